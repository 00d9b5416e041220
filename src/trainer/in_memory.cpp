// The in-memory Wide&Deep training loop.
#include "embcache/trainer/in_memory.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <unordered_map>

#include "embcache/criteo.hpp"
#include "embcache/detail/hash.hpp"
#include "embcache/sparse_ops.hpp"
#include "embcache/trainer/criteo_model.hpp"
#include "embcache/trainer/detail/dense_kernels.hpp"
#include "embcache/trainer/metrics.hpp"

namespace embcache {
namespace {

// A table of rows [w (dim) | optimizer state], grown as keys arrive.
class plain_table {
 public:
  plain_table(std::size_t dim, const optimizer_options& opt, std::uint64_t seed,
              std::uint64_t table_id, float init_range)
      : dim_(dim),
        width_(dim + state_width(opt.kind, dim)),
        opt_(opt),
        seed_(seed),
        table_id_(table_id),
        range_(init_range) {}

  std::int64_t row_of(std::int64_t key) {
    auto [it, inserted] = index_.try_emplace(key, std::int64_t(keys_.size()));
    if (inserted) {
      keys_.push_back(key);
      rows_.resize(rows_.size() + width_);
      float* r = rows_.data() + (rows_.size() - width_);
      for (std::size_t d = 0; d < dim_; ++d) {
        const std::uint64_t h = detail::splitmix64_finalize(
            detail::splitmix64_finalize(detail::splitmix64_finalize(seed_ ^ table_id_) ^
                                        std::uint64_t(key)) ^
            d);
        const double u = double(h >> 11) * (1.0 / 9007199254740992.0);
        r[d] = float((2.0 * u - 1.0) * range_);
      }
      initialize_state(opt_, dim_, r + dim_);
    }
    return it->second;
  }

  std::uint64_t digest() const {
    std::vector<std::size_t> order(keys_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return keys_[a] < keys_[b]; });
    XXH64_state_t* st = XXH64_createState();
    XXH64_reset(st, table_id_);
    for (std::size_t i : order) {
      XXH64_update(st, &keys_[i], sizeof(std::int64_t));
      XXH64_update(st, rows_.data() + i * width_, width_ * sizeof(float));
    }
    const std::uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
  }

  float* rows() noexcept { return rows_.data(); }
  std::size_t width() const noexcept { return width_; }
  std::size_t size() const noexcept { return keys_.size(); }

 private:
  std::size_t dim_, width_;
  optimizer_options opt_;
  std::uint64_t seed_, table_id_;
  float range_;
  std::unordered_map<std::int64_t, std::int64_t> index_;
  std::vector<std::int64_t> keys_;
  std::vector<float> rows_;
};

// Inputs of one batch: row indices per bag (one-hot) and the pooled embeddings.
struct batch_inputs {
  std::vector<std::int64_t> wide_offsets, wide_rows, deep_offsets, deep_rows;
  std::vector<float> wide, deep, dense, labels;
  slot_batch wide_batch, deep_batch;
};

void gather(const std::vector<criteo_sample>& samples, std::size_t begin, std::size_t n,
            bool crossed, plain_table& wide, plain_table& deep, std::size_t deep_dim,
            const host_space& space, batch_inputs& in) {
  const std::size_t ws = criteo_slot_count + (crossed ? criteo_cross_count : 0);
  const std::size_t ds = criteo_slot_count;
  in.wide_rows.resize(n * ws);
  in.deep_rows.resize(n * ds);
  in.dense.resize(n * criteo_dense_count);
  in.labels.resize(n);
  std::int64_t cross[criteo_cross_count];
  for (std::size_t b = 0; b < n; ++b) {
    const criteo_sample& s = samples[begin + b];
    in.labels[b] = s.label;
    std::copy(s.dense.begin(), s.dense.end(), in.dense.begin() + b * criteo_dense_count);
    for (std::size_t k = 0; k < ds; ++k) {
      in.deep_rows[b * ds + k] = deep.row_of(s.keys[k]);
      in.wide_rows[b * ws + k] = wide.row_of(s.keys[k]);
    }
    if (crossed) {
      criteo_cross_keys(s.keys.data(), cross);
      for (std::size_t k = 0; k < criteo_cross_count; ++k)
        in.wide_rows[b * ws + ds + k] = wide.row_of(cross[k]);
    }
  }
  in.wide_offsets.resize(n * ws + 1);
  in.deep_offsets.resize(n * ds + 1);
  for (std::size_t i = 0; i < in.wide_offsets.size(); ++i) in.wide_offsets[i] = std::int64_t(i);
  for (std::size_t i = 0; i < in.deep_offsets.size(); ++i) in.deep_offsets[i] = std::int64_t(i);
  in.wide_batch = {n, ws, in.wide_offsets.data(), in.wide_rows.data(), n * ws};
  in.deep_batch = {n, ds, in.deep_offsets.data(), in.deep_rows.data(), n * ds};
  in.wide.resize(n * ws);
  in.deep.resize(n * ds * deep_dim);
  lookup_combine(space, wide.rows(), wide.width(), 1, in.wide_batch, combiner::sum, in.wide.data());
  lookup_combine(space, deep.rows(), deep.width(), deep_dim, in.deep_batch, combiner::sum,
                 in.deep.data());
}

}  // namespace

result<in_memory_result> train_wide_deep_in_memory(const std::vector<criteo_sample>& train,
                                                   const std::vector<criteo_sample>& eval,
                                                   const in_memory_options& options) {
  if (options.batch_size == 0)
    return status::invalid_argument("in_memory_options.batch_size is 0, expected > 0");
  EMBCACHE_RETURN_IF_ERROR(
      check_options(options.wide_optimizer).with_context("in_memory_options.wide_optimizer"));
  EMBCACHE_RETURN_IF_ERROR(
      check_options(options.deep_optimizer).with_context("in_memory_options.deep_optimizer"));
  const wide_deep_options mo =
      criteo_model_shape(options.model, options.crossed, options.model.deep_dim);
  EMBCACHE_RETURN_IF_ERROR(check_options(mlp_options(mo)).with_context("in_memory_options.model"));
  const std::size_t dim = mo.deep_dim;
  const host_space& space = options.space;

  plain_table wide(1, options.wide_optimizer, options.seed, 1, 0.0f);
  plain_table deep(dim, options.deep_optimizer, options.seed, 2, options.deep_init_range);
  wide_deep_model<host_space> model(mo, space);
  batch_inputs in;
  std::vector<float> d_wide, d_deep;
  sparse_gradients<host_space> wide_grads, deep_grads;
  in_memory_result out;

  for (std::size_t epoch = 0; epoch < options.epochs; ++epoch) {
    double loss_sum = 0;
    std::size_t batches = 0;
    for (std::size_t begin = 0; begin < train.size(); begin += options.batch_size) {
      const std::size_t n = std::min(options.batch_size, train.size() - begin);
      gather(train, begin, n, options.crossed, wide, deep, dim, space, in);
      d_wide.resize(in.wide.size());
      d_deep.resize(in.deep.size());
      const wide_deep_batch batch{n, in.wide.data(), in.deep.data(), in.dense.data(),
                                  in.labels.data()};
      loss_sum += model.forward_backward(batch, out.steps, d_wide.data(), d_deep.data());
      ++batches;
      ++out.steps;
      aggregate_gradients(space, in.wide_batch, combiner::sum, d_wide.data(), 1, wide_grads);
      apply_optimizer(space, options.wide_optimizer, wide.rows(), wide.width(), wide_grads,
                      out.steps);
      aggregate_gradients(space, in.deep_batch, combiner::sum, d_deep.data(), dim, deep_grads);
      apply_optimizer(space, options.deep_optimizer, deep.rows(), deep.width(), deep_grads,
                      out.steps);
      model.apply_dense_update();
    }
    out.train_loss = batches ? loss_sum / double(batches) : 0.0;
  }

  metric_accumulator metrics;
  std::vector<float> logits;
  for (std::size_t begin = 0; begin < eval.size(); begin += options.batch_size) {
    const std::size_t n = std::min(options.batch_size, eval.size() - begin);
    gather(eval, begin, n, options.crossed, wide, deep, dim, space, in);
    model.predict({n, in.wide.data(), in.deep.data(), in.dense.data(), nullptr}, logits);
    for (std::size_t b = 0; b < n; ++b) out.eval_logits.push_back(logits[b]);
    metrics.add(logits.data(), in.labels.data(), n);
  }
  out.eval_auc = metrics.auc();
  out.eval_logloss = metrics.log_loss();
  out.dense = model.save();
  out.embedding_digest = wide.digest() ^ (deep.digest() * 0x9e3779b97f4a7c15ull);
  out.wide_rows = wide.size();
  out.deep_rows = deep.size();
  return out;
}

}  // namespace embcache
