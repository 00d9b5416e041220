// The sharded embedding path of a run over several ranks: each table is a sharded_table whose
// rows belong to the rank that owns their keys; a step sends the rank's keys to their owners and
// the gradients back (distributed/sharded_table.hpp). An owner keeps its rows in its stores
// (mode host_hybrid) or in its training cache, which takes the rank's part of every shard's
// keyset (mode keyset). Saves are sharded saves, one folder per table, loadable on any number
// of ranks; each rank exports its own deltas. Feature admission and expiry run at each shard's
// start on every owner for its own rows: keyset mode's begin_pass, or in mode host_hybrid the
// boundary of the cache of one bucket per table over the rank's stores (begin_pass_in_stores),
// as one process runs them; every rank counts the whole keyset, so that the sketches agree.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "common/durable_file.hpp"
#include "embcache/criteo.hpp"
#include "embcache/distributed/sharded_table.hpp"
#include "embcache/log_store.hpp"
#include "embcache/sparse_ops.hpp"
#include "embedding_path.hpp"
#ifdef EMBCACHE_TRAINER_WITH_ROCKSDB
#include "embcache/rocksdb_store.hpp"
#endif

namespace embcache::detail {
namespace {

namespace fs = std::filesystem;

// Opens a part of a sharded save whatever store wrote it: a log_store checkpoint (it has a
// state.json), a RocksDB checkpoint (a CURRENT file) or a host_store checkpoint.
part_opener<trainer_key> part_opener_for(const trainer_table_config& tc) {
  const part_opener<trainer_key> host = host_store_part_opener<trainer_key>();
  return [host, tc](const std::string& dir, const std::string& table,
                    std::size_t row_width) -> result<std::unique_ptr<param_store<trainer_key>>> {
    std::error_code ec;
    if (fs::exists(dir + "/state.json", ec)) {
      log_store_options lo;
      lo.path = dir;
      lo.table_name = table;
      lo.row_width = row_width;
      lo.dim = tc.dim;
      lo.optimizer = to_string(tc.optimizer.kind);
      lo.create_if_missing = false;
      auto s = log_store<trainer_key>::open(lo);
      if (!s.ok()) return s.get_status();
      return std::unique_ptr<param_store<trainer_key>>(std::move(s).value());
    }
#ifdef EMBCACHE_TRAINER_WITH_ROCKSDB
    if (fs::exists(dir + "/CURRENT", ec)) {
      rocksdb_store_options ro;
      ro.path = dir;
      ro.table_name = table;
      ro.row_width = row_width;
      ro.dim = tc.dim;
      ro.optimizer = to_string(tc.optimizer.kind);
      ro.existing_rows = existing_rows_policy::reuse;
      auto s = rocksdb_store<trainer_key>::open(ro);
      if (!s.ok()) return s.get_status();
      return std::unique_ptr<param_store<trainer_key>>(std::move(s).value());
    }
#endif
    return host(dir, table, row_width);
  };
}

// Every key of `store` (a load replaces the rows a rank holds, so they are removed first).
result<std::vector<trainer_key>> keys_of(param_store<trainer_key>& store) {
  std::vector<trainer_key> keys;
  EMBCACHE_RETURN_IF_ERROR(store.for_each(
      4096, [&](const trainer_key* k, const float*, const std::uint64_t*, std::size_t n) {
        keys.insert(keys.end(), k, k + n);
        return status{};
      }));
  return keys;
}

// Removes every row of `store`.
status clear_store(param_store<trainer_key>& store) {
  auto keys = keys_of(store);
  if (!keys.ok()) return keys.get_status();
  return store.erase(keys.value().data(), keys.value().size());
}

class cache_owner_rows final : public owner_rows<trainer_key> {
 public:
  cache_owner_rows(training_cache<trainer_key>& cache, std::size_t t, const trainer_config& config,
                   host_space space, int rank)
      : cache_(cache),
        t_(t),
        config_(config.tables[t]),
        space_(space),
        rank_(rank) {}

  status lookup(const trainer_key* keys, std::size_t n, float* out) override {
    auto& c = cache_.cache(t_);
    slots_.resize(n);
    EMBCACHE_RETURN_IF_ERROR(c.lookup_slots(keys, n, slots_.data()));
    const std::size_t dim = config_.dim, width = c.row_width();
    const std::int64_t* rows = rows_.of(c, slots_.data(), n, space_);
    for (std::size_t i = 0; i < n; ++i) {
      if (slots_[i] < 0 && config_.admission.enabled()) {
        // Refused by admission: no row; zeros or the default row of the key's slot (its tag is
        // its slot's position in the batch, as the unsharded paths take it).
        cache_.default_row(t_, criteo_key_tag(keys[i]), out + i * dim);
        continue;
      }
      if (slots_[i] < 0)
        return status::not_found("key " + std::to_string(keys[i]) + " is not in rank " +
                                 std::to_string(rank_) + "'s part of the shard's keyset (table " +
                                 config_.name + ")");
      const float* row = c.row_pool() + std::size_t(rows[i]) * width;
      std::copy(row, row + dim, out + i * dim);
    }
    offsets_.resize(n + 1);
    for (std::size_t i = 0; i <= n; ++i) offsets_[i] = std::int64_t(i);
    return {};
  }

  status update(const float* grads, std::uint64_t step) override {
    auto& c = cache_.cache(t_);
    const std::size_t n = slots_.size();
    const slot_batch batch{n, 1, offsets_.data(), slots_.data(), n};
    aggregate_gradients(space_, batch, combiner::sum, grads, config_.dim, grads_);
    apply_optimizer(space_, config_.optimizer, c.row_pool(), c.row_width(), grads_.dim,
                    rows_.of(c, grads_.rows.data(), grads_.size, space_), grads_.values.data(),
                    grads_.size, step);
    c.mark_updated(grads_.rows.data(), grads_.size);
    return {};
  }

  status read(const trainer_key* keys, std::size_t n, float* rows, bool* found) override {
    return cache_.read(t_, keys, n, rows, found);
  }

 private:
  training_cache<trainer_key>& cache_;
  std::size_t t_;
  trainer_table_config config_;
  host_space space_;
  int rank_;
  std::vector<std::int64_t> slots_, offsets_;
  slot_rows<trainer_key> rows_;  // the rows of slots_ (config.move_staged_rows), then of grads_
  sparse_gradients<host_space> grads_;
};

// Mode host_hybrid: the owner's rows in its store through host_hybrid_table, as sharded_table's
// default owner keeps them, less the keys feature admission refused at the shard's start
// (`refused`[t], set by begin_pass_in_stores): those get no row, read what keyset mode's owner
// gives them and take no gradient.
class hybrid_owner_rows final : public owner_rows<trainer_key> {
 public:
  hybrid_owner_rows(param_store<trainer_key>& store, const host_hybrid_options& options,
                    training_cache<trainer_key>& cache, std::size_t t,
                    const std::vector<std::vector<trainer_key>>& refused)
      : store_(store),
        table_(store, options, cache_initializer(cache, t)),
        cache_(cache),
        t_(t),
        refused_(refused) {}

  status lookup(const trainer_key* keys, std::size_t n, float* out) override {
    offsets_.resize(n + 1);
    for (std::size_t i = 0; i <= n; ++i) offsets_[i] = std::int64_t(i);
    static const std::vector<trainer_key> none;
    const std::vector<trainer_key>& refused = t_ < refused_.size() ? refused_[t_] : none;
    EMBCACHE_RETURN_IF_ERROR(
        table_.forward({n, 1, offsets_.data(), keys, n}, out, refused.data(), refused.size()));
    // Zeros or the default row of the key's slot, as cache_owner_rows gives a refused key.
    const std::size_t dim = table_.options().dim;
    for (std::size_t i = 0; i < n && !refused.empty(); ++i)
      if (std::binary_search(refused.begin(), refused.end(), keys[i]))
        cache_.default_row(t_, criteo_key_tag(keys[i]), out + i * dim);
    return {};
  }
  status update(const float* grads, std::uint64_t step) override {
    table_.set_step(step - 1);  // the table's next step is step
    return table_.backward(grads);
  }
  status read(const trainer_key* keys, std::size_t n, float* rows, bool* found) override {
    return store_.pull(keys, n, rows, found);
  }
  // Rows pushed from now on are newer than `version` (a resumed expiry clock's values).
  void advance_version(std::uint64_t version) { table_.advance_version(version); }

 private:
  param_store<trainer_key>& store_;
  host_hybrid_table<trainer_key> table_;
  training_cache<trainer_key>& cache_;
  std::size_t t_;
  const std::vector<std::vector<trainer_key>>& refused_;
  std::vector<std::int64_t> offsets_;
};

// Removes every row of table `t` from the training cache and its store.
status clear_cache(training_cache<trainer_key>& cache, std::size_t t) {
  EMBCACHE_RETURN_IF_ERROR(cache.end_training());  // every resident row is in the store now
  auto keys = keys_of(cache.store(t));
  if (!keys.ok()) return keys.get_status();
  return cache.erase(t, keys.value().data(), keys.value().size());
}

class sharded_path final : public embedding_path {
 public:
  sharded_path(const trainer_config& config, host_space space, communicator& comm,
               embedding_tables tables)
      : config_(config),
        comm_(comm),
        tables_(std::move(tables)),
        keyset_(config.mode == trainer_mode::keyset),
        swapper_(config_, tables_.roles,
                 [rank = comm.rank(), world = comm.size()](const std::vector<trainer_key>& k) {
                   return owned_part(k.data(), k.size(), rank, world);
                 }),
        space_(space) {}

  // The sharded tables of the wide and the deep table over the ranks.
  status build_tables() {
    for (const std::size_t t : {tables_.roles.wide, tables_.roles.deep}) {
      const trainer_table_config& tc = config_.tables[t];
      sharded_table_options so;
      so.table.dim = tc.dim;
      so.table.optimizer = tc.optimizer;
      so.table.max_threads = config_.threads;
      so.num_blocks = config_.num_blocks;
      boundaries_ = boundaries_ || tc.admission.enabled() || tc.expiry.enabled();
      steps_ = steps_ || tc.expiry.ttl_steps != 0;
      const std::string what =
          "config.tables[" + std::to_string(t) + "] (table \"" + tc.name + "\"): its sharded table";
      EMBCACHE_RETURN_IF_ERROR(allocating(what, [&]() -> status {
        if (keyset_)
          sharded_[t] = std::make_unique<sharded_table<trainer_key>>(
              comm_, *tables_.stores[t], so,
              std::make_unique<cache_owner_rows>(*tables_.cache, t, config_, space_, comm_.rank()));
        else {
          auto rows = std::make_unique<hybrid_owner_rows>(*tables_.stores[t], so.table,
                                                          *tables_.cache, t, refused_);
          hybrid_[t] = rows.get();
          sharded_[t] = std::make_unique<sharded_table<trainer_key>>(comm_, *tables_.stores[t], so,
                                                                     std::move(rows));
        }
        return {};
      }));
    }
    return {};
  }

  // One identity per run: every rank's training cache takes rank 0's, so that the ranks' deltas
  // and the sharded saves record the same run_id. Collective.
  status share_run_id() {
    char id[32] = {};
    const std::string& own = tables_.cache->run_id();
    if (comm_.rank() == 0) std::memcpy(id, own.data(), std::min(own.size(), sizeof id));
    EMBCACHE_RETURN_IF_ERROR(comm_.broadcast(id, sizeof id, 0));
    const status local = tables_.cache->set_run_id(std::string(id, sizeof id));
    return agree(comm_, local.with_context("rank " + std::to_string(comm_.rank())),
                 "the run identity");
  }

  // Keyset mode: every rank swaps in its part of the shard's keysets; mode host_hybrid with
  // admission or expiry: every rank counts the shard's keysets and admits and expires its own
  // keys' rows in its stores. Collective through the agreement on the outcome.
  status begin_shard(const std::string& shard, const std::string& upcoming) override {
    if (keyset_) {
      const status local = swapper_.begin_shard(*tables_.cache, shard, upcoming, activity_);
      return agree(comm_, local.with_context("rank " + std::to_string(comm_.rank())),
                   "the keyset swap");
    }
    if (!boundaries_) return {};
    return agree(comm_,
                 boundary_in_stores(shard).with_context("rank " + std::to_string(comm_.rank())),
                 "the pass boundary");
  }

  // Expiry's ttl_steps: every rank records every step, so the step clock is the run's.
  status begin_step() override {
    if (steps_) tables_.cache->begin_step();
    return {};
  }

  status forward(const batch_keys& k, float* wide_out, float* deep_out) override {
    const std::size_t n = k.batch_size, global = k.global_batch_size ? k.global_batch_size : n;
    EMBCACHE_RETURN_IF_ERROR(sharded_[tables_.roles.wide]->forward(
        {n, k.wide_slots, k.offsets, k.wide, n * k.wide_slots}, wide_out, global));
    return sharded_[tables_.roles.deep]->forward(
        {n, k.deep_slots, k.offsets, k.deep, n * k.deep_slots}, deep_out, global);
  }

  // The owners apply the optimizers; the tables count their own steps (set_step keeps them
  // equal to the trainer's).
  status backward(const float* d_wide, const float* d_deep, std::uint64_t,
                  non_finite_rows*) override {
    EMBCACHE_RETURN_IF_ERROR(sharded_[tables_.roles.wide]->backward(d_wide));
    return sharded_[tables_.roles.deep]->backward(d_deep);
  }

  // Collective: every rank reads the keys of its own samples.
  status read(std::size_t t, const trainer_key* keys, std::size_t n, float* rows,
              bool* found) override {
    return sharded_[t]->read(keys, n, rows, found);
  }
  std::size_t row_width(std::size_t t) const override { return tables_.cache->row_width(t); }
  bool has_cache() const noexcept override { return keyset_; }
  path_activity take_activity() override { return std::exchange(activity_, {}); }
  // This rank's counters (keyset mode: its training cache's).
  const cache_counters& counters() const override { return tables_.cache->counters(); }

  // Keyset mode: each rank writes its delta into `dir`/rank-R/delta-N/ (an ordinary delta; the
  // ranks' keys are disjoint, so the parts of delta N together are the model's delta N), with N
  // one past the highest parts file rank 0 finds, and rank 0 names the parts in
  // `dir`/delta-N.parts.json.
  // Mode host_hybrid exports the rows its owners pushed into their stores since the last export
  // (adopt_store_writes) and the keys they expired since, as one process does.
  result<exported_delta> export_incremental_to(const std::string& dir, bool with_state) override {
    if (!keyset_)
      EMBCACHE_RETURN_IF_ERROR(agree(
          comm_,
          tables_.cache->adopt_store_writes().with_context("rank " + std::to_string(comm_.rank())),
          "the incremental export"));
    std::uint64_t number = 1;
    if (comm_.rank() == 0) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.size() == 23 && name.rfind("delta-", 0) == 0 &&
            name.compare(12, 11, ".parts.json") == 0)
          number = std::max<std::uint64_t>(number, std::strtoull(name.c_str() + 6, nullptr, 10) + 1);
      }
    }
    EMBCACHE_RETURN_IF_ERROR(comm_.broadcast(&number, sizeof number, 0));
    const std::string mine = dir + "/" + rank_folder_name(comm_.rank());
    auto path = tables_.cache->export_incremental_to(mine, with_state, number);
    result<exported_delta> d =
        path.ok() ? exported_delta_of(path.value()) : result<exported_delta>(path.get_status());
    EMBCACHE_RETURN_IF_ERROR(
        agree(comm_, d.get_status().with_context("rank " + std::to_string(comm_.rank())),
              "the incremental export"));
    std::uint64_t rows = d.value().rows;
    EMBCACHE_RETURN_IF_ERROR(comm_.all_reduce_sum(&rows, 1));
    const std::string name = fs::path(d.value().path).filename().string();
    const std::string parts = dir + "/" + name + ".parts.json";
    status written;
    if (comm_.rank() == 0) {
      nlohmann::json j{
          {"format", "embcache.sharded_delta"}, {"format_version", 1},        {"sequence", number},
          {"run_id", tables_.cache->run_id()},  {"world_size", comm_.size()}, {"rows", rows},
          {"parts", nlohmann::json::array()}};
      for (int r = 0; r < comm_.size(); ++r)
        j["parts"].push_back(rank_folder_name(r) + "/" + name);
      written = write_text_durably(parts, j.dump(2) + "\n");
    }
    EMBCACHE_RETURN_IF_ERROR(agree(comm_, written, "the incremental export"));
    last_delta_ = number;
    return exported_delta{parts, rows};
  }
  // `dir`/<table>: a sharded save per table (every rank its part, rank 0 the manifest), recording
  // the last delta exported before it (serving applies the deltas after it), with each table's
  // admission counts and this rank's expiry clock. Keyset mode writes the cache's dirty rows back
  // to the stores first.
  status save_sparse(const std::string& dir, const save_progress&) override {
    if (keyset_)
      EMBCACHE_RETURN_IF_ERROR(agree(comm_, tables_.cache->end_training(), "trainer::save"));
    for (const std::size_t t : {tables_.roles.wide, tables_.roles.deep}) {
      sharded_lifetime lifetime;
      lifetime.admission = tables_.cache->admission_state(t);
      lifetime.has_expiry = config_.tables[t].expiry.enabled();
      if (lifetime.has_expiry) lifetime.expiry = tables_.cache->expiry_state(t);
      EMBCACHE_RETURN_IF_ERROR(sharded_[t]->save(dir + "/" + config_.tables[t].name,
                                                 tables_.cache->run_id(), last_delta_, &lifetime));
    }
    return {};
  }
  // Any number of ranks may have written the save: each rank keeps the rows it owns now, and
  // the run continues under the save's identity (a save without one, written before run
  // identities existed, keeps the run's own).
  status load_sparse(const std::string& dir, const load_options&) override {
    std::string adopted, adopted_from;
    sharded_manifest manifests[2];
    for (const std::size_t t : {tables_.roles.wide, tables_.roles.deep}) {
      const std::string folder = dir + "/" + config_.tables[t].name;
      status local;
      std::error_code ec;
      if (!fs::exists(folder + "/manifest.json", ec))
        local = status::invalid_argument(
            folder + "/manifest.json: not found; a sharded run resumes from the save of a sharded "
                     "run (a save of one process keeps its tables in the training cache's layout)");
      else if (keyset_)
        local = clear_cache(*tables_.cache, t);
      else
        local = clear_store(*tables_.stores[t]);
      EMBCACHE_RETURN_IF_ERROR(agree(
          comm_, local.with_context("rank " + std::to_string(comm_.rank())), "trainer::load"));
      std::string saved;
      EMBCACHE_RETURN_IF_ERROR(sharded_[t]->load(folder, part_opener_for(config_.tables[t]), &saved,
                                                 &manifests[t == tables_.roles.deep]));
      if (!saved.empty() && !adopted.empty() && saved != adopted)
        local = status::invalid_argument(folder + "/manifest.json: run_id " + saved + ", but " +
                                         adopted_from + "/manifest.json has run_id " + adopted +
                                         " (tables of two runs)");
      else if (!saved.empty())
        adopted = saved, adopted_from = folder;
      EMBCACHE_RETURN_IF_ERROR(agree(comm_, local, "trainer::load"));
      // The save is at its delta: a save before the next export is at it too.
      auto m = read_sharded_manifest(folder);
      if (m.ok()) last_delta_ = m.value().info.applied_delta;
    }
    // Every rank read the same manifests, so they adopt the same identity.
    if (!adopted.empty())
      EMBCACHE_RETURN_IF_ERROR(agree(comm_, tables_.cache->set_run_id(adopted), "trainer::load"));
    // The rows reached the stores without the training cache, whose version clock must pass
    // theirs (or, in keyset mode, rows updated after the resume look clean and are never written
    // back) and whose next export starts at them (or it repeats the exports before the save).
    EMBCACHE_RETURN_IF_ERROR(agree(
        comm_, tables_.cache->adopt_stores().with_context("rank " + std::to_string(comm_.rank())),
        "trainer::load"));
    // Admission counts on from the save's (or from zero), expiry from this rank's clock.
    status local;
    for (const std::size_t t : {tables_.roles.wide, tables_.roles.deep}) {
      const std::string folder = dir + "/" + config_.tables[t].name;
      const sharded_manifest& m = manifests[t == tables_.roles.deep];
      std::vector<std::uint32_t> words;
      if (config_.tables[t].admission.enabled()) {
        auto read = read_sharded_admission(folder, m, tables_.cache->admission_state(t).size());
        if (!read.ok()) {
          local = read.get_status();
          break;
        }
        words = std::move(read).value();
      }
      local = tables_.cache->restore_lifetime(
          t, words, resumed_expiry_clock(m, comm_.rank(), comm_.size()),
          m.admission.path.empty() ? folder + "/manifest.json" : folder + "/" + m.admission.path);
      if (!local.ok()) break;
      // Mode host_hybrid: the rows its owners push from now on are newer than the clock.
      if (hybrid_[t]) hybrid_[t]->advance_version(tables_.cache->cache(t).version());
    }
    return agree(comm_, local.with_context("rank " + std::to_string(comm_.rank())),
                 "trainer::load");
  }
  void set_step(std::uint64_t step) override {
    for (auto& s : sharded_)
      if (s) s->set_step(step);
  }
  training_cache<trainer_key>* host_cache() override { return tables_.cache.get(); }

 private:
  // Mode host_hybrid's pass boundary: the sightings of the keys other ranks own, then
  // begin_pass_in_stores of this rank's part of the shard's keysets, whose refused keys the
  // owners leave without a row until the next shard.
  status boundary_in_stores(const std::string& shard) {
    std::vector<std::vector<trainer_key>> others;
    auto keysets = swapper_.read_keysets(shard, &others);
    if (!keysets.ok()) return keysets.get_status();
    for (std::size_t t = 0; t < others.size(); ++t)
      EMBCACHE_RETURN_IF_ERROR(tables_.cache->count_sightings(t, others[t].data(), others[t].size())
                                   .with_context(shard));
    return tables_.cache->begin_pass_in_stores(keysets.value(), &refused_).with_context(shard);
  }

  const trainer_config config_;
  communicator& comm_;
  embedding_tables tables_;
  const bool keyset_;
  keyset_swapper swapper_;
  host_space space_;  // the cache_owner_rows of build_tables
  path_activity activity_;
  std::uint64_t last_delta_ = 0;  // the last delta exported (or the loaded save's applied_delta)
  bool boundaries_ = false;       // a table with admission or expiry: shards begin passes
  bool steps_ = false;            // a table with expiry's ttl_steps: steps are recorded
  // Mode host_hybrid: per table the keys admission refused at the current shard's start, which
  // its owner rows (hybrid_, in sharded_[t]) leave without a row.
  std::vector<std::vector<trainer_key>> refused_;
  hybrid_owner_rows* hybrid_[2] = {nullptr, nullptr};
  std::unique_ptr<sharded_table<trainer_key>> sharded_[2];
};

}  // namespace

result<std::unique_ptr<embedding_path>> make_sharded_path(const trainer_config& config,
                                                          host_space space, communicator& comm,
                                                          embedding_tables tables) {
  auto path = std::make_unique<sharded_path>(config, space, comm, std::move(tables));
  EMBCACHE_RETURN_IF_ERROR(path->build_tables());
  EMBCACHE_RETURN_IF_ERROR(path->share_run_id());
  return std::unique_ptr<embedding_path>(std::move(path));
}

}  // namespace embcache::detail
