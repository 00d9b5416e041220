// Counter-based random numbers for the data part: every value is a pure function of its
// inputs, so synthetic rows and shuffles are reproducible on any platform and in any order.
#pragma once

#include <cstdint>

namespace embcache::detail {

/// SplitMix64's finalizer: a bijective mix of 64 bits.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Hash of a few words (order matters).
constexpr std::uint64_t mix64(std::uint64_t a, std::uint64_t b) noexcept {
  return mix64(mix64(a) ^ (b * 0xd6e8feb86659fd93ULL));
}
constexpr std::uint64_t mix64(std::uint64_t a, std::uint64_t b, std::uint64_t c) noexcept {
  return mix64(mix64(a, b), c);
}

/// SplitMix64 stream.
class splitmix64 {
 public:
  explicit constexpr splitmix64(std::uint64_t seed) noexcept : state_(seed) {}
  constexpr std::uint64_t next() noexcept {
    state_ += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
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
