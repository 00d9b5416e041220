// The host space's gradient aggregation: rank every occurrence's row among the batch's distinct
// rows (a bitmap and a table by row, or a hash table when the rows are far apart), then sum in
// batch order with each thread owning a range of ranks.
//
// The ranking runs on the calling thread: it is a few passes over 4-byte words, cheaper than
// waking workers for each of them on a busy machine. Only the sums, which touch the gradients,
// are split between threads, in one fork-join.
#include "embcache/detail/host_gradient_aggregation.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_sort.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>

#include "embcache/detail/hash.hpp"
#include "embcache/detail/host_algorithms.hpp"

namespace embcache::detail {
namespace {

// Below this many occurrences the sums run on the calling thread: a task costs more than it saves.
constexpr std::size_t serial_below = 16384;
// How far ahead the summing loop prefetches the gradient row it will add into.
constexpr std::size_t prefetch_distance = 16;
// Most threads the sums are split between.
constexpr std::size_t max_parts = 64;

template <class T>
void ensure(buffer<T, host_space>& b, std::size_t n) {
  if (b.size() < n) b = buffer<T, host_space>(n, host_space{});
}

// The largest row index, or -1 when one is negative (outside any pool: the sorted path, which
// needs no table, takes such a batch).
std::int64_t largest_row(const std::int64_t* rows, std::size_t n) {
  std::int64_t hi = 0, lo = 0;
  for (std::size_t k = 0; k < n; ++k) {
    hi = rows[k] > hi ? rows[k] : hi;
    lo = rows[k] < lo ? rows[k] : lo;
  }
  return lo < 0 ? -1 : hi;
}

// Dense: marks the rows present in a bitmap, numbers them in ascending order by walking its set
// bits (the rows into `unique_rows`, each one's rank into a table by row), and looks every
// occurrence's rank up into `occurrence_rank`. Returns the number of distinct rows.
std::size_t rank_dense(const std::int64_t* rows, std::size_t n, std::size_t max_row,
                       gradient_scratch<host_space>& s, std::int64_t* unique_rows) {
  const std::size_t words = max_row / 64 + 1;
  ensure(s.present, words);
  ensure(s.rank_of, max_row + 1);
  std::uint64_t* present = s.present.data();
  std::int32_t* rank_of = s.rank_of.data();
  std::memset(present, 0, words * sizeof(std::uint64_t));
  for (std::size_t k = 0; k < n; ++k) {
    const auto r = static_cast<std::uint64_t>(rows[k]);
    present[r / 64] |= std::uint64_t{1} << (r % 64);
  }
  std::int32_t rank = 0;
  for (std::size_t w = 0; w < words; ++w) {
    for (std::uint64_t bits = present[w]; bits != 0; bits &= bits - 1) {
      const std::size_t r = w * 64 + static_cast<std::size_t>(__builtin_ctzll(bits));
      unique_rows[rank] = static_cast<std::int64_t>(r);
      rank_of[r] = rank++;
    }
  }
  std::int32_t* occurrence_rank = s.occurrence_rank.data();
  for (std::size_t k = 0; k < n; ++k) occurrence_rank[k] = rank_of[rows[k]];
  return static_cast<std::size_t>(rank);
}

// Far-apart rows: an open-addressing table numbers the rows by first use, the distinct rows are
// sorted, and every occurrence's first-use number is replaced by its row's rank in
// `occurrence_rank`. Returns the number of distinct rows.
std::size_t rank_sparse(const host_space& space, const std::int64_t* rows, std::size_t n,
                        gradient_scratch<host_space>& s, std::int64_t* unique_rows) {
  std::size_t capacity = 16;
  while (capacity < 2 * n) capacity *= 2;
  const std::size_t mask = capacity - 1;
  ensure(s.table_rows, capacity);
  ensure(s.table_ids, capacity);
  ensure(s.sorted_rows, n);
  ensure(s.rank_of, n);
  std::int64_t* table_rows = s.table_rows.data();
  std::int32_t* table_ids = s.table_ids.data();
  std::int64_t* first_rows = s.sorted_rows.data();
  std::int32_t* occurrence_rank = s.occurrence_rank.data();
  std::fill(table_rows, table_rows + capacity, std::int64_t{-1});  // row indices are >= 0

  std::int32_t distinct = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const std::int64_t r = rows[k];
    std::size_t h = murmur3_fmix64(static_cast<std::uint64_t>(r)) & mask;
    while (table_rows[h] != r && table_rows[h] != -1) h = (h + 1) & mask;
    if (table_rows[h] == -1) {
      table_rows[h] = r;
      table_ids[h] = distinct;
      first_rows[distinct++] = r;
    }
    occurrence_rank[k] = table_ids[h];
  }
  const auto m = static_cast<std::size_t>(distinct);
  std::copy(first_rows, first_rows + m, unique_rows);
  sort(space, unique_rows, m);
  std::int32_t* rank_of = s.rank_of.data();
  for (std::size_t i = 0; i < m; ++i)
    rank_of[i] = static_cast<std::int32_t>(
        std::lower_bound(unique_rows, unique_rows + m, first_rows[i]) - unique_rows);
  for (std::size_t k = 0; k < n; ++k) occurrence_rank[k] = rank_of[occurrence_rank[k]];
  return m;
}

// What sum_rank_range reads and writes.
struct sum_args {
  const std::int64_t* offsets;
  std::size_t bags;
  const std::int32_t* rank;  // of each occurrence
  std::size_t n;
  const float* d_out;
  std::size_t dim;
  float* values;
};

// Sums the bags' gradients into the ranks [lo, hi), occurrence by occurrence in batch order:
// each float of a row sees the same additions in the same order as in the sorted path. `Dim` is
// the row width when known at compile time (0: a.dim), so that the common widths unroll.
template <bool Mean, std::size_t Dim>
void sum_rank_range(const sum_args& a, std::size_t lo, std::size_t hi) {
  const std::size_t dim = Dim != 0 ? Dim : a.dim;
  float* const values = a.values;
  const std::int64_t* const offsets = a.offsets;
  std::fill(values + lo * dim, values + hi * dim, 0.0f);
  const auto first = static_cast<std::uint32_t>(lo);
  const auto width = static_cast<std::uint32_t>(hi - lo);
  const std::size_t prefetch_end = a.n > prefetch_distance ? a.n - prefetch_distance : 0;
  for (std::size_t bag = 0; bag < a.bags; ++bag) {
    const auto begin = static_cast<std::size_t>(offsets[bag]);
    const auto end = static_cast<std::size_t>(offsets[bag + 1]);
    const float* src = a.d_out + bag * dim;
    const float count = static_cast<float>(end - begin);
    for (std::size_t k = begin; k < end; ++k) {
      if (k < prefetch_end) {
        const auto ahead = static_cast<std::uint32_t>(a.rank[k + prefetch_distance]) - first;
        if (ahead < width) {
          const float* p = values + (std::size_t{first} + ahead) * dim;
          for (std::size_t d = 0; d < dim; d += 16) __builtin_prefetch(p + d, 1);
        }
      }
      const auto r = static_cast<std::uint32_t>(a.rank[k]) - first;
      if (r >= width) continue;
      float* g = values + (std::size_t{first} + r) * dim;
      if constexpr (Mean) {
        for (std::size_t d = 0; d < dim; ++d) g[d] += src[d] / count;
      } else {
        for (std::size_t d = 0; d < dim; ++d) g[d] += src[d];
      }
    }
  }
}

template <bool Mean>
void sum_ranks(const sum_args& a, std::size_t lo, std::size_t hi) {
  switch (a.dim) {
    case 8:
      return sum_rank_range<Mean, 8>(a, lo, hi);
    case 16:
      return sum_rank_range<Mean, 16>(a, lo, hi);
    case 32:
      return sum_rank_range<Mean, 32>(a, lo, hi);
    case 64:
      return sum_rank_range<Mean, 64>(a, lo, hi);
    case 128:
      return sum_rank_range<Mean, 128>(a, lo, hi);
    default:
      return sum_rank_range<Mean, 0>(a, lo, hi);
  }
}

// The parallel sums: the ranks are cut into `parts` ranges, one per thread. A serial pass deals
// the occurrences, in batch order, into one list per range ((bag, rank) pairs), so that each
// thread walks only its own occurrences and the order inside a row stays the batch's.
struct part_sums {
  const sum_args& a;
  std::size_t m;
  std::size_t parts;
  std::uint64_t scale;  // part of rank r: (r * scale) >> 32, non-decreasing in r and < parts

  std::size_t part_of(std::uint32_t r) const {
    return static_cast<std::size_t>((std::uint64_t{r} * scale) >> 32);
  }
  // The smallest rank of part p (m for p == parts).
  std::size_t first_rank(std::size_t p) const {
    if (p >= parts) return m;
    return static_cast<std::size_t>(((std::uint64_t{p} << 32) + scale - 1) / scale);
  }

  // Deals the occurrences into `items`, part after part; `start` gets each part's first item.
  void deal(std::uint64_t* items, std::size_t* start) const {
    std::array<std::size_t, max_parts + 1> count{};
    for (std::size_t k = 0; k < a.n; ++k) ++count[part_of(static_cast<std::uint32_t>(a.rank[k]))];
    start[0] = 0;
    for (std::size_t p = 0; p < parts; ++p) start[p + 1] = start[p] + count[p];
    std::array<std::size_t, max_parts> next{};
    std::copy(start, start + parts, next.begin());
    for (std::size_t bag = 0; bag < a.bags; ++bag) {
      for (auto k = static_cast<std::size_t>(a.offsets[bag]);
           k < static_cast<std::size_t>(a.offsets[bag + 1]); ++k) {
        const auto r = static_cast<std::uint32_t>(a.rank[k]);
        items[next[part_of(r)]++] = (std::uint64_t{bag} << 32) | r;
      }
    }
  }

  template <bool Mean, std::size_t Dim>
  void sum_part(const std::uint64_t* items, std::size_t begin, std::size_t end,
                std::size_t p) const {
    const std::size_t dim = Dim != 0 ? Dim : a.dim;
    std::fill(a.values + first_rank(p) * dim, a.values + first_rank(p + 1) * dim, 0.0f);
    for (std::size_t i = begin; i < end; ++i) {
      if (i + prefetch_distance < end) {
        const float* q = a.values + (items[i + prefetch_distance] & 0xffffffffu) * dim;
        for (std::size_t d = 0; d < dim; d += 16) __builtin_prefetch(q + d, 1);
      }
      const std::size_t bag = items[i] >> 32, r = items[i] & 0xffffffffu;
      const float* src = a.d_out + bag * dim;
      float* g = a.values + r * dim;
      if constexpr (Mean) {
        const float count = static_cast<float>(a.offsets[bag + 1] - a.offsets[bag]);
        for (std::size_t d = 0; d < dim; ++d) g[d] += src[d] / count;
      } else {
        for (std::size_t d = 0; d < dim; ++d) g[d] += src[d];
      }
    }
  }

  template <bool Mean>
  void run(const std::uint64_t* items, std::size_t begin, std::size_t end, std::size_t p) const {
    switch (a.dim) {
      case 16:
        return sum_part<Mean, 16>(items, begin, end, p);
      case 32:
        return sum_part<Mean, 32>(items, begin, end, p);
      case 64:
        return sum_part<Mean, 64>(items, begin, end, p);
      case 128:
        return sum_part<Mean, 128>(items, begin, end, p);
      default:
        return sum_part<Mean, 0>(items, begin, end, p);
    }
  }
};

// Sums the m ranks' gradients: on the calling thread for small batches or one thread, else one
// range of ranks per thread.
void sum_all(const host_space& space, const sum_args& a, std::size_t m, bool mean,
             gradient_scratch<host_space>& s) {
  const bool fits = a.bags <= std::numeric_limits<std::uint32_t>::max();
  std::size_t threads = 1;
  if (a.n > serial_below && m >= 2 && fits) {
    run_in_space(space, [&] {
      threads = static_cast<std::size_t>(std::max(1, tbb::this_task_arena::max_concurrency()));
    });
  }
  const std::size_t parts = std::min({m, threads, max_parts});
  if (parts <= 1) {
    if (mean) {
      sum_ranks<true>(a, 0, m);
    } else {
      sum_ranks<false>(a, 0, m);
    }
    return;
  }
  const part_sums ps{a, m, parts, (std::uint64_t{parts} << 32) / m};
  ensure(s.part_items, a.n);
  std::array<std::size_t, max_parts + 1> start{};
  ps.deal(s.part_items.data(), start.data());
  const std::uint64_t* items = s.part_items.data();
  run_in_space(space, [&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, parts, 1),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t p = r.begin(); p < r.end(); ++p) {
                          if (mean) {
                            ps.run<true>(items, start[p], start[p + 1], p);
                          } else {
                            ps.run<false>(items, start[p], start[p + 1], p);
                          }
                        }
                      });
  });
}

}  // namespace

bool aggregate_gradients_host(const host_space& space, const slot_batch& batch, bool mean,
                              const float* d_out, std::size_t dim,
                              sparse_gradients<host_space>& grads) {
  const std::size_t n = batch.num_indices;
  if (n > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) return false;
  auto& s = grads.scratch;
  ensure(grads.rows, n);
  const std::int64_t* rows = batch.row_indices;
  const std::int64_t largest = largest_row(rows, n);
  if (largest < 0) return false;
  const auto max_row = static_cast<std::size_t>(largest);
  ensure(s.occurrence_rank, n);
  const std::size_t m = use_dense_grouping(n, max_row)
                            ? rank_dense(rows, n, max_row, s, grads.rows.data())
                            : rank_sparse(space, rows, n, s, grads.rows.data());
  ensure(grads.values, m * dim);
  const sum_args args{batch.offsets, batch.num_bags(),   s.occurrence_rank.data(), n, d_out,
                      dim,           grads.values.data()};
  sum_all(space, args, m, mean, s);
  grads.size = m;
  return true;
}

}  // namespace embcache::detail
