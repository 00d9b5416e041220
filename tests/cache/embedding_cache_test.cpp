// Host-space conformance suite of the embedding cache, plus host-only concurrency and
// determinism tests.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "cache_conformance.hpp"
#include "common/status_assertions.hpp"
#include "embcache/detail/cuda_errors.hpp"
#include "embcache/status.hpp"

namespace embcache::testing {
namespace {

using host_cases =
    ::testing::Types<cache_case<std::int64_t, host_space>, cache_case<std::uint32_t, host_space>>;
INSTANTIATE_TYPED_TEST_SUITE_P(host, cache_conformance, host_cases);

std::vector<std::int64_t> shuffled_keys(std::size_t n, std::uint64_t seed) {
  std::vector<std::int64_t> k(n);
  for (std::size_t i = 0; i < n; ++i) k[i] = static_cast<std::int64_t>(i * 1000003 + 17);
  std::mt19937_64 g(seed);
  std::shuffle(k.begin(), k.end(), g);
  return k;
}

TEST(cache_host, rows_do_not_depend_on_batch_order_or_thread_count) {
  auto o = small_options(200000, 8, 8);
  o.init.kind = init_kind::normal;
  harness<std::int64_t, host_space> one(o, host_space{1});
  harness<std::int64_t, host_space> two(o, host_space{2});
  EMBCACHE_ASSERT_OK(one.find_or_insert(shuffled_keys(150000, 1)));
  // The second table gets the keys in another order, in smaller batches, on two threads.
  auto k2 = shuffled_keys(150000, 2);
  for (std::size_t i = 0; i < k2.size(); i += 10000)
    EMBCACHE_ASSERT_OK(two.find_or_insert({k2.begin() + i, k2.begin() + i + 10000}));
  auto a = one.export_rows();
  auto b = two.export_rows();
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.rows, b.rows);
}

TEST(cache_host, eviction_does_not_depend_on_thread_count) {
  auto o = small_options(4096, 2, 0);
  harness<std::int64_t, host_space> one(o, host_space{1});
  harness<std::int64_t, host_space> two(o, host_space{2});
  std::mt19937_64 g(5);
  for (int round = 0; round < 30; ++round) {
    std::vector<std::int64_t> keys(3000);
    for (auto& k : keys) k = static_cast<std::int64_t>(g() % 20000);
    auto a = one.insert_and_evict(keys);
    auto b = two.insert_and_evict(keys);
    ASSERT_EQ(a.st.code(), b.st.code());
    ASSERT_EQ(a.keys, b.keys) << "round " << round;
    ASSERT_EQ(a.slots, b.slots) << "round " << round;
  }
  EXPECT_EQ(one.export_rows().keys, two.export_rows().keys);
}

// find and lookup_slots run a software pipeline on the host that looks in the home bucket first
// and falls back to the full probe. In a full table many keys live past their home bucket; every
// answer must still be exactly find_slot's, in batches split across threads.
TEST(cache_host, pipelined_find_matches_find_slot_in_a_full_table) {
  auto o = small_options(8192, 3, 1);
  const auto resident = shuffled_keys(8192, 3);
  std::vector<std::int64_t> batch;
  for (int r = 0; r < 3; ++r) batch.insert(batch.end(), resident.begin(), resident.end());
  for (std::int64_t i = 0; i < 15000; ++i) batch.push_back(-7 - i * 31);  // never inserted
  std::shuffle(batch.begin(), batch.end(), std::mt19937_64(4));
  for (int threads : {1, 2}) {
    embedding_cache<std::int64_t, host_space> cache(o, host_space{threads});
    EMBCACHE_ASSERT_OK(cache.find_or_insert(resident.data(), resident.size(), nullptr, nullptr));
    ASSERT_EQ(cache.size(), 8192u);
    const auto t = cache.ref();
    std::size_t past_home = 0;
    for (auto k : resident)
      past_home +=
          static_cast<std::size_t>(t.find_slot(k)) / detail::cache_bucket_size != t.hash(k).home;
    EXPECT_GT(past_home, 100u);  // the fallback path is exercised

    const std::size_t n = batch.size(), w = cache.row_width();
    std::vector<float> rows(n * w, -1.0f);
    std::unique_ptr<bool[]> found(new bool[n]);
    std::vector<std::int64_t> slots(n, -2);
    cache.find(batch.data(), n, rows.data(), found.get());
    EMBCACHE_ASSERT_OK(cache.lookup_slots(batch.data(), n, slots.data()));
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t s = t.find_slot(batch[i]);
      ASSERT_EQ(slots[i], s) << "key " << batch[i] << ", threads " << threads;
      ASSERT_EQ(found[i], s >= 0) << "key " << batch[i];
      if (s >= 0)
        ASSERT_TRUE(std::equal(t.row(s), t.row(s) + w, rows.begin() + i * w)) << "key " << batch[i];
      else
        ASSERT_EQ(rows[i * w], -1.0f);  // rows of missing keys are left untouched
    }
  }
}

TEST(cache_host, many_host_threads_at_once) {
  auto o = small_options(1 << 17, 4, 0);
  embedding_cache<std::int64_t, host_space> cache(o);
  constexpr int threads = 8;
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 g(t);
      for (int round = 0; round < 20; ++round) {
        // Overlapping key ranges: every key is wanted by several threads.
        std::vector<std::int64_t> keys(2000);
        for (auto& k : keys) k = static_cast<std::int64_t>(g() % 50000);
        std::vector<float> rows(keys.size() * 4);
        if (!cache.find_or_insert(keys.data(), keys.size(), rows.data(), nullptr).ok()) ++failures;
        for (std::size_t i = 0; i < keys.size(); ++i) {
          auto e = expected_initial_row(o, keys[i]);
          if (!std::equal(e.begin(), e.end(), rows.begin() + i * 4)) ++failures;
        }
        std::vector<char> found(keys.size());
        cache.find(keys.data(), keys.size(), nullptr, reinterpret_cast<bool*>(found.data()));
        for (char f : found)
          if (!f) ++failures;
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto all = cache.export_to_host(export_filter::all()).value();
  EXPECT_EQ(all.keys.size(), cache.size());
  EXPECT_EQ(std::adjacent_find(all.keys.begin(), all.keys.end()), all.keys.end());  // no dupes
  EXPECT_GT(cache.size(), 40000u);
}

TEST(cache_host, bad_options_throw) {
  cache_options o;
  o.dim = 4;
  EXPECT_THROW((embedding_cache<std::int64_t, host_space>(o)), error);
  o.slots = 10;
  o.dim = 0;
  EXPECT_THROW((embedding_cache<std::int64_t, host_space>(o)), error);
}

// Running out of device memory is its own code, distinct from a full disk, and a failed CUDA
// allocation (cudaErrorMemoryAllocation) maps to it; other CUDA failures are internal.
TEST(cache_status, out_of_device_memory_is_its_own_code) {
  EXPECT_STREQ(to_string(status_code::out_of_device_memory), "out_of_device_memory");
  EXPECT_NE(status_code::out_of_device_memory, status_code::out_of_space);
  EXPECT_EQ(status::out_of_device_memory("x").code(), status_code::out_of_device_memory);
  EXPECT_EQ(detail::status_code_of_cuda_error(detail::cuda_error_memory_allocation),
            status_code::out_of_device_memory);
  EXPECT_EQ(detail::cuda_error_memory_allocation, 2);  // cudaErrorMemoryAllocation
  EXPECT_EQ(detail::status_code_of_cuda_error(1), status_code::internal);    // invalid value
  EXPECT_EQ(detail::status_code_of_cuda_error(700), status_code::internal);  // illegal address
  EXPECT_STREQ(to_string(status_code::internal), "internal");
  EXPECT_STREQ(to_string(static_cast<status_code>(200)), "unknown");
}

// A failed pinned host allocation (cudaMallocHost) is the host's memory running out, not the
// device's: its own code, and no other CUDA failure maps to it.
TEST(cache_status, out_of_pinned_host_memory_is_not_out_of_device_memory) {
  EXPECT_STREQ(to_string(status_code::out_of_host_memory), "out_of_host_memory");
  EXPECT_EQ(status::out_of_host_memory("x").code(), status_code::out_of_host_memory);
  EXPECT_EQ(detail::status_code_of_pinned_cuda_error(detail::cuda_error_memory_allocation),
            status_code::out_of_host_memory);
  EXPECT_EQ(detail::status_code_of_pinned_cuda_error(1), status_code::internal);
  EXPECT_EQ(detail::status_code_of_cuda_error(detail::cuda_error_memory_allocation),
            status_code::out_of_device_memory);
}

// export_filter says which of its two kinds it is; changed_since(v) takes only newer rows.
TEST(cache_status, export_filter_kinds) {
  constexpr auto all = export_filter::all();
  constexpr auto since = export_filter::changed_since(5);
  static_assert(!all.changed_only() && since.changed_only() && since.since() == 5);
  EXPECT_TRUE(all.passes(0));
  EXPECT_FALSE(since.passes(5));
  EXPECT_TRUE(since.passes(6));
  static_assert(!std::is_default_constructible_v<export_filter>);
}

}  // namespace
}  // namespace embcache::testing
