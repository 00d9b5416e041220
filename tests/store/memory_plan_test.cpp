// plan_memory: one budget split between the parts that cannot shrink and the tiers that can.
#include "embcache/memory_plan.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace embcache {
namespace {

constexpr std::uint64_t mib = std::uint64_t{1} << 20;

memory_plan_options three_families(std::uint64_t budget) {
  memory_plan_options o;
  o.budget_bytes = budget;
  o.cache_bytes = 100 * mib;
  o.staging_bytes = 50 * mib;
  o.other_bytes = 10 * mib;
  o.rocksdb_column_families = 3;  // two tables and the default column family
  return o;
}

TEST(memory_plan, splits_what_the_fixed_parts_and_the_reserve_leave) {
  auto p = plan_memory(three_families(1024 * mib));
  ASSERT_TRUE(p.ok()) << p.get_status().to_string();
  const memory_plan& m = p.value();
  EXPECT_EQ(m.reserve_bytes, 107374182u);  // 10% of 1 GiB, rounded down
  // The rest: 1073741824 - 107374182 - 160 MiB = 798595482; memtables 15% of it, 6 of them.
  EXPECT_EQ(m.max_write_buffers, 2);
  EXPECT_EQ(m.write_buffer_bytes, 119789322u / 6);
  EXPECT_EQ(m.memtable_bytes, 119789322u / 6 * 6);
  EXPECT_EQ(m.block_cache_bytes, 798595482u - m.memtable_bytes);
  EXPECT_EQ(m.dram_tier_bytes, 0u);
  EXPECT_EQ(m.row_cache_bytes, 0u);
  EXPECT_EQ(m.total_bytes(), 1024 * mib);

  rocksdb_store_options ro;
  apply_memory_plan(m, 2, ro);  // two databases share the block cache
  EXPECT_EQ(ro.block_cache_bytes, m.block_cache_bytes / 2);
  EXPECT_EQ(ro.write_buffer_bytes, m.write_buffer_bytes);
  EXPECT_EQ(ro.max_write_buffers, 2);
}

TEST(memory_plan, a_dram_tier_and_a_row_cache_take_their_shares) {
  memory_plan_options o = three_families(1024 * mib);
  o.dram_tier = true;
  o.row_cache = true;
  auto p = plan_memory(o);
  ASSERT_TRUE(p.ok()) << p.get_status().to_string();
  const memory_plan& m = p.value();
  EXPECT_EQ(m.dram_tier_bytes, 798595482u / 2);
  EXPECT_EQ(m.row_cache_bytes, 79859548u);
  EXPECT_EQ(m.memtable_bytes, 119789322u / 6 * 6);
  EXPECT_EQ(m.block_cache_bytes,
            798595482u - m.dram_tier_bytes - m.row_cache_bytes - m.memtable_bytes);
  EXPECT_LE(m.total_bytes(), o.budget_bytes);
  // Whatever the budget, the parts never add up to more than it, and every tier gets its least.
  for (std::uint64_t budget = 196 * mib; budget < 4096 * mib; budget = budget * 5 / 4) {
    o.budget_bytes = budget;
    p = plan_memory(o);
    ASSERT_TRUE(p.ok()) << budget << ": " << p.get_status().to_string();
    EXPECT_LE(p.value().total_bytes(), budget);
    EXPECT_GE(p.value().block_cache_bytes, min_block_cache_bytes);
    EXPECT_GE(p.value().write_buffer_bytes, min_write_buffer_bytes);
    EXPECT_GE(p.value().dram_tier_bytes, min_dram_tier_bytes);
    EXPECT_GE(p.value().row_cache_bytes, min_row_cache_bytes);
  }
}

TEST(memory_plan, a_budget_too_small_names_the_field_and_the_bytes_needed) {
  // Needed: (160 MiB + 8 MiB block cache + 6 memtables of 1 MiB) / 0.9, rounded up.
  auto p = plan_memory(three_families(100'000'000));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.get_status().code(), status_code::capacity_exceeded);
  EXPECT_EQ(p.get_status().message(),
            "memory_budget_bytes: 100000000 bytes is less than the 202724694 bytes needed "
            "(caches 104857600, staging 52428800, other 10485760, reserve 10%, RocksDB at least "
            "14680064)");
  EXPECT_FALSE(plan_memory(three_families(202724693)).ok());
  EXPECT_TRUE(plan_memory(three_families(202724694)).ok());
  // Without RocksDB only the fixed parts and the reserve count.
  memory_plan_options o = three_families(100'000'000);
  o.rocksdb_column_families = 0;
  o.field = "config.memory_budget_bytes";
  p = plan_memory(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.get_status().message(),
            "config.memory_budget_bytes: 100000000 bytes is less than the 186413512 bytes needed "
            "(caches 104857600, staging 52428800, other 10485760, reserve 10%)");
  o.budget_bytes = 186413512;
  ASSERT_TRUE(plan_memory(o).ok());
  EXPECT_EQ(plan_memory(o).value().block_cache_bytes, 0u);
  // No budget at all is too small too.
  o.budget_bytes = 0;
  EXPECT_EQ(plan_memory(o).get_status().code(), status_code::capacity_exceeded);
}

TEST(memory_plan, parts_past_64_bits_and_bad_shares_are_refused) {
  memory_plan_options o = three_families(std::numeric_limits<std::uint64_t>::max());
  o.cache_bytes = o.staging_bytes = std::numeric_limits<std::uint64_t>::max();
  auto p = plan_memory(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.get_status().message(),
            "memory_budget_bytes: the parts need more than 2^64 bytes (caches "
            "18446744073709551615, staging 18446744073709551615, other 10485760, reserve 10%, "
            "RocksDB at least 14680064)");
  o = three_families(1024 * mib);
  o.dram_tier = true;
  o.row_cache = true;
  o.dram_tier_percent = 80;
  p = plan_memory(o);
  EXPECT_EQ(p.get_status().code(), status_code::invalid_argument);
  EXPECT_EQ(p.get_status().message(),
            "memory_budget_bytes: the shares of the DRAM tier, the row cache and the memtables add "
            "up to 105%, more than 100%");
  o = three_families(1024 * mib);
  o.reserve_percent = 100;
  EXPECT_EQ(plan_memory(o).get_status().message(),
            "memory_budget_bytes: memory_plan_options::reserve_percent: expected a percentage in "
            "[0, 99], got 100");
  o = three_families(1024 * mib);
  o.max_write_buffers = 1;
  EXPECT_EQ(plan_memory(o).get_status().message(),
            "memory_budget_bytes: memory_plan_options::max_write_buffers: expected an integer in "
            "[2, 64], got 1");
}

// Under a budget, a large block freed goes back to the system, also after glibc would have raised
// its mapping threshold past it (its default after the first such free): each allocation of it
// is mapped anew, not taken from a heap that keeps it.
TEST(memory_plan, large_blocks_freed_go_back_to_the_system) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer's allocator replaces glibc's malloc";
#elif defined(__GLIBC__)
  ASSERT_TRUE(keep_allocator_within_budget());
  const std::size_t bytes = 2 * budget_allocator_threshold_bytes;
  for (int round = 0; round < 3; ++round) {
    const std::size_t before = ::mallinfo2().hblkhd;
    char* volatile p = static_cast<char*>(std::malloc(bytes));
    ASSERT_NE(p, nullptr);
    p[0] = p[bytes - 1] = 1;
    EXPECT_GE(::mallinfo2().hblkhd, before + bytes) << "round " << round;
    std::free(p);
    EXPECT_LT(::mallinfo2().hblkhd, before + bytes) << "round " << round;
  }
#else
  GTEST_SKIP() << "not glibc: keep_allocator_within_budget() has nothing to set";
#endif
}

}  // namespace
}  // namespace embcache
