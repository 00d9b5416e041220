// bench_store_ssd: pulls from a RocksDB table larger than its caches, with direct reads so that
// the page cache does not serve it either: what a table larger than memory costs per row.
//   store_pull_ssd/rocksdb/read_threads:N/batched:B   the store's batched pull (sorted
//                                           MultiGets, N in flight; 0 = one per core) of a uniform
//                                           sample of keys; B = batched_direct_reads (the blocks
//                                           a MultiGet reads from one file in one io_uring
//                                           submission; only where rocksdb_batched_reads_available)
//                                           /read_path:P  0 automatic (the default), 1
//                                           multi_get, 2 scan (rocksdb_store_options::read_path)
//   store_pull_dense_ssd/rocksdb/read_path:P  the same pull of a dense sample: about every other
//                                           row of a range of the table, as a keyset pass over a
//                                           table it mostly covers asks for (8 read threads)
//   baseline_pull_ssd/rocksdb_get_loop      one Get per key, in the sample's order, over the same
//                                           database and options (read-only open)
// Every case opens the database afresh (empty block and row caches) and reads the same keys;
// the loop reads the first EMBCACHE_BENCH_SSD_LOOP keys of the sample (its rate is per key).
// Two more cases compare the two ways of keeping hot rows in DRAM, each given the same bytes:
//   store_pull_hot/tiered_store     a tiered_store in front of the table
//   store_pull_hot/rocksdb_row_cache  RocksDB's row cache
// Both pull a hot set once (not measured), then pull it again in another order (measured).
// Environment (sizes in rows): EMBCACHE_BENCH_SSD_ROWS table rows (default 2M: ~0.8 GB on disk
// at the default width), EMBCACHE_BENCH_SSD_WIDTH floats per row (default 96: dim 32 with Adam),
// EMBCACHE_BENCH_SSD_PULL keys per pull (default 100k), EMBCACHE_BENCH_SSD_LOOP keys of the loop
// (default 20k), EMBCACHE_BENCH_SSD_HOT hot rows (default 100k), EMBCACHE_BENCH_SSD_CACHE_MB the
// block cache of every case, in MiB (default 64), EMBCACHE_BENCH_SSD_BLOCK_BYTES the table's
// data blocks (default 0: derived from the row, a 4 KiB page), EMBCACHE_BENCH_SSD_DIR folder of
// the table, kept and reused by later runs (default: a temporary folder, removed at the end).
#include <benchmark/benchmark.h>
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "embcache/rocksdb_store.hpp"
#include "embcache/tiered_store.hpp"

namespace {

namespace fs = std::filesystem;
using key = std::int64_t;
using clock_type = std::chrono::steady_clock;

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

const std::size_t g_rows = env_size("EMBCACHE_BENCH_SSD_ROWS", 2'000'000);
const std::size_t g_width = env_size("EMBCACHE_BENCH_SSD_WIDTH", 96);
const std::size_t g_pull = std::min(g_rows, env_size("EMBCACHE_BENCH_SSD_PULL", 100'000));
const std::size_t g_loop = std::min(g_pull, env_size("EMBCACHE_BENCH_SSD_LOOP", 20'000));
const std::size_t g_hot = std::min(g_rows, env_size("EMBCACHE_BENCH_SSD_HOT", 100'000));
const std::size_t block_cache_bytes = env_size("EMBCACHE_BENCH_SSD_CACHE_MB", 64) << 20;
// The table's data blocks (rocksdb_store_options::block_bytes; 0: derived from the row).
const std::size_t g_block_bytes = env_size("EMBCACHE_BENCH_SSD_BLOCK_BYTES", 0);
std::string g_dir;
bool g_remove_dir = false;

// Keys ascend with the row index, so the build writes non-overlapping SST files (no
// compaction rewrites them); pulls ask for them in random order.
key key_of(std::size_t row) { return static_cast<key>(row) * 7919 + 13; }

void check(const embcache::status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench_store_ssd: %s\n", s.to_string().c_str());
    std::exit(1);
  }
}

void check(const rocksdb::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench_store_ssd: rocksdb: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

embcache::rocksdb_store_options ssd_options() {
  embcache::rocksdb_store_options o;
  o.path = g_dir + "/db";
  o.table_name = "bench";
  o.row_width = g_width;
  o.existing_rows = embcache::existing_rows_policy::reuse;
  o.block_cache_bytes = block_cache_bytes;
  o.block_bytes = g_block_bytes;
  o.write_buffer_bytes = std::size_t{64} << 20;
  o.max_write_buffers = 2;
  o.use_direct_reads = true;
  o.use_direct_io_for_flush_and_compaction = true;
  o.partition_index_and_filters = true;
  o.cache_index_and_filter_blocks = true;
  return o;
}

std::unique_ptr<embcache::rocksdb_store<key>> open_store(const embcache::rocksdb_store_options& o) {
  auto r = embcache::rocksdb_store<key>::open(o);
  check(r.get_status());
  return std::move(r).value();
}

// Builds the table once (a marker file records its size), in ascending key order.
void build_table() {
  const std::string marker = g_dir + "/built";
  std::string want = std::to_string(g_rows) + " " + std::to_string(g_width);
  if (g_block_bytes) want += " " + std::to_string(g_block_bytes);
  std::string have;
  std::getline(std::ifstream(marker), have);
  if (have == want) return;
  fs::remove_all(g_dir + "/db");
  fs::remove(marker);
  auto s = open_store(ssd_options());
  const std::size_t chunk = 1 << 20;
  std::vector<key> keys(chunk);
  std::vector<float> rows(chunk * g_width);
  const auto t0 = clock_type::now();
  for (std::size_t b = 0; b < g_rows; b += chunk) {
    const std::size_t n = std::min(chunk, g_rows - b);
    for (std::size_t i = 0; i < n; ++i) {
      keys[i] = key_of(b + i);
      for (std::size_t j = 0; j < g_width; ++j)
        rows[i * g_width + j] = static_cast<float>((b + i) % 10007) + static_cast<float>(j);
    }
    check(s->push(keys.data(), n, rows.data()));
    std::fprintf(stderr, "bench_store_ssd: built %zu of %zu rows\r", b + n, g_rows);
  }
  check(s->flush());
  const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  std::fprintf(stderr, "\nbench_store_ssd: %zu rows of %zu floats in %.0f s\n", g_rows, g_width,
               secs);
  s.reset();
  std::ofstream(marker) << want << "\n";
}

// A uniform sample of the table's keys (distinct rows when the sample is small).
std::vector<key> sample(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> row(0, g_rows - 1);
  std::vector<key> out(n);
  for (auto& k : out) k = key_of(row(rng));
  return out;
}

const std::vector<key>& pull_keys() {
  static const std::vector<key> keys = sample(g_pull, 42);
  return keys;
}

void verify(const std::vector<key>& keys, const float* rows, const bool* found) {
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto r = static_cast<std::size_t>((keys[i] - 13) / 7919);
    if (!found[i] || rows[i * g_width + 1] != static_cast<float>(r % 10007) + 1.f) {
      std::fprintf(stderr, "bench_store_ssd: wrong row for key %lld\n",
                   static_cast<long long>(keys[i]));
      std::exit(1);
    }
  }
}

void report(benchmark::State& state, std::size_t rows) {
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(rows));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(rows * g_width * 4));
  state.counters["table_rows"] = static_cast<double>(g_rows);
}

// CPU seconds the process has used (every thread), user and system.
double process_cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// About every other row of a range of the table, in random order: g_pull keys.
const std::vector<key>& dense_keys() {
  static const std::vector<key> keys = [] {
    std::mt19937_64 rng(43);
    const std::size_t span = std::min(g_rows, 2 * g_pull), first = (g_rows - span) / 3;
    std::vector<key> out;
    for (std::size_t r = first; r < first + span && out.size() < g_pull; ++r)
      if (rng() & 1) out.push_back(key_of(r));
    std::shuffle(out.begin(), out.end(), rng);
    return out;
  }();
  return keys;
}

embcache::rocksdb_read_path read_path_arg(std::int64_t p) {
  return p == 1   ? embcache::rocksdb_read_path::multi_get
         : p == 2 ? embcache::rocksdb_read_path::scan
                  : embcache::rocksdb_read_path::automatic;
}

void pull_ssd(benchmark::State& state, const std::vector<key>& keys) {
  auto o = ssd_options();
  o.read_threads = static_cast<int>(state.range(0));
  o.batched_direct_reads = state.range(1) != 0;
  o.read_path = read_path_arg(state.range(2));
  auto s = open_store(o);
  std::vector<float> out(keys.size() * g_width);
  std::unique_ptr<bool[]> found(new bool[keys.size()]);
  double cpu = 0;
  const auto batched_before = embcache::rocksdb_batched_reads_done();
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    const double c0 = process_cpu_s();
    check(s->pull(keys.data(), keys.size(), out.data(), found.get()));
    cpu += process_cpu_s() - c0;
    state.SetIterationTime(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  // CPU microseconds per row pulled: what the reads cost the cores beside their wait.
  state.counters["cpu_us_per_row"] =
      cpu * 1e6 / static_cast<double>(state.iterations() * keys.size());
  // Reads each batched submission put in flight (0: none was batched).
  const auto batched = embcache::rocksdb_batched_reads_done();
  const auto multi_reads = batched.multi_reads - batched_before.multi_reads;
  state.counters["blocks_per_submission"] =
      multi_reads ? static_cast<double>(batched.blocks - batched_before.blocks) /
                        static_cast<double>(multi_reads)
                  : 0.0;
  // Of the keys, those read by scans (the rest by point lookups).
  const auto reads = s->read_counts();
  state.counters["scanned_fraction"] =
      static_cast<double>(reads.keys_scanned) /
      static_cast<double>(std::max<std::uint64_t>(1, reads.keys_scanned + reads.keys_looked_up));
  verify(keys, out.data(), found.get());
  report(state, keys.size());
}

void store_pull_ssd(benchmark::State& state) { pull_ssd(state, pull_keys()); }
void store_pull_dense_ssd(benchmark::State& state) { pull_ssd(state, dense_keys()); }

// The same database, options and keys, read with one Get per key.
void baseline_pull_ssd_get_loop(benchmark::State& state) {
  const auto eo = ssd_options();
  rocksdb::Options opt;
  opt.use_direct_reads = true;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(block_cache_bytes);
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(eo.bloom_bits_per_key, false));
  table.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
  table.partition_filters = true;
  table.cache_index_and_filter_blocks = true;
  opt.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  std::vector<rocksdb::ColumnFamilyDescriptor> descs{
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions(opt)},
      {"bench", rocksdb::ColumnFamilyOptions(opt)}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  check(rocksdb::DB::OpenForReadOnly(opt, eo.path, descs, &handles, &raw));
  std::unique_ptr<rocksdb::DB> db(raw);
  const auto& all = pull_keys();
  const std::vector<key> keys(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(g_loop));
  std::vector<float> out(keys.size() * g_width);
  std::unique_ptr<bool[]> found(new bool[keys.size()]);
  rocksdb::PinnableSlice value;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      // The store's encoding: big-endian with the sign bit flipped.
      std::uint64_t u = static_cast<std::uint64_t>(keys[i]) ^ (std::uint64_t{1} << 63);
      char kb[8];
      for (int b = 0; b < 8; ++b) kb[b] = static_cast<char>(u >> (56 - 8 * b));
      value.Reset();
      rocksdb::Status st =
          db->Get(rocksdb::ReadOptions(), handles[1], rocksdb::Slice(kb, 8), &value);
      found[i] = st.ok();
      if (st.ok()) std::memcpy(&out[i * g_width], value.data(), g_width * sizeof(float));
    }
    state.SetIterationTime(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  verify(keys, out.data(), found.get());
  for (auto* h : handles) check(db->DestroyColumnFamilyHandle(h));
  report(state, keys.size());
}

// Hot rows in DRAM: a tier, or RocksDB's row cache, of the same bytes.
void store_pull_hot(benchmark::State& state, bool tiered) {
  const std::size_t bytes = g_hot * embcache::tiered_store<key>::dram_row_bytes(g_width) * 5 / 4;
  auto o = ssd_options();
  if (!tiered) o.row_cache_bytes = bytes;
  std::shared_ptr<embcache::param_store<key>> s = open_store(o);
  if (tiered) {
    embcache::tiered_store_options<key> to;
    to.lower = s;
    to.dram_bytes = bytes;
    auto t = embcache::tiered_store<key>::open(to);
    check(t.get_status());
    s = std::move(t).value();
  }
  auto hot = sample(g_hot, 7);
  std::vector<float> out(hot.size() * g_width);
  std::unique_ptr<bool[]> found(new bool[hot.size()]);
  check(s->pull(hot.data(), hot.size(), out.data(), found.get()));  // brings them in
  std::shuffle(hot.begin(), hot.end(), std::mt19937_64(9));
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    check(s->pull(hot.data(), hot.size(), out.data(), found.get()));
    state.SetIterationTime(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  verify(hot, out.data(), found.get());
  report(state, hot.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* d = std::getenv("EMBCACHE_BENCH_SSD_DIR"); d && *d) {
    g_dir = d;
    fs::create_directories(g_dir);
  } else {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/bench_store_ssd_XXXXXX";
    if (!::mkdtemp(templ.data())) return 1;
    g_dir = templ;
    g_remove_dir = true;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  build_table();
  std::vector<benchmark::internal::Benchmark*> all;
  for (int batched : {0, 1})
    for (int threads : {0, 8, 32, 64})
      for (int path : {0, 1, 2})
        if (path == 0 || (threads == 8 && batched == 1))
          all.push_back(benchmark::RegisterBenchmark("store_pull_ssd/rocksdb", store_pull_ssd)
                            ->ArgNames({"read_threads", "batched", "read_path"})
                            ->Args({threads, batched, path}));
  for (int path : {0, 1, 2})
    all.push_back(benchmark::RegisterBenchmark("store_pull_dense_ssd/rocksdb", store_pull_dense_ssd)
                      ->ArgNames({"read_threads", "batched", "read_path"})
                      ->Args({8, 1, path}));
  all.push_back(benchmark::RegisterBenchmark("baseline_pull_ssd/rocksdb_get_loop",
                                             baseline_pull_ssd_get_loop));
  all.push_back(benchmark::RegisterBenchmark("store_pull_hot/tiered_store", store_pull_hot, true));
  all.push_back(
      benchmark::RegisterBenchmark("store_pull_hot/rocksdb_row_cache", store_pull_hot, false));
  // One pull is the run: a second would find the first one's blocks in the caches.
  for (auto* b : all) b->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (g_remove_dir) fs::remove_all(g_dir);
  return 0;
}
