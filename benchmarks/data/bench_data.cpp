// Data preparation throughput on synthetic Criteo-like TSV.
//
// data_read/*: the baseline, reading the file and splitting it into lines and fields (no
// parsing, no output). data_parse/*: plus parsing and hashing every line. data_prep/*: the
// whole of prepare_criteo (shards, keysets, unique-key statistics, fsyncs). Rows per second and
// input bytes per second are reported; the ratios to data_read are what matter.
//
// Environment: EMBCACHE_BENCH_ROWS (default 300000) rows of synthetic TSV, written once to a
// temporary folder (plain and gzip) and removed at exit.
#include <benchmark/benchmark.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "embcache/criteo.hpp"
#include "embcache/synth.hpp"

namespace {

namespace fs = std::filesystem;

struct inputs {
  fs::path dir;
  std::string tsv;
  std::string gz;
  std::uint64_t rows = 0;
  std::uint64_t bytes = 0;

  inputs() {
    const char* env = std::getenv("EMBCACHE_BENCH_ROWS");
    rows = env ? std::strtoull(env, nullptr, 10) : 300000;
    std::string tmpl = (fs::temp_directory_path() / "embcache-bench-data-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) std::abort();
    dir = tmpl;
    tsv = (dir / "in.tsv").string();
    gz = (dir / "in.tsv.gz").string();
    embcache::synth_options o;
    o.rows = rows;
    o.seed = 1;
    embcache::write_synth_tsv(tsv, o).throw_if_error();
    embcache::write_synth_tsv(gz, o).throw_if_error();
    bytes = fs::file_size(tsv);
  }
  ~inputs() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

inputs& data() {
  static inputs in;
  return in;
}

void set_counters(benchmark::State& state, std::uint64_t rows) {
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * rows));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * data().bytes));
}

// Reads through zlib (as prep does) and finds every tab and newline.
void BM_read(benchmark::State& state, bool gz) {
  const std::string& path = gz ? data().gz : data().tsv;
  std::string buf(1 << 20, '\0');
  std::uint64_t lines = 0;
  for (auto _ : state) {
    gzFile f = gzopen(path.c_str(), "rb");
    gzbuffer(f, 1 << 18);
    lines = 0;
    std::uint64_t fields = 0;
    int n;
    while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0) {
      for (const char* p = buf.data();
           (p = static_cast<const char*>(std::memchr(p, '\t', buf.data() + n - p))) != nullptr;
           ++p) {
        ++fields;
      }
      for (const char* p = buf.data();
           (p = static_cast<const char*>(std::memchr(p, '\n', buf.data() + n - p))) != nullptr;
           ++p) {
        ++lines;
      }
    }
    gzclose(f);
    benchmark::DoNotOptimize(fields);
  }
  set_counters(state, lines);
}

// Reads lines and parses them (hashing included), writing nothing.
void BM_parse(benchmark::State& state) {
  std::string text;
  {
    gzFile f = gzopen(data().tsv.c_str(), "rb");
    std::string buf(1 << 20, '\0');
    int n;
    while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0)
      text.append(buf, 0, n);
    gzclose(f);
  }
  embcache::criteo_parse_options opts;
  embcache::criteo_sample s;
  std::uint64_t rows = 0;
  for (auto _ : state) {
    rows = 0;
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      if (embcache::parse_criteo_line(std::string_view(text).substr(pos, nl - pos), opts, s).ok()) {
        ++rows;
      }
      pos = nl + 1;
    }
    benchmark::DoNotOptimize(s);
  }
  set_counters(state, rows);
}

void BM_prep(benchmark::State& state, bool gz, bool cross, std::uint32_t rare, bool unique) {
  embcache::prep_options o;
  o.inputs = {gz ? data().gz : data().tsv};
  o.output_dir = (data().dir / "out").string();
  o.rows_per_shard = 100000;
  o.cross = cross;
  o.rare_threshold = rare;
  o.unique_stats = unique;
  o.overwrite = true;
  std::uint64_t rows = 0;
  for (auto _ : state) {
    auto r = embcache::prepare_criteo(o);
    if (!r.ok()) {
      state.SkipWithError(r.get_status().to_string().c_str());
      return;
    }
    rows = r.value().dataset.rows;
  }
  set_counters(state, rows);
}

}  // namespace

BENCHMARK_CAPTURE(BM_read, tsv, false)
    ->Name("data_read/tsv")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_read, tsv_gz, true)
    ->Name("data_read/tsv_gz")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_parse)->Name("data_parse/tsv")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_prep, tsv, false, false, 0, true)
    ->Name("data_prep/tsv")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_prep, tsv_no_stats, false, false, 0, false)
    ->Name("data_prep/tsv/no_unique_stats")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_prep, tsv_gz, true, false, 0, true)
    ->Name("data_prep/tsv_gz")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_prep, cross, false, true, 0, true)
    ->Name("data_prep/tsv/cross")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_prep, rare, false, false, 2, true)
    ->Name("data_prep/tsv/rare:2")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);

BENCHMARK_MAIN();
