/// @file detail/cache_bookkeeping_loops.inl
/// @brief Loop bodies of the embedding cache's bookkeeping for a caller that keeps the rows in
/// sync with a backing store (the training cache): store versions, keyset marks, victim choice,
/// dirty rows gathered for a write-back, erase by slot.
#pragma once

#include <cstddef>
#include <cstdint>

#include "embcache/detail/pipelined_slots.hpp"
#include "embcache/embedding_cache_ref.hpp"

namespace embcache::detail {

// synced[s] = versions_in[i], or the row's own version.
template <class Key>
struct mark_synced_fn {
  embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  const std::uint64_t* versions_in;
  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::int64_t s = slots[i];
    if (s < 0) return;
    atomic_store(t.synced + s, versions_in ? versions_in[i] : atomic_load(t.versions + s));
  }
};

template <class Key>
struct set_marks_fn {
  embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  std::uint32_t mark;
  EMBCACHE_HD void operator()(std::size_t i) const {
    if (slots[i] >= 0) atomic_store(t.marks + slots[i], mark);
  }
};

// Flags the resident slots marked below `keep_mark`.
template <class Key>
struct victim_candidate_fn {
  const_embedding_cache_ref<Key> t;
  std::uint32_t keep_mark;
  std::uint32_t* flags;
  EMBCACHE_HD void operator()(std::size_t s) const {
    const bool resident = atomic_load(t.states + s) >= 2;
    flags[s] = resident && atomic_load(t.marks + s) < keep_mark ? 1u : 0u;
  }
};

// Writes the flagged slots, in slot order, at their scanned positions.
struct collect_flagged_fn {
  const std::uint32_t* flags;
  const std::uint64_t* positions;
  std::int64_t* out;
  EMBCACHE_HD void operator()(std::size_t s) const {
    if (flags[s]) out[positions[s]] = static_cast<std::int64_t>(s);
  }
};

// The sort keys of candidate slots: their keys as Key, or their versions or scores.
template <class Key>
struct candidate_keys_fn {
  const_embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  Key* keys_out;
  EMBCACHE_HD void operator()(std::size_t i) const { keys_out[i] = t.keys[slots[i]]; }
};
template <class Key>
struct candidate_order_fn {
  const_embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  bool by_score;
  std::uint64_t* out;
  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::int64_t s = slots[i];
    out[i] = atomic_load(by_score ? t.scores + s : t.versions + s);
  }
};

// A candidate's rank for select_victims: its version or score, then its key (keys are unique, so
// no two candidates tie).
template <class Key>
struct candidate_rank {
  std::uint64_t first;
  Key key;
  EMBCACHE_HD bool operator<(const candidate_rank& o) const {
    return first < o.first || (first == o.first && key < o.key);
  }
};
template <class Key>
struct candidate_rank_fn {
  const_embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  bool by_score;
  candidate_rank<Key>* out;
  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::int64_t s = slots[i];
    out[i] = {atomic_load(by_score ? t.scores + s : t.versions + s), t.keys[s]};
  }
};
// Unflags the candidates ranked after `last` (the need-th), so that the flagged slots are the
// chosen ones.
template <class Key>
struct unflag_after_fn {
  const std::int64_t* slots;
  const candidate_rank<Key>* ranks;
  candidate_rank<Key> last;
  std::uint32_t* flags;
  EMBCACHE_HD void operator()(std::size_t i) const {
    if (last < ranks[i]) flags[slots[i]] = 0u;
  }
};

// Flags the slots of `slots` holding a dirty row.
template <class Key>
struct dirty_flag_fn {
  const_embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  std::uint32_t* flags;
  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::int64_t s = slots[i];
    flags[i] = s >= 0 && atomic_load(t.states + s) >= 2 && t.dirty(s) ? 1u : 0u;
  }
};

template <class Key>
struct dirty_gather_fn {
  const_embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  const std::uint32_t* flags;
  const std::uint64_t* positions;
  Key* keys_out;
  float* rows_out;
  std::uint64_t* versions_out;
  std::int64_t* slots_out;
  bool stream;  // host: rows written with non-temporal stores (a batch larger than the caches)
  // Host: the rows of a few slots ahead are requested before they are read, and, streaming, the
  // output rows are written past the caches.
  void run_range(std::size_t begin, std::size_t end) const {
    constexpr std::size_t ahead = 4;
    for (std::size_t i = begin; i < end && i < begin + 2 * ahead; ++i) {
      if (flags[i]) prefetch_row_index(t, slots[i]);
    }
    for (std::size_t i = begin; i < end && i < begin + ahead; ++i) {
      if (flags[i]) prefetch_row(t, slots[i], false);
    }
    for (std::size_t i = begin; i < end; ++i) {
      if (i + 2 * ahead < end && flags[i + 2 * ahead]) prefetch_row_index(t, slots[i + 2 * ahead]);
      if (i + ahead < end && flags[i + ahead]) prefetch_row(t, slots[i + ahead], false);
      if (!flags[i]) continue;
      if (stream && rows_out) {
        const std::uint64_t p = positions[i];
        if (stream_row(rows_out + p * t.row_width, t.row(slots[i]), t.row_width)) {
          copy(i, false);
          continue;
        }
      }
      copy(i, true);
    }
#if !EMBCACHE_ON_DEVICE && defined(__SSE2__)
    if (stream) _mm_sfence();
#endif
  }
  EMBCACHE_HD void operator()(std::size_t i) const {
    if (flags[i]) copy(i, true);
  }
  EMBCACHE_HD void copy(std::size_t i, bool with_row) const {
    const std::int64_t s = slots[i];
    const std::uint64_t p = positions[i];
    if (keys_out) keys_out[p] = t.keys[s];
    if (rows_out && with_row)
      embedding_cache_ref<Key>::copy_row(rows_out + p * t.row_width, t.row(s), t.row_width);
    if (versions_out) versions_out[p] = atomic_load(t.versions + s);
    if (slots_out) slots_out[p] = s;
  }
};

// Erases the key held at each slot (an empty slot, or one whose key was erased by an earlier
// duplicate, is skipped).
template <class Key>
struct erase_slot_fn {
  embedding_cache_ref<Key> t;
  const std::int64_t* slots;
  std::uint8_t* erased;
  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::int64_t s = slots[i];
    erased[i] = s >= 0 && atomic_load(t.states + s) >= 2 && t.erase_key(t.keys[s]) ? 1 : 0;
  }
};

}  // namespace embcache::detail
