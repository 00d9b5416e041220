/// @file cuda/embedding_cache_ref.cuh
/// @brief The cuda space's warp-cooperative fast paths of the embedding cache: a lookup by a whole
/// warp, and the cuda-space overloads of the bulk find and lookup_slots loops that use it.
///
/// Each path is the twin of a portable one (embedding_cache_ref::find_slot and the loop bodies of
/// detail/cache_lookup_loops.inl) and gives the same answers; tests/cuda/embedding_cache_test.cu
/// compares them with the host space on a GPU. Include after cuda/algorithms.cuh and before
/// detail/embedding_cache.inl, so that the cache's bulk calls pick these overloads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "embcache/cuda/algorithms.cuh"
#include "embcache/detail/cache_lookup_loops.inl"
#include "embcache/embedding_cache_ref.hpp"
#include "embcache/space.hpp"

namespace embcache {

/// embedding_cache_ref::find_slot by a whole warp: every lane calls it with the same key and its
/// own `lane` (0..31), and gets the same slot (-1 when absent). Lane l reads state bytes 4l..4l+3
/// of each bucket, so a bucket's states are one 128-byte load, and the lanes check the keys of
/// their digest matches at once.
template <class Key>
__device__ std::int64_t warp_find_slot(const const_embedding_cache_ref<Key>& t, Key k,
                                       unsigned lane) {
  const auto h = t.hash(k);
  std::size_t b = h.home;
  for (std::size_t p = 0; p < t.num_buckets; ++p) {
    const std::size_t first = b * detail::cache_bucket_size + lane * 4;
    const std::uint32_t word = detail::atomic_load(
        reinterpret_cast<const std::uint32_t*>(t.states + first), cuda::std::memory_order_acquire);
    const std::uint32_t x = word ^ (0x01010101u * h.digest);
    std::uint32_t m = ~(((x & 0x7f7f7f7fu) + 0x7f7f7f7fu) | x) & 0x80808080u;
    long long mine = -1;
    while (m) {
      const std::size_t s = first + static_cast<std::size_t>(__ffs(static_cast<int>(m)) - 1) / 8;
      m &= m - 1;
      if (t.keys[s] == k) {
        mine = static_cast<long long>(s);
        break;
      }
    }
    const unsigned hits = __ballot_sync(0xffffffffu, mine >= 0);
    if (hits) {
      const long long found = __shfl_sync(0xffffffffu, mine, __ffs(static_cast<int>(hits)) - 1);
      // Only the finding lane's acquire load covers the state word the inserter published; the
      // ballot and shuffle order no memory, so the warp barrier orders that acquire before every
      // lane's later reads of the row.
      __syncwarp();
      return found;
    }
    // One read, broadcast: lanes must agree on whether to go on even while inserts run.
    const std::uint32_t more =
        __shfl_sync(0xffffffffu, lane == 0 ? detail::atomic_load(t.overflow + b) : 0u, 0);
    if (more == 0) return -1;
    b = t.next_bucket(b);
  }
  return -1;
}

namespace detail {

/// find_fn run with a warp per key: one bucket load per probe step, coalesced row copies.
template <class Key>
struct warp_find_fn {
  find_fn<Key> f;
  static constexpr bool warp_per_index = true;
  __device__ void warp(std::size_t i, unsigned lane) const {
    const std::int64_t s = warp_find_slot<Key>(f.t.as_const(), f.keys[i], lane);
    if (lane == 0) {
      if (f.found_out) f.found_out[i] = s >= 0;
      if (s >= 0) f.t.touch(s, f.op);
    }
    if (s < 0 || !f.rows_out) return;
    const float* src = f.t.row(s);
    float* dst = f.rows_out + i * f.t.row_width;
    for (std::size_t j = lane; j < f.t.row_width; j += 32) dst[j] = src[j];
  }
};

/// slot_fn run with a warp per key.
template <class Key>
struct warp_slot_fn {
  slot_fn<Key> f;
  static constexpr bool warp_per_index = true;
  __device__ void warp(std::size_t i, unsigned lane) const {
    const std::int64_t s = warp_find_slot<Key>(f.t.as_const(), f.keys[i], lane);
    if (lane == 0) f.finish(i, s);
  }
};

/// The cuda space's find loop: a warp per key (warp_find_fn).
template <class Key>
void for_each_index(const cuda_space& space, std::size_t n, const find_fn<Key>& f) {
  for_each_index(space, n, warp_find_fn<Key>{f});
}

/// The cuda space's lookup_slots loop: a warp per key (warp_slot_fn).
template <class Key>
void for_each_index(const cuda_space& space, std::size_t n, const slot_fn<Key>& f) {
  for_each_index(space, n, warp_slot_fn<Key>{f});
}

}  // namespace detail
}  // namespace embcache
