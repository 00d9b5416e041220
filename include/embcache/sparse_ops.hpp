/// @file sparse_ops.hpp
/// @brief Slot lookup with sum/mean combiners and its backward (gradient aggregation per row).
///
/// Rows live in a row pool: `float* rows`, row r at `rows + r * row_width`; the first `dim`
/// floats are the embedding, the rest the optimizer state (see optimizers.hpp). The device cache
/// maps keys to row indices, so these ops take row indices, never keys.
///
/// Every pointer passed to an op lives in the memory of the op's space. Ops in the host space
/// return when done; ops in the cuda space are ordered on the space's stream (aggregate_gradients
/// synchronizes twice: to learn the largest row index, which picks 32- or 64-bit sort keys, and
/// how many unique rows there are).
///
/// Determinism: the forward sums the occurrences of a bag in their order in the batch; the
/// backward sums the occurrences of a row in their order in the batch. Neither depends on the
/// thread count, so results are bit-identical for any `host_space::max_threads`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "embcache/buffer.hpp"
#include "embcache/space.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// How the rows of one (sample, slot) bag are pooled into one embedding.
enum class combiner : std::uint8_t {
  sum,   ///< sum of the rows
  mean,  ///< sum of the rows divided by their count
};

/// A batch of `batch_size` samples with `num_slots` slots each, in CSR form, sample-major.
///
/// Bag `b * num_slots + s` (slot s of sample b) holds the row indices
/// `row_indices[offsets[b*S + s] .. offsets[b*S + s + 1])`. One-hot slots have exactly one
/// occurrence per bag; an empty bag pools to zeros. Row index -1 stands for a key without a row (a
/// key that feature admission refused, admission.hpp, or an on-demand lookup's slot -1): it reads
/// a zero row, or its slot's default row when lookup_combine is given them (with combiner::mean
/// it still counts in the bag's size), and gets no gradient. Offsets
/// are int64: the same type as the row indices, so a batch can be sliced out of a larger index
/// array without conversion.
struct slot_batch {
  std::size_t batch_size = 0;                 ///< samples B (default 0)
  std::size_t num_slots = 0;                  ///< slots per sample S (default 0)
  const std::int64_t* offsets = nullptr;      ///< B*S+1 non-decreasing entries, offsets[0] == 0
  const std::int64_t* row_indices = nullptr;  ///< offsets[B*S] row indices (default nullptr)
  std::size_t num_indices = 0;                ///< offsets[B*S], the number of occurrences

  /// Number of bags, B*S.
  std::size_t num_bags() const noexcept { return batch_size * num_slots; }
};

/// Checks a host-memory batch: offsets start at 0, never decrease, end at num_indices, and every
/// row index is -1 or in [0, num_rows). The ops themselves trust their input (they run on the
/// device).
[[nodiscard]] status check_batch(const slot_batch& batch, std::size_t num_rows);

/// Forward: `out[(b*S + s)*dim + d]` = combiner over the bag's rows of `row[d]`.
///
/// @param rows      row pool; row r starts at `rows + r * row_width`
/// @param row_width floats per row (>= dim)
/// @param dim       embedding floats at the start of each row
/// @param out       B*S*dim floats
/// @param default_rows what row index -1 reads: nullptr (the default) a zero row; else S*dim
///                  floats in the space's memory, and a -1 in a bag of slot s reads the row at
///                  `default_rows + s * dim` (admission.hpp, refused_row::slot)
/// @throws embcache::error (invalid_argument) when dim is 0 or greater than row_width.
template <class Space>
void lookup_combine(const Space& space, const float* rows, std::size_t row_width, std::size_t dim,
                    const slot_batch& batch, combiner comb, float* out,
                    const float* default_rows = nullptr);

/// Scratch arrays of aggregate_gradients, kept between calls so that steady-state batches
/// allocate nothing.
template <class Space>
struct gradient_scratch {
  buffer<std::int64_t, Space> sorted_rows;  ///< row index of each occurrence, sorted
  buffer<std::int64_t, Space> order;        ///< occurrence position of each sorted entry
  buffer<std::int64_t, Space> bag_of;       ///< bag of each occurrence
  buffer<std::int64_t, Space> heads;        ///< 1 where a run of equal rows starts
  buffer<std::int64_t, Space> run_id;       ///< exclusive prefix sum of heads
  buffer<std::int64_t, Space> run_start;    ///< first sorted position of each run
  buffer<std::int32_t, Space> narrow_rows;  ///< row indices narrowed to 32 bits (cuda) for the sort
  buffer<std::uint64_t, Space> present;     ///< host: one bit per row index up to the largest
  buffer<std::int32_t, Space> rank_of;  ///< host: rank among the distinct rows, by row or first use
  buffer<std::int32_t, Space> occurrence_rank;  ///< host: rank of each occurrence's row
  buffer<std::int64_t, Space> table_rows;   ///< host, far-apart rows: open-addressing table's rows
  buffer<std::int32_t, Space> table_ids;    ///< host, far-apart rows: first-use index of each
  buffer<std::uint64_t, Space> part_items;  ///< host: (bag, rank) of each occurrence, by thread
};

/// Result of aggregate_gradients: one summed gradient per unique row of the batch.
template <class Space>
struct sparse_gradients {
  buffer<std::int64_t, Space> rows;  ///< unique row indices, ascending; the first `size` are valid
  buffer<float, Space> values;       ///< `size * dim` floats, row i's gradient at `i * dim`
  std::size_t size = 0;              ///< number of unique rows (default 0)
  std::size_t dim = 0;               ///< floats per gradient (default 0)
  gradient_scratch<Space> scratch;   ///< reused between calls
};

/// Backward of lookup_combine: from `d_out` (B*S*dim floats, the gradient of the loss with
/// respect to `out`) computes the unique row indices of the batch (ascending, -1 left out) and, per
/// unique row, the sum over its occurrences of the bag's gradient (divided by the bag's size for
/// `combiner::mean`). The sum runs over occurrences in batch order: deterministic.
///
/// Buffers of `grads` grow when too small and are reused otherwise.
template <class Space>
void aggregate_gradients(const Space& space, const slot_batch& batch, combiner comb,
                         const float* d_out, std::size_t dim, sparse_gradients<Space>& grads);

namespace detail {

/// Sorts `values` (n) with their positions, stably, and finds the runs of equal values.
/// Writes the sorted values and positions into `sorted`/`order` (n each), run heads (1 where a
/// run starts) into `heads` (n+1), their exclusive prefix sum into `run_id` (n+1; at a head, the
/// run's index; run_id[n] = number of runs), run starts into `run_start` (runs+1),
/// one value per run into `unique_out` (runs) and, when `inverse_out` is not null, the run of
/// each input position into `inverse_out` (n). Returns the number of
/// runs. Used by the backward and by the host-hybrid path.
template <class Space, class K>
std::size_t sort_and_group(const Space& space, const K* values, std::size_t n, K* sorted,
                           std::int64_t* order, std::int64_t* heads, std::int64_t* run_id,
                           std::int64_t* run_start, K* unique_out, std::int64_t* inverse_out);

/// sort_and_group over host vectors that are kept from batch to batch: group() sizes the scratch,
/// writes the distinct keys (ascending) into `unique` and, when `inverse` is not null, the index
/// in `unique` of every input key into `inverse` (n); returns the number of distinct keys.
template <class K>
struct host_key_grouping {
  std::vector<K> sorted;
  std::vector<std::int64_t> order, heads, run_id, run_start;

  template <class Space>
  std::size_t group(const Space& space, const K* keys, std::size_t n, std::vector<K>& unique,
                    std::int64_t* inverse) {
    sorted.resize(n);
    order.resize(n);
    heads.resize(n + 1);
    run_id.resize(n + 1);
    run_start.resize(n + 1);
    unique.resize(n);
    const std::size_t m = sort_and_group(space, keys, n, sorted.data(), order.data(), heads.data(),
                                         run_id.data(), run_start.data(), unique.data(), inverse);
    unique.resize(m);
    return m;
  }
};

}  // namespace detail
}  // namespace embcache
