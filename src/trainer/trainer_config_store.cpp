// The trainer's configuration, the fields of where the rows live and how much memory the run may
// take: each table's store (host memory or RocksDB) and the run's memory budget; read, checked
// and written here, the rest of the configuration in trainer_config.cpp.
#include "trainer_config_store.hpp"

#include <algorithm>

#include "embcache/log_store.hpp"
#include "embcache/optimizers.hpp"
#include "embcache/rocksdb_store.hpp"
#include "embcache/trainer/trainer.hpp"
#include "embcache/training_cache.hpp"

namespace embcache::detail {
namespace {

// tables[i].store_block_bytes: 0 (derived) or the RocksDB store's block sizes.
const int_range store_block_bytes_range{0, rocksdb_max_block_bytes};
// tables[i].store_rows: a log store's rows (0: from the datasets).
const int_range store_rows_range{0, std::uint64_t{1} << 40};

}  // namespace

void read_store_fields(object_reader& r, trainer_table_config& tc) {
  r.get("store", tc.store);
  r.get("store_path", tc.store_path);
  r.get("reuse_store", tc.reuse_store);
  if (r.has("dram_tier_bytes") && r.at("dram_tier_bytes").is_string()) {
    std::string v;
    r.get("dram_tier_bytes", v);
    if (v != "auto")
      r.fail(r.path("dram_tier_bytes"), "expected " + int_range{0, max_memory_budget}.text() +
                                            " or \"auto\", got " + shown(json(v)));
    tc.dram_tier_auto = true;
  } else {
    r.get_int("dram_tier_bytes", tc.dram_tier_bytes, {0, max_memory_budget});
  }
  r.get_int("store_block_bytes", tc.store_block_bytes, store_block_bytes_range);
  r.get_int("store_rows", tc.store_rows, store_rows_range);
}

status validate_store_fields(const trainer_table_config& tc, const std::string& at,
                             std::uint64_t budget) {
  if (tc.store != "host" && tc.store != "rocksdb" && tc.store != "log")
    return status::invalid_argument(at + ".store: \"" + tc.store +
                                    "\" is not a store (\"host\", \"rocksdb\" or \"log\")");
  if (tc.store != "host" && tc.store_path.empty())
    return status::invalid_argument(at + ".store_path: required with store \"" + tc.store +
                                    "\"");
  EMBCACHE_RETURN_IF_ERROR(
      check_int(at + ".dram_tier_bytes", tc.dram_tier_bytes, {0, max_memory_budget}));
  if ((tc.dram_tier_bytes != 0 || tc.dram_tier_auto) && tc.store != "rocksdb")
    return status::invalid_argument(at + ".dram_tier_bytes: a DRAM tier sits in front of a " +
                                    "RocksDB store (store \"rocksdb\"), not store \"" + tc.store +
                                    "\"");
  EMBCACHE_RETURN_IF_ERROR(
      check_int(at + ".store_block_bytes", tc.store_block_bytes, store_block_bytes_range));
  if (tc.store_block_bytes != 0 && tc.store_block_bytes < rocksdb_min_block_bytes)
    return status::invalid_argument(
        at + ".store_block_bytes: " + std::to_string(tc.store_block_bytes) +
        " is under a block's least, " + std::to_string(rocksdb_min_block_bytes) +
        " bytes (0 derives it from the row)");
  if (tc.store_block_bytes != 0 && tc.store != "rocksdb")
    return status::invalid_argument(at + ".store_block_bytes: blocks are those of a RocksDB " +
                                    "store (store \"rocksdb\"), not store \"" + tc.store + "\"");
  EMBCACHE_RETURN_IF_ERROR(check_int(at + ".store_rows", tc.store_rows, store_rows_range));
  if (tc.store_rows != 0 && tc.store != "log")
    return status::invalid_argument(at + ".store_rows: the rows a log store's index is sized " +
                                    "for (store \"log\"), not store \"" + tc.store + "\"");
  if (tc.dram_tier_auto && budget == 0)
    return status::invalid_argument(at + ".dram_tier_bytes: \"auto\" takes a share of " +
                                    "config.memory_budget_bytes, which is not set");
  return {};
}

log_store_options log_options_of(const trainer_config& c, std::size_t t) {
  const trainer_table_config& tc = c.tables[t];
  log_store_options o;
  o.path = tc.store_path + "/" + tc.name;
  o.table_name = tc.name;
  o.row_width = tc.dim + state_width(tc.optimizer.kind, tc.dim);
  o.dim = tc.dim;
  o.optimizer = to_string(tc.optimizer.kind);
  o.expected_rows = static_cast<std::size_t>(tc.store_rows);
  // An earlier run's rows are used only when asked for; a resume replaces them anyway.
  o.reuse_rows = tc.reuse_store || !c.resume_from.empty();
  return o;
}

void store_fields_json(const trainer_table_config& tc, json& j) {
  j["store"] = tc.store;
  j["store_path"] = tc.store_path;
  j["reuse_store"] = tc.reuse_store;
  j["dram_tier_bytes"] = tc.dram_tier_auto ? json("auto") : json(tc.dram_tier_bytes);
  j["store_block_bytes"] = tc.store_block_bytes;
  j["store_rows"] = tc.store_rows;
}

std::vector<rocksdb_database_use> rocksdb_databases_of(const trainer_config& c) {
  std::vector<rocksdb_database_use> dbs;
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    if (c.tables[t].store != "rocksdb") continue;
    bool found = false;
    for (auto& d : dbs)
      if (d.path == c.tables[t].store_path) {
        ++d.tables;
        found = true;
      }
    if (!found) dbs.push_back({c.tables[t].store_path, t, 1});
  }
  return dbs;
}

void read_memory_fields(object_reader& r, trainer_config& c) {
  r.get_int("memory_budget_bytes", c.memory_budget_bytes, {0, max_memory_budget});
  r.get_int("staging_bytes", c.staging_bytes, {0, max_memory_budget});
  r.get_int("write_back_bytes", c.write_back_bytes, {0, max_memory_budget});
}

status validate_memory_fields(const trainer_config& c) {
  EMBCACHE_RETURN_IF_ERROR(
      check_int("config.memory_budget_bytes", c.memory_budget_bytes, {0, max_memory_budget}));
  EMBCACHE_RETURN_IF_ERROR(
      check_int("config.staging_bytes", c.staging_bytes, {0, max_memory_budget}));
  return check_int("config.write_back_bytes", c.write_back_bytes, {0, max_memory_budget});
}

void memory_fields_json(const trainer_config& c, json& j) {
  j["memory_budget_bytes"] = c.memory_budget_bytes;
  j["staging_bytes"] = c.staging_bytes;
  j["write_back_bytes"] = c.write_back_bytes;
}

cache_memory_options cache_memory_of(const trainer_config& c) {
  const training_cache_options defaults;
  cache_memory_options m;
  const std::uint64_t budget = c.memory_budget_bytes;
  m.staging_bytes = c.staging_bytes ? c.staging_bytes
                    : budget != 0   ? budget / 4
                                    : std::uint64_t{defaults.staging_bytes};
  m.write_back_bytes = c.write_back_bytes ? c.write_back_bytes
                       : budget != 0      ? std::max<std::uint64_t>(1, budget / 32)
                                          : std::uint64_t{defaults.write_back_bytes};
  // With a budget the worker's batch buffers (two batches of rows) stay small.
  m.prefetch_batch = budget != 0 ? 16384 : defaults.prefetch_batch;
  return m;
}

}  // namespace embcache::detail
