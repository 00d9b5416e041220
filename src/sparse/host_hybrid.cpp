// The host-hybrid path: the host-space sparse ops run on rows pulled from a parameter store.
#include "embcache/host_hybrid.hpp"

#include <string>
#include <utility>

#include "embcache/detail/host_algorithms.hpp"
#include "embcache/detail/optimizers.inl"
#include "embcache/detail/sparse_ops.inl"

namespace embcache {
namespace {

template <class Key>
struct init_missing_fn {
  const Key* keys;
  const bool* found;
  float* rows;
  std::size_t row_width;
  std::size_t dim;
  const float* state;  // initial state of one row
  std::size_t state_floats;
  const embedding_initializer<Key>* init;
  std::uint64_t seed;
  float scale;

  void operator()(std::size_t i) const {
    if (found[i]) return;
    float* row = rows + i * row_width;
    if (*init) {
      (*init)(keys[i], row, dim);
    } else {
      for (std::size_t d = 0; d < dim; ++d)
        row[d] = default_embedding_value(seed, static_cast<std::uint64_t>(keys[i]), d, scale);
    }
    for (std::size_t j = 0; j < state_floats; ++j) row[dim + j] = state[j];
    // Floats past the optimizer state (padding a store may carry) start at zero.
    for (std::size_t j = dim + state_floats; j < row_width; ++j) row[j] = 0.0f;
  }
};

// Re-expresses occurrence i's row through `rows_of` (a unique key's kept row, or -1).
struct remap_rows_fn {
  std::int64_t* occurrence_rows;
  const std::int64_t* rows_of;

  void operator()(std::size_t i) const {
    occurrence_rows[i] = rows_of[std::size_t(occurrence_rows[i])];
  }
};

template <class Key>
status check_key_batch(const key_batch<Key>& batch) {
  const std::size_t bags = batch.num_bags();
  if (bags == 0) {
    if (batch.num_keys != 0)
      return status::invalid_argument("key batch without bags has " +
                                      std::to_string(batch.num_keys) + " keys");
    return {};
  }
  if (batch.offsets == nullptr)
    return status::invalid_argument("key batch of " + std::to_string(bags) +
                                    " bags has no offsets");
  if (batch.offsets[0] != 0)
    return status::invalid_argument("key batch: offsets[0] is " + std::to_string(batch.offsets[0]) +
                                    ", expected 0");
  for (std::size_t b = 0; b < bags; ++b) {
    if (batch.offsets[b + 1] < batch.offsets[b])
      return status::invalid_argument("key batch: offsets decrease at bag " + std::to_string(b) +
                                      " (sample " + std::to_string(b / batch.num_slots) +
                                      ", slot " + std::to_string(b % batch.num_slots) +
                                      "): " + std::to_string(batch.offsets[b]) + " then " +
                                      std::to_string(batch.offsets[b + 1]));
  }
  if (static_cast<std::size_t>(batch.offsets[bags]) != batch.num_keys)
    return status::invalid_argument("key batch: offsets end at " +
                                    std::to_string(batch.offsets[bags]) + ", expected num_keys " +
                                    std::to_string(batch.num_keys));
  if (batch.num_keys > 0 && batch.keys == nullptr)
    return status::invalid_argument("key batch of " + std::to_string(batch.num_keys) +
                                    " occurrences has no keys");
  return {};
}

}  // namespace

template <class Key>
host_hybrid_table<Key>::host_hybrid_table(param_store<Key>& store,
                                          const host_hybrid_options& options,
                                          embedding_initializer<Key> init)
    : store_(store),
      options_(options),
      init_(std::move(init)),
      row_width_(options.dim + state_width(options.optimizer.kind, options.dim)) {
  if (options.dim == 0) throw error(status_code::invalid_argument, "host_hybrid_table: dim is 0");
  if (store.row_width() < row_width_)
    throw error(status_code::invalid_argument,
                "host_hybrid_table: store '" + store.table_name() + "' has rows of " +
                    std::to_string(store.row_width()) + " floats, " +
                    to_string(options.optimizer.kind) + " with dim " + std::to_string(options.dim) +
                    " needs " + std::to_string(row_width_));
  row_width_ = store.row_width();
  check_options(options.optimizer).with_context("host_hybrid_table").throw_if_error();
}

template <class Key>
status host_hybrid_table<Key>::forward(const key_batch<Key>& batch, float* out, const Key* refused,
                                       std::size_t num_refused, const float* default_rows) {
  pending_ = false;
  EMBCACHE_RETURN_IF_ERROR(check_key_batch(batch).with_context("host_hybrid_table::forward"));
  if (num_refused > 0 && refused == nullptr)
    return status::invalid_argument("host_hybrid_table::forward: " + std::to_string(num_refused) +
                                    " refused keys given without their array");
  const host_space space{options_.max_threads};
  const std::size_t n = batch.num_keys;
  const std::size_t bags = batch.num_bags();
  batch_size_ = batch.batch_size;
  num_slots_ = batch.num_slots;
  offsets_.assign(batch.offsets, batch.offsets + (bags > 0 ? bags + 1 : 0));
  occurrence_rows_.resize(n);
  std::size_t m = grouping_.group(space, batch.keys, n, unique_keys_, occurrence_rows_.data());
  if (num_refused > 0) {
    // Both ascending: one merge leaves the refused keys out of the rows, their occurrences at -1.
    kept_rows_.resize(m);
    std::size_t kept = 0, r = 0;
    for (std::size_t i = 0; i < m; ++i) {
      const Key k = unique_keys_[i];
      while (r < num_refused && refused[r] < k) ++r;
      if (r < num_refused && refused[r] == k) {
        kept_rows_[i] = -1;
      } else {
        kept_rows_[i] = std::int64_t(kept);
        unique_keys_[kept++] = k;
      }
    }
    if (kept < m) {
      unique_keys_.resize(kept);
      detail::for_each_index(space, n, remap_rows_fn{occurrence_rows_.data(), kept_rows_.data()});
      m = kept;
    }
  }

  rows_.resize(m * row_width_);
  if (found_.size() < m) found_ = buffer<bool, host_space>(m);
  EMBCACHE_RETURN_IF_ERROR(
      store_.pull(unique_keys_.data(), m, rows_.data(), found_.data())
          .with_context("host_hybrid_table::forward: pull from '" + store_.table_name() + "'"));
  std::vector<float> state(state_width(options_.optimizer.kind, options_.dim));
  initialize_state(options_.optimizer, options_.dim, state.data());
  detail::for_each_index(space, m,
                         init_missing_fn<Key>{unique_keys_.data(), found_.data(), rows_.data(),
                                              row_width_, options_.dim, state.data(), state.size(),
                                              &init_, options_.init_seed, options_.init_scale});

  const slot_batch local{batch_size_, num_slots_, offsets_.data(), occurrence_rows_.data(), n};
  if (bags > 0)
    lookup_combine(space, rows_.data(), row_width_, options_.dim, local, options_.comb, out,
                   num_refused > 0 ? default_rows : nullptr);
  pending_ = true;
  return {};
}

template <class Key>
status host_hybrid_table<Key>::backward(const float* d_out) {
  if (!pending_)
    throw error(status_code::invalid_argument,
                "host_hybrid_table::backward on '" + store_.table_name() +
                    "' without a forward() since the last backward()");
  pending_ = false;
  const host_space space{options_.max_threads};
  const slot_batch local{batch_size_, num_slots_, offsets_.data(), occurrence_rows_.data(),
                         occurrence_rows_.size()};
  aggregate_gradients(space, local, options_.comb, d_out, options_.dim, grads_);
  ++step_;
  apply_optimizer(space, options_.optimizer, rows_.data(), row_width_, grads_, step_);
  const std::size_t m = unique_keys_.size();
  const std::uint64_t* versions = nullptr;
  if (version_floor_ > store_.max_version()) {
    versions_.assign(m, version_floor_ + 1);
    versions = versions_.data();
  }
  return store_.push(unique_keys_.data(), m, rows_.data(), versions)
      .with_context("host_hybrid_table::backward: push to '" + store_.table_name() + "'");
}

template class host_hybrid_table<std::int64_t>;
template class host_hybrid_table<std::uint64_t>;
template class host_hybrid_table<std::uint32_t>;

}  // namespace embcache
