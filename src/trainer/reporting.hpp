// What the trainer reports: its progress and summary lines, the per-step metrics files and the
// plots. The lines are plain text handed to the trainer's log callback; a program adds the
// timestamp and level (embcache-train through spdlog).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "embcache/status.hpp"
#include "embcache/trainer/trainer.hpp"

namespace embcache::detail {

/// One line of metrics_steps.jsonl (and of metrics_steps.tsv, gnuplot's copy): the log_interval
/// steps that end at `step`.
struct step_metrics {
  std::uint64_t step = 0;     ///< global step (resumes included) that ends the interval
  std::uint64_t pass = 0;     ///< pass number
  double pass_position = 0;   ///< pass - 1 + the fraction of the pass's samples done
  std::uint64_t samples = 0;  ///< samples trained since the start of training
  double train_loss = 0;      ///< mean batch loss over the interval
  double samples_per_s = 0;   ///< over the interval
  double hit_rate = 0;        ///< of the interval's lookups (NaN without lookups)
};

/// Creates `dir` and its parents (an output folder of the run); io_error
/// "<field>: <dir>: cannot create (<reason>)".
[[nodiscard]] status create_folder(const std::string& dir, const std::string& field);

/// Starts the metrics files of a run in `output_dir` empty: metrics.jsonl, metrics_steps.jsonl
/// and metrics_steps.tsv (with its header line). They are append-only logs: every write is
/// checked and a failure names the file, but nothing is fsynced.
[[nodiscard]] status start_metrics_files(const std::string& output_dir);

/// Appends `m` to metrics_steps.jsonl and metrics_steps.tsv.
[[nodiscard]] status append_step_metrics(const std::string& output_dir, const step_metrics& m);

/// Appends `m` to metrics.jsonl (its to_json line).
[[nodiscard]] status append_pass_metrics(const std::string& output_dir, const pass_metrics& m);

/// Reads a pass_metrics back from its to_json object (null as NaN); throws
/// nlohmann::json's exceptions for a missing field or a wrong type.
pass_metrics pass_metrics_from_json(const nlohmann::json& j);

/// What a training progress line shows.
struct training_progress {
  std::uint64_t pass = 0;        ///< pass number
  std::uint64_t passes = 0;      ///< last pass number of the run (0: unknown)
  std::uint64_t step = 0;        ///< global step
  std::uint64_t pass_done = 0;   ///< samples of the pass done
  std::uint64_t pass_total = 0;  ///< samples of the pass (shard headers)
  double pass_seconds = 0;       ///< since the pass began
  std::uint64_t run_done = 0;    ///< samples of the run done (this process)
  std::uint64_t run_total = 0;   ///< samples of every pass of the run (0: unknown)
  double run_seconds = 0;        ///< since the run began
  double loss = 0;               ///< mean batch loss over the interval
  std::string hit_rate;          ///< "0.9870", "n/a (no cache)", ...
};

/// "pass 1/3 step 40 | 45.0% of 6400 samples, 1440 samples/s, ETA 0:02 | run 15.0%, ETA 0:20 |
/// loss 0.51234 | hit rate 0.9870"; without run totals no "/3" and no run part.
std::string training_progress_line(const training_progress& p);

/// The summary line of a pass: "pass 1 done: 1500 samples in 0.40 s (...), train loss ...".
std::string pass_summary_line(const pass_metrics& m);

/// The line of a completed save: "saved to DIR: 12.3 MB in 1.20 s (10.2 MB/s)", the bytes being
/// those of every file under `dir`.
std::string save_summary_line(const std::string& dir, double seconds);

/// The temporaries plot_metrics() has gnuplot draw into: removed on destruction, so that a
/// failed plot leaves no partial image; cleared once they are renamed into place.
struct temporary_images {
  std::vector<std::string> paths;
  temporary_images() = default;
  temporary_images(const temporary_images&) = delete;
  temporary_images& operator=(const temporary_images&) = delete;
  ~temporary_images();
};

/// ok when the file `drawn` is a complete PNG (its signature first, its IEND chunk last);
/// io_error naming `image` otherwise (gnuplot may exit 0 after a write failed on a full disk).
[[nodiscard]] status check_png(const std::string& drawn, const std::string& image);

}  // namespace embcache::detail
