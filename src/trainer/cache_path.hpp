// The embedding path through the training cache, written once for both spaces: every lookup and
// sparse update hits the cache's rows, in the memory of the cache's space. Keyset mode swaps once
// per shard (its keyset read from the files beside it, the next shard's staged meanwhile);
// on-demand mode fetches each batch's misses.
//
// The loop hands the path host arrays (keys, pooled outputs, their gradients) through forward
// and backward. In the host space the sparse ops use them in place, so that path is today's, bit
// for bit. In the cuda space what crosses PCIe per step depends on the dense network:
//   - on the device too (dense_backend::takes_device_inputs): the loop calls forward_in_space and
//     backward_in_space instead, and the pooled embeddings and their gradients stay in the path's
//     device arrays (pooled_, d_pooled_), read and written there by the dense backend. Only the
//     batch's keys (keyset mode) or slots (on-demand mode, whose lookup runs on the host) go to
//     the device, the dense backend copies the dense features (the labels stay on the host, where
//     the model computes the loss from its logits and the wide slots' sum, wide_deep.hpp), and the
//     gradients' non-finite count comes back;
//   - on the host: the keys or slots go to the device, the pooled embeddings come back to the
//     host for the dense backend, and their gradients go to the device for the sparse update.
// Everything else (rows, gradients per row, optimizer state) stays on the device. Both ways run
// the same sparse ops on the same values, so they give the same bits.
//
// Included by the translation units that instantiate it (cache_path.cpp for the host,
// cache_path.cu for the cuda space); it brings their space's primitives itself
// (detail/space_algorithms.hpp), so nothing has to come before it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "embcache/buffer.hpp"
#include "embcache/detail/config.hpp"
#include "embcache/detail/space_algorithms.hpp"  // before the definitions: see that header
#include "embcache/optimizers.hpp"
#include "embcache/sparse_ops.hpp"
#include "embedding_path.hpp"

namespace embcache::detail {

// Whether a float is neither infinite nor NaN.
EMBCACHE_HD inline bool finite_float(float x) {
#if EMBCACHE_ON_DEVICE
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// flags[i] = 1 when x[i] is infinite or NaN, else 0.
struct flag_non_finite_fn {
  const float* x;
  std::int8_t* flags;

  EMBCACHE_HD void operator()(std::size_t i) const { flags[i] = finite_float(x[i]) ? 0 : 1; }
};

// An array the sparse ops use in the space's memory while the loop has it in host memory. In the
// host space it is the host array itself (nothing is copied); in the cuda space a device buffer
// kept from batch to batch, so that steady-state batches allocate nothing. Or an array that lives
// in the space only (own), for a loop that leaves it there.
template <class T, class Space>
class space_array {
 public:
  // Room for n elements in the space's memory, its own buffer in either space.
  T* own(std::size_t n, const Space& space) {
    reserve(n, space);
    return buf_.data();
  }
  // `host` (n elements) in the space's memory.
  const T* from_host(const T* host, std::size_t n, const Space& space) {
    if constexpr (is_host_space_v<Space>) {
      return host;
    } else {
      reserve(n, space);
      buf_.copy_from_host(host, n);
      return buf_.data();
    }
  }
  // Room for n elements written in the space, to be brought to `host` by to_host().
  T* room_for(T* host, std::size_t n, const Space& space) {
    if constexpr (is_host_space_v<Space>) {
      return host;
    } else {
      reserve(n, space);
      return buf_.data();
    }
  }
  // Copies the n elements written into room_for() to `host` (synchronizes the space's stream).
  void to_host(T* host, std::size_t n) const {
    if constexpr (!is_host_space_v<Space>) buf_.copy_to_host(host, n);
  }
  // How many elements the space holds (the cuda space: the buffer's size).
  std::size_t size() const noexcept { return buf_.size(); }

 private:
  void reserve(std::size_t n, const Space& space) {
    if (buf_.size() < n) buf_ = buffer<T, Space>(n, space);
  }
  buffer<T, Space> buf_;
};

// What both cache modes share: pooling from the cache's rows, the in-row optimizers, reads,
// export, save and load. A mode says how a batch's keys become slots (in the space's memory) and
// what a shard needs.
template <class Space>
class cache_path : public embedding_path {
 public:
  using cache_type = training_cache<trainer_key, Space>;

  cache_path(const trainer_config& config, Space space, cache_tables<Space> tables)
      : config_(config), space_(space), tables_(std::move(tables)) {}

  status begin_shard(const std::string&, const std::string&) override { return {}; }

  // Expiry's ttl_steps: each step's clock (nothing when no table has it).
  status begin_step() override {
    for (const auto& tc : config_.tables) {
      if (tc.expiry.ttl_steps != 0) {
        cache().begin_step();
        break;
      }
    }
    return {};
  }

  status forward(const batch_keys& k, float* wide_out, float* deep_out) override {
    const std::size_t n = k.batch_size, ws = k.wide_slots, ds = k.deep_slots;
    const std::size_t dim = config_.tables[tables_.roles.deep].dim;
    float* wide = pooled_[0].room_for(wide_out, n * ws, space_);
    float* deep = pooled_[1].room_for(deep_out, n * ds * dim, space_);
    in_space_ = {};
    EMBCACHE_RETURN_IF_ERROR(pool(k, wide, deep));
    pooled_[0].to_host(wide_out, n * ws);
    pooled_[1].to_host(deep_out, n * ds * dim);
    return {};
  }

  status backward(const float* d_wide, const float* d_deep, std::uint64_t step,
                  non_finite_rows* bad) override {
    const std::size_t dim = config_.tables[tables_.roles.deep].dim;
    const float* dw = d_pooled_[0].from_host(d_wide, wide_batch_.num_bags(), space_);
    const float* dd = d_pooled_[1].from_host(d_deep, deep_batch_.num_bags() * dim, space_);
    return update_both(dw, dd, step, bad);
  }

  bool pools_on_device() const noexcept override { return is_cuda_space_v<Space>; }

  result<space_pooled> forward_in_space(const batch_keys& k) override {
    const std::size_t n = k.batch_size, ws = k.wide_slots, ds = k.deep_slots;
    const std::size_t dim = config_.tables[tables_.roles.deep].dim;
    float* wide = pooled_[0].own(n * ws, space_);
    float* deep = pooled_[1].own(n * ds * dim, space_);
    in_space_ = {};
    EMBCACHE_RETURN_IF_ERROR(pool(k, wide, deep));
    // The dense backend may read them on another stream.
    detail::synchronize(space_);
    in_space_ = {wide, deep, d_pooled_[0].own(n * ws, space_),
                 d_pooled_[1].own(n * ds * dim, space_)};
    return in_space_;
  }

  result<std::size_t> non_finite_gradients_in_space() override {
    if (in_space_.d_wide == nullptr) return no_forward_in_space();
    const std::size_t dim = config_.tables[tables_.roles.deep].dim;
    return count_non_finite_in_space(in_space_.d_wide, wide_batch_.num_bags()) +
           count_non_finite_in_space(in_space_.d_deep, deep_batch_.num_bags() * dim);
  }

  status backward_in_space(std::uint64_t step, non_finite_rows* bad) override {
    if (in_space_.d_wide == nullptr) return no_forward_in_space();
    return update_both(in_space_.d_wide, in_space_.d_deep, step, bad);
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
  status load_sparse(const std::string& dir, const load_options& options) override {
    return cache().load(dir, options);
  }
  void set_step(std::uint64_t) override {}  // the trainer hands each update its step
  const char* device() const noexcept override { return space_name<Space>(); }
  training_cache<trainer_key>* host_cache() override {
    if constexpr (is_host_space_v<Space>)
      return tables_.cache.get();
    else
      return nullptr;
  }
  training_cache<trainer_key, cuda_space>* cuda_cache() override {
    if constexpr (is_cuda_space_v<Space>)
      return tables_.cache.get();
    else
      return nullptr;
  }

 protected:
  // The slots of the batch's keys, in the space's memory, into slots_[0] (wide) and slots_[1]
  // (deep).
  virtual status find_slots(const batch_keys& k) = 0;

  cache_type& cache() { return *tables_.cache; }

  void add_lookups(const table_counters& c) {
    activity_.hits += c.hits;
    activity_.misses += c.misses;
  }

  const trainer_config config_;
  Space space_;
  cache_tables<Space> tables_;
  // The batch's slots in the space's memory (wide, deep), found by find_slots.
  const std::int64_t* slots_[2] = {nullptr, nullptr};
  path_activity activity_;

 private:
  // Pools the batch's rows into `wide` and `deep` (in the space's memory) and keeps the batch's
  // bags for the sparse update.
  status pool(const batch_keys& k, float* wide, float* deep) {
    const std::size_t n = k.batch_size, ws = k.wide_slots, ds = k.deep_slots;
    const std::size_t dim = config_.tables[tables_.roles.deep].dim;
    EMBCACHE_RETURN_IF_ERROR(find_slots(k));
    // One-hot bags: the offsets are 0, 1, 2, ... in every batch, so the space keeps the longest
    // prefix it was given and takes more only when a batch needs more.
    const std::size_t bags = n * std::max(ws, ds) + 1;
    if constexpr (is_host_space_v<Space>) {
      offsets_ = k.offsets;
    } else if (offsets_ == nullptr || offsets_buf_.size() < bags) {
      offsets_ = offsets_buf_.from_host(k.offsets, bags, space_);
    }
    wide_batch_ = {n, ws, offsets_, slots_[0], n * ws};
    deep_batch_ = {n, ds, offsets_, slots_[1], n * ds};
    auto& wc = cache().cache(tables_.roles.wide);
    auto& dc = cache().cache(tables_.roles.deep);
    // The same bags over the rows the slots hold (the slots themselves without spare rows).
    slot_batch wide_rows = wide_batch_, deep_rows = deep_batch_;
    wide_rows.row_indices = batch_rows_[0].of(wc, slots_[0], n * ws, space_);
    deep_rows.row_indices = batch_rows_[1].of(dc, slots_[1], n * ds, space_);
    lookup_combine(space_, wc.row_pool(), wc.row_width(), 1, wide_rows, combiner::sum, wide,
                   default_rows(0, ws));
    lookup_combine(space_, dc.row_pool(), dc.row_width(), dim, deep_rows, combiner::sum, deep,
                   default_rows(1, ds));
    return {};
  }

  // What the refused keys (slot -1) of table `which` (0 wide, 1 deep) read: nullptr for zeros,
  // else the default rows of its `num_slots` slots in the space, drawn when the count changes.
  const float* default_rows(int which, std::size_t num_slots) {
    const std::size_t t = which == 0 ? tables_.roles.wide : tables_.roles.deep;
    const admission_options& a = config_.tables[t].admission;
    if (!a.enabled() || a.default_row != refused_row::slot) return nullptr;
    if (default_slots_[which] != num_slots || default_at_[which] == nullptr) {
      const std::size_t dim = config_.tables[t].dim;
      std::vector<float>& host = default_host_[which];
      host.resize(num_slots * dim);
      for (std::size_t s = 0; s < num_slots; ++s) cache().default_row(t, s, host.data() + s * dim);
      default_at_[which] = default_space_[which].from_host(host.data(), host.size(), space_);
      default_slots_[which] = num_slots;
    }
    return default_at_[which];
  }

  // Both tables' sparse updates with the gradients of the last pooling (in the space's memory):
  // wide, then deep, stopping at the first table whose rows come out non-finite.
  status update_both(const float* d_wide, const float* d_deep, std::uint64_t step,
                     non_finite_rows* bad) {
    EMBCACHE_RETURN_IF_ERROR(
        update(tables_.roles.wide, wide_batch_, d_wide, step, wide_grads_, bad));
    if (bad->rows) return {};
    return update(tables_.roles.deep, deep_batch_, d_deep, step, deep_grads_, bad);
  }

  // The non-finite floats among n at `x` in the space's memory.
  std::size_t count_non_finite_in_space(const float* x, std::size_t n) {
    std::int8_t* f = flags(n);
    for_each_index(space_, n, flag_non_finite_fn{x, f});
    return count_equal(space_, f, n, std::int8_t{1});
  }

  // Room for n flags in the space, kept from batch to batch.
  std::int8_t* flags(std::size_t n) {
    if (flags_.size() < n) flags_ = buffer<std::int8_t, Space>(n, space_);
    return flags_.data();
  }

  static status no_forward_in_space() {
    return status::invalid_argument(
        "embedding path: the gradients in the space are asked for without a forward_in_space "
        "since the last forward");
  }

  // One table's sparse update: gradients per unique slot, the optimizer in the slots' rows, then
  // the rows checked (no non-finite row may reach a store, an export or a save) and the slots
  // marked dirty.
  status update(std::size_t t, const slot_batch& batch, const float* d_out, std::uint64_t step,
                sparse_gradients<Space>& g, non_finite_rows* bad) {
    auto& c = cache().cache(t);
    aggregate_gradients(space_, batch, combiner::sum, d_out, config_.tables[t].dim, g);
    std::int8_t* f = flags(g.size);
    apply_optimizer(space_, config_.tables[t].optimizer, c.row_pool(), c.row_width(), g.dim,
                    updated_rows_.of(c, g.rows.data(), g.size, space_), g.values.data(), g.size,
                    step, f);
    if (const std::size_t rows = count_equal(space_, f, g.size, std::int8_t{1})) {
      *bad = {config_.tables[t].name, rows};
      return {};
    }
    c.mark_updated(g.rows.data(), g.size);
    return {};
  }

  const std::int64_t* offsets_ = nullptr;
  space_array<std::int64_t, Space> offsets_buf_;
  // Wide, deep: the host arrays' twins (forward, backward) or the only copies (*_in_space).
  space_array<float, Space> pooled_[2], d_pooled_[2];
  space_pooled in_space_;  // what the last forward_in_space handed out (none: all null)
  slot_batch wide_batch_, deep_batch_;  // over the slots (their rows: batch_rows_)
  slot_rows<trainer_key, Space> batch_rows_[2], updated_rows_;
  sparse_gradients<Space> wide_grads_, deep_grads_;
  buffer<std::int8_t, Space> flags_;
  // Wide, deep: the default rows of refused keys (admission's default_row "slot").
  std::vector<float> default_host_[2];
  space_array<float, Space> default_space_[2];
  const float* default_at_[2] = {nullptr, nullptr};
  std::size_t default_slots_[2] = {0, 0};
};

// Keyset mode: one begin_pass per shard with the shard's keysets; a batch key outside them is
// an error, never a fetch. The keys go to the space and the device table finds their slots there.
template <class Space>
class keyset_path final : public cache_path<Space> {
  using base = cache_path<Space>;

 public:
  using base::base;

  status begin_shard(const std::string& shard, const std::string& upcoming) override {
    return swapper_.begin_shard(this->cache(), shard, upcoming, this->activity_);
  }

 protected:
  status find_slots(const batch_keys& k) override {
    EMBCACHE_RETURN_IF_ERROR(lookup(0, k.wide, k.batch_size * k.wide_slots, "table wide"));
    return lookup(1, k.deep, k.batch_size * k.deep_slots, "table deep");
  }

 private:
  status lookup(int which, const trainer_key* keys, std::size_t n, const char* what) {
    const std::size_t t = which == 0 ? this->tables_.roles.wide : this->tables_.roles.deep;
    host_slots_[which].resize(n);
    std::int64_t* slots = found_[which].room_for(host_slots_[which].data(), n, this->space_);
    EMBCACHE_RETURN_IF_ERROR(this->cache().cache(t).lookup_slots(
        keys_[which].from_host(keys, n, this->space_), n, slots));
    this->slots_[which] = slots;
    // Keys that admission refused have no row: slot -1, which the sparse ops read as zeros or
    // as their slot's default row.
    if (this->config_.tables[t].admission.enabled()) return {};
    if (count_equal(this->space_, static_cast<const std::int64_t*>(slots), n, std::int64_t{-1}) ==
        0)
      return {};
    found_[which].to_host(host_slots_[which].data(), n);  // only to name the first such key
    std::size_t i = 0;
    while (i + 1 < n && host_slots_[which][i] >= 0) ++i;
    return status::not_found("key " + std::to_string(keys[i]) +
                             " of the batch is not in the shard's keyset (" + what + ")");
  }

  keyset_swapper swapper_{this->config_, this->tables_.roles};
  space_array<trainer_key, Space> keys_[2];
  space_array<std::int64_t, Space> found_[2];  // the slots lookup_slots wrote, in the space
  std::vector<std::int64_t> host_slots_[2];
};

// On-demand mode: each batch's lookup (on the host) fetches its misses and writes back the
// victims; the time that takes is time the step waited. Its slots then go to the space.
template <class Space>
class on_demand_path final : public cache_path<Space> {
  using base = cache_path<Space>;

 public:
  using base::base;

  // Each shard's start is a pass boundary of expiry (keyset mode's begin_pass is one too).
  status begin_shard(const std::string&, const std::string&) override {
    return this->cache().expire();
  }

 protected:
  status find_slots(const batch_keys& k) override {
    EMBCACHE_RETURN_IF_ERROR(
        lookup(0, this->tables_.roles.wide, k.wide, k.batch_size * k.wide_slots, "table wide"));
    return lookup(1, this->tables_.roles.deep, k.deep, k.batch_size * k.deep_slots, "table deep");
  }

 private:
  status lookup(int which, std::size_t t, const trainer_key* keys, std::size_t n,
                const char* what) {
    host_slots_[which].resize(n);
    EMBCACHE_RETURN_IF_ERROR(
        this->cache().lookup(t, keys, n, host_slots_[which].data()).with_context(what));
    const table_counters& last = this->counters().last[t];  // this lookup's, of this table only
    this->add_lookups(last);
    this->activity_.blocked_seconds += last.seconds_swap_in + last.seconds_write_back;
    this->slots_[which] = in_space_[which].from_host(host_slots_[which].data(), n, this->space_);
    return {};
  }

  space_array<std::int64_t, Space> in_space_[2];  // the slots in the space
  std::vector<std::int64_t> host_slots_[2];
};

// The training-cache path of config.mode (keyset or on_demand) over `tables`, in `space`.
template <class Space>
std::unique_ptr<embedding_path> make_cache_path_in(const trainer_config& config, Space space,
                                                   cache_tables<Space> tables) {
  if (config.mode == trainer_mode::on_demand)
    return std::make_unique<on_demand_path<Space>>(config, space, std::move(tables));
  return std::make_unique<keyset_path<Space>>(config, space, std::move(tables));
}

}  // namespace embcache::detail
