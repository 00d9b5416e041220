// The configuration's store and memory fields (trainer_config_store.cpp): what
// trainer_config.cpp calls to read, check and write them. Not a public header.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "config_reader.hpp"
#include "embcache/log_store.hpp"
#include "embcache/status.hpp"

namespace embcache {
struct trainer_config;
struct trainer_table_config;
}  // namespace embcache

namespace embcache::detail {

/// The largest memory budget a configuration may set: 2^50 bytes (1 PiB).
inline constexpr std::uint64_t max_memory_budget = std::uint64_t{1} << 50;

/// Reads a table's "store", "store_path", "reuse_store", "dram_tier_bytes" and
/// "store_block_bytes".
void read_store_fields(object_reader& r, trainer_table_config& tc);
/// Checks them; `at` is the table's path ("config.tables[1]"); `budget` is the run's memory
/// budget (an "auto" DRAM tier needs one).
[[nodiscard]] status validate_store_fields(const trainer_table_config& tc, const std::string& at,
                                           std::uint64_t budget);
/// Writes them into the table's JSON object.
void store_fields_json(const trainer_table_config& tc, json& j);

/// The options the trainer opens table `t`'s log store with (store "log"; direct_io is decided
/// where it is opened, from the memory budget and the file system).
log_store_options log_options_of(const trainer_config& c, std::size_t t);

/// One RocksDB database of a configuration: its folder, the first table on it and how many.
struct rocksdb_database_use {
  std::string path;
  std::size_t first_table = 0;
  std::size_t tables = 0;
};
/// The RocksDB databases the tables name (store "rocksdb"), in the order of their first table.
std::vector<rocksdb_database_use> rocksdb_databases_of(const trainer_config& c);

/// The memory options of the run's training cache (training_cache_options): staging_bytes and
/// write_back_bytes from the configuration, or their defaults (a share of memory_budget_bytes
/// when set, else the cache's own), and the prefetch's batch (16384 keys with a budget, else the
/// cache's default). check_memory counts what the cache reserves with exactly these.
struct cache_memory_options {
  std::uint64_t staging_bytes = 0;
  std::uint64_t write_back_bytes = 0;
  std::size_t prefetch_batch = 0;
};
cache_memory_options cache_memory_of(const trainer_config& c);

/// Reads the top-level "memory_budget_bytes", "staging_bytes" and "write_back_bytes".
void read_memory_fields(object_reader& r, trainer_config& c);
/// Checks them (their ranges; the budget's split is checked by check_memory).
[[nodiscard]] status validate_memory_fields(const trainer_config& c);
/// Writes them into the configuration's JSON object.
void memory_fields_json(const trainer_config& c, json& j);

}  // namespace embcache::detail
