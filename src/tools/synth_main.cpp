// embcache-synth: synthetic Criteo-like data as TSV or directly as a dataset folder.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "cli_checks.hpp"
#include "dataset_cli.hpp"
#include "embcache/detail/progress.hpp"
#include "embcache/synth.hpp"
#include "tool_log.hpp"

namespace {

int synth_main(int argc, char** argv) {
  CLI::App app{
      "Generates synthetic Criteo-like rows (Zipf values, Criteo-shaped cardinalities, "
      "labels from a hidden logistic model); deterministic from the seed."};
  embcache::synth_options opts;
  std::string format = "shards";
  std::string output;
  embcache::tools::dataset_cli dataset;
  embcache::dataset_writer_options out;
  bool cross = false;
  embcache::criteo_parse_options parse;
  embcache::tools::standard_options(app, "embcache-synth");
  app.add_option("-o,--output", output,
                 "TSV file (.gz: compressed) for --format tsv, folder for --format shards")
      ->required();
  app.add_option("-f,--format", format, "'tsv' or 'shards'")
      ->capture_default_str()
      ->check(CLI::IsMember({"tsv", "shards"}));
  app.add_option("-r,--rows", opts.rows, "Rows")->capture_default_str();
  app.add_option("-s,--seed", opts.seed, "Seed")->capture_default_str();
  app.add_option("--cardinality-scale", opts.cardinality_scale,
                 "Multiplies Criteo's per-slot cardinalities")
      ->capture_default_str()
      ->check(embcache::tools::finite_number(0, embcache::synth_max_cardinality_scale, true));
  app.add_option("--zipf", opts.zipf_exponent, "Zipf exponent of the categorical values")
      ->capture_default_str()
      ->check(embcache::tools::finite_number(0, std::numeric_limits<double>::max(), true));
  app.add_option("--signal", opts.signal, "Scale of the hidden model's weights")
      ->capture_default_str()
      ->check(embcache::tools::finite_number());
  app.add_option("--day", opts.day,
                 "Day of a drifting series: its own rows, with the keys of that day (day 0 is the "
                 "plain data)")
      ->capture_default_str()
      ->check(embcache::tools::integer_between(0, embcache::synth_max_day));
  app.add_option("--drift", opts.drift,
                 "Share of the keys retired per day of the series, each replaced by a new key "
                 "with a new hidden weight (0: every day has the same keys)")
      ->capture_default_str()
      ->check(embcache::tools::finite_number(0, 1));
  app.footer(
      "Days that drift: `embcache-synth -o day_D --day D --drift 0.05 [same other options]` for "
      "D = 0, 1, ... gives a series of daily datasets from one seed. Each day a --drift share of "
      "every slot's value ranks, popular ones included, retire their key and a new key takes its "
      "place; a key keeps its hidden weight for its whole life (about 1 / drift days on average, "
      "some ranks much longer), so a model "
      "trained on day D scores day D + 1 above chance. Zipf's long tail gives each day many keys "
      "seen once. Day D's bytes depend only on the options and D, not on the other days.");
  app.add_option("-n,--rows-per-shard", out.rows_per_shard, "Rows per shard (shards)")
      ->capture_default_str()
      ->check(embcache::tools::integer_at_least(1));
  dataset.add_keyset_option(app, "'embcache' or 'raw' (shards)");
  app.add_flag("--cross", cross, "Add the 13 crossed keys per row (shards)");
  app.add_option("--hash-seed", parse.hash_seed, "Seed of the categorical hash (shards)")
      ->capture_default_str();
  app.add_flag("--force", out.overwrite, "Replace a dataset already in the folder (shards)");
  dataset.add_report_options(app, "Skip the distinct-key counts (bounded memory for huge runs)");
  EMBCACHE_CLI_PARSE(app, argc, argv);
  embcache::tools::init_tool_log("embcache-synth");

  // A line every 10% (at most one per 2 s) or after 30 s without one.
  embcache::detail::progress_meter meter(opts.rows);
  if (dataset.progress) {
    opts.on_progress = [&meter](std::uint64_t done) {
      if (meter.due(done)) spdlog::info("synth: {}", meter.count_text(done, "rows"));
    };
  }
  if (format == "tsv") {
    embcache::status s = embcache::write_synth_tsv(output, opts);
    if (!s.ok()) {
      spdlog::error("embcache-synth: {}", s.to_string());
      return embcache::tools::run_time_failure;
    }
    std::printf("rows          %llu\nfile          %s\n",
                static_cast<unsigned long long>(opts.rows), output.c_str());
    return 0;
  }
  out.output_dir = output;
  out.keyset = dataset.format();
  out.unique_stats = dataset.unique_stats();
  auto r = embcache::write_synth_dataset(opts, out, cross, parse);
  if (!r.ok()) {
    spdlog::error("embcache-synth: {}", r.get_status().to_string());
    return embcache::tools::run_time_failure;
  }
  const embcache::dataset_summary& d = r.value();
  std::printf("rows          %llu\nlabel mean    %.4f\nshards        %zu in %s\n",
              static_cast<unsigned long long>(d.rows), d.label_mean, d.shards.size(),
              output.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return embcache::tools::run_tool("embcache-synth", &synth_main, argc, argv);
}
