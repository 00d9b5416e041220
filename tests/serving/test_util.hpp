// Helpers of the serving tests: scratch folders, file bytes, a small training-cache history with
// a base save, two deltas (changed rows, a tombstone, new keys) and the save taken at the end.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"
#include "embcache/training_cache.hpp"

namespace embcache::test {

namespace fs = std::filesystem;

/// A fresh folder under the temp folder, private to this process (tests/common/temp_dir.hpp).
inline std::string scratch(const std::string& name) {
  return testing::process_temp_dir("embcache_serving_test", name);
}

/// Removes this process's scratch folders when the test binary exits.
inline testing::process_temp_cleanup scratch_cleanup_at_exit{"embcache_serving_test"};

inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Every file under `dir` (relative path -> bytes).
inline std::vector<std::pair<std::string, std::string>> folder_bytes(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file())
      out.emplace_back(fs::relative(e.path(), dir).string(), file_bytes(e.path().string()));
  std::sort(out.begin(), out.end());
  return out;
}

/// Runs a shell command line; its exit status (-1 when it did not exit) and stdout + stderr.
inline std::pair<int, std::string> run_tool(const std::string& command) {
  std::FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

/// Folders of one history: `base` (a save), `deltas` (delta-000001, delta-000002) and `final`
/// (a save taken after the last export).
struct history {
  std::string base, deltas, final_save;
};

/// Two tables: "emb" (dim 4, AdaGrad) and "lin" (dim 1, FTRL).
inline std::unique_ptr<training_cache<std::int64_t>> history_cache(expiry_options emb_expiry = {}) {
  table_options<std::int64_t> emb, lin;
  emb.name = "emb";
  emb.dim = 4;
  emb.optimizer.kind = optimizer_kind::adagrad;
  emb.capacity = 64;
  emb.init.seed = 11;
  emb.expiry = emb_expiry;
  lin.name = "lin";
  lin.dim = 1;
  lin.optimizer.kind = optimizer_kind::ftrl;
  lin.capacity = 64;
  lin.init.seed = 12;
  return std::make_unique<training_cache<std::int64_t>>(training_cache_options{},
                                                        std::vector{emb, lin});
}

// Changes every float of the keys' rows (resident) deterministically.
inline void touch(training_cache<std::int64_t>& tc, std::size_t t,
                  const std::vector<std::int64_t>& keys, float salt) {
  const std::size_t w = tc.row_width(t);
  std::vector<float> rows(keys.size() * w);
  tc.read(t, keys.data(), keys.size(), rows.data(), nullptr).throw_if_error();
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = rows[i] * 0.5f + float(i) * 0.125f + salt;
  tc.assign(t, keys.data(), keys.size(), rows.data()).throw_if_error();
}

/// Writes the history under `root`: rows trained, base saved; rows of keys 0 and 3 changed and
/// key 12 erased (table emb), delta-000001; new keys 5 and 77 and key 1000 changed,
/// delta-000002; final save.
inline history make_history(const std::string& root, bool with_state) {
  history h{root + "/base", root + "/deltas", root + "/final"};
  auto tc = history_cache();
  const std::vector<std::int64_t> k0 = {-7, 0, 3, 12, 1000, std::int64_t{1} << 40};
  tc->begin_pass({k0, k0}).throw_if_error();
  touch(*tc, 0, k0, 1.0f);
  touch(*tc, 1, k0, 2.0f);
  tc->save(h.base).throw_if_error();
  touch(*tc, 0, {0, 3}, 3.0f);
  touch(*tc, 1, {3}, 4.0f);
  const std::int64_t gone = 12;
  tc->erase(0, &gone, 1).throw_if_error();
  tc->export_incremental_to(h.deltas, with_state).value();
  const std::vector<std::int64_t> k1 = {0, 3, 5, 77, 1000};
  tc->begin_pass({k1, {5, 77}}).throw_if_error();
  touch(*tc, 0, {5, 77, 1000}, 5.0f);
  touch(*tc, 1, {5, 77}, 6.0f);
  tc->export_incremental_to(h.deltas, with_state).value();
  tc->save(h.final_save).throw_if_error();
  return h;
}

/// A history with expiry (ttl_passes 1 on table emb only): keys 1, 2, 3 trained in pass 1 and
/// saved as `base`; pass 2 trains 2 and 3 (delta-000001); pass 3 begins {3}, where key 1 (of
/// table emb, untouched in pass 2) expires: a tombstone of delta-000002; final save.
inline history make_expiring_history(const std::string& root) {
  history h{root + "/base", root + "/deltas", root + "/final"};
  expiry_options e;
  e.ttl_passes = 1;
  auto tc = history_cache(e);
  const std::vector<std::int64_t> k1 = {1, 2, 3}, k2 = {2, 3}, k3 = {3};
  tc->begin_pass({k1, k1}).throw_if_error();
  touch(*tc, 0, k1, 1.0f);
  touch(*tc, 1, k1, 2.0f);
  tc->save(h.base).throw_if_error();
  tc->begin_pass({k2, k2}).throw_if_error();
  touch(*tc, 0, k2, 3.0f);
  touch(*tc, 1, k2, 4.0f);
  tc->export_incremental_to(h.deltas).value();
  tc->begin_pass({k3, k3}).throw_if_error();
  if (tc->counters().last[0].rows_expired != 1) throw std::runtime_error("key 1 did not expire");
  touch(*tc, 0, k3, 5.0f);
  touch(*tc, 1, k3, 6.0f);
  tc->export_incremental_to(h.deltas).value();
  tc->save(h.final_save).throw_if_error();
  return h;
}

}  // namespace embcache::test
