// Tests of the cuda space without a usable device: skipped, or failed where the run must use a
// device (EMBCACHE_REQUIRE_CUDA=1, as the GPU kit sets), so a run that could not run never looks
// green.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "embcache/space.hpp"

namespace embcache::testing {

/// Whether this run must use a CUDA device: EMBCACHE_REQUIRE_CUDA=1 in the environment.
inline bool cuda_device_required() {
  const char* v = std::getenv("EMBCACHE_REQUIRE_CUDA");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace embcache::testing

/// Skips the current test (returns from the enclosing void function) when no CUDA device can be
/// used, naming why; fails it instead under EMBCACHE_REQUIRE_CUDA=1. In SetUp, the test body then
/// does not run either way.
#define EMBCACHE_NEED_CUDA_DEVICE()                                                             \
  do {                                                                                          \
    const std::string embcache_why_ = ::embcache::cuda_device_problem();                        \
    if (!embcache_why_.empty()) {                                                               \
      if (::embcache::testing::cuda_device_required()) {                                        \
        GTEST_FAIL() << "EMBCACHE_REQUIRE_CUDA=1 but no usable CUDA device: " << embcache_why_; \
      } else {                                                                                  \
        GTEST_SKIP() << "no CUDA device: " << embcache_why_;                                    \
      }                                                                                         \
    }                                                                                           \
  } while (0)
