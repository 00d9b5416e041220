#include "embcache/space.hpp"

#if defined(EMBCACHE_WITH_CUDA_RUNTIME)
#include <cuda_runtime_api.h>
#endif

namespace embcache {

bool cuda_device_available() noexcept {
#if defined(EMBCACHE_WITH_CUDA_RUNTIME)
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
#else
  return false;
#endif
}

}  // namespace embcache
