/// @file distributed/communicator.hpp
/// @brief Collectives over host memory between the ranks of one job: the interface the scale-out
/// code is written against, and its single-process implementation.
///
/// Every operation is collective: each rank of the communicator calls it, in the same order, with
/// arguments that agree (same root, same element counts where the operation says so). Buffers are
/// host memory. Implementations: single_process_communicator (one rank; the behaviour of a
/// program that does not scale out), mpi_communicator (distributed/mpi_communicator.hpp). Device
/// buffers go through nccl_communicator (distributed/nccl_communicator.hpp) instead.
///
/// Determinism: all_to_all_v, all_gather, broadcast and the integer sums are exact. A floating
/// sum (all_reduce_sum over float or double) is whatever order the implementation picks (MPI's
/// reductions may change order with the number of ranks and the message size); code whose bits
/// must not depend on the number of ranks adds in an order of its own (see dense_all_reduce.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "embcache/status.hpp"

namespace embcache {

/// A group of ranks `0 .. size()-1` that run collectives together. Calls on one communicator
/// must not overlap each other (one thread calls them at a time).
class communicator {
 public:
  virtual ~communicator() = default;

  /// This process's rank, in [0, size()).
  virtual int rank() const noexcept = 0;
  /// Number of ranks (>= 1).
  virtual int size() const noexcept = 0;

  /// Returns once every rank has entered it.
  [[nodiscard]] virtual status barrier() = 0;

  /// Copies `bytes` bytes at `data` from rank `root` to every rank's `data`.
  [[nodiscard]] virtual status broadcast(void* data, std::size_t bytes, int root) = 0;

  /// Personalized exchange of bytes: rank r sends `send_counts[p]` bytes from
  /// `send + send_displs[p]` to every rank p, and receives `recv_counts[p]` bytes from rank p
  /// into `recv + recv_displs[p]`. Each array has size() entries; what rank r sends to p must be
  /// what p expects from r (exchange counts first with all_to_all when they are not known).
  /// Counts and displacements past the transport's limit (2^31-1 bytes for MPI) are refused with
  /// invalid_argument naming the call and the rank.
  [[nodiscard]] virtual status all_to_all_v(const void* send, const std::size_t* send_counts,
                                            const std::size_t* send_displs, void* recv,
                                            const std::size_t* recv_counts,
                                            const std::size_t* recv_displs) = 0;

  /// Fixed-size personalized exchange: `bytes_per_rank` bytes from `send + p * bytes_per_rank`
  /// go to rank p, which receives them at `recv + r * bytes_per_rank`.
  [[nodiscard]] virtual status all_to_all(const void* send, std::size_t bytes_per_rank,
                                          void* recv) = 0;

  /// Every rank's `bytes` bytes at `send`, concatenated in rank order into `recv`
  /// (`size() * bytes` bytes) on every rank.
  [[nodiscard]] virtual status all_gather(const void* send, std::size_t bytes, void* recv) = 0;

  /// In place, element-wise sum over the ranks of `n` values (exact for integers; see the file
  /// comment for floating sums).
  [[nodiscard]] virtual status all_reduce_sum(float* data, std::size_t n) = 0;
  /// @copydoc all_reduce_sum(float*, std::size_t)
  [[nodiscard]] virtual status all_reduce_sum(double* data, std::size_t n) = 0;
  /// @copydoc all_reduce_sum(float*, std::size_t)
  [[nodiscard]] virtual status all_reduce_sum(std::uint64_t* data, std::size_t n) = 0;

  /// In place, element-wise maximum over the ranks of `n` values.
  [[nodiscard]] virtual status all_reduce_max(std::uint64_t* data, std::size_t n) = 0;
};

/// The communicator of a program that runs alone: rank 0 of 1. Every collective is a local copy,
/// so code written against communicator behaves as it did before scale-out.
class single_process_communicator final : public communicator {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  status barrier() override { return {}; }
  /// Root must be 0 (invalid_argument otherwise); the data stays as it is.
  status broadcast(void* data, std::size_t bytes, int root) override;
  status all_to_all_v(const void* send, const std::size_t* send_counts,
                      const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                      const std::size_t* recv_displs) override;
  status all_to_all(const void* send, std::size_t bytes_per_rank, void* recv) override;
  status all_gather(const void* send, std::size_t bytes, void* recv) override;
  status all_reduce_sum(float*, std::size_t) override { return {}; }
  status all_reduce_sum(double*, std::size_t) override { return {}; }
  status all_reduce_sum(std::uint64_t*, std::size_t) override { return {}; }
  status all_reduce_max(std::uint64_t*, std::size_t) override { return {}; }
};

/// all_to_all_v of typed vectors: `send` holds the elements for rank 0, then rank 1, ...
/// (`send_counts[p]` elements each, size() entries); `recv` is resized to what arrives, in rank
/// order, and `recv_counts` gets the element count from each rank. Exchanges the counts first.
/// `T` must be trivially copyable.
template <class T>
[[nodiscard]] status exchange(communicator& comm, const std::vector<T>& send,
                              const std::vector<std::size_t>& send_counts, std::vector<T>& recv,
                              std::vector<std::size_t>& recv_counts);

/// Agrees on an outcome: every rank passes its own status and gets back ok when every rank's was
/// ok; otherwise its own error, or, on a rank whose own was ok, an error that names the lowest
/// failing rank. Collective; `what` names the operation in that message.
[[nodiscard]] status agree(communicator& comm, const status& local, const std::string& what);

}  // namespace embcache

#include "embcache/distributed/detail/communicator.inl"
