/// @file detail/cache_install_loops.inl
/// @brief Loop bodies of embedding_cache::install: the keys placed first (one pass over the
/// hash table), then the rows and metadata of the new keys written (one pass over the rows); and
/// of the calls that move rows between slots and spare rows through the slot-to-row map
/// (install_rows, detach_rows, row_indices).
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
    auto want_early = [this](std::size_t i) {
      if (outcome[i] == outcome_inserted) prefetch_row_index(t, slots[i]);
    };
    for (std::size_t i = begin; i < end && i < begin + 2 * ahead; ++i) want_early(i);
    for (std::size_t i = begin; i < end && i < begin + ahead; ++i) want(i);
    for (std::size_t i = begin; i < end; ++i) {
      if (i + 2 * ahead < end) want_early(i + 2 * ahead);
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

// The slot-to-row map of a new table with spare rows: slot s holds row s.
struct identity_row_map_fn {
  std::uint32_t* row_map;
  EMBCACHE_HD void operator()(std::size_t s) const { row_map[s] = static_cast<std::uint32_t>(s); }
};

// 1 where a row index is negative or past the table's rows; indices beside a slot of -1 (when
// `slots` is given) are not used, so not checked.
struct row_index_check_fn {
  const std::int64_t* rows;
  const std::int64_t* slots;  // may be nullptr
  std::size_t row_count;
  std::uint8_t* bad;
  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::int64_t r = rows[i];
    const bool used = !slots || slots[i] >= 0;
    bad[i] = used && (r < 0 || static_cast<std::size_t>(r) >= row_count) ? 1 : 0;
  }
};

// install_rows: each slot install_place_fn inserted takes the given row and gives back the one it
// held (each inserted slot is one key's, so no two indices touch one slot); then the metadata a
// new row gets, as install_fill_fn writes it.
template <class Key>
struct install_swap_fn {
  install_fill_fn<Key> fill;  // rows unused
  std::uint32_t* row_map;
  std::int64_t* rows_io;
  // Host: the slot's map entry and metadata lines, for writing.
  void prefetch(std::size_t i) const {
    if (fill.outcome[i] != outcome_inserted) return;
    const std::int64_t s = fill.slots[i];
    __builtin_prefetch(row_map + s, 1);
    __builtin_prefetch(fill.t.versions + s, 1);
    __builtin_prefetch(fill.t.scores + s, 1);
    __builtin_prefetch(fill.t.synced + s, 1);
    __builtin_prefetch(fill.t.marks + s, 1);
  }
  EMBCACHE_HD void operator()(std::size_t i) const {
    if (fill.outcome[i] != outcome_inserted) return;
    const std::int64_t s = fill.slots[i];
    const std::uint32_t held = row_map[s];
    row_map[s] = static_cast<std::uint32_t>(rows_io[i]);
    rows_io[i] = held;
    fill.metadata(i, s);
  }
};

// detach_rows: each slot takes the given row and gives back the one it held.
struct detach_row_fn {
  const std::int64_t* slots;
  std::uint32_t* row_map;
  std::int64_t* rows_io;
  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::int64_t s = slots[i];
    if (s < 0) return;
    const std::uint32_t held = row_map[s];
    row_map[s] = static_cast<std::uint32_t>(rows_io[i]);
    rows_io[i] = held;
  }
};

// write_rows: row i of `src` into the table's row rows[i]. Host: a batch larger than the
// caches is written with non-temporal stores (the destinations are scattered: no read for
// ownership of their lines).
template <class Key>
struct write_rows_fn {
  float* table_rows;
  std::size_t row_width;
  const std::int64_t* rows;
  const float* src;
  bool stream;
  void run_range(std::size_t begin, std::size_t end) const {
    for (std::size_t i = begin; i < end; ++i) {
      float* dst = table_rows + static_cast<std::size_t>(rows[i]) * row_width;
      if (!stream || !stream_row(dst, src + i * row_width, row_width)) (*this)(i);
    }
#if !EMBCACHE_ON_DEVICE && defined(__SSE2__)
    if (stream) _mm_sfence();
#endif
  }
  EMBCACHE_HD void operator()(std::size_t i) const {
    embedding_cache_ref<Key>::copy_row(table_rows + static_cast<std::size_t>(rows[i]) * row_width,
                                       src + i * row_width, row_width);
  }
};

// read_rows: the table's row rows[i] into row i of `dst`; host: the scattered source rows a few
// indices ahead are requested first.
template <class Key>
struct read_rows_fn {
  const float* table_rows;
  std::size_t row_width;
  const std::int64_t* rows;
  float* dst;
  void prefetch(std::size_t i) const {
    const char* r = reinterpret_cast<const char*>(table_rows + static_cast<std::size_t>(rows[i]) *
                                                                   row_width);
    for (std::size_t b = 0; b < row_width * sizeof(float); b += 64) __builtin_prefetch(r + b);
  }
  EMBCACHE_HD void operator()(std::size_t i) const {
    embedding_cache_ref<Key>::copy_row(dst + i * row_width,
                                       table_rows + static_cast<std::size_t>(rows[i]) * row_width,
                                       row_width);
  }
};

// row_indices: the row each slot holds (-1 stays -1).
template <class Key>
struct row_index_fn {
  const_embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  std::int64_t* rows_out;
  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::int64_t s = slots[i];
    rows_out[i] = s < 0 ? -1 : static_cast<std::int64_t>(t.row_index(s));
  }
};

}  // namespace embcache::detail
