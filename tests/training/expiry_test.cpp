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

// ttl_steps through save/load: the step clock travels in the manifest, so a resumed run expires
// what the uninterrupted one does; a manifest without it (a save of a ttl_passes-only run, or of
// an earlier build) loads with the step count at zero; a damaged one is corruption naming the
// field. Without ttl_steps nothing of it is written.
TEST(expiry, save_and_load_keep_the_step_clock) {
  temp_dir dir;
  expiry_options e;
  e.ttl_steps = 2;
  e.ttl_passes = 5;  // combined: the steps rule is the one that takes rows here
  const auto& plans = step_plans();
  const auto run = [&](training_cache<std::int64_t>& tc, std::size_t from, std::size_t to,
                       std::vector<std::uint64_t>* expired) {
    for (std::size_t p = from; p < to; ++p) {
      EXPECT_TRUE(tc.begin_pass({plans[p].keyset}).ok());
      expired->push_back(tc.counters().last[0].rows_expired);
      for (const auto& keys : plans[p].steps) {
        tc.begin_step();
        touch(tc, keys, int(p + 1));
      }
    }
  };
  auto a = make_cache<host_space>(8, e);
  std::vector<std::uint64_t> whole, resumed;
  run(*a, 0, 1, &whole);
  const std::string save = dir.path() + "/save";
  EMBCACHE_ASSERT_OK(a->save(save));
  const expiry_clock at_save = a->expiry_state(0);
  (void)a->export_incremental();  // the resumed run starts its exports at the save
  run(*a, 1, plans.size(), &whole);
  EXPECT_EQ(whole, (std::vector<std::uint64_t>{0, 3, 2}));
  auto whole_delta = a->export_incremental();
  EMBCACHE_ASSERT_OK(whole_delta);
  EMBCACHE_ASSERT_OK(a->end_training());

  auto b = make_cache<host_space>(8, e);
  EMBCACHE_ASSERT_OK(b->load(save));
  EXPECT_EQ(b->expiry_state(0).steps, 3u);
  EXPECT_EQ(b->expiry_state(0).step_versions, at_save.step_versions);
  resumed.push_back(0);
  run(*b, 1, plans.size(), &resumed);
  EXPECT_EQ(resumed, whole);
  auto resumed_delta = b->export_incremental();
  EMBCACHE_ASSERT_OK(resumed_delta);
  EXPECT_EQ(resumed_delta.value()[0].erased, whole_delta.value()[0].erased);
  EXPECT_EQ(resumed_delta.value()[0].erased, key_list({1, 2, 3, 4, 6}));
  EMBCACHE_ASSERT_OK(b->end_training());
  EXPECT_EQ(store_model(*b, 0), store_model(*a, 0));

  std::ifstream in(save + "/manifest.json");
  const auto good = nlohmann::json::parse(in);
  in.close();
  const auto& x = good.at("tables").at(0).at("expiry");
  EXPECT_EQ(x.at("steps"), 3);
  EXPECT_EQ(x.at("step_versions").size(), 2u);  // the last ttl_steps values

  // A manifest without the step clock: counting starts anew, nothing expires by steps at once.
  auto old = good;
  old["tables"][0]["expiry"].erase("steps");
  old["tables"][0]["expiry"].erase("step_versions");
  std::ofstream(save + "/manifest.json") << old.dump(2);
  auto c = make_cache<host_space>(8, e);
  EMBCACHE_ASSERT_OK(c->load(save));
  EXPECT_EQ(c->expiry_state(0).steps, 0u);
  EXPECT_TRUE(c->expiry_state(0).step_versions.empty());
  EMBCACHE_ASSERT_OK(c->begin_pass({plans[1].keyset}));
  EXPECT_EQ(c->counters().last[0].rows_expired, 0u);

  const std::vector<std::pair<const char*, nlohmann::json>> bad = {
      {"step_versions", nlohmann::json({{"steps", 1}, {"step_versions", {1, 2}}})},
      {"step_versions", nlohmann::json({{"steps", 3}, {"step_versions", {5, 2}}})},
      {"step_versions", nlohmann::json({{"steps", 3}})},
      {"steps", nlohmann::json({{"steps", -1}, {"step_versions", nlohmann::json::array()}})}};
  for (const auto& [field, value] : bad) {
    auto m = good;
    for (auto it = value.begin(); it != value.end(); ++it)
      m["tables"][0]["expiry"][it.key()] = it.value();
    if (!value.contains("step_versions")) m["tables"][0]["expiry"].erase("step_versions");
    std::ofstream(save + "/manifest.json") << m.dump(2);
    auto d = make_cache<host_space>(8, e);
    const status s = d->load(save);
    EXPECT_EQ(s.code(), status_code::corruption) << value.dump();
    EXPECT_NE(s.message().find(field), std::string::npos) << s.to_string();
  }

  // Without ttl_steps: no step fields, whatever begin_step was called.
  expiry_options passes_only;
  passes_only.ttl_passes = 2;
  auto p = make_cache<host_space>(8, passes_only);
  EMBCACHE_ASSERT_OK(p->begin_pass({plans[0].keyset}));
  p->begin_step();
  EMBCACHE_ASSERT_OK(p->save(dir.path() + "/passes"));
  std::ifstream in_p(dir.path() + "/passes/manifest.json");
  const auto mp = nlohmann::json::parse(in_p);
  EXPECT_FALSE(mp.at("tables").at(0).at("expiry").contains("steps"));
  EXPECT_EQ(p->expiry_state(0).steps, 0u);
}

TEST(expiry, ttl_steps_above_the_limit_is_refused) {
  expiry_options e;
  e.ttl_steps = max_ttl_steps + 1;
  EXPECT_THROW(make_cache<host_space>(8, e), error);
  e.ttl_steps = max_ttl_steps;
  EXPECT_NO_THROW(make_cache<host_space>(8, e));
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
