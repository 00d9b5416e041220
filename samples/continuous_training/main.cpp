// Continuous training, as HugeCTR's embedding training cache sample tells it: train on files 0-1
// with their keysets, switch the source to files 3-4 and train on, export the incremental model,
// save; then a new process resumes from the save and trains on file 2, which arrived late.
//
//   embcache-continuous-training prepare --work DIR   synthetic data (5 files + eval shard) and
//                                                     the two configurations first.json and
//                                                     resume.json for embcache-train
//   embcache-continuous-training summary --work DIR   what the two runs did, for a person
//   (--help, --version; exit 2 on a usage error)
//
// scripts/demo.sh runs prepare, `embcache-train --config first.json`, `embcache-train --config
// resume.json` (a new process) and summary.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "embcache/keyset.hpp"
#include "embcache/synth.hpp"
#include "embcache/trainer/trainer.hpp"
#include "embcache/version.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct args {
  std::string command, work = "continuous_training";
  std::uint64_t rows_per_shard = 20000;
  std::size_t shards_per_file = 5;
  std::string mode = "keyset";
};

constexpr std::size_t num_files = 5;

std::vector<std::string> file_shards(const args& a, std::size_t file) {
  std::vector<std::string> s;
  for (std::size_t i = 0; i < a.shards_per_file; ++i)
    s.push_back(embcache::shard_file_name(file * a.shards_per_file + i));
  return s;
}

int prepare(const args& a) {
  const std::string data = a.work + "/data";
  embcache::synth_options so;
  so.rows = a.rows_per_shard * (num_files * a.shards_per_file + 1);  // + 1 held-out shard
  embcache::dataset_writer_options wo;
  wo.output_dir = data;
  wo.rows_per_shard = a.rows_per_shard;
  wo.overwrite = true;
  std::printf("generating %llu synthetic rows into %s (%zu files of %zu shards + 1 eval shard)\n",
              (unsigned long long)so.rows, data.c_str(), num_files, a.shards_per_file);
  auto ds = embcache::write_synth_dataset(so, wo);
  if (!ds.ok()) {
    std::fprintf(stderr, "%s\n", ds.get_status().to_string().c_str());
    return 1;
  }
  // The cache holds the largest shard keyset (keyset mode needs no more); the table is every
  // key the two runs train.
  std::size_t largest = 0;
  std::vector<std::int64_t> all;
  for (std::size_t i = 0; i < num_files * a.shards_per_file; ++i) {
    auto k = embcache::read_keyset<std::int64_t>(data + "/" + embcache::keyset_file_name(i));
    if (!k.ok()) {
      std::fprintf(stderr, "%s\n", k.get_status().to_string().c_str());
      return 1;
    }
    largest = std::max(largest, k.value().size());
    all.insert(all.end(), k.value().begin(), k.value().end());
  }
  std::sort(all.begin(), all.end());
  const std::size_t table = std::size_t(std::unique(all.begin(), all.end()) - all.begin());
  const std::size_t capacity = largest;
  std::printf("table: %zu distinct keys; cache capacity %zu rows per table (%.1fx smaller)\n",
              table, capacity, double(table) / double(capacity));

  embcache::trainer_config c;
  c.mode = a.mode == "on_demand"     ? embcache::trainer_mode::on_demand
           : a.mode == "host_hybrid" ? embcache::trainer_mode::host_hybrid
                                     : embcache::trainer_mode::keyset;
  c.data_dir = fs::absolute(data).string();
  for (std::size_t f : {0, 1, 3, 4}) c.passes.push_back({file_shards(a, f), {}});
  c.eval_shard = embcache::shard_file_name(num_files * a.shards_per_file);
  c.model.hidden = {256, 128};
  c.model.dropout = 0.1f;
  c.batch_size = 1024;
  c.log_interval = 50;
  // The tables in the host cache on any machine (the demo's figures); embcache-train's
  // embedding_device "auto" or "cuda" puts them on a device.
  c.embedding_device = embcache::device_choice::host;
  for (auto& t : c.tables) t.capacity = capacity;
  const std::string work = fs::absolute(a.work).string();
  c.output_dir = work + "/metrics";
  if (c.mode != embcache::trainer_mode::host_hybrid) c.export_dir = work + "/exports";
  c.save_dir = work + "/save";
  fs::create_directories(work);
  std::ofstream(work + "/first.json") << json(c).dump(2) << "\n";
  embcache::trainer_config r = c;
  r.passes = {{file_shards(a, 2), {}}};
  r.resume_from = c.save_dir;
  std::ofstream(work + "/resume.json") << json(r).dump(2) << "\n";
  std::printf("wrote %s/first.json (files 0, 1, 3, 4) and %s/resume.json (file 2)\n", work.c_str(),
              work.c_str());
  return 0;
}

int summary(const args& a) {
  const std::string work = fs::absolute(a.work).string();
  std::ifstream in(work + "/metrics/metrics.jsonl");
  if (!in) {
    std::fprintf(stderr, "%s/metrics/metrics.jsonl: missing; run the two trainings first\n",
                 work.c_str());
    return 1;
  }
  std::printf("\n== continuous training: summary ==\n");
  std::printf("%-5s %-12s %9s %8s %9s %10s %10s %10s %10s\n", "pass", "source", "samples",
              "eval AUC", "logloss", "swap s", "rows in", "rows out", "exported");
  const char* sources[] = {"file 0", "file 1", "file 3", "file 4", "file 2 (new)"};
  std::string line;
  double swap = 0;
  std::uint64_t exported = 0;
  while (std::getline(in, line)) {
    const json m = json::parse(line);
    const std::uint64_t p = m.at("pass").get<std::uint64_t>();
    auto num = [&](const char* k) { return m.at(k).is_null() ? 0.0 : m.at(k).get<double>(); };
    swap += num("swap_seconds");
    exported += m.at("rows_exported").get<std::uint64_t>();
    std::printf("%-5llu %-12s %9llu %8.4f %9.4f %10.3f %10llu %10llu %10llu\n",
                (unsigned long long)p, p >= 1 && p <= 5 ? sources[p - 1] : "?",
                (unsigned long long)m.at("samples").get<std::uint64_t>(), num("eval_auc"),
                num("eval_logloss"), num("swap_seconds"),
                (unsigned long long)m.at("rows_in").get<std::uint64_t>(),
                (unsigned long long)m.at("rows_out").get<std::uint64_t>(),
                (unsigned long long)m.at("rows_exported").get<std::uint64_t>());
  }
  std::printf("swap time (blocking) in total: %.3f s; rows exported in total: %llu\n", swap,
              (unsigned long long)exported);
  std::printf("files:\n  data          %s/data\n  metrics       %s/metrics/metrics.jsonl\n",
              work.c_str(), work.c_str());
  if (fs::exists(work + "/metrics/loss.png"))
    std::printf("  curves        %s/metrics/loss.png, auc.png\n", work.c_str());
  if (fs::exists(work + "/exports")) {
    std::size_t deltas = 0;
    for (const auto& e : fs::directory_iterator(work + "/exports"))
      if (e.path().filename().string().rfind("delta-", 0) == 0) ++deltas;
    std::printf("  increments    %s/exports/delta-* (%zu folders)\n", work.c_str(), deltas);
  }
  std::printf("  model         %s/save (sparse/, dense.bin, trainer.json)\n", work.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  args a;
  CLI::App app{
      "Continuous training on synthetic data, as HugeCTR's embedding training cache sample tells "
      "it. 'prepare' writes the data (5 files and an eval shard) and the configurations "
      "first.json and resume.json for embcache-train; 'summary' prints what the two runs did."};
  app.add_option("command", a.command, "prepare or summary")
      ->required()
      ->check(CLI::IsMember({"prepare", "summary"}));
  app.add_option("--work", a.work, "Working folder")->capture_default_str();
  app.add_option("--rows-per-shard", a.rows_per_shard, "Samples per shard")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 32));
  app.add_option("--shards-per-file", a.shards_per_file, "Shards per data file")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000}));
  app.add_option("--mode", a.mode, "Cache mode of the configurations")
      ->capture_default_str()
      ->check(CLI::IsMember({"keyset", "on_demand", "host_hybrid"}));
  app.set_version_flag("--version",
                       std::string("embcache-continuous-training ") + EMBCACHE_VERSION_STRING);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return a.command == "prepare" ? prepare(a) : summary(a);
}
