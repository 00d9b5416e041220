// Host-hybrid Wide&Deep, as MindSpore's host+device mode runs it: the embedding tables and their
// sparse optimizers (FTRL for wide, lazy Adam for deep) live on the host, in parameter stores,
// and the dense network runs on the device: each batch's pooled embeddings and dense features go
// to it, forward, backward and Adam run there, and the gradients with respect to the embeddings
// come back for the sparse optimizers. Without the cuda space in the build, or without a device,
// the dense network runs on the host and the first line says why. Logs, per step,
//   epoch: E step: S, wide_loss is L, deep_loss is L
// (the two towers share one logit, so both optimizers see the same loss, as in MindSpore's
// sample) and, per epoch, the time spent in each op.
//
//   embcache-host-hybrid [rows (20000)] [epochs (2)] [batch (1000)] [dense device (auto)]
//   (--help, --version; exit 2 on a usage error)
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "embcache/criteo.hpp"
#include "embcache/host_hybrid.hpp"
#include "embcache/host_store.hpp"
#include "embcache/synth.hpp"
#include "embcache/trainer/dense_backend.hpp"
#include "embcache/trainer/in_memory.hpp"
#include "embcache/trainer/metrics.hpp"
#include "embcache/trainer/wide_deep.hpp"
#include "embcache/version.hpp"

using namespace embcache;
using clock_type = std::chrono::steady_clock;

namespace {
double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  std::uint64_t rows = 20000;
  int epochs = 2;
  std::size_t batch = 1000;
  std::string device = "auto";
  CLI::App app{
      "Host-hybrid Wide&Deep on synthetic Criteo rows: embeddings and sparse optimizers (FTRL, "
      "lazy Adam) on the host, the dense network on the device when there is one. The last 10% "
      "of the rows are held out for the AUC."};
  app.add_option("rows", rows, "Synthetic rows (at least 10)")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{10}, std::uint64_t{1} << 40));
  app.add_option("epochs", epochs, "Passes over the training rows")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("batch", batch, "Samples per batch")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 24));
  app.add_option("device", device, "Dense network: auto, host or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "host", "cuda"}));
  app.set_version_flag("--version", std::string("embcache-host-hybrid ") + EMBCACHE_VERSION_STRING);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
#ifdef EMBCACHE_SAMPLE_WITH_CUDA
  register_cuda_dense_backend();
#endif
  const std::size_t dim = 16, slots = criteo_slot_count;

  // Synthetic rows, the last 10% held out.
  synth_generator gen(synth_options{});
  std::vector<criteo_sample> samples(rows);
  synth_row r;
  for (std::uint64_t i = 0; i < rows; ++i) {
    gen.row(i, r);
    gen.to_sample(r, {}, samples[i]);
  }
  const std::size_t train_rows = rows - rows / 10;

  const optimizer_options wide_opt = default_wide_optimizer(), deep_opt = default_deep_optimizer();
  host_store<std::int64_t> wide_store({"wide", 1 + state_width(wide_opt.kind, 1)});
  host_store<std::int64_t> deep_store({"deep", dim + state_width(deep_opt.kind, dim)});
  host_hybrid_options wo, dopt;
  wo.dim = 1;
  wo.optimizer = wide_opt;
  wo.init_scale = 0.0f;
  dopt.dim = dim;
  dopt.optimizer = deep_opt;
  dopt.init_scale = 0.01f;
  host_hybrid_table<std::int64_t> wide(wide_store, wo), deep(deep_store, dopt);
  wide_deep_options mo;
  mo.hidden = {256, 128};
  mo.dropout = 0.1f;
  std::string note;
  device_choice choice = device_choice::automatic;
  if (!device_choice_from_name(device, &choice)) {
    std::fprintf(stderr, "dense device: \"%s\" is not a device (host, cuda, auto)\n",
                 device.c_str());
    return 1;
  }
  auto made = make_dense_backend(choice, mo, host_space{}, &note, "dense device");
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.get_status().to_string().c_str());
    return 1;
  }
  dense_backend& model = *made.value();
  std::printf("%s; embeddings and sparse optimizers on the host\n", note.c_str());

  std::vector<std::int64_t> offsets(batch * slots + 1), keys;
  std::iota(offsets.begin(), offsets.end(), 0);
  std::vector<float> in_wide, in_deep, d_wide, d_deep, dense, labels, logits;
  std::uint64_t step = 0;
  auto gather = [&](std::size_t begin, std::size_t n) {
    keys.resize(n * slots);
    dense.resize(n * criteo_dense_count);
    labels.resize(n);
    for (std::size_t b = 0; b < n; ++b) {
      const criteo_sample& s = samples[begin + b];
      std::copy(s.keys.begin(), s.keys.end(), keys.begin() + b * slots);
      std::copy(s.dense.begin(), s.dense.end(), dense.begin() + b * criteo_dense_count);
      labels[b] = s.label;
    }
    in_wide.resize(n * slots);
    in_deep.resize(n * slots * dim);
  };
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    double t_lookup = 0, t_dense = 0, t_sparse = 0;
    const double transfer_before = model.transfer_seconds();
    for (std::size_t begin = 0; begin < train_rows; begin += batch) {
      const std::size_t n = std::min(batch, train_rows - begin);
      gather(begin, n);
      const key_batch<std::int64_t> kb{n, slots, offsets.data(), keys.data(), n * slots};
      auto t0 = clock_type::now();
      status s = wide.forward(kb, in_wide.data());
      if (s.ok()) s = deep.forward(kb, in_deep.data());
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.to_string().c_str());
        return 1;
      }
      t_lookup += since(t0);
      t0 = clock_type::now();
      d_wide.resize(in_wide.size());
      d_deep.resize(in_deep.size());
      const double loss =
          model.forward_backward({n, in_wide.data(), in_deep.data(), dense.data(), labels.data()},
                                 step++, d_wide.data(), d_deep.data());
      model.apply_dense_update();
      t_dense += since(t0);
      t0 = clock_type::now();
      s = wide.backward(d_wide.data());
      if (s.ok()) s = deep.backward(d_deep.data());
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.to_string().c_str());
        return 1;
      }
      t_sparse += since(t0);
      std::printf("epoch: %d step: %llu, wide_loss is %.6f, deep_loss is %.6f\n", epoch,
                  (unsigned long long)step, loss, loss);
    }
    // Evaluation on the held-out rows: pull only, no update.
    metric_accumulator acc;
    std::vector<float> rows_w, rows_d;
    std::unique_ptr<bool[]> found;
    for (std::size_t begin = train_rows; begin < rows; begin += batch) {
      const std::size_t n = std::min<std::size_t>(batch, rows - begin);
      gather(begin, n);
      rows_w.resize(n * slots * wide.row_width());
      rows_d.resize(n * slots * deep.row_width());
      found.reset(new bool[n * slots]);
      std::fill(in_wide.begin(), in_wide.end(), 0.0f);
      std::fill(in_deep.begin(), in_deep.end(), 0.0f);
      if (!wide_store.pull(keys.data(), n * slots, rows_w.data(), found.get()).ok()) return 1;
      for (std::size_t i = 0; i < n * slots; ++i)
        if (found[i]) in_wide[i] = rows_w[i * wide.row_width()];
      if (!deep_store.pull(keys.data(), n * slots, rows_d.data(), found.get()).ok()) return 1;
      for (std::size_t i = 0; i < n * slots; ++i)
        if (found[i])
          std::copy(rows_d.begin() + i * deep.row_width(),
                    rows_d.begin() + i * deep.row_width() + dim, in_deep.begin() + i * dim);
      model.predict({n, in_wide.data(), in_deep.data(), dense.data(), nullptr}, logits);
      acc.add(logits.data(), labels.data(), n);
    }
    std::printf(
        "epoch %d: host lookup %.3f s, dense forward+backward+update on %s %.3f s (of which "
        "host<->device copies %.3f s), sparse optimizer + push %.3f s; eval AUC %.4f, logloss "
        "%.4f; rows on the host: wide %zu, deep %zu\n",
        epoch, t_lookup, model.device(), t_dense, model.transfer_seconds() - transfer_before,
        t_sparse, acc.auc(), acc.log_loss(), wide_store.size(), deep_store.size());
  }
  return 0;
}
