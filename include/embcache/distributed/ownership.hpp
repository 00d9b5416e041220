/// @file distributed/ownership.hpp
/// @brief Which rank owns a key, which samples a rank trains on: the two partitions of
/// scale-out.
///
/// Keys (model parallel): key k belongs to rank `owner_of(k, world)`, a pure function of the key
/// and the number of ranks. A rank's store shard, training cache and keyset hold only its keys.
///
/// Samples (data parallel): the global batch of a step is cut into `num_blocks` blocks of nearly
/// equal size (block_samples: equal when num_blocks divides the batch, as it does for every
/// batch but a pass's last), a number fixed for the run and independent of the number of ranks;
/// rank r trains on the contiguous blocks `[r * num_blocks / world, (r + 1) * num_blocks / world)`. Sums over the batch
/// (sparse and dense gradients) are taken per block and then added in block order, so they are
/// the same bits for every number of ranks that divides `num_blocks`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "embcache/detail/hash.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// Salt xored into a key before it is mixed for ownership, so that owners are independent of the
/// host store's shard choice and the device cache's bucket choice (which mix keys too).
inline constexpr std::uint64_t owner_salt = 0x6f776e6572ULL;  // "owner"

/// The owner function's name as a save manifest records it.
inline constexpr const char* owner_function_name = "murmur3_fmix64(key ^ 0x6f776e6572) % world";

/// The rank that owns `key` among `world` ranks (world >= 1): murmur3_fmix64(key ^ owner_salt)
/// modulo world. Pinned by tests: changing it breaks every sharded save.
template <class Key>
constexpr int owner_of(Key key, int world) noexcept {
  return static_cast<int>(detail::murmur3_fmix64(static_cast<std::uint64_t>(key) ^ owner_salt) %
                          static_cast<std::uint64_t>(world));
}

/// Splits `keys[0..n)` by owner: part p holds the keys rank p owns, in their input order
/// (a sorted keyset gives sorted parts). `world` parts.
template <class Key>
std::vector<std::vector<Key>> partition_by_owner(const Key* keys, std::size_t n, int world);

/// The keys of `keys[0..n)` that `rank` owns among `world` ranks, in input order: the part of a
/// pass's keyset that rank's training cache or store swaps in keyset mode.
template <class Key>
std::vector<Key> owned_part(const Key* keys, std::size_t n, int rank, int world);

/// Blocks of the global batch one rank trains on: `[first, first + count)`.
struct block_range {
  std::size_t first = 0;  ///< index of the rank's first block (default 0)
  std::size_t count = 0;  ///< number of blocks, num_blocks / world (default 0)
};

/// Samples `[begin, end)` of a global batch: of the block range of one rank, or of one block.
struct sample_range {
  std::size_t begin = 0;  ///< first sample (default 0)
  std::size_t end = 0;    ///< one past the last sample (default 0)
  std::size_t size() const noexcept { return end - begin; }
};

/// The samples of blocks `[first_block, first_block + count)` of a global batch of
/// `batch_size` samples cut into `num_blocks` (> 0) blocks: block g starts at sample
/// floor(g * batch_size / num_blocks), computed without overflow. Blocks may be empty when the
/// batch has fewer samples than blocks.
sample_range block_samples(std::size_t num_blocks, std::size_t batch_size, std::size_t first_block,
                           std::size_t count = 1) noexcept;

/// The blocks rank `rank` of `world` trains on. Fails with invalid_argument when world does not
/// divide num_blocks, or rank is outside [0, world).
[[nodiscard]] result<block_range> blocks_of_rank(std::size_t num_blocks, int rank, int world);

extern template std::vector<std::vector<std::int64_t>> partition_by_owner(const std::int64_t*,
                                                                          std::size_t, int);
extern template std::vector<std::vector<std::uint32_t>> partition_by_owner(const std::uint32_t*,
                                                                           std::size_t, int);
extern template std::vector<std::int64_t> owned_part(const std::int64_t*, std::size_t, int, int);
extern template std::vector<std::uint32_t> owned_part(const std::uint32_t*, std::size_t, int, int);

}  // namespace embcache
