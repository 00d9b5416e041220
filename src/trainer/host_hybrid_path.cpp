// The host-hybrid embedding path (MindSpore's host+device hybrid): no cache in the step; each
// table's lookup and sparse optimizer run on its parameter store through host_hybrid_table.
#include <vector>

#include "embcache/host_hybrid.hpp"
#include "embedding_path.hpp"
#include "format/model_folder.hpp"

namespace embcache::detail {
namespace {

class host_hybrid_path final : public embedding_path {
 public:
  host_hybrid_path(const trainer_config& config, embedding_tables tables, std::string* building)
      : tables_(std::move(tables)) {
    for (const std::size_t t : {tables_.roles.wide, tables_.roles.deep}) {
      host_hybrid_options ho;
      ho.dim = config.tables[t].dim;
      ho.optimizer = config.tables[t].optimizer;
      ho.max_threads = config.threads;
      *building = "config.tables[" + std::to_string(t) + "] (table \"" + config.tables[t].name +
                  "\"): its host-hybrid table";
      hybrid_[t] = std::make_unique<host_hybrid_table<trainer_key>>(*tables_.stores[t], ho,
                                                                    initializer_of(t));
    }
  }

  status begin_shard(const std::string&, const std::string&) override { return {}; }

  status forward(const batch_keys& k, float* wide_out, float* deep_out) override {
    const std::size_t n = k.batch_size;
    EMBCACHE_RETURN_IF_ERROR(hybrid_[tables_.roles.wide]->forward(
        {n, k.wide_slots, k.offsets, k.wide, n * k.wide_slots}, wide_out));
    return hybrid_[tables_.roles.deep]->forward(
        {n, k.deep_slots, k.offsets, k.deep, n * k.deep_slots}, deep_out);
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

  result<exported_delta> export_incremental_to(const std::string&, bool) override {
    return status::unsupported("incremental export needs a cache (mode keyset or on_demand)");
  }
  // The stores are written straight into the save layout (the cache holds none of their rows),
  // under the run identity of the cache, which load() below adopts from a save.
  status save_sparse(const std::string& dir, const save_progress& on_progress) override {
    std::vector<table_options<trainer_key>> tables;
    for (std::size_t t = 0; t < tables_.cache->num_tables(); ++t)
      tables.push_back(tables_.cache->table(t));
    return detail::save_stores<trainer_key>(dir, tables, on_progress, tables_.cache->run_id());
  }
  status load_sparse(const std::string& dir, const load_options& options) override {
    return tables_.cache->load(dir, options);
  }
  void set_step(std::uint64_t step) override {
    for (auto& h : hybrid_)
      if (h) h->set_step(step);
  }
  training_cache<trainer_key>* host_cache() override { return tables_.cache.get(); }

 private:
  embedding_initializer<trainer_key> initializer_of(std::size_t t) {
    return cache_initializer(*tables_.cache, t);
  }

  embedding_tables tables_;
  std::unique_ptr<host_hybrid_table<trainer_key>> hybrid_[2];
};

}  // namespace

std::unique_ptr<embedding_path> make_host_hybrid_path(const trainer_config& config,
                                                      embedding_tables tables,
                                                      std::string* building) {
  return std::make_unique<host_hybrid_path>(config, std::move(tables), building);
}

}  // namespace embcache::detail
