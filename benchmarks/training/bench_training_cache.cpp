// Per-pass swap of the training cache against the HugeCTR-style full swap, in one binary.
// Keys per keyset: EMBCACHE_BENCH_KEYS (default 1M). Rows are dim 64 with Adam state (192 floats).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "embcache/host_store.hpp"
#include "embcache/training_cache.hpp"

namespace embcache {
namespace {

constexpr std::size_t dim = 64;

std::size_t num_keys() {
  const char* e = std::getenv("EMBCACHE_BENCH_KEYS");
  return e ? std::strtoull(e, nullptr, 10) : (std::size_t{1} << 20);
}

table_options<std::int64_t> table(std::shared_ptr<param_store<std::int64_t>> store) {
  table_options<std::int64_t> o;
  o.name = "emb";
  o.dim = dim;
  o.optimizer.kind = optimizer_kind::adam;
  o.capacity = num_keys();
  o.store = std::move(store);
  return o;
}

// Keysets of pass k and k+1 sharing `overlap` percent of their keys, and a store holding both.
struct fixture {
  std::vector<std::int64_t> cur, next;
  std::shared_ptr<param_store<std::int64_t>> store;
};

fixture& get_fixture(int overlap) {
  static std::map<int, std::unique_ptr<fixture>> cache;
  auto& f = cache[overlap];
  if (f) return *f;
  cache.clear();  // one store in memory at a time
  auto& g = cache[overlap];
  g = std::make_unique<fixture>();
  const std::size_t n = num_keys();
  const std::size_t keep = n * std::size_t(overlap) / 100;
  g->cur.resize(n);
  std::iota(g->cur.begin(), g->cur.end(), std::int64_t{0});
  g->next.resize(n);
  for (std::size_t i = 0; i < keep; ++i) g->next[i] = std::int64_t(n - keep + i);
  for (std::size_t i = keep; i < n; ++i) g->next[i] = std::int64_t(n + i - keep);
  host_store_options ho;
  ho.table_name = "emb";
  ho.row_width = dim * 3;
  ho.expected_rows = 2 * n;
  g->store = std::make_shared<host_store<std::int64_t>>(ho);
  // Every key of both passes already exists in the store (a continued training run).
  std::vector<std::int64_t> all(2 * n - keep);
  std::iota(all.begin(), all.end(), std::int64_t{0});
  std::vector<float> rows(std::size_t{1 << 16} * dim * 3, 0.01f);
  std::vector<std::uint64_t> vers(std::size_t{1} << 16, 1);
  for (std::size_t b = 0; b < all.size(); b += vers.size()) {
    const std::size_t m = std::min(vers.size(), all.size() - b);
    g->store->push(all.data() + b, m, rows.data(), vers.data()).throw_if_error();
  }
  return *g;
}

// A cache holding pass k, every row updated (dirty), as after training pass k.
std::unique_ptr<training_cache<std::int64_t>> trained_cache(fixture& f) {
  auto tc = std::make_unique<training_cache<std::int64_t>>(training_cache_options{},
                                                           std::vector{table(f.store)});
  tc->begin_pass({f.cur}).throw_if_error();
  std::vector<std::int64_t> slots(f.cur.size());
  tc->cache(0).lookup_slots(f.cur.data(), f.cur.size(), slots.data()).throw_if_error();
  tc->cache(0).mark_updated(slots.data(), slots.size()).throw_if_error();
  return tc;
}

std::map<int, double> unprefetched_seconds;

void report(benchmark::State& state, double rows, double bytes) {
  state.counters["rows_per_s"] = benchmark::Counter(rows, benchmark::Counter::kIsRate);
  state.counters["bytes_per_s"] = benchmark::Counter(bytes, benchmark::Counter::kIsRate);
}

// begin_pass(next) with and without a prefetch issued at the start of a training phase as long
// as the unprefetched swap. Only the time begin_pass blocks is measured.
void training_begin_pass(benchmark::State& state) {
  const int overlap = int(state.range(0));
  const bool prefetch = state.range(1) != 0;
  auto& f = get_fixture(overlap);
  double rows = 0, bytes = 0, total = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto tc = trained_cache(f);
    if (prefetch) {
      tc->prefetch({f.next}).throw_if_error();
      const double train =
          unprefetched_seconds.count(overlap) ? unprefetched_seconds[overlap] : 0.5;
      std::this_thread::sleep_for(std::chrono::duration<double>(train));
    }
    state.ResumeTiming();
    const auto t0 = std::chrono::steady_clock::now();
    tc->begin_pass({f.next}).throw_if_error();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.PauseTiming();
    const auto& c = tc->counters().last[0];
    rows += double(f.next.size());
    bytes += double(c.bytes_store_to_cache + c.bytes_cache_to_store);
    tc.reset();
    state.ResumeTiming();
  }
  if (!prefetch) unprefetched_seconds[overlap] = total / double(state.iterations());
  report(state, rows, bytes);
}

// HugeCTR's embedding training cache: write back every row, clear, pull the whole next keyset.
void training_full_swap(benchmark::State& state) {
  const int overlap = int(state.range(0));
  auto& f = get_fixture(overlap);
  double rows = 0, bytes = 0;
  const std::size_t w = dim * 3;
  for (auto _ : state) {
    state.PauseTiming();
    auto tc = trained_cache(f);
    auto& cache = tc->cache(0);
    state.ResumeTiming();
    export_filter all;
    all.all = true;
    auto out = cache.export_to_host(all).value();
    f.store->push(out.keys.data(), out.keys.size(), out.rows.data(), out.versions.data())
        .throw_if_error();
    cache.clear();
    const std::size_t n = f.next.size();
    std::vector<float> in(n * w);
    std::vector<std::uint64_t> vers(n);
    std::unique_ptr<bool[]> found(new bool[n]);
    f.store->pull(f.next.data(), n, in.data(), found.get(), vers.data()).throw_if_error();
    cache.insert_or_assign(f.next.data(), n, in.data(), vers.data()).throw_if_error();
    state.PauseTiming();
    rows += double(n);
    bytes += double((out.keys.size() + n) * w * sizeof(float));
    tc.reset();
    state.ResumeTiming();
  }
  report(state, rows, bytes);
}

BENCHMARK(training_full_swap)
    ->Name("training_full_swap/host")
    ->ArgNames({"overlap"})
    ->Args({0})
    ->Args({50})
    ->Args({90})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(training_begin_pass)
    ->Name("training_begin_pass/host")
    ->ArgNames({"overlap", "prefetch"})
    ->Args({0, 0})
    ->Args({0, 1})
    ->Args({50, 0})
    ->Args({50, 1})
    ->Args({90, 0})
    ->Args({90, 1})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace embcache

BENCHMARK_MAIN();
