/// @file trainer/in_memory.hpp
/// @brief A small, self-contained Wide&Deep training loop in the host space: embeddings in plain
/// row arrays (one per table, keys mapped to rows by a hash map), the sparse ops and optimizers of
/// sparse_ops.hpp / optimizers.hpp, the dense model of wide_deep.hpp. The reference that the
/// cache-backed trainer must agree with, and a quick way to check that a configuration learns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "embcache/optimizers.hpp"
#include "embcache/shard.hpp"
#include "embcache/space.hpp"
#include "embcache/status.hpp"
#include "embcache/trainer/wide_deep.hpp"

namespace embcache {

/// The wide table's default optimizer: FTRL with alpha 0.05 and a unit initial accumulator.
inline optimizer_options default_wide_optimizer() {
  optimizer_options o;
  o.kind = optimizer_kind::ftrl;
  o.ftrl_alpha = 0.05f;
  o.ftrl_initial_accumulator = 1.0f;
  return o;
}

/// The deep table's default optimizer: lazy Adam with learning rate 0.001.
inline optimizer_options default_deep_optimizer() {
  optimizer_options o;
  o.kind = optimizer_kind::adam;
  o.learning_rate = 0.001f;
  return o;
}

/// Options of train_wide_deep_in_memory.
struct in_memory_options {
  wide_deep_options model;  ///< dense model; num_wide_slots is set from `crossed` (26 or 39)
  optimizer_options wide_optimizer = default_wide_optimizer();  ///< default FTRL, alpha 0.05
  optimizer_options deep_optimizer = default_deep_optimizer();  ///< default Adam, lr 0.001
  std::size_t batch_size = 512;                                 ///< samples per step (default 512)
  std::size_t epochs = 1;         ///< passes over the training samples (default 1)
  bool crossed = false;           ///< add criteo_cross_count crossed keys to the wide part (off)
  float deep_init_range = 0.01f;  ///< deep rows start uniform in [-r, r] (default 0.01)
  std::uint64_t seed = 0;         ///< seed of the embedding rows' initialization (default 0)
  host_space space;               ///< threads of the sparse ops (default: all)
};

/// What train_wide_deep_in_memory did.
struct in_memory_result {
  std::uint64_t steps = 0;             ///< optimizer steps taken
  double train_loss = 0;               ///< mean loss over the last epoch's batches
  double eval_auc = 0;                 ///< AUC on the evaluation samples
  double eval_logloss = 0;             ///< log loss on the evaluation samples
  std::vector<float> eval_logits;      ///< one per evaluation sample
  std::vector<std::uint8_t> dense;     ///< the dense state, wide_deep_model::save()
  std::uint64_t embedding_digest = 0;  ///< xxHash64 over both tables' (key, row), keys sorted
  std::size_t wide_rows = 0;           ///< rows in the wide table
  std::size_t deep_rows = 0;           ///< rows in the deep table
};

/// Trains Wide&Deep on `train` (in order, batch after batch, `epochs` times) and evaluates it on
/// `eval`. Rows are a pure function of (seed, table, key) when first used, so results do not
/// depend on the order keys are met nor on the thread count. invalid_argument names a bad
/// option (batch_size 0, optimizer hyperparameters, model shape).
result<in_memory_result> train_wide_deep_in_memory(const std::vector<criteo_sample>& train,
                                                   const std::vector<criteo_sample>& eval,
                                                   const in_memory_options& options);

}  // namespace embcache
