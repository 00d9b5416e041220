/// @file detail/cache_install_loops.inl
/// @brief Loop bodies of embedding_cache::install: the keys placed first (one pass over the
/// hash table), then the rows and metadata of the new keys written (one pass over the rows).
#pragma once

#include <cstddef>
#include <cstdint>

#include "embcache/detail/cache_assign_loops.inl"
#include "embcache/detail/pipelined_slots.hpp"
#include "embcache/embedding_cache_ref.hpp"

namespace embcache::detail {

// Finds or places each key. A new key is published at once, row not yet written: install holds
// the table exclusively, so nothing reads the slot before install_fill_fn writes it (and a
// repeated key of the same call finds it published instead of waiting for a busy slot).
template <class Key>
struct install_place_fn {
  embedding_cache_ref<Key> t;
  const Key* keys;
  std::int64_t* slots;
  std::uint8_t* outcome;
  std::uint64_t op;
  // Host: the home bucket's state bytes, ahead of the probe.
  void prefetch(std::size_t i) const {
    const std::uint8_t* b = t.states + t.hash(keys[i]).home * cache_bucket_size;
    __builtin_prefetch(b, 1);
    __builtin_prefetch(b + 64, 1);
  }
  EMBCACHE_HD void operator()(std::size_t i) const {
    const auto c = t.find_or_claim(keys[i]);
    slots[i] = c.slot;
    if (c.slot < 0) {
      outcome[i] = outcome_failed;
      return;
    }
    if (c.inserted) {
      t.publish(c.slot, c.digest);
    } else {
      t.touch(c.slot, op);
    }
    outcome[i] = c.inserted ? outcome_inserted : outcome_found;
  }
};

// The row and metadata of each key install_place_fn inserted: what insert_or_assign, then
// mark_synced (`synced` may be nullptr: the row stays dirty) and set_marks give a new row.
template <class Key>
struct install_fill_fn {
  embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  const std::uint8_t* outcome;
  const float* rows;
  const std::uint64_t* versions_in;
  const std::uint64_t* synced_in;
  std::uint64_t version;
  std::uint64_t op;
  std::uint32_t mark;
  bool stream;  // host: rows copied with non-temporal stores (a batch larger than the caches)
  // Host: the slots are random, so the metadata lines (and, without streaming, the row's) of a
  // few rows ahead are requested for writing before they are written; the source rows are read
  // in order.
  void run_range(std::size_t begin, std::size_t end) const {
    constexpr std::size_t ahead = 4;
    auto want = [this](std::size_t i) {
      if (outcome[i] != outcome_inserted) return;
      const std::int64_t s = slots[i];
      if (!stream) prefetch_row(t, s, true);
      __builtin_prefetch(t.versions + s, 1);
      __builtin_prefetch(t.scores + s, 1);
      __builtin_prefetch(t.synced + s, 1);
      __builtin_prefetch(t.marks + s, 1);
    };
    for (std::size_t i = begin; i < end && i < begin + ahead; ++i) want(i);
    for (std::size_t i = begin; i < end; ++i) {
      if (i + ahead < end) want(i + ahead);
      if (outcome[i] != outcome_inserted) continue;
      const std::int64_t s = slots[i];
      const float* src = rows + i * t.row_width;
      if (!stream || !stream_row(t.row(s), src, t.row_width)) {
        embedding_cache_ref<Key>::copy_row(t.row(s), src, t.row_width);
      }
      metadata(i, s);
    }
#if !EMBCACHE_ON_DEVICE && defined(__SSE2__)
    if (stream) _mm_sfence();
#endif
  }
  EMBCACHE_HD void operator()(std::size_t i) const {
    if (outcome[i] != outcome_inserted) return;
    const std::int64_t s = slots[i];
    embedding_cache_ref<Key>::copy_row(t.row(s), rows + i * t.row_width, t.row_width);
    metadata(i, s);
  }
  EMBCACHE_HD void metadata(std::size_t i, std::int64_t s) const {
    atomic_store(t.versions + s, versions_in ? versions_in[i] : version);
    t.touch(s, op, true);
    atomic_store(t.synced + s, synced_in ? synced_in[i] : std::uint64_t{0});
    atomic_store(t.marks + s, mark);
  }
};

}  // namespace embcache::detail
