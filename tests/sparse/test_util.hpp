// Helpers shared by the sparse tests: random batches and row pools with fixed seeds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "embcache/sparse_ops.hpp"

namespace embcache::test {

/// A host batch that owns its arrays.
struct owned_batch {
  std::size_t batch_size = 0;
  std::size_t num_slots = 0;
  std::vector<std::int64_t> offsets{0};
  std::vector<std::int64_t> indices;

  slot_batch view() const {
    return {batch_size, num_slots, offsets.data(), indices.data(), indices.size()};
  }
};

/// B*S bags with sizes in [min_hot, max_hot] and indices uniform in [0, num_rows).
inline owned_batch random_batch(std::mt19937_64& rng, std::size_t batch_size, std::size_t num_slots,
                                std::size_t num_rows, int min_hot, int max_hot) {
  owned_batch b;
  b.batch_size = batch_size;
  b.num_slots = num_slots;
  std::uniform_int_distribution<int> hot(min_hot, max_hot);
  std::uniform_int_distribution<std::int64_t> row(0, static_cast<std::int64_t>(num_rows) - 1);
  for (std::size_t bag = 0; bag < batch_size * num_slots; ++bag) {
    const int h = hot(rng);
    for (int k = 0; k < h; ++k) b.indices.push_back(row(rng));
    b.offsets.push_back(static_cast<std::int64_t>(b.indices.size()));
  }
  return b;
}

inline std::vector<float> random_floats(std::mt19937_64& rng, std::size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace embcache::test
