// The command-line tools' log lines: spdlog, with a timestamp and the level on each line, on
// stderr (stdout keeps the tools' results). Colored levels only on a terminal.
#pragma once

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <string>

namespace embcache::tools {

/// The pattern of every line: "[2026-11-23 16:40:01.123] [info] message".
inline constexpr const char* log_pattern = "[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v";

/// Makes a stderr logger named `tool` the default one, so that spdlog::info() and friends write
/// "[date time] [level] message" lines.
inline void init_tool_log(const std::string& tool) {
  auto logger = spdlog::stderr_color_mt(tool);
  logger->set_pattern(log_pattern);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace embcache::tools
