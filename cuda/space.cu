// Memory and copies of the cuda space.
#include <cuda_runtime.h>

#include "embcache/buffer.hpp"
#include "embcache/cuda/algorithms.cuh"

namespace embcache::detail {

void* cuda_allocate(std::size_t bytes, CUstream_st* stream) {
  void* p = nullptr;
  EMBCACHE_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
  return p;
}

void cuda_deallocate(void* p, CUstream_st* stream) noexcept { (void)cudaFreeAsync(p, stream); }

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
  EMBCACHE_CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}

void cuda_deallocate_pinned(void* p) noexcept { (void)cudaFreeHost(p); }

}  // namespace embcache::detail
