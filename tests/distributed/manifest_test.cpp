// Sharded saves on one rank: the layout, the generations, and a manifest that is refused field by
// field when damaged (every error names the file and the field).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/read_bytes.hpp"
#include "common/status_assertions.hpp"
#include "common/temp_dir.hpp"
#include "embcache/admission.hpp"
#include "embcache/distributed/sharded_save.hpp"
#include "embcache/distributed/sharded_table.hpp"
#include "test_util.hpp"

namespace embcache::test {
namespace {

namespace fs = std::filesystem;

class sharded_manifest_test : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = root_ + "/save";
    EMBCACHE_ASSERT_OK(train(table_, batch_spec{}, 0, 2));
    EMBCACHE_ASSERT_OK(table_.save(dir_));
    manifest_ = manifest_at(dir_);
  }

  // The manifest of the save in `dir`, parsed; read_back and expect_refused then write there.
  nlohmann::json manifest_at(const std::string& dir) {
    dir_ = dir;
    return nlohmann::json::parse(read_bytes(dir + "/manifest.json"));
  }

  // Writes `m` as the manifest and returns what reading it gives.
  status read_back(const nlohmann::json& m) {
    std::ofstream(dir_ + "/manifest.json") << m.dump();
    return read_sharded_manifest(dir_).get_status();
  }
  void expect_refused(const nlohmann::json& m, status_code code, const std::string& field) {
    SCOPED_TRACE(field);
    const status s = read_back(m);
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(dir_ + "/manifest.json"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find(field), std::string::npos) << s.to_string();
  }

  sharded_table_options options_ = table_options(optimizer_kind::adam, 4);
  single_process_communicator alone_;
  host_store<std::int64_t> store_{store_options(options_)};
  sharded_table<std::int64_t> table_{alone_, store_, options_};
  testing::temp_dir tmp_{"embcache_manifest"};
  std::string root_ = tmp_.path(), dir_;
  nlohmann::json manifest_;
};

TEST_F(sharded_manifest_test, layout_and_generations) {
  EXPECT_EQ(manifest_["format"], "embcache.sharded_save");
  EXPECT_EQ(manifest_["world_size"], 1);
  EXPECT_EQ(manifest_["generation"], 1);
  EXPECT_EQ(manifest_["step"], 2);
  EXPECT_EQ(manifest_["optimizer"], "adam");
  EXPECT_EQ(manifest_["owner_function"], owner_function_name);
  EXPECT_EQ(manifest_["parts"][0]["path"], "gen-000001/rank-00000");
  EXPECT_EQ(manifest_["parts"][0]["rows"], store_.size());
  EXPECT_TRUE(fs::exists(dir_ + "/gen-000001/rank-00000/manifest.json"));
  // A leftover generation of a crashed save is skipped over, and removed once a save publishes.
  fs::create_directories(dir_ + "/gen-000007/rank-00003");
  EMBCACHE_ASSERT_OK(table_.save(dir_));
  auto m = read_sharded_manifest(dir_);
  EMBCACHE_ASSERT_OK(m);
  EXPECT_EQ(m.value().generation, 8u);
  EXPECT_FALSE(fs::exists(dir_ + "/gen-000001"));
  EXPECT_FALSE(fs::exists(dir_ + "/gen-000007"));
  EXPECT_TRUE(fs::exists(dir_ + "/gen-000008/rank-00000"));
}

TEST_F(sharded_manifest_test, damaged_fields_are_refused_by_name) {
  EMBCACHE_EXPECT_OK(read_back(manifest_));
  auto with = [&](const char* key, nlohmann::json v) {
    nlohmann::json m = manifest_;
    m[key] = std::move(v);
    return m;
  };
  expect_refused(with("format_version", 2), status_code::unsupported, "'format_version'");
  expect_refused(with("format", "embcache.host_store"), status_code::invalid_argument, "'format'");
  expect_refused(with("world_size", 0), status_code::corruption, "'world_size'");
  expect_refused(with("world_size", -1), status_code::corruption, "'world_size'");
  expect_refused(with("world_size", 2), status_code::corruption, "'parts'");
  expect_refused(with("num_blocks", 0), status_code::corruption, "'num_blocks'");
  expect_refused(with("row_width", 2), status_code::corruption, "'row_width'");
  expect_refused(with("dim", "4"), status_code::corruption, "'dim'");
  expect_refused(with("owner_function", "key % world"), status_code::unsupported,
                 "'owner_function'");
  nlohmann::json m = manifest_;
  m["parts"][0]["path"] = "../../etc";
  expect_refused(m, status_code::corruption, "'parts[0].path'");
  m = manifest_;
  m["parts"][0]["rank"] = 1;
  expect_refused(m, status_code::corruption, "'parts[0].rank'");
  m = manifest_;
  m["parts"][0].erase("rows");
  expect_refused(m, status_code::corruption, "'parts[0].rows'");
  // Row counts whose sum overflows 64 bits.
  m = manifest_;
  m["world_size"] = 2;
  m["parts"][0]["rows"] = UINT64_MAX;
  m["parts"][1] = {{"rank", 1}, {"path", "gen-000001/rank-00001"}, {"rows", 2}};
  expect_refused(m, status_code::corruption, "'parts[1].rows'");
  std::ofstream(dir_ + "/manifest.json") << manifest_.dump().substr(0, 40);
  EXPECT_EQ(read_sharded_manifest(dir_).get_status().code(), status_code::corruption);
  fs::remove(dir_ + "/manifest.json");
  EXPECT_EQ(read_sharded_manifest(dir_).get_status().code(), status_code::not_found);
}

TEST_F(sharded_manifest_test, the_run_identity_is_recorded_and_read_back) {
  // A save without one (as before run identities existed) reads back as none.
  EXPECT_FALSE(manifest_.contains("run_id"));
  auto plain = read_sharded_manifest(dir_);
  EMBCACHE_ASSERT_OK(plain);
  EXPECT_EQ(plain.value().info.run_id, "");
  single_process_communicator alone;
  host_store<std::int64_t> fresh_store{store_options(options_)};
  sharded_table<std::int64_t> fresh{alone, fresh_store, options_};
  std::string loaded = "not read";
  EMBCACHE_ASSERT_OK(fresh.load(dir_, {}, &loaded));
  EXPECT_EQ(loaded, "");

  const std::string id = "0123456789abcdef0123456789abcdef";
  const std::string with_id = root_ + "/with_id";
  EMBCACHE_ASSERT_OK(table_.save(with_id, id));
  EXPECT_EQ(nlohmann::json::parse(read_bytes(with_id + "/manifest.json")).value("run_id", ""), id);
  auto m = read_sharded_manifest(with_id);
  EMBCACHE_ASSERT_OK(m);
  EXPECT_EQ(m.value().info.run_id, id);
  host_store<std::int64_t> again_store{store_options(options_)};
  sharded_table<std::int64_t> again{alone, again_store, options_};
  EMBCACHE_ASSERT_OK(again.load(with_id, {}, &loaded));
  EXPECT_EQ(loaded, id);

  // A damaged identity is refused by name; so is one given to save, before anything is written.
  nlohmann::json bad = manifest_;
  bad["run_id"] = "0123456789ABCDEF0123456789ABCDEF";
  expect_refused(bad, status_code::corruption, "'run_id'");
  bad["run_id"] = 7;
  expect_refused(bad, status_code::corruption, "'run_id'");
  const status refused = table_.save(root_ + "/bad_id", "xyz");
  EXPECT_EQ(refused.code(), status_code::invalid_argument) << refused.to_string();
  EXPECT_NE(refused.message().find("run_id 'xyz'"), std::string::npos) << refused.to_string();
  EXPECT_FALSE(fs::exists(root_ + "/bad_id/manifest.json"));
}

TEST_F(sharded_manifest_test, loads_check_the_parts_and_the_target) {
  // A part with another row count than the manifest says.
  nlohmann::json m = manifest_;
  m["parts"][0]["rows"] = store_.size() + 1;
  EMBCACHE_ASSERT_OK(read_back(m));
  host_store<std::int64_t> target(store_options(options_));
  status s = load_sharded_part(dir_, 0, 1, target).get_status();
  EXPECT_EQ(s.code(), status_code::corruption);
  EXPECT_NE(s.message().find("parts[0].rows"), std::string::npos) << s.to_string();
  EMBCACHE_ASSERT_OK(read_back(manifest_));
  // Another table, another width, a target that is not empty.
  host_store_options other = store_options(options_);
  other.table_name = "u";
  host_store<std::int64_t> wrong_table(other);
  EXPECT_EQ(load_sharded_part(dir_, 0, 1, wrong_table).get_status().code(), status_code::not_found);
  other = store_options(options_);
  other.row_width += 1;
  host_store<std::int64_t> wrong_width(other);
  EXPECT_EQ(load_sharded_part(dir_, 0, 1, wrong_width).get_status().code(),
            status_code::invalid_argument);
  EMBCACHE_ASSERT_OK(load_sharded_part(dir_, 0, 1, target));
  EXPECT_TRUE(read_store(target).same_rows_and_versions(read_store(store_)));
  EXPECT_EQ(load_sharded_part(dir_, 0, 1, target).get_status().code(),
            status_code::invalid_argument);
  // A table of another optimizer refuses the save.
  sharded_table_options sgd = table_options(optimizer_kind::sgd, 4);
  host_store_options so = store_options(sgd);
  so.row_width = store_options(options_).row_width;  // same width, other optimizer
  host_store<std::int64_t> sgd_store(so);
  sharded_table<std::int64_t> sgd_table(alone_, sgd_store, sgd);
  EXPECT_EQ(sgd_table.load(dir_).code(), status_code::invalid_argument);
}

// The lifetime state (admission counts, expiry clocks) is written with the save, read back
// checked, and refused by file or field name when damaged or of another sketch.
TEST_F(sharded_manifest_test, lifetime_state_is_saved_checked_and_refused_when_damaged) {
  // A save without it (admission and expiry off) reads back as none.
  EXPECT_FALSE(manifest_.contains("admission"));
  EXPECT_FALSE(manifest_["parts"][0].contains("expiry"));
  auto none = read_sharded_manifest(dir_);
  EMBCACHE_ASSERT_OK(none);
  EXPECT_TRUE(none.value().admission.path.empty());
  EXPECT_TRUE(resumed_expiry_clock(none.value(), 0, 1).versions.empty());
  auto no_words = read_sharded_admission(dir_, none.value(), 20);
  EMBCACHE_ASSERT_OK(no_words);
  EXPECT_TRUE(no_words.value().empty());

  admission_options ao;
  ao.min_count = 2;
  ao.sketch_width = 8;
  ao.sketch_depth = 2;
  admission_sketch sketch(ao);
  for (std::uint64_t k = 0; k < 5; ++k) sketch.count_sighting(k);
  sharded_lifetime lifetime;
  lifetime.admission = sketch.to_words();
  lifetime.has_expiry = true;
  // Pass versions 1 and 2: rows of version 1, 2 and above fall in three age classes.
  const model saved = read_store(store_);
  lifetime.expiry = {3, {1, 2}};
  const std::string with = root_ + "/with";
  EMBCACHE_ASSERT_OK(table_.save(with, "", 0, &lifetime));
  auto m = read_sharded_manifest(with);
  EMBCACHE_ASSERT_OK(m);
  EXPECT_EQ(m.value().admission.path, "gen-000001/admission");
  EXPECT_EQ(m.value().admission.bytes, lifetime.admission.size() * 4);
  ASSERT_TRUE(m.value().parts[0].has_expiry);
  EXPECT_EQ(m.value().parts[0].expiry.boundaries, 3u);
  EXPECT_EQ(m.value().parts[0].expiry.versions, (std::vector<std::uint64_t>{1, 2}));
  auto words = read_sharded_admission(with, m.value(), lifetime.admission.size());
  EMBCACHE_ASSERT_OK(words);
  EXPECT_EQ(words.value(), lifetime.admission);
  // On the save's world size the rank's own clock and versions; on another, age classes.
  EXPECT_EQ(resumed_expiry_clock(m.value(), 0, 1).versions, lifetime.expiry.versions);
  const expiry_clock two = resumed_expiry_clock(m.value(), 1, 2);
  EXPECT_EQ(two.boundaries, 3u);
  EXPECT_EQ(two.versions, (std::vector<std::uint64_t>{1, 2}));
  host_store<std::int64_t> same(store_options(options_));
  EMBCACHE_ASSERT_OK(load_sharded_part(with, 0, 1, same));
  EXPECT_TRUE(read_store(same).same_rows_and_versions(saved));
  std::size_t moved = 0;
  for (int r = 0; r < 2; ++r) {
    host_store<std::int64_t> half(store_options(options_));
    EMBCACHE_ASSERT_OK(load_sharded_part(with, r, 2, half));
    const model h = read_store(half);
    for (std::size_t i = 0; i < h.keys.size(); ++i, ++moved) {
      const auto at = std::find(saved.keys.begin(), saved.keys.end(), h.keys[i]);
      ASSERT_NE(at, saved.keys.end());
      const std::uint64_t v = saved.versions[std::size_t(at - saved.keys.begin())];
      EXPECT_EQ(h.versions[i], v <= 1 ? 1u : v <= 2 ? 2u : 3u) << "key " << h.keys[i];
    }
  }
  EXPECT_EQ(moved, saved.keys.size());

  // Another sketch size, a damaged or truncated file: refused naming the file.
  const std::string file = with + "/gen-000001/admission";
  status s = read_sharded_admission(with, m.value(), lifetime.admission.size() + 8).get_status();
  EXPECT_EQ(s.code(), status_code::invalid_argument) << s.to_string();
  EXPECT_NE(s.message().find(file), std::string::npos) << s.to_string();
  std::string bytes = read_bytes(file);
  bytes[bytes.size() - 1] ^= 1;
  std::ofstream(file, std::ios::binary) << bytes;
  s = read_sharded_admission(with, m.value(), lifetime.admission.size()).get_status();
  EXPECT_EQ(s.code(), status_code::corruption) << s.to_string();
  EXPECT_NE(s.message().find(file), std::string::npos) << s.to_string();
  std::ofstream(file, std::ios::binary) << bytes.substr(0, 12);
  s = read_sharded_admission(with, m.value(), lifetime.admission.size()).get_status();
  EXPECT_EQ(s.code(), status_code::corruption) << s.to_string();
  EXPECT_NE(s.message().find(file), std::string::npos) << s.to_string();

  // Damaged manifest entries, by field.
  const nlohmann::json good = manifest_at(with);
  nlohmann::json bad = good;
  bad["admission"]["path"] = "../admission";
  expect_refused(bad, status_code::corruption, "'admission.path'");
  bad = good;
  bad["admission"]["bytes"] = 7;
  expect_refused(bad, status_code::corruption, "'admission.bytes'");
  bad = good;
  bad["admission"]["xxh64"] = "xyz";
  expect_refused(bad, status_code::corruption, "'admission.xxh64'");
  bad = good;
  bad["parts"][0]["expiry"]["pass_versions"] = {2, 1};
  expect_refused(bad, status_code::corruption, "'parts[0].expiry.pass_versions'");
  bad = good;
  bad["parts"][0]["expiry"]["boundaries"] = 1;
  expect_refused(bad, status_code::corruption, "'parts[0].expiry.pass_versions'");
  bad = good;
  bad["world_size"] = 2;
  bad["parts"][1] = {{"rank", 1}, {"path", "gen-000001/rank-00001"}, {"rows", 0}};
  expect_refused(bad, status_code::corruption, "'parts[1].expiry'");
}

// Expiry by steps (ttl_steps): the step clock is saved beside the pass clock, checked when read,
// and on another number of ranks both clocks' values take their places in one order (pass 1,
// step 2, pass 3, step 3 here: places 1, 2, 3, 4) and the rows' versions become classes of it.
TEST_F(sharded_manifest_test, step_clocks_are_saved_checked_and_reclassed_with_the_pass_clock) {
  sharded_lifetime lifetime;
  lifetime.has_expiry = true;
  lifetime.expiry = {3, {1, 3}, 5, {2, 3}};
  const std::string with = root_ + "/steps";
  EMBCACHE_ASSERT_OK(table_.save(with, "", 0, &lifetime));
  auto m = read_sharded_manifest(with);
  EMBCACHE_ASSERT_OK(m);
  const expiry_clock& saved_clock = m.value().parts[0].expiry;
  EXPECT_EQ(saved_clock.steps, 5u);
  EXPECT_EQ(saved_clock.step_versions, (std::vector<std::uint64_t>{2, 3}));
  const expiry_clock same = resumed_expiry_clock(m.value(), 0, 1);
  EXPECT_EQ(same.step_versions, lifetime.expiry.step_versions);
  const expiry_clock two = resumed_expiry_clock(m.value(), 1, 2);
  EXPECT_EQ(two.boundaries, 3u);
  EXPECT_EQ(two.versions, (std::vector<std::uint64_t>{1, 3}));
  EXPECT_EQ(two.steps, 5u);
  EXPECT_EQ(two.step_versions, (std::vector<std::uint64_t>{2, 4}));
  const model saved = read_store(store_);
  const std::vector<std::uint64_t> values = {1, 2, 3, 3};
  for (int r = 0; r < 2; ++r) {
    host_store<std::int64_t> half(store_options(options_));
    EMBCACHE_ASSERT_OK(load_sharded_part(with, r, 2, half));
    const model h = read_store(half);
    for (std::size_t i = 0; i < h.keys.size(); ++i) {
      const auto at = std::find(saved.keys.begin(), saved.keys.end(), h.keys[i]);
      ASSERT_NE(at, saved.keys.end());
      const std::uint64_t v = saved.versions[std::size_t(at - saved.keys.begin())];
      const auto below =
          std::count_if(values.begin(), values.end(), [v](std::uint64_t x) { return x < v; });
      EXPECT_EQ(h.versions[i], std::uint64_t(1 + below)) << "key " << h.keys[i];
    }
  }
  // Damaged step clocks, by field; a save without ttl_steps writes none.
  const nlohmann::json good = manifest_at(with);
  nlohmann::json bad = good;
  bad["parts"][0]["expiry"]["step_versions"] = {3, 2};
  expect_refused(bad, status_code::corruption, "'parts[0].expiry.step_versions'");
  bad = good;
  bad["parts"][0]["expiry"]["steps"] = 1;
  expect_refused(bad, status_code::corruption, "'parts[0].expiry.step_versions'");
  bad = good;
  bad["parts"][0]["expiry"]["steps"] = "5";
  expect_refused(bad, status_code::corruption, "'parts[0].expiry.steps'");
  lifetime.expiry = {3, {1, 3}};
  EMBCACHE_ASSERT_OK(table_.save(root_ + "/passes", "", 0, &lifetime));
  EXPECT_FALSE(
      nlohmann::json::parse(read_bytes(root_ + "/passes/manifest.json"))["parts"][0]["expiry"]
          .contains("steps"));
}

}  // namespace
}  // namespace embcache::test
