// Definitions of the typed helpers of communicator.hpp.
#pragma once

#include <cstdint>
#include <type_traits>

namespace embcache {

template <class T>
status exchange(communicator& comm, const std::vector<T>& send,
                const std::vector<std::size_t>& send_counts, std::vector<T>& recv,
                std::vector<std::size_t>& recv_counts) {
  static_assert(std::is_trivially_copyable_v<T>, "exchange moves raw bytes");
  const std::size_t world = static_cast<std::size_t>(comm.size());
  if (send_counts.size() != world)
    return status::invalid_argument("exchange on rank " + std::to_string(comm.rank()) + ": " +
                                    std::to_string(send_counts.size()) + " send counts for " +
                                    std::to_string(world) + " ranks");
  std::vector<std::uint64_t> out(send_counts.begin(), send_counts.end()), in(world);
  EMBCACHE_RETURN_IF_ERROR(comm.all_to_all(out.data(), sizeof(std::uint64_t), in.data()));
  std::vector<std::size_t> sb(world), sd(world), rb(world), rd(world);
  std::size_t s_total = 0, r_total = 0;
  recv_counts.resize(world);
  for (std::size_t p = 0; p < world; ++p) {
    sd[p] = s_total * sizeof(T);
    sb[p] = send_counts[p] * sizeof(T);
    s_total += send_counts[p];
    // A count that could overflow the byte arithmetic below is a broken peer, not a big batch.
    if (in[p] > (SIZE_MAX / sizeof(T)) / world)
      return status::invalid_argument("exchange on rank " + std::to_string(comm.rank()) +
                                      ": rank " + std::to_string(p) + " announces " +
                                      std::to_string(in[p]) + " elements");
    recv_counts[p] = static_cast<std::size_t>(in[p]);
    rd[p] = r_total * sizeof(T);
    rb[p] = recv_counts[p] * sizeof(T);
    r_total += recv_counts[p];
  }
  if (s_total != send.size())
    return status::invalid_argument("exchange on rank " + std::to_string(comm.rank()) +
                                    ": send counts add up to " + std::to_string(s_total) +
                                    ", the buffer holds " + std::to_string(send.size()));
  recv.resize(r_total);
  return comm.all_to_all_v(send.data(), sb.data(), sd.data(), recv.data(), rb.data(), rd.data());
}

}  // namespace embcache
