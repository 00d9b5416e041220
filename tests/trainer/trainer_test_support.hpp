// What the trainer's test files share: temporary folders, the synthetic dataset (made once per
// test binary), small configurations, runs and the comparison of two saves.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/read_bytes.hpp"
#include "common/status_assertions.hpp"
#include "common/temp_dir.hpp"
#include "common/trainer_dataset.hpp"
#include "embcache/criteo.hpp"
#include "embcache/keyset.hpp"
#include "embcache/serving.hpp"
#include "embcache/shard.hpp"
#include "embcache/synth.hpp"
#include "embcache/trainer/trainer.hpp"
#include "embcache/version.hpp"

namespace embcache::test {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Folders of this process, removed when the test binary exits (tests/common/temp_dir.hpp).
inline testing::process_temp_cleanup cleanup_at_exit{"embcache_trainer_test"};

inline std::string temp_dir(const std::string& name) {
  return testing::process_temp_dir("embcache_trainer_test", name);
}

// A character device like /dev/full (1, 7) at `path`: every write to it fails with ENOSPC. A
// device node, not a link to /dev/full: the metrics logs refuse links. False when this process
// may not create device nodes (not root).
inline bool make_full_device(const std::string& path) {
  return ::mknod(path.c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0;
}

// Six shards of 1,500 synthetic rows with crossed keys, written once per build of the test
// binary and shared by its processes (ctest runs every case in a process of its own, and under a
// sanitizer writing the data costs seconds). The folder lies beside the binary, named by its size
// and modification time, so a rebuilt binary writes it afresh and the build's earlier ones go. A
// process writes into a folder of its own and renames it into place: the rename is atomic, and
// of two processes that raced, the one that comes second drops its copy (the bytes are the same:
// the generator is deterministic). No test writes into it.
inline const std::string& dataset() {
  static const std::string dir = [] {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    const auto size = ec ? 0 : fs::file_size(exe, ec);
    const auto mtime = ec ? 0 : fs::last_write_time(exe, ec).time_since_epoch().count();
    if (ec) {  // no /proc: a copy per process
      const std::string d = temp_dir("data");
      const status s = test::write_trainer_dataset(d, 9000, /*cross=*/true);
      if (!s.ok()) throw std::runtime_error(s.to_string());
      return d;
    }
    const std::string prefix = exe.filename().string() + "_dataset_";
    const fs::path d =
        exe.parent_path() / (prefix + std::to_string(size) + "_" + std::to_string(mtime));
    if (fs::exists(d)) return d.string();  // only ever renamed into place whole
    const fs::path mine = d.string() + ".tmp" + std::to_string(::getpid());
    fs::remove_all(mine);
    const status s = test::write_trainer_dataset(mine.string(), 9000, /*cross=*/true);
    if (!s.ok()) throw std::runtime_error(s.to_string());
    fs::rename(mine, d, ec);  // fails when another process placed its copy first
    if (ec) fs::remove_all(mine);
    if (!fs::exists(d))
      throw std::runtime_error("cannot place the test dataset at " + d.string() + ": " +
                               ec.message());
    if (!ec) {  // this process placed it: the copies of earlier builds go
      for (const auto& e : fs::directory_iterator(exe.parent_path(), ec)) {
        const std::string n = e.path().filename().string();
        if (n.rfind(prefix, 0) == 0 && e.path() != d && n.find(".tmp") == std::string::npos)
          fs::remove_all(e.path(), ec);
      }
    }
    return d.string();
  }();
  return dir;
}

inline std::string shard(std::size_t i) { return shard_file_name(i); }

inline trainer_config small_config(const std::string& name) {
  trainer_config c;
  c.data_dir = dataset();
  c.passes = {{{shard(0), shard(1)}}, {{shard(2)}}, {{shard(3), shard(4)}}};
  c.eval_shard = shard(5);
  c.model.hidden = {32, 16};
  c.model.dropout = 0.1f;  // on, so that its stream is part of what must be reproduced
  c.model.seed = 7;
  c.batch_size = 128;
  c.crossed = true;
  c.seed = 3;
  c.log_interval = 0;
  c.threads = 2;
  // On the host whatever the build and machine ("auto" is the device in a cuda build on a GPU
  // machine; tests/cuda runs the device path, trainer_config_test what "auto" picks).
  c.embedding_device = device_choice::host;
  c.save_dir = temp_dir(name) + "/save";
  return c;
}

// Whether embedding_device "auto" puts the tables in the cuda space here: a build with the cuda
// space (the trainer then has the cuda path) on a machine with a CUDA device.
inline bool auto_embeddings_on_cuda() {
  return EMBCACHE_BUILT_WITH_CUDA && cuda_device_available();
}

// The trainer's note when embedding_device "auto" keeps the tables on the host, by build: a
// host-only trainer has no cuda path, a cuda build has no device here.
inline std::string auto_host_embeddings_note() {
  return EMBCACHE_BUILT_WITH_CUDA ? "embeddings on host (auto: no CUDA device)"
                                  : "embeddings on host (auto: this program has no cuda space)";
}

// The model files of a save: rows, slot ids and optimizer state (HugeCTR's per-optimizer files)
// of both tables, and the dense blob. The `version` files hold the cache's update clock, which
// counts swap calls too, and trainer.json holds timings: neither is part of the model.
inline void expect_same_model(const std::string& a, const std::string& b) {
  for (const char* table : {"wide", "deep"}) {
    const std::string folder = std::string("/sparse/") + table;
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(a + folder)) {
      if (e.path().filename() != "version") files.push_back(e.path().filename().string());
    }
    std::sort(files.begin(), files.end());
    EXPECT_GE(files.size(), 3u) << folder;  // key, emb_vector, slot_id (+ the state files)
    EXPECT_TRUE(std::find(files.begin(), files.end(), "slot_id") != files.end()) << folder;
    for (const std::string& file : files) {
      const std::string f = folder + "/" + file;
      const std::string x = read_bytes(a + f), y = read_bytes(b + f);
      EXPECT_GT(x.size(), 0u) << f;
      EXPECT_TRUE(x == y) << f << " differs between " << a << " and " << b;
    }
  }
  EXPECT_TRUE(read_bytes(a + "/dense.bin") == read_bytes(b + "/dense.bin")) << "dense.bin";
}

// Expects the incremental exports `delta-000001` .. `delta-00000N` of two export folders to hold
// the same tables, row for row: keys, vectors, optimizer state and tombstones.
inline void expect_same_deltas(const std::string& a, const std::string& b, int count) {
  for (int d = 1; d <= count; ++d) {
    const std::string n = "/delta-00000" + std::to_string(d);
    auto got = read_delta_folder(a + n);
    auto want = read_delta_folder(b + n);
    EMBCACHE_ASSERT_OK(got);
    EMBCACHE_ASSERT_OK(want);
    ASSERT_EQ(got.value().tables.size(), want.value().tables.size()) << n;
    for (std::size_t i = 0; i < want.value().tables.size(); ++i) {
      const folder_table& x = got.value().tables[i];
      const folder_table& y = want.value().tables[i];
      EXPECT_EQ(x.keys, y.keys) << n << " " << y.name;
      EXPECT_TRUE(x.vectors == y.vectors) << n << " " << y.name;
      EXPECT_TRUE(x.states == y.states) << n << " " << y.name;
      EXPECT_EQ(x.erased, y.erased) << n << " " << y.name;
    }
  }
}

struct run_result {
  std::vector<pass_metrics> history;
  table_counters totals;
  std::uint64_t step = 0;
};

inline run_result run(const trainer_config& c) {
  auto t = trainer::create(c);
  EMBCACHE_EXPECT_OK(t);
  if (!t.ok()) return {};
  const status s = t.value()->run();
  EMBCACHE_EXPECT_OK(s);
  run_result r;
  r.history = t.value()->history();
  for (const auto& tc : t.value()->cache().counters().total) r.totals += tc;
  r.step = t.value()->step();
  return r;
}

// Two runs' histories: as many passes, and the same train loss and eval AUC in each, to the bit.
inline void expect_same_history(const std::vector<pass_metrics>& a,
                                const std::vector<pass_metrics>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t p = 0; p < a.size(); ++p) {
    EXPECT_EQ(a[p].train_loss, b[p].train_loss) << "pass " << p;
    EXPECT_EQ(a[p].eval_auc, b[p].eval_auc) << "pass " << p;
  }
}

inline std::size_t count_keys(const trainer_config& c, const char* file) {
  std::vector<std::int64_t> all;
  for (const auto& p : c.passes)
    for (const auto& s : p.shards) {
      const std::string base = c.data_dir + "/" + s.substr(0, s.size() - 4);
      for (const std::string& f : {base + ".keys", base + ".cross.keys"}) {
        if (std::string(file) == "deep" && f.find(".cross.") != std::string::npos) continue;
        auto k = read_keyset<std::int64_t>(f);
        EMBCACHE_EXPECT_OK(k);
        all.insert(all.end(), k.value().begin(), k.value().end());
      }
    }
  std::sort(all.begin(), all.end());
  return std::size_t(std::unique(all.begin(), all.end()) - all.begin());
}

// Caches that hold the largest shard keyset of each table and no more: every pass evicts.
inline void size_to_largest_shard(trainer_config& c) {
  std::size_t wide = 0, deep = 0;
  for (const auto& p : c.passes)
    for (const auto& s : p.shards) {
      trainer_config one = c;
      one.passes = {{{s}}};
      wide = std::max(wide, count_keys(one, "wide"));
      deep = std::max(deep, count_keys(one, "deep"));
    }
  c.tables[0].capacity = wide;
  c.tables[1].capacity = deep;
}

}  // namespace embcache::test
