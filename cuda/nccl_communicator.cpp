// The NCCL communicator: bootstrap over MPI, collectives on device buffers (host-compiled: only
// NCCL and CUDA runtime calls, no kernels of its own).
#include "embcache/distributed/nccl_communicator.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

namespace embcache {
namespace {

std::string where(int rank, int size) {
  return " failed on rank " + std::to_string(rank) + " of " + std::to_string(size) + ": ";
}

status cuda_status(cudaError_t e, const char* call, int rank, int size) {
  if (e == cudaSuccess) return {};
  return status::internal(std::string(call) + where(rank, size) + cudaGetErrorString(e));
}

}  // namespace

status nccl_communicator::check(int rc, const char* call) const {
  if (rc == ncclSuccess) return {};
  return status::internal(std::string(call) + where(rank_, size_) +
                          ncclGetErrorString(static_cast<ncclResult_t>(rc)));
}

result<std::unique_ptr<nccl_communicator>> nccl_communicator::create(mpi_communicator& mpi) {
  const int rank = mpi.rank(), size = mpi.size();
  int devices = 0;
  status local;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    local = status::unsupported("nccl_communicator::create on rank " + std::to_string(rank) +
                                ": no CUDA device");
  }
  ncclUniqueId id{};
  if (rank == 0 && local.ok()) {
    const ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess)
      local = status::internal(std::string("ncclGetUniqueId") + where(rank, size) +
                               ncclGetErrorString(rc));
  }
  EMBCACHE_RETURN_IF_ERROR(agree(mpi, local, "nccl_communicator::create"));
  // The id is plain bytes: MPI carries it to every rank.
  EMBCACHE_RETURN_IF_ERROR(mpi.broadcast(&id, sizeof(id), 0));
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = ncclCommInitRank(&comm, size, id, rank);
  if (rc != ncclSuccess)
    local = status::internal(std::string("ncclCommInitRank") + where(rank, size) +
                             ncclGetErrorString(rc));
  const status agreed = agree(mpi, local, "nccl_communicator::create");
  if (!agreed.ok()) {
    if (comm != nullptr) ncclCommDestroy(comm);
    return agreed;
  }
  return std::unique_ptr<nccl_communicator>(new nccl_communicator(comm, rank, size));
}

nccl_communicator::~nccl_communicator() {
  if (comm_ != nullptr) ncclCommDestroy(comm_);
}

status nccl_communicator::all_reduce_sum_async(float* data, std::size_t n, CUstream_st* stream) {
  return check(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream), "ncclAllReduce");
}

status nccl_communicator::all_reduce_sum_async(double* data, std::size_t n, CUstream_st* stream) {
  return check(ncclAllReduce(data, data, n, ncclFloat64, ncclSum, comm_, stream), "ncclAllReduce");
}

status nccl_communicator::all_reduce_sum_async(std::uint64_t* data, std::size_t n,
                                               CUstream_st* stream) {
  return check(ncclAllReduce(data, data, n, ncclUint64, ncclSum, comm_, stream), "ncclAllReduce");
}

status nccl_communicator::broadcast_async(void* data, std::size_t bytes, int root,
                                          CUstream_st* stream) {
  if (root < 0 || root >= size_)
    return status::invalid_argument("ncclBroadcast on rank " + std::to_string(rank_) + ": root " +
                                    std::to_string(root) + " is not a rank");
  return check(ncclBroadcast(data, data, bytes, ncclInt8, root, comm_, stream), "ncclBroadcast");
}

status nccl_communicator::all_gather_async(const void* send, std::size_t bytes, void* recv,
                                           CUstream_st* stream) {
  return check(ncclAllGather(send, recv, bytes, ncclInt8, comm_, stream), "ncclAllGather");
}

status nccl_communicator::all_to_all_v_async(const void* send, const std::size_t* send_counts,
                                             const std::size_t* send_displs, void* recv,
                                             const std::size_t* recv_counts,
                                             const std::size_t* recv_displs, CUstream_st* stream) {
  EMBCACHE_RETURN_IF_ERROR(check(ncclGroupStart(), "ncclGroupStart"));
  status first;
  for (int p = 0; p < size_ && first.ok(); ++p) {
    if (send_counts[p] > 0)
      first = check(ncclSend(static_cast<const char*>(send) + send_displs[p], send_counts[p],
                             ncclInt8, p, comm_, stream),
                    "ncclSend");
    if (first.ok() && recv_counts[p] > 0)
      first = check(ncclRecv(static_cast<char*>(recv) + recv_displs[p], recv_counts[p], ncclInt8, p,
                             comm_, stream),
                    "ncclRecv");
  }
  // The group is closed even after a failed enqueue, so the communicator stays usable.
  const status end = check(ncclGroupEnd(), "ncclGroupEnd");
  return first.ok() ? end : first;
}

status nccl_communicator::synchronize(CUstream_st* stream) {
  EMBCACHE_RETURN_IF_ERROR(
      cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize", rank_, size_));
  ncclResult_t async = ncclSuccess;
  EMBCACHE_RETURN_IF_ERROR(check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError"));
  return check(async, "an asynchronous NCCL operation");
}

}  // namespace embcache
