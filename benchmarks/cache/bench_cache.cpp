// bench_cache: bulk operations of the embedding cache against a tbb::concurrent_hash_map
// (key -> row index, plus a row array), absl::flat_hash_map (one map per thread, the keys split
// between them by hash, plus a row array) and a single-thread std::unordered_map, on the same keys.
//
// Names: cache_<op>/<space>/dim:<d>/load:<l>/dist:<uniform|zipf> and
//        baseline_<op>/<tbb_chm|absl_flat|std_umap>/dim:<d>/load:<l>/dist:<...>.
// Each iteration runs one batch of 1M keys drawn from the resident keys (find), or with one key
// in 16 new (find_or_insert, insert_or_assign; the new keys are erased again outside the timing).
// cache_<op>/<space>_spare/...: the same on a table with spare rows, whose slots reach their rows
// through the slot-to-row map (the cost of that map).
// cache_install/<space>/dim:<d>/rows:<copied|moved>: a pass boundary's install of 256Ki new keys
// into a table at load 0.5, their rows copied in by install() from a staging buffer, or moved in
// by install_rows() from the spare rows they were written to (erased again outside the timing).
#include <benchmark/benchmark.h>
#include <tbb/concurrent_hash_map.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "embcache/buffer.hpp"
#include "embcache/embedding_cache.hpp"
#include "embcache/embedding_cache_ref.hpp"

#if defined(EMBCACHE_BENCH_ABSL)
#include <absl/container/flat_hash_map.h>
#endif

namespace {

using embcache::host_space;
using key_t_ = std::int64_t;

constexpr std::size_t capacity = std::size_t{1} << 20;
constexpr std::size_t batch = std::size_t{1} << 20;

enum class op { find, find_or_insert, insert_or_assign };
const char* op_name(op o) {
  return o == op::find ? "find" : o == op::find_or_insert ? "find_or_insert" : "insert_or_assign";
}

// Resident keys and the batch, shared by the cache and both baselines of one (dim, load, dist).
struct workload {
  std::vector<key_t_> resident;
  std::vector<key_t_> batch_keys;  // find: all resident
  std::vector<key_t_> mixed_keys;  // half resident, half new
  std::vector<key_t_> new_keys;    // the new ones of mixed_keys, unique
};

std::vector<std::size_t> draw(std::size_t n, std::size_t universe, bool zipf, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::size_t> out(n);
  if (!zipf) {
    for (auto& x : out) x = g() % universe;
    return out;
  }
  std::vector<double> cdf(universe);
  double sum = 0;
  for (std::size_t r = 0; r < universe; ++r) cdf[r] = (sum += 1.0 / std::pow(double(r + 1), 1.05));
  std::uniform_real_distribution<double> u(0, sum);
  for (auto& x : out)
    x = std::min<std::size_t>(std::lower_bound(cdf.begin(), cdf.end(), u(g)) - cdf.begin(),
                              universe - 1);
  return out;
}

workload make_workload(double load, bool zipf) {
  workload w;
  const std::size_t n = static_cast<std::size_t>(load * capacity);
  w.resident.resize(n);
  std::mt19937_64 g(7);
  for (auto& k : w.resident) k = static_cast<key_t_>(g() >> 1);
  std::shuffle(w.resident.begin(), w.resident.end(), g);  // rank -> key is random
  for (auto i : draw(batch, n, zipf, 11)) w.batch_keys.push_back(w.resident[i]);
  // One key in 16 is new: the load rises by 1/16 of the batch (0.06) during the call, so the
  // table stays near its nominal load; the new keys are erased again after each iteration.
  auto idx = draw(batch, n, zipf, 13);
  for (std::size_t i = 0; i < batch; ++i) {
    if (i % 16 == 15) {
      const key_t_ fresh = -static_cast<key_t_>(i) - 1;  // resident keys are >= 0
      w.mixed_keys.push_back(fresh);
      w.new_keys.push_back(fresh);
    } else {
      w.mixed_keys.push_back(w.resident[idx[i]]);
    }
  }
  return w;
}

void report(benchmark::State& state, std::size_t dim) {
  state.SetItemsProcessed(state.iterations() * batch);
  state.SetBytesProcessed(state.iterations() * batch * dim * sizeof(float));
}

template <class Space>
void bm_cache(benchmark::State& state, op o, std::size_t dim, double load, bool zipf, bool spare) {
  const workload w = make_workload(load, zipf);
  embcache::cache_options opt;
  opt.slots = capacity;
  opt.dim = dim;
  if (spare) opt.spare_rows = capacity / 4;
  const Space space{};
  embcache::embedding_cache<key_t_, Space> cache(opt, space);
  // Keys, rows and the found mask: host vectors, as the baselines use, or copies in device
  // memory for the cuda space (made before the timing).
  std::vector<float> rows_host(batch * dim, 1.0f);
  std::unique_ptr<bool[]> found_host(new bool[batch]);
  const key_t_* resident = w.resident.data();
  const key_t_* batch_keys = w.batch_keys.data();
  const key_t_* mixed_keys = w.mixed_keys.data();
  const key_t_* new_keys = w.new_keys.data();
  float* rows = rows_host.data();
  bool* found = found_host.get();
  std::vector<embcache::buffer<key_t_, Space>> device_keys;
  embcache::buffer<float, Space> device_rows;
  embcache::buffer<bool, Space> device_found;
  if constexpr (!embcache::is_host_space_v<Space>) {
    for (const auto* v : {&w.resident, &w.batch_keys, &w.mixed_keys, &w.new_keys}) {
      device_keys.emplace_back(v->size(), space);
      device_keys.back().copy_from_host(v->data(), v->size());
    }
    resident = device_keys[0].data();
    batch_keys = device_keys[1].data();
    mixed_keys = device_keys[2].data();
    new_keys = device_keys[3].data();
    device_rows = embcache::buffer<float, Space>(batch * dim, space);
    device_rows.copy_from_host(rows_host.data(), rows_host.size());
    device_found = embcache::buffer<bool, Space>(batch, space);
    rows = device_rows.data();
    found = device_found.data();
  }
  if (!cache.find_or_insert(resident, w.resident.size(), nullptr, nullptr).ok())
    state.SkipWithError("prefill failed");
  for (auto _ : state) {
    embcache::status s;
    // Every bulk call returns once its work is complete (the cuda space synchronizes its stream).
    if (o == op::find) {
      cache.find(batch_keys, batch, rows, found);
    } else if (o == op::find_or_insert) {
      s = cache.find_or_insert(mixed_keys, batch, rows, nullptr);
    } else {
      s = cache.insert_or_assign(mixed_keys, batch, rows);
    }
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
    benchmark::DoNotOptimize(rows);
    if (o != op::find) {
      state.PauseTiming();
      cache.erase(new_keys, w.new_keys.size());
      state.ResumeTiming();
    }
  }
  report(state, dim);
}

// A pass boundary's install: `n` new keys into a table at load 0.5, rows copied or moved in.
template <class Space>
void bm_install(benchmark::State& state, std::size_t dim, bool moved) {
  constexpr std::size_t n = std::size_t{1} << 18;
  const workload w = make_workload(0.5, false);
  embcache::cache_options opt;
  opt.slots = capacity;
  opt.dim = dim;
  if (moved) opt.spare_rows = n;
  const Space space{};
  embcache::embedding_cache<key_t_, Space> cache(opt, space);
  std::vector<key_t_> fresh(n);
  for (std::size_t i = 0; i < n; ++i) fresh[i] = -static_cast<key_t_>(i) - 1;
  std::vector<std::int64_t> given(n);
  for (std::size_t i = 0; i < n; ++i) given[i] = static_cast<std::int64_t>(cache.slots() + i);
  embcache::buffer<key_t_, Space> resident(w.resident.size(), space), keys(n, space);
  resident.copy_from_host(w.resident.data(), w.resident.size());
  keys.copy_from_host(fresh.data(), n);
  embcache::buffer<std::int64_t, Space> rows_io(n, space);
  rows_io.copy_from_host(given.data(), n);
  // The staging install() copies from (host memory; pinned in the cuda space, where a training
  // cache stages), or the spare rows install_rows() finds the same floats in (written before the
  // timing, as a prefetch worker would write them during a pass).
  std::vector<float> host_staging;
  std::unique_ptr<float, void (*)(float*)> pinned(nullptr, [](float*) {});
  float* staging = nullptr;
  if (moved) {
    embcache::detail::fill_bytes(space, cache.row_pool() + cache.slots() * dim, 0, n * dim * 4);
  } else if constexpr (embcache::is_host_space_v<Space>) {
    host_staging.assign(n * dim, 0.0f);
    staging = host_staging.data();
  } else {
    pinned = {static_cast<float*>(embcache::detail::cuda_allocate_pinned(n * dim * 4)),
              [](float* p) { embcache::detail::cuda_deallocate_pinned(p); }};
    staging = pinned.get();
    std::fill(staging, staging + n * dim, 0.0f);
  }
  if (!cache.find_or_insert(resident.data(), w.resident.size(), nullptr, nullptr).ok())
    state.SkipWithError("prefill failed");
  for (auto _ : state) {
    // Each call returns once its work is complete (the cuda space synchronizes its stream).
    const embcache::status s =
        moved ? cache.install_rows(keys.data(), n, rows_io.data(), nullptr, nullptr, 1)
              : cache.install(keys.data(), n, staging, nullptr, nullptr, 1);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
    state.PauseTiming();
    // The rows given back are the next iteration's: free rows, as a caller would reuse them.
    cache.erase(keys.data(), n);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * dim * sizeof(float));
}

// Same initial row as the cache, so that the insert baselines do the same work.
void init_row(const embcache::initializer_options& init, key_t_ k, float* r, std::size_t dim) {
  for (std::size_t j = 0; j < dim; ++j)
    r[j] = embcache::detail::initial_value(init, init.scale * 1.7320508f, std::uint64_t(k), j);
}

void bm_tbb(benchmark::State& state, op o, std::size_t dim, double load, bool zipf) {
  const workload w = make_workload(load, zipf);
  using map_t = tbb::concurrent_hash_map<key_t_, std::int64_t>;
  map_t map(capacity);
  std::vector<float> pool(capacity * dim);
  std::atomic<std::int64_t> next{0};
  embcache::initializer_options init;
  for (auto k : w.resident) {
    map_t::accessor a;
    map.insert(a, k);
    a->second = next++;
    init_row(init, k, &pool[a->second * dim], dim);
  }
  std::vector<float> rows(batch * dim, 1.0f);
  std::vector<std::int64_t> free_rows;
  for (auto _ : state) {
    if (o == op::find) {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, batch, 1024), [&](auto r) {
        for (std::size_t i = r.begin(); i < r.end(); ++i) {
          map_t::const_accessor a;
          if (map.find(a, w.batch_keys[i]))
            std::memcpy(&rows[i * dim], &pool[a->second * dim], dim * sizeof(float));
        }
      });
    } else {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, batch, 1024), [&](auto r) {
        for (std::size_t i = r.begin(); i < r.end(); ++i) {
          map_t::accessor a;
          const key_t_ k = w.mixed_keys[i];
          if (map.insert(a, k)) {
            a->second = next++;
            if (o == op::find_or_insert) init_row(init, k, &pool[a->second * dim], dim);
          }
          if (o == op::find_or_insert)
            std::memcpy(&rows[i * dim], &pool[a->second * dim], dim * sizeof(float));
          else
            std::memcpy(&pool[a->second * dim], &rows[i * dim], dim * sizeof(float));
        }
      });
    }
    benchmark::DoNotOptimize(rows.data());
    if (o != op::find) {
      state.PauseTiming();
      for (auto k : w.new_keys) map.erase(k);
      next = static_cast<std::int64_t>(w.resident.size());
      state.ResumeTiming();
    }
  }
  report(state, dim);
}

#if defined(EMBCACHE_BENCH_ABSL)
// absl::flat_hash_map is not safe for concurrent writers, so the baseline keeps one map per
// thread (one thread per core) and sends each key to the map its hash picks: finds run over the
// batch in parallel (reads of different maps, or of one, are safe); inserts run one thread per
// map, each walking the whole batch and taking its own keys, in batch order.
void bm_absl(benchmark::State& state, op o, std::size_t dim, double load, bool zipf) {
  const workload w = make_workload(load, zipf);
  using map_t = absl::flat_hash_map<key_t_, std::int64_t>;
  const auto shards = static_cast<std::size_t>(std::max(1, tbb::info::default_concurrency()));
  auto shard_of = [shards](key_t_ k) {
    return static_cast<std::size_t>(
        ((static_cast<std::uint64_t>(k) * 0x9e3779b97f4a7c15ULL) >> 32) % shards);
  };
  std::vector<map_t> maps(shards);
  for (auto& m : maps) m.reserve(capacity / shards + capacity / 16);
  std::vector<float> pool(capacity * dim);
  std::atomic<std::int64_t> next{0};
  embcache::initializer_options init;
  for (auto k : w.resident) {
    const std::int64_t r = next++;
    maps[shard_of(k)][k] = r;
    init_row(init, k, &pool[r * dim], dim);
  }
  std::vector<float> rows(batch * dim, 1.0f);
  for (auto _ : state) {
    if (o == op::find) {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, batch, 1024), [&](auto r) {
        for (std::size_t i = r.begin(); i < r.end(); ++i) {
          const key_t_ k = w.batch_keys[i];
          const map_t& m = maps[shard_of(k)];
          auto it = m.find(k);
          if (it != m.end())
            std::memcpy(&rows[i * dim], &pool[it->second * dim], dim * sizeof(float));
        }
      });
    } else {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, shards, 1), [&](auto r) {
        for (std::size_t t = r.begin(); t < r.end(); ++t) {
          map_t& m = maps[t];
          for (std::size_t i = 0; i < batch; ++i) {
            const key_t_ k = w.mixed_keys[i];
            if (shard_of(k) != t) continue;
            auto [it, fresh] = m.try_emplace(k, 0);
            if (fresh) {
              it->second = next++;
              if (o == op::find_or_insert) init_row(init, k, &pool[it->second * dim], dim);
            }
            if (o == op::find_or_insert)
              std::memcpy(&rows[i * dim], &pool[it->second * dim], dim * sizeof(float));
            else
              std::memcpy(&pool[it->second * dim], &rows[i * dim], dim * sizeof(float));
          }
        }
      });
    }
    benchmark::DoNotOptimize(rows.data());
    if (o != op::find) {
      state.PauseTiming();
      for (auto k : w.new_keys) maps[shard_of(k)].erase(k);
      next = static_cast<std::int64_t>(w.resident.size());
      state.ResumeTiming();
    }
  }
  report(state, dim);
}
#endif

void bm_umap(benchmark::State& state, op o, std::size_t dim, double load, bool zipf) {
  const workload w = make_workload(load, zipf);
  std::unordered_map<key_t_, std::int64_t> map;
  map.reserve(capacity);
  std::vector<float> pool(capacity * dim);
  std::int64_t next = 0;
  embcache::initializer_options init;
  for (auto k : w.resident) {
    map[k] = next;
    init_row(init, k, &pool[next * dim], dim);
    ++next;
  }
  std::vector<float> rows(batch * dim, 1.0f);
  for (auto _ : state) {
    if (o == op::find) {
      for (std::size_t i = 0; i < batch; ++i) {
        auto it = map.find(w.batch_keys[i]);
        if (it != map.end())
          std::memcpy(&rows[i * dim], &pool[it->second * dim], dim * sizeof(float));
      }
    } else {
      for (std::size_t i = 0; i < batch; ++i) {
        const key_t_ k = w.mixed_keys[i];
        auto [it, fresh] = map.try_emplace(k, next);
        if (fresh) {
          ++next;
          if (o == op::find_or_insert) init_row(init, k, &pool[it->second * dim], dim);
        }
        if (o == op::find_or_insert)
          std::memcpy(&rows[i * dim], &pool[it->second * dim], dim * sizeof(float));
        else
          std::memcpy(&pool[it->second * dim], &rows[i * dim], dim * sizeof(float));
      }
    }
    benchmark::DoNotOptimize(rows.data());
    if (o != op::find) {
      state.PauseTiming();
      for (auto k : w.new_keys) map.erase(k);
      next = static_cast<std::int64_t>(w.resident.size());
      state.ResumeTiming();
    }
  }
  report(state, dim);
}

std::string suffix(std::size_t dim, double load, bool zipf) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "dim:%zu/load:%.1f/dist:%s", dim, load,
                zipf ? "zipf" : "uniform");
  return buf;
}

void register_all() {
  for (op o : {op::find, op::find_or_insert, op::insert_or_assign})
    for (std::size_t dim : {16, 64, 128})
      for (double load : {0.5, 0.8})
        for (bool zipf : {false, true}) {
          const std::string s = suffix(dim, load, zipf);
          const std::string name = op_name(o);
          benchmark::RegisterBenchmark(("cache_" + name + "/host/" + s).c_str(),
                                       bm_cache<host_space>, o, dim, load, zipf, false)
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
          benchmark::RegisterBenchmark(("baseline_" + name + "/tbb_chm/" + s).c_str(), bm_tbb, o,
                                       dim, load, zipf)
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
#if defined(EMBCACHE_BENCH_ABSL)
          benchmark::RegisterBenchmark(("baseline_" + name + "/absl_flat/" + s).c_str(), bm_absl, o,
                                       dim, load, zipf)
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
#endif
          benchmark::RegisterBenchmark(("baseline_" + name + "/std_umap/" + s).c_str(), bm_umap, o,
                                       dim, load, zipf)
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
        }
  for (op o : {op::find, op::find_or_insert, op::insert_or_assign})
    for (bool zipf : {false, true})
      benchmark::RegisterBenchmark(
          ("cache_" + std::string(op_name(o)) + "/host_spare/" + suffix(64, 0.8, zipf)).c_str(),
          bm_cache<host_space>, o, 64, 0.8, zipf, true)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  for (std::size_t dim : {64, 192})
    for (bool moved : {false, true})
      benchmark::RegisterBenchmark(("cache_install/host/dim:" + std::to_string(dim) +
                                    (moved ? "/rows:moved" : "/rows:copied"))
                                       .c_str(),
                                   bm_install<host_space>, dim, moved)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
#if defined(EMBCACHE_BENCH_CUDA)
  if (embcache::cuda_device_available()) {
    for (op o : {op::find, op::find_or_insert, op::insert_or_assign})
      for (bool zipf : {false, true})
        benchmark::RegisterBenchmark(
            ("cache_" + std::string(op_name(o)) + "/cuda_spare/" + suffix(32, 0.5, zipf)).c_str(),
            bm_cache<embcache::cuda_space>, o, 32, 0.5, zipf, true)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
    for (std::size_t dim : {64, 192})
      for (bool moved : {false, true})
        benchmark::RegisterBenchmark(("cache_install/cuda/dim:" + std::to_string(dim) +
                                      (moved ? "/rows:moved" : "/rows:copied"))
                                         .c_str(),
                                     bm_install<embcache::cuda_space>, dim, moved)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
  }
  // The cuda space, when this build has it and a device is present; dim 32 is the configuration
  // GPU tables are usually compared at.
  if (embcache::cuda_device_available())
    for (op o : {op::find, op::find_or_insert, op::insert_or_assign})
      for (std::size_t dim : {16, 32, 64, 128})
        for (double load : {0.5, 0.8})
          for (bool zipf : {false, true})
            benchmark::RegisterBenchmark(
                ("cache_" + std::string(op_name(o)) + "/cuda/" + suffix(dim, load, zipf)).c_str(),
                bm_cache<embcache::cuda_space>, o, dim, load, zipf, false)
                ->Unit(benchmark::kMicrosecond)
                ->UseRealTime();
#endif
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
