// The training-cache suite (tests/training/training_cache_suite.hpp) in the cuda space: every
// case skips itself without a usable CUDA device. The suite's script cases compare the cuda space
// with the host space (exports, stores, saved model). Plus the one cuda-only case: without a
// device, construction is refused clearly.
#include <string>

#include "../training/training_cache_suite.hpp"

namespace embcache::testing::training_suite {
namespace {

INSTANTIATE_TYPED_TEST_SUITE_P(training_cache_cuda, stores, store_cases<cuda_space>);
INSTANTIATE_TYPED_TEST_SUITE_P(training_cache_cuda, conformance, ::testing::Types<cuda_space>);

TEST(training_cache_cuda, without_a_device_construction_is_refused_clearly) {
  if (cuda_device_available()) GTEST_SKIP() << "a CUDA device is present";
  try {
    make_script_cache<std::int64_t, cuda_space>(cache_mode::keyset, 10);
    FAIL() << "constructed without a device";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), status_code::unsupported);
    EXPECT_NE(std::string(e.what()).find("CUDA device"), std::string::npos);
  }
}

}  // namespace
}  // namespace embcache::testing::training_suite
