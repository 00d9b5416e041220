// The expiry cases every space runs (embcache/expiry.hpp), typed over the space: a row untouched
// for ttl_passes passes leaves the cache and the store at the right boundary and not one earlier
// (resident or already in the store, with and without a prefetch), a touched row stays, expired
// keys are tombstones of the next export, small embeddings expire with min_l2_norm, rows untouched
// for ttl_steps steps expire, and on-demand mode expires through expire(). Instantiated by
// tests/training/expiry_test.cpp (host space) and tests/cuda/expiry_test.cpp (cuda space, skipped
// without a device).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/cuda_device.hpp"
#include "common/status_assertions.hpp"
#include "embcache/json.hpp"
#include "embcache/training_cache.hpp"
#include "test_util.hpp"

namespace embcache::testing::expiry_suite {

using key_list = std::vector<std::int64_t>;
inline constexpr std::size_t dim = 2;

template <class Space>
std::unique_ptr<training_cache<std::int64_t, Space>> make_cache(
    std::size_t capacity, expiry_options expiry, cache_mode mode = cache_mode::keyset) {
  table_options<std::int64_t> o;
  o.name = "t";
  o.dim = dim;
  o.capacity = capacity;
  o.expiry = expiry;
  training_cache_options co;
  co.mode = mode;
  return std::make_unique<training_cache<std::int64_t, Space>>(co, std::vector{o});
}

// Touches `keys` (resident): their rows become a function of key and pass, with a new version.
template <class Space>
void touch(training_cache<std::int64_t, Space>& tc, const key_list& keys, int pass) {
  std::vector<float> rows;
  for (const auto k : keys) rows.insert(rows.end(), {float(k), float(pass)});
  EMBCACHE_ASSERT_OK(tc.assign(0, keys.data(), keys.size(), rows.data()));
}

// Whether `key` exists (resident or in the store).
template <class Space>
bool exists(training_cache<std::int64_t, Space>& tc, std::int64_t key) {
  float row[dim];
  bool found = false;
  EXPECT_TRUE(tc.read(0, &key, 1, row, &found).ok());
  return found;
}

// The passes of the rule: pass p begins `keysets()[p]` and touches every key of it.
inline const std::vector<key_list>& keysets() {
  static const std::vector<key_list> k = {{1, 2, 3}, {3, 4, 5, 6}, {2, 3}, {3}, {3}, {3}};
  return k;
}
// Rows expired at each boundary with ttl_passes 2: key 1 (last touched in pass 1) at boundary
// 4, keys 4..6 (pass 2) at 5, key 2 (pulled back and touched in pass 3) at 6.
inline const std::vector<std::uint64_t> expired_at = {0, 0, 0, 1, 3, 1};

template <class Space>
class expiry_cases : public ::testing::Test {
 protected:
  void SetUp() override {
    if constexpr (is_cuda_space_v<Space>) EMBCACHE_NEED_CUDA_DEVICE();
  }
};
TYPED_TEST_SUITE_P(expiry_cases);

// Capacity 4: leaving rows are evicted to the store; 8: they stay resident. With and without the
// next pass prefetched while this one trains.
TYPED_TEST_P(expiry_cases, untouched_rows_leave_at_the_right_boundary_as_tombstones) {
  const auto& ks = keysets();
  for (const std::size_t capacity : {4, 8}) {
    for (const bool prefetch : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "capacity " << capacity << ", prefetch " << prefetch);
      expiry_options e;
      e.ttl_passes = 2;
      auto tc = make_cache<TypeParam>(capacity, e);
      for (std::size_t p = 0; p < ks.size(); ++p) {
        EMBCACHE_ASSERT_OK(tc->begin_pass({ks[p]}));
        EXPECT_EQ(tc->counters().last[0].rows_expired, expired_at[p]) << "boundary " << p + 1;
        if (prefetch && p + 1 < ks.size()) EMBCACHE_ASSERT_OK(tc->prefetch({ks[p + 1]}));
        touch(*tc, ks[p], int(p + 1));
        auto d = tc->export_incremental();
        EMBCACHE_ASSERT_OK(d);
        const auto& erased = d.value()[0].erased;
        if (p == 2) {
          EXPECT_TRUE(erased.empty());
          EXPECT_TRUE(exists(*tc, 1)) << "key 1 must stay one more pass";
        }
        if (p == 3) {
          EXPECT_EQ(erased, key_list({1}));
          EXPECT_FALSE(exists(*tc, 1));
          EXPECT_TRUE(exists(*tc, 2));
        }
        if (p == 4) EXPECT_EQ(erased, key_list({4, 5, 6}));
        if (p == 5) EXPECT_EQ(erased, key_list({2}));
      }
      EXPECT_EQ(tc->counters().total[0].rows_expired, 5u);
      EMBCACHE_ASSERT_OK(tc->end_training());
      EXPECT_EQ(store_model(*tc, 0), (model<std::int64_t>{{3, {3.0f, 6.0f}}}));
      EXPECT_EQ(tc->cache(0).size(), 1u);
    }
  }
}

TYPED_TEST_P(expiry_cases, off_by_default_removes_nothing_and_counts_nothing_in_json) {
  auto tc = make_cache<TypeParam>(8, {});
  for (const auto& ks : keysets()) EMBCACHE_ASSERT_OK(tc->begin_pass({ks}));
  for (std::int64_t k = 1; k <= 6; ++k) EXPECT_TRUE(exists(*tc, k)) << k;
  EXPECT_FALSE(nlohmann::json(tc->counters().total[0]).contains("rows_expired"));
  table_counters c;
  c.rows_expired = 3;
  EXPECT_EQ(nlohmann::json(c).at("rows_expired"), 3);
}

TYPED_TEST_P(expiry_cases, rows_below_the_norm_expire_unless_in_the_keyset) {
  expiry_options e;
  e.min_l2_norm = 0.5f;
  auto tc = make_cache<TypeParam>(8, e);
  const key_list keys = {1, 2, 3};
  EMBCACHE_ASSERT_OK(tc->begin_pass({keys}));
  // Norms: key 1 0.1, key 2 exactly 0.5 (not below), key 3 0.3 but in the next keyset.
  const std::vector<float> rows = {0.1f, 0.0f, 0.3f, 0.4f, 0.0f, 0.3f};
  EMBCACHE_ASSERT_OK(tc->assign(0, keys.data(), 3, rows.data()));
  EMBCACHE_ASSERT_OK(tc->begin_pass({{3}}));
  EXPECT_EQ(tc->counters().last[0].rows_expired, 1u);
  EXPECT_FALSE(exists(*tc, 1));
  EXPECT_TRUE(exists(*tc, 2));
  EXPECT_TRUE(exists(*tc, 3));
  EMBCACHE_ASSERT_OK(tc->begin_pass({{2}}));
  EXPECT_FALSE(exists(*tc, 3));
  auto d = tc->export_incremental();
  EMBCACHE_ASSERT_OK(d);
  EXPECT_EQ(d.value()[0].erased, key_list({1, 3}));
}

// The prefetch worker chooses the next boundary's victims when every resident outside the next
// keyset leaves (host space). A row that expires at that boundary is no longer resident when the
// boundary evicts, so the boundary chooses again: the expired row is neither evicted nor written
// back, the other leaver is.
TYPED_TEST_P(expiry_cases, a_row_expiring_at_a_prefetched_boundary_is_not_evicted_as_well) {
  expiry_options e;
  e.min_l2_norm = 0.5f;
  auto tc = make_cache<TypeParam>(4, e);
  const key_list k1 = {1, 2, 3, 4}, k2 = {3, 4, 5, 6};
  EMBCACHE_ASSERT_OK(tc->begin_pass({k1}));
  // Norms: key 1 0.1 (expires at the next boundary), the others 1 or more; keys 1 and 2 leave.
  const std::vector<float> rows = {0.1f, 0.0f, 1.0f, 0.0f, 3.0f, 0.0f, 4.0f, 0.0f};
  EMBCACHE_ASSERT_OK(tc->assign(0, k1.data(), k1.size(), rows.data()));
  EMBCACHE_ASSERT_OK(tc->prefetch({k2}));
  EMBCACHE_ASSERT_OK(tc->begin_pass({k2}));
  const auto& c = tc->counters().last[0];
  EXPECT_EQ(c.rows_expired, 1u);
  EXPECT_EQ(c.rows_evicted, 1u);
  EXPECT_EQ(c.rows_pushed, 1u);
  EXPECT_EQ(c.rows_staged, 2u);
  EXPECT_EQ(tc->cache(0).size(), 4u);
  EXPECT_FALSE(exists(*tc, 1));
  EMBCACHE_ASSERT_OK(tc->end_training());
  const auto m = store_model(*tc, 0);
  EXPECT_EQ(m.count(1), 0u);
  ASSERT_EQ(m.count(2), 1u);
  EXPECT_EQ(m.at(2), (std::vector<float>{1.0f, 0.0f}));
}

TYPED_TEST_P(expiry_cases, on_demand_mode_expires_at_each_expire_call) {
  expiry_options e;
  e.ttl_passes = 1;
  auto tc = make_cache<TypeParam>(8, e, cache_mode::on_demand);
  const key_list ab = {1, 2}, b = {2};
  std::int64_t slots[2];
  EMBCACHE_ASSERT_OK(tc->lookup(0, ab.data(), 2, slots));
  touch(*tc, ab, 0);
  EMBCACHE_ASSERT_OK(tc->expire());  // boundary 1: records the clock only
  EXPECT_EQ(tc->counters().last[0].rows_expired, 0u);
  EMBCACHE_ASSERT_OK(tc->lookup(0, b.data(), 1, slots));
  touch(*tc, b, 1);
  EMBCACHE_ASSERT_OK(tc->expire());  // boundary 2: key 1 untouched in pass 1
  EXPECT_EQ(tc->counters().last[0].rows_expired, 1u);
  EXPECT_FALSE(exists(*tc, 1));
  EXPECT_TRUE(exists(*tc, 2));
  auto keyset_cache = make_cache<TypeParam>(8, e);
  EXPECT_THROW((void)keyset_cache->expire(), error);
}

// The steps of the ttl_steps rule: a pass per keyset, each step touching some of its keys
// (begin_step then touch). Key 6 is never touched after its row is made.
struct step_plan {
  key_list keyset;
  std::vector<key_list> steps;
};
inline const std::vector<step_plan>& step_plans() {
  static const std::vector<step_plan> p = {
      {{1, 2, 3, 4, 6}, {{1, 2}, {3}, {4}}}, {{5}, {{5}, {5}}}, {{5}, {{5}}}};
  return p;
}

// ttl_steps 2: at boundary 2 (after 3 steps) keys 1, 2 (touched in step 1) and 6 (never) have not
// been touched in steps 2-3 and go; at boundary 3 (5 steps) keys 3 (step 2) and 4 (step 3) go; a
// key of the keyset being begun stays. Each boundary's removals are the next export's tombstones.
TYPED_TEST_P(expiry_cases, rows_untouched_for_ttl_steps_leave_at_the_next_boundary) {
  for (const cache_mode mode : {cache_mode::keyset, cache_mode::on_demand}) {
    SCOPED_TRACE(mode == cache_mode::keyset ? "keyset" : "on_demand");
    expiry_options e;
    e.ttl_steps = 2;
    auto tc = make_cache<TypeParam>(8, e, mode);
    const std::vector<key_list> erased = {{}, {1, 2, 6}, {3, 4}};
    const std::vector<std::uint64_t> steps = {0, 3, 5};
    for (std::size_t p = 0; p < step_plans().size(); ++p) {
      const step_plan& plan = step_plans()[p];
      if (mode == cache_mode::keyset) {
        EMBCACHE_ASSERT_OK(tc->begin_pass({plan.keyset}));
      } else {
        EMBCACHE_ASSERT_OK(tc->expire());
      }
      EXPECT_EQ(tc->counters().last[0].rows_expired, erased[p].size()) << "boundary " << p + 1;
      if (mode == cache_mode::on_demand) {
        std::vector<std::int64_t> slots(plan.keyset.size());
        EMBCACHE_ASSERT_OK(tc->lookup(0, plan.keyset.data(), plan.keyset.size(), slots.data()));
      }
      EXPECT_EQ(tc->expiry_state(0).steps, steps[p]);
      auto d = tc->export_incremental();
      EMBCACHE_ASSERT_OK(d);
      EXPECT_EQ(d.value()[0].erased, erased[p]) << "boundary " << p + 1;
      for (const auto k : erased[p]) EXPECT_FALSE(exists(*tc, k)) << k;
      for (const auto& keys : plan.steps) {
        tc->begin_step();
        touch(*tc, keys, int(p + 1));
      }
    }
    EXPECT_TRUE(exists(*tc, 5));
    // The clock keeps the last ttl_steps step values.
    EXPECT_EQ(tc->expiry_state(0).step_versions.size(), 2u);
  }
}

REGISTER_TYPED_TEST_SUITE_P(expiry_cases, untouched_rows_leave_at_the_right_boundary_as_tombstones,
                            off_by_default_removes_nothing_and_counts_nothing_in_json,
                            rows_below_the_norm_expire_unless_in_the_keyset,
                            a_row_expiring_at_a_prefetched_boundary_is_not_evicted_as_well,
                            on_demand_mode_expires_at_each_expire_call,
                            rows_untouched_for_ttl_steps_leave_at_the_next_boundary);

}  // namespace embcache::testing::expiry_suite
