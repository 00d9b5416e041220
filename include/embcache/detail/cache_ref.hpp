/// @file detail/cache_ref.hpp
/// @brief The single-key operations of the embedding cache, written once for host and device.
///
/// Everything here is `EMBCACHE_HD` code over `cuda::atomic_ref`, so the host space runs exactly
/// the logic the GPU runs. No stability promise: this is internal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cuda/atomic>
#if !defined(__CUDA_ARCH__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "embcache/detail/config.hpp"
#include "embcache/detail/hash.hpp"
#include "embcache/embedding_cache.hpp"

namespace embcache::detail {

inline constexpr std::uint8_t state_empty = 0;
inline constexpr std::uint8_t state_busy = 1;  // claimed by an inserter, key/row being written
inline constexpr std::size_t cache_bucket_size = 128;
inline constexpr std::size_t cache_bucket_words = cache_bucket_size / 8;

template <class T>
EMBCACHE_HD T atomic_load(T* p, cuda::std::memory_order o = cuda::std::memory_order_relaxed) {
  return cuda::atomic_ref<T, cuda::thread_scope_device>(*p).load(o);
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

/// Non-owning view of an embedding cache's arrays with its single-key operations.
template <class Key>
struct cache_ref {
  std::uint8_t* states;     // capacity bytes (stored as 64-bit words)
  Key* keys;                // capacity
  std::uint32_t* overflow;  // num_buckets: keys stored past this bucket whose probe passed it
  std::uint64_t* versions;  // capacity
  std::uint64_t* scores;    // capacity
  std::uint64_t* touched;   // capacity (LFU only, else nullptr)
  std::uint64_t* claims;    // capacity
  float* rows;              // capacity * row_width
  std::size_t num_buckets;
  std::size_t row_width;
  std::size_t dim;
  initializer_options init;
  float normal_factor;  // scale * sqrt(3), for init_kind::normal
  score_policy policy;

  struct hashed {
    std::size_t home;
    std::uint8_t digest;
  };

  EMBCACHE_HD static std::uint64_t key_bits(Key k) {
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(k));
  }
  EMBCACHE_HD hashed hash(Key k) const {
    const std::uint64_t h = murmur3_fmix64(key_bits(k) ^ 0x9e3779b97f4a7c15ULL);
    std::uint8_t d = static_cast<std::uint8_t>(h);
    if (d < 2) d += 2;
    return {static_cast<std::size_t>(mulhi64(h, num_buckets)), d};
  }
  EMBCACHE_HD std::size_t next_bucket(std::size_t b) const {
    return b + 1 == num_buckets ? 0 : b + 1;
  }
  EMBCACHE_HD std::uint64_t* bucket_words(std::size_t b) const {
    return reinterpret_cast<std::uint64_t*>(states + b * cache_bucket_size);
  }

  /// Slot of `k` in bucket `b`, or -1. Slots being written count as absent.
  EMBCACHE_HD std::int64_t find_in_bucket(std::size_t b, Key k, std::uint8_t d) const {
#if !EMBCACHE_ON_DEVICE && defined(__SSE2__)
    // Host fast path: 16 state bytes per compare. Same candidates as the portable loop below;
    // each is confirmed by the same acquire load of its state byte.
    const __m128i needle = _mm_set1_epi8(static_cast<char>(d));
    const std::uint8_t* base = states + b * cache_bucket_size;
    for (std::size_t g = 0; g < cache_bucket_size; g += 16) {
      unsigned m = static_cast<unsigned>(_mm_movemask_epi8(
          _mm_cmpeq_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(base + g)), needle)));
      while (m) {
        const std::size_t s =
            b * cache_bucket_size + g + static_cast<std::size_t>(__builtin_ctz(m));
        m &= m - 1;
        if (atomic_load(states + s, cuda::std::memory_order_acquire) == d && keys[s] == k)
          return static_cast<std::int64_t>(s);
      }
    }
    return -1;
#endif
    std::uint64_t* words = bucket_words(b);
    for (std::size_t w = 0; w < cache_bucket_words; ++w) {
      std::uint64_t m = match_bytes(atomic_load(words + w), d);
      while (m) {
        const std::size_t s = b * cache_bucket_size + w * 8 + (ctz64(m) >> 3);
        m &= m - 1;
        if (atomic_load(states + s, cuda::std::memory_order_acquire) == d && keys[s] == k)
          return static_cast<std::int64_t>(s);
      }
    }
    return -1;
  }

  /// Slot of `k`, or -1 when absent.
  EMBCACHE_HD std::int64_t find_slot(Key k) const {
    const hashed h = hash(k);
    std::size_t b = h.home;
    for (std::size_t p = 0; p < num_buckets; ++p) {
      const std::int64_t s = find_in_bucket(b, k, h.digest);
      if (s >= 0) return s;
      if (atomic_load(overflow + b) == 0) return -1;
      b = next_bucket(b);
    }
    return -1;
  }

#if defined(__CUDACC__)
  /// find_slot by a whole warp: every lane calls it with the same key and gets the same slot.
  /// Lane l reads state bytes 4l..4l+3 of each bucket, so a bucket's states are one 128-byte
  /// load, and the lanes check their digest matches' keys at once. Same answer as find_slot (the
  /// cuda test compares it with the host space, which runs find_slot).
  __device__ std::int64_t warp_find_slot(Key k, unsigned lane) const {
    const hashed h = hash(k);
    std::size_t b = h.home;
    for (std::size_t p = 0; p < num_buckets; ++p) {
      const std::size_t first = b * cache_bucket_size + lane * 4;
      const std::uint32_t word = atomic_load(reinterpret_cast<std::uint32_t*>(states + first),
                                             cuda::std::memory_order_acquire);
      const std::uint32_t x = word ^ (0x01010101u * h.digest);
      std::uint32_t m = ~(((x & 0x7f7f7f7fu) + 0x7f7f7f7fu) | x) & 0x80808080u;
      long long mine = -1;
      while (m) {
        const std::size_t s = first + static_cast<std::size_t>(__ffs(static_cast<int>(m)) - 1) / 8;
        m &= m - 1;
        if (keys[s] == k) {
          mine = static_cast<long long>(s);
          break;
        }
      }
      const unsigned hits = __ballot_sync(0xffffffffu, mine >= 0);
      if (hits) return __shfl_sync(0xffffffffu, mine, __ffs(static_cast<int>(hits)) - 1);
      // One read, broadcast: lanes must agree on whether to go on even while inserts run.
      const std::uint32_t more =
          __shfl_sync(0xffffffffu, lane == 0 ? atomic_load(overflow + b) : 0u, 0);
      if (more == 0) return -1;
      b = next_bucket(b);
    }
    return -1;
  }
#endif

  // A group of state bytes scanned at once: 16 with SSE2 on the host, 8 (one word) elsewhere.
  // Masks carry one bit per slot on the host and bit 7 of each byte (SWAR) elsewhere; `shift`
  // turns a mask bit index into a slot offset. Same candidates either way.
  struct group_masks {
    std::uint64_t match;
    std::uint64_t empty;
  };
#if !EMBCACHE_ON_DEVICE && defined(__SSE2__)
  static constexpr std::size_t group_size = 16;
  static constexpr int group_shift = 0;
#else
  static constexpr std::size_t group_size = 8;
  static constexpr int group_shift = 3;
#endif

  /// Masks of group `g` of bucket `b` taken when no slot of it is busy (waits them out: a slot is
  /// busy at most once per concurrent phase, so this ends).
  EMBCACHE_HD group_masks settled_group(std::size_t b, std::size_t g, std::uint8_t d) const {
    const std::size_t first = b * cache_bucket_size + g * group_size;
    for (;;) {
#if !EMBCACHE_ON_DEVICE && defined(__SSE2__)
      // x86 loads are not reordered with later loads, so this load acts as an acquire.
      const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(states + first));
      const std::uint64_t busy = static_cast<unsigned>(
          _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(static_cast<char>(state_busy)))));
      if (!busy) {
        // Orders the key and row reads that follow after this load (free on x86).
        cuda::std::atomic_thread_fence(cuda::std::memory_order_acquire);
        return {static_cast<unsigned>(
                    _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(static_cast<char>(d))))),
                static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_setzero_si128())))};
      }
#else
      const std::uint64_t word = atomic_load(reinterpret_cast<std::uint64_t*>(states + first),
                                             cuda::std::memory_order_acquire);
      const std::uint64_t busy = match_bytes(word, state_busy);
      if (!busy) return {match_bytes(word, d), match_bytes(word, state_empty)};
#endif
      const std::size_t s = first + (ctz64(busy) >> group_shift);
      while (atomic_load(states + s, cuda::std::memory_order_acquire) == state_busy) {
      }
    }
  }

  struct claim {
    std::int64_t slot;  // -1: no room anywhere
    bool inserted;      // true: the slot is held busy by the caller, who must publish()
    std::uint8_t digest;
  };

  /// Finds `k` or claims a free slot for it (the first empty slot along its probe chain). A claimed
  /// slot stays busy, with the key written, until publish(); concurrent inserters of the same key
  /// wait for it. Safe against concurrent find/insert, not against concurrent erase.
  EMBCACHE_HD claim find_or_claim(Key k) const {
    const hashed h = hash(k);
    constexpr std::size_t groups = cache_bucket_size / group_size;
    for (;;) {
      std::int64_t candidate = -1;
      std::size_t b = h.home;
      for (std::size_t p = 0; p < num_buckets; ++p) {
        for (std::size_t g = 0; g < groups; ++g) {
          const group_masks gm = settled_group(b, g, h.digest);
          const std::size_t first = b * cache_bucket_size + g * group_size;
          std::uint64_t m = gm.match;
          while (m) {
            const std::size_t s = first + (ctz64(m) >> group_shift);
            m &= m - 1;
            if (keys[s] == k) return {static_cast<std::int64_t>(s), false, h.digest};
          }
          if (candidate < 0 && gm.empty)
            candidate = static_cast<std::int64_t>(first + (ctz64(gm.empty) >> group_shift));
        }
        // Past this bucket only keys that probed through it can live; a full bucket must be
        // passed anyway to find room.
        if (candidate >= 0 && atomic_load(overflow + b) == 0) break;
        b = next_bucket(b);
      }
      if (candidate < 0) return {-1, false, h.digest};
      if (!atomic_cas(states + candidate, state_empty, state_busy)) continue;  // lost the race
      const std::size_t cb = static_cast<std::size_t>(candidate) / cache_bucket_size;
      for (std::size_t bb = h.home; bb != cb; bb = next_bucket(bb)) atomic_add(overflow + bb, 1u);
      keys[candidate] = k;
      return {candidate, true, h.digest};
    }
  }

  /// Makes a claimed slot visible with its key, row and metadata.
  EMBCACHE_HD void publish(std::int64_t slot, std::uint8_t digest) const {
    atomic_store(states + slot, digest, cuda::std::memory_order_release);
  }

  /// Removes `k`; false when absent (or removed by a concurrent duplicate). Not safe against
  /// concurrent inserts.
  EMBCACHE_HD bool erase_key(Key k) const {
    const std::int64_t s = find_slot(k);
    if (s < 0) return false;
    const hashed h = hash(k);
    if (!atomic_cas(states + s, h.digest, state_busy)) return false;
    const std::size_t sb = static_cast<std::size_t>(s) / cache_bucket_size;
    for (std::size_t bb = h.home; bb != sb; bb = next_bucket(bb)) atomic_sub(overflow + bb, 1u);
    atomic_store(states + s, state_empty, cuda::std::memory_order_release);
    return true;
  }

  EMBCACHE_HD float* row(std::int64_t slot) const {
    return rows + static_cast<std::size_t>(slot) * row_width;
  }

  /// Fills `dst` (row_width floats) with the initial row of `k`.
  EMBCACHE_HD void initialize_row(Key k, float* dst) const {
    const std::uint64_t kb = key_bits(k);
    for (std::size_t j = 0; j < dim; ++j) dst[j] = initial_value(init, normal_factor, kb, j);
    for (std::size_t j = dim; j < row_width; ++j) dst[j] = init.state_value;
  }

  /// Records an access by bulk call `op`.
  EMBCACHE_HD void touch(std::int64_t slot, std::uint64_t op) const {
    if (policy == score_policy::lru) {
      atomic_store(scores + slot, op);
    } else {
      atomic_add(scores + slot, std::uint64_t{1});
      atomic_store(touched + slot, op);
    }
  }
  /// Score of a fresh row inserted by bulk call `op`.
  EMBCACHE_HD void set_fresh_score(std::int64_t slot, std::uint64_t op) const {
    if (policy == score_policy::lru) {
      atomic_store(scores + slot, op);
    } else {
      atomic_store(scores + slot, std::uint64_t{1});
      atomic_store(touched + slot, op);
    }
  }
  EMBCACHE_HD bool touched_by(std::int64_t slot, std::uint64_t op) const {
    return policy == score_policy::lru ? atomic_load(scores + slot) == op
                                       : atomic_load(touched + slot) == op;
  }

  /// Copies a row. On the host this is memcpy: the C library's copy uses the widest vectors the
  /// CPU has, and with rows arriving from memory fewer, wider loads keep more rows in flight (in
  /// bench_cache's find it beat both a 16-byte loop and streaming stores by about 20%).
  EMBCACHE_HD static void copy_row(float* dst, const float* src, std::size_t width) {
#if EMBCACHE_ON_DEVICE
    for (std::size_t j = 0; j < width; ++j) dst[j] = src[j];
#else
    std::memcpy(dst, src, width * sizeof(float));
#endif
  }
};

}  // namespace embcache::detail
