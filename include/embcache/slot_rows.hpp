/// Where the sparse ops find the rows of a cache's slots.
///
/// lookup_combine reads, and apply_optimizer updates, rows by index in a cache's row pool
/// (embedding_cache::row_pool()). Without spare rows the row of slot s is row s. A cache with spare
/// rows (cache_options::spare_rows, which training_cache_options::move_staged_rows gives every
/// table) moves rows between slots by index, so the row of slot s is the one
/// embedding_cache::row_indices() names. A batch's slots (from lookup_slots) become the sparse
/// ops' row indices through slot_rows::of; marks (mark_updated) stay by slot:
///
///   slot_rows<Key> batch_rows, updated_rows;
///   slot_batch b = batch_over_slots;           // aggregate_gradients runs over slots
///   slot_batch r = b;
///   r.row_indices = batch_rows.of(cache, b.row_indices, b.num_indices, space);
///   lookup_combine(space, cache.row_pool(), cache.row_width(), dim, r, comb, out);
///   aggregate_gradients(space, b, comb, d_out, dim, grads);   // grads.rows: unique slots
///   apply_optimizer(space, opt, cache.row_pool(), cache.row_width(), grads.dim,
///                   updated_rows.of(cache, grads.rows.data(), grads.size, space),
///                   grads.values.data(), grads.size, step);
///   cache.mark_updated(grads.rows.data(), grads.size);
///
/// The sums are the same bits either way: each row is read and updated in the same order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "embcache/buffer.hpp"
#include "embcache/embedding_cache.hpp"
#include "embcache/space.hpp"

namespace embcache {

/// Translates slots of a cache into the rows they hold, into a buffer kept from call to call
/// (in the space's memory). Not thread-safe; one per concurrent use.
template <class Key, class Space = host_space>
class slot_rows {
 public:
  /// The row of each of `slots` (n, the space's memory; -1 stays -1): `slots` itself when the
  /// cache has no spare rows, else this object's buffer, valid until the next call. Reads the
  /// cache's row index (embedding_cache::row_indices), so call it after the last call that moved
  /// rows (install_rows, detach_rows; training_cache::begin_pass).
  const std::int64_t* of(const embedding_cache<Key, Space>& cache, const std::int64_t* slots,
                         std::size_t n, const Space& space) {
    if (cache.row_count() == cache.slots()) return slots;
    if (rows_.size() < n) rows_ = buffer<std::int64_t, Space>(n, space);
    cache.row_indices(slots, n, rows_.data());
    return rows_.data();
  }

 private:
  buffer<std::int64_t, Space> rows_;
};

}  // namespace embcache
