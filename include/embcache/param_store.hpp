/// @file param_store.hpp
/// @brief The parameter store: every row of one table outside the device cache.
///
/// A store is the source of truth between passes. Rows are `row_width` floats (embedding
/// followed by optimizer state) plus a version (the update counter value of the last write).
/// All pointers are host memory. Implementations: host_store (host memory) and rocksdb_store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "embcache/status.hpp"

namespace embcache {

/// Callback of a batched iteration: `n` rows, `keys[i]` owns `rows[i*row_width ..]` and
/// `versions[i]`. Returning a non-ok status stops the iteration and is returned by it.
template <class Key>
using store_batch_fn = std::function<status(const Key* keys, const float* rows,
                                            const std::uint64_t* versions, std::size_t n)>;

/// Interface of a parameter store for one table. Batches may hold 0 to 10M keys; bulk calls run
/// in parallel inside. Calls on one store are not meant to overlap each other unless an
/// implementation says so.
template <class Key>
class param_store {
 public:
  virtual ~param_store() = default;

  /// Floats per row (embedding dim + optimizer-state width).
  virtual std::size_t row_width() const noexcept = 0;
  /// Name of the table this store holds.
  virtual const std::string& table_name() const noexcept = 0;

  /// Copies the rows of `keys` into `rows_out` (`n * row_width` floats); `found_out[i]` says
  /// whether key i exists (its row is left untouched when not). A key repeated in the batch gets
  /// its row at every position. `versions_out` may be nullptr.
  virtual status pull(const Key* keys, std::size_t n, float* rows_out, bool* found_out,
                      std::uint64_t* versions_out = nullptr) = 0;

  /// Inserts or overwrites rows. `versions` may be nullptr: then every row of the batch is
  /// stamped with max_version() + 1. A key repeated in the batch: the last occurrence wins.
  virtual status push(const Key* keys, std::size_t n, const float* rows,
                      const std::uint64_t* versions = nullptr) = 0;

  /// Removes keys; absent keys are ignored. `erased_out` (may be nullptr) gets the count removed.
  virtual status erase(const Key* keys, std::size_t n, std::size_t* erased_out = nullptr) = 0;

  /// `found_out[i]` = whether key i exists.
  virtual status contains(const Key* keys, std::size_t n, bool* found_out) = 0;

  /// Number of rows held.
  virtual std::size_t size() const noexcept = 0;

  /// Highest version of any row pushed so far (0 for an empty store).
  virtual std::uint64_t max_version() const noexcept = 0;

  /// Calls `fn` on batches of at most `batch_size` rows until every row was visited.
  virtual status for_each(std::size_t batch_size, const store_batch_fn<Key>& fn) = 0;

  /// Like for_each, over the rows whose version is greater than `version` only.
  virtual status for_each_changed_since(std::uint64_t version, std::size_t batch_size,
                                        const store_batch_fn<Key>& fn) = 0;

  /// Makes every completed push durable (a no-op for stores without a durable medium).
  virtual status flush() = 0;

  /// Writes a consistent, self-describing copy of the store into the folder `dir` (created;
  /// must not exist or be empty). A crash during checkpoint leaves earlier checkpoints intact.
  virtual status checkpoint(const std::string& dir) = 0;
};

/// Base of the stores whose two iterations are one scan of their rows: for_each and
/// for_each_changed_since check their arguments (a batch_size of 0 or an empty callback is
/// invalid_argument naming the table) and call scan().
template <class Key>
class scanning_param_store : public param_store<Key> {
 public:
  status for_each(std::size_t batch_size, const store_batch_fn<Key>& fn) final {
    return checked_scan(false, 0, batch_size, fn);
  }
  status for_each_changed_since(std::uint64_t version, std::size_t batch_size,
                                const store_batch_fn<Key>& fn) final {
    return checked_scan(true, version, batch_size, fn);
  }

 protected:
  /// Calls `fn` on batches of at most `batch_size` (> 0) rows until every row was visited, or,
  /// with `changed_only`, every row whose version is greater than `version`; `fn` is not empty.
  virtual status scan(bool changed_only, std::uint64_t version, std::size_t batch_size,
                      const store_batch_fn<Key>& fn) = 0;

 private:
  status checked_scan(bool changed_only, std::uint64_t version, std::size_t batch_size,
                      const store_batch_fn<Key>& fn) {
    const char* call = changed_only ? "for_each_changed_since" : "for_each";
    if (batch_size == 0)
      return status::invalid_argument(std::string(call) + " on table '" + this->table_name() +
                                      "': batch_size must be > 0");
    if (!fn)
      return status::invalid_argument(std::string(call) + " on table '" + this->table_name() +
                                      "': empty callback");
    return scan(changed_only, version, batch_size, fn);
  }
};

}  // namespace embcache
