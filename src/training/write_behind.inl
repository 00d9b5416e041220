// Store access and write-behind: every push and pull of the orchestration (serialized with the
// prefetch worker, logged for the prefetch hazard), the flusher that pushes the rows a boundary
// wrote behind while the next pass trains, and the synchronous write-back of end_training().
#pragma once

#include <algorithm>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include "training/training_cache_core.hpp"

namespace embcache::detail {

template <class Key, class Space>
bool training_cache_core<Key, Space>::write_behind_pending() const {
  for (const auto& tb : tables) {
    if (!tb.wb.keys.empty()) return true;
  }
  return false;
}

template <class Key, class Space>
void training_cache_core<Key, Space>::start_flusher() {
  flusher.start([this] {
    status s;
    // cuda space: any CUDA call of the pushes runs on the caches' device (a new thread starts on
    // device 0). Should it not become current, nothing is pushed here: finish_write_behind()
    // pushes the rows on the caller's thread.
    std::shared_ptr<void> on_device;  // type-erased: the host build has no cuda_device_guard
    if constexpr (is_cuda_space_v<Space>) {
      try {
        on_device = std::make_shared<cuda_device_guard>(device);
      } catch (const std::exception& e) {
        s = status_of(e);
      }
    }
    for (auto& tb : tables) {
      if (!s.ok()) break;
      if (tb.wb.keys.empty()) continue;
      const auto t0 = clock_type::now();
      try {
        s = copy_out_detached(tb);
        if (!s.ok()) break;
        // Not logged for the prefetch hazard: staging starts pulling only after this push is
        // over (flusher.wait_idle()), so no staged row can predate it.
        std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
        s = tb.sync.store->push(tb.wb.keys.data(), tb.wb.keys.size(), tb.wb.rows.data(),
                                tb.wb.versions.data());
      } catch (const std::exception& e) {
        // A store that throws (an allocation, a device): kept for the caller's thread.
        return status_of(e).with_context("write-behind of table '" + tb.opt.name +
                                         "' (background push)");
      } catch (...) {
        return status::internal("write-behind of table '" + tb.opt.name +
                                "' (background push): an exception of unknown type");
      }
      tb.wb.seconds = seconds_since(t0);
      if (!s.ok()) break;  // finish_write_behind() pushes what is left and reports the error
      tb.wb.pushed = true;
    }
    return status{};  // a push error is finish_write_behind()'s to report
  });
}

// Waits for the write-behind and retires its rows. Rows the flusher did not push (its push
// failed, or begin_pass failed before starting it) are pushed here, logged like every push of
// the caller; while that fails they stay pending and every call that needs the store returns
// the error. An exception of the flusher is returned first, once, with its rows left pending.
template <class Key, class Space>
status training_cache_core<Key, Space>::finish_write_behind() {
  // An exception of the flusher is reported once; its rows stay pending and the next call pushes
  // them again.
  if (status s = flusher.take_failure(); !s.ok()) return s;
  for (auto& tb : tables) {
    if (!tb.wb.keys.empty()) {
      if (!tb.wb.pushed) {
        EMBCACHE_RETURN_IF_ERROR(
            copy_out_detached(tb).with_context("write-behind of table '" + tb.opt.name + "'"));
        EMBCACHE_RETURN_IF_ERROR(push(tb, tb.wb.keys.data(), tb.wb.keys.size(),
                                      tb.wb.rows.data(), tb.wb.versions.data())
                                     .with_context("write-behind of table '" + tb.opt.name + "'"));
      }
      tb.wb.seconds_done += tb.wb.seconds;
      tb.wb.seconds = 0;
      tb.wb.pushed = false;
      tb.wb.keys.clear();
      tb.wb.versions.clear();
    }
    // The larger free buffer is the next eviction's (prefetch() counted on it).
    if (tb.wb.rows.size() > tb.wb.spare_rows.size()) tb.wb.spare_rows.swap(tb.wb.rows);
  }
  return {};
}

template <class Key, class Space>
status training_cache_core<Key, Space>::copy_out_detached(table_type& tb) {
  if (tb.wb.detached.empty()) return {};
  EMBCACHE_RETURN_IF_ERROR(tb.bridge.read_rows(tb.wb.detached.data(), tb.wb.detached.size(),
                                               tb.wb.rows.data(), options.prefetch_batch));
  tb.wb.detached.clear();
  return {};
}

// Drops the write-behind rows unpushed (load() replaces the whole store).
template <class Key, class Space>
void training_cache_core<Key, Space>::discard_write_behind() {
  (void)flusher.take_failure();  // the rows it failed to push go too
  for (auto& tb : tables) {
    tb.wb.keys.clear();
    tb.wb.versions.clear();
    tb.wb.detached.clear();
    tb.wb.seconds = 0;
    tb.wb.pushed = false;
  }
}

// Store access, serialized with the prefetch worker.
template <class Key, class Space>
status training_cache_core<Key, Space>::push(table_type& tb, const Key* keys, std::size_t n,
                                             const float* rows, const std::uint64_t* versions) {
  if (n == 0) return {};
  std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
  if (tb.sync.log_writes) tb.sync.writes_log.insert(tb.sync.writes_log.end(), keys, keys + n);
  return tb.sync.store->push(keys, n, rows, versions);
}
template <class Key, class Space>
status training_cache_core<Key, Space>::pull(table_type& tb, const Key* keys, std::size_t n,
                                             float* rows, bool* found, std::uint64_t* versions) {
  if (n == 0) return {};
  std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
  return tb.sync.store->pull(keys, n, rows, found, versions);
}

template <class Key, class Space>
void training_cache_core<Key, Space>::initialize_row(const table_type& tb, Key k,
                                                     float* dst) const {
  tb.cache->ref().initialize_row(k, dst);
  if (tb.state_width) initialize_state(tb.opt.optimizer, tb.opt.dim, dst + tb.opt.dim);
}

template <class Key, class Space>
std::uint64_t training_cache_core<Key, Space>::fresh_version(table_type& tb) {
  const std::uint64_t v = tb.cache->version() + 1;
  tb.cache->advance_version(v);
  return v;
}

// Resident keys (sorted) and their versions.
template <class Key, class Space>
status training_cache_core<Key, Space>::residents(table_type& tb, std::vector<Key>* keys,
                                                  std::vector<std::uint64_t>* vers) {
  const auto all = export_filter::all();
  const std::size_t n = tb.cache->size();
  keys->resize(n);
  vers->resize(n);
  std::size_t count = 0;
  EMBCACHE_RETURN_IF_ERROR(
      tb.bridge.export_if(all, keys->data(), nullptr, vers->data(), n, &count));
  keys->resize(count);
  vers->resize(count);
  return {};
}

// Rows of `tb` that one write-back chunk holds (options.write_back_bytes, at least one).
template <class Key, class Space>
std::size_t training_cache_core<Key, Space>::write_back_chunk_rows(const table_type& tb) const {
  return std::max<std::size_t>(1, options.write_back_bytes / (tb.row_width * sizeof(float)));
}

// Pushes the dirty rows among the resident `keys` [b, b + m), marks them in sync and logs them
// for the export: one chunk of a write-back, in buffers of `chunk` rows.
template <class Key, class Space>
status training_cache_core<Key, Space>::write_back_chunk(table_type& tb, const Key* keys,
                                                         std::size_t m, write_back_buffers& buf,
                                                         table_counters& c) {
  const std::size_t w = tb.row_width;
  buf.slots.resize(m);
  buf.dirty_slots.resize(m);
  buf.keys.resize(m);
  buf.versions.resize(m);
  if (buf.rows.size() < m * w) buf.rows.resize(m * w);
  EMBCACHE_RETURN_IF_ERROR(tb.bridge.lookup_slots(keys, m, buf.slots.data()));
  for (const auto s : buf.slots) {
    if (s < 0) return status::internal("resident key vanished during write-back");
  }
  std::size_t d = 0;
  EMBCACHE_RETURN_IF_ERROR(tb.bridge.gather_dirty(buf.slots.data(), m, buf.dirty_slots.data(),
                                                  buf.keys.data(), buf.rows.data(),
                                                  buf.versions.data(), &d));
  EMBCACHE_RETURN_IF_ERROR(push(tb, buf.keys.data(), d, buf.rows.data(), buf.versions.data())
                               .with_context("write-back of table '" + tb.opt.name + "'"));
  tb.exports.note_written(buf.keys.begin(),
                            buf.keys.begin() + static_cast<std::ptrdiff_t>(d));
  tb.exports.compact_if_grown();
  // In sync at the versions pushed: a row updated since stays dirty.
  EMBCACHE_RETURN_IF_ERROR(tb.bridge.mark_synced(buf.dirty_slots.data(), d, buf.versions.data()));
  c.rows_pushed += d;
  c.bytes_cache_to_store += d * w * sizeof(float);
  return {};
}

// Writes back the dirty rows among resident `keys`, in chunks of write_back_bytes, then erases
// all of them from the cache when `evict`.
template <class Key, class Space>
status training_cache_core<Key, Space>::write_back(table_type& tb, const std::vector<Key>& keys,
                                                   bool evict, table_counters& c) {
  const auto t0 = clock_type::now();
  const std::size_t n = keys.size();
  const std::size_t chunk = std::min(write_back_chunk_rows(tb), std::max<std::size_t>(n, 1));
  write_back_buffers buf;
  try {
    buf.rows.reserve(chunk * tb.row_width);
  } catch (const std::bad_alloc&) {
    return host_allocation_failed("write-back of table '" + tb.opt.name + "': its buffer of " +
                                      std::to_string(chunk) + " rows",
                                  chunk * tb.row_width * sizeof(float));
  }
  for (std::size_t b = 0; b < n; b += chunk) {
    EMBCACHE_RETURN_IF_ERROR(write_back_chunk(tb, keys.data() + b, std::min(chunk, n - b), buf, c));
  }
  if (evict) {
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.erase(keys.data(), n));
    c.rows_evicted += n;
  }
  c.seconds_write_back += seconds_since(t0);
  return {};
}

}  // namespace embcache::detail
