// The options of the tools that write dataset folders (embcache-prep, embcache-synth): keyset
// format, distinct-key statistics and the progress line.
#pragma once

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <string>

#include "embcache/keyset.hpp"

namespace embcache::tools {

/// The dataset-writing options a tool shares, as parsed.
struct dataset_cli {
  std::string keyset = "embcache";               ///< --keyset-format: "embcache" or "raw"
  bool progress = ::isatty(STDERR_FILENO) != 0;  ///< --progress / --no-progress
  bool no_unique_stats = false;                  ///< --no-unique-stats

  /// Adds --keyset-format (described by `keyset_help`) to `app`.
  void add_keyset_option(CLI::App& app, const std::string& keyset_help) {
    app.add_option("--keyset-format", keyset, keyset_help)
        ->capture_default_str()
        ->check(CLI::IsMember({"embcache", "raw"}));
  }
  /// Adds --no-unique-stats (described by `unique_help`) and --progress / --no-progress.
  void add_report_options(CLI::App& app, const std::string& unique_help) {
    app.add_flag("--no-unique-stats", no_unique_stats, unique_help);
    app.add_flag("--progress,!--no-progress", progress,
                 "Progress line on stderr (default: when stderr is a terminal)");
  }
  /// The keyset format chosen.
  keyset_format format() const {
    return keyset == "raw" ? keyset_format::hugectr_raw : keyset_format::embcache;
  }
  /// Whether to count distinct keys.
  bool unique_stats() const { return !no_unique_stats; }
};

}  // namespace embcache::tools
