// Passes that name a dataset folder, capacity "auto" from the manifest's keyset sizes, and the
// command line's --version and exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/status_assertions.hpp"
#include "common/temp_dir.hpp"
#include "embcache/criteo.hpp"
#include "embcache/keyset.hpp"
#include "embcache/serving.hpp"
#include "embcache/shard.hpp"
#include "embcache/synth.hpp"
#include "embcache/trainer/score.hpp"
#include "embcache/trainer/trainer.hpp"
#include "embcache/version.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

testing::process_temp_cleanup cleanup_at_exit{"embcache_datasets_test"};

std::string fresh_dir(const std::string& name) {
  return testing::process_temp_dir("embcache_datasets_test", name);
}

// <root>/day (4 shards of 500 rows, crossed keys) and <root>/eval, made once per binary.
const std::string& data_root() {
  static const std::string root = [] {
    const std::string r = fresh_dir("data");
    for (const char* name : {"day", "eval"}) {
      synth_options so;
      so.rows = std::string(name) == "day" ? 2000 : 500;
      so.seed = std::string(name) == "day" ? 1 : 2;
      so.cardinality_scale = 0.01;
      dataset_writer_options wo;
      wo.output_dir = r + "/" + name;
      wo.rows_per_shard = 500;
      auto s = write_synth_dataset(so, wo, /*cross=*/true);
      if (!s.ok()) throw std::runtime_error(s.get_status().to_string());
    }
    return r;
  }();
  return root;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The model files of a save, concatenated (rows, optimizer state, dense network).
std::string model_bytes(const std::string& save) {
  std::string all;
  for (const char* f : {"/sparse/wide/key", "/sparse/wide/emb_vector", "/sparse/deep/key",
                        "/sparse/deep/emb_vector", "/sparse/deep/opt_state", "/dense.bin"})
    all += read_bytes(save + f);
  return all;
}

trainer_config base_config() {
  trainer_config c;
  c.data_dir = data_root();
  c.model.hidden = {8};
  c.batch_size = 128;
  c.crossed = true;
  c.log_interval = 0;
  c.threads = 2;
  return c;
}

std::uint64_t keyset_size(const std::string& path) {
  auto k = read_keyset<std::int64_t>(path);
  EMBCACHE_EXPECT_OK(k) << path;
  return k.ok() ? k.value().size() : 0;
}

TEST(trainer_config, a_pass_may_name_a_dataset_folder) {
  auto c = trainer_config_from_text(
      R"({"passes": ["day", {"dataset": "/abs/day"}, ["a.bin"], {"shards": ["b.bin"]}]})");
  EMBCACHE_ASSERT_OK(c);
  ASSERT_EQ(c.value().passes.size(), 4u);
  EXPECT_EQ(c.value().passes[0].dataset, "day");
  EXPECT_TRUE(c.value().passes[0].shards.empty());
  EXPECT_EQ(c.value().passes[1].dataset, "/abs/day");
  EXPECT_EQ(c.value().passes[2].shards, std::vector<std::string>{"a.bin"});
  // It reads back from its JSON.
  const json j = c.value();
  EXPECT_EQ(j["passes"][0], json({{"dataset", "day"}}));
  auto again = trainer_config_from_json(j);
  EMBCACHE_ASSERT_OK(again);
  EXPECT_EQ(json(again.value()), j);

  const struct {
    const char* text;
    const char* error;
  } bad[] = {
      {R"({"passes": [{"dataset": "day", "shards": ["a.bin"]}]})",
       "config text: config.passes[0]: names both shards and a dataset; give one of them"},
      {R"({"passes": [""]})", "config text: config.passes[0].dataset: empty path"},
      {R"({"passes": [{"dataset": 3}]})",
       "config text: config.passes[0].dataset: wrong type (number)"},
      {R"({"passes": [{}]})",
       "config text: config.passes[0].shards: required (or dataset, a dataset folder)"},
  };
  for (const auto& b : bad) {
    auto r = trainer_config_from_text(b.text);
    ASSERT_FALSE(r.ok()) << b.text;
    EXPECT_EQ(r.get_status().code(), status_code::invalid_argument);
    EXPECT_EQ(r.get_status().message(), b.error) << b.text;
  }
}

TEST(trainer_config, capacity_auto_reads_and_writes_as_auto) {
  auto c = trainer_config_from_text(
      R"({"passes": [["a.bin"]], "tables": [{"name": "wide", "capacity": "auto", "slots": 8},
                                            {"name": "deep", "capacity": 100}]})");
  EMBCACHE_ASSERT_OK(c);
  EXPECT_TRUE(c.value().tables[0].capacity_auto);
  EXPECT_FALSE(c.value().tables[1].capacity_auto);
  EXPECT_EQ(c.value().tables[1].capacity, 100u);
  const json j = c.value();
  EXPECT_EQ(j["tables"][0]["capacity"], "auto");
  EXPECT_EQ(j["tables"][1]["capacity"], 100);
  auto bad = trainer_config_from_text(
      R"({"passes": [["a.bin"]], "tables": [{"name": "wide", "capacity": "big"},
                                            {"name": "deep"}]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.get_status().message(),
            "config text: config.tables[0].capacity: expected an integer in [1, 1099511627776] "
            "or \"auto\", got \"big\"");
}

TEST(trainer_datasets, a_folder_pass_expands_to_its_shards_in_manifest_order) {
  trainer_config c = base_config();
  c.passes = {{{}, "day"}, {{}, data_root() + "/eval"}};
  auto r = resolve_trainer_config(c);
  EMBCACHE_ASSERT_OK(r);
  const auto& p = r.value().passes;
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].shards, (std::vector<std::string>{"day/shard-00000.bin", "day/shard-00001.bin",
                                                   "day/shard-00002.bin", "day/shard-00003.bin"}));
  EXPECT_EQ(p[1].shards, std::vector<std::string>{data_root() + "/eval/shard-00000.bin"});
  EXPECT_TRUE(p[0].dataset.empty());

  c.passes = {{{}, "missing"}};
  auto m = resolve_trainer_config(c);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.get_status().code(), status_code::not_found) << m.get_status().to_string();
  EXPECT_EQ(m.get_status().message().rfind("config.passes[0].dataset: ", 0), 0u)
      << m.get_status().message();
  EXPECT_NE(m.get_status().message().find(data_root() + "/missing/manifest.json"),
            std::string::npos)
      << m.get_status().message();
}

TEST(trainer_datasets, a_folder_pass_trains_to_the_same_bits_as_its_shard_list) {
  const std::string saves = fresh_dir("same_bits");
  std::string model[2];
  for (int i = 0; i < 2; ++i) {
    trainer_config c = base_config();
    if (i == 0) {
      c.passes = {{{}, "day"}};
    } else {
      c.passes = {{{"day/shard-00000.bin", "day/shard-00001.bin", "day/shard-00002.bin",
                    "day/shard-00003.bin"}}};
    }
    c.save_dir = saves + "/" + std::to_string(i);
    auto t = trainer::create(c);
    EMBCACHE_ASSERT_OK(t);
    t.value()->set_log([](const std::string&) {});
    EMBCACHE_ASSERT_OK(t.value()->run());
    EXPECT_EQ(t.value()->history().at(0).samples, 2000u);
    model[i] = model_bytes(c.save_dir);
  }
  EXPECT_GT(model[0].size(), 1000u);
  EXPECT_TRUE(model[0] == model[1]) << "a folder pass and its shard list trained different models";
  // A shard list in another order trains a different model: the comparison can fail.
  trainer_config c = base_config();
  c.passes = {{{"day/shard-00001.bin", "day/shard-00000.bin", "day/shard-00002.bin",
                "day/shard-00003.bin"}}};
  c.save_dir = saves + "/other";
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  t.value()->set_log([](const std::string&) {});
  EMBCACHE_ASSERT_OK(t.value()->run());
  EXPECT_FALSE(model_bytes(c.save_dir) == model[0]);
}

TEST(trainer_datasets, manifest_records_each_shards_keyset_sizes) {
  auto m = read_dataset_manifest(data_root() + "/day");
  EMBCACHE_ASSERT_OK(m);
  ASSERT_EQ(m.value().shards.size(), 4u);
  for (const shard_files& f : m.value().shards) {
    EXPECT_TRUE(f.has_key_counts);
    EXPECT_EQ(f.keys, keyset_size(f.keyset)) << f.keyset;
    EXPECT_EQ(f.crossed_keys, keyset_size(f.crossed_keyset)) << f.crossed_keyset;
    EXPECT_GT(f.keys, 0u);
  }
}

TEST(trainer_datasets, capacity_auto_is_the_largest_keyset_the_passes_need) {
  trainer_config c = base_config();
  // Shards 1 and 2 of the day, and the eval dataset (which does not count: not a pass).
  c.passes = {{{"day/shard-00001.bin"}}, {{"day/shard-00002.bin"}}};
  c.eval_shard = "eval/shard-00000.bin";
  for (auto& t : c.tables) t.capacity_auto = true;
  std::uint64_t deep = 0, wide = 0, wide_uncrossed = 0;
  for (const char* s : {"day/shard-00001", "day/shard-00002"}) {
    const std::string base = data_root() + "/" + s;
    const std::uint64_t k = keyset_size(base + ".keys"), x = keyset_size(base + ".cross.keys");
    deep = std::max(deep, k);
    wide = std::max(wide, k + x);
    wide_uncrossed = std::max(wide_uncrossed, k);
  }
  ASSERT_NE(wide, wide_uncrossed);
  auto r = resolve_trainer_config(c);
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(r.value().tables[0].name, "wide");
  EXPECT_EQ(r.value().tables[0].capacity, wide);
  EXPECT_EQ(r.value().tables[1].capacity, deep);
  EXPECT_FALSE(r.value().tables[0].capacity_auto);
  // Without crossing the wide table takes the slot keys only.
  c.crossed = false;
  r = resolve_trainer_config(c);
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(r.value().tables[0].capacity, wide_uncrossed);
  // A folder pass counts all its shards; a run with the computed capacities trains.
  c.crossed = true;
  c.passes = {{{}, "day"}};
  std::uint64_t all_deep = 0;
  for (int i = 0; i < 4; ++i)
    all_deep = std::max(all_deep, keyset_size(data_root() + "/day/" + keyset_file_name(i)));
  r = resolve_trainer_config(c);
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(r.value().tables[1].capacity, all_deep);
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  t.value()->set_log([](const std::string&) {});
  EMBCACHE_EXPECT_OK(t.value()->run());
}

TEST(trainer_datasets, capacity_auto_with_an_older_manifest_names_the_field) {
  // A copy of the day whose manifest has no keyset sizes (as written before they were recorded).
  const std::string old = fresh_dir("old") + "/day";
  fs::copy(data_root() + "/day", old);
  json m = json::parse(read_bytes(old + "/manifest.json"));
  for (auto& s : m["shards"]) {
    s.erase("keys");
    s.erase("crossed_keys");
  }
  std::ofstream(old + "/manifest.json") << m.dump(2);
  trainer_config c = base_config();
  c.passes = {{{}, old}};
  auto plain = resolve_trainer_config(c);  // without "auto" the older manifest is fine
  EMBCACHE_ASSERT_OK(plain);
  EXPECT_FALSE(plain.value().tables[1].capacity_auto);
  c.tables[1].capacity_auto = true;
  auto r = resolve_trainer_config(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.get_status().code(), status_code::invalid_argument);
  EXPECT_EQ(r.get_status().message(),
            "config.tables[1].capacity: \"auto\" needs field shards[0].keys of '" + old +
                "/manifest.json', which has no keyset sizes (a dataset written before they were "
                "recorded: prepare it again, or give the capacity as a number)");
  // A shard its folder's manifest does not list.
  c.passes = {{{"day/shard-00009.bin"}}};
  r = resolve_trainer_config(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.get_status().message(),
            "config.tables[1].capacity: \"auto\" needs the keyset size "
            "of shard '" +
                data_root() + "/day/shard-00009.bin', which '" + data_root() +
                "/day/manifest.json' does not list");
}

// A click log that is not Criteo's: label last, 2 dense and 4 categorical fields; the label is 1
// exactly when field "user" is one of the first three of its nine values.
std::string click_log(const std::string& dir, const char* name, int first, int rows) {
  std::string text;
  for (int i = first; i < first + rows; ++i) {
    const int user = (i * 7 + i / 9) % 9;
    text += std::to_string(i % 17) + "\t" + std::to_string(i % 5) + "\tu" + std::to_string(user) +
            "\tp" + std::to_string(i % 13) + "\tc" + std::to_string(i % 4) + "\tw" +
            std::to_string(i % 7) + "\t" + (user < 3 ? "1" : "0") + "\n";
  }
  const std::string tsv = dir + "/" + name + ".tsv";
  std::ofstream(tsv, std::ios::binary) << text;
  prep_options o;
  o.inputs = {tsv};
  o.output_dir = dir + "/" + name;
  o.rows_per_shard = 600;
  o.schema.label_column = 6;
  o.schema.dense = {"f0", "f1"};
  o.schema.categorical = {"user", "page", "country", "weekday"};
  auto r = prepare_criteo(o);
  EMBCACHE_EXPECT_OK(r);
  return o.output_dir;
}

// The rows of a model folder, as a serving store would hand them to score_shard.
class folder_rows : public row_lookup {
 public:
  explicit folder_rows(model_folder f) : folder_(std::move(f)) {}
  status lookup(const std::string& table, std::size_t dim, const std::int64_t* keys, std::size_t n,
                float* rows, std::uint8_t* found) override {
    for (const folder_table& t : folder_.tables) {
      if (t.name != table) continue;
      for (std::size_t i = 0; i < n; ++i) {
        found[i] = 0;
        for (std::size_t r = 0; r < t.keys.size(); ++r) {
          if (t.keys[r] != keys[i]) continue;
          std::copy_n(t.vectors.begin() + r * dim, dim, rows + i * dim);
          found[i] = 1;
          break;
        }
      }
    }
    return {};
  }

 private:
  model_folder folder_;
};

TEST(trainer_datasets, a_non_criteo_schema_sizes_the_model_and_learns) {
  const std::string dir = fresh_dir("schema");
  click_log(dir, "train", 0, 1200);
  const std::string eval = click_log(dir, "eval", 5000, 300) + "/shard-00000.bin";
  trainer_config c;
  c.data_dir = dir;
  c.passes = {{{}, "train"}, {{}, "train"}};
  c.eval_shard = eval;
  c.model.hidden = {8};
  c.batch_size = 64;
  c.log_interval = 0;
  c.threads = 2;
  c.dense_device = device_choice::host;  // score_shard runs the dense network on the host
  c.save_dir = dir + "/save";
  auto resolved = resolve_trainer_config(c);
  EMBCACHE_ASSERT_OK(resolved);
  EXPECT_EQ(resolved.value().num_dense, 2u);
  EXPECT_EQ(resolved.value().num_slots, 4u);
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  t.value()->set_log([](const std::string&) {});
  EMBCACHE_ASSERT_OK(t.value()->run());
  auto m = t.value()->evaluate();
  EMBCACHE_ASSERT_OK(m);
  EXPECT_EQ(m.value().samples, 300u);
  EXPECT_GT(m.value().auc, 0.9) << "the label is a function of field user";
  // Scoring follows the save's schema: the same metrics from its rows, a Criteo shard refused.
  auto folder = read_model_folder(c.save_dir + "/sparse");
  EMBCACHE_ASSERT_OK(folder);
  folder_rows rows(std::move(folder).value());
  auto scored = score_shard(c.save_dir, eval, rows);
  EMBCACHE_ASSERT_OK(scored);
  EXPECT_EQ(scored.value().samples, 300u);
  EXPECT_EQ(scored.value().auc, m.value().auc);
  auto wrong = score_shard(c.save_dir, data_root() + "/eval/shard-00000.bin", rows);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.get_status().message().find("has 13 dense features and 26 categorical slots"),
            std::string::npos)
      << wrong.get_status().message();

  // A Criteo shard in a later pass is refused, named.
  trainer_pass_config criteo;
  criteo.shards = {data_root() + "/day/shard-00000.bin"};
  auto p = t.value()->run_pass(criteo);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.get_status().code(), status_code::invalid_argument);
  EXPECT_NE(p.get_status().message().find("shard '" + data_root() +
                                          "/day/shard-00000.bin' has 13 dense features and 26 "
                                          "categorical slots per row, but the dataset schema "
                                          "has 2 and 4"),
            std::string::npos)
      << p.get_status().message();
  // Datasets of two schemas in one run are refused at resolution.
  c.passes = {{{}, "train"}, {{}, data_root() + "/day"}};
  auto mixed = resolve_trainer_config(c);
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.get_status().message().rfind("config.passes[1].dataset: dataset '", 0), 0u)
      << mixed.get_status().message();
  // Crossed keys pair Criteo's slots: refused for this schema, naming the field.
  c.passes = {{{}, "train"}};
  c.crossed = true;
  auto crossed = resolve_trainer_config(c);
  ASSERT_FALSE(crossed.ok());
  EXPECT_EQ(crossed.get_status().message(),
            "config.crossed: crossed keys pair Criteo's 26 categorical slots, the data has 4");
}

#ifdef EMBCACHE_TRAIN_EXE
// Runs embcache-train with `args`; stdout and stderr together.
std::pair<int, std::string> train_cli(const std::string& args) {
  const std::string log = fresh_dir("cli") + "/out.log";
  const std::string cmd =
      std::string("'") + EMBCACHE_TRAIN_EXE + "' " + args + " > '" + log + "' 2>&1";
  const int w = std::system(cmd.c_str());
  return {WIFEXITED(w) ? WEXITSTATUS(w) : -1, read_bytes(log)};
}

TEST(trainer_cli, version_prints_name_version_and_spaces) {
  const auto [rc, out] = train_cli("--version");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, std::string("embcache-train ") + version_string + " (" + build_spaces + ")\n");
}

TEST(trainer_cli, usage_errors_exit_two_and_run_time_failures_one) {
  for (const char* args : {"", "--config", "--bogus --config x.json", "--config a.json extra"}) {
    const auto [rc, out] = train_cli(args);
    EXPECT_EQ(rc, 2) << args << ": " << out;
  }
  const auto [missing, out] = train_cli("--config /nonexistent/run.json");
  EXPECT_EQ(missing, 1) << out;
  EXPECT_NE(out.find("not_found: /nonexistent/run.json"), std::string::npos) << out;
  // A configuration whose dataset folder is missing: a run-time failure naming the pass.
  const std::string dir = fresh_dir("cli_missing");
  std::ofstream(dir + "/run.json") << R"({"passes": ["nowhere"], "data_dir": ")" << dir << "\"}";
  const auto [rc, text] = train_cli("--config '" + dir + "/run.json' --print-config");
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("config.passes[0].dataset: "), std::string::npos) << text;
}

TEST(trainer_cli, print_config_shows_the_resolved_configuration) {
  const std::string dir = fresh_dir("cli_print");
  std::ofstream(dir + "/run.json") << R"({"passes": ["day"], "crossed": true, "data_dir": ")"
                                   << data_root() << R"(", "tables": [{"name": "wide"},
                                       {"name": "deep", "capacity": "auto"}]})";
  const auto [rc, out] = train_cli("--config '" + dir + "/run.json' --print-config");
  ASSERT_EQ(rc, 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["passes"][0]["shards"].size(), 4u);
  std::uint64_t deep = 0;
  for (int i = 0; i < 4; ++i)
    deep = std::max(deep, keyset_size(data_root() + "/day/" + keyset_file_name(i)));
  EXPECT_EQ(j["tables"][1]["capacity"], deep);
}
#endif

}  // namespace
}  // namespace embcache
