/// @file detail/cache_export_loops.inl
/// @brief Loop bodies of the embedding cache's exports: flag the slots that pass a filter,
/// collect their keys, gather their rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "embcache/embedding_cache.hpp"
#include "embcache/embedding_cache_ref.hpp"

namespace embcache::detail {

struct export_flag_fn {
  const std::uint8_t* states;
  const std::uint64_t* versions;
  export_filter filter;
  std::uint32_t* flags;
  EMBCACHE_HD void operator()(std::size_t s) const {
    // A digest (>= 2) marks a resident row; empty and busy slots are not exported.
    const bool resident = atomic_load(states + s) >= 2;
    flags[s] = resident && filter.passes(versions[s]) ? 1u : 0u;
  }
};

template <class Key>
struct export_collect_fn {
  const Key* keys;
  const std::uint32_t* flags;
  const std::uint64_t* positions;
  Key* out_keys;
  std::int64_t* out_slots;
  EMBCACHE_HD void operator()(std::size_t s) const {
    if (!flags[s]) return;
    out_keys[positions[s]] = keys[s];
    out_slots[positions[s]] = static_cast<std::int64_t>(s);
  }
};

template <class Key>
struct export_gather_fn {
  const_embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  float* rows_out;
  std::uint64_t* versions_out;
  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::int64_t s = slots[i];
    if (rows_out)
      embedding_cache_ref<Key>::copy_row(rows_out + i * t.row_width, t.row(s), t.row_width);
    if (versions_out) versions_out[i] = t.versions[s];
  }
};

}  // namespace embcache::detail
