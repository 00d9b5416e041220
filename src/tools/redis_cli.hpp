// What the tools that talk to Redis share (embcache-apply --redis, embcache-serve): the password
// options, and SIGPIPE ignored so that a server that goes away mid-write is an error message
// naming the server rather than a silent death by signal.
#pragma once

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <string>

#include "embcache/status.hpp"

namespace embcache::tools {

/// A write to a closed socket then fails with EPIPE, which hiredis reports as an error.
inline void ignore_sigpipe() { std::signal(SIGPIPE, SIG_IGN); }

/// Adds `--redis-password-file FILE` (its first line is the password). Without it, the password
/// is EMBCACHE_REDIS_PASSWORD when set; it is never taken from the command line itself, where
/// other users of the machine could read it.
inline void redis_password_option(CLI::App& app, std::string* file) {
  app.add_option("--redis-password-file", *file,
                 "Send AUTH with the first line of this file (default: the environment variable "
                 "EMBCACHE_REDIS_PASSWORD when set, else no AUTH)");
}

/// The password of redis_password_option: the file's first line (without its line end), else
/// the environment's, else "". io_error naming the file when it cannot be read.
inline result<std::string> redis_password(const std::string& file) {
  if (file.empty()) {
    const char* env = std::getenv("EMBCACHE_REDIS_PASSWORD");
    return std::string(env ? env : "");
  }
  std::ifstream in(file);
  std::string line;
  if (!in || (!std::getline(in, line) && !in.eof()))
    return status::io_error("--redis-password-file '" + file + "': cannot read it");
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

}  // namespace embcache::tools
