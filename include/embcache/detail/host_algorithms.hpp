/// @file detail/host_algorithms.hpp
/// @brief Bulk primitives of the host space: oneTBB loops and Thrust's TBB system.
///
/// Only host translation units include this. Every call names its policy explicitly, so Thrust's
/// CUDA system can never be picked here.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>
#include <tbb/parallel_sort.h>
#include <tbb/task_arena.h>
#include <thrust/count.h>
#include <thrust/scan.h>
#include <thrust/system/tbb/execution_policy.h>

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "embcache/space.hpp"

namespace embcache::detail {

/// Whether a loop body offers `prefetch(i)` (a hint to load what `f(i)` will touch).
template <class F, class = void>
struct has_prefetch : std::false_type {};
template <class F>
struct has_prefetch<F, std::void_t<decltype(std::declval<const F&>().prefetch(std::size_t{}))>>
    : std::true_type {};

/// Whether a loop body offers `prefetch_early(i)` (a hint for what `prefetch(i)` itself reads).
template <class F, class = void>
struct has_prefetch_early : std::false_type {};
template <class F>
struct has_prefetch_early<
    F, std::void_t<decltype(std::declval<const F&>().prefetch_early(std::size_t{}))>>
    : std::true_type {};

/// Runs `body()` inside an arena limited to the space's thread count.
template <class Body>
void run_in_space(const host_space& space, Body&& body) {
  if (space.max_threads > 0) {
    tbb::task_arena arena(space.max_threads);
    arena.execute(body);
  } else {
    body();
  }
}

/// Whether a loop body offers `run_range(begin, end)`: its own host loop over a chunk of indices
/// (e.g. a software pipeline), with the same effect as calling `f(i)` for each.
template <class F, class = void>
struct has_run_range : std::false_type {};
template <class F>
struct has_run_range<
    F, std::void_t<decltype(std::declval<const F&>().run_range(std::size_t{}, std::size_t{}))>>
    : std::true_type {};

/// Calls `f(i)` for every i in [0, n), in parallel, chunk by chunk. When `F` has
/// `run_range(begin, end)`, each chunk is handed to it whole. Otherwise, when `F` has
/// `prefetch(i)`, the loop calls it `ahead` indices before `f(i)`, so that the memory latency of
/// random accesses overlaps instead of adding up; and `prefetch_early(i)`, when `F` has it, twice
/// as far ahead (what `prefetch(i)` reads to find its addresses, such as a slot's row index).
template <class F>
void for_each_index(const host_space& space, std::size_t n, const F& f) {
  if (n == 0) return;
  constexpr std::size_t grain = 4096;
  auto chunk = [&f](std::size_t begin, std::size_t end) {
    if constexpr (has_run_range<F>::value) {
      f.run_range(begin, end);
    } else if constexpr (has_prefetch<F>::value) {
      constexpr std::size_t ahead = 16;
      if constexpr (has_prefetch_early<F>::value) {
        for (std::size_t i = begin; i < end && i < begin + 2 * ahead; ++i) f.prefetch_early(i);
      }
      for (std::size_t i = begin; i < end && i < begin + ahead; ++i) f.prefetch(i);
      for (std::size_t i = begin; i < end; ++i) {
        if constexpr (has_prefetch_early<F>::value) {
          if (i + 2 * ahead < end) f.prefetch_early(i + 2 * ahead);
        }
        if (i + ahead < end) f.prefetch(i + ahead);
        f(i);
      }
    } else {
      for (std::size_t i = begin; i < end; ++i) f(i);
    }
  };
  if (n <= grain) {
    chunk(0, n);
    return;
  }
  run_in_space(space, [&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, grain),
                      [&](const tbb::blocked_range<std::size_t>& r) { chunk(r.begin(), r.end()); });
  });
}

/// Stable sort of `values` by `keys` (both length n), in parallel.
///
/// oneTBB's parallel quicksort over (key, original position) pairs: ordering equal keys by their
/// position makes the result exactly that of a stable sort, whatever the thread count. (Thrust's
/// TBB system is not used here: the radix path of the Thrust that Debian ships binds a reference
/// to a null policy pointer, undefined behaviour that UBSan reports.)
template <class K, class V>
void stable_sort_by_key(const host_space& space, K* keys, V* values, std::size_t n) {
  if (n < 2) return;
  struct keyed {
    K key;
    std::size_t position;
  };
  std::vector<keyed> order(n);
  std::vector<V> moved(n);
  run_in_space(space, [&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 16384),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i < r.end(); ++i) order[i] = {keys[i], i};
                      });
    tbb::parallel_sort(order.begin(), order.end(), [](const keyed& a, const keyed& b) {
      return a.key < b.key || (!(b.key < a.key) && a.position < b.position);
    });
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 16384),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i < r.end(); ++i) {
                          moved[i] = std::move(values[order[i].position]);
                        }
                      });
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 16384),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i < r.end(); ++i) {
                          keys[i] = order[i].key;
                          values[i] = std::move(moved[i]);
                        }
                      });
  });
}

/// Sort of `keys` (length n), in parallel (oneTBB's parallel quicksort; equal keys are alike).
template <class K>
void sort(const host_space& space, K* keys, std::size_t n) {
  if (n < 2) return;
  run_in_space(space, [&] { tbb::parallel_sort(keys, keys + n); });
}

/// out[i] = sum of in[0..i) (exclusive prefix sum), in parallel; `in` and `out` may alias.
template <class T, class U>
void exclusive_scan(const host_space& space, const T* in, U* out, std::size_t n) {
  if (n == 0) return;
  run_in_space(space, [&] { thrust::exclusive_scan(thrust::tbb::par, in, in + n, out, U{0}); });
}

/// Number of elements of `in` equal to `value`.
template <class T>
std::size_t count_equal(const host_space& space, const T* in, std::size_t n, T value) {
  if (n == 0) return 0;
  std::size_t c = 0;
  run_in_space(space, [&] { c = thrust::count(thrust::tbb::par, in, in + n, value); });
  return c;
}

/// Largest element of `in` (n > 0), in parallel.
template <class T>
T max_value(const host_space& space, const T* in, std::size_t n) {
  auto range_max = [in](std::size_t begin, std::size_t end, T m) {
    for (std::size_t i = begin; i < end; ++i) m = in[i] < m ? m : in[i];
    return m;
  };
  if (n <= 65536) return range_max(1, n, in[0]);
  T m = in[0];
  run_in_space(space, [&] {
    m = tbb::parallel_reduce(
        tbb::blocked_range<std::size_t>(0, n, 65536), in[0],
        [&](const tbb::blocked_range<std::size_t>& r, T acc) {
          return range_max(r.begin(), r.end(), acc);
        },
        [](T a, T b) { return a < b ? b : a; });
  });
  return m;
}

/// Exclusive prefix sum of `in` into `out` (length n each; they may be the same), in parallel.
template <class T>
void exclusive_scan(const host_space& space, const T* in, T* out, std::size_t n) {
  if (n == 0) return;
  run_in_space(space, [&] { thrust::exclusive_scan(thrust::tbb::par, in, in + n, out); });
}

}  // namespace embcache::detail
