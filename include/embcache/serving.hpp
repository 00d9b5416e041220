/// @file serving.hpp
/// @brief Serving the incremental model: model and delta folders read with every check
/// training_cache::load() makes, numbered deltas applied to a base folder atomically, and the
/// row lookup a scorer reads a serving store through (the scorer itself, which runs a trainer
/// save's dense network, is in trainer/score.hpp). The Redis store is in redis.hpp.
/// docs/serving.md describes the rules and guarantees.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "embcache/distributed/sharded_save.hpp"
#include "embcache/keyset.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// One table of a model folder (training_cache::save) or a delta folder
/// (training_cache::export_incremental_to), as read and checked.
struct folder_table {
  std::string name;                     ///< table name (its sub-folder)
  std::size_t dim = 0;                  ///< embedding floats per row
  std::size_t state_width = 0;          ///< optimizer floats per row (0: no opt_state in it)
  std::string optimizer;                ///< optimizer name from the manifest ("adam", ...)
  std::uint64_t version = 0;            ///< model: table version at save; delta: until_version
  std::uint64_t since_version = 0;      ///< delta: rows newer than this are in it (model: 0)
  std::vector<std::int64_t> keys;       ///< row keys, int64 whatever the key type
  std::vector<float> vectors;           ///< keys.size() * dim floats
  std::vector<float> states;            ///< keys.size() * state_width floats
  std::vector<std::uint64_t> versions;  ///< keys.size() row versions
  std::vector<std::int64_t> erased;     ///< delta: tombstones (keys deleted since); model: empty
  /// The `slot_id` file (keys.size() slot ids), empty when the folder has none. A delta has one
  /// when each of its rows had a slot id at export (the training cache's slot_of, or ids loaded
  /// or set).
  std::vector<std::uint64_t> slot_ids;
  /// Model written by apply_deltas: rows whose slot id is unknown (rows of a delta without
  /// `slot_id` that no base row gave one); `slot_id` is then left out, as save() does.
  std::uint64_t rows_without_slot_id = 0;
};

/// A model folder or a delta folder in memory.
struct model_folder {
  bool is_delta = false;  ///< true for a `delta-NNNNNN` folder
  std::string path;       ///< the folder read
  embcache::key_type key_type = embcache::key_type::int64;  ///< default int64 (file: "int64")
  /// Delta: its sequence number. Model: the last delta applied to it (`applied_delta` in its
  /// manifest, written by apply_deltas), 0 when none is recorded.
  std::uint64_t sequence = 0;
  /// The identity of the run that wrote it (`run_id`, 32 hex digits); "" for folders of earlier
  /// versions, which did not record one.
  std::string run_id;
  std::vector<folder_table> tables;  ///< in manifest order
  /// Read from a sharded run's files (read_sharded_save, read_sharded_delta): the ranks' parts
  /// merged, the tables' versions counting deltas (see read_sharded_save). A sharded save cannot
  /// be rewritten in place: apply_deltas writes such a base to apply_options::output.
  bool sharded = false;
};

/// Reads a folder written by training_cache::save (or by apply_deltas) and checks it as load()
/// does: manifest fields and types (`corruption` naming the file and the field), format and
/// version, key type, table names (each once, usable as a folder name), per file the size the
/// count gives (overflow-checked) against the manifest's `bytes` and the real size before any
/// read, xxHash64 checksums, then the rows: a repeated key, a non-finite float or a key outside
/// the key type is `invalid_argument` naming the file and the key.
result<model_folder> read_model_folder(const std::string& dir);

/// The model folder of `dir`: `dir` itself when it has a manifest.json, else `dir/sparse` when
/// that has one (a trainer save), else `dir`.
std::string model_folder_of(const std::string& dir);

/// Reads a `delta-NNNNNN` folder written by export_incremental_to with the same checks, plus its
/// own: `sequence`, per table `since_version` <= `until_version`, `erased` count and file, an
/// `opt_state` file exactly when `state_width` > 0, and no key both in `key` and `erased`.
result<model_folder> read_delta_folder(const std::string& dir);

/// The folder of the sharded save in `dir` (`dir` or `dir/sparse`: a folder without manifest.json
/// whose tables are sub-folders with a manifest.json, distributed/sharded_save.hpp), or "" when
/// `dir` holds none (a model folder, or a trainer save whose `sparse/` is one).
std::string sharded_save_of(const std::string& dir);

/// The manifests of the tables of the sharded save in `dir` (as sharded_save_of gives it), in
/// table name order, each read and checked by read_sharded_manifest, whose table_name must be its
/// folder's; their key type, run_id and applied_delta must agree (invalid_argument naming the
/// manifest). Reads no rows.
result<std::vector<sharded_manifest>> read_sharded_manifests(const std::string& dir);

/// Reads a sharded save (the `sparse/` of a sharded trainer save: one sharded save per table, as
/// `<table>/manifest.json` and `<table>/gen-G/rank-R/`) as one model: every part of every table
/// (host_store checkpoints; a RocksDB part is unsupported), each key checked to be in its owner's
/// part, rows sorted by key, each row's embedding, optimizer state (the rest of the row) and
/// version. Tables in name order. The tables' key type, run_id and applied_delta must agree
/// (invalid_argument naming the manifest). The model stands at delta S = the save's
/// `applied_delta` (0 when none is recorded): `sequence` S and every table at version S. In a
/// trainer save (its folder holds trainer.json), every row gets `slot_id` criteo_key_tag(key), as
/// the trainer's single-process saves write it; otherwise the rows have none
/// (rows_without_slot_id). Errors name the save, the table, the rank and the part.
result<model_folder> read_sharded_save(const std::string& dir);

/// Reads delta N of a sharded run: `parts_path` is `<dir>/delta-NNNNNN.parts.json` (format
/// "embcache.sharded_delta", format_version 1, sequence, run_id, world_size, parts: one path per
/// rank, `rank-RRRRR/delta-NNNNNN`), each part a delta folder read with read_delta_folder. The
/// parts must all be there (not_found naming the rank and the folder), of the parts file's sequence
/// (corruption) and run (invalid_argument naming the rank and both identities), with rank 0's key
/// type and tables; each key in its owner's part (corruption). The result is one delta: the rows
/// and tombstones of every rank sorted by key, `slot_id` when every part carries it, and per table
/// since_version N - 1, until_version N.
result<model_folder> read_sharded_delta(const std::string& parts_path);

/// Any base serving takes: a sharded save (read_sharded_save, in `dir` or `dir/sparse`), else the
/// model folder model_folder_of(dir) (read_model_folder).
result<model_folder> read_base(const std::string& dir);

/// One entry of list_deltas: a sharded delta (a path ending in `.parts.json`,
/// read_sharded_delta) or a delta folder (read_delta_folder).
result<model_folder> read_delta(const std::string& path);

/// One delta found in a folder of deltas.
struct delta_entry {
  std::uint64_t sequence = 0;  ///< NNNNNN of its name
  std::string path;            ///< deltas_dir/delta-NNNNNN (or deltas_dir/delta-NNNNNN.parts.json)
};

/// The deltas of `deltas_dir` in increasing order: its `delta-NNNNNN` folders (six or more
/// digits), or, for a sharded run's export folder, its `delta-NNNNNN.parts.json` files (the
/// ranks' parts are in `rank-RRRRR/`); hidden temporaries and other names are ignored. A folder
/// holding both kinds is invalid_argument (the exports of two runs). not_found when the folder
/// does not exist; invalid_argument naming the folder when its number does not fit in 64 bits.
result<std::vector<delta_entry>> list_deltas(const std::string& deltas_dir);

/// Where a model stands in a stream of deltas.
struct model_position {
  std::uint64_t applied_delta = 0;  ///< the last delta applied (0: none recorded)
  /// Per table (name, version): every change up to this version is in the model.
  std::vector<std::pair<std::string, std::uint64_t>> versions;
};

/// The position of a model folder: its applied_delta and its tables' versions.
model_position position_of(const model_folder& model);

/// The deltas to take after `position`, up to `until`: those numbered above applied_delta and at
/// most `until`, which must be consecutive (and start at applied_delta + 1 when applied_delta is
/// set). invalid_argument naming the missing number for a gap, and when `until` is below
/// applied_delta (the model is already past it).
result<std::vector<delta_entry>> plan_deltas(const model_position& position,
                                             const std::vector<delta_entry>& deltas,
                                             std::uint64_t until);

/// Checks that `delta` follows `position` and moves the position past it. Per table: a part
/// whose until_version is at most the position's version is already contained (skipped; the
/// base was saved after that export); otherwise its since_version must be at most the position's
/// version (else a gap: invalid_argument naming the delta, the table and both versions). The
/// tables must be the model's, with the same dims (invalid_argument). `apply` (may be null) gets
/// one flag per table of `delta`: true where its rows must be applied.
[[nodiscard]] status advance_position(model_position& position, const model_folder& delta,
                                      std::vector<bool>* apply);

/// Options of apply_deltas.
struct apply_options {
  /// Apply deltas numbered at most this (default: every delta in the folder).
  std::uint64_t until = std::numeric_limits<std::uint64_t>::max();
  /// The model folder to write (default "": the base itself, in place). Set, the base is left
  /// alone and the base with the deltas applied is written to `output` (a missing folder, or a
  /// model folder it replaces atomically; anything else is refused), even when no delta follows.
  /// Required for a sharded base, which is read as one model and written as one HugeCTR folder.
  std::string output;
};

/// What apply_deltas did.
struct apply_report {
  std::string model_dir;              ///< the model folder written (BASE, BASE/sparse, output)
  std::uint64_t from_delta = 0;       ///< applied_delta before
  std::uint64_t applied_delta = 0;    ///< applied_delta after (recorded in the manifest)
  std::vector<std::uint64_t> deltas;  ///< deltas taken in order (contained ones included)
  std::uint64_t rows_written = 0;     ///< rows inserted or overwritten
  std::uint64_t rows_erased = 0;      ///< tombstones applied to keys the model held
  bool state_dropped = false;         ///< a delta carried no optimizer state: the result has none
  bool changed = false;               ///< false when there was nothing to apply (folder untouched)
  /// The base or a delta taken has no run identity (written by an earlier version): the runs of
  /// those folders were not checked.
  bool run_unchecked = false;
};

/// Applies the deltas of `deltas_dir` that follow `base_dir` (plan_deltas, advance_position) in
/// order: per delta, tombstones delete their keys, then its rows overwrite or insert (vector,
/// version and, when the delta carries it, optimizer state). `base_dir` is a model folder, or a
/// trainer save whose `sparse/` is one. Everything is read and checked before anything is
/// written; the result is written beside the base as `<base>.tmp` (files and folders fsynced),
/// swapped in with one atomic rename exchange (or, where the file system has none, save()'s two
/// renames, which load() follows through `<base>.old`), and the parent fsynced, so the base
/// folder always holds either the old or the new complete model. The manifest records
/// `applied_delta`. Rows are sorted by key as save() writes them, so the result's `key` and
/// `emb_vector` are byte-identical to a save taken when the last delta was exported. When a delta
/// carries no `opt_state`, the result's tables have state_width 0 and an empty `opt_state`
/// (a serving model: load() refuses it for a table with optimizer state). Concurrent applies to
/// one base are refused through a lock file `<parent>/.<name>.apply.lock`. A delta of another run
/// than the base's (both record a `run_id`) is invalid_argument naming both identities and the
/// delta; the result records the base's identity (or, for a base without one, the deltas').
result<apply_report> apply_deltas(const std::string& base_dir, const std::string& deltas_dir,
                                  const apply_options& options = {});

/// A serving store seen by a scorer (score_shard in trainer/score.hpp): the rows of a table for a
/// list of keys.
class row_lookup {
 public:
  virtual ~row_lookup() = default;
  /// Fills `rows` (n * dim floats) with the embeddings of `keys` in table `table` and `found`
  /// (n flags); a key the store does not hold leaves its row untouched and found 0.
  [[nodiscard]] virtual status lookup(const std::string& table, std::size_t dim,
                                      const std::int64_t* keys, std::size_t n, float* rows,
                                      std::uint8_t* found) = 0;
};

}  // namespace embcache
