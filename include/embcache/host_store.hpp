/// @file host_store.hpp
/// @brief Parameter store in host memory: a sharded flat index over a slab of rows.
///
/// Layout (see docs/stores.md): keys are hashed to one of `num_shards` shards. Each shard owns
/// an open-addressing index (linear probing, power-of-two capacity, at most 3/4 occupied) whose
/// slot holds the key and the location of its row, and a slab of rows made of chunks that are
/// allocated once and never reallocated, so a row never moves while it exists. Erased rows go to
/// a per-shard free list and are reused by later inserts. Occupancy is kept in the location field
/// of a slot, never in the key, so every key value (0, -1, the maximum, ...) is a valid key.
///
/// Concurrency: pull and contains take every shard's lock shared, once per batch; push and erase
/// group the batch by shard and take each shard's lock exclusively once, then work on the shards
/// in parallel. Pulls and contains may overlap each other; push, erase and checkpoint must not
/// overlap other calls on the same store. A for_each callback must not call the store it iterates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "embcache/param_store.hpp"
#include "embcache/space.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// Options of a host_store.
struct host_store_options {
  /// Name of the table the store holds; default "" (recorded in checkpoints).
  std::string table_name;
  /// Floats per row (embedding + optimizer state); default 0, must be set (> 0).
  std::size_t row_width = 0;
  /// Number of shards, rounded up to a power of two; default 64.
  std::size_t num_shards = 64;
  /// Rows the index of every shard is sized for up front, in total; default 0 (grow on demand).
  std::size_t expected_rows = 0;
  /// Smallest chunk of rows a shard allocates, in bytes; default 64 KiB.
  std::size_t min_chunk_bytes = std::size_t{64} << 10;
  /// Threads used by bulk calls; default: oneTBB's default (all cores).
  host_space space{};
};

namespace detail {
template <class Key>
struct host_shard;
}

/// Parameter store of one table in host memory.
///
/// Memory: `memory_bytes() <= memory_bound(rows, options)`: per row its floats and its 8-byte
/// version, times 33/32 (the chunk being filled), plus at most `3.2 * slot_bytes` of index
/// (slot_bytes = 16 for int64 keys, 12 for uint32 keys; the index is 31%..75% full), plus a fixed
/// `num_shards * (min_chunk_bytes + row bytes + 16 slots + 4 KiB)`. For a row of 192 floats
/// (dim 64 with Adam) and int64 keys that is at most 10.9% over the rows' own bytes, plus the
/// fixed part. `rows` is the most rows held at once: erased rows are reused, not returned, and
/// cost 8 more bytes each on the free list until reused. An index presized with `expected_rows`
/// counts as that many rows.
template <class Key>
class host_store final : public scanning_param_store<Key> {
 public:
  /// An empty store. Throws embcache::error (invalid_argument) when `row_width` is 0.
  explicit host_store(host_store_options options);
  ~host_store() override;
  host_store(const host_store&) = delete;
  host_store& operator=(const host_store&) = delete;

  /// Loads a folder written by checkpoint(). `options.table_name` and `options.row_width` are
  /// what the caller expects: a folder of another table (not_found), another row width or key
  /// type (invalid_argument), a missing or unreadable file (not_found / io_error) or a file
  /// whose size or xxHash64 checksum differs from the manifest (corruption) is refused.
  static result<std::unique_ptr<host_store>> open(const std::string& dir,
                                                  host_store_options options);

  std::size_t row_width() const noexcept override { return options_.row_width; }
  const std::string& table_name() const noexcept override { return options_.table_name; }
  status pull(const Key* keys, std::size_t n, float* rows_out, bool* found_out,
              std::uint64_t* versions_out = nullptr) override;
  status push(const Key* keys, std::size_t n, const float* rows,
              const std::uint64_t* versions = nullptr) override;
  status erase(const Key* keys, std::size_t n, std::size_t* erased_out = nullptr) override;
  status contains(const Key* keys, std::size_t n, bool* found_out) override;
  std::size_t size() const noexcept override;
  std::uint64_t max_version() const noexcept override;
  /// Nothing to make durable in memory: always ok.
  status flush() override { return {}; }
  /// Writes `dir` (manifest.json + keys.bin, versions.bin, rows.bin) through a temporary sibling
  /// folder that is fsynced and renamed into place, so `dir` is either complete or absent.
  /// A full disk gives out_of_space; the store itself is never changed by a checkpoint.
  status checkpoint(const std::string& dir) override;

  /// Bytes of host memory the store holds (rows, versions, indexes, free lists).
  std::size_t memory_bytes() const noexcept;
  /// The documented upper bound of memory_bytes() for `rows` rows with these options.
  static std::size_t memory_bound(std::size_t rows, const host_store_options& options) noexcept;
  /// Options the store was made with (num_shards rounded up to a power of two).
  const host_store_options& options() const noexcept { return options_; }

 private:
  status scan(bool changed_only, std::uint64_t version, std::size_t batch_size,
              const store_batch_fn<Key>& fn) override;

  host_store_options options_;
  unsigned shard_bits_ = 0;
  std::unique_ptr<detail::host_shard<Key>[]> shards_;
  std::uint64_t max_version_ = 0;
};

extern template class host_store<std::int64_t>;
extern template class host_store<std::uint32_t>;

}  // namespace embcache
