// embcache-train: trains the reference Wide&Deep model from a JSON configuration.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "embcache/trainer/trainer.hpp"
#include "tool_log.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Trains the reference Wide&Deep model on Criteo-format shards (docs/trainer.md)"};
  std::string config_path, resume, save_dir, output_dir;
  bool print_config = false, no_plot = false;
  app.add_option("--config", config_path, "JSON configuration file")->required();
  app.add_option("--resume", resume, "resume from this save (overrides resume_from)");
  app.add_option("--save", save_dir, "save here at the end (overrides save_dir)");
  app.add_option("--output", output_dir, "metrics and plots folder (overrides output_dir)");
  app.add_flag("--print-config", print_config, "print the full configuration and exit");
  app.add_flag("--no-plot", no_plot, "do not draw the loss and AUC curves");
  CLI11_PARSE(app, argc, argv);
  embcache::tools::init_tool_log("embcache-train");
#ifdef EMBCACHE_TRAINER_WITH_CUDA
  embcache::register_cuda_dense_backend();  // lets dense_device pick "cuda"
#endif

  auto config = embcache::load_trainer_config(config_path);
  if (!config.ok()) {
    spdlog::error("embcache-train: {}", config.get_status().to_string());
    return 2;
  }
  embcache::trainer_config c = config.value();
  if (!resume.empty()) c.resume_from = resume;
  if (!save_dir.empty()) c.save_dir = save_dir;
  if (!output_dir.empty()) c.output_dir = output_dir;
  if (print_config) {
    std::cout << nlohmann::json(c).dump(2) << "\n";
    return 0;
  }
  auto t = embcache::trainer::create(c);
  if (!t.ok()) {
    spdlog::error("embcache-train: {}", t.get_status().to_string());
    return 1;
  }
  // The trainer's progress and summary lines, as log lines with a timestamp and level. run()
  // logs where the dense network runs before the first pass.
  t.value()->set_log([](const std::string& line) { spdlog::info("{}", line); });
  spdlog::info("embcache-train: mode {}, {} passes, batch {}{}", embcache::to_string(c.mode),
               c.passes.size(), c.batch_size,
               c.resume_from.empty()
                   ? std::string()
                   : ", resuming after pass " + std::to_string(t.value()->passes_done()));
  const embcache::status s = t.value()->run();
  if (!s.ok()) {
    spdlog::error("embcache-train: {}", s.to_string());
    return 1;
  }
  if (!c.output_dir.empty()) {
    spdlog::info(
        "metrics: {0}/metrics.jsonl (per pass), {0}/metrics_steps.jsonl (per log_interval)",
        c.output_dir);
    if (!no_plot) {
      std::string note;
      const embcache::status ps = embcache::plot_metrics(c.output_dir, t.value()->history(), &note);
      if (!ps.ok()) {
        spdlog::error("embcache-train: {}", ps.to_string());
        return 1;
      }
      spdlog::info("plots: {}", note);
    }
  }
  return 0;
}
