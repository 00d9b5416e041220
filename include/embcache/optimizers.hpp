/// @file optimizers.hpp
/// @brief Sparse optimizers applied in place to rows that hold the embedding and its state.
///
/// Row layout (`row_width >= dim + state_width(kind, dim)` floats):
///   - sgd:     [w (dim)]
///   - adagrad: [w (dim) | accumulator (dim)]
///   - adam:    [w (dim) | m, first moment (dim) | v, second moment (dim)]
///   - ftrl:    [w (dim) | n, accumulator (dim) | z, linear (dim)]
///
/// Each element is updated independently: it is loaded as float, the update is computed in
/// double, and the results are stored as float. Rows are stored in float, so that store is the
/// only rounding per step; the host and the cuda spaces therefore agree to the last float ulp in
/// practice, and a double-precision reference that rounds its stored state to float once per step
/// reproduces the host results (see tests/sparse).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "embcache/space.hpp"
#include "embcache/sparse_ops.hpp"

namespace embcache {

/// The sparse optimizers.
enum class optimizer_kind : std::uint8_t {
  sgd,      ///< w -= lr * g
  adagrad,  ///< a += g^2; w -= lr * g / (sqrt(a) + epsilon)
  adam,     ///< lazy Adam: only rows of the batch move; bias correction from the caller's step
  ftrl,     ///< FTRL-Proximal as TensorFlow's ApplyFtrl / MindSpore's FTRL define it
};

/// Name of an optimizer ("sgd", "adagrad", "adam", "ftrl").
const char* to_string(optimizer_kind kind) noexcept;

/// The optimizer named `name` (as to_string() writes it) into `*out`; false for another name.
bool optimizer_kind_from_string(const std::string& name, optimizer_kind* out) noexcept;

/// HugeCTR's optimizer state files of `kind`, in the order the state lies in a row (see the
/// layout above), each one dim-wide part of it, float32[n][dim]: `AdaGrad.accm`; `Adam.m`,
/// `Adam.v`; `Ftrl.n`, `Ftrl.z`; none for sgd.
std::vector<const char*> hugectr_state_files(optimizer_kind kind);

/// Hyperparameters of the sparse optimizer of one table. Defaults are those of MindSpore's Adam /
/// LazyAdam, Adagrad and FTRL, which equal TensorFlow 1's (tf.compat.v1.train) wherever TensorFlow
/// has a default; FTRL's beta is Keras' (0). SGD shares learning_rate with the others.
struct optimizer_options {
  optimizer_kind kind = optimizer_kind::sgd;  ///< which optimizer (default sgd)
  float learning_rate = 0.001f;               ///< step size of sgd, adagrad, adam (default 0.001)
  float beta1 = 0.9f;                         ///< adam: decay of the first moment (default 0.9)
  float beta2 = 0.999f;                       ///< adam: decay of the second moment (default 0.999)
  float epsilon = 1e-8f;  ///< adam and adagrad: added to the root in the denominator (default 1e-8)
  float adagrad_initial_accumulator = 0.1f;  ///< adagrad: accumulator's start value (default 0.1)
  float ftrl_alpha = 0.001f;  ///< ftrl: learning rate, alpha of the paper (default 0.001)
  float ftrl_beta =
      0.0f;              ///< ftrl: beta of the paper, folded into l2 as beta/(2*alpha) (default 0)
  float ftrl_l1 = 0.0f;  ///< ftrl: l1 regularization strength, >= 0 (default 0)
  float ftrl_l2 = 0.0f;  ///< ftrl: l2 regularization strength, >= 0 (default 0)
  float ftrl_lr_power = -0.5f;            ///< ftrl: learning-rate power, <= 0 (default -0.5)
  float ftrl_initial_accumulator = 0.1f;  ///< ftrl: accumulator n's start value, > 0 (default 0.1)
};

/// Floats of optimizer state per row: sgd 0, adagrad dim, adam 2*dim, ftrl 2*dim.
std::size_t state_width(optimizer_kind kind, std::size_t dim) noexcept;

/// The value the optimizer's accumulator state starts at: adagrad_initial_accumulator for adagrad,
/// ftrl_initial_accumulator for ftrl, 0 for adam (and sgd, which has no state). FTRL's linear half
/// starts at 0, not at this value: fill rows with initialize_state() to get both right.
float initial_state_value(const optimizer_options& options) noexcept;

/// The start value of state float `j` (0 <= j < state_width) of a row: initial_state_value()
/// for accumulators, 0 for Adam's moments and FTRL's linear part.
float initial_state_value(const optimizer_options& options, std::size_t dim,
                          std::size_t j) noexcept;

/// Writes the start values of a row's state into `state` (state_width(kind, dim) host floats).
void initialize_state(const optimizer_options& options, std::size_t dim, float* state) noexcept;

/// Checks the hyperparameters (positive learning rates, betas in [0, 1), l1/l2 >= 0,
/// lr_power <= 0, FTRL initial accumulator > 0); the message names the field and its value.
[[nodiscard]] status check_options(const optimizer_options& options);

/// Applies one optimizer step to `n` rows in place.
///
/// @param rows        row pool (see sparse_ops.hpp); row r at `rows + r * row_width`
/// @param row_width   floats per row, >= dim + state_width(options.kind, dim)
/// @param unique_rows n row indices, each at most once (aggregate_gradients gives them)
/// @param grads       n*dim floats, row i's gradient at `grads + i * dim`
/// @param step        for adam: the number of steps applied to this table including this one
///                    (1 for the first); bias correction uses beta^step. Ignored otherwise.
/// @param non_finite_out  nullptr, or n flags in the space's memory: flag i becomes 1 when row
///                    `unique_rows[i]` holds an infinity or a NaN among its row_width floats
///                    after the update, else 0 (a guard against a diverged row reaching a store
///                    or a save). On the host the check reads each row while its update has it
///                    in the cache; the cuda space reads the rows once more.
/// @throws embcache::error (invalid_argument) when row_width is too small, dim is 0, or the
///         kind is adam and step is 0.
template <class Space>
void apply_optimizer(const Space& space, const optimizer_options& options, float* rows,
                     std::size_t row_width, std::size_t dim, const std::int64_t* unique_rows,
                     const float* grads, std::size_t n, std::uint64_t step,
                     std::int8_t* non_finite_out = nullptr);

/// apply_optimizer() on the result of aggregate_gradients().
template <class Space>
void apply_optimizer(const Space& space, const optimizer_options& options, float* rows,
                     std::size_t row_width, const sparse_gradients<Space>& grads,
                     std::uint64_t step, std::int8_t* non_finite_out = nullptr) {
  apply_optimizer(space, options, rows, row_width, grads.dim, grads.rows.data(),
                  grads.values.data(), grads.size, step, non_finite_out);
}

}  // namespace embcache
