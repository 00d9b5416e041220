// AUC and log loss.
#include "embcache/trainer/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace embcache {

double bce_with_logits(double z, double y) noexcept {
  return std::max(z, 0.0) - z * y + std::log1p(std::exp(-std::fabs(z)));
}

double sigmoid(double z) noexcept {
  if (z >= 0) return 1.0 / (1.0 + std::exp(-z));
  const double e = std::exp(z);
  return e / (1.0 + e);
}

double auc(const float* scores, const float* labels, std::size_t n) {
  // A NaN score has no rank: it would make the comparator below inconsistent (undefined behaviour
  // in std::sort) and the tie loop would never advance past it. A diverged model gives NaN.
  for (std::size_t i = 0; i < n; ++i)
    if (std::isnan(scores[i])) return std::numeric_limits<double>::quiet_NaN();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [scores](std::size_t a, std::size_t b) { return scores[a] < scores[b]; });
  // Mann-Whitney: sum of the positives' ranks (1-based, ties share their average rank).
  double rank_sum = 0;
  std::size_t positives = 0;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i + 1;  // at least one step, whatever the scores compare to
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double average_rank = 0.5 * double(i + 1 + j);  // mean of ranks i+1..j
    for (std::size_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5f) {
        rank_sum += average_rank;
        ++positives;
      }
    }
    i = j;
  }
  const std::size_t negatives = n - positives;
  if (positives == 0 || negatives == 0) return std::numeric_limits<double>::quiet_NaN();
  const double p = double(positives);
  return (rank_sum - p * (p + 1) / 2) / (p * double(negatives));
}

double log_loss(const float* logits, const float* labels, std::size_t n) {
  if (n == 0) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += bce_with_logits(logits[i], labels[i]);
  return sum / double(n);
}

void metric_accumulator::add(const float* logits, const float* labels, std::size_t n) {
  logits_.insert(logits_.end(), logits, logits + n);
  labels_.insert(labels_.end(), labels, labels + n);
}

double metric_accumulator::auc() const {
  return embcache::auc(logits_.data(), labels_.data(), logits_.size());
}

double metric_accumulator::log_loss() const {
  return embcache::log_loss(logits_.data(), labels_.data(), logits_.size());
}

void metric_accumulator::clear() noexcept {
  logits_.clear();
  labels_.clear();
}

}  // namespace embcache
