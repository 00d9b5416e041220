/// @file embedding_cache_ref.hpp
/// @brief Non-owning views of an embedding cache's arrays carrying its single-key operations,
/// for the caller's own loops and kernels (in the style of cuCollections' `_ref` views).
///
/// A view is a small trivially copyable value: pass it by value into a kernel or a loop body.
/// It stays valid while its cache lives and is neither cleared nor moved. Every operation is
/// `EMBCACHE_HD` code over `cuda::atomic_ref`, so the host space runs exactly the logic the GPU
/// runs; the cuda space adds warp-cooperative overloads in embcache/cuda/embedding_cache_ref.cuh.
///
/// Two views: `const_embedding_cache_ref` (from `embedding_cache::ref() const`) only reads;
/// `embedding_cache_ref` (from the non-const `ref()`) also claims, publishes and erases slots and
/// records accesses, and converts to the read-only view.
///
/// Concurrency is that of the cache's bulk calls: lookups may run beside inserts; erase_key must
/// not run beside inserts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if !defined(__CUDA_ARCH__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "embcache/cache_options.hpp"
#include "embcache/detail/cache_primitives.hpp"
#include "embcache/detail/config.hpp"
#include "embcache/detail/hash.hpp"

namespace embcache {

namespace detail {

/// The arrays of a cache and the operations that only read them; `Const` makes every array
/// pointer a pointer to const. Base of both public views.
template <class Key, bool Const>
struct cache_ref_base {
  /// `T*`, or `const T*` for the read-only view.
  template <class T>
  using pointer = std::conditional_t<Const, const T*, T*>;

  pointer<std::uint8_t> states;     ///< per slot: state bytes: empty (0), busy (1) or a digest
  pointer<Key> keys;                ///< per slot: keys (meaningful where the state is a digest)
  pointer<std::uint32_t> overflow;  ///< per bucket: keys stored past it whose probe passed it
  pointer<std::uint64_t> versions;  ///< per slot: versions (of the last write of each row)
  pointer<std::uint64_t> scores;    ///< per slot: eviction scores
  pointer<std::uint64_t> touched;   ///< per slot: bulk call of the last touch (LFU), else nullptr
  pointer<std::uint64_t> claims;    ///< per slot: last-writer-wins tags of the assigning calls
  /// per slot: the version each row had when the backing store last held it (0: never); a row
  /// is dirty while its version is greater
  pointer<std::uint64_t> synced;
  pointer<std::uint32_t> marks;     ///< per slot: keyset marks (set_marks; 0 for a new row)
  pointer<float> rows;              ///< row_count * row_width floats
  /// per slot: the index of its row, or nullptr: slot s holds row s (a cache without spare rows)
  pointer<std::uint32_t> row_map;
  std::size_t num_buckets;          ///< slots / bucket size
  std::size_t row_width;            ///< floats per row: dim + optimizer-state width
  std::size_t dim;                  ///< embedding floats at the start of each row
  initializer_options init;         ///< initializer of new rows
  float normal_factor;              ///< init.scale * sqrt(3), for init_kind::normal
  score_policy policy;              ///< how touches change scores

  /// Home bucket and one-byte digest (>= 2) of a key.
  struct hashed {
    std::size_t home;     ///< bucket where the key's probe starts
    std::uint8_t digest;  ///< the state byte of the key's slot
  };

  /// The key as 64 bits (sign-extended), the input of every hash.
  EMBCACHE_HD static std::uint64_t key_bits(Key k) {
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(k));
  }
  /// Home bucket and digest of `k`.
  EMBCACHE_HD hashed hash(Key k) const {
    const std::uint64_t h = detail::murmur3_fmix64(key_bits(k) ^ 0x9e3779b97f4a7c15ULL);
    std::uint8_t d = static_cast<std::uint8_t>(h);
    if (d < 2) d += 2;
    return {static_cast<std::size_t>(detail::mulhi64(h, num_buckets)), d};
  }
  /// The bucket after `b`, wrapping around.
  EMBCACHE_HD std::size_t next_bucket(std::size_t b) const {
    return b + 1 == num_buckets ? 0 : b + 1;
  }
  /// The state bytes of bucket `b` as 64-bit words.
  EMBCACHE_HD pointer<std::uint64_t> bucket_words(std::size_t b) const {
    return reinterpret_cast<pointer<std::uint64_t>>(states + b * detail::cache_bucket_size);
  }

  /// Slot of `k` in bucket `b` (`d` = its digest), or -1. Slots being written count as absent.
  EMBCACHE_HD std::int64_t find_in_bucket(std::size_t b, Key k, std::uint8_t d) const {
    using detail::atomic_load;
    constexpr std::size_t bucket = detail::cache_bucket_size;
#if !EMBCACHE_ON_DEVICE && defined(__SSE2__)
    // Host fast path: 16 state bytes per compare (two relaxed 64-bit loads, see
    // load_state_group16). Same candidates as the portable loop below; each is confirmed by the
    // same acquire load of its state byte before its key is read.
    const __m128i needle = _mm_set1_epi8(static_cast<char>(d));
    const std::uint8_t* base = states + b * bucket;
    for (std::size_t g = 0; g < bucket; g += 16) {
      unsigned m = static_cast<unsigned>(
          _mm_movemask_epi8(_mm_cmpeq_epi8(detail::load_state_group16(base + g), needle)));
      while (m) {
        const std::size_t s = b * bucket + g + static_cast<std::size_t>(__builtin_ctz(m));
        m &= m - 1;
        if (atomic_load(states + s, cuda::std::memory_order_acquire) == d && keys[s] == k)
          return static_cast<std::int64_t>(s);
      }
    }
    return -1;
#endif
    const std::uint64_t* words = bucket_words(b);
    for (std::size_t w = 0; w < detail::cache_bucket_words; ++w) {
      std::uint64_t m = detail::match_bytes(atomic_load(words + w), d);
      while (m) {
        const std::size_t s = b * bucket + w * 8 + (detail::ctz64(m) >> 3);
        m &= m - 1;
        if (detail::load_state_acquire(states, s) == d && keys[s] == k)
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
      if (detail::atomic_load(overflow + b) == 0) return -1;
      b = next_bucket(b);
    }
    return -1;
  }

  /// Index of the row of `slot`.
  EMBCACHE_HD std::size_t row_index(std::int64_t slot) const {
    return row_map ? std::size_t{row_map[slot]} : static_cast<std::size_t>(slot);
  }
  /// The row of `slot` (row_width floats).
  EMBCACHE_HD pointer<float> row(std::int64_t slot) const {
    return rows + row_index(slot) * row_width;
  }

  /// Fills `dst` (row_width floats) with the initial row of `k`: a function of (seed, key,
  /// column) only, the same in every space.
  EMBCACHE_HD void initialize_row(Key k, float* dst) const {
    const std::uint64_t kb = key_bits(k);
    for (std::size_t j = 0; j < dim; ++j)
      dst[j] = detail::initial_value(init, normal_factor, kb, j);
    for (std::size_t j = dim; j < row_width; ++j) dst[j] = init.state_value;
  }

  /// Whether the row of `slot` changed since the backing store last held it.
  EMBCACHE_HD bool dirty(std::int64_t slot) const {
    return detail::atomic_load(versions + slot) > detail::atomic_load(synced + slot);
  }

  /// Whether bulk call `op` touched `slot`.
  EMBCACHE_HD bool touched_by(std::int64_t slot, std::uint64_t op) const {
    return policy == score_policy::lru ? detail::atomic_load(scores + slot) == op
                                       : detail::atomic_load(touched + slot) == op;
  }

  /// Copies a row of `width` floats. On the host this is memcpy: the C library's copy uses the
  /// widest vectors the CPU has, and with rows arriving from memory fewer, wider loads keep more
  /// rows in flight (in bench_cache's find it beat both a 16-byte loop and streaming stores by
  /// about 20%).
  EMBCACHE_HD static void copy_row(float* dst, const float* src, std::size_t width) {
#if EMBCACHE_ON_DEVICE
    for (std::size_t j = 0; j < width; ++j) dst[j] = src[j];
#else
    std::memcpy(dst, src, width * sizeof(float));
#endif
  }
};

}  // namespace detail

/// Read-only view of an embedding cache (from `embedding_cache::ref() const`): hashing, lookups,
/// rows and the initializer. Its arrays are pointers to const.
template <class Key>
struct const_embedding_cache_ref : detail::cache_ref_base<Key, true> {};

/// Read-write view of an embedding cache (from the non-const `embedding_cache::ref()`): the
/// lookups of const_embedding_cache_ref plus the operations that insert, erase and score.
template <class Key>
struct embedding_cache_ref : detail::cache_ref_base<Key, false> {
  using base = detail::cache_ref_base<Key, false>;
  using typename base::hashed;

  /// The read-only view of the same cache.
  EMBCACHE_HD const_embedding_cache_ref<Key> as_const() const {
    return {{this->states, this->keys, this->overflow, this->versions, this->scores, this->touched,
             this->claims, this->synced, this->marks, this->rows, this->row_map, this->num_buckets,
             this->row_width, this->dim, this->init, this->normal_factor, this->policy}};
  }
  /// Same as as_const().
  EMBCACHE_HD operator const_embedding_cache_ref<Key>() const {  // NOLINT(google-explicit-*)
    return as_const();
  }

  /// Match and empty masks of a group of state bytes (see settled_group).
  struct group_masks {
    std::uint64_t match;  ///< slots whose state is the digest looked for
    std::uint64_t empty;  ///< empty slots
  };
  // A group of state bytes scanned at once: 16 with SSE2 on the host, 8 (one word) elsewhere.
  // Masks carry one bit per slot on the host and bit 7 of each byte (SWAR) elsewhere; `shift`
  // turns a mask bit index into a slot offset. Same candidates either way.
#if !EMBCACHE_ON_DEVICE && defined(__SSE2__)
  /// State bytes per group.
  static constexpr std::size_t group_size = 16;
  /// Right shift from a mask bit index to a slot offset.
  static constexpr int group_shift = 0;
#else
  static constexpr std::size_t group_size = 8;
  static constexpr int group_shift = 3;
#endif

  /// Masks of group `g` of bucket `b` taken when no slot of it is busy (waits them out: a slot is
  /// busy at most once per concurrent phase, so this ends).
  EMBCACHE_HD group_masks settled_group(std::size_t b, std::size_t g, std::uint8_t d) const {
    using detail::atomic_load;
    using detail::state_busy;
    const std::size_t first = b * detail::cache_bucket_size + g * group_size;
    for (;;) {
#if !EMBCACHE_ON_DEVICE && defined(__SSE2__)
      // Acquire loads (plain `mov`s on x86); find_or_claim still confirms a match's own state
      // byte before reading its key (see load_state_group16).
      const __m128i v =
          detail::load_state_group16(this->states + first, cuda::std::memory_order_acquire);
      const std::uint64_t busy = static_cast<unsigned>(
          _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(static_cast<char>(state_busy)))));
      if (!busy) {
        return {static_cast<unsigned>(
                    _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(static_cast<char>(d))))),
                static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_setzero_si128())))};
      }
#else
      const std::uint64_t word = detail::load_state_group_acquire(this->states + first);
      const std::uint64_t busy = detail::match_bytes(word, state_busy);
      if (!busy)
        return {detail::match_bytes(word, d), detail::match_bytes(word, detail::state_empty)};
#endif
      const std::size_t s = first + (detail::ctz64(busy) >> group_shift);
      while (detail::load_state_acquire(this->states, s) == state_busy) {
      }
    }
  }

  /// Outcome of find_or_claim.
  struct claim {
    std::int64_t slot;    ///< -1: no room anywhere
    bool inserted;        ///< true: the slot is held busy by the caller, who must publish()
    std::uint8_t digest;  ///< the key's digest, for publish()
  };

  /// Finds `k` or claims a free slot for it (the first empty slot along its probe chain). A claimed
  /// slot stays busy, with the key written, until publish(); concurrent inserters of the same key
  /// wait for it. Safe against concurrent find/insert, not against concurrent erase.
  EMBCACHE_HD claim find_or_claim(Key k) const {
    const hashed h = this->hash(k);
    constexpr std::size_t groups = detail::cache_bucket_size / group_size;
    for (;;) {
      std::int64_t candidate = -1;
      std::size_t b = h.home;
      for (std::size_t p = 0; p < this->num_buckets; ++p) {
        for (std::size_t g = 0; g < groups; ++g) {
          const group_masks gm = settled_group(b, g, h.digest);
          const std::size_t first = b * detail::cache_bucket_size + g * group_size;
          std::uint64_t m = gm.match;
          while (m) {
            const std::size_t s = first + (detail::ctz64(m) >> group_shift);
            m &= m - 1;
#if !EMBCACHE_ON_DEVICE
            // Host: the acquire of the slot's own state byte pairs with the publish of its key
            // (the group's 64-bit loads cover the byte with another address and size). On the
            // device the group's 32-bit acquires are already of the publish's own word.
            if (detail::load_state_acquire(this->states, s) != h.digest) continue;
#endif
            if (this->keys[s] == k) return {static_cast<std::int64_t>(s), false, h.digest};
          }
          if (candidate < 0 && gm.empty)
            candidate = static_cast<std::int64_t>(first + (detail::ctz64(gm.empty) >> group_shift));
        }
        // Past this bucket only keys that probed through it can live; a full bucket must be
        // passed anyway to find room.
        if (candidate >= 0 && detail::atomic_load(this->overflow + b) == 0) break;
        b = this->next_bucket(b);
      }
      if (candidate < 0) return {-1, false, h.digest};
      if (!detail::atomic_cas(this->states + candidate, detail::state_empty, detail::state_busy))
        continue;  // lost the race
      const std::size_t cb = static_cast<std::size_t>(candidate) / detail::cache_bucket_size;
      for (std::size_t bb = h.home; bb != cb; bb = this->next_bucket(bb))
        detail::atomic_add(this->overflow + bb, 1u);
      this->keys[candidate] = k;
      return {candidate, true, h.digest};
    }
  }

  /// Makes a claimed slot visible with its key, row and metadata.
  EMBCACHE_HD void publish(std::int64_t slot, std::uint8_t digest) const {
    detail::store_state_release(this->states, static_cast<std::size_t>(slot), digest);
  }

  /// Removes `k`; false when absent (or removed by a concurrent duplicate). Not safe against
  /// concurrent inserts.
  EMBCACHE_HD bool erase_key(Key k) const {
    const std::int64_t s = this->find_slot(k);
    if (s < 0) return false;
    const hashed h = this->hash(k);
    if (!detail::atomic_cas(this->states + s, h.digest, detail::state_busy)) return false;
    const std::size_t sb = static_cast<std::size_t>(s) / detail::cache_bucket_size;
    for (std::size_t bb = h.home; bb != sb; bb = this->next_bucket(bb))
      detail::atomic_sub(this->overflow + bb, 1u);
    detail::store_state_release(this->states, static_cast<std::size_t>(s), detail::state_empty);
    return true;
  }

  /// Records an access to `slot` by bulk call `op`; `fresh`: the row was just inserted (its
  /// score starts over).
  EMBCACHE_HD void touch(std::int64_t slot, std::uint64_t op, bool fresh = false) const {
    if (this->policy == score_policy::lru) {
      detail::atomic_store(this->scores + slot, op);
      return;
    }
    if (fresh) {
      detail::atomic_store(this->scores + slot, std::uint64_t{1});
    } else {
      detail::atomic_add(this->scores + slot, std::uint64_t{1});
    }
    detail::atomic_store(this->touched + slot, op);
  }
  /// Metadata of a row just written into a claimed slot by bulk call `op`: a fresh score
  /// (touch(slot, op, true)), no store copy (dirty) and no keyset mark.
  EMBCACHE_HD void start_row(std::int64_t slot, std::uint64_t op) const {
    touch(slot, op, true);
    detail::atomic_store(this->synced + slot, std::uint64_t{0});
    detail::atomic_store(this->marks + slot, std::uint32_t{0});
  }
};

}  // namespace embcache
