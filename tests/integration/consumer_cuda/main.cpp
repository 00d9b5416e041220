// A program that wants only the device cache: it links embcache::cuda, which brings no trainer,
// BLAS or cuBLAS, and builds a cache in the cuda space when a device is present.
#include <cstdio>
#include <embcache/embcache.hpp>

int main() {
  embcache::cache_options o;
  o.slots = 1000;
  o.dim = 8;
  if (!embcache::cuda_device_available()) {
    std::printf("consumer_cuda ok: linked, no device\n");
    return 0;
  }
  embcache::embedding_cache<std::int64_t, embcache::cuda_space> cache(o, embcache::cuda_space{});
  std::printf("consumer_cuda ok: %zu slots on the device\n", cache.slots());
  return cache.slots() >= o.slots ? 0 : 1;
}
