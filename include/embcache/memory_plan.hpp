/// @file memory_plan.hpp
/// @brief One memory budget for a process that trains over a table larger than memory: the
/// parts that cannot shrink (the device caches' rows and slots, the prefetch staging, whatever
/// else the caller keeps) are checked against it, and the rest is split between the tiers that
/// can (a DRAM tier, RocksDB's block cache, its row cache and its memtables).
///
/// plan_memory() runs before anything is allocated: a budget too small is capacity_exceeded
/// naming the budget's field and the bytes it would need. apply_memory_plan() writes the plan
/// into the options of a RocksDB store. docs/stores.md ("A memory budget") explains the split.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "embcache/rocksdb_store.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// What plan_memory() splits and what it must leave room for. Percentages are integers.
struct memory_plan_options {
  /// The whole budget in bytes; default 0 (must be set).
  std::uint64_t budget_bytes = 0;
  /// The training caches' rows and slots (e.g. embedding_cache::bytes_per_slot and
  /// bytes_per_bucket times the slots); default 0.
  std::uint64_t cache_bytes = 0;
  /// Rows staged by the prefetch for the next pass and rows written behind; default 0.
  std::uint64_t staging_bytes = 0;
  /// Anything else the process keeps (a dense model, a batch's buffers); default 0.
  std::uint64_t other_bytes = 0;
  /// Column families of the RocksDB databases the plan sizes, each with its own memtables;
  /// default 0 (no RocksDB store: nothing is split, only the fixed parts are checked).
  std::size_t rocksdb_column_families = 0;
  /// Memtables of one column family (rocksdb_store_options::max_write_buffers); default 2.
  int max_write_buffers = 2;
  /// A DRAM tier sits in front of the RocksDB store and takes dram_tier_percent; default false.
  bool dram_tier = false;
  /// RocksDB keeps a row cache that takes row_cache_percent; default false.
  bool row_cache = false;
  /// Share of the budget held back for what no option bounds (RocksDB's index and filter
  /// blocks outside the block cache, its table readers, the allocator's slack); default 10.
  unsigned reserve_percent = 10;
  /// Share of the split memory (the budget less the fixed parts and the reserve) for the DRAM
  /// tier when `dram_tier`; default 50.
  unsigned dram_tier_percent = 50;
  /// Share of the split memory for the row cache when `row_cache`; default 10.
  unsigned row_cache_percent = 10;
  /// Share of the split memory for the memtables of every column family; default 15. The block
  /// cache gets what the other shares leave.
  unsigned memtable_percent = 15;
  /// Name of the budget in messages; default "memory_budget_bytes".
  std::string field = "memory_budget_bytes";
};

/// The smallest sizes plan_memory() hands out: below them RocksDB stalls or thrashes.
inline constexpr std::uint64_t min_block_cache_bytes = std::uint64_t{8} << 20;   ///< 8 MiB
inline constexpr std::uint64_t min_write_buffer_bytes = std::uint64_t{1} << 20;  ///< 1 MiB
inline constexpr std::uint64_t min_row_cache_bytes = std::uint64_t{1} << 20;     ///< 1 MiB
inline constexpr std::uint64_t min_dram_tier_bytes = std::uint64_t{1} << 20;     ///< 1 MiB

/// How a budget is spent. The parts sum to at most budget_bytes.
struct memory_plan {
  std::uint64_t budget_bytes = 0;        ///< the budget
  std::uint64_t cache_bytes = 0;         ///< the caches (as given)
  std::uint64_t staging_bytes = 0;       ///< the staging (as given)
  std::uint64_t other_bytes = 0;         ///< the rest the caller keeps (as given)
  std::uint64_t reserve_bytes = 0;       ///< held back (reserve_percent of the budget)
  std::uint64_t dram_tier_bytes = 0;     ///< the DRAM tier (0 without one)
  std::uint64_t block_cache_bytes = 0;   ///< RocksDB's block cache, all databases together
  std::uint64_t row_cache_bytes = 0;     ///< RocksDB's row cache, all databases together
  std::uint64_t memtable_bytes = 0;      ///< every memtable of every column family
  std::uint64_t write_buffer_bytes = 0;  ///< one memtable (memtable_bytes / count)
  int max_write_buffers = 0;             ///< memtables per column family
  /// Every part added up (never more than budget_bytes).
  std::uint64_t total_bytes() const noexcept {
    return cache_bytes + staging_bytes + other_bytes + reserve_bytes + dram_tier_bytes +
           block_cache_bytes + row_cache_bytes + memtable_bytes;
  }
};

/// The blocks past which the allocator hands freed memory back to the system under a budget:
/// 4 MiB (glibc's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD).
inline constexpr std::size_t budget_allocator_threshold_bytes = std::size_t{4} << 20;
/// Makes glibc's malloc return freed blocks of budget_allocator_threshold_bytes or more to the
/// system: they are mapped on their own and unmapped when freed, and the heap is trimmed past
/// that much free memory at its top. By default glibc raises its mapping threshold after each
/// large free (up to 32 MiB) and keeps such blocks in its heaps, where the process holds them
/// past what a plan counts. Process-wide and lasting; call it before allocating what the plan
/// counts (trainer::create does when the configuration sets memory_budget_bytes). Returns false
/// where the C library has no such settings (not glibc) or refuses them.
bool keep_allocator_within_budget() noexcept;

/// Splits `options.budget_bytes`. invalid_argument naming the option when a percentage is out of
/// range or the shares add up to more than 100; capacity_exceeded when the budget cannot hold the
/// fixed parts, the reserve and the smallest RocksDB parts, naming `options.field`, the bytes
/// needed and each part, e.g. "memory_budget_bytes: 100000000 bytes is less than the 202724694
/// bytes needed (caches 104857600, staging 52428800, other 10485760, reserve 10%, RocksDB at least
/// 14680064)". Overflow-checked: parts past 2^64 bytes are refused the same way ("the parts need
/// more than 2^64 bytes (...)").
[[nodiscard]] result<memory_plan> plan_memory(const memory_plan_options& options);

/// Sizes the memory of one of `databases` RocksDB databases from `plan`: its block cache is
/// block_cache_bytes / databases, its row cache row_cache_bytes / databases, its memtables
/// write_buffer_bytes each, max_write_buffers per column family; and index and filter blocks go
/// through the block cache, partitioned (cache_index_and_filter_blocks,
/// partition_index_and_filters), so that a table's index does not grow the process past the
/// plan however large the table. The DRAM tier (tiered_store_options::dram_bytes) is the
/// caller's to size from dram_tier_bytes.
inline void apply_memory_plan(const memory_plan& plan, std::size_t databases,
                              rocksdb_store_options& options) {
  if (databases == 0) databases = 1;
  options.block_cache_bytes = static_cast<std::size_t>(plan.block_cache_bytes / databases);
  options.write_buffer_bytes = static_cast<std::size_t>(plan.write_buffer_bytes);
  options.max_write_buffers = plan.max_write_buffers;
  options.row_cache_bytes = static_cast<std::size_t>(plan.row_cache_bytes / databases);
  options.cache_index_and_filter_blocks = true;
  options.partition_index_and_filters = true;
}

}  // namespace embcache
