// One device per cache: a cuda-space cache and the cuda dense backend work on the device that was
// current when they were built, whatever the calling thread's current device is, and leave the
// caller's device current. Needs two devices; skips (listed by the GPU kit) with fewer.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/cuda_device.hpp"
#include "common/status_assertions.hpp"
#include "embcache/buffer.hpp"
#include "embcache/embedding_cache.hpp"

namespace embcache::testing {
namespace {

/// Skips the current test when fewer than `n` CUDA devices can be used (after
/// EMBCACHE_NEED_CUDA_DEVICE, which fails it under EMBCACHE_REQUIRE_CUDA=1 without any).
#define EMBCACHE_NEED_CUDA_DEVICES(n)                                                  \
  do {                                                                                 \
    EMBCACHE_NEED_CUDA_DEVICE();                                                       \
    int embcache_count_ = 0;                                                           \
    if (cudaGetDeviceCount(&embcache_count_) != cudaSuccess) (void)cudaGetLastError(); \
    if (embcache_count_ < (n))                                                         \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, found " << embcache_count_;   \
  } while (0)

int current_device() {
  int d = -1;
  EXPECT_EQ(cudaGetDevice(&d), cudaSuccess);
  return d;
}

int device_of(const void* p) {
  cudaPointerAttributes a{};
  EXPECT_EQ(cudaPointerGetAttributes(&a, p), cudaSuccess);
  return a.device;
}

TEST(several_devices_cuda, device_guard_restores_the_previous_device) {
  EMBCACHE_NEED_CUDA_DEVICES(2);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  {
    const cuda_device_guard g(1);
    EXPECT_EQ(current_device(), 1);
    {
      const cuda_device_guard same(1);
      EXPECT_EQ(current_device(), 1);
    }
    EXPECT_EQ(current_device(), 1);
  }
  EXPECT_EQ(current_device(), 0);
}

TEST(several_devices_cuda, a_cache_works_on_its_own_device_from_another_current_device) {
  EMBCACHE_NEED_CUDA_DEVICES(2);
  cache_options o;
  o.slots = 4096;
  o.dim = 8;
  o.state_width = 0;
  o.init.seed = 42;
  std::vector<std::int64_t> keys(1000);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = std::int64_t(i) * 977 - 3;
  const std::size_t w = o.dim;

  embedding_cache<std::int64_t, host_space> host(o);
  std::vector<float> expected(keys.size() * w);
  std::unique_ptr<bool[]> host_inserted(new bool[keys.size()]);
  EMBCACHE_ASSERT_OK(
      host.find_or_insert(keys.data(), keys.size(), expected.data(), host_inserted.get()));

  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  std::unique_ptr<embedding_cache<std::int64_t, cuda_space>> cache;
  std::vector<float> rows(keys.size() * w);
  {
    const cuda_device_guard on_one(1);
    cache = std::make_unique<embedding_cache<std::int64_t, cuda_space>>(o);
    EXPECT_EQ(cache->device(), 1);
    EXPECT_EQ(device_of(cache->ref().states), 1);
    // The call's arrays are the cache's device's memory, as the bulk calls require.
    buffer<std::int64_t, cuda_space> d_keys(keys.size());
    buffer<float, cuda_space> d_rows(rows.size());
    buffer<bool, cuda_space> d_inserted(keys.size());
    d_keys.copy_from_host(keys.data(), keys.size());
    {
      const cuda_device_guard on_zero(0);
      EMBCACHE_ASSERT_OK(
          cache->find_or_insert(d_keys.data(), keys.size(), d_rows.data(), d_inserted.data()));
      EXPECT_EQ(current_device(), 0);  // the caller's device is current again
    }
    EXPECT_EQ(cache->size(), keys.size());
    d_rows.copy_to_host(rows.data(), rows.size());
  }  // the buffers go back on device 1, then device 0 is current again
  EXPECT_EQ(rows, expected);
  EXPECT_EQ(current_device(), 0);
  cache.reset();  // frees on device 1 while device 0 is current
  EXPECT_EQ(current_device(), 0);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
}

}  // namespace
}  // namespace embcache::testing
