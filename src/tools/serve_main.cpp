// embcache-serve: lookup-only scoring of a shard with a trainer save's dense network and the
// embeddings of a Redis serving store.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_checks.hpp"
#include "embcache/redis.hpp"
#include "embcache/serving.hpp"
#include "embcache/trainer/score.hpp"
#include "redis_cli.hpp"
#include "tool_log.hpp"

namespace {

int serve_main(int argc, char** argv) {
  embcache::tools::ignore_sigpipe();
  CLI::App app{
      "Scores SHARD.bin with the dense network of the trainer save SAVE_DIR (trainer.json, "
      "dense.bin) and the embedding rows held by a Redis serving store (embcache-apply --redis): "
      "lookup only, no training. Prints the samples, AUC and log loss."};
  std::string redis, prefix = "embcache", model, shard, output, password_file;
  embcache::score_options so;
  app.add_option("--redis", redis, "Redis server HOST:PORT")->required();
  app.add_option("--prefix", prefix, "Prefix of the Redis keys")->capture_default_str();
  app.add_option("--model", model, "Trainer save folder (trainer.json, dense.bin)")->required();
  app.add_option("--shard", shard, "Shard to score (shard-NNNNN.bin)")->required();
  app.add_option("--batch-size", so.batch_size, "Samples per batch (default: the save's)")
      ->check(embcache::tools::integer_at_least(1));
  app.add_option("--max-samples", so.max_samples,
                 "Score at most this many samples (default: the save's eval_max_samples)")
      ->check(embcache::tools::integer_at_least(1));
  app.add_option("--blas-threads", so.blas_threads,
                 "Threads of the host BLAS (default: the save's blas_threads, so the scores equal "
                 "the training run's evaluation to the bit; 0: OpenBLAS's own setting)")
      ->check(embcache::tools::integer_at_least(0));
  bool allow_other_point = false;
  app.add_flag("--allow-other-point", allow_other_point,
               "Score even when the store's rows stand at another point of the run (table "
               "versions) than the save's dense network");
  app.add_option("-o,--output", output, "Also write the metrics as JSON to this file");
  embcache::tools::redis_password_option(app, &password_file);
  embcache::tools::standard_options(app, "embcache-serve");
  EMBCACHE_CLI_PARSE(app, argc, argv);
  embcache::tools::init_tool_log("embcache-serve");
  auto where = embcache::parse_redis_address(redis);
  if (!where.ok()) {
    spdlog::error("embcache-serve: --redis: {}", where.get_status().message());
    return embcache::tools::usage_error;
  }
  where.value().prefix = prefix;
  auto password = embcache::tools::redis_password(password_file);
  if (!password.ok()) {
    spdlog::error("embcache-serve: {}", password.get_status().message());
    return embcache::tools::run_time_failure;
  }
  where.value().password = password.value();
  auto rows = embcache::redis_rows::connect(where.value());
  if (!rows.ok()) {
    spdlog::error("embcache-serve: {}", rows.get_status().to_string());
    return embcache::tools::run_time_failure;
  }
  // The store must hold the save's tables, with rows, of the save's run, before a row is scored.
  const embcache::status fits =
      embcache::redis_check_model(rows.value()->model(), where.value(), model, allow_other_point);
  if (!fits.ok()) {
    spdlog::error("embcache-serve: {}", fits.to_string());
    return embcache::tools::run_time_failure;
  }
  auto m = embcache::score_shard(model, shard, *rows.value(), so);
  if (!m.ok()) {
    spdlog::error("embcache-serve: {}", m.get_status().to_string());
    return embcache::tools::run_time_failure;
  }
  const auto& r = m.value();
  const unsigned long long applied = rows.value()->model().position.applied_delta;
  std::printf("applied       %llu\n", applied);
  std::printf("samples       %llu\n", static_cast<unsigned long long>(r.samples));
  std::printf("auc           %.17g\n", r.auc);
  std::printf("logloss       %.17g\n", r.logloss);
  if (!output.empty()) {
    const nlohmann::json j = {{"applied_delta", applied},
                              {"samples", r.samples},
                              {"auc", std::isnan(r.auc) ? nlohmann::json() : nlohmann::json(r.auc)},
                              {"logloss", r.logloss}};
    std::FILE* f = std::fopen(output.c_str(), "w");
    const std::string text = j.dump(2) + "\n";
    if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0) {
      spdlog::error("embcache-serve: cannot write '{}'", output);
      return embcache::tools::run_time_failure;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return embcache::tools::run_tool("embcache-serve", &serve_main, argc, argv);
}
