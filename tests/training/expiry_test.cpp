// Expiry (embcache/expiry.hpp) in the host space: the cases every space runs
// (expiry_suite.hpp), plus the host-only ones: options refused, and the expiry clock through
// save/load (bit-exact resume) and a manifest that breaks it.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "expiry_suite.hpp"

namespace embcache::testing::expiry_suite {
namespace {

INSTANTIATE_TYPED_TEST_SUITE_P(host, expiry_cases, ::testing::Types<host_space>);

TEST(expiry, a_negative_or_nan_norm_is_refused) {
  for (const float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    expiry_options e;
    e.min_l2_norm = bad;
    EXPECT_THROW(make_cache<host_space>(8, e), error) << bad;
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
  for (std::size_t p = from; p < keysets().size(); ++p) {
    EXPECT_TRUE(tc.begin_pass({keysets()[p]}).ok());
    r.expired.push_back(tc.counters().last[0].rows_expired);
    touch(tc, keysets()[p], int(p + 1));
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
  auto a = make_cache<host_space>(4, e);
  for (std::size_t p = 0; p < 3; ++p) {
    EMBCACHE_ASSERT_OK(a->begin_pass({keysets()[p]}));
    touch(*a, keysets()[p], int(p + 1));
  }
  EMBCACHE_ASSERT_OK(a->save(dir.path() + "/save"));
  (void)a->export_incremental();  // the resumed run starts its exports at the save
  const run_result whole = finish_run(*a, 3);
  EXPECT_EQ(whole.expired, (std::vector<std::uint64_t>{1, 3, 1}));

  auto b = make_cache<host_space>(4, e);
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
  auto off = make_cache<host_space>(4, {});
  EMBCACHE_ASSERT_OK(off->begin_pass({keysets()[0]}));
  EMBCACHE_ASSERT_OK(off->save(dir.path() + "/off"));
  std::ifstream in_off(dir.path() + "/off/manifest.json");
  EXPECT_FALSE(nlohmann::json::parse(in_off).at("tables").at(0).contains("expiry"));
}

TEST(expiry, a_bad_expiry_clock_in_a_manifest_is_corruption_naming_the_field) {
  temp_dir dir;
  expiry_options e;
  e.ttl_passes = 2;
  auto a = make_cache<host_space>(4, e);
  for (std::size_t p = 0; p < 3; ++p) EMBCACHE_ASSERT_OK(a->begin_pass({keysets()[p]}));
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
    auto b = make_cache<host_space>(4, e);
    const status s = b->load(save);
    EXPECT_EQ(s.code(), status_code::corruption) << value.dump();
    EXPECT_NE(s.message().find(field), std::string::npos) << s.to_string();
  }
}

}  // namespace
}  // namespace embcache::testing::expiry_suite
