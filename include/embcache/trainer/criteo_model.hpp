/// @file trainer/criteo_model.hpp
/// @brief The Wide&Deep model on Criteo samples, in one place for every user of it (the trainer,
/// the in-memory loop, the lookup-only scorer): the model's shape, the wide keys of a batch, and
/// the check of a batch's floats.
///
/// Wide slots are a sample's categorical keys (26 for Criteo, the dataset schema's count
/// otherwise), followed by its crossed keys when the run uses them (criteo_cross_count of them);
/// deep slots are the categorical keys.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "embcache/criteo.hpp"
#include "embcache/shard.hpp"
#include "embcache/trainer/wide_deep.hpp"

namespace embcache {

/// Wide slots per sample: the categorical slots, plus the crossed ones when `crossed`.
inline std::size_t criteo_wide_slots(bool crossed) noexcept {
  return criteo_slot_count + (crossed ? criteo_cross_count : 0);
}

/// Wide slots per sample of `num_slots` categorical slots: those, plus the crossed ones when
/// `crossed`.
inline std::size_t model_wide_slots(std::size_t num_slots, bool crossed) noexcept {
  return num_slots + (crossed ? criteo_cross_count : 0);
}

/// `model` (its MLP and dense hyperparameters) with the shape of a sample set of `num_dense`
/// dense features and `num_slots` categorical slots (a dataset schema's counts): num_wide_slots
/// from `crossed`, num_deep_slots the categorical slots, `deep_dim`, and the dense features.
inline wide_deep_options criteo_model_shape(wide_deep_options model, bool crossed,
                                            std::size_t deep_dim,
                                            std::size_t num_dense = criteo_dense_count,
                                            std::size_t num_slots = criteo_slot_count) {
  model.num_wide_slots = model_wide_slots(num_slots, crossed);
  model.num_deep_slots = num_slots;
  model.deep_dim = deep_dim;
  model.num_dense = num_dense;
  return model;
}

/// Writes the wide keys of samples [first, first + n) of `b` to `out` (n * model_wide_slots(
/// b.num_slots, crossed) keys, sample-major): each sample's categorical keys, then its first
/// criteo_cross_count crossed keys when `crossed` (the batch must hold them).
inline void fill_wide_keys(const shard_batch& b, std::size_t first, std::size_t n, bool crossed,
                           std::int64_t* out) {
  const std::size_t slots = b.num_slots, ws = model_wide_slots(slots, crossed);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t* keys = b.keys.data() + (first + i) * slots;
    std::int64_t* to = out + i * ws;
    for (std::size_t s = 0; s < slots; ++s) to[s] = keys[s];
    if (crossed) {
      const std::int64_t* cross = b.crossed.data() + (first + i) * b.num_crossed;
      for (std::size_t s = 0; s < criteo_cross_count; ++s) to[slots + s] = cross[s];
    }
  }
}

/// The number of non-finite floats among the `n` at `p`.
inline std::size_t count_non_finite(const float* p, std::size_t n) noexcept {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += std::isfinite(p[i]) ? 0 : 1;
  return bad;
}

}  // namespace embcache
