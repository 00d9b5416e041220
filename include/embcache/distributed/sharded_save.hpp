/// @file distributed/sharded_save.hpp
/// @brief Saves of a sharded table: one part per rank, and a manifest that names the parts and
/// publishes the save. A save of N ranks loads on any number M of ranks.
///
/// Layout of a save folder `dir` (on a file system every rank sees):
/// ```
/// dir/manifest.json              written by rank 0, last; names the generation and its parts
/// dir/gen-GGGGGG/rank-RRRRR/     rank R's part: its store's own checkpoint (host_store:
///                                manifest.json, keys.bin, versions.bin, rows.bin)
/// dir/gen-GGGGGG/admission       the table's admission counts, when admission is on (rank 0)
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
///
/// The table's lifetime state (sharded_lifetime), optional when read (saves written with
/// admission and expiry off, or before they existed, have none; a load then starts counting and
/// expiring from zero, as training_cache::load does):
/// - `admission`: {path "gen-GGGGGG/admission", bytes, xxh64}: feature admission's counts
///   (admission.hpp; the words of admission_sketch::to_words(), the format of the `admission`
///   file of training_cache::save, docs/training_cache.md). Every rank of a sharded run counts
///   every key of a shard's keyset, so every rank holds the same sketch: the ranks check that
///   their sketches hash alike, and rank 0 writes the file once.
/// - `parts[r].expiry`: {boundaries, pass_versions}: rank r's expiry clock (expiry.hpp), in every
///   part or in none, with the same boundaries and as many pass versions in each; with `steps`
///   and `step_versions` too once a step was begun with ttl_steps on (every rank begins every
///   step, so the steps are the run's global step count and the same in every part, as is the
///   number of step versions). The values are rank r's version clock, which stamps only rank r's
///   rows; see load_sharded_part() for a load on another number of ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "embcache/distributed/communicator.hpp"
#include "embcache/expiry.hpp"
#include "embcache/keyset.hpp"
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

/// A table's lifetime state that a sharded save records beside its rows (see the file comment).
struct sharded_lifetime {
  /// admission_sketch::to_words() of the table, the same on every rank; default empty: admission
  /// off, no `admission` file.
  std::vector<std::uint32_t> admission;
  bool has_expiry = false;  ///< whether `expiry` is recorded (expiry on); default false
  expiry_clock expiry;      ///< this rank's expiry clock; default: none
};

/// One part of a save.
struct sharded_part {
  std::string path;         ///< folder of the part, relative to the save folder (default "")
  std::uint64_t rows = 0;   ///< rows the part holds (default 0)
  bool has_expiry = false;  ///< whether the part records an expiry clock (default false)
  expiry_clock expiry;      ///< the part's rank's expiry clock (default: none)
};

/// The manifest's `admission` entry.
struct sharded_admission_file {
  std::string path;         ///< relative to the save folder; default "": no file
  std::uint64_t bytes = 0;  ///< its size (default 0)
  std::uint64_t xxh64 = 0;  ///< xxHash64 of its bytes (default 0)
};

/// A parsed and checked manifest.json.
struct sharded_manifest {
  sharded_save_info info;           ///< what the save records
  embcache::key_type key_type = embcache::key_type::int64;  ///< default int64; loads refuse another
  int world_size = 0;               ///< ranks that wrote it (default 0)
  std::uint64_t generation = 0;     ///< generation folder number (default 0)
  std::vector<sharded_part> parts;  ///< world_size parts, in rank order
  std::uint64_t total_rows = 0;     ///< sum of the parts' rows (default 0)
  sharded_admission_file admission;  ///< the admission file, when the save has one
};

/// Opens the store checkpoint in `part_dir` (read only use) for a table and row width.
template <class Key>
using part_opener = std::function<result<std::unique_ptr<param_store<Key>>>(
    const std::string& part_dir, const std::string& table_name, std::size_t row_width)>;

/// The opener of parts written by host_store::checkpoint (host_store::open).
template <class Key>
part_opener<Key> host_store_part_opener();

/// Writes a save of `shard` (this rank's store) into `dir` as the file comment describes, with the
/// table's lifetime state when `lifetime` is not null (every rank passes one, or none does).
/// Collective: every rank calls it with the same `dir` and `info`. Ranks whose admission words
/// differ (they should not: every rank counts every key) fail with internal before anything is
/// written. Ok on every rank once the save
/// is published; otherwise every rank fails (its own error, or one naming the rank that failed)
/// and the previous save stays the published one. A `info.run_id` that is set but not 32
/// lowercase hex digits is invalid_argument before anything is written.
template <class Key>
[[nodiscard]] status save_sharded(communicator& comm, param_store<Key>& shard,
                                  const std::string& dir, const sharded_save_info& info,
                                  const sharded_lifetime* lifetime = nullptr);

/// Reads and checks `dir`/manifest.json: every field's presence and type, the format and its
/// version (unsupported for a later version), the owner function (unsupported for another),
/// world_size in [1, 2^20], one part per rank in rank order with the path the layout dictates
/// (a path that points elsewhere is corruption), a run_id (when present) of 32 lowercase hex
/// digits (corruption otherwise), the rows' sum without overflow, and the optional lifetime
/// entries: `admission` with the layout's path, a size that is a multiple of 4 and 16 hex digits
/// of xxh64; `expiry` in every part or none, each with at most `boundaries` non-decreasing pass
/// versions and, when it has `steps`, at most `steps` (and max_ttl_steps) non-decreasing step
/// versions, all with the same boundaries, steps and counts. Errors name the file and the field.
[[nodiscard]] result<sharded_manifest> read_sharded_manifest(const std::string& dir);

/// Loads the rows that rank `rank` of `world` owns from the save in `dir` into `target` (empty,
/// of the save's table and row width), with their versions. Reads only its own part when the
/// save has `world` parts (every key of part r is owned by r), else every part. Not collective.
/// `open` empty = host_store_part_opener(). A part holding another number of rows than the
/// manifest says is corruption.
///
/// Expiry across world sizes: a row's version is a value of the clock of the rank that wrote it,
/// and the expiry rule compares it with that rank's pass versions. When the save records expiry
/// clocks and has another number of parts than `world`, each loaded row's version becomes its
/// age class under its part's clock, 1 + the number of that part's clock values (pass and step
/// versions) below it, and the loading rank's clock is resumed_expiry_clock()'s (each value
/// replaced by its place among all of them, 1 .. k; pass versions only: 1, 2, ..., k): every row
/// then compares with every recorded value exactly as it did under its own rank's clock. With
/// the save's own number of parts versions are kept as saved.
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

/// The expiry clock rank `rank` of `world` resumes with from `m` (which records expiry clocks):
/// parts[rank]'s when `world` is the save's world size; else the same boundaries and steps with
/// each pass and step version replaced by its place, from 1, in one order of all of them that
/// keeps every part's order of its own values (with pass versions only: 1 .. k), the scale of the
/// age classes load_sharded_part() gives the rows.
expiry_clock resumed_expiry_clock(const sharded_manifest& m, int rank, int world);

/// Reads the admission file of the save in `dir` (manifest `m`), checked against the manifest's
/// size and checksum and against `words` 32-bit words expected (the loading sketch's
/// word_count()): corruption naming the file for a size or checksum that does not match,
/// invalid_argument naming it for another number of words (a sketch of another width or depth).
/// Empty when the save has no admission file.
[[nodiscard]] result<std::vector<std::uint32_t>> read_sharded_admission(const std::string& dir,
                                                                        const sharded_manifest& m,
                                                                        std::size_t words);

/// Name of the folder of generation `generation` ("gen-000007"), relative to the save folder.
std::string sharded_generation_name(std::uint64_t generation);
/// Path of rank `rank`'s part of generation `generation` ("gen-000007/rank-00003").
std::string sharded_part_path(std::uint64_t generation, int rank);

extern template part_opener<std::int64_t> host_store_part_opener<std::int64_t>();
extern template status save_sharded<std::int64_t>(communicator&, param_store<std::int64_t>&,
                                                  const std::string&, const sharded_save_info&,
                                                  const sharded_lifetime*);
extern template result<sharded_manifest> load_sharded_part<std::int64_t>(
    const std::string&, int, int, param_store<std::int64_t>&, const part_opener<std::int64_t>&);
extern template result<sharded_manifest> load_sharded<std::int64_t>(
    communicator&, const std::string&, param_store<std::int64_t>&,
    const part_opener<std::int64_t>&);
extern template part_opener<std::uint32_t> host_store_part_opener<std::uint32_t>();
extern template status save_sharded<std::uint32_t>(communicator&, param_store<std::uint32_t>&,
                                                   const std::string&, const sharded_save_info&,
                                                   const sharded_lifetime*);
extern template result<sharded_manifest> load_sharded_part<std::uint32_t>(
    const std::string&, int, int, param_store<std::uint32_t>&, const part_opener<std::uint32_t>&);
extern template result<sharded_manifest> load_sharded<std::uint32_t>(
    communicator&, const std::string&, param_store<std::uint32_t>&,
    const part_opener<std::uint32_t>&);

}  // namespace embcache
