/// @file cuda/embedding_cache_ref.cuh
/// @brief The cuda space's cooperative fast paths of the embedding cache: a lookup by a tile of
/// lanes, and the cuda-space overloads of the bulk find and lookup_slots loops that use it.
///
/// Each path is the twin of a portable one (embedding_cache_ref::find_slot and the loop bodies of
/// detail/cache_lookup_loops.inl) and gives the same answers; tests/cuda/embedding_cache_test.cu
/// compares them with the host space on a GPU. detail/space_algorithms.hpp includes it under
/// nvcc, and detail/embedding_cache.inl includes that before its definitions, so that the cache's
/// bulk calls pick these overloads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "embcache/cuda/algorithms.cuh"
#include "embcache/detail/cache_assign_loops.inl"
#include "embcache/detail/cache_install_loops.inl"
#include "embcache/detail/cache_lookup_loops.inl"
#include "embcache/embedding_cache_ref.hpp"
#include "embcache/space.hpp"

namespace embcache {

/// Lanes that look up one key together. Eight lanes read a 128-slot bucket's state bytes as
/// four 32-bit words each, so a warp has four keys' loads in flight instead of one: a lookup is a
/// chain of dependent loads (states, key, row), and more chains per warp hide more of its latency.
inline constexpr unsigned lanes_per_key = 8;
using key_tile = cooperative_groups::thread_block_tile<lanes_per_key>;

/// embedding_cache_ref::find_slot by a tile of lanes_per_key lanes: every lane calls it with the
/// same key, and gets the same slot (-1 when absent). Lane l reads the state words
/// [l * words, (l + 1) * words) of each bucket, and the lanes check the keys of their digest
/// matches at once.
template <class Key>
__device__ std::int64_t tile_find_slot(const key_tile& tile,
                                       const const_embedding_cache_ref<Key>& t, Key k) {
  constexpr unsigned words = detail::cache_bucket_size / 4 / lanes_per_key;
  const unsigned lane = tile.thread_rank();
  const auto h = t.hash(k);
  const std::uint32_t pattern = 0x01010101u * h.digest;
  std::size_t b = h.home;
  for (std::size_t p = 0; p < t.num_buckets; ++p) {
    const std::size_t first = b * detail::cache_bucket_size + lane * 4 * words;
    const auto* state_words = reinterpret_cast<const std::uint32_t*>(t.states + first);
    std::uint32_t word[words];
#pragma unroll
    for (unsigned j = 0; j < words; ++j)
      word[j] = detail::atomic_load(state_words + j, cuda::std::memory_order_acquire);
    long long mine = -1;
#pragma unroll
    for (unsigned j = 0; j < words; ++j) {
      const std::uint32_t x = word[j] ^ pattern;
      std::uint32_t m = ~(((x & 0x7f7f7f7fu) + 0x7f7f7f7fu) | x) & 0x80808080u;
      while (m && mine < 0) {
        const std::size_t s =
            first + 4 * j + static_cast<std::size_t>(__ffs(static_cast<int>(m)) - 1) / 8;
        m &= m - 1;
        if (t.keys[s] == k) mine = static_cast<long long>(s);
      }
    }
    const unsigned hits = tile.ballot(mine >= 0);
    if (hits) {
      const long long found = tile.shfl(mine, __ffs(static_cast<int>(hits)) - 1);
      // Only the finding lane's acquire load covers the state word the inserter published; the
      // ballot and shuffle order no memory, so the tile barrier orders that acquire before every
      // lane's later reads of the row.
      tile.sync();
      return found;
    }
    // One read, broadcast: lanes must agree on whether to go on even while inserts run.
    const std::uint32_t more = tile.shfl(lane == 0 ? detail::atomic_load(t.overflow + b) : 0u, 0);
    if (more == 0) return -1;
    b = t.next_bucket(b);
  }
  return -1;
}

namespace detail {

/// Copies a row of `width` floats by the tile's lanes: 16 bytes a lane where both rows are
/// 16-byte aligned, one float a lane otherwise.
__device__ inline void tile_copy_row(const key_tile& tile, float* dst, const float* src,
                                     std::size_t width) {
  const unsigned lane = tile.thread_rank();
  if (width % 4 == 0 &&
      ((reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst)) & 15) == 0) {
    const auto* src4 = reinterpret_cast<const float4*>(src);
    auto* dst4 = reinterpret_cast<float4*>(dst);
    for (std::size_t j = lane; j < width / 4; j += lanes_per_key) dst4[j] = src4[j];
  } else {
    for (std::size_t j = lane; j < width; j += lanes_per_key) dst[j] = src[j];
  }
}

/// find_fn run with a tile per key: one bucket load per probe step, coalesced row copies.
template <class Key>
struct tile_find_fn {
  find_fn<Key> f;
  static constexpr unsigned lanes_per_index = lanes_per_key;
  __device__ void lanes(std::size_t i, const key_tile& tile) const {
    const std::int64_t s = tile_find_slot<Key>(tile, f.t.as_const(), f.keys[i]);
    const unsigned lane = tile.thread_rank();
    if (lane == 0) {
      if (f.found_out) f.found_out[i] = s >= 0;
      if (s >= 0) f.t.touch(s, f.op);
    }
    if (s >= 0 && f.rows_out)
      tile_copy_row(tile, f.rows_out + i * f.t.row_width, f.t.row(s), f.t.row_width);
  }
};

/// slot_fn run with a tile per key.
template <class Key>
struct tile_slot_fn {
  slot_fn<Key> f;
  static constexpr unsigned lanes_per_index = lanes_per_key;
  __device__ void lanes(std::size_t i, const key_tile& tile) const {
    const std::int64_t s = tile_find_slot<Key>(tile, f.t.as_const(), f.keys[i]);
    if (tile.thread_rank() == 0) f.finish(i, s);
  }
};

/// The first pass of insert_fn on the device: a tile per key finds the resident keys and answers
/// them as insert_fn would (a key lives in one slot only, so a published match is what
/// find_or_claim would return); the others get slot -1 for the second pass.
template <class Key>
struct tile_insert_found_fn {
  insert_fn<Key> f;
  static constexpr unsigned lanes_per_index = lanes_per_key;
  __device__ void lanes(std::size_t i, const key_tile& tile) const {
    const std::int64_t s = tile_find_slot<Key>(tile, f.t.as_const(), f.keys[i]);
    if (tile.thread_rank() == 0) {
      f.slots[i] = s;
      if (s >= 0) {
        f.t.touch(s, f.op);
        f.outcome[i] = outcome_found;
      }
    }
    if (s >= 0 && f.rows_out)
      tile_copy_row(tile, f.rows_out + i * f.t.row_width, f.t.row(s), f.t.row_width);
  }
};

/// The second pass: a thread per key that the first did not find takes insert_fn's full path
/// (find_or_claim, which also finds a key a duplicate inserted meanwhile).
template <class Key>
struct insert_missing_fn {
  insert_fn<Key> f;
  __device__ void operator()(std::size_t i) const {
    if (f.slots[i] < 0) f(i);
  }
};

/// insert_fn by a thread per key, in one pass.
template <class Key>
struct insert_thread_fn {
  insert_fn<Key> f;
  __device__ void operator()(std::size_t i) const { f(i); }
};

/// The cuda space's insert loop. With rows to copy out (find_or_insert): resident keys by a tile
/// each, whose lanes share the row copy, then the rest by a thread each. Without
/// (insert_or_assign, lookup_slots with inserts): a thread per key in one pass, which keeps 32
/// lookups in flight per warp against the tiles' 4. On an H200 (docs/benchmarks.md), the tile
/// pass took find_or_insert at dim 32 from 1.13 to 2.04 G keys/s and insert_or_assign from 1.36
/// down to 1.21.
template <class Key>
void for_each_index(const cuda_space& space, std::size_t n, const insert_fn<Key>& f) {
  if (f.rows_out == nullptr) {
    for_each_index(space, n, insert_thread_fn<Key>{f});
    return;
  }
  for_each_index(space, n, tile_insert_found_fn<Key>{f});
  for_each_index(space, n, insert_missing_fn<Key>{f});
}

/// The cuda space's find loop: a tile per key (tile_find_fn).
template <class Key>
void for_each_index(const cuda_space& space, std::size_t n, const find_fn<Key>& f) {
  for_each_index(space, n, tile_find_fn<Key>{f});
}

/// The cuda space's lookup_slots loop: a tile per key (tile_slot_fn).
template <class Key>
void for_each_index(const cuda_space& space, std::size_t n, const slot_fn<Key>& f) {
  for_each_index(space, n, tile_slot_fn<Key>{f});
}

/// The cuda space's fill loop of install: a tile per new row, whose lanes share its copy (from the
/// staged rows the bridge copied in), the tile's first lane writing its metadata.
template <class Key>
struct tile_install_fill_fn {
  install_fill_fn<Key> f;
  static constexpr unsigned lanes_per_index = lanes_per_key;
  __device__ void lanes(std::size_t i, const key_tile& tile) const {
    if (f.outcome[i] != outcome_inserted) return;
    const std::int64_t s = f.slots[i];
    tile_copy_row(tile, f.t.row(s), f.rows + i * f.t.row_width, f.t.row_width);
    if (tile.thread_rank() == 0) f.metadata(i, s);
  }
};
template <class Key>
void for_each_index(const cuda_space& space, std::size_t n, const install_fill_fn<Key>& f) {
  for_each_index(space, n, tile_install_fill_fn<Key>{f});
}

}  // namespace detail
}  // namespace embcache
