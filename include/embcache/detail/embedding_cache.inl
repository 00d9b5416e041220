/// @file detail/embedding_cache.inl
/// @brief Definitions of embedding_cache: every bulk operation is a parallel loop over the
/// single-key operations of embedding_cache_ref, run by the space's `for_each_index`.
///
/// Included by the translation unit that instantiates a space (src/cache/embedding_cache.cpp for
/// the host, src/cache/embedding_cache.cu for the cuda space); it brings that space's primitives
/// itself (detail/space_algorithms.hpp), so nothing has to come before it.
#pragma once

// First: the qualified calls below bind to the overloads declared before them.
#include "embcache/detail/space_algorithms.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "embcache/detail/cache_assign_loops.inl"
#include "embcache/detail/cache_bookkeeping_loops.inl"
#include "embcache/detail/cache_evict_loops.inl"
#include "embcache/detail/cache_export_loops.inl"
#include "embcache/detail/cache_lookup_loops.inl"
#include "embcache/detail/embedding_cache_install.inl"
#include "embcache/embedding_cache.hpp"

namespace embcache {
namespace detail {

template <class Key>
std::string key_to_string(Key k) {
  return std::to_string(k);
}

}  // namespace detail

template <class Key, class Space>
embedding_cache<Key, Space>::embedding_cache(const cache_options& options, Space space)
    : options_(options), space_(space), mutex_(std::make_unique<std::shared_mutex>()) {
  if (options.slots == 0)
    throw error(status_code::invalid_argument, "embedding_cache: slots must be at least 1");
  if (options.dim == 0)
    throw error(status_code::invalid_argument, "embedding_cache: dim must be at least 1");
  num_buckets_ = (options.slots + bucket_size - 1) / bucket_size;
  slots_ = num_buckets_ * bucket_size;
  row_width_ = options.dim + options.state_width;
  if constexpr (is_cuda_space_v<Space>) device_ = detail::cuda_current_device();
  states_ = buffer<std::uint8_t, Space>(slots_, space_);
  keys_ = buffer<Key, Space>(slots_, space_);
  overflow_ = buffer<std::uint32_t, Space>(num_buckets_, space_);
  versions_ = buffer<std::uint64_t, Space>(slots_, space_);
  scores_ = buffer<std::uint64_t, Space>(slots_, space_);
  if (options.scores == score_policy::lfu)
    touched_ = buffer<std::uint64_t, Space>(slots_, space_);
  claims_ = buffer<std::uint64_t, Space>(slots_, space_);
  synced_ = buffer<std::uint64_t, Space>(slots_, space_);
  marks_ = buffer<std::uint32_t, Space>(slots_, space_);
  if (options.spare_rows > 0) {
    if (options.spare_rows >= max_rows || slots_ >= max_rows - options.spare_rows) {
      throw error(status_code::invalid_argument,
                  "embedding_cache: " + std::to_string(slots_) + " slots and " +
                      std::to_string(options.spare_rows) + " spare rows reach 2^32 rows");
    }
  }
  rows_ = buffer<float, Space>((slots_ + options.spare_rows) * row_width_, space_);
  if (options.spare_rows > 0) {
    row_map_ = buffer<std::uint32_t, Space>(slots_, space_);
    detail::for_each_index(space_, slots_, detail::identity_row_map_fn{row_map_.data()});
  }
  states_.fill_bytes(0);
  overflow_.fill_bytes(0);
  versions_.fill_bytes(0);
  scores_.fill_bytes(0);
  if (touched_.data()) touched_.fill_bytes(0);
  claims_.fill_bytes(0);
  synced_.fill_bytes(0);
  marks_.fill_bytes(0);
  detail::synchronize(space_);
}

template <class Key, class Space>
embedding_cache<Key, Space>::~embedding_cache() {
  if constexpr (is_cuda_space_v<Space>) {
    // The arrays go back to their own device's pool, not the destroying thread's current device.
    // Should the device not become current, they are freed as the runtime lets us (never throw).
    std::optional<cuda_device_guard> on_device;
    try {
      on_device.emplace(device_);
    } catch (const std::exception&) {
    }
    states_.reset();
    keys_.reset();
    overflow_.reset();
    versions_.reset();
    scores_.reset();
    touched_.reset();
    claims_.reset();
    synced_.reset();
    marks_.reset();
    row_map_.reset();
    rows_.reset();
  }
}

template <class Key, class Space>
std::size_t embedding_cache<Key, Space>::allocated_bytes() const noexcept {
  auto bytes = [](const auto& b) { return b.size() * sizeof(*b.data()); };
  return bytes(states_) + bytes(keys_) + bytes(overflow_) + bytes(versions_) + bytes(scores_) +
         bytes(touched_) + bytes(claims_) + bytes(synced_) + bytes(marks_) + bytes(row_map_) +
         bytes(rows_);
}

template <class Key, class Space>
embedding_cache_ref<Key> embedding_cache<Key, Space>::ref() noexcept {
  return {{states_.data(), keys_.data(), overflow_.data(), versions_.data(), scores_.data(),
           touched_.data(), claims_.data(), synced_.data(), marks_.data(), rows_.data(),
           row_map_.data(), num_buckets_, row_width_, options_.dim, options_.init,
           options_.init.scale * 1.7320508075688772f, options_.scores}};
}

template <class Key, class Space>
const_embedding_cache_ref<Key> embedding_cache<Key, Space>::ref() const noexcept {
  return {{states_.data(), keys_.data(), overflow_.data(), versions_.data(), scores_.data(),
           touched_.data(), claims_.data(), synced_.data(), marks_.data(), rows_.data(),
           row_map_.data(), num_buckets_, row_width_, options_.dim, options_.init,
           options_.init.scale * 1.7320508075688772f, options_.scores}};
}

template <class Key, class Space>
void embedding_cache<Key, Space>::find(const Key* keys, std::size_t n, float* rows_out,
                                       bool* found_out) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::shared_lock lock(*mutex_);
  detail::for_each_index(sp, n,
                         detail::find_fn<Key>{ref(), keys, rows_out, found_out, next_op()});
  detail::synchronize(sp);
}

template <class Key, class Space>
status embedding_cache<Key, Space>::check_no_failures(const std::int64_t* slots, const Key* keys,
                                                      std::size_t n, const char* what) const {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  // Rare path: copy back to name the first key that did not fit.
  std::vector<std::int64_t> s(n);
  std::vector<Key> k(n);
  detail::copy(sp, s.data(), slots, n * sizeof(std::int64_t));
  detail::copy(sp, k.data(), keys, n * sizeof(Key));
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
      " of capacity " + std::to_string(slots_));
}

template <class Key, class Space>
status embedding_cache<Key, Space>::insert_pass(const Key* keys, std::size_t n, std::int64_t* slots,
                                                float* rows_out, bool* inserted_out,
                                                bool initialize, std::uint64_t op,
                                                const char* what) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  buffer<std::uint8_t, Space> outcome(n, sp);
  const std::uint64_t version = next_version();
  detail::for_each_index(sp, n,
                         detail::insert_fn<Key>{ref(), keys, slots, outcome.data(), rows_out,
                                                nullptr, nullptr, version, op, initialize});
  const std::size_t inserted =
      detail::count_equal(sp, outcome.data(), n, detail::outcome_inserted);
  const std::size_t failed = detail::count_equal(sp, outcome.data(), n, detail::outcome_failed);
  size_ += inserted;
  if (inserted_out) {
    // Failures report false.
    detail::for_each_index(
        sp, n, detail::outcome_flag_fn{outcome.data(), detail::outcome_inserted, inserted_out});
  }
  detail::synchronize(sp);
  if (failed) return check_no_failures(slots, keys, n, what);
  return {};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::find_or_insert(const Key* keys, std::size_t n, float* rows_out,
                                                   bool* inserted_out, std::int64_t* slots_out) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::shared_lock lock(*mutex_);
  buffer<std::int64_t, Space> slots(slots_out ? 0 : n, sp);
  return insert_pass(keys, n, slots_out ? slots_out : slots.data(), rows_out, inserted_out, true,
                     next_op(), "find_or_insert");
}

template <class Key, class Space>
status embedding_cache<Key, Space>::lookup_slots(const Key* keys, std::size_t n,
                                                 std::int64_t* slots_out, bool insert_missing,
                                                 bool* inserted_out) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::shared_lock lock(*mutex_);
  if (insert_missing)
    return insert_pass(keys, n, slots_out, nullptr, inserted_out, true, next_op(), "lookup_slots");
  detail::for_each_index(sp, n, detail::slot_fn<Key>{ref(), keys, slots_out, next_op()});
  detail::synchronize(sp);
  return {};
}

template <class Key, class Space>
status embedding_cache<Key, Space>::insert_or_assign(const Key* keys, std::size_t n,
                                                     const float* rows,
                                                     const std::uint64_t* versions,
                                                     std::int64_t* slots_out) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::shared_lock lock(*mutex_);
  if (n == 0) return {};
  buffer<std::int64_t, Space> slot_buffer(slots_out ? 0 : n, sp);
  std::int64_t* const slots = slots_out ? slots_out : slot_buffer.data();
  buffer<std::uint8_t, Space> outcome(n, sp);
  // Before any work: taking epochs may release the lock for a moment.
  const std::uint64_t epoch = take_claim_epochs(lock, claim_chunks(n));
  const std::uint64_t version = next_version();
  const std::uint64_t op = next_op();
  detail::for_each_index(sp, n,
                         detail::insert_fn<Key>{ref(), keys, slots, outcome.data(), nullptr, rows,
                                                versions, version, op, false});
  claim_and_assign(sp, slots, n, outcome.data(), rows, versions, version, epoch);
  size_ += detail::count_equal(sp, outcome.data(), n, detail::outcome_inserted);
  const std::size_t failed = detail::count_equal(sp, outcome.data(), n, detail::outcome_failed);
  detail::synchronize(sp);
  if (failed) return check_no_failures(slots, keys, n, "insert_or_assign");
  return {};
}

template <class Key, class Space>
void embedding_cache<Key, Space>::erase(const Key* keys, std::size_t n, std::size_t* erased_out) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::unique_lock lock(*mutex_);
  buffer<std::uint8_t, Space> erased(n, sp);
  detail::for_each_index(sp, n, detail::erase_fn<Key>{ref(), keys, erased.data()});
  const std::size_t count = detail::count_equal(sp, erased.data(), n, std::uint8_t{1});
  size_ -= count;
  if (count) next_version();  // an erase is a change of the model
  if (erased_out) *erased_out = count;
  detail::synchronize(sp);
}

template <class Key, class Space>
void embedding_cache<Key, Space>::read_slots(const std::int64_t* slots, std::size_t n,
                                             float* rows_out) const {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::shared_lock lock(*mutex_);
  detail::for_each_index(sp, n, detail::read_slots_fn<Key>{ref(), slots, rows_out});
  detail::synchronize(sp);
}

template <class Key, class Space>
void embedding_cache<Key, Space>::assign_slots(const std::int64_t* slots, std::size_t n,
                                               const float* rows, const std::uint64_t* versions) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::shared_lock lock(*mutex_);
  if (n == 0) return;
  const std::uint64_t epoch = take_claim_epochs(lock, claim_chunks(n));
  const std::uint64_t version = next_version();
  claim_and_assign(sp, slots, n, nullptr, rows, versions, version, epoch);
  detail::synchronize(sp);
}

template <class Key, class Space>
std::uint64_t embedding_cache<Key, Space>::take_claim_epochs(
    std::shared_lock<std::shared_mutex>& lock, std::uint64_t count) {
  for (;;) {
    const std::uint64_t first = claim_epoch_.fetch_add(count) + 1;
    if (first + count <= claim_epoch_end) return first;
    // Out of epochs: wait until no call holds tags (the exclusive lock), then zero the claims.
    // Whoever gets the lock first re-bases; the others find fresh epochs.
    lock.unlock();
    {
      std::unique_lock exclusive(*mutex_);
      if (claim_epoch_.load() + count >= claim_epoch_end) {
        claims_.fill_bytes(0);
        detail::synchronize(space_);
        claim_epoch_ = 0;
      }
    }
    lock.lock();
  }
}

template <class Key, class Space>
void embedding_cache<Key, Space>::claim_and_assign(const Space& sp, const std::int64_t* slots,
                                                   std::size_t n, const std::uint8_t* outcome,
                                                   const float* rows, const std::uint64_t* versions,
                                                   std::uint64_t version,
                                                   std::uint64_t first_epoch,
                                                   const std::int64_t* rows_of) {
  // A chunk of 2^32 keys per epoch: a later chunk's epoch is higher, so the last occurrence of
  // a repeated slot still wins across chunks.
  for (std::uint64_t c = 0; c * claim_chunk < n; ++c) {
    const std::size_t at = std::size_t(c * claim_chunk);
    const std::size_t m = std::size_t(std::min<std::uint64_t>(claim_chunk, n - at));
    const std::uint64_t epoch = first_epoch + c;
    detail::for_each_index(sp, m, detail::claim_fn<Key>{ref(), slots + at, epoch});
    detail::for_each_index(
        sp, m,
        detail::assign_fn<Key>{ref(), slots + at, outcome ? outcome + at : nullptr,
                               rows_of ? nullptr : rows + at * row_width_,
                               versions ? versions + at : nullptr, version, epoch,
                               rows_of ? rows_of + at : nullptr});
  }
}

template <class Key, class Space>
void embedding_cache<Key, Space>::mark_updated(const std::int64_t* slots, std::size_t n) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::shared_lock lock(*mutex_);
  if (n == 0) return;
  detail::for_each_index(sp, n, detail::mark_fn<Key>{ref(), slots, next_version()});
  detail::synchronize(sp);
}

template <class Key, class Space>
status embedding_cache<Key, Space>::insert_and_evict(
    const Key* keys, std::size_t n, const float* rows_in, const std::uint64_t* versions_in,
    Key* evicted_keys, float* evicted_rows, std::uint64_t* evicted_versions,
    std::size_t* evicted_count, bool* found_out, std::int64_t* slots_out, bool* evicted_dirty) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::unique_lock lock(*mutex_);
  if (evicted_count) *evicted_count = 0;
  if (n == 0) return {};
  buffer<std::uint64_t, Space> homes(n, sp);
  buffer<std::uint64_t, Space> order(n, sp);
  buffer<std::uint8_t, Space> outcome(n, sp);
  buffer<std::int64_t, Space> slots(n, sp);
  buffer<Key, Space> vkeys(n, sp);
  buffer<float, Space> vrows(n * row_width_, sp);
  buffer<std::uint64_t, Space> vversions(n, sp);
  buffer<std::uint8_t, Space> vdirty(n, sp);
  const auto t = ref();
  detail::for_each_index(sp, n, detail::home_fn<Key>{t, keys, homes.data(), order.data()});
  detail::stable_sort_by_key(sp, homes.data(), order.data(), n);
  const std::uint64_t version = next_version();
  const std::uint64_t op = next_op();
  detail::for_each_index(
      sp, n,
      detail::evict_fn<Key>{t, keys, homes.data(), order.data(), n, rows_in, versions_in, version,
                            op, outcome.data(), slots.data(), vkeys.data(), vrows.data(),
                            vversions.data(), vdirty.data()});
  const std::size_t inserted =
      detail::count_equal(sp, outcome.data(), n, detail::outcome_inserted);
  const std::size_t evicted =
      detail::count_equal(sp, outcome.data(), n, detail::outcome_evicted);
  const std::size_t failed = detail::count_equal(sp, outcome.data(), n, detail::outcome_failed);
  size_ += inserted;
  if (evicted) {
    buffer<std::uint32_t, Space> flags(n, sp);
    buffer<std::uint64_t, Space> positions(n, sp);
    detail::for_each_index(sp, n, detail::victim_flag_fn<Key>{outcome.data(), flags.data()});
    detail::exclusive_scan(sp, flags.data(), positions.data(), n);
    detail::for_each_index(
        sp, n,
        detail::victim_compact_fn<Key>{outcome.data(), positions.data(), vkeys.data(), vrows.data(),
                                       vversions.data(), vdirty.data(), row_width_,
                                       evicted_keys, evicted_rows, evicted_versions,
                                       evicted_dirty});
  }
  if (evicted_count) *evicted_count = evicted;
  if (slots_out) detail::copy(sp, slots_out, slots.data(), n * sizeof(std::int64_t));
  if (found_out) {
    detail::for_each_index(
        sp, n, detail::outcome_flag_fn{outcome.data(), detail::outcome_found, found_out});
  }
  detail::synchronize(sp);
  if (failed) return check_no_failures(slots.data(), keys, n, "insert_and_evict");
  return {};
}

template <class Key, class Space>
void embedding_cache<Key, Space>::mark_synced(const std::int64_t* slots, std::size_t n,
                                              const std::uint64_t* versions) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::shared_lock lock(*mutex_);
  if (n == 0) return;
  detail::for_each_index(sp, n, detail::mark_synced_fn<Key>{ref(), slots, versions});
  detail::synchronize(sp);
}

template <class Key, class Space>
void embedding_cache<Key, Space>::set_marks(const std::int64_t* slots, std::size_t n,
                                            std::uint32_t mark) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::shared_lock lock(*mutex_);
  if (n == 0) return;
  detail::for_each_index(sp, n, detail::set_marks_fn<Key>{ref(), slots, mark});
  detail::synchronize(sp);
}

template <class Key, class Space>
void embedding_cache<Key, Space>::select_victims(std::uint32_t keep_mark, std::size_t need,
                                                 victim_order order, std::int64_t* victims_out,
                                                 std::size_t* count_out) const {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::shared_lock lock(*mutex_);
  *count_out = 0;
  if (need == 0) return;
  const auto t = ref();
  buffer<std::uint32_t, Space> flags(slots_, sp);
  detail::for_each_index(sp, slots_,
                         detail::victim_candidate_fn<Key>{t, keep_mark, flags.data()});
  const std::size_t count = detail::count_equal(sp, flags.data(), slots_, std::uint32_t{1});
  buffer<std::uint64_t, Space> positions(slots_, sp);
  detail::exclusive_scan(sp, flags.data(), positions.data(), slots_);
  if (count <= need) {
    // Every candidate goes: already in slot order.
    detail::for_each_index(sp, slots_,
                           detail::collect_flagged_fn{flags.data(), positions.data(), victims_out});
    detail::synchronize(sp);
    *count_out = count;
    return;
  }
  // Candidates ordered by key, then (stably) by version or score: the first `need` go.
  buffer<std::int64_t, Space> candidates(count, sp);
  detail::for_each_index(sp, slots_,
                         detail::collect_flagged_fn{flags.data(), positions.data(),
                                                    candidates.data()});
  if constexpr (is_host_space_v<Space>) {
    // The same choice by selection instead of two sorts: the need-th candidate by (order, key)
    // found in linear time, the ones after it unflagged, the rest collected in slot order.
    std::vector<detail::candidate_rank<Key>> ranks(count), picked;
    const bool by_score = order == victim_order::lowest_score;
    detail::for_each_index(
        sp, count, detail::candidate_rank_fn<Key>{t, candidates.data(), by_score, ranks.data()});
    picked = ranks;
    std::nth_element(picked.begin(), picked.begin() + std::ptrdiff_t(need - 1), picked.end());
    detail::for_each_index(sp, count,
                           detail::unflag_after_fn<Key>{candidates.data(), ranks.data(),
                                                        picked[need - 1], flags.data()});
    detail::exclusive_scan(sp, flags.data(), positions.data(), slots_);
    detail::for_each_index(sp, slots_,
                           detail::collect_flagged_fn{flags.data(), positions.data(), victims_out});
    detail::synchronize(sp);
    *count_out = need;
    return;
  }
  {
    buffer<Key, Space> keys(count, sp);
    detail::for_each_index(sp, count,
                           detail::candidate_keys_fn<Key>{t, candidates.data(), keys.data()});
    detail::stable_sort_by_key(sp, keys.data(), candidates.data(), count);
  }
  buffer<std::uint64_t, Space> first(count, sp);
  detail::for_each_index(sp, count,
                         detail::candidate_order_fn<Key>{t, candidates.data(),
                                                         order == victim_order::lowest_score,
                                                         first.data()});
  detail::stable_sort_by_key(sp, first.data(), candidates.data(), count);
  detail::sort(sp, candidates.data(), need);
  detail::copy(sp, victims_out, candidates.data(), need * sizeof(std::int64_t));
  detail::synchronize(sp);
  *count_out = need;
}

template <class Key, class Space>
void embedding_cache<Key, Space>::gather_dirty(const std::int64_t* slots, std::size_t n,
                                               Key* keys_out, float* rows_out,
                                               std::uint64_t* versions_out,
                                               std::int64_t* slots_out,
                                               std::size_t* count_out) const {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::shared_lock lock(*mutex_);
  *count_out = 0;
  if (n == 0) return;
  const auto t = ref();
  buffer<std::uint32_t, Space> flags(n, sp);
  buffer<std::uint64_t, Space> positions(n, sp);
  detail::for_each_index(sp, n, detail::dirty_flag_fn<Key>{t, slots, flags.data()});
  const std::size_t count = detail::count_equal(sp, flags.data(), n, std::uint32_t{1});
  detail::exclusive_scan(sp, flags.data(), positions.data(), n);
  // Rows beyond what the processor's caches hold are streamed past them (host).
  const bool stream = count * row_width_ * sizeof(float) >= (std::size_t{4} << 20);
  detail::for_each_index(
      sp, n,
      detail::dirty_gather_fn<Key>{t, slots, flags.data(), positions.data(), keys_out, rows_out,
                                   versions_out, slots_out, stream});
  detail::synchronize(sp);
  *count_out = count;
}

template <class Key, class Space>
void embedding_cache<Key, Space>::erase_slots(const std::int64_t* slots, std::size_t n,
                                              std::size_t* erased_out) {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::unique_lock lock(*mutex_);
  if (erased_out) *erased_out = 0;
  if (n == 0) return;
  buffer<std::uint8_t, Space> erased(n, sp);
  detail::for_each_index(sp, n, detail::erase_slot_fn<Key>{ref(), slots, erased.data()});
  const std::size_t count = detail::count_equal(sp, erased.data(), n, std::uint8_t{1});
  size_ -= count;
  if (count) next_version();  // an erase is a change of the model
  if (erased_out) *erased_out = count;
  detail::synchronize(sp);
}

template <class Key, class Space>
std::size_t embedding_cache<Key, Space>::count_if(const export_filter& filter) const {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::unique_lock lock(*mutex_);
  buffer<std::uint32_t, Space> flags(slots_, sp);
  detail::for_each_index(
      sp, slots_,
      detail::export_flag_fn{states_.data(), versions_.data(), filter, flags.data()});
  return detail::count_equal(sp, flags.data(), slots_, std::uint32_t{1});
}

template <class Key, class Space>
status embedding_cache<Key, Space>::export_if(const export_filter& filter, Key* keys_out,
                                              float* rows_out, std::uint64_t* versions_out,
                                              std::size_t max_out, std::size_t* count_out) const {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::unique_lock lock(*mutex_);
  if (count_out) *count_out = 0;
  buffer<std::uint32_t, Space> flags(slots_, sp);
  buffer<std::uint64_t, Space> positions(slots_, sp);
  detail::for_each_index(
      sp, slots_,
      detail::export_flag_fn{states_.data(), versions_.data(), filter, flags.data()});
  const std::size_t count = detail::count_equal(sp, flags.data(), slots_, std::uint32_t{1});
  if (count > max_out)
    return status::capacity_exceeded("embedding_cache::export_if: " + std::to_string(count) +
                                     " rows match but the output holds " + std::to_string(max_out));
  detail::exclusive_scan(sp, flags.data(), positions.data(), slots_);
  buffer<std::int64_t, Space> slots(count, sp);
  detail::for_each_index(sp, slots_,
                         detail::export_collect_fn<Key>{keys_.data(), flags.data(),
                                                        positions.data(), keys_out, slots.data()});
  detail::stable_sort_by_key(sp, keys_out, slots.data(), count);
  detail::for_each_index(
      sp, count, detail::export_gather_fn<Key>{ref(), slots.data(), rows_out, versions_out});
  detail::synchronize(sp);
  if (count_out) *count_out = count;
  return {};
}

template <class Key, class Space>
result<exported_rows<Key>> embedding_cache<Key, Space>::export_to_host(
    const export_filter& filter) const {
  const auto on_device = on_own_device();
  const Space sp = call_space();
  const std::size_t count = count_if(filter);
  exported_rows<Key> out;
  try {
    out.keys.resize(count);
    out.rows.resize(count * row_width_);
    out.versions.resize(count);
  } catch (const std::bad_alloc&) {
    // count <= capacity, whose rows are allocated already: the product cannot overflow.
    const std::size_t bytes =
        count * (sizeof(Key) + row_width_ * sizeof(float) + sizeof(std::uint64_t));
    return status::capacity_exceeded("embedding_cache::export_to_host: out of host memory "
                                     "(std::bad_alloc) allocating " + std::to_string(bytes) +
                                     " bytes for " + std::to_string(count) + " rows");
  }
  std::size_t written = 0;
  if constexpr (is_host_space_v<Space>) {
    EMBCACHE_RETURN_IF_ERROR(
        export_if(filter, out.keys.data(), out.rows.data(), out.versions.data(), count, &written));
  } else {
    buffer<Key, Space> k(count, sp);
    buffer<float, Space> r(count * row_width_, sp);
    buffer<std::uint64_t, Space> v(count, sp);
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
  const auto on_device = on_own_device();
  const Space sp = call_space();
  std::unique_lock lock(*mutex_);
  detail::fill_bytes(sp, states_.data(), 0, states_.bytes());
  detail::fill_bytes(sp, overflow_.data(), 0, overflow_.bytes());
  detail::fill_bytes(sp, scores_.data(), 0, scores_.bytes());
  if (touched_.data()) detail::fill_bytes(sp, touched_.data(), 0, touched_.bytes());
  detail::synchronize(sp);
  size_ = 0;
}

}  // namespace embcache
