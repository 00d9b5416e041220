// What every embedding path is built from: the configuration's stores (host memory or
// RocksDB) and the training cache over them; and the one place that picks the path by mode.
#include "embedding_path.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "common/durable_file.hpp"
#include "embcache/criteo.hpp"
#include "embcache/host_store.hpp"
#include "embcache/log_store.hpp"
#include "embcache/tiered_store.hpp"
#include "trainer_config_store.hpp"
#ifdef EMBCACHE_TRAINER_WITH_ROCKSDB
#include "embcache/rocksdb_store.hpp"
#endif

namespace embcache::detail {
namespace {

std::string table_field(std::size_t t) { return "config.tables[" + std::to_string(t) + "]"; }

// Whether this trainer was built with the cuda path (make_cuda_cache_path).
#ifdef EMBCACHE_TRAINER_WITH_CUDA
constexpr bool has_cuda_path = true;
#else
constexpr bool has_cuda_path = false;
#endif

#ifdef EMBCACHE_TRAINER_WITH_ROCKSDB
// Tables that name the same store_path share one database.
using database_map = std::map<std::string, std::shared_ptr<rocksdb_database>>;
#else
struct database_map {};  // no RocksDB in this build: only host stores
#endif

result<std::shared_ptr<param_store<trainer_key>>> make_store(const trainer_config& config,
                                                             std::size_t t, host_space space,
                                                             database_map& databases) {
  const trainer_table_config& tc = config.tables[t];
  const std::size_t row_width = tc.dim + state_width(tc.optimizer.kind, tc.dim);
  if (tc.store == "host") {
    host_store_options so;
    so.table_name = tc.name;
    so.row_width = row_width;
    so.space = space;
    return std::shared_ptr<param_store<trainer_key>>(std::make_shared<host_store<trainer_key>>(so));
  }
  if (tc.store == "log") {
    log_store_options lo = log_options_of(config, t);
    // Under a memory budget the table bypasses the page cache, which a memory cgroup charges to
    // the process, as the RocksDB store's does.
    lo.direct_io = config.memory_budget_bytes != 0 && direct_io_supported(tc.store_path);
    auto s = log_store<trainer_key>::open(lo);
    if (!s.ok()) return s.get_status().with_context(table_field(t) + ".store_path");
    return std::shared_ptr<param_store<trainer_key>>(std::move(s).value());
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
  ro.block_bytes = tc.store_block_bytes;
  // With a memory budget, the databases' block caches and memtables and the "auto" DRAM tiers
  // are what the budget leaves (plan_trainer_memory, the caches counted on the host wherever
  // they are).
  std::uint64_t dram_bytes = tc.dram_tier_bytes;
  if (config.memory_budget_bytes != 0) {
    auto plan = plan_trainer_memory(config);
    if (!plan.ok()) return plan.get_status();
    apply_memory_plan(plan.value(), rocksdb_databases_of(config).size(), ro);
    // Under a budget the table goes through the block cache only: the page cache, which a
    // memory cgroup charges to the process and reclaims at its limit, holds none of it.
    if (direct_io_supported(tc.store_path)) {
      ro.use_direct_reads = true;
      ro.use_direct_io_for_flush_and_compaction = true;
      // Every row that misses the block cache is then a read of the disk: MultiGets in flight
      // on threads of their own rather than the cores' keep the SSD's queue full. With their
      // blocks submitted together (batched_direct_reads) 8 of them do, at less CPU than 32
      // reading block by block (docs/stores.md, "Tuning for a table larger than memory").
      ro.read_threads = rocksdb_batched_reads_available() ? 8 : 32;
      // Compactions then take the cores training leaves (docs/trainer.md, Performance).
      ro.low_priority_compaction = true;
    }
    std::size_t auto_tiers = 0;
    for (const auto& other : config.tables) auto_tiers += other.dram_tier_auto ? 1 : 0;
    if (tc.dram_tier_auto) dram_bytes = plan.value().dram_tier_bytes / auto_tiers;
  }
  auto& db = databases[tc.store_path];
  if (!db) {
    auto opened = rocksdb_database::open(ro);
    if (!opened.ok()) return opened.get_status().with_context(table_field(t) + ".store_path");
    db = opened.value();
  }
  auto s = rocksdb_store<trainer_key>::open(db, ro);
  if (!s.ok()) return s.get_status().with_context(table_field(t) + ".store_path");
  std::shared_ptr<param_store<trainer_key>> store(std::move(s).value());
  if (dram_bytes == 0) return store;
  tiered_store_options<trainer_key> to;
  to.lower = std::move(store);
  to.dram_bytes = static_cast<std::size_t>(dram_bytes);
  auto tier = tiered_store<trainer_key>::open(std::move(to));
  if (!tier.ok()) return tier.get_status().with_context(table_field(t) + ".dram_tier_bytes");
  return std::shared_ptr<param_store<trainer_key>>(std::move(tier).value());
#else
  (void)databases;
  return status::unsupported(table_field(t) + ".store: this build has no RocksDB store");
#endif
}

}  // namespace

std::string rank_folder_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05d", rank);
  return name;
}

table_roles roles_of(const trainer_config& config) {
  table_roles r;
  for (std::size_t t = 0; t < config.tables.size(); ++t) {
    if (config.tables[t].name == "wide") r.wide = t;
    if (config.tables[t].name == "deep") r.deep = t;
  }
  return r;
}

result<exported_delta> exported_delta_of(const std::string& dir) {
  const std::string manifest = dir + "/manifest.json";
  auto text = read_file_bytes(manifest);
  if (!text.ok()) return text.get_status();
  exported_delta d{dir, 0};
  try {
    const auto m = nlohmann::json::parse(text.value().begin(), text.value().end());
    for (const auto& t : m.at("tables")) d.rows += t.at("count").get<std::uint64_t>();
  } catch (const std::exception& e) {
    return status::corruption(manifest + ": " + e.what());
  }
  return d;
}

table_counters sum_of_tables(const std::vector<table_counters>& tables) {
  table_counters sum;
  for (const auto& c : tables) sum += c;
  return sum;
}

result<embedding_stores> build_embedding_stores(const trainer_config& config, host_space space,
                                                bool save_only_cache) {
  embedding_stores tables;
  tables.roles = roles_of(config);
  database_map databases;
  for (std::size_t t = 0; t < config.tables.size(); ++t) {
    const trainer_table_config& tc = config.tables[t];
    table_options<trainer_key> o;
    o.name = tc.name;
    o.dim = tc.dim;
    o.optimizer = tc.optimizer;
    o.capacity = save_only_cache ? 1 : tc.capacity;
    o.slots = save_only_cache ? 0 : tc.slots;
    o.max_resident = save_only_cache ? 0 : tc.max_resident;
    o.init.kind = init_kind::uniform;
    o.init.scale = tc.init_scale;
    o.init.seed = config.seed;
    o.slot_of = [](trainer_key k) -> std::uint64_t { return criteo_key_tag(k); };  // HugeCTR
    o.admission = tc.admission;
    o.expiry = tc.expiry;  // host-hybrid: its boundaries (begin_pass_in_stores) expire rows
    const status opened =
        allocating(table_field(t) + " (table \"" + tc.name + "\"): its store", [&]() -> status {
          auto store = make_store(config, t, space, databases);
          if (!store.ok()) return store.get_status();
          o.store = store.value();
          tables.stores.push_back(std::move(store).value());
          tables.tables.push_back(std::move(o));
          return {};
        });
    if (!opened.ok()) return opened;
  }
  tables.options.mode =
      config.mode == trainer_mode::on_demand ? cache_mode::on_demand : cache_mode::keyset;
  const cache_memory_options memory = cache_memory_of(config);
  tables.options.staging_bytes = static_cast<std::size_t>(memory.staging_bytes);
  tables.options.write_back_bytes = static_cast<std::size_t>(memory.write_back_bytes);
  tables.options.prefetch_batch = memory.prefetch_batch;
  // config.move_staged_rows when set, else unset: the training cache's default for its space
  // (moves_staged_rows() counts the same). A save-only cache stages nothing (its tables are one
  // bucket); without prefetch nothing is staged to move.
  if (save_only_cache || config.mode != trainer_mode::keyset || !config.prefetch)
    tables.options.move_staged_rows = false;
  else
    tables.options.move_staged_rows = config.move_staged_rows;
  return tables;
}

std::string training_cache_field(const std::vector<table_options<trainer_key>>& tables) {
  std::string what = "config.tables: the training cache of";
  for (std::size_t t = 0; t < tables.size(); ++t)
    what += std::string(t ? " and" : "") + " table \"" + tables[t].name + "\" (" + table_field(t) +
            ".capacity " + std::to_string(tables[t].capacity) + ")";
  return what;
}

status out_of_memory(const std::string& what) {
  return status::capacity_exceeded(
             "out of memory (std::bad_alloc) while allocating it; lower the capacity or the "
             "model size")
      .with_context(what);
}

result<embedding_tables> build_embedding_tables(const trainer_config& config, host_space space,
                                                bool save_only_cache) {
  auto stores = build_embedding_stores(config, space, save_only_cache);
  if (!stores.ok()) return stores.get_status();
  return make_cache_tables(std::move(stores).value(), space);
}

embedding_initializer<trainer_key> cache_initializer(training_cache<trainer_key>& cache,
                                                     std::size_t t) {
  const auto ref = cache.cache(t).ref();
  const std::size_t width = cache.row_width(t);
  return [ref, width](trainer_key k, float* emb, std::size_t dim) {
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
}

result<bool> embedding_device_of(const trainer_config& config, bool sharded, std::string* note) {
  const device_choice requested = config.embedding_device;
  const std::string field = "config.embedding_device";
  EMBCACHE_RETURN_IF_ERROR(check_device_choice(requested, field));
  const bool hybrid = config.mode == trainer_mode::host_hybrid;
  // The device is probed only when the tables could go there.
  const bool device = !hybrid && !sharded && has_cuda_path && cuda_device_available();
  std::string why;
  bool use_cuda = false;
  if (requested == device_choice::cuda) {
    if (hybrid)
      return status::invalid_argument(
          field +
          ": \"cuda\" with config.mode \"host_hybrid\": host-hybrid keeps the "
          "embeddings and their sparse optimizers on the host (use \"host\" or \"auto\", "
          "or mode \"keyset\" or \"on_demand\")");
    if (sharded)
      return status::unsupported(field +
                                 ": \"cuda\" in a sharded run: it keeps its tables on the host "
                                 "(use \"host\" or \"auto\")");
    if (!has_cuda_path)
      return status::unsupported(field +
                                 ": \"cuda\" needs the cuda space, and this program was built "
                                 "without it (build embcache with CUDA)");
    if (!device) return status::unsupported(field + ": \"cuda\" but no CUDA device is present");
    use_cuda = true;
  } else if (requested == device_choice::automatic) {
    use_cuda = device;
    why = hybrid           ? " (auto: mode host_hybrid keeps them on the host)"
          : sharded        ? " (auto: a sharded run keeps them on the host)"
          : !has_cuda_path ? " (auto: this program has no cuda space)"
          : device         ? " (auto: CUDA device present)"
                           : " (auto: no CUDA device)";
  }
  if (note) *note = std::string("embeddings on ") + (use_cuda ? "cuda" : "host") + why;
  return use_cuda;
}

result<std::unique_ptr<embedding_path>> make_embedding_path(const trainer_config& config,
                                                            host_space space, communicator* comm,
                                                            std::string* note) {
  auto on_cuda = embedding_device_of(config, comm != nullptr, note);
  if (!on_cuda.ok()) return on_cuda.get_status();
  if (comm != nullptr) {
    // Each rank its own stores: a RocksDB folder per rank under the configured one.
    trainer_config mine = config;
    for (auto& tc : mine.tables)
      if (tc.store != "host") tc.store_path += "/" + rank_folder_name(comm->rank());
    const bool keyset = config.mode == trainer_mode::keyset;
    auto tables = build_embedding_tables(mine, space, /*save_only_cache=*/!keyset);
    if (!tables.ok()) return tables.get_status();
    return make_sharded_path(mine, space, *comm, std::move(tables).value());
  }
  const bool hybrid = config.mode == trainer_mode::host_hybrid;
#ifdef EMBCACHE_TRAINER_WITH_CUDA
  if (on_cuda.value()) {
    auto stores = build_embedding_stores(config, space, /*save_only_cache=*/false);
    if (!stores.ok()) return stores.get_status();
    return make_cuda_cache_path(config, std::move(stores).value());
  }
#endif
  auto tables = build_embedding_tables(config, space, /*save_only_cache=*/hybrid);
  if (!tables.ok()) return tables.get_status();
  if (hybrid) return make_host_hybrid_path(config, std::move(tables).value());
  return make_cache_path(config, space, std::move(tables).value());
}

}  // namespace embcache::detail
