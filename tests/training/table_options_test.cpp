// table_slots: the one home of a table's default slots (capacity + capacity / 4), used by the
// training cache and the trainer's memory estimate; a capacity whose slots overflow is refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "embcache/training_cache.hpp"

namespace embcache {
namespace {

TEST(table_slots, default_slots_are_five_quarters_of_the_capacity) {
  std::uint64_t slots = 0;
  ASSERT_TRUE(table_slots(1000, 0, &slots));
  EXPECT_EQ(slots, 1250u);
  ASSERT_TRUE(table_slots(3, 0, &slots));
  EXPECT_EQ(slots, 3u);  // 3 / 4 is 0: never fewer slots than the capacity
}

TEST(table_slots, slots_asked_for_are_kept_but_never_below_the_capacity) {
  std::uint64_t slots = 0;
  ASSERT_TRUE(table_slots(1000, 4096, &slots));
  EXPECT_EQ(slots, 4096u);
  ASSERT_TRUE(table_slots(1000, 10, &slots));
  EXPECT_EQ(slots, 1000u);
}

TEST(table_slots, an_overflowing_sum_is_refused_and_leaves_the_output) {
  std::uint64_t slots = 7;
  EXPECT_FALSE(table_slots(std::numeric_limits<std::uint64_t>::max(), 0, &slots));
  EXPECT_EQ(slots, 7u);
}

TEST(table_slots, a_training_cache_refuses_a_capacity_whose_slots_overflow) {
  table_options<std::int64_t> t;
  t.name = "huge";
  t.dim = 4;
  t.capacity = std::numeric_limits<std::size_t>::max() / 4 * 4;
  try {
    training_cache<std::int64_t> tc({}, {t});
    FAIL() << "a capacity of " << t.capacity << " was accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), status_code::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("is too large"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace embcache
