// The block-ordered dense all-reduce: reduce-scatter by element range, then all-gather.
#include "embcache/distributed/dense_all_reduce.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace embcache {

status all_reduce_blocks(communicator& comm, const float* partials, std::size_t blocks_per_rank,
                         std::size_t n, float* out) {
  if (blocks_per_rank == 0)
    return status::invalid_argument("all_reduce_blocks on rank " + std::to_string(comm.rank()) +
                                    ": blocks_per_rank is 0");
  const auto world = static_cast<std::size_t>(comm.size());
  const auto self = static_cast<std::size_t>(comm.rank());
  // Range s = [s * chunk, min(n, (s + 1) * chunk)); the last ranges may be short or empty.
  const std::size_t chunk = (n + world - 1) / world;
  auto range_begin = [&](std::size_t s) { return std::min(n, s * chunk); };
  auto range_size = [&](std::size_t s) { return range_begin(s + 1) - range_begin(s); };

  // Send range s of each of this rank's blocks to rank s, blocks in order.
  std::vector<float> send(blocks_per_rank * n);
  std::vector<std::size_t> sc(world), sd(world), rc(world), rd(world);
  std::size_t at = 0;
  for (std::size_t s = 0; s < world; ++s) {
    sd[s] = at * sizeof(float);
    for (std::size_t j = 0; j < blocks_per_rank; ++j) {
      // An empty range may have no storage behind it (memcpy's pointers must not be null).
      if (range_size(s) > 0)
        std::memcpy(send.data() + at, partials + j * n + range_begin(s),
                    range_size(s) * sizeof(float));
      at += range_size(s);
    }
    sc[s] = blocks_per_rank * range_size(s) * sizeof(float);
  }
  const std::size_t mine = range_size(self);
  std::vector<float> recv(world * blocks_per_rank * mine);
  for (std::size_t p = 0; p < world; ++p) {
    rc[p] = blocks_per_rank * mine * sizeof(float);
    rd[p] = p * rc[p];
  }
  EMBCACHE_RETURN_IF_ERROR(
      comm.all_to_all_v(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data()));

  // recv holds global blocks 0, 1, ..., G-1 of my range, in order: sum them in that order.
  std::vector<float> sum(chunk, 0.0f);
  const std::size_t blocks = world * blocks_per_rank;
  for (std::size_t g = 0; g < blocks; ++g)
    for (std::size_t e = 0; e < mine; ++e) sum[e] += recv[g * mine + e];

  // Everyone's range to everyone (ranges padded to `chunk` floats so all_gather suffices).
  std::vector<float> gathered(world * chunk);
  EMBCACHE_RETURN_IF_ERROR(comm.all_gather(sum.data(), chunk * sizeof(float), gathered.data()));
  for (std::size_t s = 0; s < world; ++s)
    if (range_size(s) > 0)
      std::memcpy(out + range_begin(s), gathered.data() + s * chunk, range_size(s) * sizeof(float));
  return {};
}

}  // namespace embcache
