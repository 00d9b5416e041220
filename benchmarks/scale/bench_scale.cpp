// bench_scale: the training cache over a RocksDB or log table far larger than the process's
// memory. Driven by run_scale.sh, which runs it under a memory cgroup; not in CI.
//
//   bench_scale build DIR ROWS WIDTH
//     writes a table of ROWS rows of WIDTH floats into DIR/db: ascending keys in large write
//     batches with the WAL off, so that flushes produce non-overlapping SST files that
//     compaction moves instead of rewriting.
//   bench_scale build-log DIR ROWS WIDTH
//     writes the same rows into a log store at DIR/log (O_DIRECT where the file system allows).
//   bench_scale passes DIR ROWS WIDTH [name=value ...]
//     runs keyset passes of a training cache over that table (or, with host=1, over a host store
//     holding it: the in-memory baseline) and prints one JSON line per pass and one summary line.
//
// Options of `passes` (defaults in brackets):
//   passes=N [4]          passes (the first, which only fills the cache, is reported apart)
//   fraction=F [0.05]     distinct keys of a pass's keyset as a fraction of the table
//   zipf=S [1.05]         exponent of the Zipf law the keys are drawn from (hot keys recur)
//   prefetch=0|1 [1]      stage pass k+1 while pass k trains (0: synchronous begin_pass)
//   budget=BYTES [0]      memory budget: plan_memory sizes the block cache, memtables and DRAM
//                         tier from it (0: the options below)
//   dram_tier=0|1 [0]     a tiered_store in front of RocksDB (sized by the budget)
//   direct_reads=0|1 [1]  RocksDB reads with O_DIRECT (the page cache does not serve the table)
//   block_cache=BYTES [64 MiB]  without a budget
//   staging=BYTES, write_back=BYTES  training_cache_options::staging_bytes and write_back_bytes
//                         [a quarter and a 32nd of the budget; without one the cache's defaults]
//   train_rows_per_s=R [50000]  the simulated training consumes the keyset at this rate
//                         (every row is rewritten once, then the pass waits out the rest)
//   host=0|1 [0]          the baseline: the table in a host_store (loaded first, not timed)
//   log=0|1 [0]           the log store at DIR/log instead of RocksDB (direct_reads: O_DIRECT;
//                         the budget counts its index, sized for ROWS)
//   seed=N [1]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "embcache/embedding_cache.hpp"
#include "embcache/host_store.hpp"
#include "embcache/log_store.hpp"
#include "embcache/memory_plan.hpp"
#include "embcache/rocksdb_store.hpp"
#include "embcache/tiered_store.hpp"
#include "embcache/training_cache.hpp"

namespace {

using key = std::int64_t;
using clock_type = std::chrono::steady_clock;
using embcache::status;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

void check(const status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench_scale: %s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

// Keys are spread over the int64 range (not dense), ascending with the row.
key key_of(std::uint64_t row) { return static_cast<key>(row * 7919 + 13); }

double peak_rss_mib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

std::map<std::string, std::string> parse_options(int argc, char** argv, int first) {
  std::map<std::string, std::string> o;
  for (int i = first; i < argc; ++i) {
    const char* eq = std::strchr(argv[i], '=');
    if (!eq) {
      std::fprintf(stderr, "bench_scale: expected name=value, got '%s'\n", argv[i]);
      std::exit(2);
    }
    o[std::string(argv[i], static_cast<std::size_t>(eq - argv[i]))] = eq + 1;
  }
  return o;
}

double number(const std::map<std::string, std::string>& o, const char* name, double fallback) {
  auto it = o.find(name);
  return it == o.end() ? fallback : std::strtod(it->second.c_str(), nullptr);
}

embcache::rocksdb_store_options store_options(const std::string& dir, std::size_t width) {
  embcache::rocksdb_store_options o;
  o.path = dir + "/db";
  o.table_name = "scale";
  o.row_width = width;
  o.existing_rows = embcache::existing_rows_policy::reuse;
  o.block_cache_bytes = std::size_t{64} << 20;
  o.write_buffer_bytes = std::size_t{64} << 20;
  o.max_write_buffers = 2;
  o.partition_index_and_filters = true;
  o.cache_index_and_filter_blocks = true;
  o.use_direct_io_for_flush_and_compaction = true;
  o.dynamic_level_bytes = true;
  o.max_subcompactions = 2;
  o.read_threads = 32;  // MultiGets in flight: the SSD's queue depth (docs/stores.md)
  return o;
}

// Pushes the table's ROWS rows (ascending keys, in batches of 65536), then flushes: every
// build writes the same rows. Returns the seconds it took.
double write_table(embcache::param_store<key>& store, std::uint64_t rows, std::size_t width) {
  const std::size_t chunk = 1 << 16;
  std::vector<key> keys(chunk);
  std::vector<float> values(chunk * width);
  const auto t0 = clock_type::now();
  for (std::uint64_t b = 0; b < rows; b += chunk) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, rows - b));
    for (std::size_t i = 0; i < n; ++i) {
      keys[i] = key_of(b + i);
      std::fill_n(values.begin() + i * width, width, float((b + i) % 1009) * 0.001f);
    }
    check(store.push(keys.data(), n, values.data()), "writing the table");
    if ((b / chunk) % 64 == 63)
      std::fprintf(stderr, "bench_scale: %llu rows written, %.0f s\n",
                   static_cast<unsigned long long>(b + n), seconds_since(t0));
  }
  check(store.flush(), "flushing the table");
  return seconds_since(t0);
}

int build(const std::string& dir, std::uint64_t rows, std::size_t width) {
  auto o = store_options(dir, width);
  o.existing_rows = embcache::existing_rows_policy::refuse;
  auto opened = embcache::rocksdb_store<key>::open(o);
  check(opened.get_status(), "opening the table");
  const double s = write_table(*opened.value(), rows, width);
  std::printf("{\"build_rows\": %llu, \"width\": %zu, \"seconds\": %.1f, \"rows_per_s\": %.0f}\n",
              static_cast<unsigned long long>(rows), width, s, double(rows) / s);
  return 0;
}

embcache::log_store_options log_options(const std::string& dir, std::uint64_t rows,
                                        std::size_t width) {
  embcache::log_store_options o;
  o.path = dir + "/log";
  o.table_name = "scale";
  o.row_width = width;
  o.expected_rows = rows;
  o.direct_io = embcache::direct_io_supported(dir);
  return o;
}

int build_log(const std::string& dir, std::uint64_t rows, std::size_t width) {
  auto o = log_options(dir, rows, width);
  o.reuse_rows = false;
  auto opened = embcache::log_store<key>::open(o);
  check(opened.get_status(), "opening the log table");
  const double s = write_table(*opened.value(), rows, width);
  std::printf(
      "{\"build_log_rows\": %llu, \"width\": %zu, \"seconds\": %.1f, \"rows_per_s\": %.0f, "
      "\"direct_io\": %d}\n",
      static_cast<unsigned long long>(rows), width, s, double(rows) / s, int(o.direct_io));
  return 0;
}

// Draws keysets of `distinct` keys from a Zipf law over the table's rows (a continuous
// approximation of the inverse CDF); the ranks are scattered over the rows by a multiplicative
// hash, so that hot keys are not neighbours on disk. A keyset that is a large fraction of the
// table (the in-memory baseline's) ends with uniform keys: the law's tail is too rarely drawn.
class zipf_keys {
 public:
  zipf_keys(std::uint64_t rows, double s, std::uint64_t seed) : rows_(rows), s_(s), rng_(seed) {}
  std::vector<key> keyset(std::size_t distinct) {
    std::vector<std::uint64_t> seen((rows_ + 63) / 64);  // a bit per row: bounded memory
    std::vector<key> out;
    out.reserve(distinct);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const double a = 1.0 - s_, top = std::pow(double(rows_), a);
    // A Zipf law rarely reaches its tail: after 16 draws per key wanted, the rest is uniform.
    for (std::size_t draws = 0; out.size() < distinct; ++draws) {
      const double x = std::abs(a) < 1e-9 ? std::pow(double(rows_), u(rng_))
                                          : std::pow((top - 1.0) * u(rng_) + 1.0, 1.0 / a);
      const std::uint64_t rank =
          std::min<std::uint64_t>(rows_ - 1, std::max<std::uint64_t>(1, std::uint64_t(x)) - 1);
      const std::uint64_t row =
          draws < 16 * distinct ? (rank * 0x9E3779B97F4A7C15ull) % rows_ : rng_() % rows_;
      std::uint64_t& word = seen[row / 64];
      const std::uint64_t bit = std::uint64_t{1} << (row % 64);
      if (word & bit) continue;
      word |= bit;
      out.push_back(key_of(row));
    }
    return out;
  }

 private:
  std::uint64_t rows_;
  double s_;
  std::mt19937_64 rng_;
};

int passes(const std::string& dir, std::uint64_t rows, std::size_t width,
           const std::map<std::string, std::string>& opt) {
  const int num_passes = int(number(opt, "passes", 4));
  const double fraction = number(opt, "fraction", 0.05);
  const bool prefetch = number(opt, "prefetch", 1) != 0;
  const bool host = number(opt, "host", 0) != 0;
  const bool log = number(opt, "log", 0) != 0;
  const bool dram_tier = number(opt, "dram_tier", 0) != 0;
  const std::uint64_t budget = std::uint64_t(number(opt, "budget", 0));
  const double train_rate = number(opt, "train_rows_per_s", 5e4);
  const std::size_t distinct = std::size_t(double(rows) * fraction);
  const std::size_t capacity = distinct;
  zipf_keys draw(rows, number(opt, "zipf", 1.05), std::uint64_t(number(opt, "seed", 1)));

  // The budget: the cache (its slots and buckets), the staging and write-behind rows, the rest.
  embcache::cache_options co;
  co.dim = width;
  using table_type = embcache::embedding_cache<key, embcache::host_space>;
  std::uint64_t slots = 0;
  embcache::table_slots(capacity, 0, &slots);  // cannot overflow: capacity < rows
  slots = (slots + table_type::bucket_size - 1) / table_type::bucket_size * table_type::bucket_size;
  // The staging and write-back bounds: given, or a quarter and a 32nd of the budget.
  embcache::training_cache_options copt;
  copt.staging_bytes =
      std::size_t(number(opt, "staging", budget ? double(budget / 4) : double(copt.staging_bytes)));
  copt.write_back_bytes = std::size_t(
      number(opt, "write_back", budget ? double(budget / 32) : double(copt.write_back_bytes)));
  if (budget != 0) copt.prefetch_batch = 16384;
  embcache::memory_plan plan;
  auto o = store_options(dir, width);
  o.use_direct_reads = number(opt, "direct_reads", 1) != 0;
  auto lo = log_options(dir, rows, width);
  lo.direct_io = lo.direct_io && o.use_direct_reads;
  o.block_cache_bytes = std::size_t(number(opt, "block_cache", double(64 << 20)));
  if (budget != 0) {
    embcache::memory_plan_options po;
    po.budget_bytes = budget;
    po.cache_bytes = slots * table_type::bytes_per_slot(co) +
                     slots / table_type::bucket_size * table_type::bytes_per_bucket +
                     slots * table_type::scratch_bytes_per_slot;
    // What the training cache reserves with the options below: the staged rows (at most
    // staging_bytes), 41 bytes of keys per key, three write-behind buffers of write_back_bytes
    // with their keys and versions, the worker's two batches of rows.
    const std::uint64_t row = width * sizeof(float);
    const std::uint64_t chunk =
        std::min<std::uint64_t>(capacity, std::max<std::uint64_t>(1, copt.write_back_bytes / row));
    po.staging_bytes = std::min<std::uint64_t>(copt.staging_bytes, capacity * row) +
                       std::uint64_t(capacity) * 41 + chunk * (3 * row + 16) +
                       2 * std::min<std::uint64_t>(capacity, copt.prefetch_batch) * row;
    po.other_bytes = std::uint64_t(distinct) * 3 * sizeof(key);  // the keysets in flight
    po.rocksdb_column_families = log ? 0 : 2;
    if (log) po.other_bytes += embcache::log_store<key>::memory_bound(std::size_t(rows), lo);
    po.dram_tier = dram_tier;
    auto p = embcache::plan_memory(po);
    check(p.get_status(), "budget");
    plan = p.value();
    embcache::apply_memory_plan(plan, 1, o);
  }
  std::shared_ptr<embcache::param_store<key>> store;
  if (host) {
    // The baseline: every row in host memory (copied from the RocksDB table, not timed).
    embcache::host_store_options ho;
    ho.table_name = "scale";
    ho.row_width = width;
    auto hs = std::make_shared<embcache::host_store<key>>(ho);
    auto src = embcache::rocksdb_store<key>::open(o);
    check(src.get_status(), "opening the table");
    check(src.value()->for_each(1 << 16, [&](const key* k, const float* r, const std::uint64_t* v,
                                             std::size_t n) { return hs->push(k, n, r, v); }),
          "loading the host store");
    store = hs;
  } else if (log) {
    auto ls = embcache::log_store<key>::open(lo);
    check(ls.get_status(), "opening the log table");
    store = std::shared_ptr<embcache::param_store<key>>(std::move(ls).value());
  } else {
    auto rs = embcache::rocksdb_store<key>::open(o);
    check(rs.get_status(), "opening the table");
    store = std::shared_ptr<embcache::param_store<key>>(std::move(rs).value());
    if (dram_tier) {
      embcache::tiered_store_options<key> to;
      to.lower = store;
      to.dram_bytes = std::size_t(plan.dram_tier_bytes ? plan.dram_tier_bytes : 256u << 20);
      auto ts = embcache::tiered_store<key>::open(std::move(to));
      check(ts.get_status(), "opening the DRAM tier");
      store = std::shared_ptr<embcache::param_store<key>>(std::move(ts).value());
    }
  }
  embcache::table_options<key> t;
  t.name = "scale";
  t.dim = width;
  t.capacity = capacity;
  t.max_resident = capacity;
  t.store = store;
  embcache::training_cache<key> cache(copt, {t});

  std::printf(
      "{\"rows\": %llu, \"width\": %zu, \"keyset\": %zu, \"host\": %d, \"log\": %d, \"prefetch\": "
      "%d, "
      "\"budget\": %llu, \"block_cache\": %zu, \"memtables\": %llu, \"dram_tier\": %llu, "
      "\"direct_reads\": %d, \"staging\": %zu, \"write_back\": %zu, \"plan_staging\": %llu}\n",
      static_cast<unsigned long long>(rows), width, distinct, int(host), int(log), int(prefetch),
      static_cast<unsigned long long>(budget), o.block_cache_bytes,
      static_cast<unsigned long long>(plan.memtable_bytes),
      static_cast<unsigned long long>(plan.dram_tier_bytes),
      int(log ? lo.direct_io : o.use_direct_reads), copt.staging_bytes, copt.write_back_bytes,
      static_cast<unsigned long long>(plan.staging_bytes));
  std::fflush(stdout);
  std::vector<key> current = draw.keyset(distinct), next;
  const std::size_t batch = 8192;
  std::vector<float> values(batch * width);
  double sum_begin = 0, sum_wait = 0, sum_pulled = 0, sum_pull_s = 0, sum_pushed = 0,
         sum_push_s = 0;
  int measured = 0;
  for (int p = 0; p < num_passes; ++p) {
    auto t0 = clock_type::now();
    check(cache.begin_pass({current}), "begin_pass");
    const double begin_s = seconds_since(t0);
    if (p + 1 < num_passes) {
      next = draw.keyset(distinct);
      if (prefetch) check(cache.prefetch({next}), "prefetch");
    }
    // Training: every row of the keyset rewritten once (so every row is dirty), then the pass
    // lasts as long as the simulated training rate says.
    t0 = clock_type::now();
    for (std::size_t b = 0; b < current.size(); b += batch) {
      const std::size_t n = std::min(batch, current.size() - b);
      std::fill_n(values.begin(), n * width, float(p + 1));
      check(cache.assign(0, current.data() + b, n, values.data()), "assign");
    }
    const double work_s = seconds_since(t0), want_s = double(current.size()) / train_rate;
    if (work_s < want_s)
      std::this_thread::sleep_for(std::chrono::duration<double>(want_s - work_s));
    const embcache::table_counters& c = cache.counters().last[0];
    const double pulled = double(c.rows_pulled + c.rows_staged);
    const double pull_s = c.seconds_swap_in + c.seconds_staging;
    const double push_s = c.seconds_write_back + c.seconds_write_behind;
    std::printf(
        "{\"pass\": %d, \"begin_pass_s\": %.3f, \"prefetch_wait_s\": %.3f, \"rows_in\": "
        "%.0f, \"pull_s\": %.3f, \"pull_rows_per_s\": %.0f, \"rows_pushed\": %llu, "
        "\"push_s\": %.3f, \"push_rows_per_s\": %.0f, \"train_s\": %.2f, \"peak_rss_mib\": "
        "%.0f}\n",
        p + 1, begin_s, c.seconds_prefetch_wait, pulled, pull_s, pull_s > 0 ? pulled / pull_s : 0.0,
        static_cast<unsigned long long>(c.rows_pushed), push_s,
        push_s > 0 ? double(c.rows_pushed) / push_s : 0.0, seconds_since(t0), peak_rss_mib());
    std::fflush(stdout);
    if (p > 0) {  // the first pass fills an empty cache: not a steady pass
      sum_begin += begin_s;
      sum_wait += c.seconds_prefetch_wait;
      sum_pulled += pulled;
      sum_pull_s += pull_s;
      sum_pushed += double(c.rows_pushed);
      sum_push_s += push_s;
      ++measured;
    }
    current.swap(next);
  }
  auto t0 = clock_type::now();
  check(cache.end_training(), "end_training");
  const double end_s = seconds_since(t0);
  std::printf(
      "{\"summary\": true, \"passes_measured\": %d, \"begin_pass_s\": %.3f, "
      "\"prefetch_wait_s\": %.3f, \"pull_rows_per_s\": %.0f, \"push_rows_per_s\": %.0f, "
      "\"end_training_s\": %.2f, \"peak_rss_mib\": %.0f}\n",
      measured, measured ? sum_begin / measured : 0.0, measured ? sum_wait / measured : 0.0,
      sum_pull_s > 0 ? sum_pulled / sum_pull_s : 0.0,
      sum_push_s > 0 ? sum_pushed / sum_push_s : 0.0, end_s, peak_rss_mib());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || (std::strcmp(argv[1], "build") != 0 && std::strcmp(argv[1], "build-log") != 0 &&
                   std::strcmp(argv[1], "passes") != 0)) {
    std::fprintf(stderr,
                 "usage: bench_scale build DIR ROWS WIDTH\n"
                 "       bench_scale build-log DIR ROWS WIDTH\n"
                 "       bench_scale passes DIR ROWS WIDTH [name=value ...]\n");
    return 2;
  }
  const std::string dir = argv[2];
  const std::uint64_t rows = std::strtoull(argv[3], nullptr, 10);
  const std::size_t width = std::strtoull(argv[4], nullptr, 10);
  if (rows == 0 || width == 0) {
    std::fprintf(stderr, "bench_scale: ROWS and WIDTH must be positive\n");
    return 2;
  }
  if (std::strcmp(argv[1], "build") == 0) return build(dir, rows, width);
  if (std::strcmp(argv[1], "build-log") == 0) return build_log(dir, rows, width);
  return passes(dir, rows, width, parse_options(argc, argv, 5));
}
