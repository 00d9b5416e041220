// The cuda space's own failure paths (the rest of its behaviour is pinned by the typed suites).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "common/cuda_device.hpp"
#include "embcache/buffer.hpp"
#include "embcache/cuda/algorithms.cuh"

namespace embcache::testing {
namespace {

struct iota_fn {
  int* out;
  __device__ void operator()(std::size_t i) const { out[i] = int(i); }
};

// An out-of-memory the caller handles leaves no error behind: the next kernel launch's check
// (cudaGetLastError) must not report it as its own.
TEST(space_cuda, a_handled_out_of_memory_does_not_fail_the_next_launch) {
  EMBCACHE_NEED_CUDA_DEVICE();
  cuda_space sp;
  try {
    buffer<char, cuda_space> huge(std::size_t{1} << 52, sp);  // 4 PiB: more than any device
    FAIL() << "allocated 4 PiB";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), status_code::out_of_device_memory) << e.what();
  }
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  buffer<int, cuda_space> b(1000, sp);
  detail::for_each_index(sp, 1000, iota_fn{b.data()});  // threw the old error before
  EXPECT_EQ(detail::count_equal(sp, b.data(), 1000, 999), 1u);
  std::vector<int> h(1000);
  b.copy_to_host(h.data(), h.size());
  EXPECT_EQ(h[0], 0);
  EXPECT_EQ(h[999], 999);
}

}  // namespace
}  // namespace embcache::testing
