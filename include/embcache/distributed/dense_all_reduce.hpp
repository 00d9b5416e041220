/// @file distributed/dense_all_reduce.hpp
/// @brief Data-parallel dense training: the sum over the global batch of a dense gradient, in an
/// order that does not depend on the number of ranks.
///
/// Each rank computes one partial gradient per block it trains on (distributed/ownership.hpp),
/// not one per rank. Element e of the result is
/// `((0 + p_0[e]) + p_1[e]) + ... + p_{G-1}[e]` over the G blocks in global block order, whatever
/// the number of ranks: the same bits on 1, 2, 4, ... ranks (any world size dividing G).
///
/// How: a reduce-scatter in block order, then an all-gather. Element range s (one of `size()`
/// nearly equal ranges) is summed by rank s, which receives every block's partial of that range
/// (all_to_all_v) and adds them in block order; the summed ranges are then gathered by every
/// rank. Each rank sends (G / world) * n floats and receives G * n / world, then n floats of
/// results move once more: for G = world this is the volume of a ring all-reduce, and it grows
/// with G / world. communicator::all_reduce_sum is cheaper for large G but its order is MPI's,
/// which may change with the world size: its bits are then not pinned.
#pragma once

#include <cstddef>

#include "embcache/distributed/communicator.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// Sums per-block dense gradients over the ranks in global block order.
///
/// @param comm        the ranks (collective)
/// @param partials    this rank's blocks' partial gradients, `blocks_per_rank * n` floats, block
///                    j of the rank (global block `rank * blocks_per_rank + j`) at `j * n`
/// @param blocks_per_rank  blocks each rank trains on (the same on every rank, >= 1)
/// @param n           floats per gradient (the same on every rank)
/// @param out         n floats: the sum over every block of every rank, on every rank (may not
///                    overlap `partials`)
/// Fails with invalid_argument on a zero blocks_per_rank, or with the communicator's error.
[[nodiscard]] status all_reduce_blocks(communicator& comm, const float* partials,
                                       std::size_t blocks_per_rank, std::size_t n, float* out);

}  // namespace embcache
