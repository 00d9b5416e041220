// Trainer throughput on synthetic data: keyset mode with a cache that holds one shard's keyset
// (every shard swaps; with and without prefetch) against a cache that holds every key (no
// swapping: the baseline), in the same binary. Each run first trains one untimed epoch over the
// shards, so that the baseline has every row resident, then times a second epoch.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "embcache/synth.hpp"
#include "embcache/trainer/trainer.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;
constexpr std::size_t num_shards = 6;
constexpr std::uint64_t rows_per_shard = 20000;

struct data {
  std::string dir;
  std::size_t largest_keyset = 0, table = 0;
};

const data& dataset() {
  static const data d = [] {
    data r;
    r.dir = (fs::temp_directory_path() / ("embcache_bench_trainer_" + std::to_string(::getpid())))
                .string();
    synth_options so;
    so.rows = rows_per_shard * num_shards;
    dataset_writer_options wo;
    wo.output_dir = r.dir;
    wo.rows_per_shard = rows_per_shard;
    wo.overwrite = true;
    write_synth_dataset(so, wo).value();
    std::vector<std::int64_t> all;
    for (std::size_t i = 0; i < num_shards; ++i) {
      auto k = read_keyset<std::int64_t>(r.dir + "/" + keyset_file_name(i)).value();
      r.largest_keyset = std::max(r.largest_keyset, k.size());
      all.insert(all.end(), k.begin(), k.end());
    }
    std::sort(all.begin(), all.end());
    r.table = std::size_t(std::unique(all.begin(), all.end()) - all.begin());
    return r;
  }();
  return d;
}

void run_trainer(benchmark::State& state, bool small_cache, bool prefetch) {
  const data& d = dataset();
  trainer_config c;
  c.data_dir = d.dir;
  for (std::size_t i = 0; i < num_shards; ++i) c.passes.push_back({{shard_file_name(i)}});
  c.model.hidden = {256, 128};
  c.model.dropout = 0.1f;
  c.batch_size = 1024;
  c.log_interval = 0;
  c.prefetch = prefetch;
  for (auto& t : c.tables) t.capacity = small_cache ? d.largest_keyset : d.table;
  std::uint64_t samples = 0;
  double swap = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto t = trainer::create(c).value();
    t->set_log([](const std::string&) {});
    for (std::size_t i = 0; i < num_shards; ++i)
      t->run_pass(c.passes[i], i + 1 < num_shards ? &c.passes[i + 1] : &c.passes[0]).value();
    state.ResumeTiming();
    for (std::size_t i = 0; i < num_shards; ++i) {
      const pass_metrics m =
          t->run_pass(c.passes[i], i + 1 < num_shards ? &c.passes[i + 1] : nullptr).value();
      samples += m.samples;
      swap += m.swap_seconds;
    }
    state.PauseTiming();
    t.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(std::int64_t(samples));
  state.counters["swap_s_per_epoch"] = swap / double(state.iterations());
  state.counters["table_rows"] = double(d.table);
  state.counters["cache_rows"] = double(c.tables[0].capacity);
}

void BM_trainer_all_resident(benchmark::State& s) { run_trainer(s, false, true); }
void BM_trainer_small_cache_prefetch(benchmark::State& s) { run_trainer(s, true, true); }
void BM_trainer_small_cache_no_prefetch(benchmark::State& s) { run_trainer(s, true, false); }

BENCHMARK(BM_trainer_all_resident)
    ->Name("trainer_epoch/host/all_resident")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2);
BENCHMARK(BM_trainer_small_cache_prefetch)
    ->Name("trainer_epoch/host/small_cache_prefetch")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2);
BENCHMARK(BM_trainer_small_cache_no_prefetch)
    ->Name("trainer_epoch/host/small_cache_no_prefetch")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2);

}  // namespace
}  // namespace embcache

BENCHMARK_MAIN();
