// The trainer on RocksDB stores: a new run refuses a store_path whose table holds an earlier run's
// rows unless tables[i].reuse_store (or resume_from) says so, refuses a table of another layout
// with the same row width, and a resume refuses a save whose sparse/ lost its manifest.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status_assertions.hpp"
#include "embcache/rocksdb_store.hpp"
#include "embcache/trainer/trainer.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;

using embcache::testing::temp_dir;

// Both tables on one RocksDB database; nothing is trained (create() opens the stores).
trainer_config rocksdb_config(const std::string& db) {
  trainer_config c;
  c.passes = {{{"unused.bin"}}};
  c.model.hidden = {8};
  c.threads = 1;
  c.log_interval = 0;
  c.embedding_device = device_choice::host;  // the host cache (trainer::cache()) on any machine
  for (auto& t : c.tables) {
    t.capacity = 256;
    t.store = "rocksdb";
    t.store_path = db;
  }
  return c;
}

std::size_t deep_index(const trainer_config& c) {
  for (std::size_t t = 0; t < c.tables.size(); ++t)
    if (c.tables[t].name == "deep") return t;
  return 0;
}

// Rows an earlier run left in table "deep" (dim 16, Adam: 48 floats).
void leave_rows(const std::string& db, std::size_t dim, const std::string& optimizer) {
  rocksdb_store_options o;
  o.path = db;
  o.table_name = "deep";
  o.row_width = 48;
  o.dim = dim;
  o.optimizer = optimizer;
  auto s = rocksdb_store<std::int64_t>::open(o);
  EMBCACHE_ASSERT_OK(s);
  std::vector<std::int64_t> keys = {3, 5, 9};
  std::vector<float> rows(keys.size() * 48, 0.25f);
  EMBCACHE_ASSERT_OK(s.value()->push(keys.data(), keys.size(), rows.data()));
}

TEST(trainer_store, a_new_run_refuses_a_store_path_holding_rows_unless_reuse_store) {
  temp_dir dir("embcache_trainer_store");
  const std::string db = dir.path() + "/db";
  leave_rows(db, 16, "adam");
  trainer_config c = rocksdb_config(db);
  const std::size_t d = deep_index(c);
  {
    auto t = trainer::create(c);
    ASSERT_FALSE(t.ok());
    const status& s = t.get_status();
    EXPECT_EQ(s.code(), status_code::invalid_argument) << s.to_string();
    EXPECT_NE(s.message().find("config.tables[" + std::to_string(d) + "].store_path"),
              std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("table 'deep' in '" + db + "': the table already holds rows"),
              std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("reuse_store"), std::string::npos) << s.message();
  }
  c.tables[d].reuse_store = true;
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  EXPECT_EQ(t.value()->cache().store(d).size(), 3u);
}

TEST(trainer_store, reuse_store_is_a_table_field_read_and_written_by_the_config) {
  const nlohmann::json j = {
      {"passes", {{"a.bin"}}},
      {"tables",
       {{{"name", "wide"}},
        {{"name", "deep"}, {"store", "rocksdb"}, {"store_path", "/x"}, {"reuse_store", true}}}}};
  auto c = trainer_config_from_json(j);
  EMBCACHE_ASSERT_OK(c);
  EXPECT_FALSE(c.value().tables[0].reuse_store);  // the default
  EXPECT_TRUE(c.value().tables[1].reuse_store);
  nlohmann::json back;
  to_json(back, c.value());
  EXPECT_EQ(back["tables"][1]["reuse_store"], true);
  EXPECT_EQ(back["tables"][0]["reuse_store"], false);
  nlohmann::json bad = j;
  bad["tables"][1]["reuse_store"] = 1;
  const auto e = trainer_config_from_json(bad);
  EXPECT_EQ(e.get_status().code(), status_code::invalid_argument) << e.get_status().to_string();
  EXPECT_NE(e.get_status().message().find("config.tables[1].reuse_store"), std::string::npos)
      << e.get_status().message();
}

TEST(trainer_store, a_table_of_another_layout_with_the_same_row_width_is_refused) {
  temp_dir dir("embcache_trainer_store");
  const std::string db = dir.path() + "/db";
  leave_rows(db, 24, "adagrad");  // 24 + 24 = 48 floats, like dim 16 with Adam
  trainer_config c = rocksdb_config(db);
  c.tables[deep_index(c)].reuse_store = true;
  auto t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  const status& s = t.get_status();
  EXPECT_EQ(s.code(), status_code::invalid_argument) << s.to_string();
  EXPECT_NE(s.message().find("created with schema {int64 keys, dim 24, optimizer adagrad"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("the caller expects {int64 keys, dim 16, optimizer adam"),
            std::string::npos)
      << s.message();
}

TEST(trainer_store, a_resume_reuses_the_store_and_refuses_a_save_without_its_manifest) {
  temp_dir dir("embcache_trainer_store");
  const std::string db = dir.path() + "/db", save = dir.path() + "/save";
  {
    auto t = trainer::create(rocksdb_config(db));
    EMBCACHE_ASSERT_OK(t);
    EMBCACHE_ASSERT_OK(t.value()->cache().begin_pass({{1, 2}, {1, 2, 3}}));  // new rows
    EMBCACHE_ASSERT_OK(t.value()->save(save));  // writes them to the stores too
  }
  trainer_config c = rocksdb_config(db);
  EXPECT_EQ(trainer::create(c).get_status().code(), status_code::invalid_argument);
  c.resume_from = save;
  {
    auto t = trainer::create(c);  // the stores hold the saved run's rows: a resume may use them
    EMBCACHE_ASSERT_OK(t);
    EXPECT_EQ(t.value()->cache().store(deep_index(c)).size(), 3u);
  }
  fs::remove(save + "/sparse/manifest.json");
  auto t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  const status& s = t.get_status();
  EXPECT_EQ(s.code(), status_code::not_found) << s.to_string();
  EXPECT_NE(s.message().find(save + "/sparse/manifest.json' is missing"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace embcache
