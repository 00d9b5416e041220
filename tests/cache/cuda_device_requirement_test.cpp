// The tests of the cuda space without a usable device: skipped normally, failed under
// EMBCACHE_REQUIRE_CUDA=1 (the GPU kit's runs), with the reason the runtime gave. Runs where no
// device is usable (the host build, or a machine without a GPU).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "common/cuda_device.hpp"

namespace embcache::testing {
namespace {

void need_device() { EMBCACHE_NEED_CUDA_DEVICE(); }

// What need_device() reports to gtest (into `results`), intercepted so this test itself is
// neither skipped nor failed by it.
void outcome_of_need_device(const char* require, ::testing::TestPartResultArray* results) {
  if (require) {
    ::setenv("EMBCACHE_REQUIRE_CUDA", require, 1);
  } else {
    ::unsetenv("EMBCACHE_REQUIRE_CUDA");
  }
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, results);
    need_device();
  }
  ::unsetenv("EMBCACHE_REQUIRE_CUDA");
}

class cuda_device_requirement : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_available()) GTEST_SKIP() << "a CUDA device is usable here";
  }
};

TEST_F(cuda_device_requirement, without_a_device_the_problem_is_named) {
  EXPECT_FALSE(cuda_device_problem().empty());
}

TEST_F(cuda_device_requirement, a_test_without_a_device_is_skipped_by_default) {
  ::testing::TestPartResultArray results;
  outcome_of_need_device(nullptr, &results);
  ASSERT_EQ(results.size(), 1);
  EXPECT_EQ(results.GetTestPartResult(0).type(), ::testing::TestPartResult::kSkip);
  EXPECT_NE(std::string(results.GetTestPartResult(0).message()).find(cuda_device_problem()),
            std::string::npos);
}

TEST_F(cuda_device_requirement, a_required_device_that_is_missing_fails_the_test) {
  ::testing::TestPartResultArray results;
  outcome_of_need_device("1", &results);
  ASSERT_EQ(results.size(), 1);
  EXPECT_EQ(results.GetTestPartResult(0).type(), ::testing::TestPartResult::kFatalFailure);
  const std::string message = results.GetTestPartResult(0).message();
  EXPECT_NE(message.find("EMBCACHE_REQUIRE_CUDA=1 but no usable CUDA device: "), std::string::npos)
      << message;
  EXPECT_NE(message.find(cuda_device_problem()), std::string::npos) << message;
}

TEST_F(cuda_device_requirement, only_the_value_1_requires_a_device) {
  ::testing::TestPartResultArray results;
  outcome_of_need_device("0", &results);
  ASSERT_EQ(results.size(), 1);
  EXPECT_EQ(results.GetTestPartResult(0).type(), ::testing::TestPartResult::kSkip);
}

}  // namespace
}  // namespace embcache::testing
