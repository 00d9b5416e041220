// What every command-line tool shares: `--version`, exit codes (0 done, 1 run-time failure,
// 2 usage error) and checks of numeric values whose messages name the option and the allowed
// range (CLI11's own ranges print both bounds as 300-digit doubles).
//
// A new tool: `embcache::tools::standard_options(app, "embcache-x")`, then
// `EMBCACHE_CLI_PARSE(app, argc, argv)`, and `return embcache::tools::run_time_failure` (1) or
// `usage_error` (2) on failures.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <new>
#include <string>

#include "embcache/version.hpp"

namespace embcache::tools {

/// Exit code of a run-time failure (I/O, corrupt data, a failed run).
inline constexpr int run_time_failure = 1;
/// Exit code of a usage error (unknown option, missing argument, bad value).
inline constexpr int usage_error = 2;

/// What `--version` prints: "NAME VERSION (cuda yes|no, rocksdb yes|no)".
inline std::string version_text(const std::string& tool) {
  return tool + " " + version_string + " (" + build_spaces + ")";
}

/// Adds the options every tool has: `--version` (prints version_text and exits 0).
inline void standard_options(CLI::App& app, const std::string& tool) {
  app.set_version_flag("--version", version_text(tool), "Print the version and the build's spaces");
}

/// An unsigned integer in [min, max] (no sign, no fraction).
inline CLI::Validator integer_between(std::uint64_t min, std::uint64_t max) {
  const std::string range =
      "expected an integer from " + std::to_string(min) + " to " + std::to_string(max);
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        std::uint64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [p, ec] = std::from_chars(text.data(), end, v);
        if (text.empty() || ec != std::errc() || p != end || v < min || v > max) {
          return "'" + text + "' is out of range, " + range;
        }
        return {};
      },
      "INT in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

/// An unsigned integer of at least `min` (no sign, no fraction).
inline CLI::Validator integer_at_least(std::uint64_t min) {
  return integer_between(min, std::numeric_limits<std::uint64_t>::max())
      .description("INT>=" + std::to_string(min));
}

inline std::string shown(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.15g", v);
  return buf;
}

/// A finite number (not nan or inf), above `low` when `low_open`, else at least `low`, and at
/// most `high`.
inline CLI::Validator finite_number(double low = -std::numeric_limits<double>::max(),
                                    double high = std::numeric_limits<double>::max(),
                                    bool low_open = false) {
  const bool has_low = low_open || low > -std::numeric_limits<double>::max();
  const bool has_high = high < std::numeric_limits<double>::max();
  std::string range;
  if (!low_open && has_low && has_high) {
    range = "expected a number in [" + shown(low) + ", " + shown(high) + "]";
  } else {
    if (low_open) range = "expected a number above " + shown(low);
    if (!low_open && has_low) range = "expected a number of at least " + shown(low);
    if (has_high) {
      range +=
          (range.empty() ? "expected a number" : std::string()) + " and at most " + shown(high);
    }
  }
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size()) {
          return "'" + text + "' is not a number";
        }
        if (!std::isfinite(v)) return "'" + text + "' is not a finite number";
        const bool low_ok = low_open ? v > low : v >= low;
        if (!low_ok || v > high) return "'" + text + "' is out of range, " + range;
        return {};
      },
      "FINITE");
}

/// Runs a tool's `body(argc, argv)` and returns its exit status; an exception that escapes it
/// (std::bad_alloc from a size nobody checked, an error thrown by a device call) ends the tool
/// with run_time_failure and a message naming it, instead of std::terminate's abort (rc 134).
template <class Body>
int run_tool(const char* tool, Body body, int argc, char** argv) {
  const char* what = "an exception of an unknown type";
  std::string text;
  try {
    return body(argc, argv);
  } catch (const std::bad_alloc&) {
    what = "out of memory (std::bad_alloc)";
  } catch (const std::exception& e) {
    text = std::string("unexpected exception: ") + e.what();
    what = text.c_str();
  } catch (...) {
  }
  std::fprintf(stderr, "%s: %s; stopped\n", tool, what);
  return run_time_failure;
}

/// Parses like CLI11_PARSE, but a usage error exits with 2 (--help and --version with 0).
#define EMBCACHE_CLI_PARSE(app, argc, argv)              \
  try {                                                  \
    (app).parse((argc), (argv));                         \
  } catch (const CLI::ParseError& e) {                   \
    const int rc = (app).exit(e);                        \
    return rc == 0 ? 0 : ::embcache::tools::usage_error; \
  }

}  // namespace embcache::tools
