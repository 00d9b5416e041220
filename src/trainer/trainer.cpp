// The reference Wide&Deep trainer: passes over shards with the embeddings in a training cache
// or on the stores directly (host-hybrid), evaluation, metrics, export, save and resume.
#include "embcache/trainer/trainer.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "embcache/criteo.hpp"
#include "embcache/detail/hash.hpp"
#include "embcache/detail/progress.hpp"
#include "embcache/embedding_cache_ref.hpp"
#include "embcache/host_hybrid.hpp"
#include "embcache/host_store.hpp"
#include "embcache/shard.hpp"
#include "embcache/sparse_ops.hpp"
#include "embcache/trainer/metrics.hpp"
#ifdef EMBCACHE_TRAINER_WITH_ROCKSDB
#include "embcache/rocksdb_store.hpp"
#endif
#include "reporting.hpp"
#include "trainer_files.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using key_t = std::int64_t;
using clock_type = std::chrono::steady_clock;
using detail::create_folder;
using detail::write_file_durable;
using detail::write_text_file;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Samples of every shard of `passes`, from their headers; 0 (unknown) when one cannot be read
// (the pass that reads it reports why).
std::uint64_t samples_of_passes(const std::string& data_dir,
                                const std::vector<trainer_pass_config>& passes) {
  std::uint64_t total = 0;
  for (const auto& pass : passes)
    for (const auto& shard : pass.shards) {
      auto h = read_shard_header(resolve_data_path(data_dir, shard));
      if (!h.ok()) return 0;
      total += h.value().rows;
    }
  return total;
}

// `X.bin` -> `X<suffix>`; other names get the suffix appended.
std::string beside(const std::string& shard, const std::string& suffix) {
  const std::string ext = ".bin";
  if (shard.size() > ext.size() && shard.compare(shard.size() - ext.size(), ext.size(), ext) == 0)
    return shard.substr(0, shard.size() - ext.size()) + suffix;
  return shard + suffix;
}

std::size_t count_non_finite(const float* p, std::size_t n) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += std::isfinite(p[i]) ? 0 : 1;
  return bad;
}

// Whether every float of a wide_deep_model blob is finite: the wide bias with its Adam state and
// the MLP's parameters with theirs (layout in docs/model.md). The blob is the device-independent
// picture of the dense state, so this works whichever device the network runs on. A blob that
// does not parse counts as not finite.
bool dense_blob_finite(const std::vector<std::uint8_t>& blob) {
  auto u64 = [&](std::size_t at, std::uint64_t& v) {
    if (at + 8 > blob.size()) return false;
    std::memcpy(&v, blob.data() + at, 8);
    return true;
  };
  auto floats = [&](std::size_t at, std::uint64_t n) {
    if (n > (blob.size() - std::min(at, blob.size())) / 4) return false;
    for (std::uint64_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, blob.data() + at + 4 * i, 4);
      if (!std::isfinite(f)) return false;
    }
    return true;
  };
  // Wide&Deep: magic 8, bias / m / v 12, MLP blob size 8, MLP blob, checksum 8.
  std::uint64_t mlp_size = 0;
  if (!floats(8, 3) || !u64(20, mlp_size) || mlp_size > blob.size() - 28) return false;
  // MLP: magic 8, version 4, hidden count 4, input_dim 8, widths 8 H, Adam step 8, parameter
  // count P 8, parameters / m / v 3 x 4 P, checksum 8.
  const std::size_t mlp = 28;
  std::uint32_t hidden = 0;
  if (mlp_size < 24) return false;
  std::memcpy(&hidden, blob.data() + mlp + 12, 4);
  const std::size_t count_at = mlp + 24 + 8 * std::size_t(hidden) + 8;
  std::uint64_t params = 0;
  if (!u64(count_at, params) || params > mlp_size / 12) return false;
  return floats(count_at + 8, 3 * params);
}

result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return status::not_found(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Sum of the counters of every table.
table_counters sum_tables(const std::vector<table_counters>& v) {
  table_counters s;
  for (const auto& c : v) s += c;
  return s;
}

}  // namespace

struct trainer::impl {
  trainer_config config;
  host_space space;
  std::size_t wide_t = 0, deep_t = 1;  // table indices in the cache (config order)
  std::size_t num_wide_slots = criteo_slot_count;
  std::vector<std::shared_ptr<param_store<key_t>>> stores;
#ifdef EMBCACHE_TRAINER_WITH_ROCKSDB
  std::map<std::string, std::shared_ptr<rocksdb_database>> databases;
#endif
  std::unique_ptr<training_cache<key_t>> cache;
  std::unique_ptr<host_hybrid_table<key_t>> hybrid[2];
  std::unique_ptr<dense_backend> model;
  std::string dense_note;
  bool dense_note_logged = false;
  std::uint64_t step = 0, passes_done = 0, samples = 0;
  std::vector<pass_metrics> history;
  std::function<void(const std::string&)> log = [](const std::string& s) {
    std::cout << s << std::endl;
  };
  // The run() in progress, for the run part of the progress lines: its last pass number, the
  // samples of all its passes (shard headers; 0 when unknown or outside run()), those done, and
  // when it began.
  std::uint64_t run_last_pass = 0, run_total = 0, run_done = 0;
  clock_type::time_point run_t0;

  // Per-step scratch.
  std::vector<key_t> wide_keys;
  std::vector<std::int64_t> offsets, wide_slots, deep_slots;
  std::vector<float> in_wide, in_deep, d_wide, d_deep, rows_buf, logits;
  std::unique_ptr<bool[]> found;
  std::size_t found_size = 0;
  sparse_gradients<host_space> wide_grads, deep_grads;
  // Keysets of the shard last prefetched: its begin_pass takes them instead of reading the files
  // again on the training thread.
  std::string prefetched_shard;
  std::vector<std::vector<key_t>> prefetched_keysets;
  // Hits and misses since the last progress line and over the pass.
  std::uint64_t interval_hits = 0, interval_misses = 0;
  // Set when the model was found non-finite: from then on no pass, save or export runs.
  status diverged;

  bool cached() const { return config.mode != trainer_mode::host_hybrid; }
  const trainer_table_config& table_config(std::size_t t) const { return config.tables[t]; }

  status build();
  status build_parts();
  std::string building;  // what build_parts() is allocating, for an out-of-memory message
  status make_store(std::size_t t, std::size_t row_width);
  result<std::vector<std::vector<key_t>>> keysets_of(const std::string& shard);
  // The layout of a shard's keyset files, from its dataset folder's manifest.json (our layout
  // when the folder has none); read once per folder.
  result<keyset_format> keyset_format_of(const std::string& shard);
  std::map<std::string, keyset_format> keyset_formats;
  void fill_keys(const shard_batch& b);
  status train_step(const shard_batch& b, std::uint64_t pass, std::uint64_t pass_step,
                    double* loss);
  // Records a divergence (what went non-finite, where) and returns it.
  status diverge(const std::string& where, const std::string& what) {
    diverged = status::invalid_argument(
        where + ": training diverged: " + what +
        "; the run stops here, saving and exporting nothing (lower the learning rates, check the "
        "data for non-finite features)");
    return diverged;
  }
  // "pass 2 step 14 (step 2 of the pass)": the global step counts from 1, resumes included.
  static std::string step_label(std::uint64_t pass, std::uint64_t global_step,
                                std::uint64_t pass_step) {
    return "pass " + std::to_string(pass) + " step " + std::to_string(global_step) + " (step " +
           std::to_string(pass_step) + " of the pass)";
  }
  // After a sparse update: every row it changed must be finite (vector and optimizer state),
  // so that no non-finite row reaches a store, an export or a save.
  status check_rows(const float* rows, std::size_t width, const sparse_gradients<host_space>& g,
                    const char* table, std::uint64_t pass, std::uint64_t pass_step) {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < g.size; ++i)
      bad += count_non_finite(rows + std::size_t(g.rows.data()[i]) * width, width) ? 1 : 0;
    if (bad == 0) return {};
    return diverge(step_label(pass, step, pass_step), std::to_string(bad) + " rows of table " +
                                                          table + " are not finite after its " +
                                                          "optimizer step");
  }
  void take_last_counters();
  bool* found_buffer(std::size_t n) {
    if (found_size < n) {
      found.reset(new bool[n]);
      found_size = n;
    }
    return found.get();
  }
};

status trainer::impl::make_store(std::size_t t, std::size_t row_width) {
  const trainer_table_config& tc = config.tables[t];
  if (tc.store == "host") {
    host_store_options so;
    so.table_name = tc.name;
    so.row_width = row_width;
    so.space = space;
    stores[t] = std::make_shared<host_store<key_t>>(so);
    return {};
  }
#ifdef EMBCACHE_TRAINER_WITH_ROCKSDB
  rocksdb_store_options ro;
  ro.path = tc.store_path;
  ro.table_name = tc.name;
  ro.row_width = row_width;
  ro.dim = tc.dim;
  ro.optimizer = to_string(tc.optimizer.kind);
  // An earlier run's rows are used only when asked for; a resume replaces them anyway.
  ro.existing_rows = tc.reuse_store || !config.resume_from.empty() ? existing_rows_policy::reuse
                                                                   : existing_rows_policy::refuse;
  ro.space = space;
  auto& db = databases[tc.store_path];
  if (!db) {
    auto opened = rocksdb_database::open(ro);
    if (!opened.ok())
      return opened.get_status().with_context("config.tables[" + std::to_string(t) +
                                              "].store_path");
    db = opened.value();
  }
  auto s = rocksdb_store<key_t>::open(db, ro);
  if (!s.ok())
    return s.get_status().with_context("config.tables[" + std::to_string(t) + "].store_path");
  stores[t] = std::shared_ptr<param_store<key_t>>(std::move(s).value());
  return {};
#else
  return status::unsupported("config.tables[" + std::to_string(t) +
                             "].store: this build has no RocksDB store");
#endif
}

// The memory estimate first (a clear error instead of an allocation that cannot succeed), then
// the parts; an allocation that fails anyway becomes a status naming what was being built.
status trainer::impl::build() {
  EMBCACHE_RETURN_IF_ERROR(check_memory(config, physical_memory_bytes()));
  try {
    return build_parts();
  } catch (const std::bad_alloc&) {
    return status::capacity_exceeded(building +
                                     ": out of memory (std::bad_alloc) while allocating " +
                                     "it; lower the capacity or the model size");
  }
}

status trainer::impl::build_parts() {
  space.max_threads = config.threads;
  for (std::size_t t = 0; t < config.tables.size(); ++t) {
    if (config.tables[t].name == "wide") wide_t = t;
    if (config.tables[t].name == "deep") deep_t = t;
  }
  num_wide_slots = criteo_slot_count + (config.crossed ? criteo_cross_count : 0);
  stores.resize(config.tables.size());
  std::vector<table_options<key_t>> topts;
  for (std::size_t t = 0; t < config.tables.size(); ++t) {
    const trainer_table_config& tc = config.tables[t];
    table_options<key_t> o;
    o.name = tc.name;
    o.dim = tc.dim;
    o.optimizer = tc.optimizer;
    // The host-hybrid path keeps a cache of one bucket, only for save, load and the initializer.
    o.capacity = cached() ? tc.capacity : 1;
    o.slots = cached() ? tc.slots : 0;
    o.max_resident = cached() ? tc.max_resident : 0;
    o.init.kind = init_kind::uniform;
    o.init.scale = tc.init_scale;
    o.init.seed = config.seed;
    o.slot_of = [](key_t k) -> std::uint64_t { return criteo_key_tag(k); };  // HugeCTR slot_id
    building = "config.tables[" + std::to_string(t) + "] (table \"" + tc.name + "\"): its store";
    EMBCACHE_RETURN_IF_ERROR(make_store(t, tc.dim + state_width(tc.optimizer.kind, tc.dim)));
    o.store = stores[t];
    topts.push_back(std::move(o));
  }
  training_cache_options co;
  co.mode = config.mode == trainer_mode::on_demand ? cache_mode::on_demand : cache_mode::keyset;
  building = "config.tables: the training cache of";
  for (std::size_t t = 0; t < topts.size(); ++t)
    building += std::string(t ? " and" : "") + " table \"" + topts[t].name + "\" (config.tables[" +
                std::to_string(t) + "].capacity " + std::to_string(topts[t].capacity) + ")";
  try {
    cache = std::make_unique<training_cache<key_t>>(co, topts);
  } catch (const error& e) {
    return status(e.code(), std::string("config.tables: ") + e.what());
  }
  if (!cached()) {
    for (std::size_t t = 0; t < 2; ++t) {
      host_hybrid_options ho;
      ho.dim = config.tables[t].dim;
      ho.optimizer = config.tables[t].optimizer;
      ho.max_threads = config.threads;
      // The cache's own initializer, so that every mode starts from the same rows.
      const embedding_cache_ref<key_t> ref = cache->cache(t).ref();
      const std::size_t width = cache->row_width(t);
      embedding_initializer<key_t> init = [ref, width](key_t k, float* emb, std::size_t dim) {
        float row[64];
        std::vector<float> big;
        float* dst = row;
        if (width > 64) {
          big.resize(width);
          dst = big.data();
        }
        ref.initialize_row(k, dst);
        std::copy(dst, dst + dim, emb);
      };
      building = "config.tables[" + std::to_string(t) + "] (table \"" + config.tables[t].name +
                 "\"): its host-hybrid table";
      hybrid[t] = std::make_unique<host_hybrid_table<key_t>>(*stores[t], ho, std::move(init));
    }
  }
  wide_deep_options mo = config.model;
  mo.num_wide_slots = num_wide_slots;
  mo.num_deep_slots = criteo_slot_count;
  mo.deep_dim = config.tables[deep_t].dim;
  mo.num_dense = criteo_dense_count;
  // Shape errors are the model's, not the device's.
  if (const status ms = check_options(mlp_options(mo)); !ms.ok())
    return status(ms.code(), "config.model: " + ms.message());
  if (config.blas_threads > 0) set_host_blas_threads(config.blas_threads);
  building = "config.model: the dense network";
  auto m = make_dense_backend(config.dense_device, mo, space, &dense_note, "config.dense_device");
  if (!m.ok()) return m.get_status();
  model = std::move(m).value();
  return {};
}

result<keyset_format> trainer::impl::keyset_format_of(const std::string& shard) {
  std::string dir = fs::path(shard).parent_path().string();
  if (dir.empty()) dir = ".";
  if (auto it = keyset_formats.find(dir); it != keyset_formats.end()) return it->second;
  keyset_format f = keyset_format::embcache;
  std::error_code ec;
  if (fs::exists(dir + "/manifest.json", ec)) {
    auto m = read_dataset_manifest(dir);
    if (!m.ok()) return m.get_status().with_context("the dataset of " + shard);
    f = m.value().keyset;
  }
  keyset_formats.emplace(dir, f);
  return f;
}

result<std::vector<std::vector<key_t>>> trainer::impl::keysets_of(const std::string& shard) {
  auto fmt = keyset_format_of(shard);
  if (!fmt.ok()) return fmt.get_status();
  auto slot_keys = read_keyset<key_t>(beside(shard, ".keys"), fmt.value());
  if (!slot_keys.ok()) return slot_keys.get_status().with_context("keyset of " + shard);
  std::vector<std::vector<key_t>> ks(config.tables.size());
  ks[deep_t] = slot_keys.value();
  if (config.crossed) {
    auto crossed = read_keyset<key_t>(beside(shard, ".cross.keys"), fmt.value());
    if (!crossed.ok()) return crossed.get_status().with_context("crossed keyset of " + shard);
    ks[wide_t].resize(ks[deep_t].size() + crossed.value().size());
    std::merge(ks[deep_t].begin(), ks[deep_t].end(), crossed.value().begin(), crossed.value().end(),
               ks[wide_t].begin());
  } else {
    ks[wide_t] = ks[deep_t];
  }
  return ks;
}

void trainer::impl::fill_keys(const shard_batch& b) {
  const std::size_t n = b.size, ws = num_wide_slots;
  wide_keys.resize(n * ws);
  for (std::size_t i = 0; i < n; ++i) {
    std::copy(b.keys.begin() + i * criteo_slot_count, b.keys.begin() + (i + 1) * criteo_slot_count,
              wide_keys.begin() + i * ws);
    if (config.crossed)
      std::copy(b.crossed.begin() + i * b.num_crossed,
                b.crossed.begin() + i * b.num_crossed + criteo_cross_count,
                wide_keys.begin() + i * ws + criteo_slot_count);
  }
  const std::size_t need = n * std::max(ws, criteo_slot_count) + 1;
  // One-hot bags: the offsets are 0, 1, 2, ... for every batch.
  while (offsets.size() < need) offsets.push_back(std::int64_t(offsets.size()));
}

void trainer::impl::take_last_counters() {
  const table_counters last = sum_tables(cache->counters().last);
  interval_hits += last.hits;
  interval_misses += last.misses;
}

status trainer::impl::train_step(const shard_batch& b, std::uint64_t pass, std::uint64_t pass_step,
                                 double* loss) {
  const std::size_t n = b.size, ws = num_wide_slots, ds = criteo_slot_count;
  const std::size_t dim = config.tables[deep_t].dim;
  fill_keys(b);
  const key_t* deep_keys = b.keys.data();
  in_wide.resize(n * ws);
  in_deep.resize(n * ds * dim);
  d_wide.resize(n * ws);
  d_deep.resize(n * ds * dim);
  slot_batch wide_batch, deep_batch;
  if (cached()) {
    wide_slots.resize(n * ws);
    deep_slots.resize(n * ds);
    if (config.mode == trainer_mode::keyset) {
      EMBCACHE_RETURN_IF_ERROR(
          cache->cache(wide_t).lookup_slots(wide_keys.data(), n * ws, wide_slots.data()));
      EMBCACHE_RETURN_IF_ERROR(
          cache->cache(deep_t).lookup_slots(deep_keys, n * ds, deep_slots.data()));
      for (std::size_t i = 0; i < n * ws; ++i)
        if (wide_slots[i] < 0)
          return status::not_found("key " + std::to_string(wide_keys[i]) +
                                   " of the batch is not in the shard's keyset (table wide)");
      for (std::size_t i = 0; i < n * ds; ++i)
        if (deep_slots[i] < 0)
          return status::not_found("key " + std::to_string(deep_keys[i]) +
                                   " of the batch is not in the shard's keyset (table deep)");
    } else {
      EMBCACHE_RETURN_IF_ERROR(cache->lookup(wide_t, wide_keys.data(), n * ws, wide_slots.data())
                                   .with_context("table wide"));
      take_last_counters();
      EMBCACHE_RETURN_IF_ERROR(
          cache->lookup(deep_t, deep_keys, n * ds, deep_slots.data()).with_context("table deep"));
      take_last_counters();
    }
    wide_batch = {n, ws, offsets.data(), wide_slots.data(), n * ws};
    deep_batch = {n, ds, offsets.data(), deep_slots.data(), n * ds};
    auto& wc = cache->cache(wide_t);
    auto& dc = cache->cache(deep_t);
    lookup_combine(space, wc.rows(), wc.row_width(), 1, wide_batch, combiner::sum, in_wide.data());
    lookup_combine(space, dc.rows(), dc.row_width(), dim, deep_batch, combiner::sum,
                   in_deep.data());
  } else {
    EMBCACHE_RETURN_IF_ERROR(
        hybrid[wide_t]->forward({n, ws, offsets.data(), wide_keys.data(), n * ws}, in_wide.data()));
    EMBCACHE_RETURN_IF_ERROR(
        hybrid[deep_t]->forward({n, ds, offsets.data(), deep_keys, n * ds}, in_deep.data()));
  }
  const wide_deep_batch batch{n, in_wide.data(), in_deep.data(), b.dense.data(), b.labels.data()};
  *loss = model->forward_backward(batch, step, d_wide.data(), d_deep.data());
  // Stop before this step changes a row or a weight: the first non-finite value ends the run.
  if (!std::isfinite(*loss))
    return diverge(step_label(pass, step + 1, pass_step),
                   std::string("the batch loss is ") + (std::isnan(*loss) ? "NaN" : "infinite"));
  if (const std::size_t bad =
          count_non_finite(d_wide.data(), n * ws) + count_non_finite(d_deep.data(), n * ds * dim))
    return diverge(step_label(pass, step + 1, pass_step),
                   std::to_string(bad) + " gradients of the embeddings are not finite");
  ++step;
  if (cached()) {
    auto& wc = cache->cache(wide_t);
    auto& dc = cache->cache(deep_t);
    aggregate_gradients(space, wide_batch, combiner::sum, d_wide.data(), 1, wide_grads);
    apply_optimizer(space, config.tables[wide_t].optimizer, wc.rows(), wc.row_width(), wide_grads,
                    step);
    EMBCACHE_RETURN_IF_ERROR(
        check_rows(wc.rows(), wc.row_width(), wide_grads, "wide", pass, pass_step));
    wc.mark_updated(wide_grads.rows.data(), wide_grads.size);
    aggregate_gradients(space, deep_batch, combiner::sum, d_deep.data(), dim, deep_grads);
    apply_optimizer(space, config.tables[deep_t].optimizer, dc.rows(), dc.row_width(), deep_grads,
                    step);
    EMBCACHE_RETURN_IF_ERROR(
        check_rows(dc.rows(), dc.row_width(), deep_grads, "deep", pass, pass_step));
    dc.mark_updated(deep_grads.rows.data(), deep_grads.size);
  } else {
    EMBCACHE_RETURN_IF_ERROR(hybrid[wide_t]->backward(d_wide.data()));
    EMBCACHE_RETURN_IF_ERROR(hybrid[deep_t]->backward(d_deep.data()));
  }
  model->apply_dense_update();
  return {};
}

trainer::trainer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
trainer::~trainer() = default;

result<std::unique_ptr<trainer>> trainer::create(const trainer_config& given) {
  EMBCACHE_RETURN_IF_ERROR(validate(given));
  auto resolved = resolve_trainer_config(given);  // dataset passes, capacity "auto"
  if (!resolved.ok()) return resolved.get_status();
  const trainer_config& config = resolved.value();
  auto p = std::make_unique<impl>();
  p->config = config;
  EMBCACHE_RETURN_IF_ERROR(p->build());
  std::unique_ptr<trainer> t(new trainer(std::move(p)));
  if (!config.resume_from.empty())
    EMBCACHE_RETURN_IF_ERROR(t->load(config.resume_from).with_context("config.resume_from"));
  return t;
}

std::uint64_t trainer::step() const noexcept { return impl_->step; }
std::uint64_t trainer::passes_done() const noexcept { return impl_->passes_done; }
const std::vector<pass_metrics>& trainer::history() const noexcept { return impl_->history; }
const trainer_config& trainer::config() const noexcept { return impl_->config; }
training_cache<std::int64_t>& trainer::cache() noexcept { return *impl_->cache; }
dense_backend& trainer::model() noexcept { return *impl_->model; }
const std::string& trainer::dense_note() const noexcept { return impl_->dense_note; }
void trainer::set_log(std::function<void(const std::string&)> log) { impl_->log = std::move(log); }

status trainer::run() {
  const auto& passes = impl_->config.passes;
  if (!impl_->dense_note_logged) {
    impl_->log(impl_->dense_note);
    impl_->dense_note_logged = true;
  }
  if (!impl_->diverged.ok()) return impl_->diverged;
  if (!impl_->config.output_dir.empty() && impl_->config.resume_from.empty()) {
    EMBCACHE_RETURN_IF_ERROR(create_folder(impl_->config.output_dir, "config.output_dir"));
    EMBCACHE_RETURN_IF_ERROR(write_text_file(impl_->config.output_dir + "/metrics.jsonl", ""));
    EMBCACHE_RETURN_IF_ERROR(detail::start_step_metrics(impl_->config.output_dir));
  }
  impl_->run_last_pass = impl_->passes_done + passes.size();
  impl_->run_total = samples_of_passes(impl_->config.data_dir, passes);
  impl_->run_done = 0;
  impl_->run_t0 = clock_type::now();
  status s;
  for (std::size_t p = 0; p < passes.size() && s.ok(); ++p) {
    auto m = run_pass(passes[p], p + 1 < passes.size() ? &passes[p + 1] : nullptr);
    if (!m.ok())
      s = m.get_status();
    else if (impl_->config.save_every_pass && !impl_->config.save_dir.empty() &&
             p + 1 < passes.size())
      s = save(impl_->config.save_dir);
  }
  if (s.ok() && !impl_->config.save_dir.empty()) s = save(impl_->config.save_dir);
  impl_->run_last_pass = impl_->run_total = 0;  // a run_pass() of its own has no run part
  return s;
}

result<pass_metrics> trainer::run_pass(const trainer_pass_config& given,
                                       const trainer_pass_config* next) {
  impl& s = *impl_;
  if (!s.diverged.ok()) return s.diverged;
  const trainer_config& c = s.config;
  trainer_config one = c;  // a pass naming a dataset folder gets its shards
  one.passes = {given};
  auto expanded = resolve_trainer_config(one);
  if (!expanded.ok()) return expanded.get_status();
  const trainer_pass_config& pass = expanded.value().passes[0];
  std::vector<std::string> paths;
  for (const auto& p : pass.shards) paths.push_back(resolve_data_path(c.data_dir, p));
  pass_metrics m;
  m.pass = s.passes_done + 1;
  shard_reader_options ro;
  ro.batch_size = c.batch_size;
  ro.shuffle = c.shuffle;
  ro.seed = detail::splitmix64_finalize(c.seed ^ m.pass);
  auto reader = shard_reader::open(paths, ro);
  if (!reader.ok()) return reader.get_status().with_context("pass " + std::to_string(m.pass));
  if (c.crossed && reader.value()->num_crossed() < criteo_cross_count)
    return status::invalid_argument(
        "config.crossed: the shards of pass " + std::to_string(m.pass) + " have " +
        std::to_string(reader.value()->num_crossed()) + " crossed keys, expected " +
        std::to_string(criteo_cross_count) + " (prepare them with crossing on)");
  const table_counters before = sum_tables(s.cache->counters().total);
  double blocked_swap = 0;
  s.interval_hits = s.interval_misses = 0;
  std::uint64_t pass_hits = 0, pass_misses = 0;
  std::size_t current = SIZE_MAX;
  shard_batch batch;
  double loss_sum = 0, interval_loss = 0;
  std::uint64_t interval_steps = 0, interval_samples = 0;
  const std::uint64_t pass_total = reader.value()->total_rows();
  const auto t0 = clock_type::now();
  auto ti = t0;
  std::string rate = "n/a";
  for (;;) {
    EMBCACHE_RETURN_IF_ERROR(reader.value()->next(batch));
    if (batch.size == 0) break;
    const std::size_t current_shard = batch.shard_index;
    if (c.mode == trainer_mode::keyset && batch.shard_index != current) {
      current = batch.shard_index;
      std::vector<std::vector<key_t>> keysets;
      if (s.prefetched_shard == paths[current]) {
        keysets = std::move(s.prefetched_keysets);
      } else {
        auto ks = s.keysets_of(paths[current]);
        if (!ks.ok()) return ks.get_status();
        keysets = std::move(ks).value();
      }
      s.prefetched_shard.clear();
      s.prefetched_keysets.clear();
      const auto tb = clock_type::now();
      EMBCACHE_RETURN_IF_ERROR(s.cache->begin_pass(keysets).with_context(paths[current]));
      blocked_swap += seconds_since(tb);
      s.take_last_counters();
      if (c.prefetch) {
        std::string upcoming;
        if (current + 1 < paths.size())
          upcoming = paths[current + 1];
        else if (next != nullptr && !next->shards.empty())
          upcoming = resolve_data_path(c.data_dir, next->shards[0]);
        if (!upcoming.empty()) {
          auto nks = s.keysets_of(upcoming);
          if (!nks.ok()) return nks.get_status();
          EMBCACHE_RETURN_IF_ERROR(s.cache->prefetch(nks.value()).with_context(upcoming));
          s.prefetched_shard = upcoming;
          s.prefetched_keysets = std::move(nks).value();
        }
      }
    }
    // A non-finite feature would turn the weights it meets into NaN, which a ReLU can hide from
    // the loss: refuse the batch instead.
    if (const std::size_t bad =
            count_non_finite(batch.dense.data(), batch.size * criteo_dense_count) +
            count_non_finite(batch.labels.data(), batch.size))
      return status::invalid_argument(
          impl::step_label(m.pass, s.step + 1, m.steps + 1) + ": shard " + paths[current_shard] +
          ": the batch holds " + std::to_string(bad) +
          " non-finite dense features or labels; the run stops before training on it");
    double loss = 0;
    EMBCACHE_RETURN_IF_ERROR(s.train_step(batch, m.pass, m.steps + 1, &loss));
    loss_sum += loss;
    interval_loss += loss;
    ++m.steps;
    ++interval_steps;
    m.samples += batch.size;
    interval_samples += batch.size;
    if (c.log_interval > 0 && interval_steps == c.log_interval) {
      const double secs = seconds_since(ti);
      const std::uint64_t lookups = s.interval_hits + s.interval_misses;
      // Keyset mode swaps once per shard: between swaps the line repeats the last swap's rate.
      if (lookups) {
        char r[32];
        std::snprintf(r, sizeof r, "%.4f", double(s.interval_hits) / double(lookups));
        rate = r;
      } else if (!s.cached()) {
        rate = "n/a (no cache)";
      }
      detail::training_progress p;
      p.pass = m.pass;
      p.passes = s.run_last_pass;
      p.step = s.step;
      p.pass_done = m.samples;
      p.pass_total = pass_total;
      p.pass_seconds = seconds_since(t0);
      p.run_done = s.run_done + m.samples;
      p.run_total = s.run_total;
      p.run_seconds = seconds_since(s.run_t0);
      p.loss = interval_loss / double(interval_steps);
      p.hit_rate = rate;
      s.log(detail::training_progress_line(p));
      if (!c.output_dir.empty()) {
        detail::step_metrics sm;
        sm.step = s.step;
        sm.pass = m.pass;
        sm.pass_position =
            double(m.pass - 1) + (pass_total ? double(m.samples) / double(pass_total) : 1.0);
        sm.samples = s.samples + m.samples;
        sm.train_loss = p.loss;
        sm.samples_per_s = secs > 0 ? double(interval_samples) / secs : 0.0;
        sm.hit_rate = lookups ? double(s.interval_hits) / double(lookups) : std::nan("");
        EMBCACHE_RETURN_IF_ERROR(create_folder(c.output_dir, "config.output_dir"));
        EMBCACHE_RETURN_IF_ERROR(detail::append_step_metrics(c.output_dir, sm));
      }
      pass_hits += s.interval_hits;
      pass_misses += s.interval_misses;
      s.interval_hits = s.interval_misses = 0;
      interval_loss = 0;
      interval_steps = interval_samples = 0;
      ti = clock_type::now();
    }
  }
  m.seconds = seconds_since(t0);
  s.run_done += m.samples;
  pass_hits += s.interval_hits;
  pass_misses += s.interval_misses;
  s.samples += m.samples;
  m.train_loss = m.steps ? loss_sum / double(m.steps) : std::nan("");
  m.samples_per_s = m.seconds > 0 ? double(m.samples) / m.seconds : 0.0;
  const table_counters after = sum_tables(s.cache->counters().total);
  m.rows_in = after.misses - before.misses;
  m.rows_out = after.rows_pushed - before.rows_pushed;
  if (c.mode == trainer_mode::on_demand)
    m.swap_seconds = (after.seconds_swap_in - before.seconds_swap_in) +
                     (after.seconds_write_back - before.seconds_write_back);
  else
    m.swap_seconds = blocked_swap;
  m.hit_rate =
      pass_hits + pass_misses ? double(pass_hits) / double(pass_hits + pass_misses) : std::nan("");
  // The last step's update is seen by no loss: check the dense state before anything reads,
  // exports or saves it.
  if (!dense_blob_finite(s.model->save()))
    return s.diverge("pass " + std::to_string(m.pass) + " step " + std::to_string(s.step) +
                         " (the pass's last step)",
                     "the dense weights or their Adam state are not finite");
  ++s.passes_done;
  if (!c.eval_shard.empty()) {
    auto e = evaluate();
    if (!e.ok()) return e.get_status();
    m.eval_auc = e.value().auc;
    m.eval_logloss = e.value().logloss;
  } else {
    m.eval_auc = m.eval_logloss = std::nan("");
  }
  if (!c.export_dir.empty()) {
    auto ex = export_incremental();
    if (!ex.ok()) return ex.get_status();
    m.export_path = ex.value().first;
    m.rows_exported = ex.value().second;
  }
  s.history.push_back(m);
  s.log(detail::pass_summary_line(m));
  if (!c.output_dir.empty()) {
    EMBCACHE_RETURN_IF_ERROR(create_folder(c.output_dir, "config.output_dir"));
    EMBCACHE_RETURN_IF_ERROR(
        write_text_file(c.output_dir + "/metrics.jsonl", json(m).dump() + "\n", /*append=*/true));
  }
  return m;
}

result<eval_metrics> trainer::evaluate(const std::string& shard) {
  impl& s = *impl_;
  const trainer_config& c = s.config;
  const std::string path = resolve_data_path(c.data_dir, shard.empty() ? c.eval_shard : shard);
  if (path.empty()) return status::invalid_argument("config.eval_shard: no shard to evaluate on");
  shard_reader_options ro;
  ro.batch_size = c.batch_size;
  ro.read_ahead = false;
  auto reader = shard_reader::open({path}, ro);
  if (!reader.ok()) return reader.get_status().with_context("eval shard");
  if (c.crossed && reader.value()->num_crossed() < criteo_cross_count)
    return status::invalid_argument("config.eval_shard: " + path + " has no crossed keys");
  const std::size_t ws = s.num_wide_slots, ds = criteo_slot_count;
  const std::size_t dim = c.tables[s.deep_t].dim;
  metric_accumulator acc;
  shard_batch b;
  std::uint64_t total = reader.value()->total_rows();
  if (c.eval_max_samples > 0) total = std::min<std::uint64_t>(total, c.eval_max_samples);
  detail::progress_meter meter(total);
  for (;;) {
    if (meter.due(acc.size()))
      s.log("evaluation on " + path + ": " + meter.count_text(acc.size(), "samples"));
    EMBCACHE_RETURN_IF_ERROR(reader.value()->next(b));
    if (b.size == 0) break;
    std::size_t n = b.size;
    if (c.eval_max_samples > 0) n = std::min<std::size_t>(n, c.eval_max_samples - acc.size());
    const std::string where = "pass " + std::to_string(s.passes_done) + " step " +
                              std::to_string(s.step) + ", evaluation on " + path;
    const std::string samples =
        "samples " + std::to_string(acc.size()) + ".." + std::to_string(acc.size() + n - 1);
    if (const std::size_t bad = count_non_finite(b.dense.data(), n * criteo_dense_count) +
                                count_non_finite(b.labels.data(), n))
      return status::invalid_argument(where + ": " + samples + " hold " + std::to_string(bad) +
                                      " non-finite dense features or labels");
    s.fill_keys(b);
    s.in_wide.assign(n * ws, 0.0f);
    s.in_deep.assign(n * ds * dim, 0.0f);
    // One-hot slots: each pooled value is the key's row, or zeros for a key never trained.
    struct part {
      std::size_t t;
      const key_t* keys;
      std::size_t count, dim;
      float* out;
    };
    for (const part& p : {part{s.wide_t, s.wide_keys.data(), n * ws, 1, s.in_wide.data()},
                          part{s.deep_t, b.keys.data(), n * ds, dim, s.in_deep.data()}}) {
      const std::size_t width = s.cache->row_width(p.t);
      s.rows_buf.resize(p.count * width);
      bool* found = s.found_buffer(p.count);
      if (s.cached())
        EMBCACHE_RETURN_IF_ERROR(s.cache->read(p.t, p.keys, p.count, s.rows_buf.data(), found));
      else
        EMBCACHE_RETURN_IF_ERROR(s.stores[p.t]->pull(p.keys, p.count, s.rows_buf.data(), found));
      for (std::size_t i = 0; i < p.count; ++i)
        if (found[i])
          std::copy(s.rows_buf.begin() + i * width, s.rows_buf.begin() + i * width + p.dim,
                    p.out + i * p.dim);
    }
    s.model->predict({n, s.in_wide.data(), s.in_deep.data(), b.dense.data(), nullptr}, s.logits);
    if (const std::size_t bad = count_non_finite(s.logits.data(), n))
      return s.diverge(where, std::to_string(bad) + " of the " + std::to_string(n) + " logits of " +
                                  samples + " are not finite");
    acc.add(s.logits.data(), b.labels.data(), n);
    if (c.eval_max_samples > 0 && acc.size() >= c.eval_max_samples) break;
  }
  eval_metrics e;
  e.samples = acc.size();
  e.auc = acc.auc();
  e.logloss = acc.log_loss();
  // Finite logits give a finite log loss; AUC may be NaN only for a single class.
  if (e.samples > 0 && !std::isfinite(e.logloss))
    return s.diverge("pass " + std::to_string(s.passes_done) + " step " + std::to_string(s.step) +
                         ", evaluation on " + path,
                     "the log loss is not finite");
  return e;
}

result<std::pair<std::string, std::uint64_t>> trainer::export_incremental() {
  impl& s = *impl_;
  if (!s.cached())
    return status::unsupported("incremental export needs a cache (mode keyset or on_demand)");
  if (!s.diverged.ok()) return s.diverged;
  EMBCACHE_RETURN_IF_ERROR(create_folder(s.config.export_dir, "config.export_dir"));
  auto path = s.cache->export_incremental_to(s.config.export_dir, s.config.export_with_state);
  if (!path.ok()) return path.get_status();
  auto text = read_file(path.value() + "/manifest.json");
  if (!text.ok()) return text.get_status();
  std::uint64_t rows = 0;
  try {
    const json m = json::parse(text.value());
    for (const auto& t : m.at("tables")) rows += t.at("count").get<std::uint64_t>();
  } catch (const std::exception& e) {
    return status::corruption(path.value() + "/manifest.json: " + e.what());
  }
  return std::make_pair(path.value(), rows);
}

status trainer::save(const std::string& dir) {
  impl& s = *impl_;
  if (!s.diverged.ok()) return s.diverged;
  const auto t0 = clock_type::now();
  const std::vector<std::uint8_t> dense = s.model->save();
  if (!dense_blob_finite(dense))
    return s.diverge("save to " + dir + " after step " + std::to_string(s.step),
                     "the dense weights or their Adam state are not finite");
  const std::string tmp = dir + ".tmp", old = dir + ".old";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return status::io_error(tmp + ": cannot create (" + ec.message() + ")");
  // A line by the progress rules (every 10%, at least 2 s apart) as the tables are written.
  std::optional<detail::progress_meter> meter;
  const auto on_progress = [&](std::uint64_t done, std::uint64_t total) {
    if (!meter) meter.emplace(total);
    if (done > 0 && meter->due(done))
      s.log("save to " + dir + ": " + meter->count_text(done, "rows"));
  };
  EMBCACHE_RETURN_IF_ERROR(s.cache->save(tmp + "/sparse", on_progress));
  EMBCACHE_RETURN_IF_ERROR(write_file_durable(tmp + "/dense.bin", dense.data(), dense.size()));
  json history = json::array();
  for (const auto& m : s.history) history.push_back(m);
  json cfg = s.config;
  const json state = {{"format", "embcache-trainer"},
                      {"format_version", 1},
                      {"mode", to_string(s.config.mode)},
                      {"step", s.step},
                      {"passes_done", s.passes_done},
                      {"samples", s.samples},
                      {"seed", s.config.seed},
                      {"crossed", s.config.crossed},
                      {"history", history},
                      {"counters", s.cache->counters()},
                      {"config", cfg}};
  const std::string text = state.dump(2) + "\n";
  EMBCACHE_RETURN_IF_ERROR(write_file_durable(tmp + "/trainer.json", text.data(), text.size()));
  fs::remove_all(old, ec);
  if (fs::exists(dir)) {
    fs::rename(dir, old, ec);
    if (ec)
      return status::io_error(dir + ": cannot move the previous save aside (" + ec.message() + ")");
  }
  fs::rename(tmp, dir, ec);
  if (ec) return status::io_error(tmp + ": cannot rename to " + dir + " (" + ec.message() + ")");
  fs::remove_all(old, ec);
  s.log(detail::save_summary_line(dir, seconds_since(t0)));
  return {};
}

status trainer::load(const std::string& dir_in) {
  impl& s = *impl_;
  std::string dir = dir_in;
  // Between the two renames of save() only `dir.old` holds a complete save.
  if (!fs::exists(dir + "/trainer.json") && fs::exists(dir + ".old/trainer.json")) dir += ".old";
  auto text = read_file(dir + "/trainer.json");
  if (!text.ok()) return text.get_status();
  json state;
  std::uint64_t step = 0, passes = 0, samples = 0;
  std::vector<pass_metrics> history;
  try {
    state = json::parse(text.value());
    if (state.at("format") != "embcache-trainer" || state.at("format_version") != 1)
      return status::invalid_argument(dir +
                                      "/trainer.json: not an embcache-trainer save of version 1");
    if (state.at("crossed").get<bool>() != s.config.crossed)
      return status::invalid_argument(dir + "/trainer.json: saved with crossed " +
                                      state.at("crossed").dump() + ", config.crossed differs");
    step = state.at("step").get<std::uint64_t>();
    passes = state.at("passes_done").get<std::uint64_t>();
    samples = state.at("samples").get<std::uint64_t>();
    for (const auto& h : state.at("history")) {
      pass_metrics m;
      auto num = [&](const char* k) {
        return h.at(k).is_null() ? std::nan("") : h.at(k).get<double>();
      };
      m.pass = h.at("pass").get<std::uint64_t>();
      m.samples = h.at("samples").get<std::uint64_t>();
      m.steps = h.at("steps").get<std::uint64_t>();
      m.train_loss = num("train_loss");
      m.eval_auc = num("eval_auc");
      m.eval_logloss = num("eval_logloss");
      m.swap_seconds = num("swap_seconds");
      m.rows_in = h.at("rows_in").get<std::uint64_t>();
      m.rows_out = h.at("rows_out").get<std::uint64_t>();
      m.hit_rate = num("hit_rate");
      m.samples_per_s = num("samples_per_s");
      m.seconds = num("seconds");
      m.rows_exported = h.at("rows_exported").get<std::uint64_t>();
      m.export_path = h.at("export_path").get<std::string>();
      history.push_back(m);
    }
  } catch (const std::exception& e) {
    return status::corruption(dir + "/trainer.json: " + e.what());
  }
  auto dense = read_file(dir + "/dense.bin");
  if (!dense.ok()) return dense.get_status();
  EMBCACHE_RETURN_IF_ERROR(s.cache->load(dir + "/sparse"));
  EMBCACHE_RETURN_IF_ERROR(
      s.model
          ->load(reinterpret_cast<const std::uint8_t*>(dense.value().data()), dense.value().size())
          .with_context(dir + "/dense.bin"));
  s.step = step;
  s.passes_done = passes;
  s.samples = samples;
  s.history = std::move(history);
  for (auto& h : s.hybrid)
    if (h) h->set_step(step);
  return {};
}

}  // namespace embcache
