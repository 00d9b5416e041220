/// @file detail/embedding_cache_install.inl
/// @brief Definition of embedding_cache::install, the bulk insert of a pass boundary: every key
/// placed in one parallel pass over the hash table, then every new row copied into its slot, with
/// its metadata, in one parallel pass over the rows; install_rows, the same with rows that move
/// in through the slot-to-row map instead of a copy, and detach_rows, its way out. Included by
/// detail/embedding_cache.inl.
#pragma once

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "embcache/detail/cache_install_loops.inl"
#include "embcache/embedding_cache.hpp"

namespace embcache {

template <class Key, class Space>
status embedding_cache<Key, Space>::install(const Key* keys, std::size_t n, const float* rows,
                                            const std::uint64_t* versions,
                                            const std::uint64_t* synced, std::uint32_t mark,
                                            std::int64_t* slots_out) {
  return install_impl(keys, n, rows, nullptr, versions, synced, mark, slots_out, "install");
}

template <class Key, class Space>
status embedding_cache<Key, Space>::install_rows(const Key* keys, std::size_t n,
                                                 std::int64_t* rows,
                                                 const std::uint64_t* versions,
                                                 const std::uint64_t* synced, std::uint32_t mark,
                                                 std::int64_t* slots_out) {
  return install_impl(keys, n, nullptr, rows, versions, synced, mark, slots_out, "install_rows");
}

// install (rows copied from `rows`) and install_rows (rows moved in from the table's rows
// `rows_io`, which receives the rows freed): the same placement, metadata and clocks.
template <class Key, class Space>
status embedding_cache<Key, Space>::install_impl(const Key* keys, std::size_t n, const float* rows,
                                                 std::int64_t* rows_io,
                                                 const std::uint64_t* versions,
                                                 const std::uint64_t* synced, std::uint32_t mark,
                                                 std::int64_t* slots_out, const char* call) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::unique_lock lock(*mutex_);
  if (rows_io) EMBCACHE_RETURN_IF_ERROR(check_row_indices(sp, rows_io, nullptr, n, call));
  if (n == 0) return {};
  buffer<std::int64_t, Space> slot_buffer(slots_out ? 0 : n, sp);
  std::int64_t* const slots = slots_out ? slots_out : slot_buffer.data();
  buffer<std::uint8_t, Space> outcome(n, sp);
  // The clocks move as insert_or_assign moves them: the same versions for the same calls.
  const std::uint64_t version = next_version();
  const std::uint64_t op = next_op();
  detail::for_each_index(sp, n,
                         detail::install_place_fn<Key>{ref(), keys, slots, outcome.data(), op});
  // Rows beyond what the processor's caches hold are streamed past them (host).
  const bool stream = n * row_width_ * sizeof(float) >= (std::size_t{4} << 20);
  const detail::install_fill_fn<Key> fill{ref(),    slots, outcome.data(), rows, versions,
                                          synced,   version, op,           mark, stream};
  if (rows_io) {
    detail::for_each_index(sp, n, detail::install_swap_fn<Key>{fill, row_map_.data(), rows_io});
  } else {
    detail::for_each_index(sp, n, fill);
  }
  const std::size_t inserted = detail::count_equal(sp, outcome.data(), n, detail::outcome_inserted);
  const std::size_t failed = detail::count_equal(sp, outcome.data(), n, detail::outcome_failed);
  size_ += inserted;
  if (inserted + failed < n) {
    // Keys already resident (or repeated): overwritten last occurrence wins, as insert_or_assign
    // does (install_rows: copied from the given rows, which stay the caller's), then synced and
    // marked like the new ones. No other call holds claim tags: the epochs are re-based here when
    // they run out.
    std::uint64_t epoch = claim_epoch_.fetch_add(claim_chunks(n)) + 1;
    if (epoch + claim_chunks(n) > claim_epoch_end) {
      claims_.fill_bytes(0);
      detail::synchronize(space_);
      claim_epoch_ = claim_chunks(n);
      epoch = 1;
    }
    claim_and_assign(sp, slots, n, outcome.data(), rows, versions, version, epoch, rows_io);
    if (synced) detail::for_each_index(sp, n, detail::mark_synced_fn<Key>{ref(), slots, synced});
    detail::for_each_index(sp, n, detail::set_marks_fn<Key>{ref(), slots, mark});
  }
  detail::synchronize(sp);
  if (failed) return check_no_failures(slots, keys, n, call);
  return {};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::check_row_indices(const Space& sp, const std::int64_t* rows,
                                                      const std::int64_t* slots, std::size_t n,
                                                      const char* call) const {
  if (!row_map_.data()) {
    return status::invalid_argument(std::string(call) +
                                    ": the cache has no spare rows (cache_options::spare_rows)");
  }
  buffer<std::uint8_t, Space> bad(n, sp);
  detail::for_each_index(sp, n, detail::row_index_check_fn{rows, slots, row_count(), bad.data()});
  const std::size_t count = detail::count_equal(sp, bad.data(), n, std::uint8_t{1});
  if (count == 0) return {};
  // Rare path: copy back to name the first one.
  std::vector<std::uint8_t> b(n);
  std::vector<std::int64_t> r(n);
  detail::copy(sp, b.data(), bad.data(), n);
  detail::copy(sp, r.data(), rows, n * sizeof(std::int64_t));
  const std::size_t first = static_cast<std::size_t>(
      std::find(b.begin(), b.end(), std::uint8_t{1}) - b.begin());
  return status::invalid_argument(std::string(call) + ": " + std::to_string(count) +
                                  " row indices outside [0, " + std::to_string(row_count()) +
                                  "), the first at position " + std::to_string(first) + ": " +
                                  std::to_string(r[first]));
}

template <class Key, class Space>
status embedding_cache<Key, Space>::detach_rows(const std::int64_t* slots, std::size_t n,
                                                std::int64_t* rows) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::unique_lock lock(*mutex_);
  EMBCACHE_RETURN_IF_ERROR(check_row_indices(sp, rows, slots, n, "detach_rows"));
  detail::for_each_index(sp, n, detail::detach_row_fn{slots, row_map_.data(), rows});
  detail::synchronize(sp);
  return {};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::write_rows(const std::int64_t* rows, std::size_t n,
                                               const float* src) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  // Shared: the rows written are no slot's, so lookups and updates of the slots' rows may run.
  std::shared_lock lock(*mutex_);
  EMBCACHE_RETURN_IF_ERROR(check_row_indices(sp, rows, nullptr, n, "write_rows"));
  const bool stream = n * row_width_ * sizeof(float) >= (std::size_t{4} << 20);
  detail::for_each_index(sp, n,
                         detail::write_rows_fn<Key>{rows_.data(), row_width_, rows, src, stream});
  detail::synchronize(sp);
  return {};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::read_rows(const std::int64_t* rows, std::size_t n,
                                              float* dst) const {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::shared_lock lock(*mutex_);
  EMBCACHE_RETURN_IF_ERROR(check_row_indices(sp, rows, nullptr, n, "read_rows"));
  detail::for_each_index(sp, n, detail::read_rows_fn<Key>{rows_.data(), row_width_, rows, dst});
  detail::synchronize(sp);
  return {};
}

template <class Key, class Space>
void embedding_cache<Key, Space>::row_indices(const std::int64_t* slots, std::size_t n,
                                              std::int64_t* rows_out) const {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::shared_lock lock(*mutex_);
  detail::for_each_index(sp, n, detail::row_index_fn<Key>{ref(), slots, rows_out});
  detail::synchronize(sp);
}

}  // namespace embcache
