// embcache-train: trains the reference Wide&Deep model from a JSON configuration.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli_checks.hpp"
#include "embcache/trainer/trainer.hpp"
#include "tool_log.hpp"
#ifdef EMBCACHE_TRAINER_WITH_MPI
#include "embcache/distributed/mpi_communicator.hpp"
#endif

namespace {

// The number of ranks the launcher started (mpirun, mpiexec, srun), or 0 without one.
int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"})
    if (const char* v = std::getenv(name)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  return 0;
}

int train_main(int argc, char** argv) {
  CLI::App app{"Trains the reference Wide&Deep model on Criteo-format shards (docs/trainer.md)"};
  std::string config_path, resume, save_dir, output_dir;
  bool print_config = false, no_plot = false;
  embcache::tools::standard_options(app, "embcache-train");
  app.add_option("--config", config_path, "JSON configuration file")->required();
  app.add_option("--resume", resume, "resume from this save (overrides resume_from)");
  app.add_option("--save", save_dir, "save here at the end (overrides save_dir)");
  app.add_option("--output", output_dir, "metrics and plots folder (overrides output_dir)");
  app.add_flag("--print-config", print_config,
               "print the full configuration (dataset passes expanded, capacities \"auto\" "
               "computed) and exit");
  app.add_flag("--no-plot", no_plot, "do not draw the loss and AUC curves");
  EMBCACHE_CLI_PARSE(app, argc, argv);
  embcache::tools::init_tool_log("embcache-train");
#ifdef EMBCACHE_TRAINER_WITH_CUDA
  embcache::register_cuda_dense_backend();  // lets dense_device pick "cuda"
#endif

  // A configuration that is refused is a usage error; one that cannot be read a run-time failure.
  auto config = embcache::load_trainer_config(config_path);
  if (!config.ok()) {
    spdlog::error("embcache-train: {}", config.get_status().to_string());
    return config.get_status().code() == embcache::status_code::invalid_argument
               ? embcache::tools::usage_error
               : embcache::tools::run_time_failure;
  }
  embcache::trainer_config c = config.value();
  if (!resume.empty()) c.resume_from = resume;
  if (!save_dir.empty()) c.save_dir = save_dir;
  if (!output_dir.empty()) c.output_dir = output_dir;
  if (print_config) {
    auto resolved = embcache::resolve_trainer_config(c);
    if (!resolved.ok()) {
      std::cerr << "embcache-train: " << resolved.get_status().to_string() << "\n";
      return embcache::tools::run_time_failure;
    }
    std::cout << nlohmann::json(resolved.value()).dump(2) << "\n";
    return 0;
  }
  // A sharded run under a launcher of several ranks, or when the configuration names a world.
  const int launched = launcher_world_size();
  const bool sharded = launched > 1 || c.world >= 1;
  std::string who = "embcache-train", ranks;  // ranks: "rank 1 of 4" in a sharded run
  bool leader = true;
#ifdef EMBCACHE_TRAINER_WITH_MPI
  std::optional<embcache::mpi_session> session;
  std::unique_ptr<embcache::mpi_communicator> comm;
  if (sharded) {
    try {
      session.emplace(&argc, &argv);
      comm = std::make_unique<embcache::mpi_communicator>();
    } catch (const embcache::error& e) {
      spdlog::error("embcache-train: {}", e.what());
      return embcache::tools::run_time_failure;
    }
    leader = comm->rank() == 0;
    ranks = "rank " + std::to_string(comm->rank()) + " of " + std::to_string(comm->size());
    who += " (" + ranks + ")";
  }
  auto t = sharded ? embcache::trainer::create(c, *comm) : embcache::trainer::create(c);
#else
  if (sharded) {
    spdlog::error("embcache-train: {}", launched > 1
                                            ? "started by an MPI launcher, but this build has no "
                                              "MPI (Debian: libopenmpi-dev openmpi-bin; rebuild)"
                                            : "config.world: this build has no MPI");
    return embcache::tools::usage_error;
  }
  auto t = embcache::trainer::create(c);
#endif
  if (!t.ok()) {
    spdlog::error("{}: {}", who, t.get_status().to_string());
    return embcache::tools::run_time_failure;
  }
  // How the memory budget is spent (the configuration resolved: capacity "auto" known).
  if (leader && c.memory_budget_bytes != 0) {
    auto resolved = embcache::resolve_trainer_config(c);
    auto plan = resolved.ok() ? embcache::plan_trainer_memory(resolved.value())
                              : embcache::result<embcache::memory_plan>(resolved.get_status());
    if (plan.ok()) {
      const embcache::memory_plan& m = plan.value();
      spdlog::info(
          "memory plan of {} bytes: caches {}, staging {}, other {}, reserve {}, DRAM tiers {}, "
          "block cache {}, memtables {} ({} per column family of {} bytes)",
          m.budget_bytes, m.cache_bytes, m.staging_bytes, m.other_bytes, m.reserve_bytes,
          m.dram_tier_bytes, m.block_cache_bytes, m.memtable_bytes, m.max_write_buffers,
          m.write_buffer_bytes);
    }
  }
  // The trainer's progress and summary lines, as log lines with a timestamp and level. run()
  // logs where the dense network runs before the first pass. Rank 0 speaks for a sharded run.
  t.value()->set_log([leader](const std::string& line) {
    if (leader) spdlog::info("{}", line);
  });
  if (leader)
    spdlog::info("embcache-train: mode {}, {} passes, batch {}{}{}", embcache::to_string(c.mode),
                 c.passes.size(), c.batch_size,
                 ranks.empty() ? std::string() : ", " + ranks,
                 c.resume_from.empty()
                     ? std::string()
                     : ", resuming after pass " + std::to_string(t.value()->passes_done()));
  const embcache::status s = t.value()->run();
  if (!s.ok()) {
    spdlog::error("{}: {}", who, s.to_string());
    return embcache::tools::run_time_failure;
  }
  if (leader && !c.output_dir.empty()) {
    spdlog::info(
        "metrics: {0}/metrics.jsonl (per pass), {0}/metrics_steps.jsonl (per log_interval)",
        c.output_dir);
    if (!no_plot) {
      std::string note;
      const embcache::status ps = embcache::plot_metrics(c.output_dir, t.value()->history(), &note);
      if (!ps.ok()) {
        spdlog::error("embcache-train: {}", ps.to_string());
        return embcache::tools::run_time_failure;
      }
      spdlog::info("plots: {}", note);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return embcache::tools::run_tool("embcache-train", &train_main, argc, argv);
}
