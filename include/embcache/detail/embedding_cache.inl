/// @file detail/embedding_cache.inl
/// @brief Definitions of embedding_cache: every bulk operation is a parallel loop over the
/// single-key operations of cache_ref, run by the space's `for_each_index`.
///
/// Include after the space's algorithms header (detail/host_algorithms.hpp or
/// cuda/algorithms.cuh), then instantiate.
#pragma once

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "embcache/detail/cache_ref.hpp"
#include "embcache/embedding_cache.hpp"

namespace embcache {
namespace detail {

// Outcome codes of one key in an insert pass.
inline constexpr std::uint8_t outcome_found = 0;
inline constexpr std::uint8_t outcome_inserted = 1;
inline constexpr std::uint8_t outcome_failed = 2;
inline constexpr std::uint8_t outcome_evicted = 3;  // inserted in place of a victim

// Host-only hint: the lines of the row of `slot` (-1: nothing), for reading or (`write`) writing.
template <class Key>
void prefetch_row(const cache_ref<Key>& t, std::int64_t slot, bool write) {
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

// Host-only: the slot of each key of keys[begin, end), through a software pipeline that hashes
// every key once and keeps the memory accesses of several keys in flight. Stage 1 (16 keys
// ahead) prefetches the home bucket's state bytes, stage 2 (8 ahead) the key of every digest
// match there, stage 3 (4 ahead) finds the key in its home bucket and prefetches its score and,
// `with_row`, its row. `visit(i, slot)` then runs in index order. The slot of stage 3 is checked
// again there (state byte and key), and a key not found in its home bucket, or whose slot changed
// meanwhile, goes through find_slot: the slots are exactly find_slot's. Without `resolve`, such
// keys get -1 instead (the caller does the full search). On the device (the cuda space never
// calls this) it is the plain loop.
template <class Key, class Visit>
void pipelined_slots(const cache_ref<Key>& t, const Key* keys, std::size_t begin, std::size_t end,
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
      unsigned m = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(
          _mm_load_si128(reinterpret_cast<const __m128i*>(t.states + first + g)), needle)));
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

template <class Key>
struct find_fn {
  cache_ref<Key> t;
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
    if (rows_out) cache_ref<Key>::copy_row(rows_out + i * t.row_width, t.row(s), t.row_width);
  }
#if defined(__CUDACC__)
  // The cuda space runs a warp per key: one bucket load per probe step, coalesced row copies.
  static constexpr bool warp_per_index = true;
  __device__ void warp(std::size_t i, unsigned lane) const {
    const std::int64_t s = t.warp_find_slot(keys[i], lane);
    if (lane == 0) {
      if (found_out) found_out[i] = s >= 0;
      if (s >= 0) t.touch(s, op);
    }
    if (s < 0 || !rows_out) return;
    const float* src = t.row(s);
    float* dst = rows_out + i * t.row_width;
    for (std::size_t j = lane; j < t.row_width; j += 32) dst[j] = src[j];
  }
#endif
};

template <class Key>
struct slot_fn {
  cache_ref<Key> t;
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
#if defined(__CUDACC__)
  static constexpr bool warp_per_index = true;
  __device__ void warp(std::size_t i, unsigned lane) const {
    const std::int64_t s = t.warp_find_slot(keys[i], lane);
    if (lane == 0) finish(i, s);
  }
#endif
};

// Finds or inserts each key. `rows_in` given: new rows take rows_in[i] (insert_or_assign);
// otherwise new rows are initialized when `initialize`.
template <class Key>
struct insert_fn {
  cache_ref<Key> t;
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
          if (rows_out) cache_ref<Key>::copy_row(rows_out + i * t.row_width, t.row(s), t.row_width);
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
        cache_ref<Key>::copy_row(r, rows_in + i * t.row_width, t.row_width);
        atomic_store(t.versions + c.slot, versions_in ? versions_in[i] : version);
      } else {
        if (initialize) t.initialize_row(keys[i], r);
        atomic_store(t.versions + c.slot, version);
      }
      t.set_fresh_score(c.slot, op);
      t.publish(c.slot, c.digest);
    } else {
      t.touch(c.slot, op);
    }
    outcome[i] = c.inserted ? outcome_inserted : outcome_found;
    if (rows_out) cache_ref<Key>::copy_row(rows_out + i * t.row_width, t.row(c.slot), t.row_width);
  }
};

// Last-writer-wins: the highest tag (epoch, batch index) claims a slot.
template <class Key>
struct claim_fn {
  cache_ref<Key> t;
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
  cache_ref<Key> t;
  const std::int64_t* slots;
  const std::uint8_t* outcome;  // may be nullptr; rows already written at insertion are skipped
  const float* rows;
  const std::uint64_t* versions_in;
  std::uint64_t version;
  std::uint64_t epoch;
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
    cache_ref<Key>::copy_row(t.row(s), rows + i * t.row_width, t.row_width);
    atomic_store(t.versions + s, versions_in ? versions_in[i] : version);
  }
};

template <class Key>
struct read_slots_fn {
  cache_ref<Key> t;
  const std::int64_t* slots;
  float* rows_out;
  void prefetch(std::size_t i) const { prefetch_row(t, slots[i], false); }
  EMBCACHE_HD void operator()(std::size_t i) const {
    if (slots[i] >= 0)
      cache_ref<Key>::copy_row(rows_out + i * t.row_width, t.row(slots[i]), t.row_width);
  }
};

template <class Key>
struct mark_fn {
  cache_ref<Key> t;
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
  cache_ref<Key> t;
  const Key* keys;
  std::uint8_t* erased;
  EMBCACHE_HD void operator()(std::size_t i) const { erased[i] = t.erase_key(keys[i]) ? 1 : 0; }
};

template <class Key>
struct home_fn {
  cache_ref<Key> t;
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
  cache_ref<Key> t;
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
      cache_ref<Key>::copy_row(victim_rows + k * t.row_width, t.row(s), t.row_width);
      victim_versions[k] = atomic_load(t.versions + s);
    } else {
      slots[k] = -1;
      outcome[k] = outcome_failed;
      return;
    }
    atomic_store(t.states + s, state_busy, cuda::std::memory_order_release);
    t.keys[s] = key;
    if (rows_in) {
      cache_ref<Key>::copy_row(t.row(s), rows_in + k * t.row_width, t.row_width);
    } else {
      t.initialize_row(key, t.row(s));
    }
    atomic_store(t.versions + s, versions_in ? versions_in[k] : version);
    t.set_fresh_score(s, op);
    t.publish(s, h.digest);
    slots[k] = s;
    outcome[k] = result;
  }
};

struct export_flag_fn {
  const std::uint8_t* states;
  const std::uint64_t* versions;
  export_filter filter;
  std::uint32_t* flags;
  EMBCACHE_HD void operator()(std::size_t s) const {
    const std::uint8_t st = atomic_load(const_cast<std::uint8_t*>(states) + s);
    bool take = st >= 2;
    if (take && !filter.all) take = versions[s] > filter.changed_since;
    flags[s] = take ? 1u : 0u;
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
  cache_ref<Key> t;
  const std::int64_t* slots;
  float* rows_out;
  std::uint64_t* versions_out;
  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::int64_t s = slots[i];
    if (rows_out) cache_ref<Key>::copy_row(rows_out + i * t.row_width, t.row(s), t.row_width);
    if (versions_out) versions_out[i] = t.versions[s];
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
  std::size_t row_width;
  Key* out_keys;
  float* out_rows;
  std::uint64_t* out_versions;
  EMBCACHE_HD void operator()(std::size_t i) const {
    if (outcome[i] != outcome_evicted) return;
    const std::uint64_t p = positions[i];
    if (out_keys) out_keys[p] = victim_keys[i];
    if (out_rows)
      cache_ref<Key>::copy_row(out_rows + p * row_width, victim_rows + i * row_width, row_width);
    if (out_versions) out_versions[p] = victim_versions[i];
  }
};

template <class Key>
std::string key_to_string(Key k) {
  return std::to_string(k);
}

}  // namespace detail

template <class Key, class Space>
embedding_cache<Key, Space>::embedding_cache(const cache_options& options, Space space)
    : options_(options), space_(space), mutex_(std::make_unique<std::shared_mutex>()) {
  if (options.capacity == 0)
    throw error(status_code::invalid_argument, "embedding_cache: capacity must be at least 1");
  if (options.dim == 0)
    throw error(status_code::invalid_argument, "embedding_cache: dim must be at least 1");
  num_buckets_ = (options.capacity + bucket_size - 1) / bucket_size;
  capacity_ = num_buckets_ * bucket_size;
  row_width_ = options.dim + options.state_width;
  states_ = buffer<std::uint8_t, Space>(capacity_, space_);
  keys_ = buffer<Key, Space>(capacity_, space_);
  overflow_ = buffer<std::uint32_t, Space>(num_buckets_, space_);
  versions_ = buffer<std::uint64_t, Space>(capacity_, space_);
  scores_ = buffer<std::uint64_t, Space>(capacity_, space_);
  if (options.scores == score_policy::lfu)
    touched_ = buffer<std::uint64_t, Space>(capacity_, space_);
  claims_ = buffer<std::uint64_t, Space>(capacity_, space_);
  rows_ = buffer<float, Space>(capacity_ * row_width_, space_);
  states_.fill_bytes(0);
  overflow_.fill_bytes(0);
  versions_.fill_bytes(0);
  scores_.fill_bytes(0);
  if (touched_.data()) touched_.fill_bytes(0);
  claims_.fill_bytes(0);
  detail::synchronize(space_);
}

template <class Key, class Space>
embedding_cache<Key, Space>::~embedding_cache() = default;

template <class Key, class Space>
detail::cache_ref<Key> embedding_cache<Key, Space>::ref() const noexcept {
  auto* self = const_cast<embedding_cache*>(this);
  return detail::cache_ref<Key>{self->states_.data(),
                                self->keys_.data(),
                                self->overflow_.data(),
                                self->versions_.data(),
                                self->scores_.data(),
                                self->touched_.data(),
                                self->claims_.data(),
                                self->rows_.data(),
                                num_buckets_,
                                row_width_,
                                options_.dim,
                                options_.init,
                                options_.init.scale * 1.7320508075688772f,
                                options_.scores};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::find(const Key* keys, std::size_t n, float* rows_out,
                                         bool* found_out) {
  std::shared_lock lock(*mutex_);
  detail::for_each_index(space_, n,
                         detail::find_fn<Key>{ref(), keys, rows_out, found_out, next_op()});
  detail::synchronize(space_);
  return {};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::check_no_failures(const std::int64_t* slots, const Key* keys,
                                                      std::size_t n, const char* what) const {
  // Rare path: copy back to name the first key that did not fit.
  std::vector<std::int64_t> s(n);
  std::vector<Key> k(n);
  detail::copy(space_, s.data(), slots, n * sizeof(std::int64_t));
  detail::copy(space_, k.data(), keys, n * sizeof(Key));
  std::size_t failed = 0;
  std::size_t first = n;
  for (std::size_t i = 0; i < n; ++i)
    if (s[i] < 0) {
      if (first == n) first = i;
      ++failed;
    }
  if (failed == 0) return {};
  return status::capacity_exceeded(
      std::string("embedding_cache::") + what + ": no room for " + std::to_string(failed) + " of " +
      std::to_string(n) + " keys (first: key " + detail::key_to_string(k[first]) +
      " at batch index " + std::to_string(first) + "); size " + std::to_string(size_.load()) +
      " of capacity " + std::to_string(capacity_));
}

template <class Key, class Space>
status embedding_cache<Key, Space>::insert_pass(const Key* keys, std::size_t n, std::int64_t* slots,
                                                float* rows_out, bool* inserted_out,
                                                bool initialize, std::uint64_t op,
                                                const char* what) {
  buffer<std::uint8_t, Space> outcome(n, space_);
  const std::uint64_t version = next_version();
  detail::for_each_index(space_, n,
                         detail::insert_fn<Key>{ref(), keys, slots, outcome.data(), rows_out,
                                                nullptr, nullptr, version, op, initialize});
  const std::size_t inserted =
      detail::count_equal(space_, outcome.data(), n, detail::outcome_inserted);
  const std::size_t failed = detail::count_equal(space_, outcome.data(), n, detail::outcome_failed);
  size_ += inserted;
  if (inserted_out) {
    // outcome_inserted == 1 and outcome_found == 0; failures report false.
    std::vector<std::uint8_t> o(n);
    detail::copy(space_, o.data(), outcome.data(), n);
    std::vector<std::uint8_t> flags(n);
    for (std::size_t i = 0; i < n; ++i) flags[i] = o[i] == detail::outcome_inserted;
    detail::copy(space_, inserted_out, flags.data(), n);
  }
  detail::synchronize(space_);
  if (failed) return check_no_failures(slots, keys, n, what);
  return {};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::find_or_insert(const Key* keys, std::size_t n, float* rows_out,
                                                   bool* inserted_out) {
  std::shared_lock lock(*mutex_);
  buffer<std::int64_t, Space> slots(n, space_);
  return insert_pass(keys, n, slots.data(), rows_out, inserted_out, true, next_op(),
                     "find_or_insert");
}

template <class Key, class Space>
status embedding_cache<Key, Space>::lookup_slots(const Key* keys, std::size_t n,
                                                 std::int64_t* slots_out, bool insert_missing,
                                                 bool* inserted_out) {
  std::shared_lock lock(*mutex_);
  if (insert_missing)
    return insert_pass(keys, n, slots_out, nullptr, inserted_out, true, next_op(), "lookup_slots");
  detail::for_each_index(space_, n, detail::slot_fn<Key>{ref(), keys, slots_out, next_op()});
  detail::synchronize(space_);
  return {};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::insert_or_assign(const Key* keys, std::size_t n,
                                                     const float* rows,
                                                     const std::uint64_t* versions) {
  std::shared_lock lock(*mutex_);
  if (n == 0) return {};
  buffer<std::int64_t, Space> slots(n, space_);
  buffer<std::uint8_t, Space> outcome(n, space_);
  const std::uint64_t version = next_version();
  const std::uint64_t op = next_op();
  detail::for_each_index(space_, n,
                         detail::insert_fn<Key>{ref(), keys, slots.data(), outcome.data(), nullptr,
                                                rows, versions, version, op, false});
  const std::uint64_t epoch = ++claim_epoch_;
  detail::for_each_index(space_, n, detail::claim_fn<Key>{ref(), slots.data(), epoch});
  detail::for_each_index(
      space_, n,
      detail::assign_fn<Key>{ref(), slots.data(), outcome.data(), rows, versions, version, epoch});
  size_ += detail::count_equal(space_, outcome.data(), n, detail::outcome_inserted);
  const std::size_t failed = detail::count_equal(space_, outcome.data(), n, detail::outcome_failed);
  detail::synchronize(space_);
  if (failed) return check_no_failures(slots.data(), keys, n, "insert_or_assign");
  return {};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::erase(const Key* keys, std::size_t n, std::size_t* erased_out) {
  std::unique_lock lock(*mutex_);
  buffer<std::uint8_t, Space> erased(n, space_);
  detail::for_each_index(space_, n, detail::erase_fn<Key>{ref(), keys, erased.data()});
  const std::size_t count = detail::count_equal(space_, erased.data(), n, std::uint8_t{1});
  size_ -= count;
  if (count) next_version();  // an erase is a change of the model
  if (erased_out) *erased_out = count;
  detail::synchronize(space_);
  return {};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::read_slots(const std::int64_t* slots, std::size_t n,
                                               float* rows_out) const {
  std::shared_lock lock(*mutex_);
  detail::for_each_index(space_, n, detail::read_slots_fn<Key>{ref(), slots, rows_out});
  detail::synchronize(space_);
  return {};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::assign_slots(const std::int64_t* slots, std::size_t n,
                                                 const float* rows, const std::uint64_t* versions) {
  std::shared_lock lock(*mutex_);
  if (n == 0) return {};
  const std::uint64_t version = next_version();
  const std::uint64_t epoch = ++claim_epoch_;
  detail::for_each_index(space_, n, detail::claim_fn<Key>{ref(), slots, epoch});
  detail::for_each_index(
      space_, n, detail::assign_fn<Key>{ref(), slots, nullptr, rows, versions, version, epoch});
  detail::synchronize(space_);
  return {};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::mark_updated(const std::int64_t* slots, std::size_t n) {
  std::shared_lock lock(*mutex_);
  if (n == 0) return {};
  detail::for_each_index(space_, n, detail::mark_fn<Key>{ref(), slots, next_version()});
  detail::synchronize(space_);
  return {};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::insert_and_evict(
    const Key* keys, std::size_t n, const float* rows_in, const std::uint64_t* versions_in,
    Key* evicted_keys, float* evicted_rows, std::uint64_t* evicted_versions,
    std::size_t* evicted_count, bool* found_out, std::int64_t* slots_out) {
  std::unique_lock lock(*mutex_);
  if (evicted_count) *evicted_count = 0;
  if (n == 0) return {};
  buffer<std::uint64_t, Space> homes(n, space_);
  buffer<std::uint64_t, Space> order(n, space_);
  buffer<std::uint8_t, Space> outcome(n, space_);
  buffer<std::int64_t, Space> slots(n, space_);
  buffer<Key, Space> vkeys(n, space_);
  buffer<float, Space> vrows(n * row_width_, space_);
  buffer<std::uint64_t, Space> vversions(n, space_);
  const auto t = ref();
  detail::for_each_index(space_, n, detail::home_fn<Key>{t, keys, homes.data(), order.data()});
  detail::stable_sort_by_key(space_, homes.data(), order.data(), n);
  const std::uint64_t version = next_version();
  const std::uint64_t op = next_op();
  detail::for_each_index(
      space_, n,
      detail::evict_fn<Key>{t, keys, homes.data(), order.data(), n, rows_in, versions_in, version,
                            op, outcome.data(), slots.data(), vkeys.data(), vrows.data(),
                            vversions.data()});
  const std::size_t inserted =
      detail::count_equal(space_, outcome.data(), n, detail::outcome_inserted);
  const std::size_t evicted =
      detail::count_equal(space_, outcome.data(), n, detail::outcome_evicted);
  const std::size_t failed = detail::count_equal(space_, outcome.data(), n, detail::outcome_failed);
  size_ += inserted;
  if (evicted) {
    buffer<std::uint32_t, Space> flags(n, space_);
    buffer<std::uint64_t, Space> positions(n, space_);
    detail::for_each_index(space_, n, detail::victim_flag_fn<Key>{outcome.data(), flags.data()});
    detail::exclusive_scan(space_, flags.data(), positions.data(), n);
    detail::for_each_index(
        space_, n,
        detail::victim_compact_fn<Key>{outcome.data(), positions.data(), vkeys.data(), vrows.data(),
                                       vversions.data(), row_width_, evicted_keys, evicted_rows,
                                       evicted_versions});
  }
  if (evicted_count) *evicted_count = evicted;
  if (slots_out) detail::copy(space_, slots_out, slots.data(), n * sizeof(std::int64_t));
  if (found_out) {
    std::vector<std::uint8_t> o(n);
    detail::copy(space_, o.data(), outcome.data(), n);
    std::vector<std::uint8_t> f(n);
    for (std::size_t i = 0; i < n; ++i) f[i] = o[i] == detail::outcome_found;
    detail::copy(space_, found_out, f.data(), n);
  }
  detail::synchronize(space_);
  if (failed) return check_no_failures(slots.data(), keys, n, "insert_and_evict");
  return {};
}

template <class Key, class Space>
std::size_t embedding_cache<Key, Space>::count_if(const export_filter& filter) const {
  std::unique_lock lock(*mutex_);
  buffer<std::uint32_t, Space> flags(capacity_, space_);
  detail::for_each_index(
      space_, capacity_,
      detail::export_flag_fn{states_.data(), versions_.data(), filter, flags.data()});
  return detail::count_equal(space_, flags.data(), capacity_, std::uint32_t{1});
}

template <class Key, class Space>
status embedding_cache<Key, Space>::export_if(const export_filter& filter, Key* keys_out,
                                              float* rows_out, std::uint64_t* versions_out,
                                              std::size_t max_out, std::size_t* count_out) const {
  std::unique_lock lock(*mutex_);
  if (count_out) *count_out = 0;
  buffer<std::uint32_t, Space> flags(capacity_, space_);
  buffer<std::uint64_t, Space> positions(capacity_, space_);
  detail::for_each_index(
      space_, capacity_,
      detail::export_flag_fn{states_.data(), versions_.data(), filter, flags.data()});
  const std::size_t count = detail::count_equal(space_, flags.data(), capacity_, std::uint32_t{1});
  if (count > max_out)
    return status::capacity_exceeded("embedding_cache::export_if: " + std::to_string(count) +
                                     " rows match but the output holds " + std::to_string(max_out));
  detail::exclusive_scan(space_, flags.data(), positions.data(), capacity_);
  buffer<std::int64_t, Space> slots(count, space_);
  detail::for_each_index(space_, capacity_,
                         detail::export_collect_fn<Key>{keys_.data(), flags.data(),
                                                        positions.data(), keys_out, slots.data()});
  detail::stable_sort_by_key(space_, keys_out, slots.data(), count);
  detail::for_each_index(
      space_, count, detail::export_gather_fn<Key>{ref(), slots.data(), rows_out, versions_out});
  detail::synchronize(space_);
  if (count_out) *count_out = count;
  return {};
}

template <class Key, class Space>
result<exported_rows<Key>> embedding_cache<Key, Space>::export_to_host(
    const export_filter& filter) const {
  const std::size_t count = count_if(filter);
  exported_rows<Key> out;
  out.keys.resize(count);
  out.rows.resize(count * row_width_);
  out.versions.resize(count);
  std::size_t written = 0;
  if constexpr (is_host_space_v<Space>) {
    EMBCACHE_RETURN_IF_ERROR(
        export_if(filter, out.keys.data(), out.rows.data(), out.versions.data(), count, &written));
  } else {
    buffer<Key, Space> k(count, space_);
    buffer<float, Space> r(count * row_width_, space_);
    buffer<std::uint64_t, Space> v(count, space_);
    EMBCACHE_RETURN_IF_ERROR(export_if(filter, k.data(), r.data(), v.data(), count, &written));
    k.copy_to_host(out.keys.data(), written);
    r.copy_to_host(out.rows.data(), written * row_width_);
    v.copy_to_host(out.versions.data(), written);
  }
  out.keys.resize(written);
  out.rows.resize(written * row_width_);
  out.versions.resize(written);
  return out;
}

template <class Key, class Space>
void embedding_cache<Key, Space>::clear() {
  std::unique_lock lock(*mutex_);
  states_.fill_bytes(0);
  overflow_.fill_bytes(0);
  scores_.fill_bytes(0);
  if (touched_.data()) touched_.fill_bytes(0);
  detail::synchronize(space_);
  size_ = 0;
}

}  // namespace embcache
