// The host-hybrid embedding path (MindSpore's host+device hybrid): no cache in the step; each
// table's lookup and sparse optimizer run on its parameter store through host_hybrid_table.
// With feature admission or expiry on, each shard's start is the pass boundary keyset mode's
// begin_pass makes it: the shard's keysets are sighted and its rows expired by the cache of one
// bucket per table over the stores (training_cache::begin_pass_in_stores), which keeps the
// sketches and the expiry clocks and saves them, so a host-hybrid run admits, refuses and
// expires exactly what a keyset-mode run does. Its incremental exports are the cache's, of the
// rows pushed into the stores since the last one and the keys expired since (tombstones).
#include <vector>

#include "embcache/host_hybrid.hpp"
#include "embedding_path.hpp"

namespace embcache::detail {
namespace {

class host_hybrid_path final : public embedding_path {
 public:
  host_hybrid_path(const trainer_config& config, embedding_tables tables)
      : config_(config), tables_(std::move(tables)), keysets_(config_, tables_.roles) {
    refused_.resize(config.tables.size());
  }

  // The host-hybrid tables of the wide and the deep table over their stores.
  status build_tables() {
    for (const std::size_t t : {tables_.roles.wide, tables_.roles.deep}) {
      const trainer_table_config& tc = config_.tables[t];
      host_hybrid_options ho;
      ho.dim = tc.dim;
      ho.optimizer = tc.optimizer;
      ho.max_threads = config_.threads;
      const std::string what = "config.tables[" + std::to_string(t) + "] (table \"" + tc.name +
                               "\"): its host-hybrid table";
      EMBCACHE_RETURN_IF_ERROR(allocating(what, [&]() -> status {
        hybrid_[t] = std::make_unique<host_hybrid_table<trainer_key>>(*tables_.stores[t], ho,
                                                                      initializer_of(t));
        return {};
      }));
      boundaries_ = boundaries_ || tc.admission.enabled() || tc.expiry.enabled();
      steps_ = steps_ || tc.expiry.ttl_steps != 0;
    }
    return {};
  }

  status begin_shard(const std::string& shard, const std::string&) override {
    if (!boundaries_) return {};
    auto keysets = keysets_.read_keysets(shard);
    if (!keysets.ok()) return keysets.get_status();
    return tables_.cache->begin_pass_in_stores(keysets.value(), &refused_).with_context(shard);
  }

  // Expiry's ttl_steps: the cache takes each step's clock from the stores the step writes.
  status begin_step() override {
    if (steps_) tables_.cache->begin_step();
    return {};
  }

  status forward(const batch_keys& k, float* wide_out, float* deep_out) override {
    const std::size_t n = k.batch_size, w = tables_.roles.wide, d = tables_.roles.deep;
    EMBCACHE_RETURN_IF_ERROR(
        hybrid_[w]->forward({n, k.wide_slots, k.offsets, k.wide, n * k.wide_slots}, wide_out,
                            refused_[w].data(), refused_[w].size(), default_rows(w, k.wide_slots)));
    return hybrid_[d]->forward({n, k.deep_slots, k.offsets, k.deep, n * k.deep_slots}, deep_out,
                               refused_[d].data(), refused_[d].size(),
                               default_rows(d, k.deep_slots));
  }

  // The tables count their own optimizer steps, kept equal to the trainer's by set_step.
  status backward(const float* d_wide, const float* d_deep, std::uint64_t,
                  non_finite_rows*) override {
    EMBCACHE_RETURN_IF_ERROR(hybrid_[tables_.roles.wide]->backward(d_wide));
    return hybrid_[tables_.roles.deep]->backward(d_deep);
  }

  status read(std::size_t t, const trainer_key* keys, std::size_t n, float* rows,
              bool* found) override {
    return tables_.stores[t]->pull(keys, n, rows, found);
  }
  std::size_t row_width(std::size_t t) const override { return tables_.cache->row_width(t); }
  bool has_cache() const noexcept override { return false; }
  path_activity take_activity() override { return {}; }
  const cache_counters& counters() const override { return tables_.cache->counters(); }

  // The cache's export, of the rows pushed into the stores since the last one (adopt_store_writes)
  // and of the keys expired since, its tombstones: the deltas of keyset mode.
  result<exported_delta> export_incremental_to(const std::string& dir, bool with_state) override {
    EMBCACHE_RETURN_IF_ERROR(tables_.cache->adopt_store_writes());
    auto path = tables_.cache->export_incremental_to(dir, with_state);
    if (!path.ok()) return path.get_status();
    return exported_delta_of(path.value());
  }
  // The cache holds none of the stores' rows: it takes their version clocks (adopt_stores) and
  // saves them with its admission counts and expiry clocks, under its run identity, which load()
  // below adopts from a save. With exports, a save between two of them keeps the next one's
  // position and logs (adopt_store_writes).
  status save_sparse(const std::string& dir, const save_progress& on_progress) override {
    EMBCACHE_RETURN_IF_ERROR(config_.export_dir.empty() ? tables_.cache->adopt_stores()
                                                        : tables_.cache->adopt_store_writes());
    return tables_.cache->save(dir, on_progress);
  }
  // The rows pushed from now on are newer than the loaded table clock (which the expiry clock's
  // values may reach), as an uninterrupted run's are.
  status load_sparse(const std::string& dir, const load_options& options) override {
    EMBCACHE_RETURN_IF_ERROR(tables_.cache->load(dir, options));
    for (std::size_t t = 0; t < 2; ++t)
      if (hybrid_[t]) hybrid_[t]->advance_version(tables_.cache->cache(t).version());
    return {};
  }
  void set_step(std::uint64_t step) override {
    for (auto& h : hybrid_)
      if (h) h->set_step(step);
  }
  training_cache<trainer_key>* host_cache() override { return tables_.cache.get(); }

 private:
  // What table t's refused keys read: nullptr for zeros, else its `num_slots` slots' default
  // rows (admission's default_row "slot"), drawn when the count changes.
  const float* default_rows(std::size_t t, std::size_t num_slots) {
    const admission_options& a = config_.tables[t].admission;
    if (!a.enabled() || a.default_row != refused_row::slot) return nullptr;
    std::vector<float>& rows = default_rows_[t];
    const std::size_t dim = config_.tables[t].dim;
    if (rows.size() != num_slots * dim) {
      rows.resize(num_slots * dim);
      for (std::size_t s = 0; s < num_slots; ++s)
        tables_.cache->default_row(t, s, rows.data() + s * dim);
    }
    return rows.data();
  }

  embedding_initializer<trainer_key> initializer_of(std::size_t t) {
    return cache_initializer(*tables_.cache, t);
  }

  const trainer_config config_;  // keysets_ reads it
  embedding_tables tables_;
  std::unique_ptr<host_hybrid_table<trainer_key>> hybrid_[2];
  bool boundaries_ = false;  // a table with admission or expiry: shards begin passes
  bool steps_ = false;       // a table with expiry's ttl_steps: steps are recorded
  keyset_swapper keysets_;
  std::vector<std::vector<trainer_key>> refused_;  // per table: the shard's refused keys
  std::vector<float> default_rows_[2];             // per table: its refused keys' rows, or empty
};

}  // namespace

result<std::unique_ptr<embedding_path>> make_host_hybrid_path(const trainer_config& config,
                                                              embedding_tables tables) {
  auto path = std::make_unique<host_hybrid_path>(config, std::move(tables));
  EMBCACHE_RETURN_IF_ERROR(path->build_tables());
  return std::unique_ptr<embedding_path>(std::move(path));
}

}  // namespace embcache::detail
