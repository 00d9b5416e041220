/// @file space.hpp
/// @brief Execution spaces: where data lives and where bulk operations run.
///
/// Every container and bulk operation is templated on a space. The same single-key code runs in
/// both; only the parallel loop, the allocator and the copies differ.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

struct CUstream_st;  // cudaStream_t without the CUDA headers

namespace embcache {

/// Host memory; bulk operations run on oneTBB's thread pool (Thrust's TBB system).
struct host_space {
  /// Most worker threads a bulk operation uses; 0 (default) = oneTBB's default (all cores).
  int max_threads = 0;
};

/// Device memory of a CUDA device; bulk operations run on `stream`. A cache of this space lives on
/// the device current when it is built and makes that device current in each of its calls.
/// Using it needs the embcache::cuda library and a CUDA-capable device.
struct cuda_space {
  /// Stream the operations are ordered on; nullptr (default) = the legacy default stream.
  CUstream_st* stream = nullptr;
};

/// A CUDA stream of its own, for a thread whose calls on a cache should not queue behind the
/// cache's stream (embedding_cache::order_calls_on). Created on the calling thread's current
/// device as a non-blocking stream (no implicit ordering with the legacy default stream, which
/// the default cuda_space uses), destroyed with the object once its work is done. Needs the
/// embcache::cuda library and a device: the constructor throws embcache::error otherwise.
class cuda_stream {
 public:
  cuda_stream();
  ~cuda_stream();
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;

  /// A cuda_space whose operations are ordered on this stream.
  cuda_space space() const noexcept { return cuda_space{stream_}; }

 private:
  CUstream_st* stream_ = nullptr;
};

/// Makes a CUDA device the calling thread's current device for the guard's lifetime, then makes
/// the device that was current before current again (cudaGetDevice / cudaSetDevice). A
/// cuda-space object that remembers the device it was built on holds one in each of its calls,
/// so that it runs there whatever the calling thread's current device is. Needs the
/// embcache::cuda library: the constructor throws embcache::error when `device` cannot be made
/// current; a failure to restore the previous device is ignored (and cleared).
class cuda_device_guard {
 public:
  explicit cuda_device_guard(int device);
  ~cuda_device_guard();
  cuda_device_guard(const cuda_device_guard&) = delete;
  cuda_device_guard& operator=(const cuda_device_guard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;  // false: `device` was already current, nothing to restore
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

/// Why no CUDA device can be used by this process, or "" when one can: the CUDA runtime's error
/// from cudaGetDeviceCount (its name and text, e.g. "cudaGetDeviceCount failed:
/// cudaErrorNoDevice (no CUDA-capable device is detected)"), "cudaGetDeviceCount found no
/// device", or "built without the CUDA runtime". For messages that must say why a run could not
/// use a device.
std::string cuda_device_problem();

}  // namespace embcache
