// embcache-prep: Criteo TSV, or TSV of a dataset schema (--schema), plain or gzip, to shards,
// keysets and manifest.json.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "cli_checks.hpp"
#include "dataset_cli.hpp"
#include "embcache/criteo.hpp"
#include "embcache/detail/progress.hpp"
#include "tool_log.hpp"

namespace {

// Progress by input bytes consumed (compressed bytes for gzip), one meter per pass: a line every
// 10% (at most one per 2 s) or after 30 s without one.
class prep_reporter {
 public:
  explicit prep_reporter(std::size_t files) : files_(files) {}
  void operator()(const embcache::prep_progress& p) {
    if (!meter_ || p.pass != pass_) {
      meter_.emplace(p.input_total);
      pass_ = p.pass;
    }
    if (!meter_->due(p.input_bytes)) return;
    spdlog::info("prep pass {}/{}{}: {} (file {} of {}, {} lines)", p.pass, p.passes,
                 p.passes > 1 ? (p.pass == 1 ? " (counting)" : " (writing)") : "",
                 meter_->byte_text(p.input_bytes), p.file_index + 1, files_, p.lines);
  }

 private:
  std::size_t files_;
  int pass_ = 0;
  std::optional<embcache::detail::progress_meter> meter_;
};

int prep_main(int argc, char** argv) {
  CLI::App app{
      "Converts Criteo TSV files (label, I1..I13, C1..C26; plain or gzip), or TSV files of "
      "the columns a --schema file names, into binary shards with one keyset per shard and "
      "table, and a manifest.json."};
  std::string schema_file;
  embcache::prep_options opts;
  embcache::tools::dataset_cli dataset;
  std::string transform = "log1p";
  embcache::tools::standard_options(app, "embcache-prep");
  app.add_option("inputs", opts.inputs, "TSV files, plain or gzip ('-': standard input)")
      ->required();
  app.add_option("-o,--output", opts.output_dir, "Output folder (created)")->required();
  app.add_option("-n,--rows-per-shard", opts.rows_per_shard, "Rows per shard")
      ->capture_default_str()
      ->check(embcache::tools::integer_at_least(1));
  dataset.add_keyset_option(
      app, "Keyset files: 'embcache' (header + checksum) or 'raw' (HugeCTR: bare keys)");
  app.add_option("--rare-threshold", opts.rare_threshold,
                 "Values seen fewer times than this map to one OOV key per slot (adds a counting "
                 "pass); 0 or 1: off")
      ->capture_default_str();
  app.add_option("--schema", schema_file,
                 "JSON file of the input's columns: {\"label_column\": 0, \"dense\": [names], "
                 "\"categorical\": [names]} (default: Criteo's label, I1..I13, C1..C26)");
  app.add_flag("--cross", opts.cross, "Add 13 crossed keys per row: C1xC2, C3xC4, ..., C25xC26");
  app.add_flag("--strict", opts.strict, "Stop at the first malformed line");
  app.add_flag("--force", opts.overwrite, "Replace a dataset already in the output folder");
  app.add_option("--hash-seed", opts.parse.hash_seed, "Seed of the categorical hash")
      ->capture_default_str();
  app.add_option("--dense", transform, "Dense transform: 'log1p' (log(1+max(x,0))) or 'identity'")
      ->capture_default_str()
      ->check(CLI::IsMember({"log1p", "identity"}));
  app.add_option("--max-reported", opts.max_reported, "Malformed lines reported by file:line")
      ->capture_default_str();
  dataset.add_report_options(app,
                             "Skip the distinct-key counts (saves ~16 bytes per distinct key)");
  EMBCACHE_CLI_PARSE(app, argc, argv);
  embcache::tools::init_tool_log("embcache-prep");

  if (!schema_file.empty()) {
    std::ifstream in(schema_file, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) {
      spdlog::error("embcache-prep: cannot read schema file '{}'", schema_file);
      return embcache::tools::run_time_failure;
    }
    auto schema = embcache::parse_dataset_schema(text.str(), "'" + schema_file + "'");
    if (!schema.ok()) {
      spdlog::error("embcache-prep: {}", schema.get_status().to_string());
      return embcache::tools::run_time_failure;
    }
    opts.schema = std::move(schema).value();
  }
  opts.keyset = dataset.format();
  opts.parse.transform = transform == "identity" ? embcache::dense_transform::identity
                                                 : embcache::dense_transform::log1p;
  opts.unique_stats = dataset.unique_stats();
  if (dataset.progress) opts.on_progress = prep_reporter(opts.inputs.size());

  auto r = embcache::prepare_criteo(opts);
  if (!r.ok()) {
    spdlog::error("embcache-prep: {}", r.get_status().to_string());
    return embcache::tools::run_time_failure;
  }
  const embcache::prep_summary& s = r.value();
  const embcache::dataset_summary& d = s.dataset;
  for (const auto& line : s.reports) spdlog::warn("malformed: {}", line);
  if (s.malformed > s.reports.size()) {
    spdlog::warn("malformed: ... and {} more", s.malformed - s.reports.size());
  }
  std::printf("rows          %llu\n", static_cast<unsigned long long>(d.rows));
  std::printf("malformed     %llu of %llu lines\n", static_cast<unsigned long long>(s.malformed),
              static_cast<unsigned long long>(s.lines));
  std::printf("label mean    %.4f\n", d.label_mean);
  std::printf("shards        %zu in %s\n", d.shards.size(), opts.output_dir.c_str());
  if (opts.rare_threshold > 1) {
    std::printf("rare values   %llu replaced by OOV keys\n",
                static_cast<unsigned long long>(s.rare_replaced));
  }
  if (d.has_unique_stats) {
    std::printf("unique keys  ");
    for (std::size_t j = 0; j < d.unique_keys.size(); ++j) {
      std::printf(" %s=%llu", d.schema.categorical[j].c_str(),
                  static_cast<unsigned long long>(d.unique_keys[j]));
    }
    std::printf("\n");
    if (opts.cross) {
      std::printf("crossed keys  %llu unique\n",
                  static_cast<unsigned long long>(d.unique_crossed_keys));
    }
  }
  const double secs = s.seconds > 0 ? s.seconds : 1e-9;
  std::printf("throughput    %.0f rows/s, %.1f MB/s (%.2f s)\n",
              static_cast<double>(s.lines) / secs, static_cast<double>(s.bytes) / 1e6 / secs,
              s.seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return embcache::tools::run_tool("embcache-prep", &prep_main, argc, argv);
}
