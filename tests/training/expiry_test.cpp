// Expiry (embcache/expiry.hpp): a row untouched for ttl_passes passes leaves the cache and the
// store at the right boundary and not one earlier, a touched row stays, expired keys are
// tombstones of the next export, small embeddings expire with min_l2_norm, on-demand mode expires
// through expire(), and the expiry clock survives save/load bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status_assertions.hpp"
#include "embcache/json.hpp"
#include "embcache/training_cache.hpp"
#include "test_util.hpp"

namespace embcache::testing {
namespace {

using key_list = std::vector<std::int64_t>;
constexpr std::size_t dim = 2;

struct expiry_case {
  std::size_t capacity;  // 4: leaving rows are evicted to the store; 8: they stay resident
  bool prefetch;         // the next pass is prefetched while this one trains
};

std::unique_ptr<training_cache<std::int64_t>> make_cache(std::size_t capacity,
                                                         expiry_options expiry,
                                                         cache_mode mode = cache_mode::keyset) {
  table_options<std::int64_t> o;
  o.name = "t";
  o.dim = dim;
  o.capacity = capacity;
  o.expiry = expiry;
  training_cache_options co;
  co.mode = mode;
  return std::make_unique<training_cache<std::int64_t>>(co, std::vector{o});
}

// Touches `keys` (resident): their rows become a function of key and pass, with a new version.
void touch(training_cache<std::int64_t>& tc, const key_list& keys, int pass) {
  std::vector<float> rows;
  for (const auto k : keys) rows.insert(rows.end(), {float(k), float(pass)});
  EMBCACHE_ASSERT_OK(tc.assign(0, keys.data(), keys.size(), rows.data()));
}

// Whether `key` exists (resident or in the store).
bool exists(training_cache<std::int64_t>& tc, std::int64_t key) {
  float row[dim];
  bool found = false;
  EXPECT_TRUE(tc.read(0, &key, 1, row, &found).ok());
  return found;
}

// The passes of expiry_rule: pass p begins `keysets[p]` and touches every key of it.
const std::vector<key_list> keysets = {{1, 2, 3}, {3, 4, 5, 6}, {2, 3}, {3}, {3}, {3}};
// Rows expired at each boundary with ttl_passes 2: key 1 (last touched in pass 1) at boundary
// 4, keys 4..6 (pass 2) at 5, key 2 (pulled back and touched in pass 3) at 6.
const std::vector<std::uint64_t> expired_at = {0, 0, 0, 1, 3, 1};

class expiry_rule : public ::testing::TestWithParam<expiry_case> {};

TEST_P(expiry_rule, untouched_rows_leave_at_the_right_boundary_as_tombstones) {
  expiry_options e;
  e.ttl_passes = 2;
  auto tc = make_cache(GetParam().capacity, e);
  for (std::size_t p = 0; p < keysets.size(); ++p) {
    EMBCACHE_ASSERT_OK(tc->begin_pass({keysets[p]}));
    EXPECT_EQ(tc->counters().last[0].rows_expired, expired_at[p]) << "boundary " << p + 1;
    if (GetParam().prefetch && p + 1 < keysets.size())
      EMBCACHE_ASSERT_OK(tc->prefetch({keysets[p + 1]}));
    touch(*tc, keysets[p], int(p + 1));
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

INSTANTIATE_TEST_SUITE_P(resident_or_stored, expiry_rule,
                         ::testing::Values(expiry_case{4, false}, expiry_case{8, false},
                                           expiry_case{4, true}, expiry_case{8, true}));

TEST(expiry, off_by_default_removes_nothing_and_counts_nothing_in_json) {
  auto tc = make_cache(8, {});
  for (const auto& ks : keysets) EMBCACHE_ASSERT_OK(tc->begin_pass({ks}));
  for (std::int64_t k = 1; k <= 6; ++k) EXPECT_TRUE(exists(*tc, k)) << k;
  EXPECT_FALSE(nlohmann::json(tc->counters().total[0]).contains("rows_expired"));
  table_counters c;
  c.rows_expired = 3;
  EXPECT_EQ(nlohmann::json(c).at("rows_expired"), 3);
}

TEST(expiry, rows_below_the_norm_expire_unless_in_the_keyset) {
  expiry_options e;
  e.min_l2_norm = 0.5f;
  auto tc = make_cache(8, e);
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

TEST(expiry, on_demand_mode_expires_at_each_expire_call) {
  expiry_options e;
  e.ttl_passes = 1;
  auto tc = make_cache(8, e, cache_mode::on_demand);
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
  auto keyset_cache = make_cache(8, e);
  EXPECT_THROW((void)keyset_cache->expire(), error);
}

TEST(expiry, a_negative_or_nan_norm_is_refused) {
  for (const float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    expiry_options e;
    e.min_l2_norm = bad;
    EXPECT_THROW(make_cache(8, e), error) << bad;
  }
}

// The model and the expired counts of passes `from`..end of keysets, given a cache at `from`.
struct run_result {
  std::vector<std::uint64_t> expired;
  model<std::int64_t> rows;
  key_list erased;
};
run_result finish_run(training_cache<std::int64_t>& tc, std::size_t from) {
  run_result r;
  for (std::size_t p = from; p < keysets.size(); ++p) {
    EXPECT_TRUE(tc.begin_pass({keysets[p]}).ok());
    r.expired.push_back(tc.counters().last[0].rows_expired);
    touch(tc, keysets[p], int(p + 1));
  }
  auto d = tc.export_incremental();
  EXPECT_TRUE(d.ok());
  r.erased = d.value()[0].erased;
  EXPECT_TRUE(tc.end_training().ok());
  r.rows = store_model(tc, 0);
  return r;
}

TEST(expiry, save_and_load_keep_the_expiry_clock) {
  temp_dir dir;
  expiry_options e;
  e.ttl_passes = 2;
  auto a = make_cache(4, e);
  for (std::size_t p = 0; p < 3; ++p) {
    EMBCACHE_ASSERT_OK(a->begin_pass({keysets[p]}));
    touch(*a, keysets[p], int(p + 1));
  }
  EMBCACHE_ASSERT_OK(a->save(dir.path() + "/save"));
  (void)a->export_incremental();  // the resumed run starts its exports at the save
  const run_result whole = finish_run(*a, 3);
  EXPECT_EQ(whole.expired, (std::vector<std::uint64_t>{1, 3, 1}));

  auto b = make_cache(4, e);
  EMBCACHE_ASSERT_OK(b->load(dir.path() + "/save"));
  const run_result resumed = finish_run(*b, 3);
  EXPECT_EQ(resumed.expired, whole.expired);
  EXPECT_EQ(resumed.rows, whole.rows);
  EXPECT_EQ(resumed.erased, whole.erased);

  std::ifstream in(dir.path() + "/save/manifest.json");
  const auto m = nlohmann::json::parse(in);
  const auto& x = m.at("tables").at(0).at("expiry");
  EXPECT_EQ(x.at("boundaries"), 3);
  EXPECT_EQ(x.at("pass_versions").size(), 2u);

  // Without expiry the manifest has no `expiry`.
  auto off = make_cache(4, {});
  EMBCACHE_ASSERT_OK(off->begin_pass({keysets[0]}));
  EMBCACHE_ASSERT_OK(off->save(dir.path() + "/off"));
  std::ifstream in_off(dir.path() + "/off/manifest.json");
  EXPECT_FALSE(nlohmann::json::parse(in_off).at("tables").at(0).contains("expiry"));
}

TEST(expiry, a_bad_expiry_clock_in_a_manifest_is_corruption_naming_the_field) {
  temp_dir dir;
  expiry_options e;
  e.ttl_passes = 2;
  auto a = make_cache(4, e);
  for (std::size_t p = 0; p < 3; ++p) EMBCACHE_ASSERT_OK(a->begin_pass({keysets[p]}));
  const std::string save = dir.path() + "/save";
  EMBCACHE_ASSERT_OK(a->save(save));
  std::ifstream in(save + "/manifest.json");
  const auto good = nlohmann::json::parse(in);
  in.close();
  const std::vector<std::pair<const char*, nlohmann::json>> bad = {
      {"expiry", nlohmann::json::array()},
      {"boundaries", nlohmann::json({{"pass_versions", {1}}})},
      {"pass_versions", nlohmann::json({{"boundaries", 1}, {"pass_versions", {1, 2}}})},
      {"pass_versions", nlohmann::json({{"boundaries", 3}, {"pass_versions", {5, 2}}})},
      {"pass_versions",
       nlohmann::json({{"boundaries", 3}, {"pass_versions", {std::uint64_t{1} << 60}}})},
      {"pass_versions", nlohmann::json({{"boundaries", 3}, {"pass_versions", {-1}}})}};
  for (const auto& [field, value] : bad) {
    auto m = good;
    m["tables"][0]["expiry"] = value;
    std::ofstream(save + "/manifest.json") << m.dump(2);
    auto b = make_cache(4, e);
    const status s = b->load(save);
    EXPECT_EQ(s.code(), status_code::corruption) << value.dump();
    EXPECT_NE(s.message().find(field), std::string::npos) << s.to_string();
  }
}

}  // namespace
}  // namespace embcache::testing
