/// @file detail/hash.hpp
/// @brief The project's integer mixers, one name per algorithm, for host and device code.
///
/// Each mixer has its own name because two inline functions with one name and different bodies
/// break the one-definition rule: the linker keeps either, so the values would depend on link
/// order. Every value here is a pure function of its inputs, the same on every platform, and
/// each caller's bits (initial rows, dropout masks, synthetic data, shuffles, store slots)
/// are pinned by tests: change none of them.
#pragma once

#include <cstdint>

#include "embcache/detail/config.hpp"

namespace embcache::detail {

/// The weyl increment of SplitMix64 (2^64 / golden ratio, odd).
inline constexpr std::uint64_t splitmix64_gamma = 0x9e3779b97f4a7c15ULL;

/// murmur3's 64-bit finalizer (fmix64): a bijective mix of all input bits.
EMBCACHE_HD constexpr std::uint64_t murmur3_fmix64(std::uint64_t x) noexcept {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

/// Stafford's Mix13, SplitMix64's output mix without its increment: a bijective mix.
EMBCACHE_HD constexpr std::uint64_t stafford_mix13(std::uint64_t x) noexcept {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// SplitMix64's finalizer: the first output of a SplitMix64 stream seeded with `x`.
EMBCACHE_HD constexpr std::uint64_t splitmix64_finalize(std::uint64_t x) noexcept {
  return stafford_mix13(x + splitmix64_gamma);
}

/// Hash of two words (order matters), built on splitmix64_finalize.
EMBCACHE_HD constexpr std::uint64_t hash_words(std::uint64_t a, std::uint64_t b) noexcept {
  return splitmix64_finalize(splitmix64_finalize(a) ^ (b * 0xd6e8feb86659fd93ULL));
}

/// Hash of three words (order matters): hash_words(hash_words(a, b), c).
EMBCACHE_HD constexpr std::uint64_t hash_words(std::uint64_t a, std::uint64_t b,
                                               std::uint64_t c) noexcept {
  return hash_words(hash_words(a, b), c);
}

}  // namespace embcache::detail
