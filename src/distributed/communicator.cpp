// The single-process communicator and the helpers every communicator shares.
#include "embcache/distributed/communicator.hpp"

#include <cstring>
#include <string>

namespace embcache {

status single_process_communicator::broadcast(void*, std::size_t, int root) {
  if (root != 0)
    return status::invalid_argument("broadcast on rank 0 of 1: root " + std::to_string(root) +
                                    " is not a rank");
  return {};
}

status single_process_communicator::all_to_all_v(const void* send, const std::size_t* send_counts,
                                                 const std::size_t* send_displs, void* recv,
                                                 const std::size_t* recv_counts,
                                                 const std::size_t* recv_displs) {
  if (send_counts[0] != recv_counts[0])
    return status::invalid_argument("all_to_all_v on rank 0 of 1: sends " +
                                    std::to_string(send_counts[0]) + " bytes to itself, expects " +
                                    std::to_string(recv_counts[0]));
  // memmove: a caller may exchange in place.
  if (send_counts[0] > 0)
    std::memmove(static_cast<char*>(recv) + recv_displs[0],
                 static_cast<const char*>(send) + send_displs[0], send_counts[0]);
  return {};
}

status single_process_communicator::all_to_all(const void* send, std::size_t bytes_per_rank,
                                               void* recv) {
  if (bytes_per_rank > 0) std::memmove(recv, send, bytes_per_rank);
  return {};
}

status single_process_communicator::all_gather(const void* send, std::size_t bytes, void* recv) {
  if (bytes > 0) std::memmove(recv, send, bytes);
  return {};
}

status agree(communicator& comm, const status& local, const std::string& what) {
  const int world = comm.size();
  // Each rank contributes the lowest failing rank it knows of (itself or none); the minimum over
  // the ranks is taken as a maximum of the complement so that one integer reduction suffices.
  std::uint64_t flag = local.ok() ? 0 : std::uint64_t(world) - std::uint64_t(comm.rank());
  EMBCACHE_RETURN_IF_ERROR(comm.all_reduce_max(&flag, 1).with_context(what));
  if (flag == 0) return {};
  if (!local.ok()) return local;
  const int failed = world - static_cast<int>(flag);
  return status::internal(what + ": rank " + std::to_string(failed) + " of " +
                          std::to_string(world) + " failed (its own log says why)");
}

}  // namespace embcache
