/// @file detail/cache_assign_loops.inl
/// @brief Loop bodies of the embedding cache's writes (find_or_insert, insert_or_assign,
/// assign_slots, mark_updated, erase), one key or slot per index.
#pragma once

#include <cstddef>
#include <cstdint>

#include "embcache/detail/pipelined_slots.hpp"
#include "embcache/embedding_cache_ref.hpp"

namespace embcache::detail {

// Outcome codes of one key in an insert pass.
inline constexpr std::uint8_t outcome_found = 0;
inline constexpr std::uint8_t outcome_inserted = 1;
inline constexpr std::uint8_t outcome_failed = 2;
inline constexpr std::uint8_t outcome_evicted = 3;  // inserted in place of a victim

// flags[i] = outcome[i] == value: the caller's inserted/found flags, written where they are.
struct outcome_flag_fn {
  const std::uint8_t* outcome;
  std::uint8_t value;
  bool* flags;
  EMBCACHE_HD void operator()(std::size_t i) const { flags[i] = outcome[i] == value; }
};

// Finds or inserts each key. `rows_in` given: new rows take rows_in[i] (insert_or_assign);
// otherwise new rows are initialized when `initialize`.
template <class Key>
struct insert_fn {
  embedding_cache_ref<Key> t;
  const Key* keys;
  std::int64_t* slots;
  std::uint8_t* outcome;
  float* rows_out;
  const float* rows_in;
  const std::uint64_t* versions_in;
  std::uint64_t version;
  std::uint64_t op;
  bool initialize;
  // Host: resident keys found by the pipeline skip find_or_claim (a key lives in one slot only,
  // so a checked match is the answer find_or_claim would give); the others take the full path.
  void run_range(std::size_t begin, std::size_t end) const {
    pipelined_slots(
        t, keys, begin, end, true,
        [this](std::size_t i, std::int64_t s) {
          if (s < 0) return (*this)(i);
          slots[i] = s;
          t.touch(s, op);
          outcome[i] = outcome_found;
          if (rows_out)
            embedding_cache_ref<Key>::copy_row(rows_out + i * t.row_width, t.row(s), t.row_width);
        },
        false);
  }
  EMBCACHE_HD void operator()(std::size_t i) const {
    const auto c = t.find_or_claim(keys[i]);
    slots[i] = c.slot;
    if (c.slot < 0) {
      outcome[i] = outcome_failed;
      return;
    }
    if (c.inserted) {
      float* r = t.row(c.slot);
      if (rows_in) {
        embedding_cache_ref<Key>::copy_row(r, rows_in + i * t.row_width, t.row_width);
        atomic_store(t.versions + c.slot, versions_in ? versions_in[i] : version);
      } else {
        if (initialize) t.initialize_row(keys[i], r);
        atomic_store(t.versions + c.slot, version);
      }
      t.start_row(c.slot, op);
      t.publish(c.slot, c.digest);
    } else {
      t.touch(c.slot, op);
    }
    outcome[i] = c.inserted ? outcome_inserted : outcome_found;
    if (rows_out)
      embedding_cache_ref<Key>::copy_row(rows_out + i * t.row_width, t.row(c.slot), t.row_width);
  }
};

// Last-writer-wins: the highest tag (epoch, batch index) claims a slot.
template <class Key>
struct claim_fn {
  embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  std::uint64_t epoch;
  void prefetch(std::size_t i) const {
    if (slots[i] >= 0) __builtin_prefetch(t.claims + slots[i], 1);
  }
  EMBCACHE_HD void operator()(std::size_t i) const {
    if (slots[i] >= 0) atomic_max(t.claims + slots[i], (epoch << 32) | std::uint64_t(i));
  }
};

template <class Key>
struct assign_fn {
  embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  const std::uint8_t* outcome;  // may be nullptr; rows already written at insertion are skipped
  const float* rows;
  const std::uint64_t* versions_in;
  std::uint64_t version;
  std::uint64_t epoch;
  // May be nullptr; else row i is the table's row rows_of[i] (install_rows), not rows + i * width.
  const std::int64_t* rows_of = nullptr;
  void prefetch_early(std::size_t i) const { prefetch_row_index(t, slots[i]); }
  void prefetch(std::size_t i) const {
    if (slots[i] < 0) return;
    __builtin_prefetch(t.claims + slots[i]);
    __builtin_prefetch(t.versions + slots[i], 1);
    prefetch_row(t, slots[i], true);
  }
  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::int64_t s = slots[i];
    if (s < 0) return;
    if (atomic_load(t.claims + s) != ((epoch << 32) | std::uint64_t(i))) return;
    if (outcome && outcome[i] == outcome_inserted) return;
    const float* src = rows_of ? t.rows + static_cast<std::size_t>(rows_of[i]) * t.row_width
                               : rows + i * t.row_width;
    embedding_cache_ref<Key>::copy_row(t.row(s), src, t.row_width);
    atomic_store(t.versions + s, versions_in ? versions_in[i] : version);
  }
};

template <class Key>
struct mark_fn {
  embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  std::uint64_t version;
  void prefetch(std::size_t i) const {
    if (slots[i] >= 0) __builtin_prefetch(t.versions + slots[i], 1);
  }
  EMBCACHE_HD void operator()(std::size_t i) const {
    if (slots[i] >= 0) atomic_store(t.versions + slots[i], version);
  }
};

template <class Key>
struct erase_fn {
  embedding_cache_ref<Key> t;
  const Key* keys;
  std::uint8_t* erased;
  EMBCACHE_HD void operator()(std::size_t i) const { erased[i] = t.erase_key(keys[i]) ? 1 : 0; }
};
}  // namespace embcache::detail
