// Dataset schemas: validation and JSON, prep of a click log that is not Criteo's, and shard
// readers that refuse a shard of another shape.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/status_assertions.hpp"
#include "embcache/criteo.hpp"
#include "embcache/dataset_schema.hpp"
#include "embcache/shard.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

std::string read_text(const std::string& path) {
  const std::vector<char> b = test::read_bytes(path);
  return std::string(b.begin(), b.end());
}
using test::scratch_dir;
using test::write_text;

// Label in the third column, then 3 dense and 5 categorical fields.
dataset_schema small_schema() {
  dataset_schema s;
  s.label_column = 2;
  s.dense = {"age", "clicks", "dwell"};
  s.categorical = {"user", "item", "site", "device", "hour"};
  return s;
}

std::string schema_error(const dataset_schema& s) {
  const status st = validate(s, "schema");
  EXPECT_EQ(st.code(), status_code::invalid_argument);
  return st.message();
}

std::string parse_error(const std::string& json) {
  auto r = parse_dataset_schema(json, "'s.json'");
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  EXPECT_EQ(r.get_status().code(), status_code::invalid_argument);
  return r.get_status().message();
}

TEST(dataset_schema, default_is_criteo_and_json_round_trips) {
  const dataset_schema criteo;
  EXPECT_TRUE(criteo.is_criteo());
  EXPECT_EQ(criteo.num_columns(), criteo_field_count);
  EXPECT_EQ(criteo.column_name(0), "label");
  EXPECT_EQ(criteo.column_name(13), "I13");
  EXPECT_EQ(criteo.column_name(14), "C1");
  EMBCACHE_EXPECT_OK(validate(criteo));
  const dataset_schema s = small_schema();
  EXPECT_FALSE(s.is_criteo());
  EXPECT_EQ(s.dense_column(0), 0u);
  EXPECT_EQ(s.dense_column(2), 3u);  // past the label
  EXPECT_EQ(s.categorical_column(0), 4u);
  EXPECT_EQ(s.column_name(2), "label");
  EXPECT_EQ(s.column_name(8), "hour");
  auto back = parse_dataset_schema(dataset_schema_to_json(s), "text");
  EMBCACHE_ASSERT_OK(back);
  EXPECT_TRUE(back.value() == s);
  auto no_label = parse_dataset_schema(R"({"dense": [], "categorical": ["a"]})", "text");
  EMBCACHE_ASSERT_OK(no_label);
  EXPECT_EQ(no_label.value().label_column, 0u);
  EXPECT_EQ(no_label.value().num_columns(), 2u);
}

TEST(dataset_schema, bad_fields_are_named) {
  dataset_schema s = small_schema();
  s.categorical.clear();
  EXPECT_EQ(schema_error(s), "schema.categorical: expected 1 to 63 names, got 0");
  s.categorical.assign(64, "c");
  for (std::size_t i = 0; i < 64; ++i) s.categorical[i] += std::to_string(i);
  EXPECT_EQ(schema_error(s), "schema.categorical: expected 1 to 63 names, got 64");
  s = small_schema();
  s.dense.assign(1025, "d");
  EXPECT_EQ(schema_error(s), "schema.dense: expected at most 1024 names, got 1025");
  s = small_schema();
  s.label_column = 9;
  EXPECT_EQ(schema_error(s), "schema.label_column: expected an integer in [0, 8], got 9");
  s = small_schema();
  s.categorical[3] = "age";
  EXPECT_EQ(schema_error(s), "schema.categorical[3]: name 'age' is used twice");
  s.categorical[3] = "label";
  EXPECT_EQ(schema_error(s), "schema.categorical[3]: name 'label' is used twice");
  s.categorical[3] = "a\tb";
  EXPECT_EQ(schema_error(s),
            "schema.categorical[3]: 'a?b' holds a character other than letters, digits, '_', "
            "'-' and '.'");
  s.categorical[3] = "";
  EXPECT_EQ(schema_error(s), "schema.categorical[3]: expected a name of 1 to 64 bytes, got 0");

  EXPECT_EQ(parse_error("[1]"), "'s.json': schema: expected a JSON object");
  EXPECT_EQ(parse_error("{").rfind("'s.json': not valid JSON", 0), 0u) << parse_error("{");
  EXPECT_EQ(parse_error(R"({"dense": [], "categorical": []})"),
            "'s.json': schema.categorical: expected 1 to 63 names, got 0");
  EXPECT_EQ(parse_error(R"({"dense": [], "categorical": ["a"], "label_column": -1})"),
            "'s.json': schema.label_column: expected a small non-negative integer, got -1");
  EXPECT_EQ(parse_error(R"({"dense": [], "categorical": ["a"], "label_column": 99999999999})"),
            "'s.json': schema.label_column: expected a small non-negative integer, got "
            "99999999999");
  EXPECT_EQ(parse_error(R"({"dense": [1], "categorical": ["a"]})"),
            "'s.json': schema.dense[0]: expected a string, got 1");
  EXPECT_EQ(parse_error(R"({"categorical": ["a"]})"), "'s.json': schema.dense: is missing");
  EXPECT_EQ(parse_error(R"({"dense": [], "categorical": ["a"], "labels": 1})"),
            "'s.json': schema.labels: unknown field (label_column, dense, categorical)");
  EXPECT_EQ(parse_error(R"({"dense": [], "categorical": ["a", "a"]})"),
            "'s.json': schema.categorical[1]: name 'a' is used twice");
  EXPECT_NE(parse_error(R"({"dense": [], "dense": [], "categorical": ["a"]})").find("duplicate"),
            std::string::npos);
}

// A row of small_schema from row number i: the label is 1 exactly when field "user" is u0 or u1.
std::string small_line(int i) {
  const int user = i % 7;
  std::string cols[9];
  cols[2] = user < 2 ? "1" : "0";
  cols[0] = std::to_string(i % 50);
  cols[1] = (i % 4 == 0) ? "" : std::to_string(i % 9 - 2);
  cols[3] = std::to_string(i % 13);
  cols[4] = "u" + std::to_string(user);
  cols[5] = "i" + std::to_string(i % 11);
  cols[6] = (i % 5 == 0) ? "" : "s" + std::to_string(i % 3);
  cols[7] = "d" + std::to_string(i % 2);
  cols[8] = "h" + std::to_string(i % 24);
  std::string s = cols[0];
  for (int c = 1; c < 9; ++c) s += "\t" + cols[c];
  return s;
}

TEST(prep_schema, a_non_criteo_tsv_becomes_shards_of_its_shape) {
  scratch_dir dir;
  std::string text;
  for (int i = 0; i < 40; ++i) text += small_line(i) + "\n";
  std::string bad = small_line(40);
  bad.replace(bad.find('\t'), 1, "\tx");  // column 2, "clicks": not an integer
  text += bad + "\n";
  write_text(dir / "in.tsv", text);
  prep_options o;
  o.inputs = {dir / "in.tsv"};
  o.output_dir = dir / "out";
  o.rows_per_shard = 16;
  o.schema = small_schema();
  auto r = prepare_criteo(o);
  EMBCACHE_ASSERT_OK(r);
  const prep_summary& s = r.value();
  EXPECT_EQ(s.dataset.rows, 40u);
  ASSERT_EQ(s.reports.size(), 1u);
  EXPECT_EQ(s.reports[0].substr(s.reports[0].find(":41:")),
            ":41: field clicks (column 2) 'x' is not an integer");
  ASSERT_EQ(s.dataset.unique_keys.size(), 5u);
  EXPECT_EQ(s.dataset.unique_keys[0], 7u);  // u0..u6
  EXPECT_EQ(s.dataset.unique_keys[3], 2u);  // d0, d1

  // The manifest records the schema, and the shards its counts.
  auto m = read_dataset_manifest(o.output_dir);
  EMBCACHE_ASSERT_OK(m);
  EXPECT_TRUE(m.value().schema == small_schema());
  const auto manifest = nlohmann::json::parse(read_text(o.output_dir + "/manifest.json"));
  EXPECT_EQ(manifest.at("dense_count"), 3);
  EXPECT_EQ(manifest.at("slot_count"), 5);
  EXPECT_EQ(manifest.at("schema").at("label_column"), 2);
  ASSERT_EQ(m.value().shards.size(), 3u);
  auto h = read_shard_header(m.value().shards[0].shard);
  EMBCACHE_ASSERT_OK(h);
  EXPECT_EQ(h.value().num_dense, 3u);
  EXPECT_EQ(h.value().num_slots, 5u);
  EXPECT_EQ(h.value().record_size, 4u * 4 + 8u * 5);

  // Read back with the schema's shape: every row as parse_tsv_line gives it.
  std::vector<std::string> paths;
  for (const auto& f : m.value().shards) paths.push_back(f.shard);
  shard_reader_options ro;
  ro.batch_size = 7;
  ro.num_dense = 3;
  ro.num_slots = 5;
  auto reader = shard_reader::open(paths, ro);
  EMBCACHE_ASSERT_OK(reader);
  shard_batch b;
  int row = 0;
  while (true) {
    EMBCACHE_ASSERT_OK(reader.value()->next(b));
    if (b.size == 0) break;
    EXPECT_EQ(b.num_dense, 3u);
    EXPECT_EQ(b.num_slots, 5u);
    for (std::size_t k = 0; k < b.size; ++k, ++row) {
      tsv_row want;
      EMBCACHE_ASSERT_OK(parse_tsv_line(small_line(row), small_schema(), {}, want));
      EXPECT_EQ(b.labels[k], want.label) << row;
      EXPECT_EQ(b.labels[k], row % 7 < 2 ? 1.0f : 0.0f) << row;
      EXPECT_EQ(std::vector<float>(&b.dense[k * 3], &b.dense[k * 3] + 3), want.dense) << row;
      EXPECT_EQ(std::vector<std::int64_t>(&b.keys[k * 5], &b.keys[k * 5] + 5), want.keys) << row;
      EXPECT_EQ(b.keys[k * 5 + 1], criteo_key(1, "i" + std::to_string(row % 11))) << row;
    }
  }
  EXPECT_EQ(row, 40);

  // A reader expecting Criteo's shape refuses the shard, naming it.
  auto criteo_reader = shard_reader::open(paths);
  ASSERT_FALSE(criteo_reader.ok());
  EXPECT_EQ(criteo_reader.get_status().code(), status_code::invalid_argument);
  EXPECT_EQ(criteo_reader.get_status().message(),
            "shard '" + paths[0] +
                "' has 3 dense features and 5 categorical slots per row, but the dataset schema "
                "has 13 and 26");
  // Criteo's crossed pairs need Criteo's 26 categorical fields.
  o.cross = true;
  o.overwrite = true;
  auto crossed = prepare_criteo(o);
  ASSERT_FALSE(crossed.ok());
  EXPECT_NE(crossed.get_status().message().find("the schema has 5"), std::string::npos)
      << crossed.get_status().message();
  // A schema that is not valid is refused before anything is read.
  o.cross = false;
  o.schema.categorical.clear();
  auto invalid = prepare_criteo(o);
  ASSERT_FALSE(invalid.ok());
  EXPECT_EQ(invalid.get_status().message(),
            "prep: schema.categorical: expected 1 to 63 names, got 0");
}

TEST(prep_schema, a_manifest_whose_schema_disagrees_with_its_counts_is_refused) {
  scratch_dir dir;
  write_text(dir / "in.tsv", small_line(0) + "\n" + small_line(1) + "\n");
  prep_options o;
  o.inputs = {dir / "in.tsv"};
  o.output_dir = dir / "out";
  o.schema = small_schema();
  EMBCACHE_ASSERT_OK(prepare_criteo(o));
  const std::string path = o.output_dir + "/manifest.json";
  auto j = nlohmann::json::parse(read_text(path));
  j["slot_count"] = 26;
  write_text(path, j.dump());
  auto m = read_dataset_manifest(o.output_dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.get_status().code(), status_code::corruption);
  EXPECT_EQ(m.get_status().message(),
            "'" + path +
                "': fields dense_count = 3, slot_count = 26, but the schema has 3 dense and 5 "
                "categorical fields");
  j["slot_count"] = 5;
  j["schema"]["categorical"] = nlohmann::json::array();
  write_text(path, j.dump());
  m = read_dataset_manifest(o.output_dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.get_status().code(), status_code::corruption);
  EXPECT_EQ(m.get_status().message(),
            "'" + path + "': field schema.categorical: expected 1 to 63 names, got 0");
}

}  // namespace
}  // namespace embcache
