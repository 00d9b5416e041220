/// @file trainer/metrics.hpp
/// @brief Evaluation metrics of binary classifiers: exact AUC and log loss, per array or streamed
/// over batches.
#pragma once

#include <cstddef>
#include <vector>

namespace embcache {

/// Binary cross-entropy of one logit `z` against a label `y` in [0, 1], computed without
/// overflow as max(z, 0) - z*y + log1p(exp(-|z|)).
double bce_with_logits(double z, double y) noexcept;

/// The logistic function 1 / (1 + exp(-z)), stable for any z.
double sigmoid(double z) noexcept;

/// Exact ROC AUC of `scores` against `labels` (label > 0.5 is positive): the probability that a
/// random positive scores above a random negative, ties counted one half. Rank-based (average
/// ranks for ties), O(n log n). NaN when the labels hold a single class or n is 0, and NaN when
/// any score is NaN (a diverged model): such a score has no rank, so no AUC is made up for it.
/// Infinite scores rank like any other (+inf above every finite score). Never loops, any input.
double auc(const float* scores, const float* labels, std::size_t n);

/// Mean bce_with_logits over n (logit, label) pairs; NaN when n is 0.
double log_loss(const float* logits, const float* labels, std::size_t n);

/// Collects (logit, label) pairs over batches and computes AUC and log loss over all of them.
/// Exact AUC needs every score, so memory grows by 8 bytes per sample.
class metric_accumulator {
 public:
  /// Adds `n` logits and their labels (host memory).
  void add(const float* logits, const float* labels, std::size_t n);
  /// Samples added so far.
  std::size_t size() const noexcept { return logits_.size(); }
  /// auc() over every sample added.
  double auc() const;
  /// log_loss() over every sample added.
  double log_loss() const;
  /// Forgets every sample.
  void clear() noexcept;

 private:
  std::vector<float> logits_, labels_;
};

}  // namespace embcache
