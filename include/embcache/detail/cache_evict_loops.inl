/// @file detail/cache_evict_loops.inl
/// @brief Loop bodies of the embedding cache's insert_and_evict: keys grouped by home bucket,
/// one bucket per index, victims compacted in key order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "embcache/detail/cache_assign_loops.inl"
#include "embcache/embedding_cache_ref.hpp"

namespace embcache::detail {

template <class Key>
struct home_fn {
  const_embedding_cache_ref<Key> t;
  const Key* keys;
  std::uint64_t* homes;
  std::uint64_t* order;
  EMBCACHE_HD void operator()(std::size_t i) const {
    homes[i] = t.hash(keys[i]).home;
    order[i] = i;
  }
};

// One thread per home bucket handles that bucket's keys in batch order, so eviction is
// deterministic and needs no lock; keys are only ever placed into their own home bucket here.
template <class Key>
struct evict_fn {
  embedding_cache_ref<Key> t;
  const Key* keys;
  const std::uint64_t* homes;  // sorted
  const std::uint64_t* order;
  std::size_t n;
  const float* rows_in;
  const std::uint64_t* versions_in;
  std::uint64_t version;
  std::uint64_t op;
  std::uint8_t* outcome;  // per key
  std::int64_t* slots;    // per key
  Key* victim_keys;       // per key
  float* victim_rows;     // per key
  std::uint64_t* victim_versions;
  std::uint8_t* victim_dirty;

  EMBCACHE_HD void operator()(std::size_t i) const {
    if (i > 0 && homes[i] == homes[i - 1]) return;
    const std::size_t b = static_cast<std::size_t>(homes[i]);
    for (std::size_t j = i; j < n && homes[j] == homes[i]; ++j) place(b, order[j]);
  }

  EMBCACHE_HD void place(std::size_t b, std::size_t k) const {
    const Key key = keys[k];
    const auto h = t.hash(key);
    std::int64_t s = t.find_slot(key);
    if (s >= 0) {
      t.touch(s, op);
      slots[k] = s;
      outcome[k] = outcome_found;
      return;
    }
    const std::size_t first = b * cache_bucket_size;
    std::int64_t empty = -1;
    std::int64_t victim = -1;
    std::uint64_t victim_score = 0;
    for (std::size_t q = first; q < first + cache_bucket_size; ++q) {
      const std::uint8_t st = atomic_load(t.states + q);
      if (st == state_empty) {
        empty = static_cast<std::int64_t>(q);
        break;
      }
      if (st == state_busy) continue;
      // Only rows whose home is this bucket may go: others belong to other threads' chains.
      if (t.hash(t.keys[q]).home != b) continue;
      if (t.touched_by(static_cast<std::int64_t>(q), op)) continue;
      const std::uint64_t sc = atomic_load(t.scores + q);
      if (victim < 0 || sc < victim_score) {
        victim = static_cast<std::int64_t>(q);
        victim_score = sc;
      }
    }
    std::uint8_t result = outcome_inserted;
    if (empty >= 0) {
      s = empty;
    } else if (victim >= 0) {
      s = victim;
      result = outcome_evicted;
      victim_keys[k] = t.keys[s];
      embedding_cache_ref<Key>::copy_row(victim_rows + k * t.row_width, t.row(s), t.row_width);
      victim_versions[k] = atomic_load(t.versions + s);
      victim_dirty[k] = t.dirty(s) ? 1 : 0;
    } else {
      slots[k] = -1;
      outcome[k] = outcome_failed;
      return;
    }
    store_state_release(t.states, static_cast<std::size_t>(s), state_busy);
    t.keys[s] = key;
    if (rows_in) {
      embedding_cache_ref<Key>::copy_row(t.row(s), rows_in + k * t.row_width, t.row_width);
    } else {
      t.initialize_row(key, t.row(s));
    }
    atomic_store(t.versions + s, versions_in ? versions_in[k] : version);
    t.start_row(s, op);
    t.publish(s, h.digest);
    slots[k] = s;
    outcome[k] = result;
  }
};

template <class Key>
struct victim_flag_fn {
  const std::uint8_t* outcome;
  std::uint32_t* flags;
  EMBCACHE_HD void operator()(std::size_t i) const {
    flags[i] = outcome[i] == outcome_evicted ? 1u : 0u;
  }
};

template <class Key>
struct victim_compact_fn {
  const std::uint8_t* outcome;
  const std::uint64_t* positions;
  const Key* victim_keys;
  const float* victim_rows;
  const std::uint64_t* victim_versions;
  const std::uint8_t* victim_dirty;
  std::size_t row_width;
  Key* out_keys;
  float* out_rows;
  std::uint64_t* out_versions;
  bool* out_dirty;
  EMBCACHE_HD void operator()(std::size_t i) const {
    if (outcome[i] != outcome_evicted) return;
    const std::uint64_t p = positions[i];
    if (out_keys) out_keys[p] = victim_keys[i];
    if (out_rows)
      embedding_cache_ref<Key>::copy_row(out_rows + p * row_width, victim_rows + i * row_width,
                                         row_width);
    if (out_versions) out_versions[p] = victim_versions[i];
    if (out_dirty) out_dirty[p] = victim_dirty[i] != 0;
  }
};

}  // namespace embcache::detail
