/// @file detail/optimizers.inl
/// @brief Portable definitions of the in-row optimizers; they bring the primitives of the space
/// they are compiled for (detail/space_algorithms.hpp), so nothing has to come before them.
#pragma once

// First: the qualified calls below bind to the overloads declared before them.
#include "embcache/detail/space_algorithms.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "embcache/detail/config.hpp"
#include "embcache/detail/sparse_ops.inl"
#include "embcache/optimizers.hpp"
#include "embcache/status.hpp"

namespace embcache {
namespace detail {

// Each update functor updates element d of one row: the weight at row[d] and its state at
// row[dim + d] (and row[2*dim + d]). Arithmetic is double; only the stores round to float.

struct sgd_update {
  double lr;
  EMBCACHE_HD void operator()(float* row, float g, std::size_t d, std::size_t) const {
    row[d] = static_cast<float>(static_cast<double>(row[d]) - lr * static_cast<double>(g));
  }
};

struct adagrad_update {
  double lr;
  double epsilon;
  EMBCACHE_HD void operator()(float* row, float g, std::size_t d, std::size_t dim) const {
    const double gd = g;
    const double a = static_cast<double>(row[dim + d]) + gd * gd;
    const double w = static_cast<double>(row[d]) - lr * gd / (::sqrt(a) + epsilon);
    row[d] = static_cast<float>(w);
    row[dim + d] = static_cast<float>(a);
  }
};

struct adam_update {
  double beta1;
  double one_minus_beta1;
  double beta2;
  double one_minus_beta2;
  double lr_t;  // learning rate times the bias correction sqrt(1 - beta2^t) / (1 - beta1^t)
  double epsilon;
  EMBCACHE_HD void operator()(float* row, float g, std::size_t d, std::size_t dim) const {
    const double gd = g;
    const double m = beta1 * static_cast<double>(row[dim + d]) + one_minus_beta1 * gd;
    const double v = beta2 * static_cast<double>(row[2 * dim + d]) + one_minus_beta2 * gd * gd;
    const double w = static_cast<double>(row[d]) - lr_t * m / (::sqrt(v) + epsilon);
    row[d] = static_cast<float>(w);
    row[dim + d] = static_cast<float>(m);
    row[2 * dim + d] = static_cast<float>(v);
  }
};

struct ftrl_update {
  double alpha;
  double l1;
  double two_l2;        // 2 * (l2 + beta / (2 * alpha)), the paper's beta folded in as Keras does
  double neg_lr_power;  // -lr_power
  bool sqrt_power;      // lr_power == -0.5: sqrt is exact, pow is not guaranteed to be
  EMBCACHE_HD double power(double x) const {
    return sqrt_power ? ::sqrt(x) : ::pow(x, neg_lr_power);
  }
  EMBCACHE_HD void operator()(float* row, float g, std::size_t d, std::size_t dim) const {
    const double gd = g;
    const double w = row[d];
    const double n = row[dim + d];
    double z = row[2 * dim + d];
    const double n_new = n + gd * gd;
    const double p_new = power(n_new);
    z += gd - (p_new - power(n)) / alpha * w;
    const double quadratic = p_new / alpha + two_l2;
    const double w_new = ::fabs(z) > l1 ? ((z > 0 ? l1 : -l1) - z) / quadratic : 0.0;
    row[d] = static_cast<float>(w_new);
    row[dim + d] = static_cast<float>(n_new);
    row[2 * dim + d] = static_cast<float>(z);
  }
};

// Whether none of a row's `width` floats is an infinity or a NaN: a float's exponent bits are all
// ones exactly then. The bit test vectorizes where a loop of std::isfinite did not (bench_sparse's
// sparse_apply_checked, Adam dim 64: 8% over the update against 26%).
EMBCACHE_HD inline bool row_is_finite(const float* row, std::size_t width) {
  std::uint32_t bad = 0;
  for (std::size_t j = 0; j < width; ++j) {
#if EMBCACHE_ON_DEVICE
    const std::uint32_t bits = __float_as_uint(row[j]);
#else
    std::uint32_t bits;
    std::memcpy(&bits, row + j, sizeof bits);
#endif
    bad |= static_cast<std::uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

// Host: one row per call (contiguous inner loop); cuda: one element per thread. Each element's
// update is the same function in both, so both spaces compute the same values.
template <class Update>
struct apply_rows_fn {
  Update update;
  float* rows;
  std::size_t row_width;
  std::size_t dim;
  const std::int64_t* unique_rows;
  const float* grads;
  std::int8_t* non_finite;  // nullptr, or a flag per row (apply_optimizer's non_finite_out)

  void prefetch(std::size_t r) const {
    __builtin_prefetch(rows + static_cast<std::size_t>(unique_rows[r]) * row_width, 1);
  }
  EMBCACHE_HD void operator()(std::size_t r) const {
    float* row = rows + static_cast<std::size_t>(unique_rows[r]) * row_width;
    const float* g = grads + r * dim;
    for (std::size_t d = 0; d < dim; ++d) update(row, g[d], d, dim);
    if (non_finite) non_finite[r] = row_is_finite(row, row_width) ? 0 : 1;
  }
};

// non_finite[r] = 1 when row `unique_rows[r]` holds an infinity or a NaN, else 0: the check of
// apply_rows_fn as a pass of its own (the cuda space's updates run per element).
struct flag_non_finite_rows_fn {
  const float* rows;
  std::size_t row_width;
  const std::int64_t* unique_rows;
  std::int8_t* non_finite;

  EMBCACHE_HD void operator()(std::size_t r) const {
    non_finite[r] =
        row_is_finite(rows + static_cast<std::size_t>(unique_rows[r]) * row_width, row_width) ? 0
                                                                                              : 1;
  }
};

template <class Update>
struct apply_elements_fn {
  Update update;
  float* rows;
  std::size_t row_width;
  std::size_t dim;
  const std::int64_t* unique_rows;
  const float* grads;

  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::size_t r = i / dim, d = i % dim;
    update(rows + static_cast<std::size_t>(unique_rows[r]) * row_width, grads[i], d, dim);
  }
};

template <class Space, class Update>
void run_update(const Space& space, const Update& update, float* rows, std::size_t row_width,
                std::size_t dim, const std::int64_t* unique_rows, const float* grads,
                std::size_t n, std::int8_t* non_finite) {
  if constexpr (is_host_space_v<Space>) {
    for_each_index(space, n,
                   apply_rows_fn<Update>{update, rows, row_width, dim, unique_rows, grads,
                                         non_finite});
  } else {
    for_each_index(space, n * dim,
                   apply_elements_fn<Update>{update, rows, row_width, dim, unique_rows, grads});
    if (non_finite) {
      for_each_index(space, n,
                     flag_non_finite_rows_fn{rows, row_width, unique_rows, non_finite});
    }
  }
}

/// The learning rate of lazy Adam at `step` with its bias correction, computed once per call on
/// the host so that every space uses the same double.
inline double adam_step_rate(const optimizer_options& o, std::uint64_t step) {
  const double t = static_cast<double>(step);
  return static_cast<double>(o.learning_rate) *
         std::sqrt(1.0 - std::pow(static_cast<double>(o.beta2), t)) /
         (1.0 - std::pow(static_cast<double>(o.beta1), t));
}

}  // namespace detail

template <class Space>
void apply_optimizer(const Space& space, const optimizer_options& options, float* rows,
                     std::size_t row_width, std::size_t dim, const std::int64_t* unique_rows,
                     const float* grads, std::size_t n, std::uint64_t step,
                     std::int8_t* non_finite_out) {
  const std::size_t need = dim + state_width(options.kind, dim);
  if (dim == 0 || row_width < need)
    throw error(status_code::invalid_argument,
                std::string("apply_optimizer: ") + to_string(options.kind) + " with dim " +
                    std::to_string(dim) + " needs rows of at least " + std::to_string(need) +
                    " floats, got row_width " + std::to_string(row_width));
  if (options.kind == optimizer_kind::adam && step == 0)
    throw error(status_code::invalid_argument,
                "apply_optimizer: adam needs the 1-based step of this update, got 0");
  if (n == 0) return;
  switch (options.kind) {
    case optimizer_kind::sgd:
      detail::run_update(space, detail::sgd_update{options.learning_rate}, rows, row_width, dim,
                         unique_rows, grads, n, non_finite_out);
      break;
    case optimizer_kind::adagrad:
      detail::run_update(space, detail::adagrad_update{options.learning_rate, options.epsilon},
                         rows, row_width, dim, unique_rows, grads, n, non_finite_out);
      break;
    case optimizer_kind::adam: {
      const double b1 = options.beta1, b2 = options.beta2;
      detail::run_update(
          space,
          detail::adam_update{b1, 1.0 - b1, b2, 1.0 - b2, detail::adam_step_rate(options, step),
                              options.epsilon},
          rows, row_width, dim, unique_rows, grads, n, non_finite_out);
      break;
    }
    case optimizer_kind::ftrl: {
      const double alpha = options.ftrl_alpha;
      const double two_l2 = 2.0 * static_cast<double>(options.ftrl_l2) +
                            static_cast<double>(options.ftrl_beta) / alpha;
      detail::run_update(space,
                         detail::ftrl_update{alpha, options.ftrl_l1, two_l2,
                                             -static_cast<double>(options.ftrl_lr_power),
                                             options.ftrl_lr_power == -0.5f},
                         rows, row_width, dim, unique_rows, grads, n, non_finite_out);
      break;
    }
  }
}

}  // namespace embcache
