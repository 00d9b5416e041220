/// @file redis.hpp
/// @brief Redis as a serving store of the incremental model (library embcache::redis, built when
/// hiredis is found): a base model folder and then each delta pushed in a documented layout, and
/// the rows read back for lookup-only scoring. docs/serving.md#redis-layout is the layout:
///
///   `P:schema`        string, JSON {"format":"embcache-redis","format_version":1,
///                     "key_type":..,"tables":[{"name":..,"dim":..},..]}
///   `P:table:<name>`  hash per table: field = the key in decimal, value = dim little-endian
///                     float32 (the row's emb_vector)
///   `P:versions`      hash: table name -> the table version the store holds (decimal)
///   `P:applied`       string: the last delta applied (decimal; 0 = the base only)
///   `P:rows`          hash: table name -> the rows `P:table:<name>` held after the last push
///   `P:lock`          string: the token of the one writer pushing now (expires with its lease)
///
/// where P is the prefix; the schema also carries the model's run identity (`run_id`) when its
/// folders record one. One writer at a time: a push takes `P:lock` (SET NX PX with a random token
/// and a lease it renews) and a second one is refused as "in use". A delta lands in one MULTI/EXEC
/// transaction (HDEL of its tombstones, HSET of its rows, its versions, `P:rows` and `P:applied`);
/// a base lands through staging hashes of its writer, renamed in one transaction. Before each
/// EXEC the writer WATCHes every key the transaction touches and checks its lock and the keys'
/// types, so a transaction either runs whole (no command in it can fail) or aborts whole, and a
/// reader sees each delta wholly or not at all.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "embcache/keyset.hpp"
#include "embcache/serving.hpp"
#include "embcache/status.hpp"

namespace embcache {

namespace detail {
struct redis_connection;
}  // namespace detail

/// Where the store is.
struct redis_options {
  std::string host = "127.0.0.1";   ///< server address (default 127.0.0.1)
  int port = 6379;                  ///< TCP port (default 6379)
  std::string prefix = "embcache";  ///< P of every key (default "embcache"); no spaces
  double timeout_seconds = 10;      ///< connect and per-reply timeout (default 10 s)
  std::size_t batch_rows = 1000;    ///< rows per HSET / HDEL / HMGET command (default 1000)
  /// Sent with AUTH after connecting when not empty (default "": no AUTH). The tools take it
  /// from a file or the environment, never from the command line.
  std::string password;
  /// Lease of a writer's lock `P:lock`, renewed as the push goes on (default 60 s): a writer that
  /// died frees the store after at most this long.
  double lock_lease_seconds = 60;
  /// Test hook (default empty): called right before each transaction's EXEC of a push, with the
  /// name of what it commits, so that tests can make a second writer race the first.
  std::function<void(const std::string& what)> before_commit;
};

/// Reads "HOST:PORT" or "[IPV6]:PORT" (PORT in 1..65535) into a copy of `base`; invalid_argument
/// otherwise.
result<redis_options> parse_redis_address(const std::string& host_port, redis_options base = {});

/// What redis_push did.
struct redis_push_report {
  bool base_pushed = false;           ///< the base folder replaced the store's model
  std::uint64_t from_delta = 0;       ///< `P:applied` before (after the base, when pushed)
  std::uint64_t applied_delta = 0;    ///< `P:applied` after
  std::vector<std::uint64_t> deltas;  ///< deltas taken, in order (contained ones included)
  std::uint64_t rows_written = 0;     ///< HSET fields sent
  std::uint64_t keys_deleted = 0;     ///< HDEL fields sent (tombstones)
  /// The store or a delta taken has no run identity (written by an earlier version): the runs
  /// were not checked.
  bool run_unchecked = false;
};

/// Pushes a model into the store. When the store holds no model under the prefix (no
/// `P:applied`), or `replace_base`, the model folder `base_dir` (a save's sparse folder, a
/// trainer save, or an apply_deltas result) replaces whatever is there, with `P:applied` set to
/// its applied_delta. Then every delta of `deltas_dir` (may be empty: none) that follows the
/// store's position is pushed, in order, each in one transaction, with the rules of apply_deltas
/// (plan_deltas, advance_position; deltas already contained in the base only move
/// `P:applied`). A refused delta stops the push there: the store stays at the last delta pushed.
/// io_error for a connection or server failure, naming the server and the command.
result<redis_push_report> redis_push(const redis_options& options, const std::string& base_dir,
                                     const std::string& deltas_dir, const apply_options& apply = {},
                                     bool replace_base = false);

/// The model a store holds: its tables and position.
struct redis_model {
  embcache::key_type key_type = embcache::key_type::int64;  ///< default int64 (schema: "int64")
  std::vector<std::pair<std::string, std::size_t>> dims;  ///< (table, dim) in schema order
  model_position position;                                ///< `P:applied` and `P:versions`
  std::string run_id;  ///< the schema's run identity ("" when the model has none)
  /// Per table of `dims`: the rows `P:rows` recorded at the last push (-1: not recorded, a store
  /// written by an earlier version) and the rows `P:table:<name>` holds now.
  std::vector<std::pair<std::int64_t, std::int64_t>> rows;
};

/// Reads `P:schema`, `P:applied`, `P:versions`, `P:rows` and each table's row count; not_found
/// when the store holds no model.
result<redis_model> redis_read_model(const redis_options& options);

/// Checks a store's model against the trainer save `save_dir` (its `sparse/manifest.json`, or for a
/// sharded save its tables' manifests, each table at version `applied_delta`: serving.md) before
/// scoring: key type, run identity (when both record one), every table of the save in the schema
/// with its dim and holding rows, and (unless `allow_other_point`) the point of the run: each
/// table's version in `P:versions` must equal the save's, since the save's dense network was
/// trained with exactly those rows (a store at delta 1 scored with the network of delta 3 gives a
/// worse AUC, silently). invalid_argument naming the server and what differs (for the point: the
/// table, both versions and the store's applied delta).
[[nodiscard]] status redis_check_model(const redis_model& model, const redis_options& options,
                                       const std::string& save_dir, bool allow_other_point = false);

/// The store's rows for score_shard: one HMGET per table and batch of keys (each HMGET sees one
/// delta wholly). A value of another size than dim floats is corruption naming the table and key.
class redis_rows : public row_lookup {
 public:
  /// Connects and reads the model's schema (not_found when the store holds none), then checks
  /// that every table holds the rows the last push recorded (corruption naming the table's key:
  /// a table renamed or deleted behind the store's back).
  static result<std::unique_ptr<redis_rows>> connect(const redis_options& options);
  ~redis_rows() override;
  /// row_lookup::lookup through HMGET `P:table:<table>`.
  [[nodiscard]] status lookup(const std::string& table, std::size_t dim, const std::int64_t* keys,
                              std::size_t n, float* rows, std::uint8_t* found) override;
  /// The model as read at connect().
  const redis_model& model() const noexcept { return model_; }

 private:
  redis_rows() = default;
  std::unique_ptr<detail::redis_connection> conn_;
  redis_options options_;
  redis_model model_;
};

}  // namespace embcache
