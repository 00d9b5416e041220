// The cache-backed trainer: it learns, swapping and interruption change no bit of the model, the
// host-hybrid path agrees with the cache, bad configurations name their field, real Criteo rows.
#include "embcache/trainer/trainer.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "embcache/criteo.hpp"
#include "embcache/synth.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string temp_prefix() { return "embcache_trainer_test_" + std::to_string(::getpid()) + "_"; }

// Removes this process's folders when the test binary exits.
struct temp_cleanup {
  ~temp_cleanup() {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(fs::temp_directory_path(), ec))
      if (e.path().filename().string().rfind(temp_prefix(), 0) == 0) fs::remove_all(e.path(), ec);
  }
} cleanup_at_exit;

std::string temp_dir(const std::string& name) {
  const std::string d = (fs::temp_directory_path() /
                         ("embcache_trainer_test_" + std::to_string(::getpid()) + "_" + name))
                            .string();
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Six shards of 1,500 synthetic rows with crossed keys, made once per test binary.
const std::string& dataset() {
  static const std::string dir = [] {
    const std::string d = temp_dir("data");
    synth_options so;
    so.rows = 9000;
    so.cardinality_scale = 0.01;
    dataset_writer_options wo;
    wo.output_dir = d;
    wo.rows_per_shard = 1500;
    auto s = write_synth_dataset(so, wo, /*cross=*/true);
    if (!s.ok()) throw std::runtime_error(s.get_status().to_string());
    return d;
  }();
  return dir;
}

std::string shard(std::size_t i) { return shard_file_name(i); }

trainer_config small_config(const std::string& name) {
  trainer_config c;
  c.data_dir = dataset();
  c.passes = {{{shard(0), shard(1)}}, {{shard(2)}}, {{shard(3), shard(4)}}};
  c.eval_shard = shard(5);
  c.model.hidden = {32, 16};
  c.model.dropout = 0.1f;  // on, so that its stream is part of what must be reproduced
  c.model.seed = 7;
  c.batch_size = 128;
  c.crossed = true;
  c.seed = 3;
  c.log_interval = 0;
  c.threads = 2;
  c.save_dir = temp_dir(name) + "/save";
  return c;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(bool(in)) << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The model files of a save: rows, slot ids and optimizer state (HugeCTR's per-optimizer files)
// of both tables, and the dense blob. The `version` files hold the cache's update clock, which
// counts swap calls too, and trainer.json holds timings: neither is part of the model.
void expect_same_model(const std::string& a, const std::string& b) {
  for (const char* table : {"wide", "deep"}) {
    const std::string folder = std::string("/sparse/") + table;
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(a + folder)) {
      if (e.path().filename() != "version") files.push_back(e.path().filename().string());
    }
    std::sort(files.begin(), files.end());
    EXPECT_GE(files.size(), 3u) << folder;  // key, emb_vector, slot_id (+ the state files)
    EXPECT_TRUE(std::find(files.begin(), files.end(), "slot_id") != files.end()) << folder;
    for (const std::string& file : files) {
      const std::string f = folder + "/" + file;
      const std::string x = read_bytes(a + f), y = read_bytes(b + f);
      EXPECT_GT(x.size(), 0u) << f;
      EXPECT_TRUE(x == y) << f << " differs between " << a << " and " << b;
    }
  }
  EXPECT_TRUE(read_bytes(a + "/dense.bin") == read_bytes(b + "/dense.bin")) << "dense.bin";
}

struct run_result {
  std::vector<pass_metrics> history;
  table_counters totals;
  std::uint64_t step = 0;
};

run_result run(const trainer_config& c) {
  auto t = trainer::create(c);
  EXPECT_TRUE(t.ok()) << t.get_status().to_string();
  if (!t.ok()) return {};
  const status s = t.value()->run();
  EXPECT_TRUE(s.ok()) << s.to_string();
  run_result r;
  r.history = t.value()->history();
  for (const auto& tc : t.value()->cache().counters().total) r.totals += tc;
  r.step = t.value()->step();
  return r;
}

std::size_t count_keys(const trainer_config& c, const char* file) {
  std::vector<std::int64_t> all;
  for (const auto& p : c.passes)
    for (const auto& s : p.shards) {
      const std::string base = c.data_dir + "/" + s.substr(0, s.size() - 4);
      for (const std::string& f : {base + ".keys", base + ".cross.keys"}) {
        if (std::string(file) == "deep" && f.find(".cross.") != std::string::npos) continue;
        auto k = read_keyset<std::int64_t>(f);
        EXPECT_TRUE(k.ok());
        all.insert(all.end(), k.value().begin(), k.value().end());
      }
    }
  std::sort(all.begin(), all.end());
  return std::size_t(std::unique(all.begin(), all.end()) - all.begin());
}

// Caches that hold the largest shard keyset of each table and no more: every pass evicts.
void size_to_largest_shard(trainer_config& c) {
  std::size_t wide = 0, deep = 0;
  for (const auto& p : c.passes)
    for (const auto& s : p.shards) {
      trainer_config one = c;
      one.passes = {{{s}}};
      wide = std::max(wide, count_keys(one, "wide"));
      deep = std::max(deep, count_keys(one, "deep"));
    }
  c.tables[0].capacity = wide;
  c.tables[1].capacity = deep;
}

TEST(Trainer, LearnsOnSyntheticData) {
  trainer_config c = small_config("learns");
  c.save_dir.clear();
  c.output_dir = temp_dir("learns") + "/out";
  const run_result r = run(c);
  ASSERT_EQ(r.history.size(), 3u);
  EXPECT_EQ(r.step, 5u * 12u);  // five 1,500-row shards, batch 128: 12 steps each
  EXPECT_EQ(r.history[0].samples, 3000u);
  EXPECT_GT(r.history.back().eval_auc, 0.70);
  EXPECT_LT(r.history.back().train_loss, r.history.front().train_loss);
  // metrics.jsonl: one object per pass with the documented fields.
  std::ifstream in(c.output_dir + "/metrics.jsonl");
  std::string line;
  std::size_t lines = 0;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    for (const char* k : {"pass", "samples", "train_loss", "eval_auc", "eval_logloss",
                          "swap_seconds", "rows_in", "rows_out", "hit_rate", "samples_per_s"})
      EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_EQ(j.at("pass").get<std::uint64_t>(), ++lines);
  }
  EXPECT_EQ(lines, 3u);
}

TEST(Trainer, SwappingChangesNoBitOfTheModel) {
  // Everything resident, against a keyset-mode cache the size of the largest shard's keyset
  // (every pass evicts) and an on-demand cache of 10% of each table.
  trainer_config full = small_config("full");
  full.passes = {{{shard(0)}}, {{shard(1)}}, {{shard(2)}}, {{shard(3)}}, {{shard(4)}}};
  full.batch_size = 32;  // so that a batch's distinct keys fit in 10% of the deep table
  const run_result rf = run(full);
  EXPECT_EQ(rf.totals.rows_evicted, 0u);

  trainer_config small = full;
  small.save_dir = temp_dir("small") + "/save";
  size_to_largest_shard(small);
  const run_result rs = run(small);
  EXPECT_GT(rs.totals.rows_evicted, 0u);
  EXPECT_GT(rs.totals.rows_pushed, 0u);

  trainer_config od = full;
  od.mode = trainer_mode::on_demand;
  od.save_dir = temp_dir("on_demand") + "/save";
  const std::size_t wide_rows = count_keys(full, "wide"), deep_rows = count_keys(full, "deep");
  od.tables[0].capacity = wide_rows / 10;
  od.tables[1].capacity = deep_rows / 10;
  const run_result ro = run(od);
  EXPECT_GT(ro.totals.rows_evicted, wide_rows / 2);

  ASSERT_EQ(rs.history.size(), rf.history.size());
  ASSERT_EQ(ro.history.size(), rf.history.size());
  for (std::size_t p = 0; p < rf.history.size(); ++p) {
    EXPECT_EQ(rs.history[p].eval_auc, rf.history[p].eval_auc) << p;
    EXPECT_EQ(ro.history[p].eval_auc, rf.history[p].eval_auc) << p;
    EXPECT_EQ(rs.history[p].train_loss, rf.history[p].train_loss) << p;
    EXPECT_EQ(ro.history[p].eval_logloss, rf.history[p].eval_logloss) << p;
  }
  expect_same_model(full.save_dir, small.save_dir);
  expect_same_model(full.save_dir, od.save_dir);
}

// A dataset prepared with HugeCTR's raw keysets (its manifest says keyset_format hugectr_raw)
// trains to the same bits as the same data with our keysets.
TEST(TrainerData, AHugeCtrRawKeysetDatasetTrainsLikeOurs) {
  const std::string raw = temp_dir("raw_data");
  synth_options so;
  so.rows = 9000;
  so.cardinality_scale = 0.01;
  dataset_writer_options wo;
  wo.output_dir = raw;
  wo.rows_per_shard = 1500;
  wo.keyset = keyset_format::hugectr_raw;
  auto made = write_synth_dataset(so, wo, /*cross=*/true);
  ASSERT_TRUE(made.ok()) << made.get_status().to_string();
  // The raw keysets have no header: our reader refuses them, so only the manifest makes it work.
  EXPECT_FALSE(read_keyset<std::int64_t>(raw + "/shard-00000.keys").ok());

  trainer_config ours = small_config("ours_keysets");
  ours.passes = {{{shard(0), shard(1)}}, {{shard(2)}}};
  size_to_largest_shard(ours);
  trainer_config theirs = ours;
  theirs.data_dir = raw;
  theirs.save_dir = temp_dir("raw_keysets") + "/save";
  const run_result a = run(ours), b = run(theirs);
  ASSERT_EQ(a.history.size(), 2u);
  ASSERT_EQ(b.history.size(), 2u);
  EXPECT_GT(b.totals.rows_evicted, 0u);
  EXPECT_EQ(a.history[1].eval_auc, b.history[1].eval_auc);
  expect_same_model(ours.save_dir, theirs.save_dir);
}

TEST(Trainer, ResumeEqualsAnUninterruptedRun) {
  trainer_config whole = small_config("whole");
  size_to_largest_shard(whole);
  const run_result rw = run(whole);

  trainer_config first = whole;
  first.passes = {whole.passes[0]};
  first.save_dir = temp_dir("first") + "/save";
  run(first);

  trainer_config rest = whole;
  rest.passes = {whole.passes[1], whole.passes[2]};
  rest.resume_from = first.save_dir;
  rest.save_dir = temp_dir("rest") + "/save";
  auto t = trainer::create(rest);
  ASSERT_TRUE(t.ok()) << t.get_status().to_string();
  EXPECT_EQ(t.value()->passes_done(), 1u);
  EXPECT_EQ(t.value()->step(), 24u);
  ASSERT_TRUE(t.value()->run().ok());
  EXPECT_EQ(t.value()->step(), rw.step);
  ASSERT_EQ(t.value()->history().size(), 3u);
  EXPECT_EQ(t.value()->history()[2].pass, 3u);
  EXPECT_EQ(t.value()->history()[2].eval_auc, rw.history[2].eval_auc);
  EXPECT_EQ(t.value()->history()[2].train_loss, rw.history[2].train_loss);
  expect_same_model(whole.save_dir, rest.save_dir);

  // A corrupted dense blob is refused, naming the file.
  {
    std::fstream f(first.save_dir + "/dense.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  auto bad = trainer::create(rest);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.get_status().message().find("dense.bin"), std::string::npos)
      << bad.get_status().to_string();
}

TEST(Trainer, HostHybridAgreesWithTheCache) {
  trainer_config cached = small_config("cached");
  size_to_largest_shard(cached);
  const run_result rc = run(cached);
  trainer_config hybrid = cached;
  hybrid.mode = trainer_mode::host_hybrid;
  hybrid.save_dir = temp_dir("hybrid") + "/save";
  const run_result rh = run(hybrid);
  ASSERT_EQ(rh.history.size(), rc.history.size());
  for (std::size_t p = 0; p < rc.history.size(); ++p) {
    EXPECT_EQ(rh.history[p].train_loss, rc.history[p].train_loss) << p;
    EXPECT_EQ(rh.history[p].eval_auc, rc.history[p].eval_auc) << p;
  }
  expect_same_model(cached.save_dir, hybrid.save_dir);
}

TEST(TrainerConfig, ErrorsNameTheField) {
  auto err = [](const json& j) {
    auto c = trainer_config_from_json(j);
    return c.ok() ? std::string("ok") : c.get_status().message();
  };
  const json base = {{"passes", {{"a.bin"}}}};
  EXPECT_EQ(err(base), "ok");
  json j = base;
  j["tables"] = {{{"name", "wide"}}, {{"name", "deep"}, {"capacity", 0}}};
  EXPECT_EQ(err(j), "config.tables[1].capacity: expected an integer in [1, 1099511627776], got 0");
  j = base;
  j["tables"] = {{{"name", "wide"}}, {{"name", "deep"}, {"capacity", "big"}}};
  EXPECT_EQ(err(j),
            "config.tables[1].capacity: expected an integer in [1, 1099511627776] or "
            "\"auto\", got \"big\"");
  j = base;
  j["tables"] = {{{"name", "wide"}}, {{"name", "deep"}, {"capacity", 100}, {"max_resident", 99}}};
  EXPECT_EQ(err(j), "config.tables[1].max_resident: must be 0 (default) or >= capacity");
  j = base;
  j["tables"] = {{{"name", "wide"}, {"capacity", 100}, {"slots", 120}, {"max_resident", 121}},
                 {{"name", "deep"}}};
  EXPECT_EQ(err(j), "config.tables[0].max_resident: must be <= slots");
  j = base;
  j["tables"] = {{{"name", "wide"}, {"capacity", 100}, {"slots", 90}}, {{"name", "deep"}}};
  EXPECT_EQ(err(j), "config.tables[0].slots: must be 0 (default) or >= capacity");
  j = base;
  j["batch_sise"] = 4;
  EXPECT_EQ(err(j), "config.batch_sise: unknown field");
  j = base;
  j["mode"] = "lazy";
  EXPECT_EQ(err(j), "config.mode: \"lazy\" is not a mode (keyset, on_demand, host_hybrid)");
  j = base;
  j["tables"] = {{{"name", "wide"}, {"optimizer", {{"kind", "ftrl"}, {"ftrl_l1", -1}}}},
                 {{"name", "deep"}}};
  EXPECT_EQ(err(j), "config.tables[0].optimizer.ftrl_l1: expected a finite number >= 0, got -1");
  EXPECT_EQ(err(json::object()), "config.passes: must hold at least 1 pass");
  j = base;
  j["tables"] = {{{"name", "wide"}, {"store", "rocksdb"}}, {{"name", "deep"}}};
  EXPECT_EQ(err(j), "config.tables[0].store_path: required with store \"rocksdb\"");
  j = base;
  j["model"] = {{"dropout", 1.5}};
  EXPECT_EQ(err(j), "config.model.dropout: expected a number in [0, 1), got 1.5");
  j = base;
  j["dense_device"] = "gpu";
  EXPECT_EQ(err(j), "config.dense_device: \"gpu\" is not a device (host, cuda, auto)");
  j = base;
  j["dense_device"] = 1;
  EXPECT_EQ(err(j), "config.dense_device: wrong type (number)");
  for (const char* d : {"host", "cuda", "auto"}) {
    j = base;
    j["dense_device"] = d;
    auto parsed = trainer_config_from_json(j);
    ASSERT_TRUE(parsed.ok()) << d;
    EXPECT_EQ(parsed.value().dense_device, d);
  }
  EXPECT_EQ(trainer_config{}.dense_device, "auto");
  j = base;
  j["blas_threads"] = -1;
  EXPECT_EQ(err(j), "config.blas_threads: expected an integer in [0, 4096], got -1");

  // Every field round-trips, and a table named "wide" starts from the wide defaults.
  j = base;
  j["tables"] = {
      {{"name", "wide"}},
      {{"name", "deep"}, {"dim", 8}, {"capacity", 3000}, {"slots", 5000}, {"max_resident", 4000}}};
  auto c = trainer_config_from_json(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c.value().tables[1].slots, 5000u);
  EXPECT_EQ(c.value().tables[1].max_resident, 4000u);
  EXPECT_EQ(c.value().tables[0].dim, 1u);
  EXPECT_EQ(c.value().tables[0].optimizer.kind, optimizer_kind::ftrl);
  EXPECT_EQ(c.value().tables[1].dim, 8u);
  const json full = c.value();
  auto again = trainer_config_from_json(full);
  ASSERT_TRUE(again.ok()) << again.get_status().to_string();
  EXPECT_EQ(json(again.value()), full);
}

// A stand-in for the cuda backend: the host model under another device name, counting its builds.
int fake_cuda_builds = 0;
std::unique_ptr<dense_backend> fake_cuda(const wide_deep_options& o) {
  ++fake_cuda_builds;
  return make_host_dense_backend(o);
}

// Restores the factory this binary started with (none: it does not link embcache::cuda).
struct factory_guard {
  ~factory_guard() { set_cuda_dense_backend_factory(nullptr); }
};

TEST(TrainerDenseDevice, CudaIsAClearErrorWithoutTheCudaSpace) {
  ASSERT_EQ(cuda_dense_backend_factory(), nullptr);
  trainer_config c = small_config("dense_device");
  c.dense_device = "cuda";
  auto t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::unsupported);
  EXPECT_EQ(t.get_status().message(),
            "config.dense_device: \"cuda\" needs the cuda space, and this program was built "
            "without it (link embcache::cuda, call register_cuda_dense_backend())");
  c.dense_device = "tpu";
  t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().message(),
            "config.dense_device: \"tpu\" is not a device (host, cuda, auto)");
}

TEST(TrainerDenseDevice, AutoAndHostSayWhereTheNetworkRuns) {
  ASSERT_EQ(cuda_dense_backend_factory(), nullptr);
  trainer_config c = small_config("dense_auto");
  c.passes = {{{shard(0)}}};
  c.save_dir.clear();
  auto t = trainer::create(c);
  ASSERT_TRUE(t.ok()) << t.get_status().to_string();
  EXPECT_STREQ(t.value()->model().device(), "host");
  EXPECT_EQ(t.value()->dense_note(),
            "dense network on host (auto: this program has no cuda space)");
  std::vector<std::string> lines;
  t.value()->set_log([&](const std::string& l) { lines.push_back(l); });
  ASSERT_TRUE(t.value()->run().ok());
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0], "dense network on host (auto: this program has no cuda space)");
  c.dense_device = "host";
  t = trainer::create(c);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t.value()->dense_note(), "dense network on host");
}

TEST(TrainerDenseDevice, BlasThreadsSetsOpenBlasAndZeroLeavesIt) {
  const int before = set_host_blas_threads(0);
  ASSERT_GE(before, 1);
  trainer_config c = small_config("blas_threads");
  c.blas_threads = 0;
  ASSERT_TRUE(trainer::create(c).ok());
  EXPECT_EQ(set_host_blas_threads(0), before);
  c.blas_threads = before + 1;
  ASSERT_TRUE(trainer::create(c).ok());
  EXPECT_EQ(set_host_blas_threads(0), before + 1);
  set_host_blas_threads(before);
  EXPECT_EQ(set_host_blas_threads(0), before);
}

TEST(TrainerDenseDevice, AutoUsesTheRegisteredFactoryOnlyWithADevice) {
  factory_guard guard;
  set_cuda_dense_backend_factory(&fake_cuda);
  fake_cuda_builds = 0;
  std::string note;
  const bool device = cuda_device_available();
  auto b = make_dense_backend("auto", wide_deep_options{}, host_space{}, &note, "f");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(fake_cuda_builds, device ? 1 : 0);
  EXPECT_EQ(note, device ? "dense network on host (auto: CUDA device present)"
                         : "dense network on host (auto: no CUDA device)");
  auto c = make_dense_backend("cuda", wide_deep_options{}, host_space{}, &note, "f");
  if (device) {
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(fake_cuda_builds, 2);
  } else {
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.get_status().message(), "f: \"cuda\" but no CUDA device is present");
  }
}

// --- configuration ranges and memory ---------------------------------------------------------

TEST(TrainerConfig, NumbersOutOfRangeNameTheFieldAndTheRange) {
  auto err = [](const std::string& text) {
    auto c = trainer_config_from_text(text);
    return c.ok() ? std::string("ok") : c.get_status().message();
  };
  const std::string pass = R"("passes": [["a.bin"]])";
  auto with = [&](const std::string& fields) { return "{" + pass + ", " + fields + "}"; };
  auto tables = [&](const std::string& deep) {
    return with(R"("tables": [{"name": "wide"}, {"name": "deep", )" + deep + "}]");
  };
  EXPECT_EQ(err(with(R"("batch_size": 64)")), "ok");
  // Negative numbers used to wrap to huge unsigned values.
  EXPECT_EQ(err(with(R"("model": {"hidden": [32, -1]})")),
            "config text: config.model.hidden[1]: expected an integer in [1, 65536], got -1");
  EXPECT_EQ(err(tables(R"("dim": -3)")),
            "config text: config.tables[1].dim: expected an integer in [1, 4096], got -3");
  EXPECT_EQ(err(tables(R"("capacity": -5)")),
            "config text: config.tables[1].capacity: expected an integer in [1, 1099511627776], "
            "got -5");
  EXPECT_EQ(err(tables(R"("slots": -1)")),
            "config text: config.tables[1].slots: expected an integer in [0, 1099511627776], got "
            "-1");
  EXPECT_EQ(err(with(R"("batch_size": -1)")),
            "config text: config.batch_size: expected an integer in [1, 1048576], got -1");
  EXPECT_EQ(err(with(R"("eval_max_samples": -1)")),
            "config text: config.eval_max_samples: expected an integer in [0, 1125899906842624], "
            "got -1");
  EXPECT_EQ(err(with(R"("seed": -1)")),
            "config text: config.seed: expected an integer in [0, 18446744073709551615], got -1");
  EXPECT_EQ(err(with(R"("threads": -2)")),
            "config text: config.threads: expected an integer in [0, 4096], got -2");
  // An integer field takes JSON integers only.
  EXPECT_EQ(err(with(R"("batch_size": 12.5)")),
            "config text: config.batch_size: expected an integer in [1, 1048576], got 12.5");
  EXPECT_EQ(err(with(R"("batch_size": 1e3)")),
            "config text: config.batch_size: expected an integer in [1, 1048576], got 1000.0");
  EXPECT_EQ(err(with(R"("log_interval": true)")),
            "config text: config.log_interval: expected an integer in [0, 1125899906842624], got "
            "true");
  // Upper bounds.
  EXPECT_EQ(err(with(R"("batch_size": 1048577)")),
            "config text: config.batch_size: expected an integer in [1, 1048576], got 1048577");
  EXPECT_EQ(err(with(R"("threads": 100000)")),
            "config text: config.threads: expected an integer in [0, 4096], got 100000");
  EXPECT_EQ(err(tables(R"("dim": 5000)")),
            "config text: config.tables[1].dim: expected an integer in [1, 4096], got 5000");
  EXPECT_EQ(err(with(R"("model": {"hidden": "wide"})")),
            "config text: config.model.hidden: expected an array of at most 32 widths, each an "
            "integer in [1, 65536], got \"wide\"");
  std::string layers = "[1";
  for (int i = 0; i < 32; ++i) layers += ", 1";
  EXPECT_EQ(err(with(R"("model": {"hidden": )" + layers + "]}")),
            "config text: config.model.hidden: expected an array of at most 32 widths, each an "
            "integer in [1, 65536], got an array");
  // Reals: finite (also as a float), within their range.
  EXPECT_EQ(err(with(R"("model": {"learning_rate": 0})")),
            "config text: config.model.learning_rate: expected a finite number > 0, got 0");
  EXPECT_EQ(err(with(R"("model": {"learning_rate": 1e39})")),
            "config text: config.model.learning_rate: expected a finite number > 0, got 1e+39");
  EXPECT_EQ(err(with(R"("model": {"dropout": 1.0})")),
            "config text: config.model.dropout: expected a number in [0, 1), got 1.0");
  EXPECT_EQ(err(with(R"("model": {"epsilon": -1e-8})")),
            "config text: config.model.epsilon: expected a finite number > 0, got -1e-08");
  EXPECT_EQ(err(tables(R"("init_scale": -0.5)")),
            "config text: config.tables[1].init_scale: expected a number in [0, 1000], got -0.5");
  EXPECT_EQ(err(tables(R"("optimizer": {"learning_rate": -0.1})")),
            "config text: config.tables[1].optimizer.learning_rate: expected a finite number > 0, "
            "got -0.1");
  EXPECT_EQ(err(tables(R"("optimizer": {"kind": "ftrl", "ftrl_lr_power": 0.5})")),
            "config text: config.tables[1].optimizer.ftrl_lr_power: expected a finite number <= "
            "0, got 0.5");
  // Text that is no JSON names its origin.
  EXPECT_EQ(err("{\"passes\": [").rfind("config text: not valid JSON: ", 0), 0u);

  // Configurations built in code get the same checks.
  trainer_config c;
  c.passes = {{{"a.bin"}}};
  c.batch_size = std::size_t(-1);
  EXPECT_EQ(validate(c).message(),
            "config.batch_size: expected an integer in [1, 1048576], got 18446744073709551615");
  c = trainer_config{};
  c.passes = {{{"a.bin"}}};
  c.model.hidden = {32, std::size_t(-1)};
  EXPECT_EQ(validate(c).message(),
            "config.model.hidden[1]: expected an integer in [1, 65536], got 18446744073709551615");
  c.model.hidden = {32};
  c.tables[0].optimizer.learning_rate = std::numeric_limits<float>::infinity();
  EXPECT_EQ(validate(c).message(),
            "config.tables[0].optimizer.learning_rate: expected a finite number > 0, got inf");
}

TEST(TrainerMemory, TooLargeForMemoryNamesTheFieldAndTheBytes) {
  trainer_config c;
  c.passes = {{{"a.bin"}}};
  c.tables[1].capacity = 1 << 20;  // deep: 1,310,720 slots of (16 + 32) * 4 + 40 bytes
  EXPECT_TRUE(check_memory(c, std::uint64_t{1} << 30).ok());
  status s = check_memory(c, 100'000'000);
  EXPECT_EQ(s.code(), status_code::capacity_exceeded);
  EXPECT_EQ(s.message(),
            "config.tables[1].capacity: the cache of table \"deep\" (1310720 slots of 232 bytes) "
            "needs 304087040 bytes, more than the 100000000 bytes of physical memory");
  c.tables[1].slots = 2 << 20;
  EXPECT_EQ(check_memory(c, 100'000'000).message(),
            "config.tables[1].slots: the cache of table \"deep\" (2097152 slots of 232 bytes) "
            "needs 486539264 bytes, more than the 100000000 bytes of physical memory");
  // Sizes whose product does not fit in 64 bits say so instead of wrapping.
  c.tables[1].slots = 0;
  c.tables[1].capacity = std::size_t(-1);
  EXPECT_EQ(check_memory(c, 100'000'000).message(),
            "config.tables[1].capacity: the cache of table \"deep\" (18446744073709551615 rows) "
            "needs more than 2^64 bytes, more than the 100000000 bytes of physical memory");

  // Through trainer::create, against this machine's memory: a clear error, not std::bad_alloc.
  ASSERT_GT(physical_memory_bytes(), 0u);
  c = trainer_config{};
  c.passes = {{{"a.bin"}}};
  c.tables[1].capacity = std::size_t{1} << 40;
  auto t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::capacity_exceeded);
  EXPECT_EQ(t.get_status().message().rfind(
                "config.tables[1].capacity: the cache of table \"deep\" (1374389534720 slots of "
                "232 bytes) needs 318858372055040 bytes, more than the ",
                0),
            0u)
      << t.get_status().to_string();
  c.tables[1].capacity = 1000;
  c.model.hidden.assign(32, 65536);
  t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().message().rfind(
                "config.model.hidden: the dense network's parameters, gradients and Adam state "
                "needs 2130788220944 bytes, more than the ",
                0),
            0u)
      << t.get_status().to_string();
  c.model.hidden = {1024, 1024};
  c.tables[1].dim = 4096;
  c.batch_size = 1 << 20;
  t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().message().rfind("config.batch_size: the buffers of one batch of 1048576 "
                                           "samples needs ",
                                           0),
            0u)
      << t.get_status().to_string();
}

#if defined(__SANITIZE_ADDRESS__)
#define EMBCACHE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMBCACHE_TEST_ASAN 1
#endif
#endif

// In a child process whose address space is capped 300 MB above what it uses: a cache that the
// memory estimate lets through (this machine has the memory) but that cannot be allocated is a
// status naming the tables, not an uncaught std::bad_alloc. Exit 0 when so.
int create_under_an_address_space_limit() {
  std::ifstream st("/proc/self/status");
  std::string line;
  std::uint64_t vm_kb = 0;
  while (std::getline(st, line))
    if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stoull(line.substr(7));
  if (vm_kb == 0) return 2;
  const rlim_t cap = rlim_t(vm_kb + 300 * 1024) * 1024;
  const rlimit rl{cap, cap};
  if (::setrlimit(RLIMIT_AS, &rl) != 0) return 3;
  trainer_config c;
  c.passes = {{{"a.bin"}}};
  c.model.hidden = {16};
  c.tables[1].capacity = 4 << 20;  // 5,242,880 slots of 232 bytes: 1.2 GB
  auto t = trainer::create(c);
  if (t.ok()) return 4;
  std::fprintf(stderr, "%s\n", t.get_status().to_string().c_str());
  return t.get_status().code() == status_code::capacity_exceeded ? 0 : 5;
}

TEST(TrainerMemory, AllocationFailureIsAStatusNamingTheTables) {
#ifdef EMBCACHE_TEST_ASAN
  GTEST_SKIP() << "AddressSanitizer reserves more address space than the cap leaves";
#else
  if (physical_memory_bytes() < (std::uint64_t{4} << 30)) GTEST_SKIP() << "less than 4 GiB";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(create_under_an_address_space_limit()), ::testing::ExitedWithCode(0),
              "capacity_exceeded: config.tables: the training cache of table \"wide\" "
              "\\(config.tables\\[0\\].capacity 1048576\\) and table \"deep\" "
              "\\(config.tables\\[1\\].capacity 4194304\\): out of memory \\(std::bad_alloc\\)");
#endif
}

// --- divergence ------------------------------------------------------------------------------

// A copy of shard `i` and its keysets in a folder of its own, with a NaN dense feature in
// sample `row`.
std::string poisoned_shard(std::size_t i, std::uint64_t row, const std::string& name) {
  const std::string dir = temp_dir(name);
  const std::string src = dataset() + "/" + shard(i);
  auto d = read_shard(src);
  EXPECT_TRUE(d.ok()) << d.get_status().to_string();
  const std::size_t crossed_count = d.value().header.num_crossed;
  auto w = shard_writer::create(dir + "/poisoned.bin", crossed_count);
  EXPECT_TRUE(w.ok());
  std::vector<std::int64_t> crossed(crossed_count);
  for (std::uint64_t r = 0; r < d.value().header.rows; ++r) {
    criteo_sample sample;
    d.value().get(r, sample, crossed.data());
    if (r == row) sample.dense[3] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(w.value()->append(sample, crossed.data()).ok());
  }
  EXPECT_TRUE(w.value()->finish().ok());
  const std::string base = src.substr(0, src.size() - 4);
  fs::copy_file(base + ".keys", dir + "/poisoned.keys");
  fs::copy_file(base + ".cross.keys", dir + "/poisoned.cross.keys");
  return dir + "/poisoned.bin";
}

std::size_t entries(const std::string& dir) {
  std::error_code ec;
  std::size_t n = 0;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); ++it) ++n;
  return n;
}

std::uint64_t saved_passes(const std::string& save) {
  return json::parse(read_bytes(save + "/trainer.json")).at("passes_done").get<std::uint64_t>();
}

const std::string stops_without_saving =
    "; the run stops here, saving and exporting nothing (lower the learning rates, check the data "
    "for non-finite features)";

TEST(TrainerData, NaNInTheDataStopsAtItsStepNamingPassStepAndShard) {
  trainer_config c = small_config("nan_data");
  const std::string root = fs::path(c.save_dir).parent_path().string();
  const std::string poisoned = poisoned_shard(1, 200, "nan_data_shard");
  c.passes = {{{shard(0)}}, {{poisoned}}, {{shard(2)}}};
  c.export_dir = root + "/exports";
  c.output_dir = root + "/out";
  c.save_every_pass = true;
  auto t = trainer::create(c);
  ASSERT_TRUE(t.ok()) << t.get_status().to_string();
  const status s = t.value()->run();
  // Pass 1 has 12 steps (1,500 rows, batch 128); sample 200 is in the second batch of pass 2.
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_EQ(s.message(), "pass 2 step 14 (step 2 of the pass): shard " + poisoned +
                             ": the batch holds 1 non-finite dense features or labels; the run "
                             "stops before training on it");
  EXPECT_EQ(t.value()->step(), 13u);
  // Pass 1's export, save and metrics line are all there is.
  EXPECT_EQ(t.value()->history().size(), 1u);
  EXPECT_EQ(entries(c.export_dir), 1u);
  EXPECT_EQ(saved_passes(c.save_dir), 1u);
  std::ifstream jsonl(c.output_dir + "/metrics.jsonl");
  std::string line;
  std::size_t lines = 0;
  while (std::getline(jsonl, line)) ++lines;
  EXPECT_EQ(lines, 1u);

  // The same in the eval shard: the pass neither exports nor saves.
  trainer_config e = small_config("nan_eval");
  const std::string eroot = fs::path(e.save_dir).parent_path().string();
  e.passes = {{{shard(0)}}};
  e.eval_shard = poisoned;
  e.export_dir = eroot + "/exports";
  t = trainer::create(e);
  ASSERT_TRUE(t.ok()) << t.get_status().to_string();
  EXPECT_EQ(t.value()->run().message(),
            "pass 1 step 12, evaluation on " + poisoned +
                ": samples 128..255 hold 1 non-finite dense features or labels");
  EXPECT_FALSE(fs::exists(e.save_dir));
  EXPECT_EQ(entries(e.export_dir), 0u);
}

TEST(TrainerDivergence, HugeLearningRateEndsTheRunFastWithoutSaving) {
  trainer_config c = small_config("huge_lr");
  const std::string root = fs::path(c.save_dir).parent_path().string();
  c.passes = {{{shard(0), shard(1)}}, {{shard(2)}}};
  c.model.adam.learning_rate = 1e30f;
  c.tables[1].optimizer.learning_rate = 1e30f;
  c.export_dir = root + "/exports";
  auto t = trainer::create(c);
  ASSERT_TRUE(t.ok()) << t.get_status().to_string();
  const auto t0 = std::chrono::steady_clock::now();
  const status s = t.value()->run();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(s.ok());
  EXPECT_LT(seconds, 30.0);
  EXPECT_EQ(s.message().rfind("pass 1 step ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find(" of the pass): training diverged: "), std::string::npos)
      << s.message();
  EXPECT_LT(t.value()->step(), 24u);  // stopped inside pass 1
  EXPECT_TRUE(t.value()->history().empty());
  EXPECT_FALSE(fs::exists(c.save_dir));
  EXPECT_EQ(entries(c.export_dir), 0u);
}

// Makes one float of a save's dense.bin NaN and fixes the blob's checksum: `offset` 8 is the
// wide bias, 16 its Adam second moment (docs/model.md).
void poison_dense_state(const std::string& save, std::size_t offset) {
  std::string blob = read_bytes(save + "/dense.bin");
  ASSERT_GT(blob.size(), 36u);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&blob[offset], &nan, 4);
  const std::uint64_t h = XXH64(blob.data(), blob.size() - 8, 0);
  std::memcpy(&blob[blob.size() - 8], &h, 8);
  std::ofstream(save + "/dense.bin", std::ios::binary | std::ios::trunc) << blob;
}

TEST(TrainerDivergence, NonFiniteDenseStateAfterThePassIsNotSaved) {
  // A save whose wide bias has a NaN Adam second moment: the next dense update makes the bias
  // NaN. With one step in the pass no loss sees it; the end-of-pass check must.
  trainer_config first = small_config("nan_dense_first");
  first.passes = {{{shard(0)}}};
  ASSERT_EQ(run(first).step, 12u);
  poison_dense_state(first.save_dir, 16);
  trainer_config next = small_config("nan_dense_next");
  const std::string root = fs::path(next.save_dir).parent_path().string();
  next.passes = {{{shard(1)}}};
  next.batch_size = 2048;  // the whole shard in one step
  next.resume_from = first.save_dir;
  next.export_dir = root + "/exports";
  auto t = trainer::create(next);
  ASSERT_TRUE(t.ok()) << t.get_status().to_string();
  const status s = t.value()->run();
  EXPECT_EQ(s.message(),
            "pass 2 step 13 (the pass's last step): training diverged: the dense weights or their "
            "Adam state are not finite" +
                stops_without_saving);
  EXPECT_FALSE(fs::exists(next.save_dir));
  EXPECT_EQ(entries(next.export_dir), 0u);
}

TEST(TrainerDivergence, NonFiniteLogitsMarkTheModelDivergedAndNothingIsSaved) {
  // A NaN wide bias reaches every logit. Evaluation says so, and from then on the trainer
  // neither saves, nor exports, nor trains.
  trainer_config first = small_config("nan_bias_first");
  first.passes = {{{shard(0)}}};
  ASSERT_EQ(run(first).step, 12u);
  poison_dense_state(first.save_dir, 8);
  trainer_config next = small_config("nan_bias_next");
  const std::string root = fs::path(next.save_dir).parent_path().string();
  next.resume_from = first.save_dir;
  next.export_dir = root + "/exports";
  auto t = trainer::create(next);
  ASSERT_TRUE(t.ok()) << t.get_status().to_string();
  auto e = t.value()->evaluate();
  ASSERT_FALSE(e.ok());
  const std::string expected = "pass 1 step 12, evaluation on " + next.data_dir + "/" + shard(5) +
                               ": training diverged: 128 of the 128 logits of samples 0..127 are "
                               "not finite" +
                               stops_without_saving;
  EXPECT_EQ(e.get_status().message(), expected);
  EXPECT_EQ(t.value()->save(root + "/later").message(), expected);
  EXPECT_FALSE(fs::exists(root + "/later"));
  EXPECT_EQ(t.value()->export_incremental().get_status().message(), expected);
  EXPECT_EQ(entries(next.export_dir), 0u);
  EXPECT_EQ(t.value()->run().message(), expected);
  EXPECT_EQ(t.value()->step(), 12u);
  EXPECT_FALSE(fs::exists(next.save_dir));
}

// --- metrics and plots -----------------------------------------------------------------------

bool gnuplot_on_path() {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string d;
  while (std::getline(ss, d, ':'))
    if (!d.empty() && ::access((d + "/gnuplot").c_str(), X_OK) == 0) return true;
  return false;
}

std::vector<pass_metrics> two_passes(bool with_eval) {
  std::vector<pass_metrics> h(2);
  for (std::size_t i = 0; i < 2; ++i) {
    h[i].pass = i + 1;
    h[i].train_loss = 0.6 - 0.1 * double(i);
    h[i].eval_auc = with_eval ? 0.7 + 0.05 * double(i) : std::nan("");
    h[i].eval_logloss = with_eval ? 0.55 - 0.1 * double(i) : std::nan("");
    h[i].samples_per_s = 1000;
  }
  return h;
}

std::uintmax_t file_size_or_zero(const std::string& p) {
  std::error_code ec;
  const auto n = fs::file_size(p, ec);
  return ec ? 0 : n;
}

TEST(TrainerPlot, AnOutputDirWithShellCharactersPlotsWithoutAShell) {
  if (!gnuplot_on_path()) GTEST_SKIP() << "gnuplot is not on the PATH";
  const std::string root = temp_dir("plot_quote");
  // Pasted into `cd '<dir>' && gnuplot ...` this name would run `touch <root>/pwned`.
  const std::string dir = root + "/x'; touch " + root + "/pwned; '$(touch " + root +
                          "/pwned2);`touch " + root + "/pwned3`";
  std::string note;
  const status s = plot_metrics(dir, two_passes(true), &note);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_FALSE(fs::exists(root + "/pwned"));
  EXPECT_FALSE(fs::exists(root + "/pwned2"));
  EXPECT_FALSE(fs::exists(root + "/pwned3"));
  EXPECT_FALSE(fs::exists("pwned"));
  EXPECT_GT(file_size_or_zero(dir + "/loss.png"), 0u);
  EXPECT_GT(file_size_or_zero(dir + "/auc.png"), 0u);
  EXPECT_EQ(note, "drew " + dir + "/loss.png and " + dir + "/auc.png");
  // A folder that gnuplot would read as a command ("<cmd") is made absolute first.
  const std::string cwd = fs::current_path().string();
  fs::current_path(root);
  const status rel = plot_metrics("<touch pwned4", two_passes(true), &note);
  fs::current_path(cwd);
  EXPECT_TRUE(rel.ok()) << rel.to_string();
  EXPECT_FALSE(fs::exists(root + "/pwned4"));
  EXPECT_GT(file_size_or_zero(root + "/<touch pwned4/loss.png"), 0u);
}

TEST(TrainerPlot, NoEvalShardMeansNoAucPlot) {
  const std::string dir = temp_dir("plot_no_eval");
  std::ofstream(dir + "/auc.png") << "an image of an earlier run";
  std::string note;
  const status s = plot_metrics(dir, two_passes(false), &note);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_FALSE(fs::exists(dir + "/auc.png"));
  const std::string gp = read_bytes(dir + "/plot.gp");
  EXPECT_EQ(gp.find("auc.png"), std::string::npos) << gp;
  const std::string skipped = ", no auc.png (no eval AUC: no eval_shard, or a single class)";
  if (gnuplot_on_path()) {
    EXPECT_GT(file_size_or_zero(dir + "/loss.png"), 0u);
    EXPECT_EQ(note, "drew " + dir + "/loss.png" + skipped);
  }
  // No metric at all: no image, and no gnuplot run that would leave an empty one.
  std::vector<pass_metrics> none(1);
  none[0].pass = 1;
  none[0].train_loss = none[0].eval_auc = none[0].eval_logloss = std::nan("");
  ASSERT_TRUE(plot_metrics(dir, none, &note).ok());
  EXPECT_FALSE(fs::exists(dir + "/loss.png"));
  EXPECT_FALSE(fs::exists(dir + "/auc.png"));
  EXPECT_EQ(note,
            "wrote " + dir + "/plot.gp and metrics.tsv, no loss.png (no finite loss)" + skipped);
}

TEST(TrainerPlot, WriteErrorsNameTheFile) {
  // Both files replace the previous ones atomically: a folder in the way fails the rename.
  for (const char* file : {"metrics.tsv", "plot.gp"}) {
    const std::string dir = temp_dir(std::string("plot_blocked_") + file);
    fs::create_directories(dir + "/" + file + "/inside");
    std::string note;
    const status s = plot_metrics(dir, two_passes(true), &note);
    EXPECT_EQ(s.code(), status_code::io_error) << s.to_string();
    EXPECT_EQ(s.message(), "cannot rename to '" + dir + "/" + file + "': Is a directory");
  }
  // An output folder that cannot be created.
  const std::string dir = temp_dir("plot_not_a_dir");
  std::ofstream(dir + "/file") << "x";
  std::string note;
  const status s = plot_metrics(dir + "/file/out", two_passes(true), &note);
  EXPECT_EQ(s.code(), status_code::io_error);
  EXPECT_EQ(s.message().rfind("output_dir: " + dir + "/file/out: cannot create (", 0), 0u)
      << s.message();
}

TEST(TrainerMetrics, AFullDiskFailsTheRunNamingMetricsJsonl) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  trainer_config c = small_config("metrics_full");
  c.passes = {{{shard(0)}}};
  c.save_dir.clear();
  c.output_dir = temp_dir("metrics_full_out");
  fs::create_symlink("/dev/full", c.output_dir + "/metrics.jsonl");
  auto t = trainer::create(c);
  ASSERT_TRUE(t.ok()) << t.get_status().to_string();
  const status s = t.value()->run();
  EXPECT_EQ(s.code(), status_code::out_of_space) << s.to_string();
  EXPECT_EQ(s.message(),
            "cannot write '" + c.output_dir + "/metrics.jsonl': No space left on device");
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> lines;
  std::stringstream ss(read_bytes(path));
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  return lines;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Two passes of one 1,500-row shard, batches of 128: 12 steps a pass (the last of 92 samples), a
// progress line every 5 steps.
trainer_config step_config(const std::string& name) {
  trainer_config c = small_config(name);
  c.passes = {{{shard(0)}}, {{shard(1)}}};
  c.log_interval = 5;
  c.output_dir = temp_dir(name + "_out");
  return c;
}

TEST(TrainerMetrics, StepMetricsHoldALinePerLogIntervalAndTheCallbackGetsEveryLine) {
  const trainer_config c = step_config("steps");
  auto t = trainer::create(c);
  ASSERT_TRUE(t.ok()) << t.get_status().to_string();
  std::vector<std::string> log;  // as an embedder sees it: no timestamp, no level
  t.value()->set_log([&](const std::string& l) { log.push_back(l); });
  ASSERT_TRUE(t.value()->run().ok());

  // metrics_steps.jsonl: steps 5 and 10 of pass 1, 17 and 22 (5 and 10 of pass 2).
  const std::vector<std::string> jsonl = lines_of(c.output_dir + "/metrics_steps.jsonl");
  ASSERT_EQ(jsonl.size(), 4u);
  const std::uint64_t steps[] = {5, 10, 17, 22}, passes[] = {1, 1, 2, 2};
  const std::uint64_t samples[] = {640, 1280, 1500 + 640, 1500 + 1280};
  for (std::size_t i = 0; i < 4; ++i) {
    const json j = json::parse(jsonl[i]);
    EXPECT_EQ(j.at("step").get<std::uint64_t>(), steps[i]) << jsonl[i];
    EXPECT_EQ(j.at("pass").get<std::uint64_t>(), passes[i]) << jsonl[i];
    EXPECT_EQ(j.at("samples").get<std::uint64_t>(), samples[i]) << jsonl[i];
    EXPECT_DOUBLE_EQ(j.at("pass_position").get<double>(),
                     double(passes[i] - 1) + double(i % 2 == 0 ? 640 : 1280) / 1500.0);
    EXPECT_TRUE(std::isfinite(j.at("train_loss").get<double>())) << jsonl[i];
    EXPECT_GT(j.at("samples_per_s").get<double>(), 0) << jsonl[i];
  }
  // Its TSV twin, gnuplot's input: a header, then the same steps.
  const std::vector<std::string> tsv = lines_of(c.output_dir + "/metrics_steps.tsv");
  ASSERT_EQ(tsv.size(), 5u);
  EXPECT_EQ(tsv[0], "# step\tpass\tpass_position\tsamples\ttrain_loss\tsamples_per_s\thit_rate");
  EXPECT_TRUE(starts_with(tsv[3], "17\t2\t1.42667\t2140\t")) << tsv[3];

  // The callback got the dense note, a progress line per interval with the pass's and the run's
  // percentage and ETA, a summary per pass and the save's line.
  ASSERT_EQ(log.size(), 1u + 4 + 2 + 1) << ::testing::PrintToString(log);
  EXPECT_EQ(log[0], "dense network on host (auto: this program has no cuda space)");
  const std::regex progress(
      "pass ([12])/2 step ([0-9]+) \\| ([0-9.]+)% of 1500 samples, [0-9]+ samples/s, ETA "
      "[0-9?]+:?[0-9]*:?[0-9]* \\| run ([0-9.]+)%, ETA [0-9?:]+ \\| loss [0-9.]+ \\| hit rate "
      "[0-9.]+");
  const char* const expected[][4] = {{"1", "5", "42.6", "21.3"},
                                     {"1", "10", "85.3", "42.6"},
                                     {"2", "17", "42.6", "71.3"},
                                     {"2", "22", "85.3", "92.6"}};
  const std::size_t at[] = {1, 2, 4, 5};
  for (std::size_t i = 0; i < 4; ++i) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(log[at[i]], m, progress)) << log[at[i]];
    for (std::size_t k = 0; k < 4; ++k) EXPECT_EQ(m[k + 1].str(), expected[i][k]) << log[at[i]];
  }
  EXPECT_TRUE(starts_with(log[3], "pass 1 done: 1500 samples in ")) << log[3];
  EXPECT_TRUE(starts_with(log[6], "pass 2 done: 1500 samples in ")) << log[6];
  EXPECT_TRUE(std::regex_match(
      log[7], std::regex("saved to " + c.save_dir + ": [0-9.]+ [kMG]?B in [0-9.]+ s \\(.*/s\\)")))
      << log[7];
}

TEST(TrainerPlot, TheScriptHasIntegerPassTicksALegendOffTheCurvesAndTheStepCurve) {
  trainer_config c = step_config("plot_steps");
  c.passes.resize(1);
  auto t = trainer::create(c);
  ASSERT_TRUE(t.ok()) << t.get_status().to_string();
  t.value()->set_log([](const std::string&) {});
  ASSERT_TRUE(t.value()->run().ok());
  std::string note;
  const status s = plot_metrics(c.output_dir, t.value()->history(), &note);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const std::string gp = read_bytes(c.output_dir + "/plot.gp");
  for (const char* want :
       {"\nset xrange [0:1]\nset xtics 1\nset format x '%.0f'\n",
        "\nset key outside center bottom horizontal\n",
        "plot d.'/metrics_steps.tsv' using 3:5 with lines",
        "d.'/metrics.tsv' using 1:2 with linespoints",
        "d.'/metrics.tsv' using 1:4 with linespoints", "set output d.'/auc.png'"})
    EXPECT_NE(gp.find(want), std::string::npos) << want << " is not in\n" << gp;
  if (gnuplot_on_path()) {
    EXPECT_GT(file_size_or_zero(c.output_dir + "/loss.png"), 0u);
    EXPECT_GT(file_size_or_zero(c.output_dir + "/auc.png"), 0u);
  }
  // Twelve passes: a tick every second pass, still integers; without a step file no step curve.
  std::vector<pass_metrics> many(12);
  for (std::size_t i = 0; i < many.size(); ++i) {
    many[i].pass = i + 1;
    many[i].train_loss = 0.6;
    many[i].eval_auc = many[i].eval_logloss = std::nan("");
  }
  const std::string dir = temp_dir("plot_many");
  ASSERT_TRUE(plot_metrics(dir, many, &note).ok());
  const std::string gp12 = read_bytes(dir + "/plot.gp");
  EXPECT_NE(gp12.find("\nset xrange [0:12]\nset xtics 2\nset format x '%.0f'\n"), std::string::npos)
      << gp12;
  EXPECT_EQ(gp12.find("metrics_steps.tsv' using"), std::string::npos) << gp12;
  EXPECT_EQ(gp12.find("eval log loss"), std::string::npos) << gp12;  // no eval: no such curve
}

// --- the command line ------------------------------------------------------------------------

#ifdef EMBCACHE_TRAIN_EXE
struct cli_result {
  int exit_code = -1;
  std::string output;
};

// Runs embcache-train on `config` (written to <dir>/run.json); stdout and stderr together.
cli_result train_cli(const std::string& dir, const json& config, const std::string& extra = "") {
  {
    std::ofstream f(dir + "/run.json");
    f << config.dump(2);
  }
  const std::string log = dir + "/cli.log";
  const std::string cmd = std::string("'") + EMBCACHE_TRAIN_EXE + "' --config '" + dir +
                          "/run.json' " + extra + " > '" + log + "' 2>&1";
  const int w = std::system(cmd.c_str());
  cli_result r;
  r.exit_code = WIFEXITED(w) ? WEXITSTATUS(w) : -1;
  r.output = read_bytes(log);
  return r;
}

json cli_config(const std::string& root) {
  return {{"data_dir", dataset()},       {"passes", {{shard(0)}}},    {"model", {{"hidden", {16}}}},
          {"batch_size", 128},           {"crossed", true},           {"log_interval", 0},
          {"output_dir", root + "/out"}, {"save_dir", root + "/save"}};
}

TEST(TrainerCli, FailuresExitNonZeroAndSayWhy) {
  // A full disk under metrics.jsonl.
  std::string root = temp_dir("cli_full");
  json c = cli_config(root);
  fs::create_directories(root + "/out");
  fs::create_symlink("/dev/full", root + "/out/metrics.jsonl");
  cli_result r = train_cli(root, c);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("embcache-train: out_of_space: cannot write '" + root +
                          "/out/metrics.jsonl': No space left on device"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(root + "/save"));

  // A diverged run.
  root = temp_dir("cli_diverged");
  c = cli_config(root);
  c["model"]["learning_rate"] = 1e30;
  c["tables"] = {{{"name", "wide"}}, {{"name", "deep"}, {"optimizer", {{"learning_rate", 1e30}}}}};
  r = train_cli(root, c);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("embcache-train: invalid_argument: pass 1 step "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("training diverged"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(root + "/save"));

  // A number out of range.
  root = temp_dir("cli_range");
  c = cli_config(root);
  c["batch_size"] = -1;
  r = train_cli(root, c);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("config.batch_size: expected an integer in [1, 1048576], got -1"),
            std::string::npos)
      << r.output;
}

TEST(TrainerCli, LinesCarryATimestampAndALevel) {
  const std::string root = temp_dir("cli_log");
  json c = cli_config(root);
  c["log_interval"] = 5;
  const cli_result r = train_cli(root, c, "--no-plot");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string stamp =
      "\\[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}\\] ";
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex("(^|\n)" + stamp + "\\[info\\] pass 1/1 step 5 \\| 42\\.6% of 1500 samples")))
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex("(^|\n)" + stamp + "\\[info\\] pass 1 done: 1500 samples")))
      << r.output;
  EXPECT_EQ(lines_of(root + "/out/metrics_steps.jsonl").size(), 2u);
  // A failure is an error line.
  c["data_dir"] = root + "/nowhere";
  const cli_result bad = train_cli(root, c, "--no-plot");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_TRUE(std::regex_search(
      bad.output, std::regex("(^|\n)" + stamp + "\\[error\\] embcache-train: not_found: ")))
      << bad.output;
}

TEST(TrainerCli, NoEvalShardPlotsTheLossOnly) {
  const std::string root = temp_dir("cli_plot");
  const cli_result r = train_cli(root, cli_config(root));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(root + "/out/auc.png"));
  const std::string skipped = ", no auc.png (no eval AUC: no eval_shard, or a single class)";
  if (gnuplot_on_path()) {
    EXPECT_GT(file_size_or_zero(root + "/out/loss.png"), 0u);
    EXPECT_NE(r.output.find("plots: drew " + root + "/out/loss.png" + skipped), std::string::npos)
        << r.output;
  } else {
    EXPECT_NE(r.output.find("plots: gnuplot not found"), std::string::npos) << r.output;
  }
}
#endif

#ifndef EMBCACHE_CRITEO_SAMPLE_DIR
#define EMBCACHE_CRITEO_SAMPLE_DIR ""
#endif

// The real Criteo sample beside the source tree, prepared once per test binary: 12,000-row
// shards, the last one (about 2,600 rows) held out. Empty when the sample is absent.
const std::vector<shard_files>& criteo_shards() {
  static const std::vector<shard_files> shards = [] {
    const std::string src = EMBCACHE_CRITEO_SAMPLE_DIR;
    std::vector<std::string> inputs;
    if (!src.empty() && fs::is_directory(src))
      for (const auto& e : fs::directory_iterator(src))
        if (e.path().extension() == ".tsv") inputs.push_back(e.path().string());
    if (inputs.empty()) return std::vector<shard_files>{};
    std::sort(inputs.begin(), inputs.end());
    prep_options po;
    po.inputs = inputs;
    po.output_dir = temp_dir("criteo") + "/data";
    po.rows_per_shard = 12000;
    po.rare_threshold = 3;
    auto prepped = prepare_criteo(po);
    if (!prepped.ok()) throw std::runtime_error(prepped.get_status().to_string());
    return prepped.value().dataset.shards;
  }();
  return shards;
}

// One pass over the first shard, evaluated on the last.
trainer_config criteo_config(const std::vector<shard_files>& shards) {
  trainer_config c;
  c.passes = {{{shards[0].shard}}};
  c.eval_shard = shards.back().shard;
  c.model.hidden = {64, 32};
  c.model.dropout = 0.0f;
  c.batch_size = 64;
  c.log_interval = 0;
  c.tables[1].dim = 8;
  return c;
}

std::vector<criteo_sample> read_samples(const std::string& path) {
  auto d = read_shard(path);
  EXPECT_TRUE(d.ok()) << d.get_status().to_string();
  std::vector<criteo_sample> out(d.ok() ? d.value().header.rows : 0);
  for (std::size_t i = 0; i < out.size(); ++i) d.value().get(i, out[i]);
  return out;
}

TEST(Trainer, RealCriteoSampleReachesAuc065) {
  const auto& shards = criteo_shards();
  if (shards.empty()) GTEST_SKIP() << "no Criteo sample at '" << EMBCACHE_CRITEO_SAMPLE_DIR << "'";
  ASSERT_GE(shards.size(), 2u);
  const run_result r = run(criteo_config(shards));
  ASSERT_EQ(r.history.size(), 1u);
  EXPECT_GT(r.history[0].eval_auc, 0.65);
}

// The cache-backed trainer against the plain loop of in_memory.hpp (row arrays, no cache, no
// store) with the same model, optimizers, learning rates, batch size, seeds and sample order
// (no shuffling: both take the shard's records in file order).
TEST(Trainer, RealCriteoSampleAgreesWithThePlainReference) {
  const auto& shards = criteo_shards();
  if (shards.empty()) GTEST_SKIP() << "no Criteo sample at '" << EMBCACHE_CRITEO_SAMPLE_DIR << "'";
  ASSERT_GE(shards.size(), 2u);
  trainer_config c = criteo_config(shards);
  ASSERT_FALSE(c.shuffle);
  const run_result r = run(c);
  ASSERT_EQ(r.history.size(), 1u);

  in_memory_options o;
  o.model = c.model;
  o.model.deep_dim = c.tables[1].dim;
  o.wide_optimizer = c.tables[0].optimizer;
  o.deep_optimizer = c.tables[1].optimizer;
  o.deep_init_range = c.tables[1].init_scale;
  o.batch_size = c.batch_size;
  o.epochs = 1;
  o.crossed = c.crossed;
  o.seed = c.seed;
  ASSERT_EQ(c.tables[0].init_scale, 0.0f);  // the reference starts wide rows at 0
  auto ref = train_wide_deep_in_memory(read_samples(shards[0].shard),
                                       read_samples(shards.back().shard), o);
  ASSERT_TRUE(ref.ok()) << ref.get_status().to_string();
  EXPECT_EQ(ref.value().steps, r.step);
  const double auc = r.history[0].eval_auc, ref_auc = ref.value().eval_auc;
  std::printf("real Criteo sample: trainer AUC %.5f, plain reference AUC %.5f (diff %+.5f)\n", auc,
              ref_auc, auc - ref_auc);
  EXPECT_GT(ref_auc, 0.65);
  EXPECT_LE(std::abs(auc - ref_auc), 0.005) << "trainer " << auc << ", reference " << ref_auc;
}

}  // namespace
}  // namespace embcache
