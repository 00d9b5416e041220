// Key ownership and block assignment: pinned values (every sharded save depends on them),
// partitions that agree with owner_of, and balance.
#include "embcache/distributed/ownership.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "common/status_assertions.hpp"

namespace embcache {
namespace {

TEST(ownership_test, owner_of_is_pinned) {
  // murmur3_fmix64(key ^ 0x6f776e6572) % world, computed independently of the library.
  struct row {
    std::int64_t key;
    int owners[4];  // worlds 2, 3, 4, 7
  };
  const row rows[] = {{0, {1, 0, 3, 4}},
                      {1, {1, 1, 1, 5}},
                      {2, {1, 2, 3, 4}},
                      {12345, {1, 2, 1, 4}},
                      {-1, {0, 0, 0, 1}},
                      {std::numeric_limits<std::int64_t>::min(), {1, 2, 3, 1}},
                      {std::numeric_limits<std::int64_t>::max(), {0, 1, 0, 2}}};
  const int worlds[4] = {2, 3, 4, 7};
  for (const row& r : rows) {
    EXPECT_EQ(owner_of(r.key, 1), 0);
    for (int w = 0; w < 4; ++w)
      EXPECT_EQ(owner_of(r.key, worlds[w]), r.owners[w])
          << "key " << r.key << " world " << worlds[w];
  }
}

TEST(ownership_test, partitions_follow_owner_of_and_balance) {
  std::vector<std::int64_t> keys(100000);
  for (std::size_t i = 0; i < keys.size(); ++i)
    keys[i] = static_cast<std::int64_t>(i);  // dense ids
  const int world = 4;
  const auto parts = partition_by_owner(keys.data(), keys.size(), world);
  ASSERT_EQ(parts.size(), 4u);
  std::size_t total = 0;
  for (int r = 0; r < world; ++r) {
    const auto& p = parts[static_cast<std::size_t>(r)];
    total += p.size();
    EXPECT_NEAR(static_cast<double>(p.size()), 25000.0, 750.0) << "rank " << r;
    for (std::size_t i = 0; i < p.size(); ++i) {
      ASSERT_EQ(owner_of(p[i], world), r);
      if (i > 0) ASSERT_LT(p[i - 1], p[i]);  // a sorted keyset gives sorted parts
    }
    EXPECT_EQ(owned_part(keys.data(), keys.size(), r, world), p);
  }
  EXPECT_EQ(total, keys.size());
  const std::uint32_t small[3] = {5, 6, 7};
  EXPECT_EQ(owned_part(small, 3, 0, 1).size(), 3u);
}

TEST(ownership_test, blocks_split_evenly_or_fail) {
  auto b = blocks_of_rank(8, 3, 4);
  EMBCACHE_ASSERT_OK(b);
  EXPECT_EQ(b.value().first, 6u);
  EXPECT_EQ(b.value().count, 2u);
  EXPECT_EQ(blocks_of_rank(8, 0, 3).get_status().code(), status_code::invalid_argument);
  EXPECT_EQ(blocks_of_rank(0, 0, 1).get_status().code(), status_code::invalid_argument);
  EXPECT_EQ(blocks_of_rank(8, 4, 4).get_status().code(), status_code::invalid_argument);
  EXPECT_EQ(blocks_of_rank(8, -1, 4).get_status().code(), status_code::invalid_argument);
}

}  // namespace
}  // namespace embcache
