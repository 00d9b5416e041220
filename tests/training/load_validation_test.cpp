// Loading a model folder: the manifest of a save is required, a plain HugeCTR folder loads only
// when asked for, every size field of the manifest is checked against the files (without
// overflow), repeated keys and non-finite floats are refused by default, and a resumed save holds
// the same rows as an uninterrupted one (docs/training_cache.md, "Save and load").
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/read_bytes.hpp"
#include "common/status_assertions.hpp"
#include "embcache/training_cache.hpp"
#include "test_util.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace embcache {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::read_bytes;
using testing::store_model;

constexpr std::size_t dim = 4;

struct load_dir : testing::temp_dir {
  load_dir() : testing::temp_dir("embcache_load") {}
};

table_options<std::int64_t> emb_table(std::size_t capacity = 64) {
  table_options<std::int64_t> o;
  o.name = "emb";
  o.dim = dim;
  o.optimizer.kind = optimizer_kind::adagrad;
  o.optimizer.adagrad_initial_accumulator = 0.5f;
  o.capacity = capacity;
  o.init.seed = 5;
  return o;
}

void write_bytes(const std::string& path, const void* data, std::size_t n) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

void write_bytes(const std::string& path, const std::string& s) {
  write_bytes(path, s.data(), s.size());
}

std::string xxh64_of(const std::string& path) {
  const std::string b = read_bytes(path);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx",
                static_cast<unsigned long long>(XXH64(b.data(), b.size(), 0)));
  return buf;
}

// Overwrites rows of `keys` (resident) with values that depend on the key and `step`.
void train(training_cache<std::int64_t>& tc, const std::vector<std::int64_t>& keys, int step) {
  const std::size_t w = tc.row_width(0);
  std::vector<float> rows(keys.size() * w);
  EMBCACHE_ASSERT_OK(tc.read(0, keys.data(), keys.size(), rows.data(), nullptr));
  for (std::size_t i = 0; i < keys.size(); ++i)
    for (std::size_t j = 0; j < w; ++j)
      rows[i * w + j] = rows[i * w + j] * 0.5f + float(step + 1) * 0.125f + float(j) * 1e-3f;
  EMBCACHE_ASSERT_OK(tc.assign(0, keys.data(), keys.size(), rows.data()));
}

std::vector<std::int64_t> keys_of_pass(int p) {
  std::vector<std::int64_t> k;
  for (int i = 0; i < 24; ++i) k.push_back(std::int64_t(p * 7 + i) * 3 - 20);
  return k;
}

// A small trained save of table "emb" (24 rows, AdaGrad) at `dir`/save.
std::string small_save(const std::string& dir) {
  training_cache<std::int64_t> tc({}, {emb_table()});
  const auto keys = keys_of_pass(0);
  EMBCACHE_EXPECT_OK(tc.begin_pass({keys}));
  train(tc, keys, 0);
  const std::string save = dir + "/save";
  EMBCACHE_EXPECT_OK(tc.save(save));
  return save;
}

// A cache holding a few rows that a refused load must leave as they are.
struct target {
  training_cache<std::int64_t> tc{{}, {emb_table()}};
  testing::model<std::int64_t> before;
  target() {
    EMBCACHE_EXPECT_OK(tc.begin_pass({{1000, 1001}}));
    EMBCACHE_EXPECT_OK(tc.end_training());
    before = store_model(tc, 0);
  }
  bool unchanged() { return store_model(tc, 0) == before; }
};

json read_json(const std::string& path) { return json::parse(read_bytes(path)); }
void write_json(const std::string& path, const json& j) { write_bytes(path, j.dump(2)); }

// --- the manifest is required ----------------------------------------------------------------

TEST(load_validation, a_save_without_its_manifest_is_refused_naming_the_file) {
  load_dir dir;
  const std::string save = small_save(dir.path());
  training_cache<std::int64_t> source({}, {emb_table()});
  EMBCACHE_ASSERT_OK(source.load(save));
  const auto saved = store_model(source, 0);
  fs::remove(save + "/manifest.json");

  target t;
  const status s = t.tc.load(save);
  EXPECT_EQ(s.code(), status_code::not_found) << s.to_string();
  EXPECT_NE(s.message().find(save + "/manifest.json"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("allow_hugectr_folder"), std::string::npos) << s.message();
  EXPECT_TRUE(t.unchanged());

  // Asked for explicitly, the folder loads as a HugeCTR one: rows and AdaGrad state kept (its
  // `AdaGrad.accm` is HugeCTR's file); without that file the state is initialized.
  load_options o;
  o.allow_hugectr_folder = true;
  const status kept = t.tc.load(save, o);
  EMBCACHE_ASSERT_OK(kept);
  EXPECT_TRUE(store_model(t.tc, 0) == saved);
  fs::remove(save + "/emb/AdaGrad.accm");
  const status h = t.tc.load(save, o);
  EMBCACHE_ASSERT_OK(h);
  const auto m = store_model(t.tc, 0);
  ASSERT_EQ(m.size(), saved.size());
  for (const auto& [k, row] : saved) {
    ASSERT_EQ(m.count(k), 1u) << k;
    EXPECT_TRUE(std::equal(row.begin(), row.begin() + dim, m.at(k).begin())) << k;
    EXPECT_EQ(std::vector<float>(m.at(k).begin() + dim, m.at(k).end()),
              std::vector<float>(dim, 0.5f))
        << k;
    EXPECT_NE(std::vector<float>(row.begin() + dim, row.end()), std::vector<float>(dim, 0.5f));
  }
}

// --- plain HugeCTR folders ---------------------------------------------------------------------

struct hugectr_folder {
  std::string dir, table;
  hugectr_folder(const std::string& root, std::vector<std::int64_t> keys, std::vector<float> vec)
      : dir(root + "/hugectr"), table(root + "/hugectr/emb") {
    fs::create_directories(table);
    write_bytes(table + "/key", keys.data(), keys.size() * 8);
    write_bytes(table + "/emb_vector", vec.data(), vec.size() * 4);
  }
};

std::vector<float> iota_rows(std::size_t rows) {
  std::vector<float> v(rows * dim);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i + 1);
  return v;
}

TEST(load_validation, a_hugectr_folder_loads_only_when_asked_for) {
  load_dir dir;
  hugectr_folder f(dir.path(), {5, -3, 7}, iota_rows(3));
  target t;
  const status s = t.tc.load(f.dir);
  EXPECT_EQ(s.code(), status_code::not_found) << s.to_string();
  EXPECT_NE(s.message().find(f.dir + "/manifest.json"), std::string::npos) << s.message();
  EXPECT_TRUE(t.unchanged());
  load_options o;
  o.allow_hugectr_folder = true;
  EMBCACHE_ASSERT_OK(t.tc.load(f.dir, o));
  const auto m = store_model(t.tc, 0);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m.at(7), (std::vector<float>{9, 10, 11, 12, 0.5f, 0.5f, 0.5f, 0.5f}));
}

TEST(load_validation, a_hugectr_folder_with_repeated_keys_is_refused_unless_allowed) {
  load_dir dir;
  hugectr_folder f(dir.path(), {5, -3, 5}, iota_rows(3));
  target t;
  load_options o;
  o.allow_hugectr_folder = true;
  const status s = t.tc.load(f.dir, o);
  EXPECT_EQ(s.code(), status_code::invalid_argument) << s.to_string();
  EXPECT_NE(s.message().find("'" + f.table + "/key' repeats key 5"), std::string::npos)
      << s.message();
  EXPECT_TRUE(t.unchanged());
  o.allow_duplicate_keys = true;  // the last occurrence wins
  EMBCACHE_ASSERT_OK(t.tc.load(f.dir, o));
  const auto m = store_model(t.tc, 0);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.at(5), (std::vector<float>{9, 10, 11, 12, 0.5f, 0.5f, 0.5f, 0.5f}));
}

TEST(load_validation, a_hugectr_folder_with_non_finite_floats_is_refused_unless_allowed) {
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    load_dir dir;
    auto vec = iota_rows(3);
    vec[1 * dim + 2] = bad;
    hugectr_folder f(dir.path(), {5, -3, 7}, vec);
    target t;
    load_options o;
    o.allow_hugectr_folder = true;
    const status s = t.tc.load(f.dir, o);
    EXPECT_EQ(s.code(), status_code::invalid_argument) << s.to_string();
    EXPECT_NE(s.message().find("'" + f.table + "/emb_vector' holds"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("for key -3 (float 2 of its row)"), std::string::npos)
        << s.message();
    EXPECT_TRUE(t.unchanged());
    o.allow_non_finite = true;
    EMBCACHE_ASSERT_OK(t.tc.load(f.dir, o));
    const auto m = store_model(t.tc, 0);
    EXPECT_EQ(std::isnan(m.at(-3)[2]), std::isnan(bad));
    if (!std::isnan(bad)) EXPECT_EQ(m.at(-3)[2], bad);
  }
}

TEST(load_validation, a_hugectr_folder_of_another_dim_or_a_torn_key_file_is_refused) {
  load_dir dir;
  hugectr_folder f(dir.path(), {5, -3, 7}, iota_rows(3));
  load_options o;
  o.allow_hugectr_folder = true;
  {
    auto opt = emb_table();
    opt.dim = 3;
    training_cache<std::int64_t> other({}, {opt});
    const status s = other.load(f.dir, o);
    EXPECT_EQ(s.code(), status_code::invalid_argument) << s.to_string();
    EXPECT_NE(s.message().find(f.table + "/emb_vector"), std::string::npos) << s.message();
  }
  fs::resize_file(f.table + "/key", 20);
  target t;
  const status s = t.tc.load(f.dir, o);
  EXPECT_EQ(s.code(), status_code::corruption) << s.to_string();
  EXPECT_NE(s.message().find(f.table + "/key' has 20 bytes"), std::string::npos) << s.message();
  EXPECT_TRUE(t.unchanged());
}

// --- size fields of the manifest ---------------------------------------------------------------

struct manifest_case {
  const char* what;
  std::function<void(json&)> edit;
  status_code code;
  const char* names;  // what the message must name besides the manifest
};

TEST(load_validation, every_size_field_of_the_manifest_is_checked_against_the_files) {
  load_dir dir;
  const std::string save = small_save(dir.path());
  const std::string mpath = save + "/manifest.json";
  const json good = read_json(mpath);
  const std::uint64_t huge = std::uint64_t{1} << 62;
  const std::vector<manifest_case> cases = {
      {"count overflows", [&](json& m) { m["tables"][0]["count"] = huge + 24; },
       status_code::corruption, "tables[0].count 4611686018427387928"},
      {"count at the maximum",
       [&](json& m) { m["tables"][0]["count"] = std::numeric_limits<std::uint64_t>::max(); },
       status_code::corruption, "overflows 64 bits"},
      {"count one short", [&](json& m) { m["tables"][0]["count"] = 23; }, status_code::corruption,
       "tables[0].files.key.bytes is 192, expected 184"},
      {"count negative", [&](json& m) { m["tables"][0]["count"] = -1; }, status_code::corruption,
       "'tables[0].count' must be an unsigned integer"},
      {"count a float", [&](json& m) { m["tables"][0]["count"] = 1e300; }, status_code::corruption,
       "'tables[0].count' must be an unsigned integer"},
      {"count a string", [&](json& m) { m["tables"][0]["count"] = "24"; }, status_code::corruption,
       "'tables[0].count' must be an unsigned integer"},
      {"file bytes disagree",
       [&](json& m) { m["tables"][0]["files"]["emb_vector"]["bytes"] = huge; },
       status_code::corruption, "tables[0].files.emb_vector.bytes is 4611686018427387904"},
      {"file bytes missing",
       [&](json& m) { m["tables"][0]["files"]["AdaGrad.accm"].erase("bytes"); },
       status_code::corruption, "'tables[0].files.AdaGrad.accm.bytes' must be an unsigned integer"},
      {"state file missing", [&](json& m) { m["tables"][0]["files"].erase("AdaGrad.accm"); },
       status_code::corruption, "'tables[0].files.AdaGrad.accm' must be an object"},
      {"file entry missing", [&](json& m) { m["tables"][0]["files"].erase("version"); },
       status_code::corruption, "'tables[0].files.version' must be an object"},
      {"dim overflows", [&](json& m) { m["tables"][0]["dim"] = huge; },
       status_code::invalid_argument, "has dim 4611686018427387904"},
      {"version a float", [&](json& m) { m["tables"][0]["version"] = 2.5; },
       status_code::corruption, "'tables[0].version' must be an unsigned integer"},
      {"tables not an array", [&](json& m) { m["tables"] = json::object(); },
       status_code::corruption, "'tables' must be an array"},
      {"table not an object", [&](json& m) { m["tables"][0] = 3; }, status_code::corruption,
       "'tables[0]' must be an object"},
      {"format_version a float", [&](json& m) { m["format_version"] = 1.0; },
       status_code::corruption, "'format_version' must be an integer"},
      {"not an object",
       [&](json& m) {
         m = json::array({1, 2});
       },
       status_code::corruption, "is not a JSON object"},
  };
  for (const auto& c : cases) {
    json m = good;
    c.edit(m);
    write_json(mpath, m);
    target t;
    const status s = t.tc.load(save);
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s.to_string();
    EXPECT_NE(s.message().find(c.names), std::string::npos) << c.what << ": " << s.message();
    if (c.code == status_code::corruption)
      EXPECT_NE(s.message().find(mpath), std::string::npos) << c.what << ": " << s.message();
    EXPECT_TRUE(t.unchanged()) << c.what;
  }
  write_json(mpath, good);
  target t;
  EMBCACHE_ASSERT_OK(t.tc.load(save));
}

TEST(load_validation, a_manifest_whose_count_and_bytes_agree_but_not_the_files_is_refused) {
  load_dir dir;
  const std::string save = small_save(dir.path());
  const std::string mpath = save + "/manifest.json";
  json m = read_json(mpath);
  auto& e = m["tables"][0];
  e["count"] = 25;
  e["files"]["key"]["bytes"] = 25 * 8;
  e["files"]["version"]["bytes"] = 25 * 8;
  e["files"]["emb_vector"]["bytes"] = 25 * dim * 4;
  e["files"]["AdaGrad.accm"]["bytes"] = 25 * dim * 4;
  write_json(mpath, m);
  target t;
  const status s = t.tc.load(save);
  EXPECT_EQ(s.code(), status_code::corruption) << s.to_string();
  EXPECT_NE(s.message().find("'" + save + "/emb/key' is 192 bytes, expected 200"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("(truncated)"), std::string::npos) << s.message();
  EXPECT_TRUE(t.unchanged());
}

// A save whose files pass their checksums but repeat a key or hold a non-finite float.
TEST(load_validation, a_save_with_repeated_keys_or_non_finite_floats_is_refused_unless_allowed) {
  load_dir dir;
  const std::string save = small_save(dir.path());
  const std::string mpath = save + "/manifest.json";
  const json good = read_json(mpath);
  const std::string keys_before = read_bytes(save + "/emb/key");
  {
    std::string k = keys_before;
    std::memcpy(&k[8], &k[0], 8);  // key 1 := key 0
    std::int64_t k0 = 0;
    std::memcpy(&k0, k.data(), 8);
    write_bytes(save + "/emb/key", k);
    json m = good;
    m["tables"][0]["files"]["key"]["xxh64"] = xxh64_of(save + "/emb/key");
    write_json(mpath, m);
    target t;
    const status s = t.tc.load(save);
    EXPECT_EQ(s.code(), status_code::invalid_argument) << s.to_string();
    EXPECT_NE(s.message().find("'" + save + "/emb/key' repeats key " + std::to_string(k0)),
              std::string::npos)
        << s.message();
    EXPECT_TRUE(t.unchanged());
    load_options o;
    o.allow_duplicate_keys = true;
    EMBCACHE_ASSERT_OK(t.tc.load(save, o));
    EXPECT_EQ(store_model(t.tc, 0).size(), 23u);
  }
  write_bytes(save + "/emb/key", keys_before);
  {
    std::string st = read_bytes(save + "/emb/AdaGrad.accm");
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(&st[4 * (3 * dim + 1)], &inf, 4);  // row 3, state float 1
    write_bytes(save + "/emb/AdaGrad.accm", st);
    std::int64_t k3 = 0;
    std::memcpy(&k3, keys_before.data() + 3 * 8, 8);
    json m = good;
    m["tables"][0]["files"]["AdaGrad.accm"]["xxh64"] = xxh64_of(save + "/emb/AdaGrad.accm");
    write_json(mpath, m);
    target t;
    const status s = t.tc.load(save);
    EXPECT_EQ(s.code(), status_code::invalid_argument) << s.to_string();
    EXPECT_NE(s.message().find("'" + save + "/emb/AdaGrad.accm' holds inf for key " +
                               std::to_string(k3) + " (float 1 of its row)"),
              std::string::npos)
        << s.message();
    EXPECT_TRUE(t.unchanged());
    load_options o;
    o.allow_non_finite = true;
    EMBCACHE_ASSERT_OK(t.tc.load(save, o));
    EXPECT_EQ(store_model(t.tc, 0).at(k3)[dim + 1], inf);
  }
}

// --- HugeCTR's optimizer files and slot ids ----------------------------------------------------

table_options<std::int64_t> table_of(optimizer_kind kind) {
  auto o = emb_table();
  o.optimizer.kind = kind;
  return o;
}

// Keys of the tests below, ascending (the order of a save's files).
const std::vector<std::int64_t> slot_keys = {-9, 2, 40, std::int64_t{1} << 50};

// Trained rows of `slot_keys` in a cache of table `o`: every float of the row distinct.
void fill_rows(training_cache<std::int64_t>& tc) {
  EMBCACHE_ASSERT_OK(tc.begin_pass({slot_keys}));
  const std::size_t w = tc.row_width(0);
  std::vector<float> rows(slot_keys.size() * w);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = 0.25f + float(i);
  EMBCACHE_ASSERT_OK(tc.assign(0, slot_keys.data(), slot_keys.size(), rows.data()));
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST(hugectr_files, a_save_holds_the_state_as_the_optimizers_hugectr_files) {
  struct expected {
    optimizer_kind kind;
    std::vector<const char*> files;  // in the order of the state in a row
  };
  for (const expected& x :
       {expected{optimizer_kind::sgd, {}}, expected{optimizer_kind::adagrad, {"AdaGrad.accm"}},
        expected{optimizer_kind::adam, {"Adam.m", "Adam.v"}},
        expected{optimizer_kind::ftrl, {"Ftrl.n", "Ftrl.z"}}}) {
    SCOPED_TRACE(to_string(x.kind));
    load_dir dir;
    training_cache<std::int64_t> tc({}, {table_of(x.kind)});
    fill_rows(tc);
    EMBCACHE_ASSERT_OK(tc.save(dir.path() + "/save"));
    const std::string folder = dir.path() + "/save/emb/";
    const auto rows = store_model(tc, 0);
    const json files = read_json(dir.path() + "/save/manifest.json")["tables"][0]["files"];
    EXPECT_FALSE(fs::exists(folder + "opt_state"));
    EXPECT_FALSE(files.contains("opt_state"));
    EXPECT_FALSE(fs::exists(folder + "slot_id"));  // no slot id known
    EXPECT_EQ(files.size(), 3 + x.files.size()) << files.dump();
    for (std::size_t p = 0; p < x.files.size(); ++p) {
      std::vector<float> want;
      for (const auto& [k, row] : rows) {
        want.insert(want.end(), row.begin() + dim * (p + 1), row.begin() + dim * (p + 2));
      }
      const std::string path = folder + x.files[p];
      EXPECT_TRUE(read_bytes(path) == bytes_of(want)) << path;
      EXPECT_EQ(files[x.files[p]]["bytes"], want.size() * 4);
      EXPECT_EQ(files[x.files[p]]["xxh64"], xxh64_of(path));
    }
    training_cache<std::int64_t> back({}, {table_of(x.kind)});
    EMBCACHE_ASSERT_OK(back.load(dir.path() + "/save"));
    EXPECT_TRUE(store_model(back, 0) == rows);
  }
}

TEST(hugectr_files, a_save_of_an_earlier_version_with_one_opt_state_file_still_loads) {
  load_dir dir;
  const std::string save = dir.path() + "/save";
  training_cache<std::int64_t> tc({}, {table_of(optimizer_kind::adam)});
  fill_rows(tc);
  EMBCACHE_ASSERT_OK(tc.save(save));
  const auto rows = store_model(tc, 0);
  // The earlier layout: the whole state of each row in one file, float32[n][2 * dim].
  std::vector<float> state;
  for (const auto& [k, row] : rows) state.insert(state.end(), row.begin() + dim, row.end());
  write_bytes(save + "/emb/opt_state", bytes_of(state));
  fs::remove(save + "/emb/Adam.m");
  fs::remove(save + "/emb/Adam.v");
  json m = read_json(save + "/manifest.json");
  auto& files = m["tables"][0]["files"];
  files.erase("Adam.m");
  files.erase("Adam.v");
  files["opt_state"] = {{"bytes", state.size() * 4}, {"xxh64", xxh64_of(save + "/emb/opt_state")}};
  write_json(save + "/manifest.json", m);
  target t;
  training_cache<std::int64_t> back({}, {table_of(optimizer_kind::adam)});
  const status s = back.load(save);
  EMBCACHE_ASSERT_OK(s);
  EXPECT_TRUE(store_model(back, 0) == rows);
  // Its size is checked like every file's.
  fs::resize_file(save + "/emb/opt_state", state.size() * 4 - 4);
  const status torn = back.load(save);
  EXPECT_EQ(torn.code(), status_code::corruption) << torn.to_string();
  EXPECT_NE(torn.message().find("'" + save + "/emb/opt_state' is " +
                                std::to_string(state.size() * 4 - 4) + " bytes"),
            std::string::npos)
      << torn.message();
}

TEST(hugectr_files, slot_ids_survive_save_load_and_save_byte_identical) {
  load_dir dir;
  const std::vector<std::uint64_t> ids = {3, 0, 25, 7};  // of slot_keys
  training_cache<std::int64_t> tc({}, {table_of(optimizer_kind::adam)});
  fill_rows(tc);
  // Given in another order than the keys': the file is in key order.
  const std::vector<std::int64_t> rev(slot_keys.rbegin(), slot_keys.rend());
  const std::vector<std::uint64_t> rev_ids(ids.rbegin(), ids.rend());
  EMBCACHE_ASSERT_OK(tc.set_slot_ids(0, rev.data(), rev_ids.data(), rev.size()));
  EXPECT_EQ(tc.set_slot_ids(1, rev.data(), rev_ids.data(), 1).code(),
            status_code::invalid_argument);
  EMBCACHE_ASSERT_OK(tc.save(dir.path() + "/a"));
  const std::string a = read_bytes(dir.path() + "/a/emb/slot_id");
  EXPECT_TRUE(a == bytes_of(ids));
  const json ma = read_json(dir.path() + "/a/manifest.json");
  EXPECT_EQ(ma["tables"][0]["files"]["slot_id"]["xxh64"], xxh64_of(dir.path() + "/a/emb/slot_id"));

  training_cache<std::int64_t> back({}, {table_of(optimizer_kind::adam)});
  EXPECT_EQ(back.slot_id(0, 40).get_status().code(), status_code::not_found);
  EMBCACHE_ASSERT_OK(back.load(dir.path() + "/a"));
  EXPECT_EQ(back.slot_id(0, 40).value(), 25u);
  EMBCACHE_ASSERT_OK(back.save(dir.path() + "/b"));
  for (const char* file : {"key", "emb_vector", "slot_id", "Adam.m", "Adam.v"}) {
    EXPECT_TRUE(read_bytes(dir.path() + "/a/emb/" + file) == read_bytes(dir.path() + "/b/emb/" + file))
        << file;
  }
  // A folder without `slot_id` loaded over them forgets them.
  EMBCACHE_ASSERT_OK(tc.save(dir.path() + "/c"));
  fs::remove(dir.path() + "/c/emb/slot_id");
  json mc = read_json(dir.path() + "/c/manifest.json");
  mc["tables"][0]["files"].erase("slot_id");
  write_json(dir.path() + "/c/manifest.json", mc);
  EMBCACHE_ASSERT_OK(back.load(dir.path() + "/c"));
  EXPECT_EQ(back.slot_id(0, 40).get_status().code(), status_code::not_found);
  EMBCACHE_ASSERT_OK(back.save(dir.path() + "/d"));
  EXPECT_FALSE(fs::exists(dir.path() + "/d/emb/slot_id"));
}

TEST(hugectr_files, slot_id_is_written_only_when_every_row_has_one) {
  load_dir dir;
  training_cache<std::int64_t> tc({}, {table_of(optimizer_kind::sgd)});
  fill_rows(tc);
  const std::int64_t some[2] = {2, 40};
  const std::uint64_t some_ids[2] = {11, 12};
  EMBCACHE_ASSERT_OK(tc.set_slot_ids(0, some, some_ids, 2));
  EMBCACHE_ASSERT_OK(tc.save(dir.path() + "/partial"));
  EXPECT_FALSE(fs::exists(dir.path() + "/partial/emb/slot_id"));
  const json m = read_json(dir.path() + "/partial/manifest.json")["tables"][0];
  EXPECT_FALSE(m["files"].contains("slot_id"));
  EXPECT_EQ(m["rows_without_slot_id"], 2);

  // table_options::slot_of supplies the rest; set (or loaded) ids come first.
  auto o = table_of(optimizer_kind::sgd);
  o.slot_of = [](std::int64_t k) { return static_cast<std::uint64_t>(k & 0xff) + 100; };
  training_cache<std::int64_t> derived({}, {o});
  fill_rows(derived);
  EMBCACHE_ASSERT_OK(derived.set_slot_ids(0, some, some_ids, 2));
  EXPECT_EQ(derived.slot_id(0, -9).value(), std::uint64_t(0xf7 + 100));
  EMBCACHE_ASSERT_OK(derived.save(dir.path() + "/full"));
  const std::vector<std::uint64_t> want = {0xf7 + 100, 11, 12, 100};
  EXPECT_TRUE(read_bytes(dir.path() + "/full/emb/slot_id") == bytes_of(want));
  EXPECT_FALSE(
      read_json(dir.path() + "/full/manifest.json")["tables"][0].contains("rows_without_slot_id"));
}

// A plain HugeCTR folder of an Adam table with slot ids: `slot_keys`, rows 0.5 + i.
struct hugectr_adam_folder {
  std::string dir, table;
  std::vector<float> vec, m, v;
  std::vector<std::uint64_t> slots = {1, 4, 1, 9};
  explicit hugectr_adam_folder(const std::string& root)
      : dir(root + "/hugectr"), table(root + "/hugectr/emb") {
    fs::create_directories(table);
    for (std::size_t i = 0; i < slot_keys.size() * dim; ++i) {
      vec.push_back(0.5f + float(i));
      m.push_back(-0.5f - float(i));
      v.push_back(0.125f * float(i));
    }
    write_bytes(table + "/key", bytes_of(slot_keys));
    write_bytes(table + "/emb_vector", bytes_of(vec));
    write_bytes(table + "/slot_id", bytes_of(slots));
    write_bytes(table + "/Adam.m", bytes_of(m));
    write_bytes(table + "/Adam.v", bytes_of(v));
  }
};

TEST(hugectr_files, a_hugectr_folder_with_slot_id_and_adam_state_loads_and_resaves_them) {
  load_dir dir;
  hugectr_adam_folder f(dir.path());
  training_cache<std::int64_t> tc({}, {table_of(optimizer_kind::adam)});
  load_options o;
  o.allow_hugectr_folder = true;
  EMBCACHE_ASSERT_OK(tc.load(f.dir, o));
  const auto rows = store_model(tc, 0);
  ASSERT_EQ(rows.size(), slot_keys.size());
  for (std::size_t i = 0; i < slot_keys.size(); ++i) {
    std::vector<float> want(f.vec.begin() + i * dim, f.vec.begin() + (i + 1) * dim);
    want.insert(want.end(), f.m.begin() + i * dim, f.m.begin() + (i + 1) * dim);
    want.insert(want.end(), f.v.begin() + i * dim, f.v.begin() + (i + 1) * dim);
    EXPECT_EQ(rows.at(slot_keys[i]), want) << slot_keys[i];
    EXPECT_EQ(tc.slot_id(0, slot_keys[i]).value(), f.slots[i]);
  }
  EMBCACHE_ASSERT_OK(tc.save(dir.path() + "/save"));
  for (const char* file : {"key", "emb_vector", "slot_id", "Adam.m", "Adam.v"}) {
    EXPECT_TRUE(read_bytes(f.table + "/" + file) == read_bytes(dir.path() + "/save/emb/" + file))
        << file;
  }
  // An AdaGrad table ignores Adam's files: its state is initialized.
  training_cache<std::int64_t> ada({}, {table_of(optimizer_kind::adagrad)});
  EMBCACHE_ASSERT_OK(ada.load(f.dir, o));
  EXPECT_EQ(store_model(ada, 0).at(2),
            (std::vector<float>{4.5f, 5.5f, 6.5f, 7.5f, 0.5f, 0.5f, 0.5f, 0.5f}));
}

TEST(hugectr_files, a_torn_slot_id_or_optimizer_file_is_refused_naming_it) {
  load_dir dir;
  load_options o;
  o.allow_hugectr_folder = true;
  struct torn_case {
    const char* file;
    std::uint64_t size;  // bytes left; 0 = removed
    const char* message;
  };
  for (const torn_case& c : {torn_case{"slot_id", 31, "/slot_id' has 31 bytes; 4 keys need"},
                             torn_case{"slot_id", 40, "/slot_id' has 40 bytes; 4 keys need"},
                             torn_case{"Adam.m", 60, "/Adam.m' has 60 bytes; 4 keys need"},
                             torn_case{"Adam.v", 0, "/Adam.v' is missing while 'Adam.m'"},
                             torn_case{"Adam.m", 0, "/Adam.m' is missing while 'Adam.v'"}}) {
    SCOPED_TRACE(std::string(c.file) + " " + std::to_string(c.size));
    hugectr_adam_folder fresh(dir.path());
    const std::string path = fresh.table + "/" + c.file;
    if (c.size == 0)
      fs::remove(path);
    else if (c.size < fs::file_size(path))
      fs::resize_file(path, c.size);
    else
      write_bytes(path, std::string(c.size, '\0'));
    training_cache<std::int64_t> tc({}, {table_of(optimizer_kind::adam)});
    EMBCACHE_ASSERT_OK(tc.begin_pass({{1000, 1001}}));
    EMBCACHE_ASSERT_OK(tc.end_training());
    const auto before = store_model(tc, 0);
    const status s = tc.load(fresh.dir, o);
    EXPECT_EQ(s.code(), status_code::corruption) << s.to_string();
    EXPECT_NE(s.message().find(fresh.table + c.message), std::string::npos) << s.message();
    EXPECT_TRUE(store_model(tc, 0) == before);
  }
  // In a save, against the manifest.
  const hugectr_adam_folder whole_folder(dir.path());
  training_cache<std::int64_t> tc({}, {table_of(optimizer_kind::adam)});
  EMBCACHE_ASSERT_OK(tc.load(whole_folder.dir, o));
  const std::string save = dir.path() + "/save";
  EMBCACHE_ASSERT_OK(tc.save(save));
  for (const char* file : {"slot_id", "Adam.v"}) {
    SCOPED_TRACE(file);
    const std::string path = save + "/emb/" + file;
    const std::string whole = read_bytes(path);
    fs::resize_file(path, whole.size() - 8);
    training_cache<std::int64_t> other({}, {table_of(optimizer_kind::adam)});
    const status s = other.load(save);
    EXPECT_EQ(s.code(), status_code::corruption) << s.to_string();
    EXPECT_NE(s.message().find("'" + path + "' is " + std::to_string(whole.size() - 8) +
                               " bytes, expected " + std::to_string(whole.size())),
              std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("(truncated)"), std::string::npos) << s.message();
    write_bytes(path, whole);
  }
}

// --- resuming ----------------------------------------------------------------------------------

// docs/training_cache.md: a save resumed and trained on holds the same `key`, `emb_vector` and
// `AdaGrad.accm` bytes as a save of an uninterrupted run; the `version` files (and the manifest's
// versions and checksums of them) may differ, but every row changed after the resume has a
// version above the loaded save's `version`.
TEST(load_validation, a_resumed_save_holds_the_rows_of_an_uninterrupted_run) {
  load_dir dir;
  constexpr int passes = 4, split = 2;
  auto run = [&](training_cache<std::int64_t>& tc, int from, int to) {
    for (int p = from; p < to; ++p) {
      const auto keys = keys_of_pass(p);
      EMBCACHE_ASSERT_OK(tc.begin_pass({keys}));
      train(tc, keys, p);
    }
  };
  // A cache smaller than the key space, so rows are evicted and written back.
  training_cache<std::int64_t> whole({}, {emb_table(30)});
  run(whole, 0, passes);
  EMBCACHE_ASSERT_OK(whole.save(dir.path() + "/whole"));

  training_cache<std::int64_t> first({}, {emb_table(30)});
  run(first, 0, split);
  EMBCACHE_ASSERT_OK(first.save(dir.path() + "/half"));
  training_cache<std::int64_t> rest({}, {emb_table(30)});
  EMBCACHE_ASSERT_OK(rest.load(dir.path() + "/half"));
  run(rest, split, passes);
  EMBCACHE_ASSERT_OK(rest.save(dir.path() + "/rest"));

  for (const char* file : {"key", "emb_vector", "AdaGrad.accm"}) {
    const std::string a = read_bytes(dir.path() + "/whole/emb/" + file);
    EXPECT_GT(a.size(), 0u) << file;
    EXPECT_TRUE(a == read_bytes(dir.path() + "/rest/emb/" + file)) << file;
  }
  const std::uint64_t loaded_version =
      read_json(dir.path() + "/half/manifest.json")["tables"][0]["version"].get<std::uint64_t>();
  const std::string keys = read_bytes(dir.path() + "/rest/emb/key");
  const std::string vers = read_bytes(dir.path() + "/rest/emb/version");
  std::set<std::int64_t> changed;
  for (int p = split; p < passes; ++p)
    for (auto k : keys_of_pass(p)) changed.insert(k);
  std::size_t checked = 0;
  for (std::size_t i = 0; i < keys.size() / 8; ++i) {
    std::int64_t k = 0;
    std::uint64_t v = 0;
    std::memcpy(&k, keys.data() + 8 * i, 8);
    std::memcpy(&v, vers.data() + 8 * i, 8);
    if (changed.count(k)) {
      EXPECT_GT(v, loaded_version) << k;
      ++checked;
    } else {
      EXPECT_LE(v, loaded_version) << k;
    }
  }
  EXPECT_EQ(checked, changed.size());
}

}  // namespace
}  // namespace embcache
