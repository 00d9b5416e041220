/// @file distributed/sharded_save.hpp
/// @brief Saves of a sharded table: one part per rank, and a manifest that names the parts and
/// publishes the save. A save of N ranks loads on any number M of ranks.
///
/// Layout of a save folder `dir` (on a file system every rank sees):
/// ```
/// dir/manifest.json              written by rank 0, last; names the generation and its parts
/// dir/gen-GGGGGG/rank-RRRRR/     rank R's part: its store's own checkpoint (host_store:
///                                manifest.json, keys.bin, versions.bin, rows.bin)
/// ```
/// A save writes a new generation folder beside the published one: every rank checkpoints its
/// store into its part (each checkpoint is itself written to a temporary folder and renamed),
/// the ranks agree that every part is complete, and rank 0 then replaces manifest.json
/// atomically (temporary file, fsync, rename, fsync of the folder) and removes the other
/// generations. Until that rename the previous manifest names the previous generation, which
/// nothing has touched: a rank killed at any point of a save leaves the last complete save
/// loadable.
///
/// manifest.json fields: format "embcache.sharded_save", format_version 1, table_name,
/// key_type ("int64" or "uint32"), dim, row_width, optimizer, step, num_blocks, world_size,
/// owner_function (ownership.hpp's owner_function_name), generation, parts: [{rank, path, rows}]
/// with one entry per rank in rank order and path "gen-GGGGGG/rank-RRRRR"; and run_id (the run's
/// identity, 32 lowercase hex digits), written when sharded_save_info::run_id is set and optional
/// when read (saves written before it existed have none); applied_delta (the last incremental
/// export taken before the save, whose ranks' parts it therefore contains), written when not 0 and
/// 0 when absent. Serving (serving.hpp: read_sharded_save) reads a save as one model at that delta.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "embcache/distributed/communicator.hpp"
#include "embcache/param_store.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// What a sharded save records besides the rows.
struct sharded_save_info {
  std::string table_name;      ///< the table (default ""; must equal the stores' table_name())
  std::size_t dim = 0;         ///< embedding floats per row (default 0, must be > 0)
  std::size_t row_width = 0;   ///< floats per row (default 0, must be >= dim)
  std::string optimizer;       ///< to_string() of the sparse optimizer (default "")
  std::uint64_t step = 0;      ///< steps applied when saved (default 0)
  std::size_t num_blocks = 0;  ///< blocks of the global batch of the run (default 0)
  /// The run's identity (training_cache::run_id(), 32 lowercase hex digits), recorded as
  /// `run_id`; default "": none recorded (as in saves written before run identities existed).
  std::string run_id;
  /// The number of the last incremental export (`delta-N.parts.json`) the run took before the
  /// save, recorded as `applied_delta` (default 0: none, or not recorded). The save contains every
  /// change of that delta, so serving applies the deltas after it.
  std::uint64_t applied_delta = 0;
};

/// One part of a save.
struct sharded_part {
  std::string path;        ///< folder of the part, relative to the save folder (default "")
  std::uint64_t rows = 0;  ///< rows the part holds (default 0)
};

/// A parsed and checked manifest.json.
struct sharded_manifest {
  sharded_save_info info;           ///< what the save records
  std::string key_type;             ///< "int64" or "uint32" (loads refuse another store's)
  int world_size = 0;               ///< ranks that wrote it (default 0)
  std::uint64_t generation = 0;     ///< generation folder number (default 0)
  std::vector<sharded_part> parts;  ///< world_size parts, in rank order
  std::uint64_t total_rows = 0;     ///< sum of the parts' rows (default 0)
};

/// Opens the store checkpoint in `part_dir` (read only use) for a table and row width.
template <class Key>
using part_opener = std::function<result<std::unique_ptr<param_store<Key>>>(
    const std::string& part_dir, const std::string& table_name, std::size_t row_width)>;

/// The opener of parts written by host_store::checkpoint (host_store::open).
template <class Key>
part_opener<Key> host_store_part_opener();

/// Writes a save of `shard` (this rank's store) into `dir` as the file comment describes.
/// Collective: every rank calls it with the same `dir` and `info`. Ok on every rank once the save
/// is published; otherwise every rank fails (its own error, or one naming the rank that failed)
/// and the previous save stays the published one. A `info.run_id` that is set but not 32
/// lowercase hex digits is invalid_argument before anything is written.
template <class Key>
[[nodiscard]] status save_sharded(communicator& comm, param_store<Key>& shard,
                                  const std::string& dir, const sharded_save_info& info);

/// Reads and checks `dir`/manifest.json: every field's presence and type, the format and its
/// version (unsupported for a later version), the owner function (unsupported for another),
/// world_size in [1, 2^20], one part per rank in rank order with the path the layout dictates
/// (a path that points elsewhere is corruption), a run_id (when present) of 32 lowercase hex
/// digits (corruption otherwise), and the rows' sum without overflow. Errors name
/// the file and the field.
[[nodiscard]] result<sharded_manifest> read_sharded_manifest(const std::string& dir);

/// Loads the rows that rank `rank` of `world` owns from the save in `dir` into `target` (empty,
/// of the save's table and row width), with their versions. Reads only its own part when the
/// save has `world` parts (every key of part r is owned by r), else every part. Not collective.
/// `open` empty = host_store_part_opener(). A part holding another number of rows than the
/// manifest says is corruption.
template <class Key>
[[nodiscard]] result<sharded_manifest> load_sharded_part(const std::string& dir, int rank,
                                                         int world, param_store<Key>& target,
                                                         const part_opener<Key>& open = {});

/// load_sharded_part() for comm.rank() of comm.size() on every rank, which then check together
/// that the rows they loaded add up to the save's. Collective; fails on every rank when one
/// fails.
template <class Key>
[[nodiscard]] result<sharded_manifest> load_sharded(communicator& comm, const std::string& dir,
                                                    param_store<Key>& target,
                                                    const part_opener<Key>& open = {});

/// Name of the folder of generation `generation` ("gen-000007"), relative to the save folder.
std::string sharded_generation_name(std::uint64_t generation);
/// Path of rank `rank`'s part of generation `generation` ("gen-000007/rank-00003").
std::string sharded_part_path(std::uint64_t generation, int rank);

extern template part_opener<std::int64_t> host_store_part_opener<std::int64_t>();
extern template status save_sharded<std::int64_t>(communicator&, param_store<std::int64_t>&,
                                                  const std::string&, const sharded_save_info&);
extern template result<sharded_manifest> load_sharded_part<std::int64_t>(
    const std::string&, int, int, param_store<std::int64_t>&, const part_opener<std::int64_t>&);
extern template result<sharded_manifest> load_sharded<std::int64_t>(
    communicator&, const std::string&, param_store<std::int64_t>&,
    const part_opener<std::int64_t>&);
extern template part_opener<std::uint32_t> host_store_part_opener<std::uint32_t>();
extern template status save_sharded<std::uint32_t>(communicator&, param_store<std::uint32_t>&,
                                                   const std::string&, const sharded_save_info&);
extern template result<sharded_manifest> load_sharded_part<std::uint32_t>(
    const std::string&, int, int, param_store<std::uint32_t>&, const part_opener<std::uint32_t>&);
extern template result<sharded_manifest> load_sharded<std::uint32_t>(
    communicator&, const std::string&, param_store<std::uint32_t>&,
    const part_opener<std::uint32_t>&);

}  // namespace embcache
