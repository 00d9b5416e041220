// Lookup-only scoring: the trainer's evaluation with the embeddings of a serving store. The same
// batches, pooling and dense forward as trainer::evaluate, so equal rows give equal bits.
#include "embcache/trainer/score.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/durable_file.hpp"
#include "embcache/criteo.hpp"
#include "embcache/shard.hpp"
#include "embcache/trainer/criteo_model.hpp"
#include "embcache/trainer/dense_backend.hpp"
#include "embcache/trainer/metrics.hpp"
#include "embcache/trainer/trainer.hpp"

namespace embcache {

namespace {

// The save's configuration and its dense network, on the host.
struct saved_model {
  trainer_config config;
  std::unique_ptr<dense_backend> dense;
  std::string wide, deep;  // table names
  std::size_t deep_dim = 0;
};

result<saved_model> open_save(const std::string& save_dir) {
  const std::string state_path = save_dir + "/trainer.json";
  auto text = detail::read_file_bytes(state_path);
  if (!text.ok()) return text.get_status();
  const nlohmann::json state =
      nlohmann::json::parse(text.value().begin(), text.value().end(), nullptr, false);
  if (state.is_discarded() || !state.is_object() || state.value("format", "") != "embcache-trainer")
    return status::invalid_argument("'" + state_path + "' is not an embcache-trainer save");
  const auto cfg = state.find("config");
  if (cfg == state.end()) return status::corruption("'" + state_path + "' has no 'config'");
  auto config = trainer_config_from_json(*cfg);
  if (!config.ok()) return config.get_status().with_context(state_path);
  saved_model m;
  m.config = std::move(config).value();
  const trainer_config& c = m.config;
  for (const auto& t : c.tables) {
    if (t.name == "wide") m.wide = t.name;
    if (t.name == "deep") {
      m.deep = t.name;
      m.deep_dim = t.dim;
    }
  }
  if (m.wide.empty() || m.deep.empty())
    return status::invalid_argument("'" + state_path + "': tables 'wide' and 'deep' expected");
  const wide_deep_options mo =
      criteo_model_shape(c.model, c.crossed, m.deep_dim, c.num_dense, c.num_slots);
  try {
    m.dense = make_host_dense_backend(mo);
  } catch (const error& e) {
    return status(e.code(), state_path + ": " + e.what());
  }
  const std::string dense_path = save_dir + "/dense.bin";
  auto blob = detail::read_file_bytes(dense_path);
  if (!blob.ok()) return blob.get_status();
  EMBCACHE_RETURN_IF_ERROR(
      m.dense->load(reinterpret_cast<const std::uint8_t*>(blob.value().data()), blob.value().size())
          .with_context(dense_path));
  return m;
}

}  // namespace

result<score_metrics> score_shard(const std::string& save_dir, const std::string& shard,
                                  row_lookup& rows, const score_options& options) {
  auto opened = open_save(save_dir);
  if (!opened.ok()) return opened.get_status().with_context("score");
  saved_model& m = opened.value();
  const trainer_config& c = m.config;
  if (options.blas_threads < -1)
    return status::invalid_argument("score: score_options.blas_threads is " +
                                    std::to_string(options.blas_threads) + ", expected >= -1");
  set_host_blas_threads(options.blas_threads < 0 ? c.blas_threads : options.blas_threads);
  shard_reader_options ro;
  ro.batch_size = options.batch_size ? options.batch_size : c.batch_size;
  ro.read_ahead = false;
  ro.num_dense = c.num_dense;  // the save's dataset schema: a shard of another is refused
  ro.num_slots = c.num_slots;
  const std::size_t max_samples = options.max_samples ? options.max_samples : c.eval_max_samples;
  auto reader = shard_reader::open({shard}, ro);
  if (!reader.ok()) return reader.get_status().with_context("score");
  if (c.crossed && reader.value()->num_crossed() < criteo_cross_count)
    return status::invalid_argument("score: " + shard +
                                    " has no crossed keys, the model uses them");
  const std::size_t ws = model_wide_slots(c.num_slots, c.crossed);
  const std::size_t ds = c.num_slots, dim = m.deep_dim;
  metric_accumulator acc;
  shard_batch b;
  std::vector<std::int64_t> wide_keys;
  std::vector<float> in_wide, in_deep, logits;
  std::vector<std::uint8_t> found;
  for (;;) {
    EMBCACHE_RETURN_IF_ERROR(reader.value()->next(b));
    if (b.size == 0) break;
    std::size_t n = b.size;
    if (max_samples > 0) n = std::min<std::size_t>(n, max_samples - acc.size());
    if (const std::size_t bad = count_non_finite(b.dense.data(), n * c.num_dense) +
                                count_non_finite(b.labels.data(), n))
      return status::invalid_argument("score: " + shard + ": samples " +
                                      std::to_string(acc.size()) + ".." +
                                      std::to_string(acc.size() + n - 1) + " hold " +
                                      std::to_string(bad) + " non-finite dense features or labels");
    wide_keys.resize(n * ws);
    fill_wide_keys(b, 0, n, c.crossed, wide_keys.data());
    // One-hot slots: each pooled value is the key's row, or zeros for a key the store lacks.
    in_wide.assign(n * ws, 0.0f);
    in_deep.assign(n * ds * dim, 0.0f);
    found.resize(n * std::max(ws, ds));
    EMBCACHE_RETURN_IF_ERROR(
        rows.lookup(m.wide, 1, wide_keys.data(), n * ws, in_wide.data(), found.data()));
    EMBCACHE_RETURN_IF_ERROR(
        rows.lookup(m.deep, dim, b.keys.data(), n * ds, in_deep.data(), found.data()));
    m.dense->predict({n, in_wide.data(), in_deep.data(), b.dense.data(), nullptr}, logits);
    acc.add(logits.data(), b.labels.data(), n);
    if (max_samples > 0 && acc.size() >= max_samples) break;
  }
  score_metrics out;
  out.samples = acc.size();
  out.auc = acc.auc();
  out.logloss = acc.log_loss();
  return out;
}

}  // namespace embcache
