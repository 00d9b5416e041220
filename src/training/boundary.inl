// The pass boundary (keyset mode): which keys of the keyset are missing, which residents leave
// (as far as max_resident requires, oldest first), the dirty leavers gathered for the
// write-behind, and the missing rows brought in from the staging, the store or the initializer.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>

#include "training/training_cache_core.hpp"

namespace embcache::detail {

template <class Key, class Space>
status training_cache_core<Key, Space>::swap_in(table_type& tb, const std::vector<Key>& missing,
                                                bool use_staging, table_counters& c) {
  if (use_staging && tb.sync.writes_log.empty() &&
      (&missing == &tb.staged.keys || tb.staged.keys == missing)) {
    return swap_in_staged(tb, missing, c);
  }
  const auto t0 = clock_type::now();
  const std::size_t n = missing.size(), w = tb.row_width;
  std::vector<float> rows(n * w);
  std::vector<std::uint64_t> vers(n, 0);
  std::unique_ptr<bool[]> found(new bool[std::max<std::size_t>(n, 1)]);
  std::vector<std::size_t> to_pull;
  if (use_staging) {
    // Keys the store changed for after staging began must be re-pulled.
    auto log = std::move(tb.sync.writes_log);
    std::sort(log.begin(), log.end());
    const auto& st = tb.staged;
    std::size_t j = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const Key k = missing[i];
      while (j < st.keys.size() && st.keys[j] < k) ++j;
      const bool staged = j < st.keys.size() && st.keys[j] == k;
      if (staged && !std::binary_search(log.begin(), log.end(), k)) {
        std::memcpy(rows.data() + i * w, st.rows.data() + j * w, w * sizeof(float));
        vers[i] = st.versions[j];
        found[i] = st.found[j] != 0;
        ++c.rows_staged;
      } else {
        if (staged) ++c.rows_restaged;
        to_pull.push_back(i);
      }
    }
  } else {
    to_pull.resize(n);
    std::iota(to_pull.begin(), to_pull.end(), std::size_t{0});
  }
  if (to_pull.size() == n) {
    EMBCACHE_RETURN_IF_ERROR(pull(tb, missing.data(), n, rows.data(), found.get(), vers.data()));
  } else if (!to_pull.empty()) {
    const std::size_t m = to_pull.size();
    std::vector<Key> k(m);
    std::vector<float> r(m * w);
    std::vector<std::uint64_t> v(m);
    std::unique_ptr<bool[]> f(new bool[m]);
    for (std::size_t i = 0; i < m; ++i) k[i] = missing[to_pull[i]];
    EMBCACHE_RETURN_IF_ERROR(pull(tb, k.data(), m, r.data(), f.get(), v.data()));
    for (std::size_t i = 0; i < m; ++i) {
      const std::size_t d = to_pull[i];
      std::memcpy(rows.data() + d * w, r.data() + i * w, w * sizeof(float));
      vers[d] = v[i];
      found[d] = f[i];
    }
  }
  c.rows_pulled += to_pull.size();
  // New rows get a fresh version so that they are dirty (written back) and exported.
  std::uint64_t init_version = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (found[i]) continue;
    if (!init_version) init_version = fresh_version(tb);
    initialize_row(tb, missing[i], rows.data() + i * w);
    vers[i] = init_version;
    ++c.rows_initialized;
  }
  c.bytes_store_to_cache += (n - c.rows_initialized) * w * sizeof(float);
  EMBCACHE_RETURN_IF_ERROR(tb.bridge.insert_or_assign(missing.data(), n, rows.data(), vers.data()));
  std::vector<std::int64_t> slots(n);
  EMBCACHE_RETURN_IF_ERROR(tb.bridge.lookup_slots(missing.data(), n, slots.data()));
  for (std::size_t i = 0; i < n; ++i) {
    if (slots[i] < 0) return status::internal("inserted key is absent from the cache");
    tb.book.slot_used[slots[i]] = 1;
    tb.book.slot_mark[slots[i]] = tb.book.mark_epoch;  // a key of this pass (early_evict reads it)
    tb.book.slot_synced[slots[i]] = found[i] ? vers[i] : 0;
  }
  c.seconds_swap_in += seconds_since(t0);
  return {};
}

// Every missing key staged, none written to the store since: the staged rows go in as they are,
// without another copy (the common case, and the one whose blocking time prefetch must cut).
template <class Key, class Space>
status training_cache_core<Key, Space>::swap_in_staged(table_type& tb,
                                                       const std::vector<Key>& missing,
                                                       table_counters& c) {
  const auto t0 = clock_type::now();
  auto& st = tb.staged;
  const std::size_t n = missing.size(), w = tb.row_width;
  std::uint64_t init_version = 0;
  std::size_t initialized = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (st.found[i]) continue;
    // Initialized by the worker; a fresh version makes the row dirty (written back, exported).
    if (!init_version) init_version = fresh_version(tb);
    st.versions[i] = init_version;
    ++initialized;
  }
  c.rows_staged += n;
  c.rows_initialized += initialized;
  c.bytes_store_to_cache += (n - initialized) * w * sizeof(float);
  EMBCACHE_RETURN_IF_ERROR(
      tb.bridge.insert_or_assign(missing.data(), n, st.rows.data(), st.versions.data()));
  auto& slots = tb.scratch.slots;
  slots.resize(n);
  EMBCACHE_RETURN_IF_ERROR(tb.bridge.lookup_slots(missing.data(), n, slots.data()));
  for (std::size_t i = 0; i < n; ++i) {
    if (slots[i] < 0) return status::internal("inserted key is absent from the cache");
    tb.book.slot_used[slots[i]] = 1;
    tb.book.slot_mark[slots[i]] = tb.book.mark_epoch;  // a key of this pass (early_evict reads it)
    tb.book.slot_synced[slots[i]] = st.found[i] ? st.versions[i] : 0;
  }
  c.seconds_swap_in += seconds_since(t0);
  return {};
}

// Removes the rows of `victims` (slots) from the cache; the dirty ones are gathered and pushed,
// by the flusher after begin_pass returns when write-behind is on.
template <class Key, class Space>
status training_cache_core<Key, Space>::evict(table_type& tb,
                                              const std::vector<std::int64_t>& victims,
                                              const slot_meta<Key>& ref, table_counters& c) {
  const auto t0 = clock_type::now();
  const std::size_t m = victims.size(), w = tb.row_width;
  std::vector<Key>& keys = tb.scratch.keys;
  keys.resize(m);
  std::vector<std::int64_t> dirty_slots;
  std::vector<Key> dirty_keys;
  std::vector<std::uint64_t> dirty_vers;
  dirty_slots.reserve(m);
  dirty_keys.reserve(m);
  dirty_vers.reserve(m);
  for (std::size_t i = 0; i < m; ++i) {
    const auto s = victims[i];
    keys[i] = ref.keys[s];
    const std::uint64_t v = ref.versions[s];
    if (!tb.book.slot_used[s] || v > tb.book.slot_synced[s]) {
      dirty_slots.push_back(s);
      dirty_keys.push_back(keys[i]);
      dirty_vers.push_back(v);
    }
    tb.book.slot_used[s] = 0;
  }
  const std::size_t d = dirty_slots.size();
  auto& rows = tb.wb.spare_rows;
  if (rows.size() < d * w) rows.resize(d * w);
  EMBCACHE_RETURN_IF_ERROR(tb.bridge.read_slots(dirty_slots.data(), d, rows.data()));
  EMBCACHE_RETURN_IF_ERROR(tb.bridge.erase(keys.data(), m));
  tb.exports.written.insert(tb.exports.written.end(), dirty_keys.begin(), dirty_keys.end());
  c.rows_pushed += d;
  c.rows_evicted += m;
  c.bytes_cache_to_store += d * w * sizeof(float);
  if (options.write_behind) {
    tb.wb.keys = std::move(dirty_keys);
    tb.wb.versions = std::move(dirty_vers);
    tb.wb.rows.swap(rows);
  } else {
    EMBCACHE_RETURN_IF_ERROR(push(tb, dirty_keys.data(), d, rows.data(), dirty_vers.data())
                                 .with_context("write-back of table '" + tb.opt.name + "'"));
  }
  c.seconds_write_back += seconds_since(t0);
  return {};
}

// One table's boundary: which keys are missing, which residents leave, then out and in. Works on
// slots (no export, no sort of the residents).
template <class Key, class Space>
status training_cache_core<Key, Space>::move_table_to_keyset(table_type& tb,
                                                             const std::vector<Key>& keys,
                                                             bool use_staging, table_counters& c) {
  const std::size_t n = keys.size();
  auto& st = tb.staged;
  const bool as_staged = use_staging && st.residency == tb.book.residency &&
                         st.resident_rows == tb.cache->size() && st.keyset == keys;
  if (tb.book.slot_mark.size() != tb.cache->capacity())
    tb.book.slot_mark.assign(tb.cache->capacity(), 0);
  const bool worker_marked = as_staged && st.next_mark_epoch != 0;
  if (worker_marked) {
    // The worker marked the keyset's resident slots already.
    std::swap(tb.book.slot_mark, tb.book.next_mark);
    tb.book.mark_epoch = st.next_mark_epoch;
    st.next_mark_epoch = 0;  // consumed
  } else if (++tb.book.mark_epoch == 0) {
    std::fill(tb.book.slot_mark.begin(), tb.book.slot_mark.end(), 0);
    std::fill(tb.book.next_mark.begin(), tb.book.next_mark.end(), 0);
    tb.book.mark_epoch = 1;
  }
  std::vector<Key> computed;
  const std::vector<Key>* miss = &computed;
  std::size_t early = 0;
  bool planned = false;
  if (as_staged) {
    // Nothing entered or left since prefetch computed the hits and staged the misses (and the
    // worker did what it could of the residency change).
    if (!worker_marked) {
      for (const auto s : st.hit_slots) tb.book.slot_mark[s] = tb.book.mark_epoch;
    }
    miss = &st.keys;
    early = st.early_inserted;
    planned = st.leave_valid;
  } else {
    auto& missing = computed;
    auto& slots = tb.scratch.slots;
    slots.resize(n);
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.lookup_slots(keys.data(), n, slots.data()));
    missing.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (slots[i] < 0) {
        missing.push_back(keys[i]);
      } else {
        tb.book.slot_mark[slots[i]] = tb.book.mark_epoch;
      }
    }
  }
  ++tb.book.residency;
  const std::vector<Key>& missing = *miss;
  // Rows the worker inserted early were missing when the pass was prefetched.
  c.misses = missing.size() + early;
  c.hits = n - c.misses;
  const std::size_t resident = tb.cache->size();
  if (resident + missing.size() > tb.max_resident) {
    const std::size_t need = resident + missing.size() - tb.max_resident;
    const auto ref = tb.bridge.meta();
    std::vector<std::int64_t> computed_victims;
    std::vector<std::int64_t>& victims = planned ? st.leave_slots : computed_victims;
    if (!planned) {
      victims.reserve(resident - (n - missing.size()));
      const std::size_t cap = tb.cache->capacity();
      for (std::size_t s = 0; s < cap; ++s) {
        if (ref.states[s] > detail::state_busy && tb.book.slot_mark[s] != tb.book.mark_epoch) {
          victims.push_back(static_cast<std::int64_t>(s));
        }
      }
    }
    pick_oldest(ref, victims, need);
    EMBCACHE_RETURN_IF_ERROR(evict(tb, victims, ref, c));
  }
  return swap_in(tb, missing, use_staging, c);
}

template <class Key, class Space>
status training_cache_core<Key, Space>::begin_pass(const std::vector<std::vector<Key>>& keysets) {
  if (keysets.size() != tables.size()) {
    return status::invalid_argument("begin_pass: " + std::to_string(keysets.size()) +
                                    " keysets for " + std::to_string(tables.size()) + " tables");
  }
  std::vector<std::vector<Key>> scratch(tables.size());
  std::vector<const std::vector<Key>*> ks(tables.size());
  for (std::size_t t = 0; t < tables.size(); ++t) {
    ks[t] = &sorted_unique(keysets[t], scratch[t]);
    if (ks[t]->size() > tables[t].opt.capacity) {
      return status::capacity_exceeded(
          "keyset of table '" + tables[t].opt.name + "' has " + std::to_string(ks[t]->size()) +
          " distinct keys, more than the cache capacity " + std::to_string(tables[t].opt.capacity));
    }
  }
  std::vector<table_counters> pass(tables.size());
  const auto tw = clock_type::now();
  const bool had_worker = worker.joinable() || flusher.joinable();
  wait_worker();
  // The previous boundary's write-behind must be in the store before this one reads it.
  const status written_behind = finish_write_behind();
  const double waited = had_worker ? seconds_since(tw) : 0.0;
  if (!staging_status.ok()) {
    status s = staging_status;
    staging_status = {};
    drop_staging();
    return s.with_context("prefetch");
  }
  EMBCACHE_RETURN_IF_ERROR(written_behind);
  const bool use_staging = staged_valid;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    auto& tb = tables[t];
    auto& c = pass[t];
    c.seconds_prefetch_wait = t == 0 ? waited : 0.0;
    c.seconds_write_behind = tb.wb.seconds_done;
    tb.wb.seconds_done = 0;
    // What the worker evicted and inserted during the pass that just ended.
    c += tb.worker_counters;
    tb.worker_counters = {};
    if (use_staging && tb.staged.gather.size() > tb.wb.spare_rows.size()) {
      tb.wb.spare_rows.swap(tb.staged.gather);
    }
    EMBCACHE_RETURN_IF_ERROR(move_table_to_keyset(tb, *ks[t], use_staging, c));
    c.seconds_staging = use_staging ? tb.staged.seconds : 0.0;
  }
  if (use_staging) drop_staging();
  if (write_behind_pending()) start_flusher();
  ++counters.passes;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    counters.last[t] = pass[t];
    counters.total[t] += pass[t];
  }
  return {};
}

}  // namespace embcache::detail
