// The communicator over MPI: each collective is the MPI call of the same name on byte buffers.
#include "embcache/distributed/mpi_communicator.hpp"

#include <climits>
#include <string>
#include <vector>

namespace embcache {
namespace {

int checked_int(std::size_t v, bool* ok) {
  if (v > static_cast<std::size_t>(INT_MAX)) {
    *ok = false;
    return 0;
  }
  return static_cast<int>(v);
}

void init_mpi(int* argc, char*** argv, bool* owns, int* provided) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) throw error(status_code::internal, "mpi_session: MPI was already finalized");
  if (initialized) {
    MPI_Query_thread(provided);
    return;
  }
  const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, provided);
  if (rc != MPI_SUCCESS)
    throw error(status_code::internal, mpi_error_message(rc, "Init_thread", 0, 1));
  *owns = true;
}

}  // namespace

std::string mpi_error_message(int rc, const char* call, int rank, int size) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  return std::string("MPI_") + call + " failed on rank " + std::to_string(rank) + " of " +
         std::to_string(size) + ": " +
         (len > 0 ? std::string(text, len) : "error " + std::to_string(rc));
}

mpi_session::mpi_session() { init_mpi(nullptr, nullptr, &owns_, &provided_); }

mpi_session::mpi_session(int* argc, char*** argv) { init_mpi(argc, argv, &owns_, &provided_); }

mpi_session::~mpi_session() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

mpi_communicator::mpi_communicator(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    throw error(status_code::internal,
                "mpi_communicator: MPI is not initialized (make an mpi_session first)");
  int rc = MPI_Comm_dup(comm, &comm_);
  if (rc != MPI_SUCCESS)
    throw error(status_code::internal, mpi_error_message(rc, "Comm_dup", 0, 1));
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

mpi_communicator::~mpi_communicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

status mpi_communicator::check(int rc, const char* call) const {
  if (rc == MPI_SUCCESS) return {};
  return status::internal(mpi_error_message(rc, call, rank_, size_));
}

status mpi_communicator::barrier() { return check(MPI_Barrier(comm_), "Barrier"); }

status mpi_communicator::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size_)
    return status::invalid_argument("MPI_Bcast on rank " + std::to_string(rank_) + " of " +
                                    std::to_string(size_) + ": root " + std::to_string(root) +
                                    " is not a rank");
  bool ok = true;
  const int n = checked_int(bytes, &ok);
  if (!ok)
    return status::invalid_argument("MPI_Bcast on rank " + std::to_string(rank_) + ": " +
                                    std::to_string(bytes) + " bytes exceed 2^31-1");
  return check(MPI_Bcast(data, n, MPI_BYTE, root, comm_), "Bcast");
}

status mpi_communicator::all_to_all_v(const void* send, const std::size_t* send_counts,
                                      const std::size_t* send_displs, void* recv,
                                      const std::size_t* recv_counts,
                                      const std::size_t* recv_displs) {
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  bool ok = true;
  for (int p = 0; p < size_; ++p) {
    sc[p] = checked_int(send_counts[p], &ok);
    sd[p] = checked_int(send_displs[p], &ok);
    rc[p] = checked_int(recv_counts[p], &ok);
    rd[p] = checked_int(recv_displs[p], &ok);
    if (!ok)
      return status::invalid_argument("MPI_Alltoallv on rank " + std::to_string(rank_) + " of " +
                                      std::to_string(size_) +
                                      ": the count or displacement for rank " + std::to_string(p) +
                                      " exceeds 2^31-1 bytes (split the exchange)");
  }
  return check(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(),
                             MPI_BYTE, comm_),
               "Alltoallv");
}

status mpi_communicator::all_to_all(const void* send, std::size_t bytes_per_rank, void* recv) {
  bool ok = true;
  const int n = checked_int(bytes_per_rank, &ok);
  if (!ok)
    return status::invalid_argument("MPI_Alltoall on rank " + std::to_string(rank_) + ": " +
                                    std::to_string(bytes_per_rank) +
                                    " bytes per rank exceed 2^31-1");
  return check(MPI_Alltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_), "Alltoall");
}

status mpi_communicator::all_gather(const void* send, std::size_t bytes, void* recv) {
  bool ok = true;
  const int n = checked_int(bytes, &ok);
  if (!ok)
    return status::invalid_argument("MPI_Allgather on rank " + std::to_string(rank_) + ": " +
                                    std::to_string(bytes) + " bytes exceed 2^31-1");
  return check(MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_), "Allgather");
}

status mpi_communicator::all_reduce(void* data, std::size_t n, MPI_Datatype type, MPI_Op op,
                                    const char* call) {
  // Large reductions go in pieces of at most INT_MAX elements, so any n works.
  int elem = 0;
  MPI_Type_size(type, &elem);
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const std::size_t piece = n < static_cast<std::size_t>(INT_MAX) ? n : INT_MAX;
    EMBCACHE_RETURN_IF_ERROR(
        check(MPI_Allreduce(MPI_IN_PLACE, p, static_cast<int>(piece), type, op, comm_), call));
    p += piece * static_cast<std::size_t>(elem);
    n -= piece;
  }
  return {};
}

status mpi_communicator::all_reduce_sum(float* data, std::size_t n) {
  return all_reduce(data, n, MPI_FLOAT, MPI_SUM, "Allreduce");
}
status mpi_communicator::all_reduce_sum(double* data, std::size_t n) {
  return all_reduce(data, n, MPI_DOUBLE, MPI_SUM, "Allreduce");
}
status mpi_communicator::all_reduce_sum(std::uint64_t* data, std::size_t n) {
  return all_reduce(data, n, MPI_UINT64_T, MPI_SUM, "Allreduce");
}
status mpi_communicator::all_reduce_max(std::uint64_t* data, std::size_t n) {
  return all_reduce(data, n, MPI_UINT64_T, MPI_MAX, "Allreduce");
}

result<int> mpi_communicator::local_rank() const {
  MPI_Comm node = MPI_COMM_NULL;
  EMBCACHE_RETURN_IF_ERROR(
      check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
            "Comm_split_type"));
  int r = 0;
  const int rc = MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  EMBCACHE_RETURN_IF_ERROR(check(rc, "Comm_rank"));
  return r;
}

}  // namespace embcache
