// The expiry cases (tests/training/expiry_suite.hpp) in the cuda space: the same boundaries,
// tombstones and norms as the host space; every case skips itself without a usable CUDA device.
#include "../training/expiry_suite.hpp"

namespace embcache::testing::expiry_suite {
namespace {

INSTANTIATE_TYPED_TEST_SUITE_P(cuda, expiry_cases, ::testing::Types<cuda_space>);

}  // namespace
}  // namespace embcache::testing::expiry_suite
