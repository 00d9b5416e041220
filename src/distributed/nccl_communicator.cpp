// The NCCL communicator: bootstrap over MPI, collectives on device buffers (host-compiled: only
// NCCL and CUDA runtime calls, no kernels of its own).
#include "embcache/distributed/nccl_communicator.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <string>
#include <thread>

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

status nccl_communicator::check(int rc, const char* call) {
  if (rc == ncclSuccess) return {};
  return fail(status::internal(std::string(call) + where(rank_, size_) +
                               ncclGetErrorString(static_cast<ncclResult_t>(rc))));
}

status nccl_communicator::fail(status why) {
  if (comm_ != nullptr) {
    // Abort, not destroy: the peers' pending operations with this rank fail instead of waiting
    // for ever, and nothing here waits on a dead peer.
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    (void)cudaGetLastError();  // whatever the failure left behind is reported here
  }
  if (broken_.empty()) broken_ = why.to_string();
  return why;
}

status nccl_communicator::usable() const {
  if (comm_ != nullptr) return {};
  return status::internal("nccl_communicator on rank " + std::to_string(rank_) + " of " +
                          std::to_string(size_) + ": aborted after an earlier error: " + broken_);
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
  if (comm_ == nullptr) return;
  ncclResult_t async = ncclSuccess;
  // Work never waited for may wait on a dead peer: abort it. A quiet communicator is destroyed.
  if (pending_ || ncclCommGetAsyncError(comm_, &async) != ncclSuccess || async != ncclSuccess) {
    (void)ncclCommAbort(comm_);
  } else {
    (void)ncclCommDestroy(comm_);
  }
}

status nccl_communicator::all_reduce_sum_async(float* data, std::size_t n, CUstream_st* stream) {
  EMBCACHE_RETURN_IF_ERROR(usable());
  pending_ = true;
  return check(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream), "ncclAllReduce");
}

status nccl_communicator::all_reduce_sum_async(double* data, std::size_t n, CUstream_st* stream) {
  EMBCACHE_RETURN_IF_ERROR(usable());
  pending_ = true;
  return check(ncclAllReduce(data, data, n, ncclFloat64, ncclSum, comm_, stream), "ncclAllReduce");
}

status nccl_communicator::all_reduce_sum_async(std::uint64_t* data, std::size_t n,
                                               CUstream_st* stream) {
  EMBCACHE_RETURN_IF_ERROR(usable());
  pending_ = true;
  return check(ncclAllReduce(data, data, n, ncclUint64, ncclSum, comm_, stream), "ncclAllReduce");
}

status nccl_communicator::broadcast_async(void* data, std::size_t bytes, int root,
                                          CUstream_st* stream) {
  EMBCACHE_RETURN_IF_ERROR(usable());
  if (root < 0 || root >= size_)
    return status::invalid_argument("ncclBroadcast on rank " + std::to_string(rank_) + ": root " +
                                    std::to_string(root) + " is not a rank");
  pending_ = true;
  return check(ncclBroadcast(data, data, bytes, ncclInt8, root, comm_, stream), "ncclBroadcast");
}

status nccl_communicator::all_gather_async(const void* send, std::size_t bytes, void* recv,
                                           CUstream_st* stream) {
  EMBCACHE_RETURN_IF_ERROR(usable());
  pending_ = true;
  return check(ncclAllGather(send, recv, bytes, ncclInt8, comm_, stream), "ncclAllGather");
}

status nccl_communicator::all_to_all_v_async(const void* send, const std::size_t* send_counts,
                                             const std::size_t* send_displs, void* recv,
                                             const std::size_t* recv_counts,
                                             const std::size_t* recv_displs, CUstream_st* stream) {
  EMBCACHE_RETURN_IF_ERROR(usable());
  pending_ = true;
  EMBCACHE_RETURN_IF_ERROR(check(ncclGroupStart(), "ncclGroupStart"));
  int rc = ncclSuccess;
  const char* call = "";
  for (int p = 0; p < size_ && rc == ncclSuccess; ++p) {
    if (send_counts[p] > 0) {
      rc = ncclSend(static_cast<const char*>(send) + send_displs[p], send_counts[p], ncclInt8, p,
                    comm_, stream);
      call = "ncclSend";
    }
    if (rc == ncclSuccess && recv_counts[p] > 0) {
      rc = ncclRecv(static_cast<char*>(recv) + recv_displs[p], recv_counts[p], ncclInt8, p, comm_,
                    stream);
      call = "ncclRecv";
    }
  }
  // The group is closed even after a failed enqueue. The peers, whose halves of this exchange
  // were enqueued, would then wait for ever: check() aborts the communicator, which fails them.
  const int end = ncclGroupEnd();
  if (rc != ncclSuccess) return check(rc, call);
  return check(end, "ncclGroupEnd");
}

status nccl_communicator::synchronize(CUstream_st* stream, double deadline_s) {
  EMBCACHE_RETURN_IF_ERROR(usable());
  // Poll instead of cudaStreamSynchronize: a peer that died leaves the stream busy for ever,
  // and only NCCL's asynchronous error (or the deadline) says so.
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) return fail(cuda_status(e, "cudaStreamQuery", rank_, size_));
    ncclResult_t async = ncclSuccess;
    EMBCACHE_RETURN_IF_ERROR(check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError"));
    EMBCACHE_RETURN_IF_ERROR(check(async, "an asynchronous NCCL operation"));
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    if (waited.count() > deadline_s)
      return fail(status::internal("nccl_communicator::synchronize on rank " +
                                   std::to_string(rank_) + " of " + std::to_string(size_) +
                                   ": the stream was still busy after " +
                                   std::to_string(deadline_s) + " s (a peer dead or stuck?)"));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  ncclResult_t async = ncclSuccess;
  EMBCACHE_RETURN_IF_ERROR(check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError"));
  EMBCACHE_RETURN_IF_ERROR(check(async, "an asynchronous NCCL operation"));
  pending_ = false;
  return {};
}

}  // namespace embcache
