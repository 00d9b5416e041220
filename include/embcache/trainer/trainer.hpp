/// @file trainer/trainer.hpp
/// @brief The reference Wide&Deep trainer on Criteo-format shards: its configuration (a JSON
/// document for the `embcache-train` CLI) and the `trainer` that runs passes over shards with
/// the embeddings in a training cache (keyset or on-demand mode) or directly on the parameter
/// stores (host-hybrid mode). docs/trainer.md describes the configuration and the outputs.
///
/// Two tables: "wide" (dim 1, FTRL by default; the 26 slot keys, plus the 13 crossed keys when
/// `crossed`) and "deep" (dim 16 by default, lazy Adam; the 26 slot keys). The dense part is a
/// dense_backend: wide_deep_model<host_space> (OpenBLAS) or, with `dense_device` "cuda" (or "auto"
/// on a machine with a device, in a program that registered the cuda backend), the cuda space
/// (cuBLAS). The tables and their sparse optimizers are on the host, or with `embedding_device`
/// "cuda" (or "auto" with a device, in a build with the cuda space) in a training cache in the
/// cuda space. For a given pair of devices every result is a function of
/// the configuration and the data only: the cache capacity, the mode (with the tables in the cuda
/// space: keyset or on_demand), prefetch, thread count and an interruption by save / resume change
/// timings, never a bit of the model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "embcache/admission.hpp"
#include "embcache/json.hpp"
#include "embcache/memory_plan.hpp"
#include "embcache/optimizers.hpp"
#include "embcache/shard.hpp"
#include "embcache/status.hpp"
#include "embcache/trainer/dense_backend.hpp"
#include "embcache/trainer/in_memory.hpp"
#include "embcache/trainer/wide_deep.hpp"
#include "embcache/training_cache.hpp"

namespace embcache {

class communicator;

/// Where the embeddings live while training.
enum class trainer_mode : std::uint8_t {
  keyset,       ///< training cache, keyset mode: one begin_pass per shard, next shard prefetched
  on_demand,    ///< training cache, on-demand mode: lookup per batch, eviction by score
  host_hybrid,  ///< no cache: host_hybrid_table on each store (MindSpore's host+device hybrid)
};

/// Name of a mode ("keyset", "on_demand", "host_hybrid").
const char* to_string(trainer_mode mode) noexcept;

/// One embedding table of the trainer.
struct trainer_table_config {
  std::string name;                                        ///< "wide" or "deep"; required
  std::size_t dim = 16;                                    ///< embedding floats (default 16)
  optimizer_options optimizer = default_deep_optimizer();  ///< default lazy Adam, lr 0.001
  std::size_t capacity = std::size_t{1} << 20;  ///< cache rows (default 1 Mi); unused host_hybrid
  /// `"capacity": "auto"` (default false): resolve_trainer_config sets capacity to the largest
  /// keyset of this table among the passes' shards, from their datasets' manifest.json (wide:
  /// slot keys plus crossed keys when `crossed`; deep: slot keys).
  bool capacity_auto = false;
  /// Device table slots and the rows it may hold between passes (table_options::slots and
  /// max_resident); default 0 = the cache's defaults (capacity * 5 / 4 and capacity * 9 / 8).
  std::size_t slots = 0, max_resident = 0;
  /// "host" (default), "rocksdb" or "log" (a log_store; both need store_path)
  std::string store = "host";
  /// RocksDB folder, which tables may share, or the folder of the log stores, each table in
  /// store_path/<name> (default "")
  std::string store_path;
  /// Trains from the rows a RocksDB or log table at store_path already holds (default false:
  /// such a table is refused unless resume_from is set, which replaces its rows).
  bool reuse_store = false;
  /// A DRAM tier (tiered_store) of this many bytes in front of the RocksDB store: recently used
  /// rows stay in memory, evicted ones are demoted to it, dirty ones written down in key order
  /// (default 0: none). `"dram_tier_bytes": "auto"` (dram_tier_auto) takes the tables' share of
  /// config.memory_budget_bytes instead (plan_trainer_memory). Needs store "rocksdb".
  std::uint64_t dram_tier_bytes = 0;
  /// `"dram_tier_bytes": "auto"` (default false): the tier is sized from the memory budget.
  bool dram_tier_auto = false;
  /// The SST data block size of the table's RocksDB column family (rocksdb_store_options::
  /// block_bytes): default 0 derives it from the row (a 4 KiB page per block for rows under
  /// about 4 KiB); else 1024 to 268435456. Larger blocks suit a table whose shards' keysets
  /// cover a large part of it, read by scans (docs/stores.md, "Block size"). Needs store
  /// "rocksdb". The size is the table's from its creation: reopened (resume_from, reuse_store)
  /// it keeps it, and another nonzero size is refused.
  std::size_t store_block_bytes = 0;
  /// The most rows the table's log store (store "log") holds: its index in memory is sized for
  /// them up front and counted in memory_budget_bytes (log_store::memory_bound). Default 0:
  /// resolve_trainer_config sets it to the unique keys of the datasets the passes' shards come
  /// from (their manifest.json's unique counts: slot keys, plus crossed keys for the wide table
  /// when `crossed`), or, for a dataset without them, the sum of its shards' keyset sizes; it
  /// stays 0 (the index grows on demand, uncounted) only without a manifest. 0 to 2^40.
  std::uint64_t store_rows = 0;
  float init_scale = 0.01f;  ///< new rows start uniform in [-scale, scale) (default 0.01)
  /// Feature admission of the table (`"admission": {...}`, embcache/admission.hpp); default off.
  /// A refused key gets no gradient and reads zeros, or with `"default_row": "slot"` the fixed
  /// default row of its slot (the slot's position among the table's keys of a sample, which is
  /// criteo_key_tag of the key: training_cache::default_row), in every mode.
  admission_options admission{};
  /// `"expiry": {"ttl_passes": N, "min_l2_norm": x}` (table_options::expiry; every field
  /// optional, default off): rows untouched for N shards, or whose embedding's norm is below x,
  /// leave the table at a shard's start and are tombstones of the next export. Modes keyset and
  /// on_demand; printed only when on.
  expiry_options expiry{};
};

/// The default tables: wide (dim 1, FTRL alpha 0.05, init 0) and deep (dim 16, Adam, init 0.01),
/// each with a cache of 1 Mi rows on a host store.
std::vector<trainer_table_config> default_trainer_tables();

/// One pass: shards trained in order (one keyset swap per shard in keyset mode), then evaluation,
/// a metrics line, the export and the save. A pass names either its shards or a dataset folder.
struct trainer_pass_config {
  /// Shard files (relative paths are relative to trainer_config::data_dir). Each shard's keyset
  /// is beside it: `X.bin` has `X.keys` (and `X.cross.keys` when crossing is on).
  std::vector<std::string> shards;
  /// A dataset folder (relative to data_dir, or absolute) instead of shards: the pass trains
  /// all its shards in the order of its manifest.json (resolve_trainer_config expands it).
  std::string dataset;
};

/// Everything a training run needs; every field has a default except the passes.
struct trainer_config {
  trainer_mode mode = trainer_mode::keyset;  ///< default keyset
  std::string data_dir;                      ///< base of relative shard paths (default: none)
  std::vector<trainer_pass_config> passes;   ///< passes of this run; required (>= 1)
  std::string eval_shard;                    ///< held-out shard (default "": no evaluation)
  std::size_t eval_max_samples = 0;          ///< evaluate on at most this many (default 0: all)
  std::vector<trainer_table_config> tables = default_trainer_tables();  ///< wide and deep
  wide_deep_options model = default_model();  ///< dense part (shape fields are set from data)
  bool crossed = false;            ///< wide also takes the shards' crossed keys (default off)
  /// Dense features per sample, the dataset schema's (default 13, Criteo's; 0..1024).
  /// resolve_trainer_config sets it and num_slots from the first dataset's manifest.json (or the
  /// first shard's header); every shard of the run must have this shape (else refused, named).
  std::size_t num_dense = criteo_dense_count;
  /// Categorical slots per sample, the dataset schema's (default 26, Criteo's; 1..63).
  std::size_t num_slots = criteo_slot_count;
  std::size_t batch_size = 1024;   ///< samples per step (default 1024)
  bool shuffle = false;            ///< visit each shard in a seeded random order (default off)
  std::uint64_t seed = 0;          ///< embedding initialization and shuffling (default 0)
  bool prefetch = true;            ///< keyset mode: stage the next shard while training (on)
  /// Keyset mode with prefetch: the staged rows move into the caches at a shard's start, and the
  /// dirty leaving rows out of them, by index instead of by copy
  /// (training_cache_options::move_staged_rows). Unset (the default): moved when the caches are
  /// on the host, where their spare rows are the staging (one batch of rows is staged beside
  /// them), copied when they are on the device, where spare rows would be device memory on top
  /// of the staging (moves_staged_rows()). Each cache that moves holds spare rows for its share
  /// of staging_bytes (at most twice its capacity) beside its slots, counted by check_memory and
  /// plan_trainer_memory with the cache. The same model bit for bit either way; true is refused
  /// in the other modes and without prefetch, naming this field.
  std::optional<bool> move_staged_rows;
  std::size_t log_interval = 100;  ///< steps between progress lines (default 100; 0: none)
  std::string output_dir;          ///< metrics.jsonl, metrics.tsv, plots (default "": none)
  std::string export_dir;          ///< incremental export after each pass (default "": none)
  bool export_with_state = false;  ///< exports carry optimizer state (default off)
  std::string save_dir;            ///< save at the end of the run (default "": none)
  bool save_every_pass = false;    ///< save after every pass too (default off)
  std::string resume_from;         ///< a save to start from (default "": fresh start)
  /// A plain HugeCTR sparse model folder (default "": none) the tables start from: `DIR/wide` and
  /// `DIR/deep`, each with `key` (int64), `emb_vector` (float32[n][dim]), and optionally
  /// `slot_id` and the optimizer's files (`Adam.m` and `Adam.v`, `AdaGrad.accm`, ...: all or none;
  /// none: state initialized). Read with the library's checks (training_cache::load with
  /// load_options::allow_hugectr_folder): sizes before a byte is read, repeated keys and
  /// non-finite floats refused naming the file and key. The dense network starts fresh and the
  /// run at pass 1. Not with resume_from, nor in a sharded run.
  std::string start_from_hugectr;
  int threads = 0;  ///< worker threads of the sparse ops (default 0: all)
  /// Where the dense network runs: host, cuda or automatic (JSON "host", "cuda", "auto"; default
  /// automatic: cuda when the program registered the cuda backend and a device is present, else
  /// host). make_dense_backend.
  device_choice dense_device = device_choice::automatic;
  /// Where the embedding tables and their sparse ops (lookup and combine, gradient aggregation,
  /// the in-row optimizers) run in modes keyset and on_demand: host, cuda or automatic (JSON
  /// "host", "cuda", "auto"; default automatic: cuda when embcache was built with the cuda space,
  /// EMBCACHE_BUILT_WITH_CUDA, and a device is present, else host). With "cuda" the
  /// tables are a training_cache<std::int64_t, cuda_space> and only each batch's keys (or, on
  /// demand, its slots) go to the device; with the dense network there too the pooled embeddings
  /// and their gradients stay on the device (dense_backend::forward_backward_on_device), with it on
  /// the host they cross to the host and back (docs/trainer.md: what crosses PCIe per step). Mode
  /// host_hybrid keeps them on the host
  /// ("auto" means host there, "cuda" is refused naming the mode), and so does a sharded run
  /// (trainer::create with a communicator; "cuda" is refused as unsupported).
  device_choice embedding_device = device_choice::automatic;
  /// Threads of OpenBLAS for the host dense network, process-wide (default 0: OpenBLAS's own
  /// setting, OPENBLAS_NUM_THREADS or one per core). set_host_blas_threads.
  int blas_threads = 0;
  /// Ranks of a data- and model-parallel run (docs/distributed.md): "auto" (0, the default)
  /// takes the launcher's (`mpirun -np N`; one rank without a launcher), a number N >= 1 must
  /// equal it. With a communicator (trainer::create's second argument) each rank owns the rows
  /// of its keys (sharded tables, mode host_hybrid) and trains on its blocks of every batch.
  int world = 0;
  /// Blocks every global batch is cut into for a sharded run (default 8): a multiple of the
  /// number of ranks, fixed for a run and its resumes. The model is the same bits on every
  /// number of ranks that divides it.
  std::size_t num_blocks = 8;
  /// The run's memory budget in bytes, at most 2^50 (default 0: none; RocksDB stores keep their
  /// own defaults and the run is only checked against physical memory). The caches, the prefetch
  /// staging and write-behind buffers, the dense network and a batch must fit in it with a
  /// reserve; what they leave sizes the RocksDB stores' block caches and memtables
  /// (plan_trainer_memory). Checked before anything is allocated: too small is
  /// capacity_exceeded naming this field and the bytes needed.
  std::uint64_t memory_budget_bytes = 0;
  /// Keyset mode: most bytes of rows the prefetch stages for the next shard, over all tables
  /// (training_cache_options::staging_bytes), at most 2^50 (default 0: a quarter of
  /// memory_budget_bytes when set, else the cache's 1 GiB). Missing rows past it are pulled when
  /// the shard begins. Counted by check_memory and plan_trainer_memory as the cache reserves it.
  std::uint64_t staging_bytes = 0;
  /// Keyset mode: most bytes of rows gathered at once to be written back, per table
  /// (training_cache_options::write_back_bytes), at least one row, at most 2^50 (default 0: a
  /// 32nd of memory_budget_bytes when set, else the cache's 256 MiB).
  std::uint64_t write_back_bytes = 0;

  /// The default dense part: hidden 1024-1024, dropout 0.5, Adam lr 0.001, seed 0.
  static wide_deep_options default_model() { return wide_deep_options{}; }
};

/// Checks a configuration: every numeric field within its range (docs/trainer.md), names known,
/// fields consistent. The message names the field and what was expected, e.g.
/// "config.tables[1].dim: expected an integer in [1, 4096], got 0".
[[nodiscard]] status validate(const trainer_config& config);
/// The memory check_memory holds a run to, and where its training caches are.
struct memory_budget {
  /// Host memory for what the run keeps on the host (default: no limit).
  std::uint64_t host_bytes = std::numeric_limits<std::uint64_t>::max();
  /// The training caches are in the cuda space (config.embedding_device resolved to "cuda"), so
  /// they count against device_bytes instead of host_bytes (default false: on the host).
  bool caches_on_device = false;
  /// Device memory for the caches when caches_on_device (default: no limit).
  std::uint64_t device_bytes = std::numeric_limits<std::uint64_t>::max();
};
/// Checks that the caches, the dense network, one batch and the RocksDB stores' block caches and
/// memtables fit in `available_bytes` of host memory (an estimate from below: the tables' arrays,
/// embedding_cache::bytes_per_slot and bytes_per_bucket, 16 bytes per MLP parameter, the batch's
/// buffers; per RocksDB database its block cache and all its memtables, one
/// "config.tables[i].store_path" part for the first table on it), with overflow-checked
/// arithmetic. With config.memory_budget_bytes the budget must fit in `available_bytes` and
/// plan_trainer_memory must succeed instead. capacity_exceeded names the field that
/// sizes the part that does not fit and the bytes it needs, e.g. "config.tables[1].capacity: the
/// cache of table "deep" (...) needs N bytes, more than the M bytes of physical memory".
[[nodiscard]] status check_memory(const trainer_config& config, std::uint64_t available_bytes);
/// check_memory with the caches where `budget` puts them: on the host as above, or, with
/// caches_on_device, the dense network and the batch against budget.host_bytes and the caches
/// with the largest table's pass-boundary scratch (embedding_cache::scratch_bytes_per_slot)
/// against budget.device_bytes, where too much is out_of_device_memory naming the field
/// the same way ("... needs N bytes, more than the M bytes of free device memory").
/// trainer::create checks host parts against physical_memory_bytes() before it allocates
/// anything; the caches in the cuda space are checked against the device's free memory when the
/// cuda path is built (embedding_device "cuda").
[[nodiscard]] status check_memory(const trainer_config& config, const memory_budget& budget);
/// Whether a run of `config` moves its staged rows by index (config.move_staged_rows): only in
/// mode "keyset" with prefetch; there the field when set, else true when the caches are on the
/// host (not `caches_on_device`).
[[nodiscard]] bool moves_staged_rows(const trainer_config& config, bool caches_on_device);
/// How config.memory_budget_bytes is spent (plan_memory with field "config.memory_budget_bytes"):
/// the caches (on the host unless `caches_on_device`; when moves_staged_rows() their spare rows
/// and row index too), their pass boundary's scratch, in keyset
/// mode the prefetch staging (when config.prefetch: the rows the cache reserves within
/// config.staging_bytes, and per table its keys) and the write-behind buffers (per table three
/// buffers of config.write_back_bytes of rows, two without prefetch, with their keys), the dense
/// network and a batch as check_memory counts them, a 10% reserve, and the rest split between the
/// RocksDB stores' memtables (two per column family: one per table and each database's default),
/// the DRAM tiers of the tables with `"dram_tier_bytes": "auto"` (shared equally; a table's fixed
/// dram_tier_bytes counts with the parts above) and block caches (shared equally by the
/// databases). capacity_exceeded names the field of a part larger than the budget by itself
/// ("config.tables[1].capacity: ... needs N bytes, more than the M bytes of
/// config.memory_budget_bytes"), else config.memory_budget_bytes and the bytes needed.
/// invalid_argument when the configuration sets no budget.
[[nodiscard]] result<memory_plan> plan_trainer_memory(const trainer_config& config,
                                                      bool caches_on_device = false);
/// This machine's physical memory (sysconf), or UINT64_MAX when it cannot be read.
std::uint64_t physical_memory_bytes() noexcept;
/// Reads a configuration from JSON (unknown fields are refused, naming them) and validates it.
/// Integer fields must be JSON integers within their range (12.5, -1 and 1e3 are refused), real
/// fields finite numbers within theirs. Never throws.
result<trainer_config> trainer_config_from_json(const nlohmann::json& j);
/// Parses JSON text and reads it as a configuration; errors start with `origin` (a file name,
/// or "config text"). A key given twice in one object is refused, naming it and its place
/// (`config.tables[1]`). Never throws, whatever the bytes.
result<trainer_config> trainer_config_from_text(std::string_view text,
                                                const std::string& origin = "config text");
/// The largest configuration file load_trainer_config() reads: 16 MiB.
inline constexpr std::uint64_t max_trainer_config_bytes = std::uint64_t{16} << 20;
/// Reads and parses a JSON configuration file (errors name the file). Only a regular file of at
/// most max_trainer_config_bytes is read: a larger one, a folder, a FIFO or a device
/// (/dev/zero) is refused with invalid_argument before anything is read.
result<trainer_config> load_trainer_config(const std::string& path);
/// A path of the configuration as the trainer opens it: relative to `data_dir` unless it is
/// absolute or data_dir is empty.
std::string resolve_data_path(const std::string& data_dir, const std::string& path);
/// The configuration a run uses: every pass that names a dataset folder gets that folder's
/// shards (manifest order, paths relative to data_dir when the folder is), and every table with
/// capacity_auto gets the largest keyset its passes need (then capacity_auto is false). Reads
/// the datasets' manifest.json; errors name the field ("config.passes[1].dataset: ...",
/// "config.tables[0].capacity: ..."), e.g. a manifest written before keyset sizes were recorded
/// (no shards[i].keys). trainer::create calls it.
result<trainer_config> resolve_trainer_config(const trainer_config& config);
/// JSON of a configuration, every field included; trainer_config_from_json reads it back.
void to_json(nlohmann::json& j, const trainer_config& config);

/// What one pass did (a line of metrics.jsonl).
struct pass_metrics {
  std::uint64_t pass = 0;           ///< pass number, from 1, continued across resumes
  std::uint64_t samples = 0;        ///< samples trained in the pass
  std::uint64_t steps = 0;          ///< optimizer steps in the pass
  double train_loss = 0;            ///< mean batch loss over the pass
  double eval_auc = 0;              ///< AUC on the eval shard (NaN without one)
  double eval_logloss = 0;          ///< log loss on the eval shard (NaN without one)
  double swap_seconds = 0;          ///< time training was blocked on swapping (all tables)
  std::uint64_t rows_in = 0;        ///< rows brought into the caches (misses)
  std::uint64_t rows_out = 0;       ///< dirty rows written back to the stores
  double hit_rate = 0;              ///< hits / (hits + misses) over the pass's swaps and lookups
  double samples_per_s = 0;         ///< samples / wall seconds of the training loop
  double seconds = 0;               ///< wall seconds of the training loop
  std::uint64_t rows_exported = 0;  ///< rows in this pass's incremental export
  std::string export_path;          ///< its folder ("" when none)
};

/// JSON object of a pass_metrics (the metrics.jsonl line; NaN is written as null).
void to_json(nlohmann::json& j, const pass_metrics& m);

/// Evaluation result.
struct eval_metrics {
  std::uint64_t samples = 0;  ///< samples evaluated
  double auc = 0;             ///< exact AUC
  double logloss = 0;         ///< mean binary cross-entropy
};

/// The reference Wide&Deep trainer.
///
/// A save is a folder: `sparse/` (training_cache::save layout: per table `key`, `emb_vector`,
/// `opt_state`, `version`, plus manifest.json), `dense.bin` (wide_deep_model::save) and
/// `trainer.json` (step, passes, samples, history, counters). The same layout in every mode, so
/// a save of one mode resumes in another.
class trainer {
 public:
  /// Resolves the configuration (resolve_trainer_config), builds the stores, the cache and the
  /// model, and loads `config.resume_from` when set.
  static result<std::unique_ptr<trainer>> create(const trainer_config& config);
  /// A trainer that is one rank of a sharded, data-parallel run over `comm` (which must outlive
  /// it; docs/distributed.md). Every rank calls create, run, save, load and evaluate with the
  /// same configuration; each is collective and fails on every rank when one rank fails. The
  /// tables are sharded_tables: each rank owns the rows of its keys, in its stores (mode
  /// host_hybrid) or in its training cache, which takes the rank's part of every shard's keyset
  /// (mode keyset; a table's "auto" capacity is then sized for that part). RocksDB stores get a
  /// `rank-R` folder per rank under store_path. Every rank reads every batch and trains on its
  /// blocks of it (config.num_blocks, a multiple of comm.size()), and the dense gradients are
  /// summed over the blocks in block order: the model is the same bits whatever the number of
  /// ranks, and in either mode. Only rank 0 logs, and writes the metrics files and the save's
  /// dense.bin and trainer.json; every rank writes its part of the sparse tables (a sharded
  /// save per table, with the admission counts and the rank's expiry clocks) and its own
  /// incremental exports (export_dir/rank-R/, with export_dir/delta-N.parts.json naming them).
  /// Feature admission and expiry (passes, steps, norm) run on each owner for its own rows, in
  /// either mode. Saves, resumes and exports go through folders every rank sees. invalid_argument when config.world is set and differs from comm.size(),
  /// or the mode is on_demand; unsupported when config.embedding_device is "cuda" (a sharded
  /// run keeps its tables on the host; "auto" means host).
  static result<std::unique_ptr<trainer>> create(const trainer_config& config, communicator& comm);
  ~trainer();
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  /// Runs every pass of the configuration, then saves to save_dir when set.
  [[nodiscard]] status run();
  /// Trains one pass, evaluates, appends to metrics.jsonl, exports; `next` (may be null) is the
  /// pass after it, whose first shard is prefetched while this pass's last shard trains. A pass
  /// that names a dataset folder is expanded first.
  result<pass_metrics> run_pass(const trainer_pass_config& pass,
                                const trainer_pass_config* next = nullptr);
  /// Evaluates on the eval shard (or `shard` when not empty) without changing the model. Keys
  /// never trained have a zero embedding.
  result<eval_metrics> evaluate(const std::string& shard = "");
  /// Writes a save to `dir`, durably: staged in `dir`.tmp with every file fsynced, then
  /// published in place of the previous save, so that a crash at any point leaves a complete
  /// save loadable. A failure (out_of_space, io_error naming the file) removes the staged folder
  /// and leaves the previous save as it was.
  [[nodiscard]] status save(const std::string& dir);
  /// Replaces the model and the trainer's state with the save in `dir` (or in `dir`.old, where a
  /// save cut short between its renames left the previous one).
  [[nodiscard]] status load(const std::string& dir);
  /// Writes an incremental export into export_dir; returns its folder and row count.
  result<std::pair<std::string, std::uint64_t>> export_incremental();

  /// Steps taken since the start of training (resumes included): the dropout stream and Adam's
  /// bias correction are functions of it.
  std::uint64_t step() const noexcept;
  /// Passes completed (resumes included).
  std::uint64_t passes_done() const noexcept;
  /// Metrics of every pass so far (resumes included).
  const std::vector<pass_metrics>& history() const noexcept;
  /// The configuration.
  const trainer_config& config() const noexcept;
  /// Where the embeddings live: "host" or "cuda" (config.embedding_device resolved).
  const char* embedding_device() const noexcept;
  /// Where the embeddings live and, for "auto", why: "embeddings on cuda (auto: CUDA device
  /// present)". run() logs it right after dense_note().
  const std::string& embedding_note() const noexcept;
  /// The training cache's counters, wherever its tables live (host_hybrid mode: zeros).
  const cache_counters& counters() const;
  /// The training cache when the embeddings are on the host (host_hybrid mode: one bucket per
  /// table, which only initializes rows, saves and loads). Throws embcache::error (unsupported)
  /// when they are in the cuda space (embedding_device() "cuda"): use cuda_cache() then. Reads,
  /// exports, saves and counters go through the trainer, whichever space holds the tables.
  training_cache<std::int64_t>& cache();
  /// The training cache when the embeddings are in the cuda space (its rows in device memory,
  /// every other pointer of its calls in host memory). Throws embcache::error (unsupported) when
  /// they are on the host.
  training_cache<std::int64_t, cuda_space>& cuda_cache();
  /// The dense model, on the device config.dense_device chose.
  dense_backend& model() noexcept;
  /// Where the dense network runs and, for "auto", why: "dense network on host (auto: no CUDA
  /// device)". run() logs it before the first pass.
  const std::string& dense_note() const noexcept;
  /// Receives progress lines and pass summaries; default: printed to stdout.
  void set_log(std::function<void(const std::string&)> log);

  struct impl;

 private:
  explicit trainer(std::unique_ptr<impl> p);
  static result<std::unique_ptr<trainer>> create_with(const trainer_config& config,
                                                      communicator* comm);
  std::unique_ptr<impl> impl_;
};

/// Writes `dir`/metrics.tsv and `dir`/plot.gp from `history` and, when gnuplot is on the PATH,
/// runs it to draw `dir`/loss.png and `dir`/auc.png. `note` receives what was done or why the
/// drawing was skipped.
[[nodiscard]] status plot_metrics(const std::string& dir, const std::vector<pass_metrics>& history,
                                  std::string* note);

}  // namespace embcache
