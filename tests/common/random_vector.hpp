// Uniform random floats for tests that need arbitrary inputs (dense layers, logits, labels).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace embcache::test {

/// `n` floats drawn uniformly from [lo, hi) by a Mersenne Twister seeded with `seed`: the same
/// values on every run and machine.
inline std::vector<float> random_vector(std::size_t n, std::uint32_t seed, float lo = -1,
                                        float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

}  // namespace embcache::test
