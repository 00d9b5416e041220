/// @file detail/cache_primitives.hpp
/// @brief Building blocks of the embedding cache's single-key operations: slot states, atomics
/// on plain memory, bit tricks and the deterministic row initializer, the same on host and device.
///
/// No stability promise: this is internal (embedding_cache_ref.hpp is the public view).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda/atomic>
#if !defined(__CUDA_ARCH__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "embcache/cache_options.hpp"
#include "embcache/detail/config.hpp"
#include "embcache/detail/hash.hpp"

namespace embcache::detail {

inline constexpr std::uint8_t state_empty = 0;
inline constexpr std::uint8_t state_busy = 1;  // claimed by an inserter, key/row being written
inline constexpr std::size_t cache_bucket_size = 128;
inline constexpr std::size_t cache_bucket_words = cache_bucket_size / 8;

/// An atomic load. It takes a pointer to const because a load never writes, while
/// cuda::atomic_ref (like std::atomic_ref before C++26) only takes a non-const object.
template <class T>
EMBCACHE_HD T atomic_load(const T* p, cuda::std::memory_order o = cuda::std::memory_order_relaxed) {
  return cuda::atomic_ref<T, cuda::thread_scope_device>(*const_cast<T*>(p)).load(o);
}
template <class T>
EMBCACHE_HD void atomic_store(T* p, T v,
                              cuda::std::memory_order o = cuda::std::memory_order_relaxed) {
  cuda::atomic_ref<T, cuda::thread_scope_device>(*p).store(v, o);
}
template <class T>
EMBCACHE_HD bool atomic_cas(T* p, T expected, T desired) {
  return cuda::atomic_ref<T, cuda::thread_scope_device>(*p).compare_exchange_strong(
      expected, desired, cuda::std::memory_order_acq_rel, cuda::std::memory_order_acquire);
}
template <class T>
EMBCACHE_HD T atomic_add(T* p, T v) {
  return cuda::atomic_ref<T, cuda::thread_scope_device>(*p).fetch_add(
      v, cuda::std::memory_order_relaxed);
}
template <class T>
EMBCACHE_HD T atomic_sub(T* p, T v) {
  return cuda::atomic_ref<T, cuda::thread_scope_device>(*p).fetch_sub(
      v, cuda::std::memory_order_relaxed);
}
template <class T>
EMBCACHE_HD void atomic_max(T* p, T v) {
  cuda::atomic_ref<T, cuda::thread_scope_device> r(*p);
  T cur = r.load(cuda::std::memory_order_relaxed);
  while (cur < v && !r.compare_exchange_weak(cur, v, cuda::std::memory_order_relaxed)) {
  }
}

/// Acquire load of the state byte of slot `s`. On the device it loads the aligned 32-bit word
/// holding the byte: libcu++ makes one-byte atomic stores and compare-exchanges 32-bit CAS loops on
/// that word, and the PTX memory model orders an acquire after a release only between accesses of
/// the same size and address (morally strong), so the acquire that must see a publish() takes the
/// publish's size. State arrays start 4-byte aligned (every slot index's word lies inside them).
EMBCACHE_HD inline std::uint8_t load_state_acquire(const std::uint8_t* states, std::size_t s) {
#if EMBCACHE_ON_DEVICE
  const std::uint32_t word = atomic_load(
      reinterpret_cast<const std::uint32_t*>(states + (s & ~std::size_t{3})),
      cuda::std::memory_order_acquire);
  return static_cast<std::uint8_t>(word >> (8 * (s & 3)));  // little-endian
#else
  return atomic_load(states + s, cuda::std::memory_order_acquire);
#endif
}

/// Stores `value` into byte `i` of `bytes` by a 32-bit compare-exchange loop on the aligned word
/// holding it (`bytes` 4-byte aligned, little-endian like load_state_acquire), with order `o` on
/// success; the word's other three bytes keep whatever concurrent writers put there. Written by
/// hand rather than left to how libcu++ lowers a one-byte store (a 32-bit CAS loop today), so
/// the device's 32-bit acquire loads pair with a release of their own size whatever libcu++ does.
EMBCACHE_HD inline void store_byte_in_word(std::uint8_t* bytes, std::size_t i, std::uint8_t value,
                                           cuda::std::memory_order o) {
  cuda::atomic_ref<std::uint32_t, cuda::thread_scope_device> word(
      *reinterpret_cast<std::uint32_t*>(bytes + (i & ~std::size_t{3})));
  const unsigned shift = 8 * static_cast<unsigned>(i & 3);
  const std::uint32_t keep = ~(std::uint32_t{0xff} << shift);
  const std::uint32_t put = static_cast<std::uint32_t>(value) << shift;
  std::uint32_t cur = word.load(cuda::std::memory_order_relaxed);
  while (!word.compare_exchange_weak(cur, (cur & keep) | put, o, cuda::std::memory_order_relaxed)) {
  }
}

/// Release store of the state byte of slot `s` (publish, erase, eviction's re-claim). On the
/// device a 32-bit CAS on the word holding it (store_byte_in_word), the size load_state_acquire
/// loads. The host keeps the one-byte store: its acquires there are one-byte loads of the same
/// address, and x86-64 and AArch64 store a byte with release order natively, where a CAS loop
/// would add a locked read-modify-write to every publish.
EMBCACHE_HD inline void store_state_release(std::uint8_t* states, std::size_t s,
                                            std::uint8_t value) {
#if EMBCACHE_ON_DEVICE
  store_byte_in_word(states, s, value, cuda::std::memory_order_release);
#else
  atomic_store(states + s, value, cuda::std::memory_order_release);
#endif
}

/// Acquire load of the 8 state bytes at `first` (8-aligned) as one little-endian word: on the
/// device two 32-bit acquire loads, for the reason load_state_acquire gives.
EMBCACHE_HD inline std::uint64_t load_state_group_acquire(const std::uint8_t* first) {
#if EMBCACHE_ON_DEVICE
  const auto* w = reinterpret_cast<const std::uint32_t*>(first);
  const std::uint64_t lo = atomic_load(w, cuda::std::memory_order_acquire);
  const std::uint64_t hi = atomic_load(w + 1, cuda::std::memory_order_acquire);
  return lo | (hi << 32);
#else
  return atomic_load(reinterpret_cast<const std::uint64_t*>(first),
                     cuda::std::memory_order_acquire);
#endif
}

#if !EMBCACHE_ON_DEVICE && defined(__SSE2__)
/// Host, SSE2: the 16 state bytes at `first` (16-aligned) in a vector register, for a compare of a
/// whole group at once. The bytes are shared with concurrent inserters (CAS to busy, release store
/// of the digest), so they are read as two 64-bit atomic loads, never one plain vector load (a
/// data race). With `o` relaxed or acquire each is one plain `mov` on x86, so the cost over
/// `movdqa` is the move of two words into the register. The group's bytes are a snapshot: a
/// caller that then reads what a slot's state guards (its key, row) first confirms that slot's
/// state with load_state_acquire, which pairs with the publish of that very byte.
inline __m128i load_state_group16(const std::uint8_t* first,
                                  cuda::std::memory_order o = cuda::std::memory_order_relaxed) {
  const auto* w = reinterpret_cast<const std::uint64_t*>(first);
  const std::uint64_t lo = atomic_load(w, o);
  const std::uint64_t hi = atomic_load(w + 1, o);
  return _mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo));
}
#endif

/// High 64 bits of a 64x64-bit product (the same value on host and device).
EMBCACHE_HD inline std::uint64_t mulhi64(std::uint64_t a, std::uint64_t b) {
#if EMBCACHE_ON_DEVICE
  return __umul64hi(a, b);
#else
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

/// Index of the lowest set bit (x != 0).
EMBCACHE_HD inline int ctz64(std::uint64_t x) {
#if EMBCACHE_ON_DEVICE
  return __ffsll(static_cast<long long>(x)) - 1;
#else
  return __builtin_ctzll(x);
#endif
}

/// Bit 7 of each byte of `word` that equals `byte`, and no other bit (exact, no false hits).
EMBCACHE_HD inline std::uint64_t match_bytes(std::uint64_t word, std::uint8_t byte) {
  const std::uint64_t x = word ^ (0x0101010101010101ULL * byte);
  const std::uint64_t t = ((x & 0x7f7f7f7f7f7f7f7fULL) + 0x7f7f7f7f7f7f7f7fULL) | x;
  return ~t & 0x8080808080808080ULL;
}

/// Element `column` of the initial row of `key` (embedding part only).
EMBCACHE_HD inline float initial_value(const initializer_options& init, float normal_factor,
                                       std::uint64_t key_bits, std::size_t column) {
  const std::uint64_t base =
      murmur3_fmix64(init.seed ^ murmur3_fmix64(key_bits + 0x632be59bd9b4e019ULL));
  const std::uint64_t r = murmur3_fmix64(base + (column + 1) * 0x9e3779b97f4a7c15ULL);
  switch (init.kind) {
    case init_kind::uniform: {
      // Every step is exact in float but the last multiply, so all spaces agree bit for bit.
      const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
      return (2.0f * u - 1.0f) * init.scale;
    }
    case init_kind::normal: {
      // Irwin-Hall with 4 terms of 22 bits: the sum is exact in float, one rounding at the end.
      const std::uint64_t r2 = murmur3_fmix64(r ^ 0xd6e8feb86659fd93ULL);
      const float k = 1.0f / 4194304.0f;
      const float s =
          static_cast<float>(r & 0x3fffff) * k + static_cast<float>((r >> 22) & 0x3fffff) * k +
          static_cast<float>(r2 & 0x3fffff) * k + static_cast<float>((r2 >> 22) & 0x3fffff) * k;
      return (s - 2.0f) * normal_factor;
    }
    case init_kind::constant:
    default:
      return init.scale;
  }
}

}  // namespace embcache::detail
