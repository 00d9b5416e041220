// bench_sparse: slot lookup + combine, gradient aggregation and the in-row optimizers in the host
// space, each against a plain loop over the same dense row array on the same indices.
//
// Names: sparse_<op>/host/.../dim:<d> and baseline_<op>/<gather|scatter_add|scatter>/.../dim:<d>.
// A batch is 16384 samples x 26 slots (Criteo's categorical slots), one-hot (hot:1) or four
// occurrences per bag (hot:4), row indices drawn from a Zipf(1.05) law over 1M rows, whose rank
// order is shuffled so that hot rows are spread over the pool.
//   lookup:    lookup_combine (sum) vs a parallel gather-sum loop over bags (tbb::parallel_for);
//   aggregate: aggregate_gradients (deterministic, sorted) vs a sequential scatter-add into a dense
//              gradient array (the touched rows are cleared again outside the timing);
//   apply:     apply_optimizer on the batch's unique rows vs a parallel float loop over the same
//              rows written inline;
//   checked:   apply_optimizer flagging the rows left non-finite (non_finite_out) vs
//              apply_optimizer and then a parallel pass over the same rows that flags them (what a
//              trainer that guards its stores against diverged rows does without the flags).
#include <benchmark/benchmark.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "embcache/optimizers.hpp"
#include "embcache/sparse_ops.hpp"

namespace {

using embcache::combiner;
using embcache::host_space;
using embcache::optimizer_kind;
using embcache::optimizer_options;

constexpr std::size_t num_rows = std::size_t{1} << 20;
constexpr std::size_t batch_size = 16384;
constexpr std::size_t num_slots = 26;
constexpr std::size_t bags = batch_size * num_slots;

std::vector<std::int64_t> zipf_rows(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<double> cdf(num_rows);
  double sum = 0;
  for (std::size_t r = 0; r < num_rows; ++r) cdf[r] = (sum += 1.0 / std::pow(double(r + 1), 1.05));
  std::vector<std::int64_t> perm(num_rows);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g);
  std::uniform_real_distribution<double> u(0, sum);
  std::vector<std::int64_t> out(n);
  for (auto& x : out) {
    const auto rank = std::min<std::size_t>(
        std::lower_bound(cdf.begin(), cdf.end(), u(g)) - cdf.begin(), num_rows - 1);
    x = perm[rank];
  }
  return out;
}

struct batch_data {
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> indices;
  embcache::slot_batch view() const {
    return {batch_size, num_slots, offsets.data(), indices.data(), indices.size()};
  }
};

const batch_data& get_batch(int hot) {
  static std::map<int, batch_data> cache;
  auto it = cache.find(hot);
  if (it != cache.end()) return it->second;
  batch_data b;
  b.indices = zipf_rows(bags * hot, 100 + hot);
  b.offsets.resize(bags + 1);
  for (std::size_t i = 0; i <= bags; ++i) b.offsets[i] = static_cast<std::int64_t>(i * hot);
  return cache.emplace(hot, std::move(b)).first->second;
}

// One pool per dim, wide enough for any optimizer (3*dim floats per row).
std::vector<float>& get_pool(std::size_t dim) {
  static std::map<std::size_t, std::vector<float>> cache;
  auto it = cache.find(dim);
  if (it != cache.end()) return it->second;
  std::vector<float> v(num_rows * 3 * dim);
  std::mt19937 g(5);
  std::uniform_real_distribution<float> u(0.0f, 0.05f);
  for (auto& x : v) x = u(g);
  return cache.emplace(dim, std::move(v)).first->second;
}

std::vector<float> random_grads(std::size_t n) {
  std::vector<float> v(n);
  std::mt19937 g(9);
  std::uniform_real_distribution<float> u(-0.01f, 0.01f);
  for (auto& x : v) x = u(g);
  return v;
}

void set_counters(benchmark::State& state, std::size_t items, std::size_t bytes) {
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * items));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

// --- lookup -------------------------------------------------------------------------------------

void sparse_lookup(benchmark::State& state, std::size_t dim, int hot) {
  const auto& b = get_batch(hot);
  const auto& pool = get_pool(dim);
  std::vector<float> out(bags * dim);
  for (auto _ : state) {
    embcache::lookup_combine(host_space{}, pool.data(), dim, dim, b.view(), combiner::sum,
                             out.data());
    benchmark::DoNotOptimize(out.data());
  }
  set_counters(state, bags, (b.indices.size() + bags) * dim * sizeof(float));
}

void baseline_lookup(benchmark::State& state, std::size_t dim, int hot) {
  const auto& b = get_batch(hot);
  const auto& pool = get_pool(dim);
  std::vector<float> out(bags * dim);
  for (auto _ : state) {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, bags, 1024),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t bag = r.begin(); bag < r.end(); ++bag) {
                          float* o = &out[bag * dim];
                          std::fill(o, o + dim, 0.0f);
                          for (auto k = b.offsets[bag]; k < b.offsets[bag + 1]; ++k) {
                            const float* row = &pool[b.indices[k] * dim];
                            for (std::size_t d = 0; d < dim; ++d) o[d] += row[d];
                          }
                        }
                      });
    benchmark::DoNotOptimize(out.data());
  }
  set_counters(state, bags, (b.indices.size() + bags) * dim * sizeof(float));
}

// --- aggregate ----------------------------------------------------------------------------------

void sparse_aggregate(benchmark::State& state, std::size_t dim, int hot) {
  const auto& b = get_batch(hot);
  const auto d_out = random_grads(bags * dim);
  embcache::sparse_gradients<host_space> g;
  for (auto _ : state) {
    embcache::aggregate_gradients(host_space{}, b.view(), combiner::sum, d_out.data(), dim, g);
    benchmark::DoNotOptimize(g.values.data());
  }
  state.counters["unique_rows"] = static_cast<double>(g.size);
  set_counters(state, b.indices.size(), b.indices.size() * dim * sizeof(float));
}

void baseline_aggregate(benchmark::State& state, std::size_t dim, int hot) {
  const auto& b = get_batch(hot);
  const auto d_out = random_grads(bags * dim);
  std::vector<float> dense(num_rows * dim, 0.0f);
  for (auto _ : state) {
    for (std::size_t bag = 0; bag < bags; ++bag) {
      const float* src = &d_out[bag * dim];
      for (auto k = b.offsets[bag]; k < b.offsets[bag + 1]; ++k) {
        float* dst = &dense[b.indices[k] * dim];
        for (std::size_t d = 0; d < dim; ++d) dst[d] += src[d];
      }
    }
    benchmark::DoNotOptimize(dense.data());
    state.PauseTiming();
    for (auto r : b.indices) std::fill(&dense[r * dim], &dense[r * dim] + dim, 0.0f);
    state.ResumeTiming();
  }
  set_counters(state, b.indices.size(), b.indices.size() * dim * sizeof(float));
}

// --- apply --------------------------------------------------------------------------------------

optimizer_options options_for(optimizer_kind kind) {
  optimizer_options o;
  o.kind = kind;
  o.learning_rate = 0.01f;
  o.ftrl_alpha = 0.05f;
  o.ftrl_l1 = 1e-4f;
  o.ftrl_l2 = 1e-4f;
  return o;
}

// The unique rows of the one-hot batch, and one gradient per row.
struct apply_data {
  std::vector<std::int64_t> rows;
  std::vector<float> grads;
};
const apply_data& get_apply(std::size_t dim) {
  static std::map<std::size_t, apply_data> cache;
  auto it = cache.find(dim);
  if (it != cache.end()) return it->second;
  apply_data a;
  a.rows = get_batch(1).indices;
  std::sort(a.rows.begin(), a.rows.end());
  a.rows.erase(std::unique(a.rows.begin(), a.rows.end()), a.rows.end());
  a.grads = random_grads(a.rows.size() * dim);
  return cache.emplace(dim, std::move(a)).first->second;
}

std::size_t apply_bytes(optimizer_kind kind, std::size_t dim, std::size_t n) {
  const std::size_t w = dim + embcache::state_width(kind, dim);
  return n * (2 * w + dim) * sizeof(float);
}

// check 0: apply_optimizer alone; 1: with its non-finite flags; 2: apply_optimizer, then a
// parallel pass that flags the rows holding an infinity or a NaN.
void sparse_apply(benchmark::State& state, optimizer_kind kind, std::size_t dim, int check) {
  const auto& a = get_apply(dim);
  auto& pool = get_pool(dim);
  const auto o = options_for(kind);
  const std::size_t w = dim + embcache::state_width(kind, dim);
  std::vector<std::int8_t> flags(check ? a.rows.size() : 0);
  std::uint64_t step = 0;
  for (auto _ : state) {
    embcache::apply_optimizer(host_space{}, o, pool.data(), w, dim, a.rows.data(), a.grads.data(),
                              a.rows.size(), ++step, check == 1 ? flags.data() : nullptr);
    if (check == 2) {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, a.rows.size(), 1024),
                        [&](const tbb::blocked_range<std::size_t>& range) {
                          for (std::size_t i = range.begin(); i < range.end(); ++i) {
                            const float* row = &pool[a.rows[i] * w];
                            std::int8_t bad = 0;
                            for (std::size_t j = 0; j < w; ++j)
                              bad |= std::isfinite(row[j]) ? 0 : 1;
                            flags[i] = bad;
                          }
                        });
    }
    benchmark::DoNotOptimize(pool.data());
    benchmark::DoNotOptimize(flags.data());
  }
  set_counters(state, a.rows.size(), apply_bytes(kind, dim, a.rows.size()));
}

// The textbook float loop for each optimizer, one row per iteration of a tbb::parallel_for.
void baseline_apply(benchmark::State& state, optimizer_kind kind, std::size_t dim) {
  const auto& a = get_apply(dim);
  auto& pool = get_pool(dim);
  const auto o = options_for(kind);
  const std::size_t w = dim + embcache::state_width(kind, dim);
  std::uint64_t step = 0;
  for (auto _ : state) {
    ++step;
    const float lr_t = o.learning_rate * std::sqrt(1.0f - std::pow(o.beta2, float(step))) /
                       (1.0f - std::pow(o.beta1, float(step)));
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, a.rows.size(), 1024),
        [&](const tbb::blocked_range<std::size_t>& range) {
          for (std::size_t i = range.begin(); i < range.end(); ++i) {
            float* row = &pool[a.rows[i] * w];
            const float* g = &a.grads[i * dim];
            for (std::size_t d = 0; d < dim; ++d) {
              switch (kind) {
                case optimizer_kind::sgd:
                  row[d] -= o.learning_rate * g[d];
                  break;
                case optimizer_kind::adagrad:
                  row[dim + d] += g[d] * g[d];
                  row[d] -= o.learning_rate * g[d] / (std::sqrt(row[dim + d]) + o.epsilon);
                  break;
                case optimizer_kind::adam: {
                  float& m = row[dim + d];
                  float& v = row[2 * dim + d];
                  m = o.beta1 * m + (1 - o.beta1) * g[d];
                  v = o.beta2 * v + (1 - o.beta2) * g[d] * g[d];
                  row[d] -= lr_t * m / (std::sqrt(v) + o.epsilon);
                  break;
                }
                case optimizer_kind::ftrl: {
                  float& n = row[dim + d];
                  float& z = row[2 * dim + d];
                  const float n_new = n + g[d] * g[d];
                  z += g[d] - (std::sqrt(n_new) - std::sqrt(n)) / o.ftrl_alpha * row[d];
                  const float q = std::sqrt(n_new) / o.ftrl_alpha + 2 * o.ftrl_l2;
                  row[d] =
                      std::fabs(z) > o.ftrl_l1 ? ((z > 0 ? o.ftrl_l1 : -o.ftrl_l1) - z) / q : 0.0f;
                  n = n_new;
                  break;
                }
              }
            }
          }
        });
    benchmark::DoNotOptimize(pool.data());
  }
  set_counters(state, a.rows.size(), apply_bytes(kind, dim, a.rows.size()));
}

void register_all() {
  for (std::size_t dim : {16, 64}) {
    const std::string ds = "/dim:" + std::to_string(dim);
    for (int hot : {1, 4}) {
      const std::string hs = "/hot:" + std::to_string(hot);
      benchmark::RegisterBenchmark(("sparse_lookup/host" + hs + ds).c_str(), sparse_lookup, dim,
                                   hot)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("baseline_lookup/gather" + hs + ds).c_str(), baseline_lookup,
                                   dim, hot)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    for (int hot : {1, 4}) {
      const std::string hs = "/hot:" + std::to_string(hot);
      benchmark::RegisterBenchmark(("sparse_aggregate/host" + hs + ds).c_str(), sparse_aggregate,
                                   dim, hot)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("baseline_aggregate/scatter_add" + hs + ds).c_str(),
                                   baseline_aggregate, dim, hot)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    for (optimizer_kind kind : {optimizer_kind::sgd, optimizer_kind::adagrad, optimizer_kind::adam,
                                optimizer_kind::ftrl}) {
      const std::string ks = std::string("/") + embcache::to_string(kind);
      benchmark::RegisterBenchmark(("sparse_apply/host" + ks + ds).c_str(), sparse_apply, kind, dim,
                                   0)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("sparse_apply_checked/host" + ks + ds).c_str(), sparse_apply,
                                   kind, dim, 1)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("baseline_apply_then_check/scatter" + ks + ds).c_str(),
                                   sparse_apply, kind, dim, 2)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("baseline_apply/scatter" + ks + ds).c_str(), baseline_apply,
                                   kind, dim)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
