/// @file distributed/nccl_communicator.hpp
/// @brief Collectives over device buffers between the ranks of an MPI job, through NCCL
/// (library embcache::nccl, built in a cuda build when MPI and NCCL are found).
///
/// One rank per GPU: set the rank's device (cudaSetDevice, usually to
/// mpi_communicator::local_rank()) before create(), and use device buffers of that device.
/// NCCL's communicator is bootstrapped over MPI: rank 0 makes the ncclUniqueId and MPI_Bcast
/// hands it to every rank before ncclCommInitRank. Every call is collective (all ranks, same
/// order) and only enqueues work on `stream` (`_async`); synchronize() waits for it and reports
/// errors NCCL raised asynchronously. Failures name the NCCL or CUDA call and the rank.
///
/// Errors: after any failed call (an enqueue, a CUDA error, an asynchronous NCCL error, a
/// synchronize past its deadline) the communicator is aborted (ncclCommAbort), so that no rank
/// waits on it for ever and the peers' calls fail too; every later call then fails with internal
/// naming the first error. The destructor aborts a communicator that has work it never waited
/// for, and destroys a quiet one.
///
/// Determinism: NCCL's all_reduce sums in an order that depends on the number of ranks and on the
/// algorithm NCCL picks (ring, tree); its bits are pinned only for a fixed world size and
/// topology. all_to_all_v, all_gather and broadcast are exact. A sum whose bits must not depend on
/// the world size is written as in dense_all_reduce.hpp (exchange per-block partials, add them in
/// block order) over all_to_all_v and all_gather.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "embcache/distributed/mpi_communicator.hpp"
#include "embcache/status.hpp"

struct CUstream_st;  // cudaStream_t without the CUDA headers
struct ncclComm;     // ncclComm_t without NCCL's header

namespace embcache {

/// An NCCL communicator over the ranks of an mpi_communicator.
class nccl_communicator {
 public:
  /// Bootstraps NCCL over `mpi` on the current CUDA device. Collective over `mpi`. Fails with
  /// unsupported when no CUDA device is present, internal naming the failing NCCL or MPI call
  /// otherwise (on every rank: the ranks agree on the outcome over MPI).
  [[nodiscard]] static result<std::unique_ptr<nccl_communicator>> create(mpi_communicator& mpi);
  ~nccl_communicator();
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  /// This rank, in [0, size()).
  int rank() const noexcept { return rank_; }
  /// Number of ranks.
  int size() const noexcept { return size_; }

  /// In place, element-wise sum over the ranks of `n` device values, enqueued on `stream`.
  [[nodiscard]] status all_reduce_sum_async(float* data, std::size_t n, CUstream_st* stream);
  /// @copydoc all_reduce_sum_async(float*, std::size_t, CUstream_st*)
  [[nodiscard]] status all_reduce_sum_async(double* data, std::size_t n, CUstream_st* stream);
  /// @copydoc all_reduce_sum_async(float*, std::size_t, CUstream_st*)
  [[nodiscard]] status all_reduce_sum_async(std::uint64_t* data, std::size_t n,
                                            CUstream_st* stream);

  /// Copies `bytes` device bytes at `data` from rank `root` to every rank's `data`.
  [[nodiscard]] status broadcast_async(void* data, std::size_t bytes, int root,
                                       CUstream_st* stream);

  /// Every rank's `bytes` device bytes at `send`, concatenated in rank order into `recv`
  /// (`size() * bytes` bytes).
  [[nodiscard]] status all_gather_async(const void* send, std::size_t bytes, void* recv,
                                        CUstream_st* stream);

  /// Personalized exchange of device bytes, as communicator::all_to_all_v: counts and
  /// displacements (host arrays of size() entries, in bytes) as there; one ncclSend and one
  /// ncclRecv per peer inside a group.
  [[nodiscard]] status all_to_all_v_async(const void* send, const std::size_t* send_counts,
                                          const std::size_t* send_displs, void* recv,
                                          const std::size_t* recv_counts,
                                          const std::size_t* recv_displs, CUstream_st* stream);

  /// Waits for `stream`, polling NCCL's asynchronous error meanwhile, and reports a CUDA error
  /// or an error NCCL raised. A dead peer would keep the stream busy for ever: past
  /// `deadline_s` seconds (default 600) the communicator is aborted and the call fails with
  /// internal saying so.
  [[nodiscard]] status synchronize(CUstream_st* stream, double deadline_s = 600);

 private:
  nccl_communicator(ncclComm* comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  // The status of an NCCL result; a failure aborts the communicator.
  status check(int nccl_result, const char* call);
  // Aborts the communicator (once) and remembers `why` for later calls; returns `why`.
  status fail(status why);
  // Fails when an earlier error aborted the communicator.
  status usable() const;

  ncclComm* comm_ = nullptr;
  std::string broken_;    // the first error, once aborted
  bool pending_ = false;  // work enqueued since the last successful synchronize
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace embcache
