// Checks of numeric command-line values whose messages name the option and the allowed range
// (CLI11's own ranges print both bounds as 300-digit doubles).
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

namespace embcache::tools {

/// An unsigned integer of at least `min` (no sign, no fraction).
inline CLI::Validator integer_at_least(std::uint64_t min) {
  const std::string range = "expected an integer from " + std::to_string(min) + " to " +
                            std::to_string(std::numeric_limits<std::uint64_t>::max());
  return CLI::Validator(
      [min, range](std::string& text) -> std::string {
        std::uint64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [p, ec] = std::from_chars(text.data(), end, v);
        if (text.empty() || ec != std::errc() || p != end || v < min) {
          return "'" + text + "' is out of range, " + range;
        }
        return {};
      },
      "INT>=" + std::to_string(min));
}

inline std::string shown(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.15g", v);
  return buf;
}

/// A finite number (not nan or inf), above `low` when `low_open`, at most `high`.
inline CLI::Validator finite_number(double low = -std::numeric_limits<double>::max(),
                                    double high = std::numeric_limits<double>::max(),
                                    bool low_open = false) {
  std::string range;
  if (low_open) range = "expected a number above " + shown(low);
  if (high < std::numeric_limits<double>::max()) {
    range += (range.empty() ? "expected a number" : std::string()) + " and at most " + shown(high);
  }
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size()) {
          return "'" + text + "' is not a number";
        }
        if (!std::isfinite(v)) return "'" + text + "' is not a finite number";
        if ((low_open && !(v > low)) || v > high) return "'" + text + "' is out of range, " + range;
        return {};
      },
      "FINITE");
}

/// Parses like CLI11_PARSE, but a usage error exits with 2 (--help and --version with 0).
#define EMBCACHE_CLI_PARSE(app, argc, argv) \
  try {                                     \
    (app).parse((argc), (argv));            \
  } catch (const CLI::ParseError& e) {      \
    const int rc = (app).exit(e);           \
    return rc == 0 ? 0 : 2;                 \
  }

}  // namespace embcache::tools
