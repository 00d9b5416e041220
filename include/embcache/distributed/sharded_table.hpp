/// @file distributed/sharded_table.hpp
/// @brief One embedding table sharded row-wise over the ranks of a communicator: each rank
/// stores and updates the rows of the keys it owns (distributed/ownership.hpp), and looks up the
/// rows of its own samples wherever they live.
///
/// A step is forward() then backward(), called by every rank (both are collective):
///   - forward: the rank deduplicates its batch's keys, sends each unique key to its owner
///     (all_to_all_v), the owners look the keys up in their rows (owner_rows: by default a
///     host_hybrid_table on their parameter store; missing keys are initialized exactly as on
///     one rank: the initial row is a function of the seed and the key only), send the embeddings back (all_to_all_v), and
///     the rank pools them per bag with the table's combiner.
///   - backward: per block of the batch, the rank sums the gradient of each key over the
///     block's occurrences (in batch order) and sends one partial per (block, key) to the key's
///     owner. The owner adds a key's partials in global block order, starting from 0, applies
///     the sparse optimizer to the row and pushes it to its store.
///
/// Determinism: the rows, optimizer states and step counters the ranks' stores hold after any
/// sequence of steps are the same bits for every world size that divides num_blocks, given the
/// same global batches cut into the same blocks (tests/distributed pins 1, 2 and 4 ranks). Rows
/// are a function of (key, initializer, every partial of every step in block order), and each
/// partial is a sum over one block that does not depend on which rank computed it. The
/// exception: the per-row versions a store stamps on each push count that rank's pushes, so they
/// differ with the world size (they order exports within one rank's store only).
///
/// With num_blocks = 1 on one rank the step is the host-hybrid step of host_hybrid_table on the
/// same batch (same bits: tests pin it); with more blocks a key's gradient is a sum of block
/// partials, which rounds differently from one flat sum, by design.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "embcache/distributed/communicator.hpp"
#include "embcache/distributed/ownership.hpp"
#include "embcache/distributed/sharded_save.hpp"
#include "embcache/host_hybrid.hpp"
#include "embcache/param_store.hpp"
#include "embcache/sparse_ops.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// Options of a sharded_table.
struct sharded_table_options {
  /// The table as host_hybrid_table trains it: dim, combiner, sparse optimizer, initializer seed
  /// and scale, threads (default: host_hybrid_options{}).
  host_hybrid_options table{};
  /// Blocks G the global batch of a step is cut into; every rank trains on G / world of them, so
  /// the world size must divide it. Fixed for a run: a resumed run must keep it for its bits to
  /// match (default 8).
  std::size_t num_blocks = 8;
};

/// Where an owner keeps the rows of the keys it owns, as a sharded_table reaches them. The
/// default is host_hybrid_table on the rank's store (rows pulled and pushed every step); a
/// trainer in keyset mode passes its training cache's rows instead (rows resident for a pass).
/// Both must give the same bits: the same initial row per key, the same optimizer step.
template <class Key>
class owner_rows {
 public:
  virtual ~owner_rows() = default;
  /// The embeddings (dim floats each) of `n` distinct keys in ascending order into `out`
  /// (n * dim floats); the rows stay reachable for the next update(). Missing rows are
  /// initialized, or refused when this owner cannot create them (e.g. outside its keyset).
  [[nodiscard]] virtual status lookup(const Key* keys, std::size_t n, float* out) = 0;
  /// Applies the sparse optimizer, as optimizer step `step` (from 1), to the rows of the last
  /// lookup(), with one summed gradient (dim floats) per key in the same order.
  [[nodiscard]] virtual status update(const float* grads, std::uint64_t step) = 0;
  /// The current whole rows (row width floats) of `n` keys into `rows`, creating none;
  /// found[i] false for a key that has no row (its row is left as it is).
  [[nodiscard]] virtual status read(const Key* keys, std::size_t n, float* rows, bool* found) = 0;
};

/// What one rank moved in its last step (forward + backward), counted at the rank.
struct exchange_stats {
  std::size_t unique_keys = 0;       ///< unique keys of the rank's batch (default 0)
  std::size_t remote_keys = 0;       ///< of those, keys another rank owns (default 0)
  std::size_t owned_keys = 0;        ///< unique keys this rank served as owner (default 0)
  std::size_t gradient_records = 0;  ///< (block, key) partials the rank sent (default 0)
  std::uint64_t bytes_sent = 0;      ///< bytes sent to other ranks (default 0)
  std::uint64_t bytes_received = 0;  ///< bytes received from other ranks (default 0)
  /// unique_keys * dim * sizeof(float): the embeddings the rank's batch reads, the least any
  /// design moves per rank in one direction (default 0).
  std::uint64_t min_bytes = 0;
};

/// One embedding table whose rows are spread over the ranks of `comm` by owner. Not
/// thread-safe; the rank's store must not be written by anyone else during a step.
template <class Key>
class sharded_table {
 public:
  /// @param comm    the ranks; every rank makes its sharded_table with equal options
  /// @param shard   this rank's parameter store (host_store, rocksdb_store; a path per rank),
  ///                rows of `dim + state_width(optimizer, dim)` floats or wider
  /// @param init    initializer of missing keys as in host_hybrid_table (must be the same on
  ///                every rank); empty = default_embedding_value
  /// @throws embcache::error (invalid_argument) when num_blocks is not a positive multiple of
  ///         comm.size(), or as host_hybrid_table's constructor does.
  sharded_table(communicator& comm, param_store<Key>& shard, const sharded_table_options& options,
                embedding_initializer<Key> init = {});
  /// The same with the owner's rows in `rows` instead of a host_hybrid_table on `shard` (which
  /// still receives saves and loads: whoever holds rows elsewhere writes them back to it first).
  sharded_table(communicator& comm, param_store<Key>& shard, const sharded_table_options& options,
                std::unique_ptr<owner_rows<Key>> rows);

  /// Looks up and pools this rank's batch: its blocks of the global batch, in block order. With
  /// `global_batch` 0 the blocks are of equal size, `batch.batch_size / blocks().count` samples
  /// each (the count must divide batch_size); otherwise the global batch has `global_batch`
  /// samples cut as block_samples() says (ownership.hpp), and batch_size must be the samples of
  /// this rank's blocks. Writes B*S*dim floats into `out`. Collective: every rank calls it, and
  /// every rank gets an error when any rank's batch or store fails (its own message, or one that
  /// names the failing rank).
  [[nodiscard]] status forward(const key_batch<Key>& batch, float* out,
                               std::size_t global_batch = 0);

  /// Applies `d_out` (B*S*dim floats, the gradient with respect to the last forward()'s `out`):
  /// owners update their rows with the optimizer and push them to their stores; the step counter
  /// advances on every rank. Collective; fails on every rank when one fails.
  /// @throws embcache::error (invalid_argument) when no forward() precedes it.
  [[nodiscard]] status backward(const float* d_out);

  /// Reads whole rows (`shard().row_width()` floats each) of `n` keys wherever they live,
  /// without creating or changing any: found[i] is false, and row i zeros, for a key no rank's
  /// store holds. Collective (every rank calls it, with keys of its own; n may be 0); fails on
  /// every rank when one fails.
  [[nodiscard]] status read(const Key* keys, std::size_t n, float* rows, bool* found);

  /// Writes this table's save into `dir` (distributed/sharded_save.hpp): every rank its shard,
  /// rank 0 the manifest that publishes it, with `run_id` (rank 0's; default "": none recorded)
  /// and `applied_delta` (the last incremental export before the save; default 0: none); when
  /// `lifetime` is not null, the table's admission counts and this rank's expiry clock
  /// (save_sharded()). Collective.
  [[nodiscard]] status save(const std::string& dir, const std::string& run_id = {},
                            std::uint64_t applied_delta = 0,
                            const sharded_lifetime* lifetime = nullptr);

  /// Loads the save in `dir`, written by any number of ranks, into this rank's store (which must
  /// be empty): the rank keeps the rows it owns now, and the step counter is the save's. A save
  /// of another dim or optimizer is refused (invalid_argument). Collective.
  /// @param open  opens a part (empty: host_store_part_opener())
  /// @param run_id_out  when not null, gets the save's run identity ("" when it records none)
  /// @param manifest_out  when not null, gets the save's manifest (its lifetime state included)
  [[nodiscard]] status load(const std::string& dir, const part_opener<Key>& open = {},
                            std::string* run_id_out = nullptr,
                            sharded_manifest* manifest_out = nullptr);

  /// Steps applied so far (the same on every rank).
  std::uint64_t step() const noexcept { return step_; }
  /// Sets the step counter (resuming).
  void set_step(std::uint64_t step) noexcept { step_ = step; }
  /// What this rank moved in its last step.
  const exchange_stats& last_stats() const noexcept { return stats_; }
  /// The blocks of the global batch this rank trains on.
  block_range blocks() const noexcept { return blocks_; }
  /// The ranks.
  communicator& comm() const noexcept { return comm_; }
  /// This rank's store.
  param_store<Key>& shard() const noexcept { return shard_; }
  /// The options this table was built with.
  const sharded_table_options& options() const noexcept { return options_; }

 private:
  status forward_impl(const key_batch<Key>& batch, float* out);
  status read_impl(const Key* keys, std::size_t n, float* rows, bool* found);
  // Groups the unique keys of `keys[0..n)` by owner into sent_keys_ / owner_start_, the row of
  // every occurrence into occurrence_rows_, and sends them to their owners (received into
  // `recv_keys`, `recv_counts` per rank). Returns the number of unique keys.
  result<std::size_t> send_to_owners(const Key* keys, std::size_t n, std::vector<Key>& recv_keys,
                                     std::vector<std::size_t>& counts,
                                     std::vector<std::size_t>& recv_counts);
  status backward_impl(const float* d_out);

  communicator& comm_;
  param_store<Key>& shard_;
  sharded_table_options options_;
  std::unique_ptr<owner_rows<Key>> rows_;  // the owner's rows
  std::uint64_t step_ = 0;
  block_range blocks_;
  exchange_stats stats_;
  bool pending_ = false;

  // The requester's side of the last forward().
  std::size_t batch_size_ = 0, num_slots_ = 0;
  std::vector<std::size_t> block_start_;       // first sample of each of the rank's blocks (+1)
  std::vector<std::int64_t> offsets_;
  std::vector<std::int64_t> occurrence_rows_;  // occurrence -> row of recv_rows_
  std::vector<Key> sent_keys_;                 // unique keys grouped by owner, ascending in each
  std::vector<std::size_t> owner_start_;       // first index of each owner's group (world + 1)
  std::vector<float> recv_rows_;               // their embeddings, in sent_keys_ order
  // The owner's side: the keys it serves (ascending) and their summed gradients.
  std::vector<Key> own_keys_;
  std::vector<float> own_grads_;
  // Scratch.
  detail::host_key_grouping<Key> grouping_;
  std::vector<std::int64_t> inverse_;
  sparse_gradients<host_space> grads_;
};

extern template class sharded_table<std::int64_t>;
extern template class sharded_table<std::uint32_t>;

}  // namespace embcache
