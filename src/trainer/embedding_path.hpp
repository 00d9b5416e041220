// Where the trainer's embeddings live and how a training step reaches them. The pass loop
// (trainer.cpp) and the checkpoints (trainer_checkpoint.cpp) see the tables only through
// embedding_path, so that the modes differ in one place: the training cache in keyset or
// on-demand mode, its tables on the host or in the cuda space (cache_path.hpp), or host-hybrid
// on the stores (host_hybrid_path.cpp).
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "embcache/distributed/communicator.hpp"
#include "embcache/host_hybrid.hpp"
#include "embcache/keyset.hpp"
#include "embcache/param_store.hpp"
#include "embcache/slot_rows.hpp"
#include "embcache/space.hpp"
#include "embcache/status.hpp"
#include "embcache/trainer/criteo_model.hpp"
#include "embcache/trainer/trainer.hpp"
#include "embcache/training_cache.hpp"

namespace embcache::detail {

using trainer_key = std::int64_t;

/// Which table of the configuration is which (indices into trainer_config::tables).
struct table_roles {
  std::size_t wide = 0;  ///< the dim-1 table of the wide part
  std::size_t deep = 1;  ///< the table of the deep part
};
/// The roles of `config`'s tables (validate() guarantees one "wide" and one "deep").
table_roles roles_of(const trainer_config& config);

/// The keys of one batch as the two tables see them: one key per bag (one-hot slots).
struct batch_keys {
  std::size_t batch_size = 0;             ///< samples B
  const trainer_key* wide = nullptr;      ///< B * wide_slots keys
  std::size_t wide_slots = 0;             ///< slot keys, plus the crossed keys when crossing
  const trainer_key* deep = nullptr;      ///< B * deep_slots keys
  std::size_t deep_slots = 0;             ///< slot keys
  const std::int64_t* offsets = nullptr;  ///< 0, 1, 2, ...: every bag holds one key
  /// Samples of the global batch these are this rank's part of (sharded runs; 0: batch_size).
  std::size_t global_batch_size = 0;
};

/// What a path did since it was last asked (embedding_path::take_activity).
struct path_activity {
  std::uint64_t hits = 0;      ///< keys found resident (keyset swaps, on-demand lookups)
  std::uint64_t misses = 0;    ///< keys brought in from the stores
  double blocked_seconds = 0;  ///< time the caller waited on swapping
};

/// A batch's pooled embeddings and room for their gradients in the memory of the path's space
/// (embedding_path::forward_in_space): wide B * wide_slots floats, deep B * deep_slots * dim.
struct space_pooled {
  const float* wide = nullptr;
  const float* deep = nullptr;
  float* d_wide = nullptr;  ///< written by the dense network, read by backward_in_space
  float* d_deep = nullptr;
};

/// Rows an optimizer step left non-finite: the first table found so (rows 0: none).
struct non_finite_rows {
  std::string table;  ///< "wide" or "deep"
  std::size_t rows = 0;
};

/// The sum of per-table counters.
table_counters sum_of_tables(const std::vector<table_counters>& tables);

/// An incremental export: its folder (or, for a sharded run, the file that names its parts) and
/// the rows it holds.
struct exported_delta {
  std::string path;
  std::uint64_t rows = 0;
};
/// The rows of the delta folder `dir` (training_cache::export_incremental_to), from its
/// manifest.json.
result<exported_delta> exported_delta_of(const std::string& dir);

/// Cuts a table's keyset to the keys this process holds.
using keyset_filter = std::function<std::vector<trainer_key>(const std::vector<trainer_key>&)>;

/// Keyset mode's swaps: before each shard the training cache takes the shard's keysets, read
/// from the files beside it (`X.keys`, and `X.cross.keys` for the wide table when crossing) in
/// the layout its dataset's manifest.json names; with config.prefetch the next shard's are
/// staged meanwhile and taken by its begin_shard without reading them again. Host-hybrid's
/// boundaries (admission, expiry) read the same keysets through read_keysets.
class keyset_swapper {
 public:
  /// `keep` (may be empty) cuts each keyset to this process's keys (a sharded run: the keys the
  /// rank owns).
  keyset_swapper(const trainer_config& config, table_roles roles, keyset_filter keep = {});
  /// begin_pass with the keysets of `shard`, then a prefetch of `upcoming`'s ("" for none);
  /// adds the swap's hits, misses and blocked seconds to `activity`. A training cache of either
  /// space: its calls take host memory.
  template <class Space>
  [[nodiscard]] status begin_shard(training_cache<trainer_key, Space>& cache,
                                   const std::string& shard, const std::string& upcoming,
                                   path_activity& activity) {
    auto keysets = take_keysets(shard);
    if (!keysets.ok()) return keysets.get_status();
    const auto t0 = std::chrono::steady_clock::now();
    // Feature admission counts the whole keyset on every rank (admission.hpp).
    for (std::size_t t = 0; t < others_.size(); ++t)
      EMBCACHE_RETURN_IF_ERROR(
          cache.count_sightings(t, others_[t].data(), others_[t].size()).with_context(shard));
    EMBCACHE_RETURN_IF_ERROR(cache.begin_pass(keysets.value()).with_context(shard));
    activity.blocked_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const table_counters swap = sum_of_tables(cache.counters().last);  // every table's
    activity.hits += swap.hits;
    activity.misses += swap.misses;
    if (!config_.prefetch || upcoming.empty()) return {};
    auto next = keysets_of(upcoming, &prefetched_others_);
    if (!next.ok()) return next.get_status();
    EMBCACHE_RETURN_IF_ERROR(cache.prefetch(next.value()).with_context(upcoming));
    prefetched_shard_ = upcoming;
    prefetched_keysets_ = std::move(next).value();
    return {};
  }
  /// The keysets of `shard`, one per table (config.tables order), as begin_shard reads them;
  /// with `others`, per table with admission on, the keys `keep` cut from it (other ranks').
  [[nodiscard]] result<std::vector<std::vector<trainer_key>>> read_keysets(
      const std::string& shard, std::vector<std::vector<trainer_key>>* others = nullptr) {
    return keysets_of(shard, others);
  }

 private:
  // The keysets of `shard`: those prefetched for it, else read; forgets the prefetched ones.
  result<std::vector<std::vector<trainer_key>>> take_keysets(const std::string& shard);
  result<keyset_format> keyset_format_of(const std::string& shard);
  // With `others`: per table with admission on, the keys `keep` cut (other ranks' keys).
  result<std::vector<std::vector<trainer_key>>> keysets_of(
      const std::string& shard, std::vector<std::vector<trainer_key>>* others = nullptr);

  const trainer_config& config_;
  table_roles roles_;
  keyset_filter keep_;
  std::map<std::string, keyset_format> formats_;  // per dataset folder
  std::string prefetched_shard_;
  std::vector<std::vector<trainer_key>> prefetched_keysets_;
  // The keys of the current (prefetched) shard's keysets that other ranks own, per table with
  // admission on: counted as sightings, never swapped in.
  std::vector<std::vector<trainer_key>> others_, prefetched_others_;
};

/// The trainer's two embedding tables and the way a step reaches them. Every mode gives the
/// same model bits: the rows start from the cache's initializer and are updated by the same
/// sparse optimizers in the same order (wide, then deep).
class embedding_path {
 public:
  virtual ~embedding_path() = default;

  /// Before the first batch of `shard`: keyset mode makes its keyset resident (taking the keys
  /// prefetched for it when there are) and, with prefetch on, stages `upcoming` (the next
  /// shard, "" for none) in the background. The other modes have nothing to do.
  [[nodiscard]] virtual status begin_shard(const std::string& shard,
                                           const std::string& upcoming) = 0;
  /// Before a training step's forward: tables with expiry's ttl_steps record the step
  /// (training_cache::begin_step). The paths without such tables do nothing.
  [[nodiscard]] virtual status begin_step() { return {}; }
  /// Pools the batch's rows into `wide_out` (B * wide_slots floats) and `deep_out` (B *
  /// deep_slots * dim floats).
  [[nodiscard]] virtual status forward(const batch_keys& keys, float* wide_out,
                                       float* deep_out) = 0;
  /// Applies the sparse optimizers to the rows of the last forward with the gradients of its
  /// outputs, as optimizer step `step` (from 1). When a table's rows come out non-finite, stops
  /// before anything else changes and says so in `*bad`.
  [[nodiscard]] virtual status backward(const float* d_wide, const float* d_deep,
                                        std::uint64_t step, non_finite_rows* bad) = 0;
  /// Whether the loop should use the *_in_space calls when the dense network takes device
  /// inputs (dense_backend::takes_device_inputs): the tables are in the cuda space, so the
  /// pooled embeddings and their gradients can stay there. False for every host path.
  virtual bool pools_on_device() const noexcept { return false; }
  /// forward without the copy to the host: pools the batch's rows into the path's own arrays in
  /// its space's memory, complete when it returns, and hands them out with room for their
  /// gradients; they stay valid until the next forward_in_space. unsupported where the path has
  /// no such arrays.
  [[nodiscard]] virtual result<space_pooled> forward_in_space(const batch_keys&) {
    return status::unsupported("embedding path: the pooled embeddings are in host memory");
  }
  /// The number of non-finite floats among the gradients written into the last
  /// forward_in_space's room, counted in the space.
  [[nodiscard]] virtual result<std::size_t> non_finite_gradients_in_space() {
    return status::unsupported("embedding path: the gradients are in host memory");
  }
  /// backward with the gradients written into the last forward_in_space's room: the same
  /// updates, in the same order, as backward on the same values.
  [[nodiscard]] virtual status backward_in_space(std::uint64_t, non_finite_rows*) {
    return status::unsupported("embedding path: the gradients are in host memory");
  }
  /// Reads whole rows (row_width floats each) without changing anything; found[i] is false for
  /// a key never trained.
  [[nodiscard]] virtual status read(std::size_t table, const trainer_key* keys, std::size_t n,
                                    float* rows, bool* found) = 0;
  /// Floats per row of `table`: the embedding and its optimizer state.
  virtual std::size_t row_width(std::size_t table) const = 0;
  /// Whether the rows pass through a cache (false: read from the stores, no hit rate).
  virtual bool has_cache() const noexcept = 0;
  /// Hits, misses and blocked seconds since the previous call.
  virtual path_activity take_activity() = 0;
  /// The training cache's counters (zeros for host-hybrid, whose cache only saves and loads).
  virtual const cache_counters& counters() const = 0;

  /// Writes the rows changed since the previous export into a new folder under `dir`;
  /// unsupported without a cache.
  virtual result<exported_delta> export_incremental_to(const std::string& dir, bool with_state) = 0;
  /// Writes both tables to `dir` in the training_cache::save layout.
  [[nodiscard]] virtual status save_sparse(const std::string& dir,
                                           const save_progress& on_progress) = 0;
  /// Replaces both tables with a save_sparse folder (with `options`, a HugeCTR folder too).
  [[nodiscard]] virtual status load_sparse(const std::string& dir, const load_options& options) = 0;
  /// After a load: the optimizer step the tables continue from.
  virtual void set_step(std::uint64_t step) = 0;
  /// Where the tables and their sparse ops are: "host" or "cuda".
  virtual const char* device() const noexcept { return "host"; }
  /// The training cache behind trainer::cache() when the tables are on the host (host-hybrid:
  /// its cache of one bucket per table); nullptr when they are in the cuda space.
  virtual training_cache<trainer_key>* host_cache() = 0;
  /// The training cache behind trainer::cuda_cache() when the tables are in the cuda space;
  /// nullptr otherwise.
  virtual training_cache<trainer_key, cuda_space>* cuda_cache() { return nullptr; }
};

/// Builds the path `config.mode` names, with its stores and cache, in the space
/// config.embedding_device resolves to (embedding_device_of); with a communicator, the sharded
/// path over its ranks, on the host. Memory that runs out is a capacity_exceeded status naming
/// the part being built (out_of_memory); `*note` (may be null) receives embedding_device_of's
/// line.
result<std::unique_ptr<embedding_path>> make_embedding_path(const trainer_config& config,
                                                            host_space space, communicator* comm,
                                                            std::string* note = nullptr);

/// The status of a std::bad_alloc while allocating `what` (a field and the part, e.g.
/// "config.model: the dense network"): capacity_exceeded, "<what>: out of memory
/// (std::bad_alloc) while allocating it; lower the capacity or the model size".
status out_of_memory(const std::string& what);

/// `build()` (returning a status or a result), a std::bad_alloc it throws becoming
/// out_of_memory(what): the builders name what they allocate this way.
template <class Build>
auto allocating(const std::string& what, Build&& build) -> decltype(build()) {
  try {
    return build();
  } catch (const std::bad_alloc&) {
    return out_of_memory(what);
  }
}

/// Whether config.embedding_device puts the tables in the cuda space: "cuda" needs a trainer built
/// with the cuda space (make_cuda_cache_path) and a device, and is refused in mode host_hybrid and
/// in a sharded run (`sharded`); "auto" is cuda when all of that holds. `*note` (may be null)
/// receives where and, for "auto", why, e.g. "embeddings on host (auto: no CUDA device)".
/// Errors (unsupported, invalid_argument) start with "config.embedding_device: ".
result<bool> embedding_device_of(const trainer_config& config, bool sharded, std::string* note);

/// "rank-00003": a rank's folder (its RocksDB stores under a table's store_path).
std::string rank_folder_name(int rank);

/// The initializer of `cache`'s table `t` as a function of the key: the rows every mode starts
/// from, whether or not they pass through the cache.
embedding_initializer<trainer_key> cache_initializer(training_cache<trainer_key>& cache,
                                                     std::size_t t);

// The parts make_embedding_path puts together (embedding_path.cpp).

/// The configuration's stores and the options of the training cache over them.
struct embedding_stores {
  table_roles roles;
  std::vector<std::shared_ptr<param_store<trainer_key>>> stores;  ///< config.tables order
  training_cache_options options;
  std::vector<table_options<trainer_key>> tables;  ///< each with its store
};
/// Opens the stores and sets the training cache's options: sized by the configuration, or with
/// `save_only_cache` one bucket per table, which serves only the initializer, save and load.
/// Memory that runs out while opening table t's store names "config.tables[t] (table "<name>"):
/// its store".
result<embedding_stores> build_embedding_stores(const trainer_config& config, host_space space,
                                                bool save_only_cache);

/// What make_cache_tables allocates, for its out-of-memory status: "config.tables: the training
/// cache of table "wide" (config.tables[0].capacity 1048576) and table "deep" (...)".
std::string training_cache_field(const std::vector<table_options<trainer_key>>& tables);

/// The stores and the training cache of the configuration's tables, in `Space`.
template <class Space>
struct cache_tables {
  table_roles roles;
  std::vector<std::shared_ptr<param_store<trainer_key>>> stores;  ///< config.tables order
  std::unique_ptr<training_cache<trainer_key, Space>> cache;
};
/// The tables of every host path.
using embedding_tables = cache_tables<host_space>;

/// Builds the training cache over `stores` in `space`; a failure (a device that cannot be used,
/// its memory exhausted) is a status starting with "config.tables: ", host memory that runs out
/// one naming the training cache (training_cache_field).
template <class Space>
result<cache_tables<Space>> make_cache_tables(embedding_stores stores, Space space) {
  const std::string what = training_cache_field(stores.tables);
  return allocating(what, [&]() -> result<cache_tables<Space>> {
    cache_tables<Space> tables;
    tables.roles = stores.roles;
    tables.stores = std::move(stores.stores);
    try {
      tables.cache = std::make_unique<training_cache<trainer_key, Space>>(
          stores.options, std::move(stores.tables), space);
    } catch (const error& e) {
      return status(e.code(), std::string("config.tables: ") + e.what());
    }
    return result<cache_tables<Space>>(std::move(tables));
  });
}
/// build_embedding_stores, then the training cache over them on the host.
result<embedding_tables> build_embedding_tables(const trainer_config& config, host_space space,
                                                bool save_only_cache);
/// The training-cache path on the host, keyset or on-demand by config.mode (cache_path.cpp).
std::unique_ptr<embedding_path> make_cache_path(const trainer_config& config, host_space space,
                                                embedding_tables tables);

#ifdef EMBCACHE_TRAINER_WITH_CUDA
/// Builds the training-cache path with its tables in the cuda space over `stores`, once the
/// caches fit in the device's free memory (check_memory, out_of_device_memory). Defined in
/// cache_path.cu, which the trainer compiles only in a cuda build (EMBCACHE_TRAINER_WITH_CUDA);
/// a host-only trainer has no such function and refuses embedding_device "cuda".
result<std::unique_ptr<embedding_path>> make_cuda_cache_path(const trainer_config& config,
                                                             embedding_stores stores);
#endif
/// The sharded path (sharded_path.cpp): each table a sharded_table over `comm`'s ranks, each
/// rank's rows in its own stores (host_hybrid: `tables` built with a save-only cache) or its
/// training cache (keyset). Collective: the ranks' training caches take rank 0's run identity.
/// Memory that runs out names the table: "config.tables[t] (table "<name>"): its sharded table".
result<std::unique_ptr<embedding_path>> make_sharded_path(const trainer_config& config,
                                                          host_space space, communicator& comm,
                                                          embedding_tables tables);
/// The host-hybrid path (host_hybrid_path.cpp). Memory that runs out names the table:
/// "config.tables[t] (table "<name>"): its host-hybrid table".
result<std::unique_ptr<embedding_path>> make_host_hybrid_path(const trainer_config& config,
                                                              embedding_tables tables);

}  // namespace embcache::detail
