// The model-folder module (src/format/model_folder.hpp): save_stores writes, from stores alone,
// the folder a training cache over the same stores saves; saves stream in batches; one manifest
// reader serves the training cache's load and serving alike.
#include "format/model_folder.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "common/read_bytes.hpp"
#include "common/status_assertions.hpp"
#include "embcache/host_store.hpp"
#include "embcache/training_cache.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;
using test::read_bytes;
using testing::store_model;

// Every file of `a` equals the same file of `b`, and both hold the same files.
void expect_same_folders(const std::string& a, const std::string& b) {
  std::size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(a)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), a).string();
    EXPECT_TRUE(fs::exists(b + "/" + rel)) << rel;
    if (rel == "manifest.json") {  // the same but for the cache's run identity
      auto ma = nlohmann::json::parse(read_bytes(e.path().string()));
      auto mb = nlohmann::json::parse(read_bytes(b + "/" + rel));
      ma.erase("run_id");
      mb.erase("run_id");
      EXPECT_EQ(ma, mb);
    } else {
      EXPECT_TRUE(read_bytes(e.path().string()) == read_bytes(b + "/" + rel)) << rel;
    }
    ++files;
  }
  std::size_t other = 0;
  for (const auto& e : fs::recursive_directory_iterator(b)) other += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, other);
}

// A host store of `n` rows (keys 3i - n, so negative keys too, pushed out of order) for a table
// of `dim` and `kind`, with versions 1..n.
std::shared_ptr<host_store<std::int64_t>> filled_store(const std::string& name, std::size_t dim,
                                                       optimizer_kind kind, std::size_t n) {
  host_store_options o;
  o.table_name = name;
  o.row_width = dim + state_width(kind, dim);
  auto store = std::make_shared<host_store<std::int64_t>>(o);
  std::vector<std::int64_t> keys(n);
  std::vector<float> rows(n * o.row_width);
  std::vector<std::uint64_t> versions(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t j = (i * 7919) % n;  // a permutation: the store's order is not key order
    keys[i] = static_cast<std::int64_t>(3 * j) - static_cast<std::int64_t>(n);
    versions[i] = j + 1;
    for (std::size_t c = 0; c < o.row_width; ++c) rows[i * o.row_width + c] = 0.25f * j + c;
  }
  store->push(keys.data(), n, rows.data(), versions.data()).throw_if_error();
  return store;
}

std::vector<table_options<std::int64_t>> two_tables(std::size_t rows_a, std::size_t rows_b) {
  std::vector<table_options<std::int64_t>> t(2);
  t[0].name = "wide";
  t[0].dim = 1;
  t[0].optimizer.kind = optimizer_kind::adam;
  t[0].slot_of = [](std::int64_t k) { return static_cast<std::uint64_t>(k & 31); };
  t[1].name = "deep";
  t[1].dim = 8;
  t[1].optimizer.kind = optimizer_kind::adagrad;
  for (auto& o : t) {
    o.capacity = 1;
    o.store = filled_store(o.name, o.dim, o.optimizer.kind, &o == &t[0] ? rows_a : rows_b);
  }
  return t;
}

TEST(model_folder, save_stores_writes_the_folder_a_training_cache_saves) {
  testing::temp_dir dir;
  // More rows than one pull batch (65536): the streamed files cross batch boundaries.
  auto tables = two_tables(70000, 1000);
  std::vector<std::uint64_t> progress;
  EMBCACHE_ASSERT_OK(detail::save_stores<std::int64_t>(
      dir.path() + "/stores", tables, [&](std::uint64_t done, std::uint64_t total) {
        EXPECT_EQ(total, 71000u);
        progress.push_back(done);
      }));
  EXPECT_EQ(progress, (std::vector<std::uint64_t>{0, 70000, 71000}));
  {
    // The same stores behind a training cache (the trainer's host-hybrid path before).
    training_cache<std::int64_t> tc({}, tables);
    EMBCACHE_ASSERT_OK(tc.save(dir.path() + "/cache"));
  }
  expect_same_folders(dir.path() + "/stores", dir.path() + "/cache");
  EXPECT_TRUE(fs::exists(dir.path() + "/stores/wide/slot_id"));
  EXPECT_FALSE(fs::exists(dir.path() + "/stores/deep/slot_id"));  // no slot ids known
  EXPECT_FALSE(fs::exists(dir.path() + "/stores.tmp"));
  // It loads back into a cache: the same rows.
  auto fresh = two_tables(0, 0);
  training_cache<std::int64_t> back({}, fresh);
  EMBCACHE_ASSERT_OK(back.load(dir.path() + "/stores"));
  training_cache<std::int64_t> source({}, tables);
  for (std::size_t t = 0; t < 2; ++t) EXPECT_TRUE(store_model(back, t) == store_model(source, t));
  // The reader serving uses (read_model_folder) sees every row, in key order.
  auto m = detail::read_folder_manifest(dir.path() + "/stores", detail::folder_kind::model);
  EMBCACHE_ASSERT_OK(m);
  ASSERT_EQ(m.value().tables.size(), 2u);
  EXPECT_EQ(m.value().tables[0].version, 70000u);  // the store's max_version
  detail::table_rows rows;
  EMBCACHE_ASSERT_OK(detail::read_listed_table(m.value(), m.value().tables[0], &rows));
  EXPECT_EQ(rows.keys.size(), 70000u);
  EXPECT_TRUE(std::is_sorted(rows.keys.begin(), rows.keys.end()));
  EXPECT_EQ(rows.state_width, 2u);  // Adam.m and Adam.v, interleaved
  EMBCACHE_EXPECT_OK(detail::check_table_rows(rows, 1, {}));
}

TEST(model_folder, set_run_id_gives_the_identity_saves_and_loads_carry) {
  testing::temp_dir dir;
  training_cache<std::int64_t> tc({}, two_tables(3, 2));
  EXPECT_TRUE(detail::is_run_id(tc.run_id())) << tc.run_id();
  const std::string drawn = tc.run_id();
  // Refused by name, and nothing changes.
  for (const std::string bad : {"", "0123456789ABCDEF0123456789ABCDEF", "0123456789abcdef",
                                "0123456789abcdef0123456789abcdeg"}) {
    const status s = tc.set_run_id(bad);
    EXPECT_EQ(s.code(), status_code::invalid_argument) << bad;
    EXPECT_NE(s.message().find("'" + bad + "'"), std::string::npos) << s.to_string();
    EXPECT_EQ(tc.run_id(), drawn);
  }
  const std::string id = "00112233445566778899aabbccddeeff";
  EMBCACHE_ASSERT_OK(tc.set_run_id(id));
  EXPECT_EQ(tc.run_id(), id);
  EMBCACHE_ASSERT_OK(tc.save(dir.path() + "/save"));
  auto m = detail::read_folder_manifest(dir.path() + "/save", detail::folder_kind::model);
  EMBCACHE_ASSERT_OK(m);
  EXPECT_EQ(m.value().run_id, id);
  training_cache<std::int64_t> back({}, two_tables(0, 0));
  EXPECT_NE(back.run_id(), id);
  EMBCACHE_ASSERT_OK(back.load(dir.path() + "/save"));
  EXPECT_EQ(back.run_id(), id);
}

TEST(model_folder, save_stores_refuses_a_table_without_a_store_or_of_another_width) {
  testing::temp_dir dir;
  auto tables = two_tables(10, 10);
  tables[1].store = nullptr;
  const status none = detail::save_stores<std::int64_t>(dir.path() + "/x", tables);
  EXPECT_EQ(none.code(), status_code::invalid_argument) << none.to_string();
  EXPECT_NE(none.message().find("table 1 'deep' has no store"), std::string::npos)
      << none.message();
  tables = two_tables(10, 10);
  tables[1].optimizer.kind = optimizer_kind::adam;  // 8 + 16 floats, the store holds 8 + 8
  const status width = detail::save_stores<std::int64_t>(dir.path() + "/x", tables);
  EXPECT_EQ(width.code(), status_code::invalid_argument) << width.to_string();
  EXPECT_NE(width.message().find("store row width 16"), std::string::npos) << width.message();
  EXPECT_FALSE(fs::exists(dir.path() + "/x"));
}

TEST(model_folder, the_manifest_reader_refuses_for_load_and_serving_alike) {
  testing::temp_dir dir;
  auto tables = two_tables(20, 20);
  EMBCACHE_ASSERT_OK(detail::save_stores<std::int64_t>(dir.path() + "/m", tables));
  std::ofstream(dir.path() + "/m/manifest.json", std::ios::trunc) << "[1, 2]";
  const std::string want = "'" + dir.path() + "/m/manifest.json' is not a JSON object";
  training_cache<std::int64_t> tc({}, two_tables(0, 0));
  const status s = tc.load(dir.path() + "/m");
  EXPECT_EQ(s.code(), status_code::corruption);
  EXPECT_EQ(s.message(), "load: " + want);
  const auto r = detail::read_folder_manifest(dir.path() + "/m", detail::folder_kind::model);
  EXPECT_EQ(r.get_status().code(), status_code::corruption);
  EXPECT_EQ(r.get_status().message(), want);  // serving's read_model_folder returns it as is
  // A delta's reader refuses a model's manifest by its format.
  EMBCACHE_ASSERT_OK(detail::save_stores<std::int64_t>(dir.path() + "/m", tables));
  const auto d = detail::read_folder_manifest(dir.path() + "/m", detail::folder_kind::delta);
  EXPECT_EQ(d.get_status().code(), status_code::invalid_argument);
  EXPECT_NE(d.get_status().message().find("has format 'embcache-model', expected 'embcache-delta'"),
            std::string::npos)
      << d.get_status().message();
}

}  // namespace
}  // namespace embcache
