// Memory and copies of the cuda space.
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "embcache/buffer.hpp"
#include "embcache/cuda/algorithms.cuh"

namespace embcache::detail {

namespace {
// Stream-ordered allocations come from the device's default pool. With its default release
// threshold (0) the pool hands memory back at every synchronization, and the bulk calls, which
// allocate scratch per call and synchronize before returning, would map fresh memory each time.
// Keep up to an eighth of the device's memory instead (once per device): enough for the scratch
// of a boundary to be reused, and finite, so that the pool's peak does not starve cudaMalloc's
// users (cuBLAS, other libraries) for the rest of the run.
void bound_pool_memory() {
  static std::mutex m;
  static std::uint64_t done = 0;  // bit per device
  int device = 0;
  EMBCACHE_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= 64) return;
  std::lock_guard<std::mutex> lock(m);
  if (done & (std::uint64_t{1} << device)) return;
  cudaMemPool_t pool;
  EMBCACHE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  std::size_t free = 0, total = 0;
  EMBCACHE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  std::uint64_t threshold = total / 8;
  EMBCACHE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  done |= std::uint64_t{1} << device;
}
}  // namespace

int cuda_current_device() {
  int device = 0;
  EMBCACHE_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void cuda_set_device(int device) { EMBCACHE_CUDA_CHECK(cudaSetDevice(device)); }

void* cuda_allocate(std::size_t bytes, CUstream_st* stream) {
  bound_pool_memory();
  void* p = nullptr;
  EMBCACHE_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
  return p;
}

// A failed release is ignored (nothing can be done about it here); its error is cleared so that
// no later check reports it as its own.
void cuda_deallocate(void* p, CUstream_st* stream) noexcept {
  if (cudaFreeAsync(p, stream) != cudaSuccess) (void)cudaGetLastError();
}

void cuda_copy(void* dst, const void* src, std::size_t bytes, CUstream_st* stream) {
  EMBCACHE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  // Copies from pageable host memory may return before the source was read; keep them safe.
  EMBCACHE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void cuda_memset(void* dst, int value, std::size_t bytes, CUstream_st* stream) {
  EMBCACHE_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream));
}

void cuda_synchronize(CUstream_st* stream) { EMBCACHE_CUDA_CHECK(cudaStreamSynchronize(stream)); }

void* cuda_allocate_pinned(std::size_t bytes) {
  void* p = nullptr;
  // Pinned memory is the host's: its exhaustion is out_of_host_memory, not the device's.
  EMBCACHE_CUDA_CHECK_AS(cudaMallocHost(&p, bytes), status_code_of_pinned_cuda_error);
  return p;
}

void cuda_deallocate_pinned(void* p) noexcept {
  if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace embcache::detail

namespace embcache {

cuda_device_guard::cuda_device_guard(int device) {
  previous_ = detail::cuda_current_device();
  if (previous_ == device) return;
  detail::cuda_set_device(device);
  changed_ = true;
}

cuda_device_guard::~cuda_device_guard() {
  if (changed_ && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
}

cuda_stream::cuda_stream() {
  cudaStream_t s = nullptr;
  EMBCACHE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
}

cuda_stream::~cuda_stream() {
  if (stream_ && cudaStreamDestroy(stream_) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace embcache
