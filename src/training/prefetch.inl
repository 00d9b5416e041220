// The prefetch worker: stages the next pass's rows in a background thread while the current pass
// trains and, in keyset mode, installs what it can of the next pass early (evicting residents
// outside both keysets, inserting staged rows while there is room), so that begin_pass moves
// only what is left.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "training/training_cache_core.hpp"

namespace embcache::detail {

template <class Key, class Space>
void training_cache_core<Key, Space>::wait_worker() {
  worker.join();
}

template <class Key, class Space>
void training_cache_core<Key, Space>::drop_staging() {
  wait_worker();
  staged_valid = false;
  for (auto& tb : tables) {
    // The log belongs to the caller's thread (the worker only pulls, the flusher's pushes are
    // not logged), so no lock: taking the store's would wait for a running write-behind.
    tb.sync.log_writes = false;
    tb.sync.writes_log.clear();
    // Marks of a replaced prefetch need no undoing: a later boundary's mark is later still.
    // The row buffer is kept: the next staging reuses its pages instead of faulting new ones.
    auto rows = std::move(tb.staged.rows);
    tb.staged = staged_pass<Key, Space>{};
    tb.staged.rows = std::move(rows);
  }
}

// The prefetch worker's early install (keyset mode). The caller's pass updates rows of its own
// keyset in place and changes no residency, so what the next boundary decides from the resident
// set and the next keyset alone can be done during the pass: residents outside both keysets
// (frozen: nothing touches them before the boundary) are evicted first, as far as the next
// keyset's misses need the room; then each staged batch is inserted as far as it fits, right
// after its pull (while it is still in the processor's cache). begin_pass only handles what is
// left, with the eviction candidates listed here. Everything stops as soon as the residency or
// the store changed behind the worker (the boundary then does the rest).
template <class Key, class Space>
bool training_cache_core<Key, Space>::staging_matches_residency(const table_type& tb) const {
  return tb.staged.residency == tb.book.residency && tb.staged.resident_rows == tb.cache->size();
}

template <class Key, class Space>
void training_cache_core<Key, Space>::note_worker_residency_change(table_type& tb) {
  ++tb.book.residency;
  tb.staged.residency = tb.book.residency;
  tb.staged.resident_rows = tb.cache->size();
}

template <class Key, class Space>
status training_cache_core<Key, Space>::early_evict(table_type& tb, bool* go_on) {
  *go_on = false;
  std::lock_guard<std::mutex> lock(*tb.sync.install_mutex);
  auto& st = tb.staged;
  if (!staging_matches_residency(tb)) return {};
  const std::size_t w = tb.row_width;
  const std::size_t resident = tb.cache->size(), cap = tb.max_resident;
  const std::size_t need = resident + st.keys.size() > cap ? resident + st.keys.size() - cap : 0;
  // Frozen rows: marked below the current keyset's mark (the next keyset's hits carry a later
  // one), so outside both keysets. Before the first begin_pass (mark 0) none is known.
  victim_slots<Space> frozen;
  if (need > 0 && tb.book.mark_epoch != 0) {
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.select_victims(tb.book.mark_epoch, need, &frozen));
  }
  const std::size_t ev = frozen.count;
  if (ev > 0) {
    const std::size_t batch = std::max<std::size_t>(1, options.prefetch_batch);
    std::vector<Key> dirty_keys;
    std::vector<std::uint64_t> dirty_vers;
    std::vector<float> rows;
    std::size_t pushed = 0;
    for (std::size_t b = 0; b < ev; b += batch) {
      const std::size_t m = std::min(batch, ev - b);
      dirty_keys.resize(m);
      dirty_vers.resize(m);
      rows.resize(m * w);
      std::size_t d = 0;
      EMBCACHE_RETURN_IF_ERROR(tb.bridge.gather_dirty(frozen, b, m, dirty_keys.data(), rows.data(),
                                                      dirty_vers.data(), &d));
      if (d == 0) continue;
      {
        // Not logged for the prefetch hazard: these keys are outside the staged keyset.
        std::lock_guard<std::mutex> store_lock(*tb.sync.store_mutex);
        EMBCACHE_RETURN_IF_ERROR(
            tb.sync.store->push(dirty_keys.data(), d, rows.data(), dirty_vers.data())
                .with_context("early write-back of table '" + tb.opt.name + "'"));
      }
      tb.exports.note_written(dirty_keys.begin(),
                                dirty_keys.begin() + static_cast<std::ptrdiff_t>(d));
      pushed += d;
    }
    // Pushed first, erased after: a row is always in the device or in the store.
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.erase_slots(frozen));
    tb.worker_counters.rows_evicted += ev;
    tb.worker_counters.rows_pushed += pushed;
    tb.worker_counters.bytes_cache_to_store += pushed * w * sizeof(float);
    note_worker_residency_change(tb);
  }
  *go_on = true;
  return {};
}

// Inserts the staged rows [b, b + m) found in the store as far as they fit; `taken` marks them.
// Rows the initializer made wait for the boundary, which gives them a fresh version (until then
// the key does not exist). A store write since staging began (erase, write-back) stops it.
template <class Key, class Space>
status training_cache_core<Key, Space>::early_insert(table_type& tb, std::size_t b, std::size_t m,
                                                     const float* rows,
                                                     std::vector<std::uint8_t>& taken,
                                                     bool* go_on) {
  std::lock_guard<std::mutex> lock(*tb.sync.install_mutex);
  auto& st = tb.staged;
  const std::size_t cap = tb.max_resident, w = tb.row_width;
  bool logged = false;
  {
    // The caller's pushes append to the log under the store's mutex (finish_write_behind() may push
    // while this runs), so it is read under it too.
    std::lock_guard<std::mutex> store_lock(*tb.sync.store_mutex);
    logged = !tb.sync.writes_log.empty();
  }
  if (!staging_matches_residency(tb) || logged || tb.cache->size() >= cap) {
    *go_on = false;
    return {};
  }
  const std::size_t room = cap - tb.cache->size();
  std::vector<std::size_t> pick;
  for (std::size_t i = b; i < b + m && pick.size() < room; ++i) {
    if (st.found[i]) pick.push_back(i);
  }
  const std::size_t k = pick.size();
  if (k == 0) return {};
  const bool whole = k == m;  // the batch as it lies in the staging
  // Staged into the free rows (move_staged_rows, host space): moved in by index, no copy.
  const bool by_index = is_host_space_v<Space> && tb.free_rows.size() > 0;
  std::vector<Key> keys(k);
  std::vector<std::uint64_t> vers(k);
  std::vector<float> gathered(whole || by_index ? 0 : k * w);
  for (std::size_t i = 0; i < k; ++i) {
    keys[i] = st.keys[pick[i]];
    vers[i] = st.versions[pick[i]];
    if (!whole && !by_index) {
      std::memcpy(gathered.data() + i * w, rows + (pick[i] - b) * w, w * sizeof(float));
    }
  }
  // Rows from the store, in sync with it, keys of the next pass: they carry its mark. Moved in by
  // index, the rows the new slots give back take their places in free_rows.
  if constexpr (is_host_space_v<Space>) {
    if (by_index) {
      std::int64_t* const free = tb.free_rows.data();
      std::vector<std::int64_t> io(k);
      for (std::size_t i = 0; i < k; ++i) io[i] = free[pick[i]];
      EMBCACHE_RETURN_IF_ERROR(tb.bridge.install_moved(keys.data(), k, io.data(), vers.data(),
                                                       vers.data(), st.mark));
      for (std::size_t i = 0; i < k; ++i) free[pick[i]] = io[i];
      tb.worker_counters.rows_moved += k;
    }
  }
  if (!by_index) {
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.install(keys.data(), k, whole ? rows : gathered.data(),
                                               vers.data(), vers.data(), st.mark));
  }
  for (std::size_t i = 0; i < k; ++i) taken[pick[i]] = 1;
  st.hits += k;
  st.early_inserted += k;
  tb.worker_counters.rows_staged += k;
  tb.worker_counters.bytes_store_to_cache += k * w * sizeof(float);
  note_worker_residency_change(tb);
  return {};
}

// Runs in the worker, last: the residents the next boundary evicts, when that choice is already
// certain. The pass changes no residency and no mark, only rows and versions; so when every
// resident outside the next keyset must leave (no more of them than the boundary needs room
// for), which ones go depends on nothing the pass does, and the boundary takes them from here
// instead of a pass over every slot. With more candidates than that the boundary picks the
// oldest versions, which the pass changes: it chooses them itself. Host space only (in the cuda
// space the choice is a kernel on the boundary's stream).
template <class Key, class Space>
status training_cache_core<Key, Space>::choose_victims_early(table_type& tb) {
  auto& st = tb.staged;
  st.victims_ready = false;
  if constexpr (!is_host_space_v<Space>) {
    return {};
  } else {
    // As the early install: the caller's erase changes the residency under this lock.
    std::lock_guard<std::mutex> lock(*tb.sync.install_mutex);
    if (options.mode != cache_mode::keyset || !staging_matches_residency(tb)) return {};
    const std::size_t resident = tb.cache->size(), cap = tb.max_resident;
    const std::size_t missing =
        st.unstaged.empty() && st.fresh.empty() ? st.keys.size() : st.missing.size();
    if (resident + missing <= cap || resident == 0) return {};
    const std::size_t need = resident + missing - cap;
    // The residents carrying the next keyset's mark: its hits and the rows inserted early. With
    // more candidates than the room needed (the slack's case) no pass over the slots is made.
    const std::size_t marked = st.hits + st.early_inserted;
    if (resident - std::min(resident, marked) > need) return {};
    // Every candidate (at most every resident), in slot order as the boundary would take them.
    victim_slots<Space> all;
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.select_victims(st.mark, resident, &all));
    if (all.count > need) return {};
    st.victims = std::move(all);
    st.victims_resident = resident;
    st.victims_need = need;
    st.victims_ready = true;
    return {};
  }
}

// Runs in the worker: stages the rows of `keys` (sorted, not resident at prefetch time) within
// `max_rows` (prefetch() reserved their room), with the early install in keyset mode. When every
// key fits, each gets its row: the store's, or the initializer's for a key the store lacks. When
// they do not, the room goes to the rows the store holds, which need its reads: the worker pulls
// on through the keys, keeps only the rows found, and leaves the keys the store lacks to begin_pass
// to initialize (`fresh`), so that begin_pass pulls only the stored rows past the room
// (`unstaged`), not stored rows the initializer's rows took the room of.
//
// move_staged_rows in the host space: the staging is the cache's free rows themselves. Each batch
// is pulled into a buffer of one batch and written into the next free rows right away (while it
// is in the processor's caches), so the staged rows are in free_rows[0, keys.size()) and nowhere
// else: one batch of rows beside the spare rows, not a staging buffer beside them.
template <class Key, class Space>
status training_cache_core<Key, Space>::stage(table_type& tb, std::vector<Key> keys,
                                              std::size_t max_rows, std::size_t spare_floats) {
  const auto t0 = clock_type::now();
  auto& st = tb.staged;
  st.keys = std::move(keys);
  const bool into_free = is_host_space_v<Space> && tb.free_rows.size() > 0;
  if (into_free && !tb.wb.detached.empty()) max_rows = 0;  // see the end: nothing staged
  const std::size_t all = st.keys.size(), n = std::min(all, max_rows), w = tb.row_width;
  const bool found_only = all > n;
  const std::size_t batch = std::max<std::size_t>(1, options.prefetch_batch);
  st.rows.resize((into_free ? std::min(batch, n) : n) * w);
  st.versions.assign(n, 0);
  st.found.assign(n, 0);
  bool early = false;
  // The early eviction makes room for every missing key, staged or not.
  if (options.mode == cache_mode::keyset) EMBCACHE_RETURN_IF_ERROR(early_evict(tb, &early));
  {
    // Rows the boundary will still have to gather (at most); its write-behind buffer is sized,
    // and its pages touched, here rather than at the boundary.
    const std::size_t resident = tb.cache->size(), cap = tb.max_resident;
    const std::size_t need = resident + all > cap ? resident + all - cap : 0;
    const std::size_t leaving =
        std::min({need, resident - std::min(resident, st.hits), write_back_chunk_rows(tb)});
    if (spare_floats < leaving * w) st.gather.resize(leaving * w);
  }
  std::vector<std::uint8_t> taken(early ? n : 0, 0);
  std::unique_ptr<bool[]> found(new bool[std::min(batch, std::max<std::size_t>(n, 1))]);
  // Keys [0, next) pulled; rows [0, staged) kept, in key order. Kept rows move down over the
  // fresh keys' (found_only), so a key or row is written only where one was already read.
  std::size_t next = 0, staged = 0;
  while (next < all && staged < n) {
    const std::size_t m = std::min({batch, all - next, n - staged});
    float* const rows = st.rows.data() + (into_free ? 0 : staged * w);
    std::uint64_t* const vers = st.versions.data() + staged;
    EMBCACHE_RETURN_IF_ERROR(pull(tb, st.keys.data() + next, m, rows, found.get(), vers));
    std::size_t kept = 0;
    for (std::size_t i = 0; i < m; ++i) {
      const Key k = st.keys[next + i];
      if (!found[i] && found_only) {
        st.fresh.push_back(k);
        continue;
      }
      if (kept != i) {
        std::memmove(rows + kept * w, rows + i * w, w * sizeof(float));
        vers[kept] = vers[i];
      }
      st.keys[staged + kept] = k;
      st.found[staged + kept] = found[i];
      if (!found[i]) initialize_row(tb, k, rows + kept * w);
      ++kept;
    }
    if (into_free && kept > 0) {
      EMBCACHE_RETURN_IF_ERROR(
          tb.bridge.write_rows(tb.free_rows.data() + staged, kept, rows, options.prefetch_batch));
    }
    if (early && kept > 0) {
      EMBCACHE_RETURN_IF_ERROR(early_insert(tb, staged, kept, rows, taken, &early));
    }
    staged += kept;
    next += m;
  }
  st.unstaged.assign(st.keys.begin() + static_cast<std::ptrdiff_t>(next), st.keys.end());
  st.keys.resize(staged);
  st.versions.resize(staged);
  st.found.resize(staged);
  if (st.early_inserted > 0) {
    // Keep in the staging only the rows still missing, in key order. Staged into the free rows,
    // their indices move instead (those of the rows inserted early stay free, after them).
    std::vector<std::int64_t> taken_rows;
    std::size_t out = 0;
    for (std::size_t i = 0; i < staged; ++i) {
      if (taken[i]) {
        if constexpr (is_host_space_v<Space>) {
          if (into_free) taken_rows.push_back(tb.free_rows.data()[i]);
        }
        continue;
      }
      if (out != i) {
        st.keys[out] = st.keys[i];
        st.versions[out] = st.versions[i];
        st.found[out] = st.found[i];
        if constexpr (is_host_space_v<Space>) {
          if (into_free) tb.free_rows.data()[out] = tb.free_rows.data()[i];
        }
        if (!into_free) {
          std::memmove(st.rows.data() + out * w, st.rows.data() + i * w, w * sizeof(float));
        }
      }
      ++out;
    }
    if constexpr (is_host_space_v<Space>) {
      std::copy(taken_rows.begin(), taken_rows.end(), tb.free_rows.data() + out);
    }
    st.keys.resize(out);
    st.versions.resize(out);
    st.found.resize(out);
  }
  if (!st.unstaged.empty() || !st.fresh.empty()) {
    // Every key still missing, staged or not, in key order: the staged and fresh keys interleave,
    // the unstaged ones (never pulled) all come after them.
    st.missing.resize(st.keys.size() + st.fresh.size() + st.unstaged.size());
    const auto pulled = std::merge(st.keys.begin(), st.keys.end(), st.fresh.begin(),
                                   st.fresh.end(), st.missing.begin());
    std::copy(st.unstaged.begin(), st.unstaged.end(), pulled);
  }
  // move_staged_rows. Host space: the staged rows are in the first free rows (written batch by
  // batch above), which begin_pass moves in by index when every missing key was staged, and reads
  // them from otherwise. (Not while leavers moved out at the last boundary are still in free rows,
  // their push having failed: then nothing was staged, and begin_pass pulls every row.)
  // Cuda space: every missing key staged, and room for them in the free rows: the rows go into the
  // first free rows now, so that begin_pass moves them in by index. (Only that case: the others
  // take begin_pass's pulls and copies, from the staging, which keeps the rows.)
  const std::size_t n_staged = st.keys.size();
  if (into_free) {
    st.moved = n_staged > 0;
  } else if (n_staged > 0 && n_staged <= tb.free_rows.size() && st.unstaged.empty() &&
             st.fresh.empty() && tb.wb.detached.empty()) {
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.write_rows(tb.free_rows.data(), n_staged, st.rows.data(),
                                                  options.prefetch_batch));
    st.moved = true;
  }
  EMBCACHE_RETURN_IF_ERROR(choose_victims_early(tb));
  // The keys the last boundary and this worker logged for the export, compacted off the
  // boundary's path, under the lock an export takes (it may run beside the worker).
  {
    std::lock_guard<std::mutex> lock(*tb.sync.install_mutex);
    tb.exports.compact_if_grown();
  }
  st.seconds = seconds_since(t0);
  return {};
}

// Plans the next pass from the current residency (hits, misses) and starts the worker on it.
template <class Key, class Space>
status training_cache_core<Key, Space>::prefetch(const std::vector<std::vector<Key>>& keysets) {
  auto& im = *this;
  if (keysets.size() != im.tables.size()) {
    return status::invalid_argument("prefetch: " + std::to_string(keysets.size()) +
                                    " keysets for " + std::to_string(im.tables.size()) + " tables");
  }
  im.drop_staging();
  im.worker.clear_failure();
  std::vector<std::vector<Key>> todo(im.tables.size());
  std::vector<std::size_t> spare(im.tables.size(), 0);
  for (std::size_t t = 0; t < im.tables.size(); ++t) {
    auto& tb = im.tables[t];
    std::vector<Key> scratch;
    const std::vector<Key>* unique = &sorted_unique(keysets[t], scratch);
    if (tb.admission.enabled()) {
      // The keys the next begin_pass admits for certain (those with a row, and those its sighting
      // takes to their threshold): a key it may refuse never gets a row staged or installed
      // early. A key the sketch admits only through another key's sighting (a shared counter) is
      // made by begin_pass.
      if (unique != &scratch) scratch = *unique;
      table_counters none;
      EMBCACHE_RETURN_IF_ERROR(im.admit(tb, &scratch, admit_mode::next_sighting, &none));
      unique = &scratch;
    }
    const auto& keys = *unique;
    // The next keyset's resident keys get its mark now: the worker's early eviction and the
    // boundary keep every row marked at or above the marks they are given.
    auto mark = im.next_mark(tb);
    if (!mark.ok()) return mark.get_status();
    std::vector<std::int64_t> slots(keys.size());
    EMBCACHE_RETURN_IF_ERROR(
        tb.bridge.lookup_and_mark(keys.data(), keys.size(), mark.value(), slots.data()));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (slots[i] < 0) todo[t].push_back(keys[i]);
    }
    auto& st = tb.staged;
    st.keyset.assign(keys.begin(), keys.end());
    st.hits = keys.size() - todo[t].size();
    st.mark = mark.value();
    st.residency = tb.book.residency;
    st.resident_rows = tb.cache->size();
    // The worker sizes the gather buffer of the boundary's write-behind, past what is spare: the
    // spare, or the buffer the flusher is pushing, which the boundary's finish_write_behind()
    // frees and makes the spare when it is the larger (read here, not written: the flusher only
    // reads it too). One buffer then serves every boundary instead of a new one per pass.
    spare[t] = im.options.write_behind ? std::max(tb.wb.spare_rows.size(), tb.wb.rows.size())
                                       : ~std::size_t{0};
    tb.sync.log_writes = true;
  }
  // The staging's room, within staging_bytes over all tables, is reserved here so that the worker
  // never grows it mid-pass (and a failure to get it is this call's).
  // move_staged_rows in the host space: the free rows are the staging (stage()), sized from
  // staging_bytes when the cache was built; only one batch of rows is reserved here.
  std::vector<std::size_t> max_rows(im.tables.size(), 0);
  std::size_t left = im.options.staging_bytes;
  for (std::size_t t = 0; t < im.tables.size(); ++t) {
    auto& tb = im.tables[t];
    const std::size_t row_bytes = tb.row_width * sizeof(float);
    const bool into_free = is_host_space_v<Space> && tb.free_rows.size() > 0;
    std::size_t reserved = 0;
    if (into_free) {
      max_rows[t] = std::min(todo[t].size(), tb.free_rows.size());
      reserved = std::min(max_rows[t], std::max<std::size_t>(1, im.options.prefetch_batch));
    } else {
      max_rows[t] = std::min(todo[t].size(), left / row_bytes);
      left -= max_rows[t] * row_bytes;
      reserved = max_rows[t];
    }
    const status s = guarded([&] {
      // A buffer too small goes before the larger one comes (reserve would hold both at once,
      // twice the bound, and copy the old rows). One large enough keeps its rows, so that the
      // worker's resize does not zero what its pulls overwrite.
      if (tb.staged.rows.capacity() < reserved * tb.row_width)
        staging_rows<Space>().swap(tb.staged.rows);
      tb.staged.rows.reserve(reserved * tb.row_width);
      return status{};
    });
    if (!s.ok()) {
      im.drop_staging();  // nothing staged: begin_pass pulls every row itself
      return s.with_context("prefetch: reserving " + std::to_string(reserved * row_bytes) +
                            " bytes of staging for table '" + tb.opt.name + "'");
    }
  }
  im.staged_valid = true;
  im.worker.start([&im, todo = std::move(todo), max_rows, spare]() mutable {
    // Rows written behind at the last boundary must be in the store before staging reads it.
    im.flusher.wait_idle();
    std::size_t t = 0;
    try {
      // The worker's cache calls run on the device the cache was built on (a new thread starts
      // on device 0).
      if constexpr (is_cuda_space_v<Space>) detail::cuda_set_device(im.device);
      for (; t < im.tables.size(); ++t) {
        auto& tb = im.tables[t];
        // On a stream of its own in the cuda space, so staging overlaps training.
        const auto on_worker_stream = tb.cache->order_calls_on(im.worker_calls.of(*tb.cache));
        status s = im.stage(tb, std::move(todo[t]), max_rows[t], spare[t]);
        if (!s.ok()) return s.with_context("staging table '" + im.tables[t].opt.name + "'");
      }
    } catch (const std::exception& e) {
      // A device or allocation failure: reported by the next begin_pass, never std::terminate.
      const std::string where =
          t < im.tables.size() ? "staging table '" + im.tables[t].opt.name + "'" : "staging";
      return status_of(e).with_context(where);
    }
    return status{};
  });
  return {};
}

}  // namespace embcache::detail
