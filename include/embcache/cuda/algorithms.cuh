/// @file cuda/algorithms.cuh
/// @brief Bulk primitives of the cuda space: kernels launched on the space's stream, and Thrust's
/// CUDA system with an explicit policy.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <thrust/count.h>
#include <thrust/execution_policy.h>
#include <thrust/reduce.h>
#include <thrust/scan.h>
#include <thrust/sort.h>
#include <thrust/system/cuda/error.h>
#include <thrust/system_error.h>

#include <cstddef>
#include <limits>
#include <new>
#include <string>
#include <type_traits>

#include "embcache/buffer.hpp"
#include "embcache/detail/cuda_errors.hpp"
#include "embcache/space.hpp"
#include "embcache/status.hpp"

static_assert(cudaErrorMemoryAllocation == ::embcache::detail::cuda_error_memory_allocation,
              "detail/cuda_errors.hpp disagrees with the CUDA runtime");

/// Throws embcache::error naming the call, the file and the line when a CUDA call fails:
/// out_of_device_memory when the device's memory is exhausted, internal otherwise. The runtime's
/// last error is cleared first (cudaGetLastError): a handled failure, such as an out-of-memory the
/// caller reports as a status, must not resurface at the next launch check.
#define EMBCACHE_CUDA_CHECK(call) \
  EMBCACHE_CUDA_CHECK_AS(call, ::embcache::detail::status_code_of_cuda_error)

/// EMBCACHE_CUDA_CHECK with the status code chosen by `code_of` (a function of the cudaError_t
/// as int), for calls whose out-of-memory is not the device's (cudaMallocHost).
#define EMBCACHE_CUDA_CHECK_AS(call, code_of)                                                  \
  do {                                                                                         \
    cudaError_t _embcache_e = (call);                                                          \
    if (_embcache_e != cudaSuccess) {                                                          \
      (void)cudaGetLastError();                                                                \
      throw ::embcache::error(code_of(int(_embcache_e)), std::string(#call) + " failed at " +  \
                                                             __FILE__ + ":" +                  \
                                                             std::to_string(__LINE__) + ": " + \
                                                             cudaGetErrorString(_embcache_e)); \
    }                                                                                          \
  } while (0)

namespace embcache::detail {

/// Runs a Thrust call `f` (named `what` in messages), turning Thrust's exceptions into
/// embcache::error: a failed temporary allocation (thrust's bad_alloc, a std::bad_alloc) or a
/// CUDA out-of-memory error is out_of_device_memory; any other CUDA error is internal.
template <class F>
decltype(auto) thrust_call(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc& e) {
    (void)cudaGetLastError();  // handled here: no later check may report it again
    throw error(status_code::out_of_device_memory,
                std::string(what) + ": out of device memory: " + e.what());
  } catch (const thrust::system_error& e) {
    (void)cudaGetLastError();
    const bool cuda = e.code().category() == thrust::cuda_category();
    throw error(cuda ? status_code_of_cuda_error(e.code().value()) : status_code::internal,
                std::string(what) + ": " + e.what());
  }
}

/// Thrust's scratch from the space's stream-ordered pool (cudaMallocAsync/cudaFreeAsync on the
/// space's stream, as every buffer of the space). Without it Thrust takes scratch with
/// cudaMalloc/cudaFree, and cudaFree synchronizes the whole device: the prefetch worker's stream
/// would then overlap nothing. Its failure is embcache::error (out_of_device_memory).
struct stream_scratch {
  using value_type = char;
  CUstream_st* stream = nullptr;
  char* allocate(std::ptrdiff_t n) {
    return static_cast<char*>(cuda_allocate(static_cast<std::size_t>(n), stream));
  }
  void deallocate(char* p, std::size_t) noexcept { cuda_deallocate(p, stream); }
};

/// The one Thrust policy of the cuda space: ordered on the space's stream, no synchronization
/// Thrust could skip, scratch from stream_scratch. Every Thrust call of the space uses it (a
/// ctest step, cuda_objects_take_no_cudamalloc, checks that no object file links cudaMalloc or
/// cudaFree).
inline auto thrust_policy(const cuda_space& space) {
  return thrust::cuda::par_nosync(stream_scratch{space.stream}).on(space.stream);
}

template <class F>
__global__ void for_each_index_kernel(std::size_t n, F f) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

// A tile of F::lanes_per_index lanes per index: every lane of a tile calls f.lanes(i, tile) with
// the same i, so the tile's collectives (ballot, shuffle, sync) are safe in it; tiles of one warp
// may take different paths.
template <class F>
__global__ void for_each_index_tile_kernel(std::size_t n, F f) {
  constexpr unsigned lanes = F::lanes_per_index;
  const auto tile =
      cooperative_groups::tiled_partition<lanes>(cooperative_groups::this_thread_block());
  const std::size_t tiles = (std::size_t(gridDim.x) * blockDim.x) / lanes;
  for (std::size_t i = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) / lanes; i < n;
       i += tiles)
    f.lanes(i, tile);
}

/// Whether a loop body asks for several lanes per index (`static constexpr unsigned
/// lanes_per_index`, a power of two up to 32, with a `__device__ lanes(i, tile)` doing the work
/// of `f(i)` cooperatively on a cooperative_groups tile of that size).
template <class F, class = void>
struct lanes_per_index : std::integral_constant<unsigned, 1> {};
template <class F>
struct lanes_per_index<F, std::enable_if_t<(F::lanes_per_index > 1)>>
    : std::integral_constant<unsigned, F::lanes_per_index> {};

/// Calls `f(i)` for every i in [0, n) on the space's stream (asynchronous); a body with
/// `lanes_per_index` gets a tile of that many lanes per index instead.
template <class F>
void for_each_index(const cuda_space& space, std::size_t n, const F& f) {
  if (n == 0) return;
  constexpr int block = 256;
  constexpr std::size_t max_grid = 65535u * 32u;
  constexpr std::size_t threads_per_index = lanes_per_index<F>::value;
  static_assert(block % threads_per_index == 0 && threads_per_index <= 32,
                "lanes_per_index: a power of two up to 32");
  const std::size_t blocks = (n * threads_per_index + block - 1) / block;
  const unsigned grid = static_cast<unsigned>(blocks < max_grid ? blocks : max_grid);
  if constexpr (threads_per_index > 1)
    for_each_index_tile_kernel<<<grid, block, 0, space.stream>>>(n, f);
  else
    for_each_index_kernel<<<grid, block, 0, space.stream>>>(n, f);
  EMBCACHE_CUDA_CHECK(cudaGetLastError());
}

/// Stable sort of `values` by `keys` (device pointers) on the space's stream.
template <class K, class V>
void stable_sort_by_key(const cuda_space& space, K* keys, V* values, std::size_t n) {
  if (n < 2) return;
  thrust_call("thrust::stable_sort_by_key",
              [&] { thrust::stable_sort_by_key(thrust_policy(space), keys, keys + n, values); });
}

/// Sort of `keys` (device pointer) on the space's stream.
template <class K>
void sort(const cuda_space& space, K* keys, std::size_t n) {
  if (n < 2) return;
  thrust_call("thrust::sort", [&] { thrust::sort(thrust_policy(space), keys, keys + n); });
}

/// out[i] = sum of in[0..i) (exclusive prefix sum) on the space's stream.
template <class T, class U>
void exclusive_scan(const cuda_space& space, const T* in, U* out, std::size_t n) {
  if (n == 0) return;
  thrust_call("thrust::exclusive_scan",
              [&] { thrust::exclusive_scan(thrust_policy(space), in, in + n, out, U{0}); });
}

/// Number of elements of `in` (device memory) equal to `value`; synchronizes the stream.
template <class T>
std::size_t count_equal(const cuda_space& space, const T* in, std::size_t n, T value) {
  if (n == 0) return 0;
  return thrust_call("thrust::count", [&]() -> std::size_t {
    return thrust::count(thrust_policy(space), in, in + n, value);
  });
}

template <class T>
struct larger_fn {
  __host__ __device__ T operator()(const T& a, const T& b) const { return a < b ? b : a; }
};

/// Largest element of `in` (device memory, n > 0); synchronizes the stream.
template <class T>
T max_value(const cuda_space& space, const T* in, std::size_t n) {
  return thrust_call("thrust::reduce", [&]() -> T {
    return thrust::reduce(thrust_policy(space), in, in + n, std::numeric_limits<T>::lowest(),
                          larger_fn<T>{});
  });
}

/// Exclusive prefix sum of `in` into `out` (device pointers, length n each; they may be the same)
/// on the space's stream.
template <class T>
void exclusive_scan(const cuda_space& space, const T* in, T* out, std::size_t n) {
  if (n == 0) return;
  thrust_call("thrust::exclusive_scan",
              [&] { thrust::exclusive_scan(thrust_policy(space), in, in + n, out); });
}

}  // namespace embcache::detail
