// The pass boundary (keyset mode): which keys of the keyset are missing, which residents leave
// (as far as max_resident requires, oldest first), the dirty leavers gathered for the
// write-behind, and the missing rows brought in from the staging, the store or the initializer.
#pragma once

#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <new>

#include "training/training_cache_core.hpp"

namespace embcache::detail {

// Staged row j: in the staging or, move_staged_rows in the host space, in the cache's free row
// free_rows[j] (stage()).
template <class Key, class Space>
const float* staged_row(const table_state<Key, Space>& tb, std::size_t j) {
  if constexpr (is_host_space_v<Space>) {
    if (tb.staged.moved)
      return tb.cache->row_pool() + static_cast<std::size_t>(tb.free_rows.data()[j]) * tb.row_width;
  }
  return tb.staged.rows.data() + j * tb.row_width;
}

template <class Key, class Space>
status training_cache_core<Key, Space>::swap_in(table_type& tb, const std::vector<Key>& missing,
                                                bool use_staging, table_counters& c) {
  if (use_staging && tb.sync.writes_log.empty() &&
      (&missing == &tb.staged.keys || tb.staged.keys == missing)) {
    return swap_in_staged(tb, missing, c);
  }
  const auto t0 = clock_type::now();
  const std::size_t n = missing.size(), w = tb.row_width;
  // Keys the store changed for after staging began must be re-pulled.
  std::vector<Key> log;
  if (use_staging) {
    log = std::move(tb.sync.writes_log);
    std::sort(log.begin(), log.end());
  }
  // In chunks of prefetch_batch rows (the worker's batch, done by now): the boundary holds one
  // chunk of rows beside the staging, never a row per missing key.
  const std::size_t chunk = std::max<std::size_t>(1, std::min(n, options.prefetch_batch));
  std::vector<float> rows(chunk * w);
  std::vector<std::uint64_t> vers(chunk), synced(chunk);
  std::unique_ptr<bool[]> found(new bool[chunk]);
  std::vector<std::size_t> to_pull;
  std::vector<Key> pull_keys;
  std::vector<float> pulled;
  std::vector<std::uint64_t> pulled_vers;
  std::unique_ptr<bool[]> pulled_found;
  const auto& st = tb.staged;
  std::size_t j = 0, f = 0;  // the staging's and the fresh keys' cursors: all in key order
  std::uint64_t init_version = 0;
  for (std::size_t b = 0; b < n; b += chunk) {
    const std::size_t m = std::min(n, b + chunk) - b;
    const Key* keys = missing.data() + b;
    std::fill(vers.begin(), vers.begin() + static_cast<std::ptrdiff_t>(m), 0);
    to_pull.clear();
    for (std::size_t i = 0; i < m; ++i) {
      const Key k = keys[i];
      while (use_staging && j < st.keys.size() && st.keys[j] < k) ++j;
      while (use_staging && f < st.fresh.size() && st.fresh[f] < k) ++f;
      const bool staged = use_staging && j < st.keys.size() && st.keys[j] == k;
      const bool fresh = use_staging && f < st.fresh.size() && st.fresh[f] == k;
      const bool logged = (staged || fresh) && std::binary_search(log.begin(), log.end(), k);
      if (staged && !logged) {
        std::memcpy(rows.data() + i * w, staged_row(tb, j), w * sizeof(float));
        vers[i] = st.versions[j];
        found[i] = st.found[j] != 0;
        ++c.rows_staged;
      } else if (fresh && !logged) {
        found[i] = false;  // not in the store when the worker pulled it, nor written since
      } else {
        if (staged) ++c.rows_restaged;
        to_pull.push_back(i);
      }
    }
    if (to_pull.size() == m) {
      EMBCACHE_RETURN_IF_ERROR(pull(tb, keys, m, rows.data(), found.get(), vers.data()));
    } else if (!to_pull.empty()) {
      const std::size_t p = to_pull.size();
      pull_keys.resize(p);
      pulled.resize(p * w);
      pulled_vers.resize(p);
      if (!pulled_found) pulled_found.reset(new bool[chunk]);
      for (std::size_t i = 0; i < p; ++i) pull_keys[i] = keys[to_pull[i]];
      EMBCACHE_RETURN_IF_ERROR(
          pull(tb, pull_keys.data(), p, pulled.data(), pulled_found.get(), pulled_vers.data()));
      for (std::size_t i = 0; i < p; ++i) {
        const std::size_t d = to_pull[i];
        std::memcpy(rows.data() + d * w, pulled.data() + i * w, w * sizeof(float));
        vers[d] = pulled_vers[i];
        found[d] = pulled_found[i];
      }
    }
    c.rows_pulled += to_pull.size();
    // New rows get a fresh version (one for the whole boundary) so that they are dirty (written
    // back) and exported.
    for (std::size_t i = 0; i < m; ++i) {
      if (found[i]) continue;
      if (!init_version) init_version = fresh_version(tb);
      initialize_row(tb, keys[i], rows.data() + i * w);
      vers[i] = init_version;
      ++c.rows_initialized;
    }
    // Pulled rows are in sync with the store; initialized ones are dirty. All are keys of this
    // pass.
    for (std::size_t i = 0; i < m; ++i) synced[i] = found[i] ? vers[i] : 0;
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.install_alone(keys, m, rows.data(), vers.data(),
                                                     synced.data(), tb.book.mark_epoch));
  }
  c.bytes_store_to_cache += (n - c.rows_initialized) * w * sizeof(float);
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
  auto& synced = tb.scratch.synced;
  synced.resize(n);
  for (std::size_t i = 0; i < n; ++i) synced[i] = st.found[i] ? st.versions[i] : 0;
  if (st.moved) {
    // The worker wrote them into the free rows too: moved in by index, no copy.
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.install_moved(missing.data(), n, tb.free_rows.data(),
                                                     st.versions.data(), synced.data(),
                                                     tb.book.mark_epoch));
    c.rows_moved += n;
  } else {
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.install_alone(missing.data(), n, st.rows.data(),
                                                     st.versions.data(), synced.data(),
                                                     tb.book.mark_epoch));
  }
  c.seconds_swap_in += seconds_since(t0);
  return {};
}

// Evicts up to `need` resident rows marked below `keep_mark` (outside the keysets), oldest first;
// the dirty ones are gathered and pushed, by the flusher after begin_pass returns when
// write-behind is on. The victims never leave the cache's memory: only their dirty rows do. At
// most write_back_bytes of them are written behind: the victims past that are pushed here first,
// in chunks of that size, through the same buffer.
//
// `chosen`: the victims the worker chose already (choose_victims_early), taken instead.
template <class Key, class Space>
status training_cache_core<Key, Space>::evict(table_type& tb, std::size_t need,
                                              std::uint32_t keep_mark, table_counters& c,
                                              victim_slots<Space>* chosen) {
  const auto t0 = clock_type::now();
  const std::size_t w = tb.row_width;
  victim_slots<Space> victims;
  if (chosen) {
    victims = std::move(*chosen);
  } else {
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.select_victims(keep_mark, need, &victims));
  }
  const std::size_t m = victims.count;
  const std::size_t chunk = std::min(write_back_chunk_rows(tb), std::max<std::size_t>(m, 1));
  // Victims [0, behind) are written behind; [behind, m) are pushed now.
  const std::size_t behind = options.write_behind ? std::min(chunk, m) : 0;
  std::vector<Key> dirty_keys(chunk);
  std::vector<std::uint64_t> dirty_vers(chunk);
  auto& rows = tb.wb.spare_rows;
  if (rows.size() < chunk * w) {
    try {
      rows.resize(chunk * w);
    } catch (const std::bad_alloc&) {
      // chunk <= the table's slots, whose rows are allocated already: chunk * w cannot overflow.
      return host_allocation_failed("evicting " + std::to_string(m) + " rows of table '" +
                                        tb.opt.name + "': their write-back buffer of " +
                                        std::to_string(chunk) + " rows",
                                    chunk * w * sizeof(float));
    }
  }
  std::size_t pushed = 0;
  for (std::size_t b = behind; b < m; b += chunk) {
    std::size_t d = 0;
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.gather_dirty(
        victims, b, std::min(chunk, m - b), dirty_keys.data(), rows.data(), dirty_vers.data(), &d));
    if (d > 0) {
      // Not logged for the prefetch hazard: the victims are outside the keyset being installed,
      // so no staged row can be theirs (logging them would only make swap_in copy every row).
      std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
      EMBCACHE_RETURN_IF_ERROR(
          tb.sync.store->push(dirty_keys.data(), d, rows.data(), dirty_vers.data())
              .with_context("write-back of table '" + tb.opt.name + "'"));
    }
    tb.exports.note_written(dirty_keys.begin(),
                              dirty_keys.begin() + static_cast<std::ptrdiff_t>(d));
    pushed += d;
  }
  std::size_t d = 0;
  // move_staged_rows, with free rows past the staged ones for every leaver written behind: the
  // dirty leavers are moved out into them by index (embedding_cache::detach_rows), not copied,
  // and the flusher copies them out while the next pass trains. Else they are gathered here.
  const std::size_t reserved = tb.staged.moved ? tb.staged.keys.size() : 0;
  if (behind > 0 && tb.free_rows.size() >= reserved + behind) {
    std::vector<std::int64_t> dirty_slots(behind);
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.gather_dirty_slots(
        victims, 0, behind, dirty_keys.data(), dirty_vers.data(), dirty_slots.data(), &d));
    tb.wb.detached.resize(d);
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.detach(dirty_slots.data(), d,
                                              tb.free_rows.data() + reserved,
                                              tb.wb.detached.data()));
    c.rows_detached += d;
  } else if (behind > 0) {
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.gather_dirty(victims, 0, behind, dirty_keys.data(),
                                                    rows.data(), dirty_vers.data(), &d));
  }
  dirty_keys.resize(d);
  dirty_vers.resize(d);
  // The rows pushed above are in the store, those written behind in `rows`: erased after both.
  EMBCACHE_RETURN_IF_ERROR(tb.bridge.erase_slots(victims));
  tb.exports.note_written(dirty_keys.begin(), dirty_keys.end());
  c.rows_pushed += d + pushed;
  c.rows_evicted += m;
  c.bytes_cache_to_store += (d + pushed) * w * sizeof(float);
  if (d > 0) {
    tb.wb.keys = std::move(dirty_keys);
    tb.wb.versions = std::move(dirty_vers);
    tb.wb.rows.swap(rows);
  }
  c.seconds_write_back += seconds_since(t0);
  return {};
}

// A new keyset mark, later than every mark handed out (all marks are cleared when the counter
// would start over).
template <class Key, class Space>
result<std::uint32_t> training_cache_core<Key, Space>::next_mark(table_type& tb) {
  if (++tb.book.mark_clock == 0) {
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.clear_marks());
    tb.book.mark_epoch = 0;
    tb.book.mark_clock = 1;
  }
  return tb.book.mark_clock;
}

// One table's boundary: which keys are missing, which residents leave, then out and in. Works on
// the cache's slots and marks (no export, no sort of the residents, nothing per slot on the host).
template <class Key, class Space>
status training_cache_core<Key, Space>::move_table_to_keyset(table_type& tb,
                                                             const std::vector<Key>& keys,
                                                             bool use_staging, table_counters& c) {
  const std::size_t n = keys.size();
  auto& st = tb.staged;
  const bool as_staged = use_staging && st.residency == tb.book.residency &&
                         st.resident_rows == tb.cache->size() && st.keyset == keys;
  std::vector<Key> computed;
  const std::vector<Key>* miss = &computed;
  std::size_t early = 0;
  if (as_staged) {
    // Nothing entered or left since prefetch marked the hits and staged the misses (and the
    // worker did what it could of the residency change).
    tb.book.mark_epoch = st.mark;
    miss = st.unstaged.empty() && st.fresh.empty() ? &st.keys : &st.missing;
    early = st.early_inserted;
  } else {
    auto mark = next_mark(tb);
    if (!mark.ok()) return mark.get_status();
    tb.book.mark_epoch = mark.value();
    auto& missing = computed;
    auto& slots = tb.scratch.slots;
    slots.resize(n);
    EMBCACHE_RETURN_IF_ERROR(
        tb.bridge.lookup_and_mark(keys.data(), n, tb.book.mark_epoch, slots.data()));
    missing.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (slots[i] < 0) missing.push_back(keys[i]);
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
    // The worker's choice holds while nothing entered or left since (expiry, a caller's erase).
    const bool chosen = as_staged && st.victims_ready && st.victims_resident == resident &&
                        st.victims_need == need;
    EMBCACHE_RETURN_IF_ERROR(
        evict(tb, need, tb.book.mark_epoch, c, chosen ? &st.victims : nullptr));
  }
  EMBCACHE_RETURN_IF_ERROR(swap_in(tb, missing, use_staging, c));
  if (!use_staging) tb.exports.compact_if_grown();  // else the next prefetch's worker does
  return {};
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
  const bool had_worker = worker.started() || flusher.started();
  const status staged = worker.take_failure();
  // The previous boundary's write-behind must be in the store before this one reads it.
  const status written_behind = finish_write_behind();
  const double waited = had_worker ? seconds_since(tw) : 0.0;
  if (!staged.ok()) {
    drop_staging();
    return staged.with_context("prefetch");
  }
  EMBCACHE_RETURN_IF_ERROR(written_behind);
  // Feature admission: the keys refused at this sighting stay out of the pass (no row).
  std::vector<std::vector<Key>> admitted(tables.size());
  for (std::size_t t = 0; t < tables.size(); ++t) {
    if (!tables[t].admission.enabled()) continue;
    admitted[t] = *ks[t];
    EMBCACHE_RETURN_IF_ERROR(admit(tables[t], &admitted[t], admit_mode::sight, &pass[t]));
    ks[t] = &admitted[t];
  }
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
    EMBCACHE_RETURN_IF_ERROR(expire_table(tb, ks[t], c));
    EMBCACHE_RETURN_IF_ERROR(move_table_to_keyset(tb, *ks[t], use_staging, c));
    // The admitted keys without a row are the rows made for this pass.
    if (tb.admission.enabled()) c.keys_admitted = c.rows_initialized;
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

// Tables kept in their stores (training_cache::begin_pass_in_stores): begin_pass's admission and
// expiry, with the store standing for the residents, and no row moved.
template <class Key, class Space>
status training_cache_core<Key, Space>::begin_pass_in_stores(
    const std::vector<std::vector<Key>>& keysets, std::vector<std::vector<Key>>* refused_out) {
  const std::string call = "begin_pass_in_stores: ";
  if (keysets.size() != tables.size()) {
    return status::invalid_argument(call + std::to_string(keysets.size()) + " keysets for " +
                                    std::to_string(tables.size()) + " tables");
  }
  wait_worker();
  EMBCACHE_RETURN_IF_ERROR(finish_write_behind());
  for (const auto& tb : tables) {
    if (tb.cache->size() != 0) {
      return status::invalid_argument(call + "table '" + tb.opt.name + "' holds " +
                                      std::to_string(tb.cache->size()) +
                                      " resident rows (its rows must be in its store only)");
    }
  }
  refused_out->assign(tables.size(), {});
  std::vector<table_counters> pass(tables.size());
  std::vector<std::vector<Key>> scratch(tables.size()), admitted(tables.size());
  std::vector<const std::vector<Key>*> ks(tables.size());
  // Every table's sightings first, as begin_pass counts them.
  for (std::size_t t = 0; t < tables.size(); ++t) {
    auto& tb = tables[t];
    ks[t] = &sorted_unique(keysets[t], scratch[t]);
    if (!tb.admission.enabled()) continue;
    admitted[t] = *ks[t];
    EMBCACHE_RETURN_IF_ERROR(admit(tb, &admitted[t], admit_mode::sight, &pass[t]));
    std::set_difference(ks[t]->begin(), ks[t]->end(), admitted[t].begin(), admitted[t].end(),
                        std::back_inserter((*refused_out)[t]));
    ks[t] = &admitted[t];
    // The admitted keys without a row: those begin_pass would make rows for (keys_admitted).
    const std::size_t n = admitted[t].size();
    std::unique_ptr<bool[]> stored(new bool[std::max<std::size_t>(n, 1)]);
    {
      std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
      EMBCACHE_RETURN_IF_ERROR(tb.sync.store->contains(admitted[t].data(), n, stored.get()));
    }
    pass[t].keys_admitted =
        static_cast<std::uint64_t>(std::count(stored.get(), stored.get() + n, false));
  }
  for (std::size_t t = 0; t < tables.size(); ++t) {
    auto& tb = tables[t];
    if (!tb.opt.expiry.enabled()) continue;
    std::lock_guard<std::mutex> install_lock(*tb.sync.install_mutex);
    {
      // The rows written to the store since the last boundary are newer than the clock it took.
      std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
      tb.cache->advance_version(tb.sync.store->max_version());
    }
    EMBCACHE_RETURN_IF_ERROR(expire_table(tb, ks[t], pass[t]));
  }
  ++counters.passes;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    counters.last[t] = pass[t];
    counters.total[t] += pass[t];
  }
  return {};
}

}  // namespace embcache::detail
