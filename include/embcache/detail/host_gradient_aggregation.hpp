/// @file detail/host_gradient_aggregation.hpp
/// @brief The host space's aggregate_gradients: grouping by row without a comparison sort.
///
/// The portable path sorts the batch's 64-bit row indices with their positions. On the host that
/// sort costs more than the sums themselves, so the host path instead gives every occurrence the
/// 32-bit index of its row among the batch's distinct rows, ascending:
/// - dense: when the largest row index is at most a small multiple of the batch (rows index a
///   pool, so this is the usual case), a bitmap over [0, max row] marks the rows present and a
///   table indexed by row holds each one's rank; no hashing, no sort;
/// - sparse: otherwise, an open-addressing table groups the occurrences and only the distinct
///   rows are sorted.
/// The sums then run over the occurrences in batch order, the threads splitting the distinct rows
/// into ranges, so every row's floats are added in the same order as the sorted path adds them:
/// the results are bit-identical to it, whatever the thread count.
#pragma once

#include <cstddef>

#include "embcache/space.hpp"
#include "embcache/sparse_ops.hpp"

namespace embcache::detail {

/// aggregate_gradients in the host space. Returns false (and does nothing) when the batch has
/// more occurrences than a 32-bit index can number or a negative row index; the caller then takes
/// the sorted path.
bool aggregate_gradients_host(const host_space& space, const slot_batch& batch, bool mean,
                              const float* d_out, std::size_t dim,
                              sparse_gradients<host_space>& grads);

/// Whether the dense grouping is used for a batch of `n` occurrences whose largest row index is
/// `max_row`: its table (4 bytes per row up to max_row) stays within a fixed multiple of the
/// batch's own index array.
constexpr bool use_dense_grouping(std::size_t n, std::size_t max_row) noexcept {
  return max_row < 16 * n + (std::size_t{1} << 16);
}

}  // namespace embcache::detail
