/// @file distributed/mpi_communicator.hpp
/// @brief The communicator over MPI (library embcache::mpi, built when MPI's C bindings are
/// found), and a small RAII helper that initializes MPI for programs that do not do it themselves.
///
/// Programs start under a launcher (`mpirun -np 4 prog`, `srun`, ...). An mpi_communicator works
/// on a duplicate of the MPI_Comm it is given, so its messages never match the caller's own, and
/// sets MPI_ERRORS_RETURN on that duplicate: a failing call becomes a status whose message names
/// the MPI call, the rank and MPI's error string, instead of MPI's default abort.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "embcache/distributed/communicator.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// Initializes MPI on construction when nobody has (MPI_Init_thread asking for
/// MPI_THREAD_FUNNELED: only the thread that made the session calls MPI; oneTBB's workers never
/// do), and finalizes it on destruction when it was the one that initialized it. Make one at the
/// top of main(), before any mpi_communicator, and let it outlive them all.
class mpi_session {
 public:
  /// @throws embcache::error (internal) when MPI_Init_thread fails or MPI was already finalized.
  mpi_session();
  /// Same, passing the program's arguments on to MPI_Init_thread.
  mpi_session(int* argc, char*** argv);
  ~mpi_session();
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;

  /// Whether this session called MPI_Init_thread (false when MPI was already initialized).
  bool owns_mpi() const noexcept { return owns_; }
  /// The thread level MPI granted.
  int thread_level() const noexcept { return provided_; }

 private:
  bool owns_ = false;
  int provided_ = 0;
};

/// The communicator of the ranks of an MPI communicator. Not copyable; movable neither (the
/// duplicate it owns is freed in the destructor, which must run before MPI_Finalize).
class mpi_communicator final : public communicator {
 public:
  /// Works on a duplicate of `comm` (default MPI_COMM_WORLD). MPI must be initialized.
  /// @throws embcache::error (internal) naming the failing MPI call when MPI is not initialized
  ///         or the duplicate cannot be made.
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD);
  ~mpi_communicator() override;
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  status barrier() override;
  status broadcast(void* data, std::size_t bytes, int root) override;
  /// MPI_Alltoallv over MPI_BYTE: each count and displacement must fit in an int (2^31-1 bytes).
  status all_to_all_v(const void* send, const std::size_t* send_counts,
                      const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                      const std::size_t* recv_displs) override;
  status all_to_all(const void* send, std::size_t bytes_per_rank, void* recv) override;
  status all_gather(const void* send, std::size_t bytes, void* recv) override;
  status all_reduce_sum(float* data, std::size_t n) override;
  status all_reduce_sum(double* data, std::size_t n) override;
  status all_reduce_sum(std::uint64_t* data, std::size_t n) override;
  status all_reduce_max(std::uint64_t* data, std::size_t n) override;

  /// The duplicate communicator the collectives run on (for code that calls MPI itself, such as
  /// the NCCL bootstrap).
  MPI_Comm native() const noexcept { return comm_; }

  /// Rank of this process among the ranks of its node (MPI_Comm_split_type with
  /// MPI_COMM_TYPE_SHARED): the index of the GPU a rank usually takes.
  [[nodiscard]] result<int> local_rank() const;

 private:
  status check(int rc, const char* call) const;
  status all_reduce(void* data, std::size_t n, MPI_Datatype type, MPI_Op op, const char* call);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

/// "MPI_<call> failed on rank R of N: <MPI's error string>" for an MPI return code.
std::string mpi_error_message(int rc, const char* call, int rank, int size);

}  // namespace embcache
