// The embedding path through the training cache: every lookup and sparse update hits the
// cache's rows. Keyset mode swaps once per shard (its keyset read from the files beside it, the
// next shard's staged meanwhile); on-demand mode fetches each batch's misses.
#include <utility>

#include "embcache/sparse_ops.hpp"
#include "embedding_path.hpp"

namespace embcache::detail {
namespace {

// What both cache modes share: pooling from the cache's rows, the in-row optimizers, reads,
// export, save and load. A mode says how a batch's keys become slots and what a shard needs.
class cache_path : public embedding_path {
 public:
  cache_path(const trainer_config& config, host_space space, embedding_tables tables)
      : config_(config), space_(space), tables_(std::move(tables)) {}

  status begin_shard(const std::string&, const std::string&) override { return {}; }

  status forward(const batch_keys& k, float* wide_out, float* deep_out) override {
    const std::size_t n = k.batch_size, ws = k.wide_slots, ds = k.deep_slots;
    wide_slots_.resize(n * ws);
    deep_slots_.resize(n * ds);
    EMBCACHE_RETURN_IF_ERROR(find_slots(k));
    wide_batch_ = {n, ws, k.offsets, wide_slots_.data(), n * ws};
    deep_batch_ = {n, ds, k.offsets, deep_slots_.data(), n * ds};
    auto& wc = cache().cache(tables_.roles.wide);
    auto& dc = cache().cache(tables_.roles.deep);
    lookup_combine(space_, wc.rows(), wc.row_width(), 1, wide_batch_, combiner::sum, wide_out);
    lookup_combine(space_, dc.rows(), dc.row_width(), config_.tables[tables_.roles.deep].dim,
                   deep_batch_, combiner::sum, deep_out);
    return {};
  }

  status backward(const float* d_wide, const float* d_deep, std::uint64_t step,
                  non_finite_rows* bad) override {
    EMBCACHE_RETURN_IF_ERROR(update(tables_.roles.wide, wide_batch_, d_wide, step, bad));
    if (bad->rows) return {};
    return update(tables_.roles.deep, deep_batch_, d_deep, step, bad);
  }

  status read(std::size_t t, const trainer_key* keys, std::size_t n, float* rows,
              bool* found) override {
    return cache().read(t, keys, n, rows, found);
  }
  std::size_t row_width(std::size_t t) const override { return tables_.cache->row_width(t); }
  bool has_cache() const noexcept override { return true; }
  path_activity take_activity() override { return std::exchange(activity_, {}); }
  const cache_counters& counters() const override { return tables_.cache->counters(); }

  result<exported_delta> export_incremental_to(const std::string& dir, bool with_state) override {
    auto path = cache().export_incremental_to(dir, with_state);
    if (!path.ok()) return path.get_status();
    return exported_delta_of(path.value());
  }
  status save_sparse(const std::string& dir, const save_progress& on_progress) override {
    return cache().save(dir, on_progress);
  }
  status load_sparse(const std::string& dir) override { return cache().load(dir); }
  void set_step(std::uint64_t) override {}  // the trainer hands each update its step
  training_cache<trainer_key>& cache() override { return *tables_.cache; }

 protected:
  // The slots of the batch's keys in wide_slots_ and deep_slots_.
  virtual status find_slots(const batch_keys& k) = 0;

  void add_lookups(const table_counters& c) {
    activity_.hits += c.hits;
    activity_.misses += c.misses;
  }

  const trainer_config config_;
  host_space space_;
  embedding_tables tables_;
  std::vector<std::int64_t> wide_slots_, deep_slots_;
  path_activity activity_;

 private:
  // One table's sparse update: gradients per unique row, the optimizer in the rows, then the
  // rows checked (no non-finite row may reach a store, an export or a save) and marked dirty.
  status update(std::size_t t, const slot_batch& batch, const float* d_out, std::uint64_t step,
                non_finite_rows* bad) {
    auto& c = cache().cache(t);
    sparse_gradients<host_space>& g = t == tables_.roles.wide ? wide_grads_ : deep_grads_;
    aggregate_gradients(space_, batch, combiner::sum, d_out, config_.tables[t].dim, g);
    apply_optimizer(space_, config_.tables[t].optimizer, c.rows(), c.row_width(), g, step);
    std::size_t rows = 0;
    for (std::size_t i = 0; i < g.size; ++i) {
      const float* row = c.rows() + std::size_t(g.rows.data()[i]) * c.row_width();
      if (count_non_finite(row, c.row_width()) > 0) ++rows;
    }
    if (rows) {
      *bad = {config_.tables[t].name, rows};
      return {};
    }
    c.mark_updated(g.rows.data(), g.size);
    return {};
  }

  slot_batch wide_batch_, deep_batch_;
  sparse_gradients<host_space> wide_grads_, deep_grads_;
};

// Keyset mode: one begin_pass per shard with the shard's keysets; a batch key outside them is
// an error, never a fetch.
class keyset_path final : public cache_path {
 public:
  using cache_path::cache_path;

  status begin_shard(const std::string& shard, const std::string& upcoming) override {
    return swapper_.begin_shard(cache(), shard, upcoming, activity_);
  }

 protected:
  status find_slots(const batch_keys& k) override {
    const std::size_t nw = k.batch_size * k.wide_slots, nd = k.batch_size * k.deep_slots;
    EMBCACHE_RETURN_IF_ERROR(
        cache().cache(tables_.roles.wide).lookup_slots(k.wide, nw, wide_slots_.data()));
    EMBCACHE_RETURN_IF_ERROR(
        cache().cache(tables_.roles.deep).lookup_slots(k.deep, nd, deep_slots_.data()));
    for (std::size_t i = 0; i < nw; ++i)
      if (wide_slots_[i] < 0)
        return status::not_found("key " + std::to_string(k.wide[i]) +
                                 " of the batch is not in the shard's keyset (table wide)");
    for (std::size_t i = 0; i < nd; ++i)
      if (deep_slots_[i] < 0)
        return status::not_found("key " + std::to_string(k.deep[i]) +
                                 " of the batch is not in the shard's keyset (table deep)");
    return {};
  }

 private:
  keyset_swapper swapper_{config_, tables_.roles};
};

// On-demand mode: each batch's lookup fetches its misses and writes back the victims; the time
// that takes is time the step waited.
class on_demand_path final : public cache_path {
 public:
  using cache_path::cache_path;

 protected:
  status find_slots(const batch_keys& k) override {
    EMBCACHE_RETURN_IF_ERROR(lookup(tables_.roles.wide, k.wide, k.batch_size * k.wide_slots,
                                    wide_slots_.data(), "table wide"));
    return lookup(tables_.roles.deep, k.deep, k.batch_size * k.deep_slots, deep_slots_.data(),
                  "table deep");
  }

 private:
  status lookup(std::size_t t, const trainer_key* keys, std::size_t n, std::int64_t* slots,
                const char* what) {
    EMBCACHE_RETURN_IF_ERROR(cache().lookup(t, keys, n, slots).with_context(what));
    const table_counters& last = counters().last[t];  // this lookup's, of this table only
    add_lookups(last);
    activity_.blocked_seconds += last.seconds_swap_in + last.seconds_write_back;
    return {};
  }
};

}  // namespace

std::unique_ptr<embedding_path> make_cache_path(const trainer_config& config, host_space space,
                                                embedding_tables tables) {
  if (config.mode == trainer_mode::on_demand)
    return std::make_unique<on_demand_path>(config, space, std::move(tables));
  return std::make_unique<keyset_path>(config, space, std::move(tables));
}

}  // namespace embcache::detail
