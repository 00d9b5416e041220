// bench_store: pull and push of 1M rows with Adam state (row = 3 * dim floats) through each
// parameter store, beside two baselines on the same keys and rows:
//   baseline_<op>/memcpy       gather/scatter between flat arrays (the floor),
//   baseline_<op>/rocksdb_raw  one Get/Put per key on a RocksDB with default options.
// Each benchmark moves the whole table (1M rows, shuffled key order) per iteration. The raw
// push runs a single iteration (one Put per key with the write-ahead log, as default options
// do, takes seconds). The raw pull alone reads a sample: one Get per key from a database with
// no bloom filter and the small default block cache costs ~45 s per dim for the whole table, so
// it reads the first 64Ki keys of the same shuffled batch (a uniform random sample of the same
// table) and reports the same rates.
#include <benchmark/benchmark.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "embcache/detail/host_algorithms.hpp"
#include "embcache/host_store.hpp"
#include "embcache/rocksdb_store.hpp"

namespace {

using embcache::host_space;
namespace fs = std::filesystem;

std::size_t g_rows = std::size_t{1} << 20;
std::size_t g_raw_rows = std::size_t{1} << 16;

// Everything of one dim; built once and shared by the benchmarks of that dim.
struct dim_data {
  std::size_t dim = 0, width = 0;
  std::vector<std::int64_t> keys;  // key of flat row r
  std::vector<std::size_t> order;  // the batch: flat rows in shuffled order
  std::vector<std::int64_t> batch_keys;
  std::vector<float> table;       // flat rows (source of pulls, target of pushes)
  std::vector<float> batch_rows;  // rows in batch order
  std::unique_ptr<bool[]> found;
  std::string dir;
  std::unique_ptr<embcache::host_store<std::int64_t>> host;
  std::unique_ptr<embcache::rocksdb_store<std::int64_t>> rocks;
  std::unique_ptr<rocksdb::DB> raw;

  ~dim_data() {
    rocks.reset();
    raw.reset();
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
  std::size_t row_bytes() const { return width * sizeof(float); }
};

std::unique_ptr<dim_data> g_data;

void check(const embcache::status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench_store: %s\n", s.to_string().c_str());
    std::exit(1);
  }
}

void check(const rocksdb::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench_store: rocksdb: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

std::string raw_key(std::int64_t k) { return std::string(reinterpret_cast<const char*>(&k), 8); }

dim_data& data_for(std::size_t dim) {
  if (g_data && g_data->dim == dim) return *g_data;
  g_data.reset();  // one dim's data at a time: dim 128 alone is ~6 GB
  auto d = std::make_unique<dim_data>();
  d->dim = dim;
  d->width = 3 * dim;
  const std::size_t n = g_rows, w = d->width;
  d->keys.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    d->keys[i] = static_cast<std::int64_t>((i + 1) * 0x9E3779B97F4A7C15ULL);
  d->order.resize(n);
  std::iota(d->order.begin(), d->order.end(), std::size_t{0});
  std::shuffle(d->order.begin(), d->order.end(), std::mt19937_64(42));
  d->batch_keys.resize(n);
  for (std::size_t i = 0; i < n; ++i) d->batch_keys[i] = d->keys[d->order[i]];
  d->table.resize(n * w);
  for (std::size_t i = 0; i < n * w; ++i) d->table[i] = static_cast<float>(i % 9973) * 0.5f;
  d->batch_rows.resize(n * w);
  for (std::size_t i = 0; i < n; ++i)
    std::memcpy(&d->batch_rows[i * w], &d->table[d->order[i] * w], d->row_bytes());
  d->found.reset(new bool[n]);

  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/bench_store_XXXXXX";
  if (!::mkdtemp(templ.data())) std::exit(1);
  d->dir = templ;

  embcache::host_store_options ho;
  ho.table_name = "bench";
  ho.row_width = w;
  ho.expected_rows = n;
  d->host = std::make_unique<embcache::host_store<std::int64_t>>(ho);
  check(d->host->push(d->keys.data(), n, d->table.data()));

  embcache::rocksdb_store_options ro;
  ro.path = d->dir + "/tuned";
  ro.table_name = "bench";
  ro.row_width = w;
  ro.block_cache_bytes = std::size_t{6} << 30;  // holds the whole table: pulls hit the cache
  auto r = embcache::rocksdb_store<std::int64_t>::open(ro);
  check(r.get_status());
  d->rocks = std::move(r).value();
  check(d->rocks->push(d->keys.data(), n, d->table.data()));
  check(d->rocks->flush());
  check(d->rocks->pull(d->batch_keys.data(), n, d->batch_rows.data(), d->found.get()));  // warm

  // The raw baseline: default options, one Put per key, as a first try would look.
  rocksdb::Options opt;
  opt.create_if_missing = true;
  rocksdb::DB* db = nullptr;
  check(rocksdb::DB::Open(opt, d->dir + "/raw", &db));
  d->raw.reset(db);
  // Loaded in write batches: the load is setup, not measured.
  for (std::size_t b = 0; b < n; b += 4096) {
    rocksdb::WriteBatch wb;
    for (std::size_t i = b; i < std::min(n, b + 4096); ++i)
      check(
          wb.Put(raw_key(d->keys[i]),
                 rocksdb::Slice(reinterpret_cast<const char*>(&d->table[i * w]), d->row_bytes())));
    check(db->Write(rocksdb::WriteOptions(), &wb));
  }
  g_data = std::move(d);
  return *g_data;
}

void finish(benchmark::State& state, const dim_data& d, std::size_t rows = g_rows) {
  const auto n = static_cast<std::int64_t>(rows);
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * static_cast<std::int64_t>(d.row_bytes()));
}

// Gathers batch rows from the flat table: what a pull cannot beat.
struct gather {
  const dim_data* d;
  float* out;
  void prefetch(std::size_t i) const { __builtin_prefetch(&d->table[d->order[i] * d->width]); }
  void operator()(std::size_t i) const {
    std::memcpy(out + i * d->width, &d->table[d->order[i] * d->width], d->row_bytes());
  }
};

struct scatter {
  dim_data* d;
  const float* in;
  void prefetch(std::size_t i) const { __builtin_prefetch(&d->table[d->order[i] * d->width]); }
  void operator()(std::size_t i) const {
    std::memcpy(&d->table[d->order[i] * d->width], in + i * d->width, d->row_bytes());
  }
};

void baseline_pull_memcpy(benchmark::State& state, std::size_t dim) {
  auto& d = data_for(dim);
  gather g{&d, d.batch_rows.data()};
  for (auto _ : state) {
    embcache::detail::for_each_index(host_space{}, g_rows, g);
    benchmark::ClobberMemory();
  }
  finish(state, d);
}

void baseline_push_memcpy(benchmark::State& state, std::size_t dim) {
  auto& d = data_for(dim);
  scatter s{&d, d.batch_rows.data()};
  for (auto _ : state) {
    embcache::detail::for_each_index(host_space{}, g_rows, s);
    benchmark::ClobberMemory();
  }
  finish(state, d);
}

void store_pull_host(benchmark::State& state, std::size_t dim) {
  auto& d = data_for(dim);
  for (auto _ : state)
    check(d.host->pull(d.batch_keys.data(), g_rows, d.batch_rows.data(), d.found.get()));
  finish(state, d);
}

void store_push_host(benchmark::State& state, std::size_t dim) {
  auto& d = data_for(dim);
  for (auto _ : state) check(d.host->push(d.batch_keys.data(), g_rows, d.batch_rows.data()));
  finish(state, d);
}

void store_pull_rocksdb(benchmark::State& state, std::size_t dim) {
  auto& d = data_for(dim);
  for (auto _ : state)
    check(d.rocks->pull(d.batch_keys.data(), g_rows, d.batch_rows.data(), d.found.get()));
  finish(state, d);
}

void store_push_rocksdb(benchmark::State& state, std::size_t dim) {
  auto& d = data_for(dim);
  // The raw push (run just before) leaves flushes and compactions behind: closing the raw
  // database waits for them, so they do not share the two cores with this run.
  d.raw.reset();
  for (auto _ : state) check(d.rocks->push(d.batch_keys.data(), g_rows, d.batch_rows.data()));
  finish(state, d);
}

void baseline_pull_rocksdb_raw(benchmark::State& state, std::size_t dim) {
  auto& d = data_for(dim);
  std::string value;
  for (auto _ : state) {
    for (std::size_t i = 0; i < g_raw_rows; ++i) {
      check(d.raw->Get(rocksdb::ReadOptions(), raw_key(d.batch_keys[i]), &value));
      std::memcpy(&d.batch_rows[i * d.width], value.data(), d.row_bytes());
    }
  }
  finish(state, d, g_raw_rows);
}

void baseline_push_rocksdb_raw(benchmark::State& state, std::size_t dim) {
  auto& d = data_for(dim);
  for (auto _ : state) {
    for (std::size_t i = 0; i < g_rows; ++i)
      check(d.raw->Put(rocksdb::WriteOptions(), raw_key(d.batch_keys[i]),
                       rocksdb::Slice(reinterpret_cast<const char*>(&d.batch_rows[i * d.width]),
                                      d.row_bytes())));
  }
  finish(state, d);
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* r = std::getenv("EMBCACHE_BENCH_STORE_ROWS"))
    g_rows = std::strtoull(r, nullptr, 10);
  g_raw_rows = std::min(g_raw_rows, g_rows);
  using fn = void (*)(benchmark::State&, std::size_t);
  const std::pair<const char*, fn> cases[] = {
      {"baseline_pull/memcpy", baseline_pull_memcpy},
      {"store_pull/host", store_pull_host},
      {"baseline_pull/rocksdb_raw", baseline_pull_rocksdb_raw},
      {"store_pull/rocksdb", store_pull_rocksdb},
      {"baseline_push/memcpy", baseline_push_memcpy},
      {"store_push/host", store_push_host},
      {"baseline_push/rocksdb_raw", baseline_push_rocksdb_raw},
      {"store_push/rocksdb", store_push_rocksdb},
  };
  for (std::size_t dim : {16, 64, 128}) {
    for (auto& [name, f] : cases) {
      const std::string full = std::string(name) + "/dim:" + std::to_string(dim);
      auto* b = benchmark::RegisterBenchmark(full.c_str(), f, dim);
      b->Unit(benchmark::kMillisecond)->UseRealTime();
      // One pass over the table takes seconds for the RocksDB cases: one iteration is the run.
      if (std::strstr(name, "rocksdb"))
        b->Iterations(1);
      else
        b->MinTime(0.3);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_data.reset();
  return 0;
}
