// embcache-apply: numbered deltas applied to a base model folder atomically, or pushed with the
// base into a Redis serving store.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <limits>
#include <string>

#include "cli_checks.hpp"
#include "redis_cli.hpp"
#include "tool_log.hpp"
#include "embcache/serving.hpp"
#ifdef EMBCACHE_APPLY_WITH_REDIS
#include "embcache/redis.hpp"
#endif

namespace {

// The lines both modes print: deltas taken, position before and after, rows.
void print_summary(const std::vector<std::uint64_t>& deltas, std::uint64_t applied,
                   std::uint64_t from, std::uint64_t rows, std::uint64_t erased,
                   const char* erased_word) {
  std::string list;
  for (auto x : deltas) list += (list.empty() ? "" : " ") + std::to_string(x);
  std::printf("deltas        %s\n", list.empty() ? "none" : list.c_str());
  std::printf("applied       %llu (was %llu)\n", static_cast<unsigned long long>(applied),
              static_cast<unsigned long long>(from));
  std::printf("rows          %llu written, %llu %s\n", static_cast<unsigned long long>(rows),
              static_cast<unsigned long long>(erased), erased_word);
}

int apply_main(int argc, char** argv) {
  embcache::tools::ignore_sigpipe();
  CLI::App app{
      "Applies the numbered deltas of DELTAS_DIR (delta-NNNNNN, as training_cache::"
      "export_incremental_to writes them, or a sharded run's export folder: "
      "delta-NNNNNN.parts.json and rank-RRRRR/) to the base model folder BASE (a save's sparse "
      "folder, a trainer save, or a sharded save) atomically; with --output DIR, writes the "
      "result to DIR and leaves BASE alone (required for a sharded save; without DELTAS_DIR it "
      "writes the sharded save as one HugeCTR sparse model folder); with --redis, pushes BASE and "
      "the deltas into a Redis serving store instead and leaves BASE alone."};
  std::string base, deltas, redis, prefix = "embcache", password_file, output;
  std::uint64_t until = std::numeric_limits<std::uint64_t>::max();
  bool replace = false;
  app.add_option("BASE", base, "Base model folder, trainer save or sharded save")->required();
  app.add_option("DELTAS_DIR", deltas,
                 "Folder of delta-NNNNNN folders or of a sharded run's delta-NNNNNN.parts.json "
                 "(may be left out with --output or --redis: the base alone)");
  app.add_option("--output", output,
                 "Write the result to this model folder (new, or a model folder it replaces) "
                 "instead of BASE");
  app.add_option("--until", until, "Apply deltas up to this number (default: all)")
      ->check(embcache::tools::integer_at_least(0));
  app.add_option("--redis", redis, "Push into the Redis server at HOST:PORT");
  app.add_option("--prefix", prefix, "Prefix of the Redis keys")->capture_default_str();
  app.add_flag("--replace-base", replace,
               "With --redis: push BASE even when the store already holds a model");
  embcache::tools::redis_password_option(app, &password_file);
  embcache::tools::standard_options(app, "embcache-apply");
  EMBCACHE_CLI_PARSE(app, argc, argv);
  embcache::tools::init_tool_log("embcache-apply");
  embcache::apply_options ao;
  ao.until = until;
  ao.output = output;
  if (deltas.empty() && output.empty() && redis.empty()) {
    spdlog::error("embcache-apply: DELTAS_DIR is required unless --output or --redis is given");
    return embcache::tools::usage_error;
  }
  if (!output.empty() && !redis.empty()) {
    spdlog::error("embcache-apply: --output and --redis exclude each other");
    return embcache::tools::usage_error;
  }
  if (!redis.empty()) {
#ifdef EMBCACHE_APPLY_WITH_REDIS
    auto where = embcache::parse_redis_address(redis);
    if (!where.ok()) {
      spdlog::error("embcache-apply: --redis: {}", where.get_status().message());
      return embcache::tools::usage_error;
    }
    where.value().prefix = prefix;
    auto password = embcache::tools::redis_password(password_file);
    if (!password.ok()) {
      spdlog::error("embcache-apply: {}", password.get_status().message());
      return embcache::tools::run_time_failure;
    }
    where.value().password = password.value();
    auto r = embcache::redis_push(where.value(), base, deltas, ao, replace);
    if (!r.ok()) {
      spdlog::error("embcache-apply: {}", r.get_status().to_string());
      return embcache::tools::run_time_failure;
    }
    const auto& p = r.value();
    if (p.run_unchecked)
      spdlog::warn(
          "embcache-apply: the store or a delta has no run identity (written by an "
          "earlier version): whether they belong to one run was not checked");
    std::printf("base          %s\n", p.base_pushed ? "pushed" : "kept (the store had a model)");
    print_summary(p.deltas, p.applied_delta, p.from_delta, p.rows_written, p.keys_deleted,
                  "deleted");
    return 0;
#else
    spdlog::error("embcache-apply: --redis: this build has no Redis support (hiredis not found)");
    return embcache::tools::usage_error;
#endif
  }
  auto r = embcache::apply_deltas(base, deltas, ao);
  if (!r.ok()) {
    spdlog::error("embcache-apply: {}", r.get_status().to_string());
    return embcache::tools::run_time_failure;
  }
  const auto& a = r.value();
  if (a.run_unchecked)
    spdlog::warn(
        "embcache-apply: the base or a delta has no run identity (written by an earlier "
        "version): whether they belong to one run was not checked");
  std::printf("model         %s%s\n", a.model_dir.c_str(), a.changed ? "" : " (unchanged)");
  print_summary(a.deltas, a.applied_delta, a.from_delta, a.rows_written, a.rows_erased, "erased");
  if (a.state_dropped)
    std::printf(
        "note          a delta carried no optimizer state: the result has none "
        "(a serving model)\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return embcache::tools::run_tool("embcache-apply", &apply_main, argc, argv);
}
