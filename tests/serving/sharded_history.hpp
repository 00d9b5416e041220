// Helpers of the serving tests of a sharded run: a 2-rank history built in one process (a
// training cache per rank holding the keys the rank owns, its store checkpointed as the rank's part
// of a sharded save, its exports as the rank's parts of each delta), beside the same history
// trained by one cache.
#pragma once

#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>

#include "embcache/distributed/ownership.hpp"
#include "test_util.hpp"

namespace embcache::test {

inline constexpr int world = 2;
inline const char* const run_a = "0123456789abcdef0123456789abcdef";
inline const char* const run_b = "fedcba9876543210fedcba9876543210";

inline std::vector<std::int64_t> owned(const std::vector<std::int64_t>& keys, int rank, int ranks) {
  std::vector<std::int64_t> out;
  for (const std::int64_t k : keys)
    if (owner_of(k, ranks) == rank) out.push_back(k);
  return out;
}

// Changes every float of the keys' rows by a function of the key alone (so one cache and the
// ranks' caches change a key the same way).
inline void touch_by_key(training_cache<std::int64_t>& tc, std::size_t t,
                         const std::vector<std::int64_t>& keys, float salt) {
  const std::size_t w = tc.row_width(t);
  std::vector<float> rows(keys.size() * w);
  tc.read(t, keys.data(), keys.size(), rows.data(), nullptr).throw_if_error();
  for (std::size_t i = 0; i < keys.size(); ++i)
    for (std::size_t j = 0; j < w; ++j)
      rows[i * w + j] = rows[i * w + j] * 0.5f + float(keys[i] % 7) * 0.125f + float(j) + salt;
  tc.assign(t, keys.data(), keys.size(), rows.data()).throw_if_error();
}

// The ranks' save of their stores as a sharded save per table in `dir` (the layout of
// distributed/sharded_save.hpp), at delta `applied`.
inline void save_sharded_by_hand(std::vector<std::unique_ptr<training_cache<std::int64_t>>>& ranks,
                                 const std::string& dir, std::uint64_t applied) {
  for (std::size_t t = 0; t < 2; ++t) {
    const std::string name = t == 0 ? "emb" : "lin";
    nlohmann::json parts = nlohmann::json::array();
    for (int r = 0; r < world; ++r) {
      auto& tc = *ranks[static_cast<std::size_t>(r)];
      tc.end_training().throw_if_error();
      char part[64];
      std::snprintf(part, sizeof part, "gen-000001/rank-%05d", r);
      fs::create_directories(dir + "/" + name + "/gen-000001");
      tc.store(t).checkpoint(dir + "/" + name + "/" + part).throw_if_error();
      parts.push_back({{"rank", r}, {"path", part}, {"rows", tc.store(t).size()}});
    }
    const std::size_t dim = t == 0 ? 4 : 1;
    const nlohmann::json m = {{"format", "embcache.sharded_save"},
                              {"format_version", 1},
                              {"table_name", name},
                              {"key_type", "int64"},
                              {"dim", dim},
                              {"row_width", ranks[0]->row_width(t)},
                              {"optimizer", t == 0 ? "adagrad" : "ftrl"},
                              {"step", 3},
                              {"num_blocks", 2},
                              {"run_id", run_a},
                              {"applied_delta", applied},
                              {"world_size", world},
                              {"owner_function", owner_function_name},
                              {"generation", 1},
                              {"parts", parts}};
    std::ofstream(dir + "/" + name + "/manifest.json") << m.dump(2);
  }
}

// Every rank exports delta `n` into `dir`/rank-R/, and the parts file names them.
inline void export_sharded(std::vector<std::unique_ptr<training_cache<std::int64_t>>>& ranks,
                           const std::string& dir, std::uint64_t n) {
  nlohmann::json parts = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    char part[64];
    std::snprintf(part, sizeof part, "rank-%05d", r);
    ranks[static_cast<std::size_t>(r)]->export_incremental_to(dir + "/" + part, true, n).value();
    std::snprintf(part, sizeof part, "rank-%05d/delta-%06llu", r, (unsigned long long)n);
    parts.push_back(part);
  }
  char name[64];
  std::snprintf(name, sizeof name, "/delta-%06llu.parts.json", (unsigned long long)n);
  std::ofstream(dir + name) << nlohmann::json{
      {"format", "embcache.sharded_delta"},
      {"format_version", 1},
      {"sequence", n},
      {"run_id", run_a},
      {"world_size", world},
      {"rows", 0},
      {"parts", parts}}.dump(2);
}

// One history, trained by one cache and by two ranks: pass 1 (export 1, save: the base), pass 2
// (keys changed, key 12 of table emb erased; export 2), pass 3 (new keys; export 3, final save).
struct sharded_history {
  std::string one_final, one_deltas, one_base;  // the one cache's saves and deltas
  std::string base, exports, final_save;        // the ranks': sharded saves and export folder
};

inline sharded_history make_sharded_history(const std::string& root) {
  sharded_history h{root + "/one_final", root + "/one_deltas", root + "/one_base",
                    root + "/base",      root + "/exports",    root + "/final"};
  std::vector<std::unique_ptr<training_cache<std::int64_t>>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(history_cache());
    ranks.back()->set_run_id(run_a).throw_if_error();
  }
  auto one = history_cache();
  // Every step on the one cache and on each rank's cache with the keys it owns.
  auto step = [&](const std::function<void(training_cache<std::int64_t>&, int, int)>& f) {
    f(*one, 0, 1);
    for (int r = 0; r < world; ++r) f(*ranks[static_cast<std::size_t>(r)], r, world);
  };
  const std::vector<std::int64_t> k0 = {-7, 0, 3, 12, 1000, std::int64_t{1} << 40};
  step([&](training_cache<std::int64_t>& tc, int r, int n) {
    const auto k = owned(k0, r, n);
    tc.begin_pass({k, k}).throw_if_error();
    touch_by_key(tc, 0, k, 1.0f);
    touch_by_key(tc, 1, k, 2.0f);
  });
  one->export_incremental_to(h.one_deltas, true).value();
  export_sharded(ranks, h.exports, 1);
  one->save(h.one_base).throw_if_error();
  save_sharded_by_hand(ranks, h.base, 1);
  step([&](training_cache<std::int64_t>& tc, int r, int n) {
    touch_by_key(tc, 0, owned({0, 3}, r, n), 3.0f);
    touch_by_key(tc, 1, owned({3}, r, n), 4.0f);
    const auto gone = owned({12}, r, n);
    tc.erase(0, gone.data(), gone.size()).throw_if_error();
  });
  one->export_incremental_to(h.one_deltas, true).value();
  export_sharded(ranks, h.exports, 2);
  const std::vector<std::int64_t> k1 = {0, 3, 5, 77, 1000};
  step([&](training_cache<std::int64_t>& tc, int r, int n) {
    tc.begin_pass({owned(k1, r, n), owned({5, 77}, r, n)}).throw_if_error();
    touch_by_key(tc, 0, owned({5, 77, 1000}, r, n), 5.0f);
    touch_by_key(tc, 1, owned({5, 77}, r, n), 6.0f);
  });
  one->export_incremental_to(h.one_deltas, true).value();
  export_sharded(ranks, h.exports, 3);
  one->save(h.one_final).throw_if_error();
  save_sharded_by_hand(ranks, h.final_save, 3);
  return h;
}

}  // namespace embcache::test
