/// @file tiered_store.hpp
/// @brief A bounded host-memory (DRAM) tier in front of any parameter store.
///
/// tiered_store<Key> holds the most recently used rows of a table in host memory, at most
/// `dram_bytes` of them, and keeps every other row in the store below it (a rocksdb_store
/// normally). A pull reads the tier first and the misses from below in one batched call, then
/// keeps what it read; a push writes into the tier only. When the tier is over its bound it
/// demotes rows (CLOCK order: rows not touched since the hand last passed go first): a clean row
/// (the same as below) is dropped from memory, a dirty one is written down to the lower store, in
/// key order, in batches, before it leaves memory. flush() writes every dirty row down and
/// flushes the lower store; checkpoint() is that plus the lower store's checkpoint, so what a
/// flush or checkpoint made durable is whatever the lower store keeps across a crash.
///
/// Every query is exact across both tiers: size(), contains(), erase(), max_version(), and the
/// iterations (which write the dirty rows down first, then iterate the lower store, which then
/// holds every row). Calls on one tiered store may overlap: each runs under the store's lock.
/// docs/stores.md ("The DRAM tier") says when to use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "embcache/param_store.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// Options of a tiered store.
template <class Key>
struct tiered_store_options {
  /// The store below the tier, which holds every row the tier does not; default null (must be
  /// set). The tiered store owns a share of it; nothing else should write to it meanwhile.
  std::shared_ptr<param_store<Key>> lower;
  /// Bound of the tier's memory: its rows, versions and index, counted as
  /// tiered_store<Key>::dram_row_bytes(row_width) per row; default 1 GiB. Must hold one row.
  std::size_t dram_bytes = std::size_t{1} << 30;
  /// Rows per push to the lower store when dirty rows are written down; default 65536.
  std::size_t write_down_rows = 65536;
};

/// What a tiered store has done since it was opened (tiered_store::counters).
struct tiered_store_counters {
  std::uint64_t hits = 0;                ///< pulled keys served by the tier
  std::uint64_t misses = 0;              ///< pulled keys read from the lower store
  std::uint64_t demotions = 0;           ///< rows that left the tier for its bound
  std::uint64_t clean_drops = 0;         ///< demoted rows that were clean (nothing written)
  std::uint64_t rows_written_down = 0;   ///< dirty rows written to the lower store, all causes
  std::uint64_t bytes_written_down = 0;  ///< their bytes (row floats and 8-byte version)
  std::size_t rows = 0;                  ///< rows in the tier now
  std::size_t dirty_rows = 0;            ///< of which dirty
  std::size_t bytes = 0;                 ///< memory the tier counts now (rows * dram_row_bytes)
  std::size_t capacity_rows = 0;         ///< rows the tier holds at most
};

/// A bounded DRAM tier in front of a parameter store (see the file's description).
template <class Key>
class tiered_store final : public param_store<Key> {
 public:
  /// Bytes the tier counts for one row of `row_width` floats: the floats, the version and the
  /// tier's bookkeeping (index entry and slot, 80 bytes).
  static constexpr std::size_t dram_row_bytes(std::size_t row_width) noexcept {
    return row_width * sizeof(float) + 80;
  }

  /// Opens a tier in front of `options.lower`. A null lower store, a dram_bytes that does not
  /// hold one row, or a write_down_rows of 0 is invalid_argument naming the field (and, for
  /// dram_bytes, the bytes one row needs).
  static result<std::unique_ptr<tiered_store>> open(tiered_store_options<Key> options);
  /// Writes the dirty rows down (errors are dropped: call flush() first to see them).
  ~tiered_store() override;
  tiered_store(const tiered_store&) = delete;
  tiered_store& operator=(const tiered_store&) = delete;

  /// The lower store's.
  std::size_t row_width() const noexcept override;
  /// The lower store's.
  const std::string& table_name() const noexcept override;
  /// Hits are copied from the tier; the misses are pulled from the lower store in one call
  /// (each distinct key once) and the rows found join the tier as clean rows, demoting others
  /// when the tier is full (a failed write-down is returned; the outputs are filled anyway).
  status pull(const Key* keys, std::size_t n, float* rows_out, bool* found_out,
              std::uint64_t* versions_out = nullptr) override;
  /// Writes into the tier (dirty rows), demoting others first when it is full; a batch with
  /// more new keys than the tier holds writes the excess straight down, in key order.
  status push(const Key* keys, std::size_t n, const float* rows,
              const std::uint64_t* versions = nullptr) override;
  /// Removes the keys from the tier and from the lower store; `erased_out` counts each key
  /// present in either once.
  status erase(const Key* keys, std::size_t n, std::size_t* erased_out = nullptr) override;
  status contains(const Key* keys, std::size_t n, bool* found_out) override;
  /// The lower store's size plus the tier's rows that it does not hold (whether a pushed key is
  /// below is asked of it on the first size() after the push, in one contains call; an error
  /// there counts such rows as new).
  std::size_t size() const noexcept override;
  std::uint64_t max_version() const noexcept override;
  /// Writes the dirty rows down, then iterates the lower store.
  status for_each(std::size_t batch_size, const store_batch_fn<Key>& fn) override;
  /// Writes the dirty rows down, then iterates the lower store.
  status for_each_changed_since(std::uint64_t version, std::size_t batch_size,
                                const store_batch_fn<Key>& fn) override;
  /// Writes every dirty row down (key order, batches of write_down_rows), then flushes the
  /// lower store.
  status flush() override;
  /// flush(), then the lower store's checkpoint into `dir` (reopen it as the lower store and
  /// put a new tier in front).
  status checkpoint(const std::string& dir) override;

  /// What the tier has done and holds now.
  tiered_store_counters counters() const;
  /// The store below the tier.
  const std::shared_ptr<param_store<Key>>& lower() const noexcept;

  struct impl;

 private:
  explicit tiered_store(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

extern template class tiered_store<std::int64_t>;
extern template class tiered_store<std::uint32_t>;

}  // namespace embcache
