/// @file detail/embedding_cache_install.inl
/// @brief Definition of embedding_cache::install, the bulk insert of a pass boundary: every key
/// placed in one parallel pass over the hash table, then every new row copied into its slot, with
/// its metadata, in one parallel pass over the rows. Included by detail/embedding_cache.inl.
#pragma once

#include <mutex>

#include "embcache/detail/cache_install_loops.inl"
#include "embcache/embedding_cache.hpp"

namespace embcache {

template <class Key, class Space>
status embedding_cache<Key, Space>::install(const Key* keys, std::size_t n, const float* rows,
                                            const std::uint64_t* versions,
                                            const std::uint64_t* synced, std::uint32_t mark,
                                            std::int64_t* slots_out) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::unique_lock lock(*mutex_);
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
  detail::for_each_index(sp, n,
                         detail::install_fill_fn<Key>{ref(), slots, outcome.data(), rows, versions,
                                                      synced, version, op, mark, stream});
  const std::size_t inserted = detail::count_equal(sp, outcome.data(), n, detail::outcome_inserted);
  const std::size_t failed = detail::count_equal(sp, outcome.data(), n, detail::outcome_failed);
  size_ += inserted;
  if (inserted + failed < n) {
    // Keys already resident (or repeated): overwritten last occurrence wins, as insert_or_assign
    // does, then synced and marked like the new ones. No other call holds claim tags: the epochs
    // are re-based here when they run out.
    std::uint64_t epoch = claim_epoch_.fetch_add(claim_chunks(n)) + 1;
    if (epoch + claim_chunks(n) > claim_epoch_end) {
      claims_.fill_bytes(0);
      detail::synchronize(space_);
      claim_epoch_ = claim_chunks(n);
      epoch = 1;
    }
    claim_and_assign(sp, slots, n, outcome.data(), rows, versions, version, epoch);
    if (synced) detail::for_each_index(sp, n, detail::mark_synced_fn<Key>{ref(), slots, synced});
    detail::for_each_index(sp, n, detail::set_marks_fn<Key>{ref(), slots, mark});
  }
  detail::synchronize(sp);
  if (failed) return check_no_failures(slots, keys, n, "install");
  return {};
}

}  // namespace embcache
