// The sharded embedding path of a run over several ranks: each table is a sharded_table whose
// rows live in the stores of the rank that owns their keys; a step sends the rank's keys to
// their owners and the gradients back (distributed/sharded_table.hpp). Saves are sharded saves,
// one folder per table, loadable on any number of ranks.
#include <filesystem>
#include <utility>
#include <vector>

#include "embcache/distributed/sharded_table.hpp"
#include "embedding_path.hpp"
#ifdef EMBCACHE_TRAINER_WITH_ROCKSDB
#include "embcache/rocksdb_store.hpp"
#endif

namespace embcache::detail {
namespace {

namespace fs = std::filesystem;

// Opens a part of a sharded save whatever store wrote it: a RocksDB checkpoint (it has a
// CURRENT file) or a host_store checkpoint.
part_opener<trainer_key> part_opener_for(const trainer_table_config& tc) {
  const part_opener<trainer_key> host = host_store_part_opener<trainer_key>();
#ifdef EMBCACHE_TRAINER_WITH_ROCKSDB
  return [host, tc](const std::string& dir, const std::string& table,
                    std::size_t row_width) -> result<std::unique_ptr<param_store<trainer_key>>> {
    std::error_code ec;
    if (!fs::exists(dir + "/CURRENT", ec)) return host(dir, table, row_width);
    rocksdb_store_options ro;
    ro.path = dir;
    ro.table_name = table;
    ro.row_width = row_width;
    ro.dim = tc.dim;
    ro.optimizer = to_string(tc.optimizer.kind);
    ro.existing_rows = existing_rows_policy::reuse;
    auto s = rocksdb_store<trainer_key>::open(ro);
    if (!s.ok()) return s.get_status();
    return std::unique_ptr<param_store<trainer_key>>(std::move(s).value());
  };
#else
  (void)tc;
  return host;
#endif
}

// Removes every row of `store` (a load replaces the rows a rank holds).
status clear_store(param_store<trainer_key>& store) {
  std::vector<trainer_key> keys;
  EMBCACHE_RETURN_IF_ERROR(store.for_each(
      4096, [&](const trainer_key* k, const float*, const std::uint64_t*, std::size_t n) {
        keys.insert(keys.end(), k, k + n);
        return status{};
      }));
  return store.erase(keys.data(), keys.size());
}

class sharded_path final : public embedding_path {
 public:
  sharded_path(const trainer_config& config, communicator& comm, embedding_tables tables,
               std::string* building)
      : config_(config), comm_(comm), tables_(std::move(tables)) {
    for (const std::size_t t : {tables_.roles.wide, tables_.roles.deep}) {
      sharded_table_options so;
      so.table.dim = config.tables[t].dim;
      so.table.optimizer = config.tables[t].optimizer;
      so.table.max_threads = config.threads;
      so.num_blocks = config.num_blocks;
      *building = "config.tables[" + std::to_string(t) + "] (table \"" + config.tables[t].name +
                  "\"): its sharded table";
      sharded_[t] = std::make_unique<sharded_table<trainer_key>>(
          comm, *tables_.stores[t], so, cache_initializer(*tables_.cache, t));
    }
  }

  status begin_shard(const std::string&, const std::string&) override { return {}; }

  status forward(const batch_keys& k, float* wide_out, float* deep_out) override {
    const std::size_t n = k.batch_size, global = k.global_batch_size ? k.global_batch_size : n;
    EMBCACHE_RETURN_IF_ERROR(sharded_[tables_.roles.wide]->forward(
        {n, k.wide_slots, k.offsets, k.wide, n * k.wide_slots}, wide_out, global));
    return sharded_[tables_.roles.deep]->forward(
        {n, k.deep_slots, k.offsets, k.deep, n * k.deep_slots}, deep_out, global);
  }

  // The owners apply the optimizers; the tables count their own steps (set_step keeps them
  // equal to the trainer's).
  status backward(const float* d_wide, const float* d_deep, std::uint64_t,
                  non_finite_rows*) override {
    EMBCACHE_RETURN_IF_ERROR(sharded_[tables_.roles.wide]->backward(d_wide));
    return sharded_[tables_.roles.deep]->backward(d_deep);
  }

  // Collective: every rank reads the keys of its own samples.
  status read(std::size_t t, const trainer_key* keys, std::size_t n, float* rows,
              bool* found) override {
    return sharded_[t]->read(keys, n, rows, found);
  }
  std::size_t row_width(std::size_t t) const override { return tables_.cache->row_width(t); }
  bool has_cache() const noexcept override { return false; }
  path_activity take_activity() override { return {}; }
  const cache_counters& counters() const override { return tables_.cache->counters(); }

  result<std::string> export_incremental_to(const std::string&, bool) override {
    return status::unsupported("incremental export needs a cache (mode keyset or on_demand)");
  }
  // `dir`/<table>: a sharded save per table (every rank its part, rank 0 the manifest).
  status save_sparse(const std::string& dir, const save_progress&) override {
    for (const std::size_t t : {tables_.roles.wide, tables_.roles.deep})
      EMBCACHE_RETURN_IF_ERROR(sharded_[t]->save(dir + "/" + config_.tables[t].name));
    return {};
  }
  // Any number of ranks may have written the save: each rank keeps the rows it owns now.
  status load_sparse(const std::string& dir) override {
    for (const std::size_t t : {tables_.roles.wide, tables_.roles.deep}) {
      const std::string folder = dir + "/" + config_.tables[t].name;
      status local;
      std::error_code ec;
      if (!fs::exists(folder + "/manifest.json", ec))
        local = status::invalid_argument(
            folder + "/manifest.json: not found; a sharded run resumes from the save of a sharded "
                     "run (a save of one process keeps its tables in the training cache's layout)");
      else
        local = clear_store(*tables_.stores[t]);
      EMBCACHE_RETURN_IF_ERROR(agree(
          comm_, local.with_context("rank " + std::to_string(comm_.rank())), "trainer::load"));
      EMBCACHE_RETURN_IF_ERROR(sharded_[t]->load(folder, part_opener_for(config_.tables[t])));
    }
    return {};
  }
  void set_step(std::uint64_t step) override {
    for (auto& s : sharded_)
      if (s) s->set_step(step);
  }
  training_cache<trainer_key>& cache() override { return *tables_.cache; }

 private:
  const trainer_config config_;
  communicator& comm_;
  embedding_tables tables_;
  std::unique_ptr<sharded_table<trainer_key>> sharded_[2];
};

}  // namespace

std::unique_ptr<embedding_path> make_sharded_path(const trainer_config& config,
                                                  communicator& comm, embedding_tables tables,
                                                  std::string* building) {
  return std::make_unique<sharded_path>(config, comm, std::move(tables), building);
}

}  // namespace embcache::detail
