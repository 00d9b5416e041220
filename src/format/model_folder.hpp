// Model and delta folders on disk, in one place: the writer of their layout (per table a HugeCTR
// sparse model folder: `key`, `emb_vector`, the optimizer's files, `version`, `slot_id`; plus
// `manifest.json` with every file's size and xxHash64), and the one reader and validator of
// their manifests. training_cache::save/load/export_incremental_to, the trainer's host-hybrid save
// (save_stores) and serving's read_model_folder/read_delta_folder all go through here; every
// write goes through common/durable_file.hpp. docs/training_cache.md describes the format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "embcache/keyset.hpp"
#include "embcache/optimizers.hpp"
#include "embcache/param_store.hpp"
#include "embcache/status.hpp"
#include "embcache/training_cache.hpp"

namespace embcache::detail {

class durable_file_writer;

/// A saved model (training_cache::save) or an incremental one (export_incremental_to).
enum class folder_kind { model, delta };

/// A new run identity: 128 random bits (std::random_device) as 32 lowercase hex digits. Saves
/// and deltas record it as `run_id` in their manifests so that readers can refuse a mix of runs.
std::string new_run_id();
/// True for 32 lowercase hex digits (what new_run_id() writes).
bool is_run_id(const std::string& text);

// --- writing -------------------------------------------------------------------------------------

/// Which files of a table folder hold the optimizer state: `files[p]` holds floats
/// [p * part_width, (p + 1) * part_width) of every row's state; no files: the state is not written.
struct state_layout {
  std::vector<std::string> files;
  std::size_t part_width = 0;
};
/// A save's state: HugeCTR's optimizer files (AdaGrad.accm; Adam.m, Adam.v; ...), dim floats each.
state_layout hugectr_state_layout(optimizer_kind optimizer, std::size_t dim);
/// A delta's state: one `opt_state` of the whole state width, or nothing without state.
state_layout opt_state_layout(bool with_state, std::size_t state_width);

/// Writes one table folder of a staged model or delta folder, rows appended in order in batches,
/// so that no caller holds a table in memory to write it. Every file is written in place
/// (file_placement::in_staged_folder) and hashed as it grows; finish() commits them and fsyncs
/// the folder.
class table_folder_writer {
 public:
  table_folder_writer();
  ~table_folder_writer();
  table_folder_writer(const table_folder_writer&) = delete;
  table_folder_writer& operator=(const table_folder_writer&) = delete;

  /// Creates `folder` and its files: `key`, `emb_vector`, `version`, the files of `state`, and
  /// `slot_id` / `erased` when asked for.
  [[nodiscard]] status open(const std::string& folder, std::size_t dim, const state_layout& state,
                            bool with_slot_ids, bool with_erased);
  /// Appends `n` rows: row i's embedding at `emb + i * emb_stride` (dim floats), its state at
  /// `state + i * state_stride` (read only when the layout has files), `slot_ids` only when the
  /// folder has a `slot_id` file.
  [[nodiscard]] status append(const std::int64_t* keys, const float* emb, std::size_t emb_stride,
                              const float* state, std::size_t state_stride,
                              const std::uint64_t* versions, const std::uint64_t* slot_ids,
                              std::size_t n);
  /// Appends tombstones to `erased`.
  [[nodiscard]] status append_erased(const std::int64_t* keys, std::size_t n);
  /// Commits every file and fsyncs the folder; `files` gets the manifest entry of each file
  /// ({"bytes": n, "xxh64": "16 hex digits"}).
  [[nodiscard]] status finish(nlohmann::json* files);

 private:
  durable_file_writer& file(std::size_t i) { return *files_[i]; }
  [[nodiscard]] status write_gathered(durable_file_writer& w, const float* src, std::size_t stride,
                                      std::size_t width, std::size_t n);

  std::string folder_;
  std::size_t dim_ = 0;
  state_layout state_;
  bool slot_ids_ = false, erased_ = false;
  std::vector<std::string> names_;  // in the order of files_
  std::vector<std::unique_ptr<durable_file_writer>> files_;
  std::vector<float> scratch_;
};

/// Writes `manifest` (pretty-printed, 2 spaces) as `dir/manifest.json` of a staged folder.
[[nodiscard]] status write_manifest(const std::string& dir, const nlohmann::json& manifest);

/// The slot id of `key`: the one `known` holds (loaded or set; may be null), else `slot_of`'s
/// (may be empty). False when neither knows one. The one rule of saves and deltas.
template <class Key>
bool known_slot_id(const std::unordered_map<Key, std::uint64_t>* known,
                   const std::function<std::uint64_t(Key)>& slot_of, Key key, std::uint64_t* out) {
  if (known) {
    const auto it = known->find(key);
    if (it != known->end()) {
      *out = it->second;
      return true;
    }
  }
  if (!slot_of) return false;
  *out = slot_of(key);
  return true;
}

/// One table to save from its parameter store.
template <class Key>
struct stored_table {
  std::string name;
  std::size_t dim = 0;
  optimizer_kind optimizer = optimizer_kind::sgd;
  param_store<Key>* store = nullptr;
  std::uint64_t version = 0;  ///< the table's version clock, recorded in the manifest
  /// Slot ids known for some keys (loaded or set), looked up first; may be null.
  const std::unordered_map<Key, std::uint64_t>* slot_ids = nullptr;
  std::function<std::uint64_t(Key)> slot_of;  ///< for the other keys; may be empty
  /// Feature admission's state (admission_sketch::to_words), written as the file `admission`
  /// when not null and not empty.
  const std::vector<std::uint32_t>* admission = nullptr;
  const expiry_clock* expiry = nullptr;       ///< written as `expiry` when set
};

/// Writes the model folder `dir` from the stores of `tables` (the layout of
/// training_cache::save): staged as staging_folder_of(dir), then published with publish_folder().
/// Each table is streamed: one for_each lists its keys (8 bytes a row), sorted; the rows are then
/// pulled in key order, a batch at a time, and appended to the files. The stores must not change
/// meanwhile. `slot_id` is written when every row has one. `on_progress` as save() documents.
/// `run_id` (may be empty: none) goes into the manifest.
template <class Key>
[[nodiscard]] status write_model_folder(const std::string& dir,
                                        const std::vector<stored_table<Key>>& tables,
                                        const save_progress& on_progress,
                                        const std::string& run_id = {});

/// Saves tables that live in parameter stores only (the trainer's host-hybrid mode), exactly as
/// training_cache::save would with those tables, without building a training cache: per table its
/// `store` (required, row width dim + state width of its optimizer), `name`, `dim`,
/// `optimizer.kind` and `slot_of` are used; the manifest's version of a table is its store's
/// max_version(). Each store is flushed first. invalid_argument for a table without a store or
/// with another row width; load it back with training_cache::load(). `run_id` (may be empty:
/// none) goes into the manifest, as training_cache::save writes its own.
template <class Key>
[[nodiscard]] status save_stores(const std::string& dir,
                                 const std::vector<table_options<Key>>& tables,
                                 const save_progress& on_progress = {},
                                 const std::string& run_id = {});

// --- reading -------------------------------------------------------------------------------------

/// One table of a manifest, its fields checked for type (not yet against anything).
struct manifest_table {
  std::string at;  ///< "tables[i]." (for messages)
  std::string name;
  std::uint64_t dim = 0, state_width = 0, count = 0;
  std::string optimizer;
  std::uint64_t version = 0;        ///< model: `version`; delta: `until_version`
  std::uint64_t since_version = 0;  ///< delta only
  std::uint64_t erased = 0;         ///< delta only: tombstones
  nlohmann::json files;             ///< the `files` object
  /// Model only: the optional `expiry` object ({"boundaries": n, "pass_versions": [v, ...]}:
  /// at most n values, non-decreasing, none above `version`; at most 2^32 of them).
  bool has_expiry = false;
  expiry_clock expiry;
};

/// A folder's manifest.json, read and checked: size bound, JSON object, `format` of `kind`,
/// `format_version`, `key_type` (int64 or uint32), `sequence` (delta) or `applied_delta` (model,
/// optional), `tables` (each an object with a usable folder name given once, dim, state_width,
/// optimizer, count, version fields or a delta's erased/since_version/until_version, files).
/// Every refusal names the manifest and the field.
struct folder_manifest {
  folder_kind kind = folder_kind::model;
  std::string dir;   ///< the folder
  std::string path;  ///< dir + "/manifest.json"
  embcache::key_type key_type = embcache::key_type::int64;  ///< default int64
  std::uint64_t sequence = 0;  ///< delta: its number; model: applied_delta (0 when absent)
  /// `run_id` (optional, 32 hex digits): the run that wrote the folder; "" for folders of
  /// earlier versions, which did not record one.
  std::string run_id;
  std::vector<manifest_table> tables;
};
[[nodiscard]] result<folder_manifest> read_folder_manifest(const std::string& dir,
                                                           folder_kind kind);

/// What a reader expects of a table, checked against its manifest entry.
struct table_schema {
  std::string name;
  std::size_t dim = 0, state_width = 0;
  optimizer_kind optimizer = optimizer_kind::sgd;
};
/// Checks the manifest against the tables of a cache: key type, table count, every table present
/// with its dim, state width and optimizer (invalid_argument; not_found for a missing table).
/// `order[t]` gets the manifest index of want[t].
[[nodiscard]] status match_schema(const folder_manifest& m, embcache::key_type key_type,
                                  const std::vector<table_schema>& want,
                                  std::vector<std::size_t>* order);
/// Bounds of a table read without a schema (serving): dim in [1, 2^20], state_width <= 2 dim.
[[nodiscard]] status check_table_shape(const folder_manifest& m, const manifest_table& t);

/// One table's rows as read from a folder, before anything is changed.
struct table_rows {
  /// A file of optimizer state: `width` floats of each row's state, at `offset` in it.
  struct state_part {
    std::string file;
    std::size_t offset = 0, width = 0;
  };
  std::string folder;
  std::vector<std::int64_t> keys;  ///< int64 whatever the key type
  std::vector<float> vectors;      ///< keys.size() * dim
  std::vector<state_part> parts;   ///< empty: the folder holds no state
  std::size_t state_width = 0;     ///< floats per row in `states` (sum of the parts' widths)
  std::vector<float> states;       ///< keys.size() * state_width, the parts interleaved
  std::vector<std::uint64_t> versions;
  bool has_slot_ids = false;
  std::vector<std::uint64_t> slot_ids;
  std::vector<std::int64_t> erased;  ///< delta: tombstones
  std::uint64_t version = 0;         ///< the table's version (delta: until_version)
  bool has_expiry = false;           ///< the manifest's `expiry` of the table (a save only)
  expiry_clock expiry;
};

/// Reads the files of table `t` of `m` into `out`: each file's manifest entry against the size
/// its count gives (overflow-checked), the file's real size against it before a byte is read, its
/// content against its xxh64. The state comes from `opt_state` when listed (a delta, or a save of
/// an earlier version), else from the optimizer's HugeCTR files; `slot_id` when a save lists it;
/// `erased` for a delta.
[[nodiscard]] status read_listed_table(const folder_manifest& m, const manifest_table& t,
                                       table_rows* out);
/// Reads the file `name` of table `t` of `m`, listed in its `files`, as `words` 32-bit words:
/// checked as read_listed_table checks its files (size against the manifest and the file, then
/// the checksum). Used for a save's `admission` file (admission.hpp).
[[nodiscard]] status read_listed_words(const folder_manifest& m, const manifest_table& t,
                                       const std::string& name, std::uint64_t words,
                                       std::vector<std::uint32_t>* out);
/// Reads a plain HugeCTR table folder (no manifest): `key` int64, `emb_vector` float32[n][dim],
/// optional `slot_id` uint64[n] and the files of `optimizer` (float32[n][dim] each: all or none);
/// sizes checked before reading; every row at version 1.
[[nodiscard]] status read_hugectr_table(const std::string& folder, std::size_t dim,
                                        optimizer_kind optimizer, table_rows* out);

/// Checks of the rows themselves.
struct row_rules {
  bool allow_duplicate_keys = false;
  bool allow_non_finite = false;
  embcache::key_type key_type = embcache::key_type::int64;  ///< uint32 refuses keys past 2^32
  /// Appended to the refusals of repeats and non-finite floats (the option that accepts them).
  std::string duplicate_hint, non_finite_hint;
};
/// A repeated key (unless allowed), a key outside the key type, then a non-finite float (unless
/// allowed) of `emb_vector` or a state file: invalid_argument naming the file and the key.
[[nodiscard]] status check_table_rows(const table_rows& rows, std::size_t dim,
                                      const row_rules& rules);

}  // namespace embcache::detail
