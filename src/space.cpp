#include "embcache/space.hpp"

#if defined(EMBCACHE_WITH_CUDA_RUNTIME)
#include <cuda_runtime_api.h>
#endif

namespace embcache {

std::string cuda_device_problem() {
#if defined(EMBCACHE_WITH_CUDA_RUNTIME)
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    // Keep the runtime's reason (no driver, driver older than the runtime, no device...): a run
    // that needs a device must say why it had none. Clear the error so no later check sees it.
    (void)cudaGetLastError();
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(e) + " (" +
           cudaGetErrorString(e) + ")";
  }
  if (count <= 0) return "cudaGetDeviceCount found no device";
  return {};
#else
  return "built without the CUDA runtime";
#endif
}

bool cuda_device_available() noexcept {
  try {
    return cuda_device_problem().empty();
  } catch (...) {  // only an allocation of the message can throw
    return false;
  }
}

}  // namespace embcache
