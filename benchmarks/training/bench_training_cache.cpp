// Per-pass swap of the training cache against the HugeCTR-style full swap, in one binary, on the
// host store and on RocksDB (when built with it). Keys per keyset: EMBCACHE_BENCH_KEYS (default
// 1M). Rows are dim 64 with Adam state (192 floats). Keysets roll over a key universe: pass p
// trains the n keys from p * s on (modulo n + 2s), s = n * (100 - overlap) / 100, so consecutive
// keysets share `overlap` percent of their keys and every pass brings s new ones.
#include <benchmark/benchmark.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "embcache/buffer.hpp"
#include "embcache/host_store.hpp"
#include "embcache/training_cache.hpp"
#ifdef EMBCACHE_BENCH_ROCKSDB
#include "embcache/rocksdb_store.hpp"
#endif

namespace embcache {
namespace {

constexpr std::size_t dim = 64;

std::size_t num_keys() {
  const char* e = std::getenv("EMBCACHE_BENCH_KEYS");
  return e ? std::strtoull(e, nullptr, 10) : (std::size_t{1} << 20);
}

table_options<std::int64_t> table(std::shared_ptr<param_store<std::int64_t>> store,
                                  std::size_t capacity, std::size_t max_resident = 0) {
  table_options<std::int64_t> o;
  o.name = "emb";
  o.dim = dim;
  o.optimizer.kind = optimizer_kind::adam;
  o.capacity = capacity;
  o.max_resident = max_resident;  // 0: the default, 90% of the slots
  o.store = std::move(store);
  return o;
}

// The rolling keysets of one overlap, and a store holding every key of the universe.
struct fixture {
  std::size_t n = 0, step = 0, universe = 0;
  std::vector<std::int64_t> cur, next;  // passes 0 and 1
  std::map<int, std::vector<std::int64_t>> passes;
  const std::vector<std::int64_t>& keyset(int p) {
    auto& k = passes[p];
    if (k.empty()) {
      k.resize(n);
      for (std::size_t i = 0; i < n; ++i)
        k[i] = std::int64_t((std::size_t(p) * step + i) % universe);
      std::sort(k.begin(), k.end());
    }
    return k;
  }
  std::shared_ptr<param_store<std::int64_t>> store;
  std::string dir;  // RocksDB folder, removed with the fixture
  ~fixture() {
    store.reset();
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

std::shared_ptr<param_store<std::int64_t>> make_store(bool rocksdb, std::size_t rows,
                                                      std::string* dir) {
#ifdef EMBCACHE_BENCH_ROCKSDB
  if (rocksdb) {
    *dir = (std::filesystem::temp_directory_path() /
            ("embcache_bench_training_" + std::to_string(::getpid())))
               .string();
    rocksdb_store_options o;
    o.path = *dir;
    o.table_name = "emb";
    o.row_width = dim * 3;
    return std::shared_ptr<param_store<std::int64_t>>(
        rocksdb_store<std::int64_t>::open(o).value().release());
  }
#else
  if (rocksdb) throw std::runtime_error("built without RocksDB");
#endif
  host_store_options ho;
  ho.table_name = "emb";
  ho.row_width = dim * 3;
  ho.expected_rows = rows;
  return std::make_shared<host_store<std::int64_t>>(ho);
}

std::map<std::pair<int, bool>, std::unique_ptr<fixture>> fixtures;

fixture& get_fixture(int overlap, bool rocksdb) {
  auto& cache = fixtures;
  auto& f = cache[{overlap, rocksdb}];
  if (f) return *f;
  cache.clear();  // one store at a time
  auto& g = cache[{overlap, rocksdb}];
  g = std::make_unique<fixture>();
  const std::size_t n = num_keys();
  const std::size_t keep = n * std::size_t(overlap) / 100;
  g->n = n;
  g->step = n - keep;
  // With a cache of n + s rows, the rows of pass p - 1 that pass p does not train are outside
  // pass p + 1's keyset too: a universe of n + 2s keys.
  g->universe = n + 2 * g->step;
  g->cur = g->keyset(0);
  g->next = g->keyset(1);
  g->store = make_store(rocksdb, g->universe, &g->dir);
  // Every key already exists in the store (a continued training run).
  std::vector<std::int64_t> all(g->universe);
  std::iota(all.begin(), all.end(), std::int64_t{0});
  std::vector<float> rows(std::size_t{1 << 16} * dim * 3, 0.01f);
  std::vector<std::uint64_t> vers(std::size_t{1} << 16, 1);
  for (std::size_t b = 0; b < all.size(); b += vers.size()) {
    const std::size_t m = std::min(vers.size(), all.size() - b);
    g->store->push(all.data() + b, m, rows.data(), vers.data()).throw_if_error();
  }
  g->store->flush().throw_if_error();
  return *g;
}

// The training step's effect on the cache: every row of `keys` updated in place (dirty). The
// cache's own calls take pointers in the space's memory.
template <class Space>
void mark_trained(training_cache<std::int64_t, Space>& tc, const std::vector<std::int64_t>& keys) {
  auto& cache = tc.cache(0);
  const std::size_t n = keys.size();
  buffer<std::int64_t, Space> k(n, cache.space()), slots(n, cache.space());
  k.copy_from_host(keys.data(), n);
  cache.lookup_slots(k.data(), n, slots.data()).throw_if_error();
  cache.mark_updated(slots.data(), n);
}

// A cache holding pass k, every row updated (dirty), as after training pass k.
template <class Space = host_space>
std::unique_ptr<training_cache<std::int64_t, Space>> trained_cache(fixture& f,
                                                                   bool write_behind = true,
                                                                   std::size_t capacity = 0,
                                                                   std::size_t max_resident = 0,
                                                                   bool moved = false) {
  training_cache_options opts;
  opts.write_behind = write_behind;
  opts.move_staged_rows = moved;
  auto tc = std::make_unique<training_cache<std::int64_t, Space>>(
      opts, std::vector{table(f.store, capacity ? capacity : f.n, max_resident)});
  tc->begin_pass({f.cur}).throw_if_error();
  mark_trained(*tc, f.cur);
  return tc;
}

// Mean blocking time of the synchronous swap (no prefetch, no write-behind), per fixture and cache
// size: the length of the simulated training phase of the other variants.
std::map<std::tuple<std::string, int, bool, int>, double> sync_seconds;

// Mean time of baseline_boundary_copies per overlap (host memory).
std::map<int, double> copy_floor_seconds;

// The floor of a boundary that moves rows by copying them: the rows of one pass's new keys
// (room 0: as many leave as arrive) copied out of random slots of a pool of the cache's size into
// a buffer, and as many copied from a buffer into random slots, with memcpy on all cores (oneTBB,
// as the cache's loops). Nothing else: no probe, no metadata, no store. With prefetch and
// write-behind, what begin_pass must still do on the host is these two copies, so
// `boundary_to_copies` in training_begin_pass is how far the boundary is from this floor.
void baseline_boundary_copies(benchmark::State& state) {
  const int overlap = int(state.range(0));
  const std::size_t n = num_keys(), w = dim * 3;
  const std::size_t m = n - n * std::size_t(overlap) / 100, slots = n * 5 / 4;
  std::vector<float> pool(slots * w, 1.0f), out(m * w, 2.0f), in(m * w, 3.0f);
  std::vector<std::size_t> from(slots);
  std::iota(from.begin(), from.end(), std::size_t{0});
  std::shuffle(from.begin(), from.end(), std::mt19937_64(1));
  const std::size_t* to = from.data() + (slots - m);  // other random slots for the arrivals
  double total = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, m), [&](const auto& r) {
      for (std::size_t i = r.begin(); i < r.end(); ++i)
        std::memcpy(out.data() + i * w, pool.data() + from[i] * w, w * sizeof(float));
    });
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, m), [&](const auto& r) {
      for (std::size_t i = r.begin(); i < r.end(); ++i)
        std::memcpy(pool.data() + to[i] * w, in.data() + i * w, w * sizeof(float));
    });
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total += t;
    state.SetIterationTime(t);
  }
  copy_floor_seconds[overlap] = total / double(state.iterations());
  state.counters["rows_moved"] = double(m);
}

void report(benchmark::State& state, double rows, double bytes) {
  state.counters["rows_per_s"] = benchmark::Counter(rows, benchmark::Counter::kIsRate);
  state.counters["bytes_per_s"] = benchmark::Counter(bytes, benchmark::Counter::kIsRate);
}

// Steady-state pass boundaries on one cache over the rolling keysets: train (sleep as long as the
// synchronous swap, then mark every row of the pass updated), begin_pass(next). With prefetch,
// prefetch(next) is issued when the training phase starts; with write-behind, the previous
// boundary's push runs during the phase too. Only the time begin_pass blocks is timed. `room`:
//  0: capacity = the keyset, max_resident = capacity: every leaving row is evicted at its boundary;
//  1: capacity = the keyset, default max_resident (90% of the 1.25 * capacity slots): leaving rows
//     wait in the slack and the worker installs as much of the next pass as the slack holds;
//  2: capacity = the keyset plus one pass's new keys (slack unused, max_resident = capacity).
// With room (1, 2), the prefetch worker can install the next pass during the phase. prefetch 2:
// prefetch with move_staged_rows (the staged rows moved into their slots by index).
template <class Space>
void training_begin_pass(benchmark::State& state) {
  const int overlap = int(state.range(0));
  const bool prefetch = state.range(1) != 0;
  const bool moved = state.range(1) == 2;
  const bool write_behind = state.range(2) != 0;
  const bool rocksdb = state.range(3) != 0;
  const int room = int(state.range(4));
  auto& f = get_fixture(overlap, rocksdb);
  const auto key = std::make_tuple(std::string(space_name<Space>()), overlap, rocksdb, room);
  const double train = sync_seconds.count(key) ? sync_seconds[key] : 0.0;
  if ((prefetch || write_behind) && train == 0.0) {
    state.SkipWithError("run the synchronous variant first (it sets the training time)");
    return;
  }
  double rows = 0, bytes = 0, total = 0, wb = 0, in = 0, wait = 0, staging = 0, behind = 0;
  const std::size_t capacity = room == 2 ? f.n + f.step : f.n;
  auto tc = trained_cache<Space>(f, write_behind, capacity, room == 1 ? 0 : capacity, moved);
  int pass = 0;
  if (room != 0) {
    // Fill the room: from pass 1 on, the cache holds a keyset and the rest of the one before.
    tc->begin_pass({f.next}).throw_if_error();
    pass = 1;
  }
  const std::vector<std::int64_t>* cur = &f.keyset(pass);
  const std::vector<std::int64_t>* next = nullptr;
  // One pass: train `cur` (with the next keyset prefetched), then the timed boundary.
  auto one_pass = [&] {
    next = &f.keyset(pass + 1);
    if (prefetch) tc->prefetch({*next}).throw_if_error();
    std::this_thread::sleep_for(std::chrono::duration<double>(train));
    mark_trained(*tc, *cur);
    const auto t0 = std::chrono::steady_clock::now();
    tc->begin_pass({*next}).throw_if_error();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Untimed boundaries of the variant first: buffers reach their steady size, and a cache that
  // moves rows by index has written every spare row once (its first writes into fresh pages
  // fault them in: a cost of a run's first passes, not of its steady state).
  for (int warm = 0; warm < 3; ++warm) {
    one_pass();
    cur = next;
    ++pass;
  }
  for (auto _ : state) {
    const double t = one_pass();
    total += t;
    state.SetIterationTime(t);  // only begin_pass counts
    const auto& c = tc->counters().last[0];
    rows += double(next->size());
    bytes += double(c.bytes_store_to_cache + c.bytes_cache_to_store);
    wb += c.seconds_write_back;
    in += c.seconds_swap_in;
    wait += c.seconds_prefetch_wait;
    staging += c.seconds_staging;
    behind += c.seconds_write_behind;
    cur = next;
    ++pass;
  }
  tc.reset();  // after the timed loop: waits for the last write-behind
  const double iters = double(state.iterations());
  if (!prefetch && !write_behind) sync_seconds[key] = total / iters;
  report(state, rows, bytes);
  // Where the blocking time goes (ms per begin_pass), from the cache's own counters.
  state.counters["write_back_ms"] = 1e3 * wb / iters;
  state.counters["swap_in_ms"] = 1e3 * in / iters;
  state.counters["wait_ms"] = 1e3 * wait / iters;
  // The background's own times (not blocking): the worker's staging and the flusher's push. When
  // they outlast the simulated pass, begin_pass waits (wait_ms) for a race with the simulated
  // training rather than for the boundary's work; `boundary_to_sync` leaves that wait out.
  state.counters["staging_ms"] = 1e3 * staging / iters;
  state.counters["write_behind_ms"] = 1e3 * behind / iters;
  if (prefetch || write_behind) {
    state.counters["ratio_to_sync"] = total / iters / train;
    state.counters["boundary_to_sync"] = (total - wait) / iters / train;
  }
  if (!rocksdb && copy_floor_seconds.count(overlap)) {
    state.counters["boundary_to_copies"] = (total - wait) / iters / copy_floor_seconds[overlap];
  }
}

// Feature admission's cost at a pass boundary: the synchronous begin_pass (capacity = the keyset,
// every leaving row evicted) with admission off and on (min_count 1, the default 2^20 x 4 sketch:
// every key is admitted, so the same rows move and the difference is the counting, the residency
// lookup and the store's contains for the missing keys). Keys in the store are the rows of a
// continued run, as in training_begin_pass.
void training_begin_pass_admission(benchmark::State& state) {
  const int overlap = int(state.range(0));
  const bool admission = state.range(1) != 0;
  auto& f = get_fixture(overlap, false);
  training_cache_options opts;
  opts.write_behind = false;
  auto t = table(f.store, f.n, f.n);
  if (admission) t.admission.min_count = 1;
  auto tc = std::make_unique<training_cache<std::int64_t>>(opts, std::vector{t});
  tc->begin_pass({f.cur}).throw_if_error();
  int pass = 0;
  double rows = 0, bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    mark_trained(*tc, f.keyset(pass));
    const auto& next = f.keyset(pass + 1);
    state.ResumeTiming();
    tc->begin_pass({next}).throw_if_error();
    const auto& c = tc->counters().last[0];
    rows += double(next.size());
    bytes += double(c.bytes_store_to_cache + c.bytes_cache_to_store);
    ++pass;
  }
  tc.reset();
  report(state, rows, bytes);
}

// HugeCTR's embedding training cache: write back every row, clear, pull the whole next keyset.
void training_full_swap(benchmark::State& state) {
  const int overlap = int(state.range(0));
  auto& f = get_fixture(overlap, state.range(1) != 0);
  double rows = 0, bytes = 0;
  const std::size_t w = dim * 3;
  for (auto _ : state) {
    state.PauseTiming();
    auto tc = trained_cache(f);
    auto& cache = tc->cache(0);
    state.ResumeTiming();
    const auto all = export_filter::all();
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

// Per store, the fixtures are built once per overlap: keep each overlap's runs together.
void full_swap_args(benchmark::internal::Benchmark* b) {
  for (int store : {0, 1}) {
#ifndef EMBCACHE_BENCH_ROCKSDB
    if (store) continue;
#endif
    for (int overlap : {0, 50, 90}) b->Args({overlap, store});
  }
}
void begin_pass_args(benchmark::internal::Benchmark* b) {
  for (int store : {0, 1}) {
#ifndef EMBCACHE_BENCH_ROCKSDB
    if (store) continue;
#endif
    for (int overlap : {0, 50, 90}) {
      for (int room : {0, 1, 2}) {
        b->Args({overlap, 0, 0, store, room});  // synchronous: sets the training time of the others
        b->Args({overlap, 0, 1, store, room});
        b->Args({overlap, 1, 1, store, room});
        b->Args({overlap, 1, 0, store, room});
        b->Args({overlap, 2, 1, store, room});
      }
    }
  }
}

BENCHMARK(baseline_boundary_copies)
    ->Name("baseline_boundary_copies")
    ->ArgNames({"overlap"})
    ->Args({0})
    ->Args({50})
    ->Args({90})
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK(training_full_swap)
    ->Name("training_full_swap")
    ->ArgNames({"overlap", "rocksdb"})
    ->Apply(full_swap_args)
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(training_begin_pass_admission)
    ->Name("training_begin_pass_admission")
    ->ArgNames({"overlap", "admission"})
    ->Args({90, 0})
    ->Args({90, 1})
    ->Args({50, 0})
    ->Args({50, 1})
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(training_begin_pass<host_space>)
    ->Name("training_begin_pass")
    ->ArgNames({"overlap", "prefetch", "write_behind", "rocksdb", "room"})
    ->Apply(begin_pass_args)
    ->Iterations(8)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

}  // namespace
}  // namespace embcache

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
#ifdef EMBCACHE_BENCH_CUDA
  // The cuda space, when this build has it and a device is present: the device caches in GPU
  // memory, staging and write-behind rows in pinned memory, the same stores.
  if (embcache::cuda_device_available()) {
    benchmark::RegisterBenchmark("training_begin_pass/cuda",
                                 embcache::training_begin_pass<embcache::cuda_space>)
        ->ArgNames({"overlap", "prefetch", "write_behind", "rocksdb", "room"})
        ->Apply(embcache::begin_pass_args)
        ->Iterations(8)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();
  }
#endif
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  embcache::fixtures.clear();  // removes the RocksDB folder
  return 0;
}
