// The cache-backed trainer: it learns, swapping and interruption change no bit of the model, the
// host-hybrid path agrees with the cache, bad configurations name their field, real Criteo rows.
#include "embcache/trainer/trainer.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
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

// The model files of a save: rows and optimizer state of both tables, and the dense blob. The
// `version` files hold the cache's update clock, which counts swap calls too, and trainer.json
// holds timings: neither is part of the model.
void expect_same_model(const std::string& a, const std::string& b) {
  for (const char* table : {"wide", "deep"})
    for (const char* file : {"key", "emb_vector", "opt_state"}) {
      const std::string f = std::string("/sparse/") + table + "/" + file;
      const std::string x = read_bytes(a + f), y = read_bytes(b + f);
      EXPECT_GT(x.size(), 0u) << f;
      EXPECT_TRUE(x == y) << f << " differs between " << a << " and " << b;
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
  EXPECT_EQ(err(j), "config.tables[1].capacity: must be >= 1");
  j = base;
  j["tables"] = {{{"name", "wide"}}, {{"name", "deep"}, {"capacity", "big"}}};
  EXPECT_EQ(err(j), "config.tables[1].capacity: wrong type (string)");
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
  EXPECT_EQ(err(j).rfind("config.tables[0].optimizer: ", 0), 0u) << err(j);
  EXPECT_EQ(err(json::object()), "config.passes: must hold at least 1 pass");
  j = base;
  j["tables"] = {{{"name", "wide"}, {"store", "rocksdb"}}, {{"name", "deep"}}};
  EXPECT_EQ(err(j), "config.tables[0].store_path: required with store \"rocksdb\"");
  j = base;
  j["model"] = {{"dropout", 1.5}};
  EXPECT_EQ(err(j), "config.model.dropout: must be in [0, 1)");
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
  EXPECT_EQ(err(j), "config.blas_threads: must be >= 0");

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
