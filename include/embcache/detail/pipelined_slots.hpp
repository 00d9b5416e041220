/// @file detail/pipelined_slots.hpp
/// @brief Host-only software pipeline of the embedding cache's lookups: hashes a chunk of
/// keys once and keeps the memory accesses of several keys in flight.
#pragma once

#include <cstddef>
#include <cstdint>

#include "embcache/detail/cache_primitives.hpp"

namespace embcache::detail {

// Host-only hint: the lines of the row of `slot` (-1: nothing), for reading or (`write`) writing.
template <class Ref>
void prefetch_row(const Ref& t, std::int64_t slot, bool write) {
#if !EMBCACHE_ON_DEVICE && defined(__GNUC__)
  if (slot < 0) return;
  const char* r = reinterpret_cast<const char*>(t.row(slot));
  const std::size_t bytes = t.row_width * sizeof(float);
  if (write) {
    for (std::size_t b = 0; b < bytes; b += 64) __builtin_prefetch(r + b, 1);
  } else {
    for (std::size_t b = 0; b < bytes; b += 64) __builtin_prefetch(r + b);
  }
#else
  (void)t;
  (void)slot;
  (void)write;
#endif
}

// Host-only hint: the row index of `slot` (-1: nothing) in a table with spare rows, which
// prefetch_row reads to find the row.
template <class Ref>
void prefetch_row_index(const Ref& t, std::int64_t slot) {
#if !EMBCACHE_ON_DEVICE && defined(__GNUC__)
  if (slot >= 0 && t.row_map) __builtin_prefetch(t.row_map + slot);
#else
  (void)t;
  (void)slot;
#endif
}

// Host: copies a row with non-temporal stores (no read of the destination's lines, which a
// scattered write of a large batch would otherwise fetch first, and no eviction of the cache's
// working set); false where the row is not 16-byte aligned or the processor lacks them (the
// caller then copies). A store fence must follow the last one before the rows are published.
inline bool stream_row(float* dst, const float* src, std::size_t width) {
#if !EMBCACHE_ON_DEVICE && defined(__SSE2__)
  if (width % 4 != 0 || reinterpret_cast<std::uintptr_t>(dst) % 16 != 0) return false;
  for (std::size_t j = 0; j < width; j += 4) _mm_stream_ps(dst + j, _mm_loadu_ps(src + j));
  return true;
#else
  (void)dst;
  (void)src;
  (void)width;
  return false;
#endif
}

// Host-only: the slot of each key of keys[begin, end), through a software pipeline that hashes
// every key once and keeps the memory accesses of several keys in flight. Stage 1 (16 keys
// ahead) prefetches the home bucket's state bytes, stage 2 (8 ahead) the key of every digest
// match there, stage 3 (4 ahead) finds the key in its home bucket and prefetches its score and,
// `with_row`, its row. `visit(i, slot)` then runs in index order. The slot of stage 3 is checked
// again there (state byte and key), and a key not found in its home bucket, or whose slot changed
// meanwhile, goes through find_slot: the slots are exactly find_slot's. Without `resolve`, such
// keys get -1 instead (the caller does the full search). On the device (the cuda space never
// calls this) it is the plain loop.
template <class Ref, class Key, class Visit>
void pipelined_slots(const Ref& t, const Key* keys, std::size_t begin, std::size_t end,
                     bool with_row, const Visit& visit, bool resolve = true) {
#if !EMBCACHE_ON_DEVICE && defined(__GNUC__)
  constexpr std::size_t ahead1 = 16;
  constexpr std::size_t ahead2 = 8;
  constexpr std::size_t ahead3 = 4;
  constexpr std::size_t ring = 32;  // a power of two above ahead1
  std::size_t home[ring];
  std::uint8_t digest[ring];
  std::int64_t slot[ring];
  const std::size_t row_bytes = t.row_width * sizeof(float);
  auto stage1 = [&](std::size_t j) {
    const auto h = t.hash(keys[j]);
    home[j % ring] = h.home;
    digest[j % ring] = h.digest;
    __builtin_prefetch(t.states + h.home * cache_bucket_size);
    __builtin_prefetch(t.states + h.home * cache_bucket_size + 64);
  };
  auto stage2 = [&](std::size_t j) {
    const std::size_t first = home[j % ring] * cache_bucket_size;
#if defined(__SSE2__)
    const __m128i needle = _mm_set1_epi8(static_cast<char>(digest[j % ring]));
    for (std::size_t g = 0; g < cache_bucket_size; g += 16) {
      unsigned m = static_cast<unsigned>(
          _mm_movemask_epi8(_mm_cmpeq_epi8(load_state_group16(t.states + first + g), needle)));
      for (; m; m &= m - 1) __builtin_prefetch(t.keys + first + g + __builtin_ctz(m));
    }
#else
    const std::uint64_t* words = t.bucket_words(home[j % ring]);
    for (std::size_t w = 0; w < cache_bucket_words; ++w)
      for (std::uint64_t m = match_bytes(words[w], digest[j % ring]); m; m &= m - 1)
        __builtin_prefetch(t.keys + first + w * 8 + (ctz64(m) >> 3));
#endif
  };
  auto stage3 = [&](std::size_t j) {
    const std::int64_t s = t.find_in_bucket(home[j % ring], keys[j], digest[j % ring]);
    slot[j % ring] = s;
    if (s < 0) return;
    __builtin_prefetch(t.scores + s, 1);
    if (with_row) {
      const char* r = reinterpret_cast<const char*>(t.row(s));
      for (std::size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(r + b);
    }
  };
  for (std::size_t j = begin; j < end && j < begin + ahead1; ++j) stage1(j);
  for (std::size_t j = begin; j < end && j < begin + ahead2; ++j) stage2(j);
  for (std::size_t j = begin; j < end && j < begin + ahead3; ++j) stage3(j);
  for (std::size_t i = begin; i < end; ++i) {
    if (i + ahead1 < end) stage1(i + ahead1);
    if (i + ahead2 < end) stage2(i + ahead2);
    if (i + ahead3 < end) stage3(i + ahead3);
    std::int64_t s = slot[i % ring];
    if (s >= 0 && (atomic_load(t.states + s, cuda::std::memory_order_acquire) != digest[i % ring] ||
                   t.keys[s] != keys[i]))
      s = -1;
    if (s < 0 && resolve) s = t.find_slot(keys[i]);
    visit(i, s);
  }
#else
  (void)with_row;
  for (std::size_t i = begin; i < end; ++i) visit(i, resolve ? t.find_slot(keys[i]) : -1);
#endif
}

}  // namespace embcache::detail
