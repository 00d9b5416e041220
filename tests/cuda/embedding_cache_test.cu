// cuda-space conformance suite of the embedding cache (skips without a device), and the check
// that both spaces produce the same rows.
#include "../cache/cache_conformance.hpp"

namespace embcache::testing {
namespace {

using cuda_cases =
    ::testing::Types<cache_case<std::int64_t, cuda_space>, cache_case<std::uint32_t, cuda_space>>;
INSTANTIATE_TYPED_TEST_SUITE_P(cuda, cache_conformance, cuda_cases);

TEST(cache_cuda, SameRowsAsTheHostSpace) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  for (init_kind kind : {init_kind::uniform, init_kind::normal}) {
    auto o = small_options(1 << 16, 16, 16);
    o.init.kind = kind;
    harness<std::int64_t, host_space> h(o);
    harness<std::int64_t, cuda_space> d(o);
    std::vector<std::int64_t> keys(50000);
    for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = std::int64_t(i) * 7777 - 100000;
    ASSERT_TRUE(h.find_or_insert(keys).ok());
    ASSERT_TRUE(d.find_or_insert(keys).ok());
    auto a = h.export_rows();
    auto b = d.export_rows();
    EXPECT_EQ(a.keys, b.keys);
    EXPECT_EQ(a.rows, b.rows);
  }
}

TEST(cache_cuda, EvictionMatchesTheHostSpace) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  auto o = small_options(4096, 2, 0);
  harness<std::int64_t, host_space> h(o);
  harness<std::int64_t, cuda_space> d(o);
  std::mt19937_64 g(5);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::int64_t> keys(3000);
    for (auto& k : keys) k = static_cast<std::int64_t>(g() % 20000);
    auto a = h.insert_and_evict(keys);
    auto b = d.insert_and_evict(keys);
    ASSERT_EQ(a.keys, b.keys) << "round " << round;
    ASSERT_EQ(a.slots, b.slots) << "round " << round;
  }
}

}  // namespace
}  // namespace embcache::testing
