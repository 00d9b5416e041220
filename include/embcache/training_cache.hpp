/// @file training_cache.hpp
/// @brief The training cache: per table a device cache in front of a parameter store, swapped per
/// pass from keysets (with background prefetch) or filled on demand, with incremental export,
/// save and load. docs/training_cache.md describes the semantics and the file formats; the
/// definitions live in src/training (instantiated for int64 and uint32 keys in both spaces). The
/// counters' JSON form is in embcache/json.hpp.
///
/// Rows are `dim + state_width(optimizer, dim)` floats: the embedding followed by the sparse
/// optimizer's state, which travels with its row between every tier. Every row carries a version
/// from the table's update counter (the device cache's version clock, which only grows); a row
/// is dirty while its version is newer than the version it had when last in sync with the store.
///
/// Spaces. training_cache<Key> keeps its device caches in host memory (host_space, library
/// embcache); training_cache<Key, cuda_space> keeps them in GPU memory (library embcache::cuda),
/// with the staging and write-behind rows in pinned host memory. Either way the orchestration runs
/// on the host and every pointer argument of this class is host memory; only the rows of cache(t)
/// (cache(t).row_pool(), the slots of lookup) live in the space's memory. The orchestration keeps
/// nothing per slot: dirtiness, keyset membership and victim choice are the device cache's own
/// bookkeeping (embedding_cache::mark_synced, set_marks, select_victims, gather_dirty), so a
/// boundary moves the keyset's keys and the rows that leave or arrive, not the slots' metadata.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "embcache/admission.hpp"
#include "embcache/embedding_cache.hpp"
#include "embcache/expiry.hpp"
#include "embcache/keyset.hpp"
#include "embcache/optimizers.hpp"
#include "embcache/param_store.hpp"
#include "embcache/space.hpp"
#include "embcache/status.hpp"

namespace embcache {

namespace detail {
template <class Key, class Space>
struct training_cache_core;  // src/training/training_cache_core.hpp
}  // namespace detail

/// How the cache is filled.
enum class cache_mode : std::uint8_t {
  keyset,     ///< begin_pass(keyset) before each pass makes every row of the keyset resident
  on_demand,  ///< lookup(keys) fetches misses per batch and evicts by score
};

/// Options of one table.
template <class Key>
struct table_options {
  std::string name;               ///< table name; required, unique, usable as a folder name
  std::size_t dim = 0;            ///< embedding floats per row; required (>= 1)
  optimizer_options optimizer{};  ///< default: sgd (no state); sets the state width and init
  std::size_t capacity = 0;  ///< most distinct keys of a keyset or lookup batch; required (>= 1)
  /// Slots of the device table; default 0 = capacity * 5 / 4, so that a full keyset leaves the
  /// table at most 80% occupied and probing stays short.
  std::size_t slots = 0;
  /// Rows the cache may hold between passes, in keyset mode; default 0 = capacity * 9 / 8 (the
  /// slack of the default slots), at most 90% of the slots and at least `capacity`. A begin_pass
  /// evicts the rows that leave only as far as this limit requires: the others stay resident past
  /// their pass (written back, or exported, like any resident row) until the prefetch worker of a
  /// later pass evicts them in the background or a later boundary needs their room. So the table's
  /// slack slots, allocated anyway, hold the next pass's new rows: when `max_resident` >= the
  /// keyset plus the rows new to the next pass, the prefetch worker installs them all during the
  /// pass and begin_pass moves no row. Set it to `capacity` to evict every leaving row at its
  /// boundary. Must lie in [capacity, slots].
  std::size_t max_resident = 0;
  initializer_options init{};  ///< default uniform(-0.05, 0.05); the table index is folded
                               ///< into init.seed, so equal options differ per table
  score_policy scores = score_policy::lru;  ///< default LRU (on-demand eviction)
  /// Store of the table; default nullptr = a new host_store. Pass a rocksdb_store (library
  /// embcache::rocksdb) for the SSD tier; its row width must be dim + state width.
  std::shared_ptr<param_store<Key>> store;
  /// Slot id of a key, for the `slot_id` file of a save (HugeCTR's localized embeddings need
  /// it); default empty: only the slot ids loaded from a folder or given to set_slot_ids() are
  /// known. save() asks it for the keys with no loaded or set slot id. For keys made by
  /// criteo_key() the slot is criteo_key_tag(key).
  std::function<std::uint64_t(Key)> slot_of;
  /// Feature admission (admission.hpp); default off: every key gets a row at its first lookup.
  admission_options admission{};
  expiry_options expiry{};  ///< default off; see expiry.hpp
};

/// The slots a table asks its device cache for (before the cache rounds them up to whole
/// buckets): `slots` when set, but at least `capacity`; else capacity + capacity / 4, so that a
/// full keyset leaves the table at most 80% occupied. The one home of that rule: the training
/// cache builds its tables with it and the trainer's memory estimate counts them with it. False
/// (and `*out` untouched) when the sum overflows.
inline bool table_slots(std::uint64_t capacity, std::uint64_t slots, std::uint64_t* out) noexcept {
  if (slots != 0) {
    *out = slots > capacity ? slots : capacity;
    return true;
  }
  std::uint64_t sum = 0;
  if (__builtin_add_overflow(capacity, capacity / 4, &sum)) return false;
  *out = sum;
  return true;
}

/// Options of a training cache.
struct training_cache_options {
  cache_mode mode = cache_mode::keyset;                ///< default: keyset passes
  keyset_format keyset_fmt = keyset_format::embcache;  ///< default: our keyset format
  /// Keys per store pull while staging, and rows per chunk in which begin_pass brings in the
  /// missing rows it installs; default 65536.
  std::size_t prefetch_batch = 65536;
  /// Most bytes of rows a prefetch stages, over all tables (tables in order, each staging the
  /// first of its missing keys that fit); default 1 GiB. The missing rows past it are pulled by
  /// begin_pass. A table whose missing keys do not all fit stages only the rows its store holds
  /// (the keys the store lacks are initialized by begin_pass). Reserved by prefetch() before its
  /// worker starts: pinned host memory in the cuda space, whose allocation failure prefetch()
  /// returns as status_code::out_of_host_memory.
  std::size_t staging_bytes = std::size_t{1} << 30;
  /// Write-behind; default true: begin_pass gathers the dirty rows that leave into a host buffer
  /// and a background thread pushes them to the store while the next pass trains. Every call that
  /// reads or changes the store (and store(t)) waits for that push first. false: begin_pass
  /// pushes them itself before returning.
  bool write_behind = true;
  /// Most bytes of rows gathered at once to be written back; default 256 MiB (at least one row
  /// is gathered). end_training() (and so save()) writes the resident dirty rows back in chunks
  /// of this size, and a boundary writes behind at most this much per table: leavers past it are
  /// pushed by begin_pass itself, in chunks of this size, before it returns. The stored rows are
  /// the same whatever the size; a table holds at most three buffers of this size for its
  /// write-behind (the one being pushed, a recycled one, the prefetch's gather buffer).
  std::size_t write_back_bytes = std::size_t{256} << 20;
  /// Rows moved at the pass boundary by index, not copied (keyset mode). Unset (the default):
  /// true in the host space, false in the cuda space (resolved_move_staged_rows()). true: each
  /// table's cache gets spare rows for its share of `staging_bytes` (tables in order, at most
  /// twice its capacity; in the space's memory). In the host space they are the staging: the
  /// prefetch worker writes each batch it pulls into them (one batch of rows beside them, no
  /// staging of staging_bytes), so they cost no memory the staging would not. In the cuda space
  /// they are device memory on top of the pinned staging (hence off there unless asked for), and
  /// the worker copies the rows it staged into them during the pass. begin_pass moves them into
  /// their slots by index (embedding_cache::install_rows) instead of copying them there, and,
  /// with write-behind, moves the dirty leaving rows out to free rows the same way
  /// (embedding_cache::detach_rows) for the flusher to copy out and push. The row a slot holds
  /// is then the one embedding_cache::row_indices() names (slot_rows.hpp), anywhere in
  /// row_pool(). The same rows, versions, saves and exports bit for bit either way.
  std::optional<bool> move_staged_rows;
};

/// Whether a training cache in `Space` with `options` moves its staged rows by index: the
/// option when set, else the space's default (true in the host space, false in the cuda space);
/// false outside keyset mode.
template <class Space>
bool resolved_move_staged_rows(const training_cache_options& options) {
  if (options.mode != cache_mode::keyset) return false;
  return options.move_staged_rows.value_or(!is_cuda_space_v<Space>);
}

/// Counters of one table (over one pass, or in total).
struct table_counters {
  std::uint64_t hits = 0;              ///< keys already resident (keyset or lookup batch)
  std::uint64_t misses = 0;            ///< keys that had to be brought in
  std::uint64_t rows_pulled = 0;       ///< rows read from the store by the caller's thread
  std::uint64_t rows_staged = 0;       ///< prefetched rows used by begin_pass
  std::uint64_t rows_restaged = 0;     ///< staged rows re-pulled because the store changed since
  std::uint64_t rows_initialized = 0;  ///< new rows made by the initializer
  std::uint64_t rows_pushed = 0;       ///< dirty rows written back to the store
  std::uint64_t rows_evicted = 0;      ///< rows removed from the device cache to make room
  std::uint64_t bytes_store_to_cache = 0;  ///< row bytes moved store -> device (staged included)
  std::uint64_t bytes_cache_to_store = 0;  ///< row bytes moved device -> store
  double seconds_swap_in = 0;              ///< pulling, initializing and inserting rows
  double seconds_write_back = 0;           ///< reading dirty victims and pushing them
  double seconds_prefetch_wait = 0;        ///< begin_pass blocked on a running prefetch
  double seconds_staging = 0;              ///< background staging time (not blocking the caller)
  /// Background push of the rows written behind at this pass's boundary (not blocking the
  /// caller); known once that push is over, so `last` gets it at the next begin_pass.
  double seconds_write_behind = 0;
  std::uint64_t keys_admitted = 0;  ///< sightings that admitted a key without a row (admission.hpp)
  std::uint64_t keys_refused = 0;   ///< sightings of keys without a row that were not admitted
  std::uint64_t rows_expired = 0;  ///< rows removed by expiry (expiry.hpp) at a pass boundary
  /// Of rows_staged, those begin_pass moved into their slots by index (move_staged_rows)
  std::uint64_t rows_moved = 0;
  /// Of rows_pushed, the dirty leavers begin_pass moved out by index for the write-behind
  /// (move_staged_rows) instead of gathering them
  std::uint64_t rows_detached = 0;
  /// Adds every field of `o`.
  table_counters& operator+=(const table_counters& o);
};

/// Counters of every table: of the last pass (begin_pass or lookup batch) and since construction.
struct cache_counters {
  std::uint64_t passes = 0;           ///< begin_pass calls that succeeded
  std::vector<std::string> tables;    ///< table names, in table order
  std::vector<table_counters> last;   ///< last begin_pass / lookup, per table
  std::vector<table_counters> total;  ///< since construction, per table
};

/// Rows of one table changed since the previous export, and keys erased since.
template <class Key>
struct table_delta {
  std::string table;                    ///< table name
  std::size_t dim = 0;                  ///< embedding floats per row
  std::size_t state_width = 0;          ///< state floats per row in `states` (0 without state)
  std::uint64_t since_version = 0;      ///< versions greater than this are in the delta
  std::uint64_t until_version = 0;      ///< ... and at most this (the table's counter at export)
  std::vector<Key> keys;                ///< changed keys, ascending
  std::vector<float> vectors;           ///< keys.size() * dim embedding floats
  std::vector<float> states;            ///< keys.size() * state_width floats, when asked for
  std::vector<std::uint64_t> versions;  ///< version of each changed row
  std::vector<Key> erased;              ///< keys erased since (tombstones), ascending
};

/// Progress of training_cache::save(): rows written so far, rows of every table.
using save_progress = std::function<void(std::uint64_t rows_done, std::uint64_t rows_total)>;

/// Format version of the folders written by save() and export_incremental_to().
inline constexpr int model_format_version = 1;

/// What training_cache::load() accepts beyond a complete folder written by save().
struct load_options {
  /// Loads a plain HugeCTR sparse model folder (`dir/<table>/key` + `emb_vector`, or `dir/key` +
  /// `emb_vector` for a single table; no manifest): optimizer state initialized, every row at
  /// version 1, no checksums. Default false: a folder without `manifest.json` is refused
  /// (not_found naming the file), because a folder written by save() always has one and loading
  /// it without its manifest would drop the optimizer state and skip every checksum.
  bool allow_hugectr_folder = false;
  /// Accepts a key that appears more than once in a table's `key` file (the last occurrence
  /// wins). Default false: invalid_argument naming the file and the key.
  bool allow_duplicate_keys = false;
  /// Accepts NaN and infinite floats in `emb_vector` and the optimizer state files. Default false:
  /// invalid_argument naming the file, the key and the value.
  bool allow_non_finite = false;
};

/// The training cache of several tables.
///
/// Thread safety: one caller thread drives the cache; the only other threads are its own
/// prefetch worker and write-behind flusher. Rows may be updated in place through cache(t)
/// (lookup_slots, row_pool() at the slots' row_indices(), mark_updated) between
/// begin_pass / lookup calls; in keyset mode, while
/// a prefetch is pending, only rows of the current pass's keyset (see prefetch()).
///
/// Failures: every call that returns a status or a result reports through it whatever fails at
/// run time, a CUDA failure or a failed allocation included (`training_cache::<call>: ...`; host
/// memory that cannot be allocated is capacity_exceeded, naming the bytes where the call knows
/// them), and so does the next call for a failure in the background threads. Only misuse throws
/// (embcache::error, or std::out_of_range for a table index).
template <class Key, class Space = host_space>
class training_cache {
 public:
  using cache_type = embedding_cache<Key, Space>;
  using space_type = Space;

  /// Builds the caches and, where none is given, the host stores. Throws embcache::error
  /// (invalid_argument) for an empty or repeated name, a zero dim or capacity, bad optimizer
  /// or admission options, or a store whose row width differs from dim + state width; in the cuda
  /// space, embcache::error (unsupported) when no CUDA device can be used. `space` carries the
  /// stream the device caches run on.
  training_cache(training_cache_options options, std::vector<table_options<Key>> tables,
                 Space space = {});
  /// Waits for a running prefetch; does not flush (call end_training() for that).
  ~training_cache();
  training_cache(const training_cache&) = delete;
  training_cache& operator=(const training_cache&) = delete;

  /// Number of tables.
  std::size_t num_tables() const noexcept;
  /// Index of the table called `name`; not_found otherwise.
  result<std::size_t> table_index(const std::string& name) const;
  /// Options of table `t` (init.seed as given, before folding).
  const table_options<Key>& table(std::size_t t) const;
  /// Floats per row of table `t`.
  std::size_t row_width(std::size_t t) const;
  /// Device cache of table `t`.
  cache_type& cache(std::size_t t);
  /// Store of table `t`, after waiting for a pending write-behind (a failed one is reported by
  /// the next call that returns a status). Do not write to it directly while the cache holds
  /// rows of the table.
  param_store<Key>& store(std::size_t t);

  /// Keyset mode: makes every key of `keysets[t]` resident in table t (one keyset per table;
  /// keys in any order, repeats allowed). Rows resident and in the keyset stay; other rows are
  /// evicted only as the table's max_resident requires (oldest version first, then smallest
  /// key), the dirty ones written back first (rows outside the keyset may stay resident); missing
  /// rows come from the prefetch staging, the store, or the initializer. After a prefetch of the
  /// same keysets, part of this may already have been done during the pass (see prefetch()). A
  /// keyset with more distinct keys than its table's capacity gives capacity_exceeded before
  /// anything changes; so does a count of keysets other than num_tables() (invalid_argument).
  /// Throws in on_demand mode. With table_options::admission on, a key of the keyset that has no
  /// row and is not admitted at this sighting stays out (admission.hpp): no row, slot -1.
  status begin_pass(const std::vector<std::vector<Key>>& keysets);
  /// begin_pass with keysets read from files (one per table, options().keyset_fmt). Read errors
  /// (missing, truncated, wrong key type) are returned before anything changes.
  status begin_pass_files(const std::vector<std::string>& paths);

  /// Starts staging, in a background thread, the rows of `keysets` that are not resident now,
  /// so that a later begin_pass moves only the difference. A running prefetch is waited for and
  /// replaced. Staged rows are checked at begin_pass: a key written to or erased from the store
  /// after staging began is re-pulled, a key resident by then keeps its resident row.
  ///
  /// In keyset mode the worker also installs what it can of the next pass while this one
  /// trains: residents outside both the current pass's keyset and `keysets` are evicted as far
  /// as the missing rows need room under max_resident (oldest version first, then smallest key;
  /// dirty ones pushed to the store first), and staged rows found in the store are inserted while
  /// there is room.
  /// So, until the next begin_pass, update in place only rows of the current pass's keyset.
  /// read(), assign(), erase() and export_incremental() wait while the worker changes which
  /// rows are resident; end_training(), save() and store(t) wait for the worker to finish.
  status prefetch(const std::vector<std::vector<Key>>& keysets);
  /// prefetch() with keysets read from files.
  status prefetch_files(const std::vector<std::string>& paths);
  /// Whether a prefetch is staged or running.
  bool prefetch_pending() const noexcept;

  /// On-demand mode: makes the keys of the batch resident and writes each key's slot into
  /// `slots_out` (n, may be nullptr; on-demand caches have no spare rows, so slot s holds row s of
  /// cache(t).row_pool()). Misses are
  /// pulled or initialized and inserted with eviction by score; dirty victims are written back.
  /// More distinct keys than the capacity gives capacity_exceeded before anything changes. When
  /// some keys find no room (more keys of the batch share a home bucket than it holds), the
  /// others are made resident, the victims written back, `slots_out` is -1 for those keys and
  /// capacity_exceeded names how many and the first. With table_options::admission on, a key
  /// that has no row and is not admitted at this sighting gets no row and slot -1 (admission.hpp).
  /// Throws in keyset mode.
  status lookup(std::size_t t, const Key* keys, std::size_t n, std::int64_t* slots_out);

  /// Feature admission (admission.hpp): counts one sighting of each distinct key of `keys` in
  /// table t's sketch, making no row and deciding nothing; nothing when the table's admission is
  /// off. A sharded run calls it with the keys of a shard's keyset that other ranks own, before
  /// its begin_pass of its own part, so that every rank counts what a single rank counts.
  status count_sightings(std::size_t t, const Key* keys, std::size_t n);

  /// Keyset mode, for tables trained outside the cache, directly in their stores (the trainer's
  /// host-hybrid mode, host_hybrid.hpp; the cache holds none of their rows): the pass boundary of
  /// begin_pass(keysets) without its swap. Per table with admission on, counts the sighting of
  /// every distinct key of `keysets[t]` and writes into `(*refused_out)[t]` (ascending; resized
  /// to num_tables(), empty for the other tables) the keys begin_pass would leave out: no row in
  /// the store and not admitted at this sighting. The caller makes no row for them in this pass
  /// (host_hybrid_table::forward's `refused`). Then, per table with expiry on, the boundary of
  /// expiry with the admitted keys kept (expiry.hpp); the version clock first moves up to the
  /// store's max_version(), so that the rows the caller pushed since the previous boundary count
  /// as touched in that pass. Counted as begin_pass counts (passes; keys_admitted, keys_refused,
  /// rows_expired). invalid_argument when a table holds resident rows or the number of keysets
  /// is not num_tables() (nothing changes then). Throws in on_demand mode or when `refused_out`
  /// is null.
  status begin_pass_in_stores(const std::vector<std::vector<Key>>& keysets,
                              std::vector<std::vector<Key>>* refused_out);

  /// Overwrites the rows of resident keys (`rows`: n * row_width floats) and marks them
  /// updated. A key that is not resident gives not_found (nothing is written).
  status assign(std::size_t t, const Key* keys, std::size_t n, const float* rows);

  /// Copies the current row of each key into `rows_out` (n * row_width), from the device when
  /// resident, else from the store; `found_out` (may be nullptr) says whether the key exists.
  status read(std::size_t t, const Key* keys, std::size_t n, float* rows_out, bool* found_out);

  /// Removes keys from the cache and the store; they are reported as erased by the next export.
  status erase(std::size_t t, const Key* keys, std::size_t n);

  /// On-demand mode: a pass boundary of expiry (expiry.hpp): records the version clocks and
  /// removes the expired rows of every table with expiry on (cache, store, tombstones of the next
  /// export; counted as rows_expired of their `counters().last` and totals). Waits for a pending
  /// write-behind first. Does nothing for tables with expiry off (nothing at all when every
  /// table's is off). Throws in keyset mode, where every begin_pass is the boundary.
  status expire();
  /// Marks the start of a training step for expiry's ttl_steps (expiry.hpp, "Steps"): each table
  /// with ttl_steps on records its version clock (tables kept in their stores, as the trainer's
  /// host-hybrid mode keeps them, take their store's max_version() first); rows touched from now
  /// on belong to this step. Nothing at all for tables with ttl_steps 0. Either mode; call it
  /// between the pass calls, never during one.
  void begin_step();

  /// Writes every dirty resident row back and flushes the stores; rows stay resident.
  status end_training();

  /// Rows changed since the previous export (resident or already written back), per table,
  /// with optimizer state when `with_state`, and the keys erased since.
  result<std::vector<table_delta<Key>>> export_incremental(bool with_state = false);
  /// export_incremental() written as the folder `dir/delta-NNNNNN`, through a temporary folder
  /// that is fsynced and renamed. Returns the folder's path. NNNNNN is `number`, or with 0 (the
  /// default) one past the highest delta already in `dir`; a number at or below one already
  /// there, or past 999999, is refused (invalid_argument) before anything is exported. Ranks of
  /// a sharded run pass an agreed number, so that their deltas of one export share it.
  result<std::string> export_incremental_to(const std::string& dir, bool with_state = false,
                                            std::uint64_t number = 0);

  /// end_training(), then writes `dir`: per table a HugeCTR sparse model folder `dir/<table>/`
  /// (rows in key order: `key`: int64[n], `emb_vector`: float32[n][dim]), the optimizer state
  /// as HugeCTR's files (float32[n][dim] each: `AdaGrad.accm`; `Adam.m`, `Adam.v`; `Ftrl.n`,
  /// `Ftrl.z`; none for sgd), `version` (uint64[n]) and, when every row's slot id is known
  /// (loaded, set_slot_ids() or table_options::slot_of), `slot_id` (uint64[n]); plus
  /// `dir/manifest.json` with every file's size and xxHash64. The folder is built beside `dir`
  /// and renamed into place; a crash at any point leaves the previous save loadable by load(dir).
  /// `on_progress`, when set, is called with (0, total rows) before the first table and with the
  /// rows written so far after each table, so a caller can show a percentage, rate and ETA.
  status save(const std::string& dir, const save_progress& on_progress = {});
  /// Replaces every table's rows with those of `dir`, a folder written by save(). Its
  /// `manifest.json` is required (not_found naming it when missing) and checked: format version,
  /// key type, tables, dims, optimizer, counts, every file's size against the count (corruption)
  /// and its checksum (corruption). The optimizer state comes from the optimizer's HugeCTR files
  /// or, in saves of earlier versions, from one `opt_state` file (float32[n][state width]). A
  /// plain HugeCTR folder (no manifest) loads only with `options.allow_hugectr_folder`; its
  /// optimizer files, when there, restore the state (otherwise it is initialized). Either way a
  /// `slot_id` file, when there, replaces the table's known slot ids (else they are forgotten);
  /// each state or `slot_id` file must hold n rows (corruption naming it). Repeated keys and
  /// non-finite floats are refused (invalid_argument) unless `options` allows them. Everything
  /// is validated before anything changes.
  status load(const std::string& dir, const load_options& options = {});
  /// After the stores were written from outside the cache while it held none of their rows (a
  /// sharded save loaded into them, distributed/sharded_table.hpp): as the constructor does with
  /// a store's rows, moves each table's version clock to at least its store's max_version(), so
  /// that a row updated from now on is newer than its stored version (else its write-back would
  /// take it for clean and drop the update), and, as load() does, starts the next export there
  /// with its logs of written and erased keys emptied. Waits for a running prefetch and drops
  /// staged rows. invalid_argument, before anything changes, when a table holds resident rows.
  status adopt_stores();
  /// For tables trained outside the cache, directly in their stores (the trainer's host-hybrid
  /// mode, host_hybrid.hpp; the cache holds none of their rows), before an export or a save:
  /// logs every store row pushed since the last export (or since the previous call) as written,
  /// so that the next export_incremental() / export_incremental_to() takes it from the store, and
  /// moves each table's version clock up to its store's max_version(). Unlike adopt_stores(), the
  /// export keeps its position and its logs, the keys erased since the last export (expiry,
  /// erase()) included: they are the next export's tombstones. One scan of the rows newer than the
  /// last export per table. invalid_argument, before anything changes, when a table holds resident
  /// rows.
  status adopt_store_writes();

  /// Feature admission's state of table `t` as saves record it (admission_sketch::to_words():
  /// header and counters); empty when the table's admission is off. Throws std::out_of_range for
  /// a `t` out of range.
  std::vector<std::uint32_t> admission_state(std::size_t t) const;
  /// Writes into `out` (table(t).dim floats, host memory) what a key of feature slot `slot` reads
  /// while table `t`'s admission refuses it: zeros under refused_row::zeros (the default, and
  /// while admission is off), else slot_default_row() of the table's initializer with the seed the
  /// table's rows are drawn with (init.seed with the table index folded in). Throws
  /// std::out_of_range for a `t` out of range.
  void default_row(std::size_t t, std::uint64_t slot, float* out) const;
  /// The expiry clock of table `t` (expiry.hpp); empty (no boundary) while its expiry is off.
  /// Throws std::out_of_range for a `t` out of range.
  expiry_clock expiry_state(std::size_t t) const;
  /// What load() does with a save's admission file and expiry clock, for state saved elsewhere (a
  /// sharded save, distributed/sharded_save.hpp), called after the rows are in place
  /// (adopt_stores()): with the table's admission on, its counts become `admission` (as
  /// admission_state() gave them), or zero when `admission` is empty (a save written with
  /// admission off); with its expiry on, its clock becomes `clock` and its version clock moves to
  /// at least the newest value of `clock`, so that rows written from now on are newer than every
  /// recorded boundary. What a table does not use is ignored. corruption naming `origin` (the
  /// file the words came from) for words of another sketch (width, depth or seed) or damaged
  /// ones; nothing changes then. invalid_argument for a `t` out of range, or pass versions that
  /// decrease or outnumber the boundaries. Waits for a running prefetch and drops staged rows.
  status restore_lifetime(std::size_t t, const std::vector<std::uint32_t>& admission,
                          const expiry_clock& clock, const std::string& origin);

  /// Records the slot id of each key of table `t` (`keys` and `slot_ids`: n each; a key given
  /// twice keeps the later id), for the `slot_id` file of save(). They stay until load() replaces
  /// them; about 40 bytes of host memory per key. invalid_argument when `t` is out of range.
  status set_slot_ids(std::size_t t, const Key* keys, const std::uint64_t* slot_ids, std::size_t n);
  /// The slot id save() writes for `key` in table `t`: a loaded or set one first, else
  /// table(t).slot_of(key); not_found when neither knows it (or `t` is out of range).
  result<std::uint64_t> slot_id(std::size_t t, Key key) const;

  /// Counters of the last pass and the totals.
  const cache_counters& counters() const noexcept;
  /// Options of the cache.
  const training_cache_options& options() const noexcept;

  /// The identity of the run (32 lowercase hex digits) recorded as `run_id` in every save and
  /// delta: drawn at random when the cache is built, replaced by the one a loaded save records
  /// (a save without one keeps the current identity).
  const std::string& run_id() const noexcept;
  /// Makes `id` the run identity, so that several caches of one run record the same one (the
  /// ranks of a sharded run take rank 0's; a resume from a sharded save takes the save's).
  /// invalid_argument naming `id` unless it is 32 lowercase hex digits (nothing changes then).
  status set_run_id(const std::string& id);

 private:
  std::unique_ptr<detail::training_cache_core<Key, Space>> core_;
};

extern template class training_cache<std::int64_t, host_space>;
extern template class training_cache<std::uint32_t, host_space>;
extern template class training_cache<std::int64_t, cuda_space>;  // library embcache::cuda
extern template class training_cache<std::uint32_t, cuda_space>;

}  // namespace embcache
