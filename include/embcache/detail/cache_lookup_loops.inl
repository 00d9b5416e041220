/// @file detail/cache_lookup_loops.inl
/// @brief Loop bodies of the embedding cache's lookups (find, lookup_slots, read_slots),
/// one key or slot per index; the cuda space runs find and lookup_slots with a warp per key
/// instead (embcache/cuda/embedding_cache_ref.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

#include "embcache/detail/pipelined_slots.hpp"
#include "embcache/embedding_cache_ref.hpp"

namespace embcache::detail {

template <class Key>
struct find_fn {
  embedding_cache_ref<Key> t;
  const Key* keys;
  float* rows_out;
  bool* found_out;
  std::uint64_t op;
  void run_range(std::size_t begin, std::size_t end) const {
    pipelined_slots(t, keys, begin, end, rows_out != nullptr,
                    [this](std::size_t i, std::int64_t s) { finish(i, s); });
  }
  EMBCACHE_HD void operator()(std::size_t i) const { finish(i, t.find_slot(keys[i])); }
  EMBCACHE_HD void finish(std::size_t i, std::int64_t s) const {
    if (found_out) found_out[i] = s >= 0;
    if (s < 0) return;
    t.touch(s, op);
    if (rows_out)
      embedding_cache_ref<Key>::copy_row(rows_out + i * t.row_width, t.row(s), t.row_width);
  }
};

template <class Key>
struct slot_fn {
  embedding_cache_ref<Key> t;
  const Key* keys;
  std::int64_t* slots;
  std::uint64_t op;
  void run_range(std::size_t begin, std::size_t end) const {
    pipelined_slots(t, keys, begin, end, false,
                    [this](std::size_t i, std::int64_t s) { finish(i, s); });
  }
  EMBCACHE_HD void operator()(std::size_t i) const { finish(i, t.find_slot(keys[i])); }
  EMBCACHE_HD void finish(std::size_t i, std::int64_t s) const {
    slots[i] = s;
    if (s >= 0) t.touch(s, op);
  }
};

template <class Key>
struct read_slots_fn {
  const_embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  float* rows_out;
  void prefetch_early(std::size_t i) const { prefetch_row_index(t, slots[i]); }
  void prefetch(std::size_t i) const { prefetch_row(t, slots[i], false); }
  EMBCACHE_HD void operator()(std::size_t i) const {
    if (slots[i] >= 0)
      embedding_cache_ref<Key>::copy_row(rows_out + i * t.row_width, t.row(slots[i]), t.row_width);
  }
};

}  // namespace embcache::detail
