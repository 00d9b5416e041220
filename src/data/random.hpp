// Counter-based random numbers for the data part: every value is a pure function of its
// inputs, so synthetic rows and shuffles are reproducible on any platform and in any order.
#pragma once

#include <cstdint>

#include "embcache/detail/hash.hpp"

namespace embcache::detail {

/// SplitMix64 stream.
class splitmix64 {
 public:
  explicit constexpr splitmix64(std::uint64_t seed) noexcept : state_(seed) {}
  constexpr std::uint64_t next() noexcept {
    state_ += splitmix64_gamma;
    return stafford_mix13(state_);
  }
  /// Uniform in [0, 1) with 53 bits.
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform in [0, n) (multiply-shift; bias below 2^-64 * n, irrelevant here).
  std::uint64_t below(std::uint64_t n) noexcept {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }

 private:
  std::uint64_t state_;
};

}  // namespace embcache::detail
