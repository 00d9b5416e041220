// Ownership of keys and blocks (distributed/ownership.hpp).
#include "embcache/distributed/ownership.hpp"

#include <string>

namespace embcache {

template <class Key>
std::vector<std::vector<Key>> partition_by_owner(const Key* keys, std::size_t n, int world) {
  std::vector<std::vector<Key>> parts(static_cast<std::size_t>(world));
  for (std::size_t i = 0; i < n; ++i)
    parts[static_cast<std::size_t>(owner_of(keys[i], world))].push_back(keys[i]);
  return parts;
}

template <class Key>
std::vector<Key> owned_part(const Key* keys, std::size_t n, int rank, int world) {
  std::vector<Key> out;
  for (std::size_t i = 0; i < n; ++i)
    if (owner_of(keys[i], world) == rank) out.push_back(keys[i]);
  return out;
}

result<block_range> blocks_of_rank(std::size_t num_blocks, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world)
    return status::invalid_argument("blocks_of_rank: rank " + std::to_string(rank) +
                                    " is outside a world of " + std::to_string(world));
  const auto w = static_cast<std::size_t>(world);
  if (num_blocks == 0 || num_blocks % w != 0)
    return status::invalid_argument("blocks_of_rank: " + std::to_string(num_blocks) +
                                    " blocks do not split evenly over " + std::to_string(world) +
                                    " ranks (num_blocks must be a positive multiple of the world "
                                    "size)");
  const std::size_t per = num_blocks / w;
  return block_range{static_cast<std::size_t>(rank) * per, per};
}

namespace {
// floor(g * n / blocks) without forming g * n.
std::size_t block_start(std::size_t blocks, std::size_t n, std::size_t g) noexcept {
  return g * (n / blocks) + (g * (n % blocks)) / blocks;
}
}  // namespace

sample_range block_samples(std::size_t num_blocks, std::size_t batch_size, std::size_t first_block,
                           std::size_t count) noexcept {
  return {block_start(num_blocks, batch_size, first_block),
          block_start(num_blocks, batch_size, first_block + count)};
}

template std::vector<std::vector<std::int64_t>> partition_by_owner(const std::int64_t*, std::size_t,
                                                                   int);
template std::vector<std::vector<std::uint32_t>> partition_by_owner(const std::uint32_t*,
                                                                    std::size_t, int);
template std::vector<std::int64_t> owned_part(const std::int64_t*, std::size_t, int, int);
template std::vector<std::uint32_t> owned_part(const std::uint32_t*, std::size_t, int, int);

}  // namespace embcache
