/// @file detail/sparse_ops.inl
/// @brief Portable definitions of the sparse ops; they bring the primitives of the space they are
/// compiled for (detail/space_algorithms.hpp), so nothing has to come before them.
#pragma once

// First: the qualified calls below bind to the overloads declared before them.
#include "embcache/detail/space_algorithms.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "embcache/buffer.hpp"
#include "embcache/detail/config.hpp"
#include "embcache/detail/host_gradient_aggregation.hpp"
#include "embcache/sparse_ops.hpp"
#include "embcache/status.hpp"

namespace embcache {
namespace detail {

// The host loop runs one bag per call so that the inner loop over dim vectorizes; the cuda loop
// runs one element per thread so that neighbouring threads read neighbouring floats. Both sum
// the occurrences in the same order, so they produce the same floats.
struct combine_bag_fn {
  const float* rows;
  std::size_t row_width;
  std::size_t dim;
  const std::int64_t* offsets;
  const std::int64_t* row_indices;
  float* out;
  bool mean;
  const float* default_rows;  // slot s's row at s * dim; nullptr: zeros
  std::size_t num_slots;

  void prefetch(std::size_t bag) const {
    for (std::int64_t k = offsets[bag]; k < offsets[bag + 1]; ++k)
      if (row_indices[k] >= 0)
        __builtin_prefetch(rows + static_cast<std::size_t>(row_indices[k]) * row_width);
  }
  EMBCACHE_HD void operator()(std::size_t bag) const {
    float* o = out + bag * dim;
    for (std::size_t d = 0; d < dim; ++d) o[d] = 0.0f;
    const std::int64_t begin = offsets[bag], end = offsets[bag + 1];
    for (std::int64_t k = begin; k < end; ++k) {
      const float* r;
      if (row_indices[k] >= 0) {
        r = rows + static_cast<std::size_t>(row_indices[k]) * row_width;
      } else if (default_rows) {
        r = default_rows + (bag % num_slots) * dim;  // no row: its slot's default row
      } else {
        continue;  // no row: reads zeros
      }
      for (std::size_t d = 0; d < dim; ++d) o[d] += r[d];
    }
    if (mean && end > begin) {
      const float count = static_cast<float>(end - begin);
      for (std::size_t d = 0; d < dim; ++d) o[d] = o[d] / count;
    }
  }
};

struct combine_element_fn {
  const float* rows;
  std::size_t row_width;
  std::size_t dim;
  const std::int64_t* offsets;
  const std::int64_t* row_indices;
  float* out;
  bool mean;
  const float* default_rows;  // slot s's row at s * dim; nullptr: zeros
  std::size_t num_slots;

  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::size_t bag = i / dim, d = i % dim;
    const std::int64_t begin = offsets[bag], end = offsets[bag + 1];
    float acc = 0.0f;
    for (std::int64_t k = begin; k < end; ++k) {
      if (row_indices[k] >= 0)
        acc += rows[static_cast<std::size_t>(row_indices[k]) * row_width + d];
      else if (default_rows)
        acc += default_rows[(bag % num_slots) * dim + d];
    }
    if (mean && end > begin) acc = acc / static_cast<float>(end - begin);
    out[i] = acc;
  }
};

struct iota_fn {
  std::int64_t* out;
  EMBCACHE_HD void operator()(std::size_t i) const { out[i] = static_cast<std::int64_t>(i); }
};

template <class K>
struct copy_fn {
  const K* in;
  K* out;
  EMBCACHE_HD void operator()(std::size_t i) const { out[i] = in[i]; }
};

// heads[i] = 1 where a run of equal sorted values starts; heads[n] = 0 so that the exclusive
// scan's last entry is the number of runs.
template <class K>
struct run_heads_fn {
  const K* sorted;
  std::size_t n;
  std::int64_t* heads;
  EMBCACHE_HD void operator()(std::size_t i) const {
    heads[i] = (i < n && (i == 0 || sorted[i] != sorted[i - 1])) ? 1 : 0;
  }
};

template <class K>
struct run_starts_fn {
  const K* sorted;
  const std::int64_t* heads;
  const std::int64_t* run_id;
  std::size_t n;
  std::int64_t* run_start;
  K* unique_out;
  EMBCACHE_HD void operator()(std::size_t i) const {
    if (i == n) {
      run_start[run_id[n]] = static_cast<std::int64_t>(n);
    } else if (heads[i]) {
      run_start[run_id[i]] = static_cast<std::int64_t>(i);
      unique_out[run_id[i]] = sorted[i];
    }
  }
};

// run_id is an exclusive scan of heads: inside a run, the run's index is run_id + heads - 1.
struct inverse_fn {
  const std::int64_t* order;
  const std::int64_t* heads;
  const std::int64_t* run_id;
  std::int64_t* inverse;
  EMBCACHE_HD void operator()(std::size_t i) const { inverse[order[i]] = run_id[i] + heads[i] - 1; }
};

struct narrow_fn {
  const std::int64_t* in;
  std::int32_t* out;
  EMBCACHE_HD void operator()(std::size_t i) const { out[i] = static_cast<std::int32_t>(in[i]); }
};

struct widen_fn {
  const std::int32_t* in;
  std::int64_t* out;
  EMBCACHE_HD void operator()(std::size_t i) const { out[i] = in[i]; }
};

struct bag_of_fn {
  const std::int64_t* offsets;
  std::int64_t* bag_of;
  EMBCACHE_HD void operator()(std::size_t bag) const {
    for (std::int64_t k = offsets[bag]; k < offsets[bag + 1]; ++k)
      bag_of[k] = static_cast<std::int64_t>(bag);
  }
};

// Sums the gradients of one run of equal rows, occurrence by occurrence in batch order (the
// stable sort keeps that order inside a run).
struct reduce_run_fn {
  const std::int64_t* run_start;
  const std::int64_t* order;
  const std::int64_t* bag_of;
  const std::int64_t* offsets;
  const float* d_out;
  std::size_t dim;
  float* values;
  bool mean;

  EMBCACHE_HD void operator()(std::size_t run) const {
    float* g = values + run * dim;
    for (std::size_t d = 0; d < dim; ++d) g[d] = 0.0f;
    for (std::int64_t p = run_start[run]; p < run_start[run + 1]; ++p) {
      const std::int64_t bag = bag_of[order[p]];
      const float* src = d_out + static_cast<std::size_t>(bag) * dim;
      if (mean) {
        const float count = static_cast<float>(offsets[bag + 1] - offsets[bag]);
        for (std::size_t d = 0; d < dim; ++d) g[d] += src[d] / count;
      } else {
        for (std::size_t d = 0; d < dim; ++d) g[d] += src[d];
      }
    }
  }
};

struct reduce_element_fn {
  const std::int64_t* run_start;
  const std::int64_t* order;
  const std::int64_t* bag_of;
  const std::int64_t* offsets;
  const float* d_out;
  std::size_t dim;
  float* values;
  bool mean;

  EMBCACHE_HD void operator()(std::size_t i) const {
    const std::size_t run = i / dim, d = i % dim;
    float acc = 0.0f;
    for (std::int64_t p = run_start[run]; p < run_start[run + 1]; ++p) {
      const std::int64_t bag = bag_of[order[p]];
      const float x = d_out[static_cast<std::size_t>(bag) * dim + d];
      if (mean) {
        acc += x / static_cast<float>(offsets[bag + 1] - offsets[bag]);
      } else {
        acc += x;
      }
    }
    values[i] = acc;
  }
};

template <class T, class Space>
void ensure_size(buffer<T, Space>& b, std::size_t n, const Space& space) {
  if (b.size() < n) b = buffer<T, Space>(n, space);
}

template <class T, class Space>
T read_value(const Space& space, const T* p) {
  T v{};
  copy(space, &v, p, sizeof(T));
  return v;
}

inline void check_dims(const char* op, std::size_t row_width, std::size_t dim) {
  if (dim == 0 || dim > row_width)
    throw error(status_code::invalid_argument, std::string(op) + ": dim " + std::to_string(dim) +
                                                   " must be in [1, row_width] with row_width " +
                                                   std::to_string(row_width));
}

template <class Space, class K>
std::size_t sort_and_group(const Space& space, const K* values, std::size_t n, K* sorted,
                           std::int64_t* order, std::int64_t* heads, std::int64_t* run_id,
                           std::int64_t* run_start, K* unique_out, std::int64_t* inverse_out) {
  if (n == 0) return 0;
  for_each_index(space, n, copy_fn<K>{values, sorted});
  for_each_index(space, n, iota_fn{order});
  // Stable: equal values keep their batch order, which fixes the summation order downstream.
  stable_sort_by_key(space, sorted, order, n);
  for_each_index(space, n + 1, run_heads_fn<K>{sorted, n, heads});
  exclusive_scan(space, heads, run_id, n + 1);
  for_each_index(space, n + 1, run_starts_fn<K>{sorted, heads, run_id, n, run_start, unique_out});
  if (inverse_out) for_each_index(space, n, inverse_fn{order, heads, run_id, inverse_out});
  return static_cast<std::size_t>(read_value(space, run_id + n));
}

}  // namespace detail

template <class Space>
void lookup_combine(const Space& space, const float* rows, std::size_t row_width, std::size_t dim,
                    const slot_batch& batch, combiner comb, float* out,
                    const float* default_rows) {
  detail::check_dims("lookup_combine", row_width, dim);
  const std::size_t bags = batch.num_bags();
  const bool mean = comb == combiner::mean;
  if constexpr (is_host_space_v<Space>) {
    detail::for_each_index(space, bags,
                           detail::combine_bag_fn{rows, row_width, dim, batch.offsets,
                                                  batch.row_indices, out, mean, default_rows,
                                                  batch.num_slots});
  } else {
    detail::for_each_index(space, bags * dim,
                           detail::combine_element_fn{rows, row_width, dim, batch.offsets,
                                                      batch.row_indices, out, mean, default_rows,
                                                      batch.num_slots});
  }
}

template <class Space>
void aggregate_gradients(const Space& space, const slot_batch& batch, combiner comb,
                         const float* d_out, std::size_t dim, sparse_gradients<Space>& grads) {
  if (dim == 0) throw error(status_code::invalid_argument, "aggregate_gradients: dim is 0");
  grads.dim = dim;
  grads.size = 0;
  const std::size_t n = batch.num_indices;
  if (n == 0) return;
  const bool mean = comb == combiner::mean;
  if constexpr (is_host_space_v<Space>) {
    if (detail::aggregate_gradients_host(space, batch, mean, d_out, dim, grads)) return;
  }
  auto& s = grads.scratch;
  detail::ensure_size(s.order, n, space);
  detail::ensure_size(s.bag_of, n, space);
  detail::ensure_size(s.heads, n + 1, space);
  detail::ensure_size(s.run_id, n + 1, space);
  detail::ensure_size(s.run_start, n + 1, space);
  detail::ensure_size(grads.rows, n, space);

  detail::for_each_index(space, batch.num_bags(),
                         detail::bag_of_fn{batch.offsets, s.bag_of.data()});
  std::size_t m = 0, skip = 0;
  // Row indices that fit in 32 bits are sorted as such: half the bytes to move, half the radix
  // passes. The order (stable, by row) and so the sums are the same as with the 64-bit keys.
  if (detail::max_value(space, batch.row_indices, n) <= std::numeric_limits<std::int32_t>::max()) {
    detail::ensure_size(s.narrow_rows, 3 * n, space);
    std::int32_t* narrow = s.narrow_rows.data();
    detail::for_each_index(space, n, detail::narrow_fn{batch.row_indices, narrow});
    m = detail::sort_and_group(space, static_cast<const std::int32_t*>(narrow), n, narrow + n,
                               s.order.data(), s.heads.data(), s.run_id.data(), s.run_start.data(),
                               narrow + 2 * n, static_cast<std::int64_t*>(nullptr));
    // Row -1 (no row, sparse_ops.hpp) sorts first: its run gets no gradient.
    skip = m > 0 && detail::read_value(space, narrow + 2 * n) < 0 ? 1 : 0;
    detail::for_each_index(space, m - skip,
                           detail::widen_fn{narrow + 2 * n + skip, grads.rows.data()});
  } else {
    detail::ensure_size(s.sorted_rows, n, space);
    m = detail::sort_and_group(space, batch.row_indices, n, s.sorted_rows.data(), s.order.data(),
                               s.heads.data(), s.run_id.data(), s.run_start.data(),
                               grads.rows.data(), static_cast<std::int64_t*>(nullptr));
    skip = m > 0 && detail::read_value(space, grads.rows.data()) < 0 ? 1 : 0;
    if (skip) {  // shifted through the scratch: the loop's reads and writes must not overlap
      detail::for_each_index(space, m - 1,
                             detail::copy_fn<std::int64_t>{grads.rows.data() + 1, s.heads.data()});
      detail::for_each_index(space, m - 1,
                             detail::copy_fn<std::int64_t>{s.heads.data(), grads.rows.data()});
    }
  }
  m -= skip;
  detail::ensure_size(grads.values, m * dim, space);
  grads.size = m;

  if constexpr (is_host_space_v<Space>) {
    detail::for_each_index(
        space, m,
        detail::reduce_run_fn{s.run_start.data() + skip, s.order.data(), s.bag_of.data(),
                              batch.offsets, d_out, dim, grads.values.data(), mean});
  } else {
    detail::for_each_index(
        space, m * dim,
        detail::reduce_element_fn{s.run_start.data() + skip, s.order.data(), s.bag_of.data(),
                                  batch.offsets, d_out, dim, grads.values.data(), mean});
  }
}

}  // namespace embcache
