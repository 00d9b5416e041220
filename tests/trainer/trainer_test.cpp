// The cache-backed trainer: it learns, swapping and interruption change no bit of the model, the
// host-hybrid path agrees with the cache, a HugeCTR raw keyset dataset trains like ours, real
// Criteo rows.
#include <cstdlib>

#include "embcache/serving.hpp"
#include "trainer_test_support.hpp"

namespace embcache::test {
namespace {

TEST(trainer, learns_on_synthetic_data) {
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

TEST(trainer, swapping_changes_no_bit_of_the_model) {
  // Everything resident, against a keyset-mode cache the size of the largest shard's keyset
  // (every pass evicts) and an on-demand cache of 10% of each table.
  trainer_config full = small_config("full");
  full.passes = {{{shard(0)}}, {{shard(1)}}, {{shard(2)}}};
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

// config.move_staged_rows: the staged rows move into the caches and the leaving rows out of them
// by index, and the sparse ops read and update the rows the slots hold: the same bits as rows
// copied, with spare rows for every staged row and for only part of them (a boundary without
// enough copies them), over evicting passes with their saves and exports.
TEST(trainer, staged_rows_moved_by_index_train_the_same_bits) {
  trainer_config copied = small_config("copied");
  copied.move_staged_rows = false;  // the default on the host moves them
  copied.passes = {{{shard(0)}}, {{shard(1)}}, {{shard(2)}}, {{shard(3)}}};
  copied.export_dir = temp_dir("copied") + "/export";
  size_to_largest_shard(copied);
  const run_result rc = run(copied);
  EXPECT_GT(rc.totals.rows_pushed, 0u);
  EXPECT_EQ(rc.totals.rows_moved, 0u);
  for (const std::uint64_t staging : {std::uint64_t{0}, std::uint64_t{40000}}) {
    SCOPED_TRACE("staging_bytes " + std::to_string(staging));
    trainer_config moved = copied;
    moved.move_staged_rows = true;
    moved.staging_bytes = staging;  // 0: the cache's 1 GiB; 40000: spare rows for part of them
    const std::string dir = temp_dir("moved_" + std::to_string(staging));
    moved.save_dir = dir + "/save";
    moved.export_dir = dir + "/export";
    const run_result rm = run(moved);
    if (staging == 0) {
      EXPECT_GT(rm.totals.rows_moved, 0u);
      EXPECT_GT(rm.totals.rows_detached, 0u);
    }
    EXPECT_EQ(rm.totals.rows_pushed, rc.totals.rows_pushed);
    expect_same_history(rc.history, rm.history);
    expect_same_model(copied.save_dir, moved.save_dir);
    for (std::size_t p = 0; p < rc.history.size(); ++p)
      EXPECT_EQ(rm.history[p].rows_exported, rc.history[p].rows_exported) << p;
  }
}

// A dataset prepared with HugeCTR's raw keysets (its manifest says keyset_format hugectr_raw)
// trains to the same bits as the same data with our keysets.
TEST(trainer_data, a_hugectr_raw_keyset_dataset_trains_like_ours) {
  const std::string raw = temp_dir("raw_data");
  synth_options so;
  so.rows = 9000;
  so.cardinality_scale = 0.01;
  dataset_writer_options wo;
  wo.output_dir = raw;
  wo.rows_per_shard = 1500;
  wo.keyset = keyset_format::hugectr_raw;
  auto made = write_synth_dataset(so, wo, /*cross=*/true);
  EMBCACHE_ASSERT_OK(made);
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

TEST(trainer, host_hybrid_agrees_with_the_cache) {
  trainer_config cached = small_config("cached");
  size_to_largest_shard(cached);
  const run_result rc = run(cached);
  trainer_config hybrid = cached;
  hybrid.mode = trainer_mode::host_hybrid;
  hybrid.save_dir = temp_dir("hybrid") + "/save";
  const run_result rh = run(hybrid);
  expect_same_history(rh.history, rc.history);
  expect_same_model(cached.save_dir, hybrid.save_dir);
}

// Feature admission and expiry in host-hybrid mode: each shard's start is the boundary keyset
// mode's begin_pass makes it (the shard's keysets sighted, the rows untouched for ttl_passes
// shards removed), so the same keys are refused and the same rows expire, and the model, its
// admission counts included, is the keyset run's, bit for bit.
TEST(trainer, host_hybrid_admits_and_expires_as_the_cache_does) {
  trainer_config cached = small_config("lifecycle_cached");
  size_to_largest_shard(cached);
  for (auto& t : cached.tables) {
    t.admission.min_count = 2;
    t.admission.sketch_width = 4096;
    t.expiry.ttl_passes = 1;
  }
  const run_result rc = run(cached);
  trainer_config hybrid = cached;
  hybrid.mode = trainer_mode::host_hybrid;
  hybrid.save_dir = temp_dir("lifecycle_hybrid") + "/save";
  const run_result rh = run(hybrid);
  expect_same_history(rh.history, rc.history);
  EXPECT_GT(rc.totals.keys_refused, 0u);
  EXPECT_GT(rc.totals.rows_expired, 0u);
  EXPECT_EQ(rh.totals.keys_refused, rc.totals.keys_refused);
  EXPECT_EQ(rh.totals.keys_admitted, rc.totals.keys_admitted);
  EXPECT_EQ(rh.totals.rows_expired, rc.totals.rows_expired);
  // The `admission` files are among the files compared; the expiry clocks count the same
  // boundaries (their versions are each mode's own clock).
  expect_same_model(cached.save_dir, hybrid.save_dir);
  ASSERT_TRUE(fs::exists(hybrid.save_dir + "/sparse/deep/admission"));
  const auto clock = [](const std::string& save, int t) {
    return json::parse(read_bytes(save + "/sparse/manifest.json"))["tables"][t]["expiry"];
  };
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(clock(hybrid.save_dir, t).value("boundaries", 0u), 5u) << t;
    EXPECT_EQ(clock(hybrid.save_dir, t)["boundaries"], clock(cached.save_dir, t)["boundaries"]);
  }
}

// Host-hybrid's incremental exports are the training cache's (adopt_store_writes): delta 1 holds
// the rows pass 1 pushed into the stores, those of the save after it, state included; passes 2
// and 3, resumed from that save, export deltas 2 and 3, whose tombstones are the keys expiry
// removed; the deltas applied to the first save give the final save's tables, so the expired keys
// leave serving.
TEST(trainer, host_hybrid_deltas_apply_to_its_final_save) {
  const std::string root = temp_dir("hybrid_exports");
  trainer_config c = small_config("hybrid_exports");
  c.passes = {{{shard(0)}}, {{shard(1)}}, {{shard(2)}}};
  c.mode = trainer_mode::host_hybrid;
  c.save_dir.clear();
  c.export_dir = root + "/deltas";
  c.export_with_state = true;
  for (auto& tc : c.tables) tc.expiry.ttl_passes = 1;
  auto first_run = trainer::create(c);
  EMBCACHE_ASSERT_OK(first_run);
  EMBCACHE_ASSERT_OK(first_run.value()->run_pass(c.passes[0], nullptr));
  EMBCACHE_ASSERT_OK(first_run.value()->save(root + "/base"));
  trainer_config rest = c;
  rest.passes.erase(rest.passes.begin());
  rest.resume_from = root + "/base";
  rest.save_dir = root + "/final";
  auto t = trainer::create(rest);
  EMBCACHE_ASSERT_OK(t);
  t.value()->set_log([](const std::string&) {});
  EMBCACHE_ASSERT_OK(t.value()->run());
  auto base = read_model_folder(root + "/base/sparse");
  auto last = read_model_folder(root + "/final/sparse");
  auto first = read_delta_folder(c.export_dir + "/delta-000001");
  EMBCACHE_ASSERT_OK(base);
  EMBCACHE_ASSERT_OK(last);
  EMBCACHE_ASSERT_OK(first);
  std::vector<std::int64_t> tombstones;  // of deltas 2 and 3, every table
  for (std::size_t i = 0; i < 2; ++i) {
    const folder_table& b = base.value().tables[i];
    const folder_table& d = first.value().tables[i];
    ASSERT_EQ(d.name, b.name);
    EXPECT_GT(d.state_width, 0u) << d.name;
    EXPECT_EQ(d.keys, b.keys) << d.name;
    EXPECT_TRUE(d.vectors == b.vectors) << d.name;
    EXPECT_TRUE(d.states == b.states) << d.name;
    EXPECT_TRUE(d.erased.empty()) << d.name;
    for (const char* n : {"/delta-000002", "/delta-000003"}) {
      auto later = read_delta_folder(c.export_dir + n);
      EMBCACHE_ASSERT_OK(later);
      const auto& e = later.value().tables[i].erased;
      tombstones.insert(tombstones.end(), e.begin(), e.end());
    }
    const auto& kept = last.value().tables[i].keys;
    for (const std::int64_t k : tombstones)
      EXPECT_FALSE(std::binary_search(kept.begin(), kept.end(), k)) << d.name << " key " << k;
  }
  std::uint64_t expired = 0;
  for (const auto& tc : t.value()->cache().counters().total) expired += tc.rows_expired;
  EXPECT_GT(expired, 0u);
  EXPECT_EQ(tombstones.size(), expired);
  // The same three passes without the interruption write the same deltas, row for row and
  // tombstone for tombstone.
  trainer_config whole = c;
  whole.export_dir = root + "/whole_deltas";
  auto w = trainer::create(whole);
  EMBCACHE_ASSERT_OK(w);
  w.value()->set_log([](const std::string&) {});
  EMBCACHE_ASSERT_OK(w.value()->run());
  expect_same_deltas(c.export_dir, whole.export_dir, 3);
  const std::string applied = root + "/applied";
  fs::copy(root + "/base", applied, fs::copy_options::recursive);
  auto r = apply_deltas(applied, c.export_dir);
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(r.value().deltas, (std::vector<std::uint64_t>{1, 2, 3}));
  EXPECT_GT(r.value().rows_erased, 0u);  // expired keys the base held
  // Every file of the final save's tables but `version` (the update clock).
  for (const char* table : {"wide", "deep"}) {
    const std::string want = root + "/final/sparse/" + table;
    std::size_t compared = 0;
    for (const auto& e : fs::directory_iterator(want)) {
      const std::string f = e.path().filename().string();
      if (f == "version") continue;
      EXPECT_TRUE(read_bytes(applied + "/sparse/" + table + "/" + f) == read_bytes(want + "/" + f))
          << table << "/" << f;
      ++compared;
    }
    EXPECT_GE(compared, 3u) << table;  // key, emb_vector, slot_id (+ the optimizer's files)
  }
}

// embedding_device "auto" (the host in a host-only build or without a device; "host" where it
// would be the device) and an explicit "host" train the cache path of every earlier version: the
// same bits as host-hybrid, whose path does not pass through the cache at all, in keyset and
// on-demand mode alike.
TEST(trainer, embeddings_on_the_host_keep_the_bits_of_the_host_hybrid_path) {
  trainer_config hybrid = small_config("emb_hybrid");
  hybrid.passes = {{{shard(0), shard(1)}}, {{shard(2)}}};
  hybrid.mode = trainer_mode::host_hybrid;
  const run_result rh = run(hybrid);
  // "auto" in keyset mode, "host" in on-demand mode: both resolve to the host here.
  const char* automatic = auto_embeddings_on_cuda() ? "host" : "auto";
  for (const auto& [mode, device] :
       {std::pair{trainer_mode::keyset, automatic}, std::pair{trainer_mode::on_demand, "host"}}) {
    SCOPED_TRACE(std::string(to_string(mode)) + " " + device);
    trainer_config c = hybrid;
    c.mode = mode;
    ASSERT_TRUE(device_choice_from_name(device, &c.embedding_device)) << device;
    c.save_dir = temp_dir(std::string("emb_") + to_string(mode) + "_" + device) + "/save";
    auto t = trainer::create(c);
    EMBCACHE_ASSERT_OK(t);
    EXPECT_STREQ(t.value()->embedding_device(), "host");
    EMBCACHE_ASSERT_OK(t.value()->run());
    expect_same_history(t.value()->history(), rh.history);
    expect_same_model(c.save_dir, hybrid.save_dir);
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
  EMBCACHE_EXPECT_OK(d);
  std::vector<criteo_sample> out(d.ok() ? d.value().header.rows : 0);
  for (std::size_t i = 0; i < out.size(); ++i) d.value().get(i, out[i]);
  return out;
}

TEST(trainer, real_criteo_sample_reaches_auc_0_65) {
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
TEST(trainer, real_criteo_sample_agrees_with_the_plain_reference) {
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
  EMBCACHE_ASSERT_OK(ref);
  EXPECT_EQ(ref.value().steps, r.step);
  const double auc = r.history[0].eval_auc, ref_auc = ref.value().eval_auc;
  std::printf("real Criteo sample: trainer AUC %.5f, plain reference AUC %.5f (diff %+.5f)\n", auc,
              ref_auc, auc - ref_auc);
  EXPECT_GT(ref_auc, 0.65);
  EXPECT_LE(std::abs(auc - ref_auc), 0.005) << "trainer " << auc << ", reference " << ref_auc;
}

}  // namespace
}  // namespace embcache::test
