// cuda-space conformance suite of the embedding cache (skips without a device), and the check
// that both spaces produce the same rows.
#include "../cache/cache_conformance.hpp"
#include "common/status_assertions.hpp"

namespace embcache::testing {
namespace {

using cuda_cases =
    ::testing::Types<cache_case<std::int64_t, cuda_space>, cache_case<std::uint32_t, cuda_space>>;
INSTANTIATE_TYPED_TEST_SUITE_P(cuda, cache_conformance, cuda_cases);

TEST(cache_cuda, same_rows_as_the_host_space) {
  EMBCACHE_NEED_CUDA_DEVICE();
  for (init_kind kind : {init_kind::uniform, init_kind::normal}) {
    auto o = small_options(1 << 16, 16, 16);
    o.init.kind = kind;
    harness<std::int64_t, host_space> h(o);
    harness<std::int64_t, cuda_space> d(o);
    std::vector<std::int64_t> keys(50000);
    for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = std::int64_t(i) * 7777 - 100000;
    EMBCACHE_ASSERT_OK(h.find_or_insert(keys));
    EMBCACHE_ASSERT_OK(d.find_or_insert(keys));
    auto a = h.export_rows();
    auto b = d.export_rows();
    EXPECT_EQ(a.keys, b.keys);
    EXPECT_EQ(a.rows, b.rows);
  }
}

// The cuda space finds keys with a tile of lanes per key (tile_find_slot); the host space runs the
// portable find_slot. In a full table (many keys past their home bucket) both must answer alike.
TEST(cache_cuda, tile_find_matches_the_host_space_in_a_full_table) {
  EMBCACHE_NEED_CUDA_DEVICE();
  auto o = small_options(8192, 37, 3);  // a row width that is not a multiple of 32
  harness<std::int64_t, host_space> h(o);
  harness<std::int64_t, cuda_space> d(o);
  std::vector<std::int64_t> resident(8192), batch;
  for (std::size_t i = 0; i < resident.size(); ++i)
    resident[i] = static_cast<std::int64_t>(i) * 1000003 + 17;
  EMBCACHE_ASSERT_OK(h.find_or_insert(resident));
  EMBCACHE_ASSERT_OK(d.find_or_insert(resident));
  ASSERT_EQ(d.cache.size(), 8192u);
  for (int r = 0; r < 2; ++r) batch.insert(batch.end(), resident.begin(), resident.end());
  for (std::int64_t i = 0; i < 9000; ++i) batch.push_back(-7 - i * 31);  // never inserted
  std::shuffle(batch.begin(), batch.end(), std::mt19937_64(4));
  auto a = h.find(batch);
  auto b = d.find(batch);
  ASSERT_EQ(a.found, b.found);
  const std::size_t w = d.cache.row_width();
  for (std::size_t i = 0; i < batch.size(); ++i)
    if (a.found[i])  // rows of missing keys are left untouched (uninitialized here)
      ASSERT_TRUE(
          std::equal(a.rows.begin() + i * w, a.rows.begin() + (i + 1) * w, b.rows.begin() + i * w))
          << "key " << batch[i];
  const auto hs = h.slots(batch);
  const auto ds = d.slots(batch);
  for (std::size_t i = 0; i < batch.size(); ++i)
    ASSERT_EQ(hs[i] < 0, ds[i] < 0) << "key " << batch[i];
  // The device's slots hold the keys' rows.
  std::vector<std::int64_t> found_slots;
  std::vector<float> expect;
  for (std::size_t i = 0; i < batch.size(); ++i)
    if (ds[i] >= 0) {
      found_slots.push_back(ds[i]);
      expect.insert(expect.end(), a.rows.begin() + i * w, a.rows.begin() + (i + 1) * w);
    }
  EXPECT_EQ(d.read_slots(found_slots), expect);
}

TEST(cache_cuda, eviction_matches_the_host_space) {
  EMBCACHE_NEED_CUDA_DEVICE();
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
