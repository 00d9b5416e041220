/// @file space.hpp
/// @brief Execution spaces: where data lives and where bulk operations run.
///
/// Every container and bulk operation is templated on a space. The same single-key code runs in
/// both; only the parallel loop, the allocator and the copies differ.
#pragma once

#include <cstddef>
#include <type_traits>

struct CUstream_st;  // cudaStream_t without the CUDA headers

namespace embcache {

/// Host memory; bulk operations run on oneTBB's thread pool (Thrust's TBB system).
struct host_space {
  /// Most worker threads a bulk operation uses; 0 (default) = oneTBB's default (all cores).
  int max_threads = 0;
};

/// Device memory of the current CUDA device; bulk operations run on `stream`.
/// Using it needs the embcache::cuda library and a CUDA-capable device.
struct cuda_space {
  /// Stream the operations are ordered on; nullptr (default) = the legacy default stream.
  CUstream_st* stream = nullptr;
};

/// True for the host space.
template <class Space>
inline constexpr bool is_host_space_v = std::is_same_v<Space, host_space>;

/// True for the cuda space.
template <class Space>
inline constexpr bool is_cuda_space_v = std::is_same_v<Space, cuda_space>;

/// Short name of a space, for logs and benchmark names ("host", "cuda").
template <class Space>
constexpr const char* space_name() {
  return is_host_space_v<Space> ? "host" : "cuda";
}

/// Whether a CUDA device can be used by this process (false when built without CUDA).
bool cuda_device_available() noexcept;

}  // namespace embcache
