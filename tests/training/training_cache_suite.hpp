// Conformance suite of the training cache, typed over spaces: swap transparency, keyset errors,
// export completeness, save/load, crash during save, prefetch overlap and hazard, write-behind,
// early install, on-demand mode, and one script that must leave the same model in every space.
// Written once; each space's test binary compiles it in one translation unit and instantiates
// it for its space: tests/training/training_cache_test.cpp (host_space, cpu build) and
// tests/cuda/training_cache_test.cpp (cuda_space, cuda_tests; every case skips itself without a
// usable CUDA device).
//
// Two suites:
//  - stores<store_case<Space, Kind>>: the cases that also run over each kind of store (host
//    stores of int64 and uint32 keys, RocksDB where built);
//  - conformance<Space>: the others, on int64 keys and host stores.
// Instantiated as training_cache_host/... and training_cache_cuda/...; ctest names its tests after
// that prefix (training_cache_host.<case><type>), so `ctest -R training_cache` finds them all.
// No case is host-only: stores (the gated ones included) are host objects in either space, and
// the host space's internals are never inspected, only the public API and cache(t).
//
// Every pointer argument of training_cache is host memory in both spaces; only the rows of
// cache(t) (rows(), the rows the slots of lookup index) and cache(t)'s own bulk calls take the
// space's memory. The suite reaches those through cache_access alone.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/cuda_device.hpp"
#include "common/status_assertions.hpp"
#include "embcache/buffer.hpp"
#include "embcache/host_store.hpp"
#include "embcache/json.hpp"
#include "embcache/space.hpp"
#include "embcache/training_cache.hpp"
#include "test_util.hpp"
#ifdef EMBCACHE_TEST_ROCKSDB
#include "embcache/rocksdb_store.hpp"
#endif

extern char** environ;

// A namespace of its own: the suite shares a test binary with other suites of embcache::testing.
namespace embcache::testing::training_suite {

namespace fs = std::filesystem;

inline constexpr std::size_t dim = 4;

// A table's options: its name, row width, capacity and optimizer; the rest default.
inline table_options<std::int64_t> table_of(const char* name, std::size_t d, std::size_t capacity,
                                            optimizer_kind kind = optimizer_options{}.kind) {
  table_options<std::int64_t> o;
  o.name = name;
  o.dim = d;
  o.capacity = capacity;
  o.optimizer.kind = kind;
  return o;
}

// --- spaces --------------------------------------------------------------------------------------

// Skips every case of the cuda space when no CUDA device can be used.
template <class Space>
class space_test : public ::testing::Test {
 protected:
  void SetUp() override {
    if constexpr (is_cuda_space_v<Space>) EMBCACHE_NEED_CUDA_DEVICE();
  }
};

// Calls on table t's device cache (training_cache::cache(t)) with host vectors: copied through the
// space's memory with the library's buffers and copies (plain copies in the host space).
template <class Key, class Space>
class cache_access {
 public:
  cache_access(training_cache<Key, Space>& tc, std::size_t t)
      : cache_(tc.cache(t)), width_(tc.row_width(t)) {}

  /// cache(t).lookup_slots: each key's slot into `slots_out`, -1 when absent.
  status lookup_slots(const std::vector<Key>& keys, std::vector<std::int64_t>* slots_out) {
    buffer<Key, Space> k(keys.size(), cache_.space());
    buffer<std::int64_t, Space> s(keys.size(), cache_.space());
    k.copy_from_host(keys.data(), keys.size());
    const status st = cache_.lookup_slots(k.data(), keys.size(), s.data());
    slots_out->resize(keys.size());
    s.copy_to_host(slots_out->data(), keys.size());
    return st;
  }
  /// A copy of the row `slot` holds (cache(t).row_pool() at its row_indices()).
  std::vector<float> row(std::int64_t slot) {
    std::vector<float> r(width_);
    copy_to_host(cache_.space(), r.data(), at(slot), width_);
    return r;
  }
  /// Overwrites that row in place, as a training kernel would (mark_updated() then stamps it).
  void set_row(std::int64_t slot, const std::vector<float>& r) {
    copy_to_space(cache_.space(), at(slot), r.data(), width_);
  }
  /// cache(t).mark_updated.
  void mark_updated(const std::vector<std::int64_t>& slots) {
    buffer<std::int64_t, Space> s(slots.size(), cache_.space());
    s.copy_from_host(slots.data(), slots.size());
    cache_.mark_updated(s.data(), slots.size());
  }

 private:
  float* at(std::int64_t slot) {  // the row the slot holds (rows move between slots by index)
    buffer<std::int64_t, Space> s(1, cache_.space()), r(1, cache_.space());
    s.copy_from_host(&slot, 1);
    cache_.row_indices(s.data(), 1, r.data());
    std::int64_t row = 0;
    r.copy_to_host(&row, 1);
    return cache_.row_pool() + std::size_t(row) * width_;
  }

  embedding_cache<Key, Space>& cache_;
  std::size_t width_;
};

// --- stores --------------------------------------------------------------------------------------

template <class Key>
struct host_kind {
  using key = Key;
  static std::shared_ptr<param_store<Key>> make(const std::string&, const std::string& name,
                                                std::size_t width) {
    host_store_options o;
    o.table_name = name;
    o.row_width = width;
    return std::make_shared<host_store<Key>>(o);
  }
};

#ifdef EMBCACHE_TEST_ROCKSDB
template <class Key>
struct rocksdb_kind {
  using key = Key;
  static std::shared_ptr<param_store<Key>> make(const std::string& dir, const std::string& name,
                                                std::size_t width) {
    rocksdb_store_options o;
    o.path = dir + "/db_" + name;
    o.table_name = name;
    o.row_width = width;
    o.block_cache_bytes = 8 << 20;
    o.write_buffer_bytes = 4 << 20;
    auto s = rocksdb_store<Key>::open(o);
    if (!s.ok()) throw std::runtime_error(s.get_status().to_string());
    return std::shared_ptr<param_store<Key>>(std::move(s).value().release());
  }
};
#endif

// A case of stores: the space of the device caches and the kind of store behind.
template <class Space, class Kind>
struct store_case {
  using space_type = Space;
  using key = typename Kind::key;
  static std::shared_ptr<param_store<key>> make(const std::string& dir, const std::string& name,
                                                std::size_t width) {
    return Kind::make(dir, name, width);
  }
};

// The store cases of a space: host stores of both key types, and RocksDB where it is built.
template <class Space>
using store_cases = ::testing::Types<store_case<Space, host_kind<std::int64_t>>,
                                     store_case<Space, host_kind<std::uint32_t>>
#ifdef EMBCACHE_TEST_ROCKSDB
                                     ,
                                     store_case<Space, rocksdb_kind<std::int64_t>>
#endif
                                     >;

// --- the scripted training -----------------------------------------------------------------------

template <class Key>
std::vector<table_options<Key>> two_tables(std::size_t cap_a, std::size_t cap_b,
                                           std::shared_ptr<param_store<Key>> sa = nullptr,
                                           std::shared_ptr<param_store<Key>> sb = nullptr) {
  table_options<Key> a;
  a.name = "a";
  a.dim = dim;
  a.optimizer.kind = optimizer_kind::adam;
  a.capacity = cap_a;
  a.init.seed = 7;
  a.store = std::move(sa);
  table_options<Key> b;
  b.name = "b";
  b.dim = dim;
  b.optimizer.kind = optimizer_kind::adagrad;
  b.capacity = cap_b;
  b.init.seed = 7;
  b.store = std::move(sb);
  return {a, b};
}

// The scripted training: row <- row * 0.5 + f(pass, key) for a third of each keyset.
template <class Key, class Space>
void train_pass(training_cache<Key, Space>& tc, const std::vector<std::vector<Key>>& ks, int pass) {
  for (std::size_t t = 0; t < ks.size(); ++t) {
    std::vector<Key> keys;
    for (Key k : ks[t]) {
      if ((static_cast<std::uint64_t>(k) * 2654435761u + pass) % 3 == 0) keys.push_back(k);
    }
    const std::size_t w = tc.row_width(t);
    std::vector<float> rows(keys.size() * w);
    std::unique_ptr<bool[]> found(new bool[keys.size() + 1]);
    EMBCACHE_ASSERT_OK(tc.read(t, keys.data(), keys.size(), rows.data(), found.get()));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      ASSERT_TRUE(found[i]);
      for (std::size_t j = 0; j < w; ++j) {
        rows[i * w + j] = rows[i * w + j] * 0.5f + 0.25f * float(pass + 1) + float(j) * 1e-3f;
      }
    }
    EMBCACHE_ASSERT_OK(tc.assign(t, keys.data(), keys.size(), rows.data()));
  }
}

template <class Key>
std::vector<std::vector<std::vector<Key>>> script(std::size_t key_space, std::size_t per_pass,
                                                  int passes) {
  std::mt19937_64 rng(42);
  std::vector<std::vector<std::vector<Key>>> out;
  for (int p = 0; p < passes; ++p) {
    std::vector<std::vector<Key>> ks(2);
    for (auto& k : ks) {
      while (k.size() < per_pass) k.push_back(static_cast<Key>(rng() % key_space) * 3 + 1);
    }
    out.push_back(ks);
  }
  return out;
}

template <class Case>
class stores : public space_test<typename Case::space_type> {};
TYPED_TEST_SUITE_P(stores);

template <class Space>
class conformance : public space_test<Space> {};
TYPED_TEST_SUITE_P(conformance);

// Swap transparency: a cache of 10% of the key space ends with the same store as one of 100%.
TYPED_TEST_P(stores, swap_transparency_small_cache_equals_full_cache) {
  using Key = typename TypeParam::key;
  using Space = typename TypeParam::space_type;
  temp_dir dir;
  const std::size_t space = 2000;
  const auto passes = script<Key>(space, 180, 8);
  // tight: every leaving row is evicted at its boundary (max_resident = capacity); otherwise
  // leaving rows may stay in the table's slack.
  auto run = [&](std::size_t cap, const std::string& sub, bool use_prefetch, bool tight = false) {
    auto sa = TypeParam::make(dir.path() + "/" + sub, "a", dim * 3);
    auto sb = TypeParam::make(dir.path() + "/" + sub, "b", dim * 2);
    auto opts = two_tables<Key>(cap, cap, sa, sb);
    for (auto& o : opts) o.max_resident = tight ? cap : 0;
    training_cache<Key, Space> tc({}, opts);
    for (std::size_t p = 0; p < passes.size(); ++p) {
      EMBCACHE_EXPECT_OK(tc.begin_pass(passes[p]));
      if (use_prefetch && p + 1 < passes.size()) {
        EMBCACHE_EXPECT_OK(tc.prefetch(passes[p + 1]));
      }
      train_pass(tc, passes[p], int(p));
      if (p == 4) {
        std::vector<Key> gone(passes[p][0].begin(), passes[p][0].begin() + 10);
        EMBCACHE_EXPECT_OK(tc.erase(0, gone.data(), gone.size()));
      }
    }
    EMBCACHE_EXPECT_OK(tc.end_training());
    return std::make_tuple(store_model(tc, 0), store_model(tc, 1), tc.counters());
  };
  const auto [a_full, b_full, c_full] = run(space, "full", false);
  const auto [a_small, b_small, c_small] = run(space / 10, "small", false);
  const auto [a_pref, b_pref, c_pref] = run(space / 10, "pref", true);
  const auto [a_tight, b_tight, c_tight] = run(space / 10, "tight", true, true);
  EXPECT_EQ(c_full.total[0].rows_evicted, 0u);
  EXPECT_GT(c_tight.total[0].rows_evicted, c_pref.total[0].rows_evicted);
  EXPECT_GT(c_small.total[0].rows_evicted, 0u);
  EXPECT_GT(c_small.total[0].rows_pushed, 0u);
  EXPECT_GT(c_pref.total[0].rows_staged, 0u);
  ASSERT_EQ(a_full.size(), a_small.size());
  EXPECT_TRUE(a_full == a_small);  // bit-identical floats
  EXPECT_TRUE(b_full == b_small);
  EXPECT_TRUE(a_full == a_pref);
  EXPECT_TRUE(b_full == b_pref);
  EXPECT_TRUE(a_full == a_tight);
  EXPECT_TRUE(b_full == b_tight);
}

// Export completeness: base + every delta, applied in order, equals the current model, and keys
// left untouched since the base never appear in a delta.
TYPED_TEST_P(stores, export_base_plus_deltas_equals_model) {
  using Key = typename TypeParam::key;
  using Space = typename TypeParam::space_type;
  temp_dir dir;
  const auto passes = script<Key>(1500, 150, 7);
  auto sa = TypeParam::make(dir.path(), "a", dim * 3);
  auto sb = TypeParam::make(dir.path(), "b", dim * 2);
  training_cache<Key, Space> tc({}, two_tables<Key>(200, 160, sa, sb));
  EMBCACHE_ASSERT_OK(tc.begin_pass(passes[0]));
  train_pass(tc, passes[0], 0);
  EMBCACHE_ASSERT_OK(tc.end_training());
  model<Key> base[2] = {store_model(tc, 0), store_model(tc, 1)};
  model<Key> applied[2] = {base[0], base[1]};
  EMBCACHE_ASSERT_OK(tc.export_incremental());  // the base is the reference from here on
  std::set<Key> touched[2];
  for (std::size_t p = 1; p < passes.size(); ++p) {
    EMBCACHE_ASSERT_OK(tc.begin_pass(passes[p]));
    train_pass(tc, passes[p], int(p));
    for (int t = 0; t < 2; ++t) {
      for (Key k : passes[p][t]) {
        if ((static_cast<std::uint64_t>(k) * 2654435761u + p) % 3 == 0 || !base[t].count(k)) {
          touched[t].insert(k);
        }
      }
    }
    if (p == 3) {
      std::vector<Key> gone = {passes[1][0][0], passes[1][0][1]};
      EMBCACHE_ASSERT_OK(tc.erase(0, gone.data(), gone.size()));
      touched[0].insert(gone.begin(), gone.end());
    }
    if (p % 2 == 0 || p + 1 == passes.size()) {
      std::string path;
      if (p == 4) {
        auto r = tc.export_incremental_to(dir.path() + "/deltas", true);
        EMBCACHE_ASSERT_OK(r);
        path = r.value();
        EXPECT_TRUE(fs::exists(path + "/manifest.json"));
        EXPECT_TRUE(fs::exists(path + "/a/key") && fs::exists(path + "/a/emb_vector"));
        EXPECT_EQ(fs::path(path).filename().string(), "delta-000001");
        // Applied below from the folder; the in-memory export right after it is empty.
      }
      auto r = tc.export_incremental(true);
      EMBCACHE_ASSERT_OK(r);
      if (p == 4) {
        EXPECT_EQ(r.value()[0].keys.size(), 0u);
      }
      for (int t = 0; t < 2; ++t) {
        const auto& d = r.value()[t];
        const std::size_t sw = d.state_width;
        for (std::size_t i = 0; i < d.keys.size(); ++i) {
          EXPECT_TRUE(touched[t].count(d.keys[i])) << "untouched key exported: " << d.keys[i];
          auto& row = applied[t][d.keys[i]];
          row.assign(d.vectors.begin() + i * dim, d.vectors.begin() + (i + 1) * dim);
          row.insert(row.end(), d.states.begin() + i * sw, d.states.begin() + (i + 1) * sw);
        }
        for (Key k : d.erased) applied[t].erase(k);
      }
    }
    if (p == 4) {
      // Apply the folder written above.
      const std::string path = dir.path() + "/deltas/delta-000001";
      for (int t = 0; t < 2; ++t) {
        const std::string f = path + "/" + (t == 0 ? "a" : "b");
        const std::size_t sw = t == 0 ? 2 * dim : dim;
        auto rd = [](const std::string& p) {
          std::ifstream in(p, std::ios::binary);
          return std::vector<char>(std::istreambuf_iterator<char>(in), {});
        };
        auto kb = rd(f + "/key"), vb = rd(f + "/emb_vector"), sb2 = rd(f + "/opt_state"),
             eb = rd(f + "/erased");
        const std::size_t n = kb.size() / 8;
        ASSERT_EQ(vb.size(), n * dim * 4);
        ASSERT_EQ(sb2.size(), n * sw * 4);
        for (std::size_t i = 0; i < n; ++i) {
          std::int64_t k;
          std::memcpy(&k, kb.data() + i * 8, 8);
          EXPECT_TRUE(touched[t].count(Key(k)));
          std::vector<float> row(dim + sw);
          std::memcpy(row.data(), vb.data() + i * dim * 4, dim * 4);
          std::memcpy(row.data() + dim, sb2.data() + i * sw * 4, sw * 4);
          applied[t][Key(k)] = row;
        }
        for (std::size_t i = 0; i < eb.size() / 8; ++i) {
          std::int64_t k;
          std::memcpy(&k, eb.data() + i * 8, 8);
          applied[t].erase(Key(k));
        }
      }
    }
  }
  EMBCACHE_ASSERT_OK(tc.end_training());
  EXPECT_TRUE(applied[0] == store_model(tc, 0));
  EXPECT_TRUE(applied[1] == store_model(tc, 1));
  // Nothing changed since the last export: the next one is empty.
  auto again = tc.export_incremental();
  EMBCACHE_ASSERT_OK(again);
  EXPECT_EQ(again.value()[0].keys.size(), 0u);
  EXPECT_EQ(again.value()[0].erased.size(), 0u);
}

// A delta folder that cannot be written (a full disk) leaves no delta behind and loses no row:
// the next export covers everything the failed one would have held.
TYPED_TEST_P(conformance, a_failed_delta_write_loses_no_row) {
  using Space = TypeParam;
  using Key = std::int64_t;
  temp_dir dir;
  const std::string disk = dir.path() + "/small_disk";
  fs::create_directories(disk);
  if (::mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=65536") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  }
  struct unmount_at_exit {
    std::string path;
    ~unmount_at_exit() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{disk};
  const auto passes = script<Key>(3000, 1200, 3);
  training_cache<Key, Space> tc({}, two_tables<Key>(2500, 2500));
  EMBCACHE_ASSERT_OK(tc.begin_pass(passes[0]));
  EMBCACHE_ASSERT_OK(tc.end_training());
  model<Key> applied[2] = {store_model(tc, 0), store_model(tc, 1)};
  EMBCACHE_ASSERT_OK(tc.export_incremental());  // the base
  for (int p = 1; p < 3; ++p) {
    EMBCACHE_ASSERT_OK(tc.begin_pass(passes[p]));
    train_pass(tc, passes[p], p);
    std::vector<Key> gone = {passes[p][0][0]};
    EMBCACHE_ASSERT_OK(tc.erase(0, gone.data(), gone.size()));
    // About 1,200 rows of 12 floats with state: far more than 64 KiB.
    auto failed = tc.export_incremental_to(disk + "/deltas", true);
    ASSERT_FALSE(failed.ok());
    EXPECT_EQ(failed.get_status().code(), status_code::out_of_space)
        << failed.get_status().to_string();
    EXPECT_FALSE(fs::exists(disk + "/deltas/delta-000001"));
  }
  auto r = tc.export_incremental(true);
  EMBCACHE_ASSERT_OK(r);
  for (int t = 0; t < 2; ++t) {
    const auto& d = r.value()[t];
    const std::size_t sw = d.state_width;
    for (std::size_t i = 0; i < d.keys.size(); ++i) {
      auto& row = applied[t][d.keys[i]];
      row.assign(d.vectors.begin() + i * dim, d.vectors.begin() + (i + 1) * dim);
      row.insert(row.end(), d.states.begin() + i * sw, d.states.begin() + (i + 1) * sw);
    }
    for (Key k : d.erased) applied[t].erase(k);
  }
  EXPECT_EQ(r.value()[0].erased.size(), 2u);
  EMBCACHE_ASSERT_OK(tc.end_training());
  EXPECT_TRUE(applied[0] == store_model(tc, 0));
  EXPECT_TRUE(applied[1] == store_model(tc, 1));
}

// A delta number chosen by the caller (the ranks of a sharded run agree on one): used as given,
// refused at or below a delta already in the folder, before anything is exported.
TYPED_TEST_P(conformance, an_export_takes_a_given_delta_number_past_the_folder_s_last) {
  using Space = TypeParam;
  using Key = std::int64_t;
  temp_dir dir;
  const auto passes = script<Key>(600, 200, 2);
  training_cache<Key, Space> tc({}, two_tables<Key>(500, 500));
  EMBCACHE_ASSERT_OK(tc.begin_pass(passes[0]));
  train_pass(tc, passes[0], 0);
  auto first = tc.export_incremental_to(dir.path(), false, 3);
  EMBCACHE_ASSERT_OK(first);
  EXPECT_EQ(first.value(), dir.path() + "/delta-000003");
  EMBCACHE_ASSERT_OK(tc.begin_pass(passes[1]));
  train_pass(tc, passes[1], 1);
  for (const std::uint64_t bad : {std::uint64_t{2}, std::uint64_t{3}, std::uint64_t{1000000}}) {
    auto refused = tc.export_incremental_to(dir.path(), false, bad);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.get_status().code(), status_code::invalid_argument);
    EXPECT_NE(refused.get_status().message().find("delta number " + std::to_string(bad)),
              std::string::npos)
        << refused.get_status().to_string();
  }
  // The refusals exported nothing: the next delta still holds the second pass's rows.
  auto next = tc.export_incremental_to(dir.path(), false);
  EMBCACHE_ASSERT_OK(next);
  EXPECT_EQ(next.value(), dir.path() + "/delta-000004");
  auto empty = tc.export_incremental(false);
  EMBCACHE_ASSERT_OK(empty);
  EXPECT_EQ(empty.value()[0].keys.size() + empty.value()[1].keys.size(), 0u);
}

// save() reports the rows written: (0, total) first, then after each table, ending at the total.
TYPED_TEST_P(conformance, save_reports_its_progress_by_rows) {
  using Space = TypeParam;
  using Key = std::int64_t;
  temp_dir dir;
  const auto passes = script<Key>(1500, 150, 2);
  training_cache<Key, Space> tc({}, two_tables<Key>(200, 160));
  for (const auto& p : passes) {
    EMBCACHE_ASSERT_OK(tc.begin_pass(p));
    train_pass(tc, p, 0);
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> calls;
  EMBCACHE_ASSERT_OK(tc.save(dir.path() + "/save", [&](std::uint64_t done, std::uint64_t total) {
    calls.emplace_back(done, total);
  }));
  const std::uint64_t a = tc.store(0).size(), b = tc.store(1).size();
  ASSERT_GT(a, 0u);
  ASSERT_GT(b, 0u);
  using call = std::pair<std::uint64_t, std::uint64_t>;
  EXPECT_EQ(calls, (std::vector<call>{{0, a + b}, {a, a + b}, {a + b, a + b}}));
}

TYPED_TEST_P(stores, save_load_round_trip_and_refusals) {
  using Key = typename TypeParam::key;
  using Space = typename TypeParam::space_type;
  temp_dir dir;
  const auto passes = script<Key>(800, 100, 3);
  training_cache<Key, Space> tc(
      {}, two_tables<Key>(150, 150, TypeParam::make(dir.path() + "/s1", "a", dim * 3),
                          TypeParam::make(dir.path() + "/s1", "b", dim * 2)));
  for (std::size_t p = 0; p < passes.size(); ++p) {
    EMBCACHE_ASSERT_OK(tc.begin_pass(passes[p]));
    train_pass(tc, passes[p], int(p));
  }
  const std::string ckpt = dir.path() + "/ckpt";
  EMBCACHE_ASSERT_OK(tc.save(ckpt));
  const auto a = store_model(tc, 0), b = store_model(tc, 1);
  training_cache<Key, Space> other(
      {}, two_tables<Key>(150, 150, TypeParam::make(dir.path() + "/s2", "a", dim * 3),
                          TypeParam::make(dir.path() + "/s2", "b", dim * 2)));
  EMBCACHE_ASSERT_OK(other.begin_pass(passes[0]));  // rows that load must replace
  EMBCACHE_ASSERT_OK(other.end_training());
  const status s = other.load(ckpt);
  EMBCACHE_ASSERT_OK(s);
  EXPECT_EQ(other.cache(0).size(), 0u);
  EXPECT_TRUE(store_model(other, 0) == a);
  EXPECT_TRUE(store_model(other, 1) == b);
  // Training continues from the loaded rows, optimizer state included.
  EMBCACHE_ASSERT_OK(other.begin_pass(passes[1]));
  std::vector<float> row(dim * 3);
  EMBCACHE_ASSERT_OK(other.read(0, &passes[1][0][0], 1, row.data(), nullptr));
  EXPECT_TRUE(row == a.at(passes[1][0][0]));

  // Mismatched dim.
  {
    auto opts = two_tables<Key>(150, 150);
    opts[1].dim = dim + 1;
    training_cache<Key, Space> wrong({}, opts);
    const status e = wrong.load(ckpt);
    EXPECT_EQ(e.code(), status_code::invalid_argument) << e.to_string();
    EXPECT_NE(e.message().find("'b'"), std::string::npos) << e.message();
  }
  // Missing folder.
  EXPECT_EQ(other.load(dir.path() + "/nowhere").code(), status_code::not_found);
  // Corrupted file: one flipped byte.
  {
    const std::string f = ckpt + "/a/emb_vector";
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(5);
    char c = 0;
    io.read(&c, 1);
    io.seekp(5);
    c ^= 0x20;
    io.write(&c, 1);
    io.close();
    const auto before = store_model(other, 0);
    const status e = other.load(ckpt);
    EXPECT_EQ(e.code(), status_code::corruption) << e.to_string();
    EXPECT_TRUE(store_model(other, 0) == before);  // nothing changed
  }
  // Truncated file.
  fs::resize_file(ckpt + "/b/key", 12);
  EXPECT_EQ(other.load(ckpt).code(), status_code::corruption);
}

TYPED_TEST_P(conformance, loads_a_plain_hugectr_folder) {
  using Space = TypeParam;
  temp_dir dir;
  const std::string folder = dir.path() + "/model/emb";
  fs::create_directories(folder);
  std::vector<std::int64_t> keys = {5, -3, 1000000000000};
  std::vector<float> vec = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::ofstream(folder + "/key", std::ios::binary)
      .write(reinterpret_cast<const char*>(keys.data()), 24);
  std::ofstream(folder + "/emb_vector", std::ios::binary)
      .write(reinterpret_cast<const char*>(vec.data()), 48);
  table_options<std::int64_t> o;
  o.name = "emb";
  o.dim = dim;
  o.optimizer.kind = optimizer_kind::adagrad;
  o.optimizer.adagrad_initial_accumulator = 0.5f;
  o.capacity = 128;
  training_cache<std::int64_t, Space> tc({}, {o});
  load_options hugectr;
  hugectr.allow_hugectr_folder = true;
  const status s = tc.load(dir.path() + "/model", hugectr);
  EMBCACHE_ASSERT_OK(s);
  auto m = store_model(tc, 0);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[-3], (std::vector<float>{5, 6, 7, 8, 0.5f, 0.5f, 0.5f, 0.5f}));
  // A folder of another dim is refused.
  o.dim = 3;
  training_cache<std::int64_t, Space> wrong({}, {o});
  EXPECT_EQ(wrong.load(dir.path() + "/model", hugectr).code(), status_code::invalid_argument);
}

// --- keyset errors -------------------------------------------------------------------------------

TYPED_TEST_P(conformance, keyset_errors_are_clear_and_change_nothing) {
  using Space = TypeParam;
  temp_dir dir;
  std::vector<std::int64_t> k1(100), big(300);
  for (std::size_t i = 0; i < k1.size(); ++i) k1[i] = std::int64_t(i) * 7;
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = std::int64_t(i);
  const std::string p1 = dir.path() + "/k1", pbig = dir.path() + "/big", praw = dir.path() + "/raw";
  EMBCACHE_ASSERT_OK(write_keyset(p1, k1.data(), k1.size()));
  EMBCACHE_ASSERT_OK(write_keyset(pbig, big.data(), big.size()));
  EMBCACHE_ASSERT_OK(write_keyset(praw, k1.data(), k1.size(), keyset_format::hugectr_raw));
  std::vector<std::uint32_t> k32 = {1, 2, 3};
  const std::string p32 = dir.path() + "/k32";
  EMBCACHE_ASSERT_OK(write_keyset(p32, k32.data(), k32.size()));
  const std::string ptrunc = dir.path() + "/trunc";
  fs::copy_file(p1, ptrunc);
  fs::resize_file(ptrunc, fs::file_size(p1) - 5);

  auto o = table_of("t", dim, 200);
  training_cache<std::int64_t, Space> tc({}, {o});
  EMBCACHE_ASSERT_OK(tc.begin_pass_files({p1}));
  EXPECT_EQ(tc.cache(0).size(), 100u);

  status s = tc.begin_pass_files({pbig});
  EXPECT_EQ(s.code(), status_code::capacity_exceeded);
  EXPECT_NE(s.message().find("300"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("200"), std::string::npos) << s.message();
  s = tc.begin_pass_files({ptrunc});
  EXPECT_EQ(s.code(), status_code::corruption) << s.to_string();
  s = tc.begin_pass_files({p32});
  EXPECT_EQ(s.code(), status_code::invalid_argument) << s.to_string();
  s = tc.begin_pass_files({dir.path() + "/missing"});
  EXPECT_EQ(s.code(), status_code::not_found) << s.to_string();
  EXPECT_NE(s.message().find("missing"), std::string::npos);
  s = tc.begin_pass_files({p1, p1});
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  // Nothing changed: same residents, one pass counted.
  EXPECT_EQ(tc.cache(0).size(), 100u);
  EXPECT_EQ(tc.counters().passes, 1u);
  EXPECT_EQ(tc.counters().total[0].rows_evicted, 0u);

  // HugeCTR's raw keyset files.
  training_cache_options raw_opts;
  raw_opts.keyset_fmt = keyset_format::hugectr_raw;
  training_cache<std::int64_t, Space> raw(raw_opts, {o});
  EMBCACHE_ASSERT_OK(raw.begin_pass_files({praw}));
  EXPECT_EQ(raw.cache(0).size(), 100u);
}

// Minimal movement: rows that stay in the next keyset stay; eviction only as capacity requires.
TYPED_TEST_P(conformance, begin_pass_moves_only_the_difference) {
  using Space = TypeParam;
  auto o = table_of("t", dim, 150, optimizer_kind::adam);
  o.max_resident = o.capacity;  // every leaving row is evicted at its boundary
  training_cache<std::int64_t, Space> tc({}, {o});
  std::vector<std::int64_t> k1, k2;
  for (int i = 0; i < 100; ++i) k1.push_back(i);
  for (int i = 60; i < 160; ++i) k2.push_back(i);
  EMBCACHE_ASSERT_OK(tc.begin_pass({k1}));
  EXPECT_EQ(tc.counters().last[0].rows_initialized, 100u);
  std::vector<float> row(dim * 3, 1.0f);
  EMBCACHE_ASSERT_OK(tc.assign(0, &k1[0], 1, row.data()));  // key 0 dirty
  EMBCACHE_ASSERT_OK(tc.begin_pass({k2}));
  const auto& c = tc.counters().last[0];
  EXPECT_EQ(c.hits, 40u);
  EXPECT_EQ(c.misses, 60u);
  EXPECT_EQ(c.rows_evicted, 10u);  // 100 + 60 - 150
  EXPECT_EQ(c.rows_pushed, 10u);   // initialized rows are dirty (not yet in the store)
  EXPECT_EQ(c.rows_initialized, 60u);
  EXPECT_EQ(tc.cache(0).size(), 150u);
  EXPECT_EQ(tc.store(0).size(), 10u);
  nlohmann::json j = tc.counters();
  EXPECT_EQ(j["tables"]["t"]["last"]["rows_evicted"], 10);
  EXPECT_EQ(j["passes"], 2);
  // Assigning a key that is not resident is refused.
  std::int64_t absent = 100000;
  EXPECT_EQ(tc.assign(0, &absent, 1, row.data()).code(), status_code::not_found);
}

// --- prefetch ------------------------------------------------------------------------------------

// A store whose pulls (and, separately, pushes) wait at a gate, to make the overlap observable
// without timing.
template <class Key>
class gated_store final : public param_store<Key> {
 public:
  explicit gated_store(std::size_t width, std::string name = "t") {
    host_store_options o;
    o.table_name = std::move(name);
    o.row_width = width;
    inner_ = std::make_unique<host_store<Key>>(o);
  }
  void close_gate() {
    std::lock_guard<std::mutex> l(m_);
    open_ = false;
  }
  void open_gate() {
    {
      std::lock_guard<std::mutex> l(m_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // Waits (up to `limit`; by default a minute, against a hang) until a pull waits at the closed
  // gate.
  bool wait_for_blocked_pull(std::chrono::milliseconds limit = std::chrono::minutes(1)) {
    std::unique_lock<std::mutex> l(m_);
    return cv_.wait_for(l, limit, [&] { return blocked_ > 0; });
  }
  std::thread::id last_pull_thread() {
    std::lock_guard<std::mutex> l(m_);
    return pull_thread_;
  }
  std::size_t pulls() {
    std::lock_guard<std::mutex> l(m_);
    return pulls_;
  }
  // The push gate. A closed gate holds a push for at most 20 seconds (a write-back that the
  // caller's thread waits for then shows up as a push from that thread, not as a hang).
  void close_push_gate() {
    std::lock_guard<std::mutex> l(m_);
    push_open_ = false;
  }
  void open_push_gate() {
    {
      std::lock_guard<std::mutex> l(m_);
      push_open_ = true;
    }
    cv_.notify_all();
  }
  bool wait_for_blocked_push() {
    std::unique_lock<std::mutex> l(m_);
    return cv_.wait_for(l, std::chrono::minutes(1), [&] { return push_blocked_ > 0; });
  }
  // Whether a push is held at the gate now.
  bool push_held() {
    std::lock_guard<std::mutex> l(m_);
    return push_blocked_ > 0;
  }
  std::thread::id last_push_thread() {
    std::lock_guard<std::mutex> l(m_);
    return push_thread_;
  }
  // Pulls and erases that reached the store while a push was held at the gate: a caller that
  // reads or changes the store before a pending write-behind is in shows up here.
  std::size_t calls_during_blocked_push() {
    std::lock_guard<std::mutex> l(m_);
    return calls_during_push_;
  }
  void fail_pushes(int n) {
    std::lock_guard<std::mutex> l(m_);
    fail_pushes_ = n;
  }
  // The next `n` pushes throw std::runtime_error("injected push exception") instead.
  void throw_on_pushes(int n) {
    std::lock_guard<std::mutex> l(m_);
    throw_pushes_ = n;
  }

  std::size_t row_width() const noexcept override { return inner_->row_width(); }
  const std::string& table_name() const noexcept override { return inner_->table_name(); }
  status pull(const Key* k, std::size_t n, float* r, bool* f, std::uint64_t* v) override {
    {
      std::unique_lock<std::mutex> l(m_);
      ++pulls_;
      if (push_blocked_ > 0) ++calls_during_push_;
      pull_thread_ = std::this_thread::get_id();
      ++blocked_;
      cv_.notify_all();
      cv_.wait(l, [&] { return open_; });
      --blocked_;
    }
    return inner_->pull(k, n, r, f, v);
  }
  status push(const Key* k, std::size_t n, const float* r, const std::uint64_t* v) override {
    {
      std::unique_lock<std::mutex> l(m_);
      push_thread_ = std::this_thread::get_id();
      if (fail_pushes_ > 0) {
        --fail_pushes_;
        return status::io_error("injected push failure");
      }
      if (throw_pushes_ > 0) {
        --throw_pushes_;
        throw std::runtime_error("injected push exception");
      }
      ++push_blocked_;
      cv_.notify_all();
      cv_.wait_for(l, std::chrono::seconds(20), [&] { return push_open_; });
      --push_blocked_;
    }
    return inner_->push(k, n, r, v);
  }
  status erase(const Key* k, std::size_t n, std::size_t* e) override {
    {
      std::lock_guard<std::mutex> l(m_);
      if (push_blocked_ > 0) ++calls_during_push_;
    }
    return inner_->erase(k, n, e);
  }
  status contains(const Key* k, std::size_t n, bool* f) override {
    return inner_->contains(k, n, f);
  }
  std::size_t size() const noexcept override { return inner_->size(); }
  std::uint64_t max_version() const noexcept override { return inner_->max_version(); }
  status for_each(std::size_t b, const store_batch_fn<Key>& fn) override {
    return inner_->for_each(b, fn);
  }
  status for_each_changed_since(std::uint64_t v, std::size_t b,
                                const store_batch_fn<Key>& fn) override {
    return inner_->for_each_changed_since(v, b, fn);
  }
  status flush() override { return {}; }
  status checkpoint(const std::string& d) override { return inner_->checkpoint(d); }

 private:
  std::unique_ptr<host_store<Key>> inner_;
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = true;
  int blocked_ = 0;
  std::size_t pulls_ = 0;
  std::thread::id pull_thread_;
  bool push_open_ = true;
  int push_blocked_ = 0;
  int fail_pushes_ = 0;
  int throw_pushes_ = 0;
  std::size_t calls_during_push_ = 0;
  std::thread::id push_thread_;
};

TYPED_TEST_P(conformance, prefetch_stages_in_the_background_while_the_caller_trains) {
  using Space = TypeParam;
  auto store = std::make_shared<gated_store<std::int64_t>>(dim * 3);
  auto o = table_of("t", dim, 256, optimizer_kind::adam);
  o.store = store;
  training_cache<std::int64_t, Space> tc({}, {o});
  std::vector<std::int64_t> k1, k2;
  for (int i = 0; i < 100; ++i) k1.push_back(i);
  for (int i = 50; i < 200; ++i) k2.push_back(i);
  EMBCACHE_ASSERT_OK(tc.begin_pass({k1}));
  train_pass(tc, {k1}, 0);
  EMBCACHE_ASSERT_OK(tc.end_training());
  // Put rows 100..149 in the store so that staging pulls real rows.
  std::vector<float> rows(50 * dim * 3, 2.5f);
  std::vector<std::int64_t> pre;
  for (int i = 100; i < 150; ++i) pre.push_back(i);
  std::vector<std::uint64_t> ones(pre.size(), 1);
  EMBCACHE_ASSERT_OK(store->push(pre.data(), pre.size(), rows.data(), ones.data()));

  store->close_gate();
  const std::size_t pulls_before = store->pulls();
  EMBCACHE_ASSERT_OK(tc.prefetch({k2}));  // returns while the staging pull waits at the gate
  ASSERT_TRUE(store->wait_for_blocked_pull());
  EXPECT_NE(store->last_pull_thread(), std::this_thread::get_id());
  // The caller keeps training pass 1 while staging is blocked in the store.
  train_pass(tc, {k1}, 1);
  EXPECT_TRUE(tc.prefetch_pending());
  store->open_gate();
  EMBCACHE_ASSERT_OK(tc.begin_pass({k2}));
  EXPECT_EQ(store->pulls(), pulls_before + 1);  // begin_pass itself pulled nothing
  const auto& c = tc.counters().last[0];
  EXPECT_EQ(c.rows_staged, 100u);
  EXPECT_EQ(c.rows_pulled, 0u);
  EXPECT_EQ(c.rows_initialized, 50u);
  EXPECT_EQ(c.hits, 50u);
  std::vector<float> row(dim * 3);
  std::int64_t k = 120;
  EMBCACHE_ASSERT_OK(tc.read(0, &k, 1, row.data(), nullptr));
  EXPECT_EQ(row[0], 2.5f);
}

// Prefetch hazard (docs/training_cache.md): rows staged for pass k+1 are never older than a
// write-back of the same key at the pass k boundary. The race made reproducible: table "a"'s
// write-behind push is held at its store's gate, so the flusher has not reached table "b", whose
// key 10 left at the same boundary; then pass k+1, which brings key 10 back, is prefetched with
// "b"'s pull gate closed. A worker that staged before the write-behind is in would pull key 10
// at once (the pull shows up at the gate, holding "b"'s store until the gate opens, so the stale
// row is what it reads); the cache must make it wait for the flusher instead.
TYPED_TEST_P(conformance, staged_rows_are_never_older_than_a_write_back) {
  using Space = TypeParam;
  auto store_a = std::make_shared<gated_store<std::int64_t>>(dim, "a");
  auto store_b = std::make_shared<gated_store<std::int64_t>>(dim, "b");
  std::vector<table_options<std::int64_t>> opts(2);
  for (std::size_t t = 0; t < 2; ++t) {
    opts[t].name = t == 0 ? "a" : "b";
    opts[t].dim = dim;
    opts[t].capacity = 8;
    opts[t].max_resident = opts[t].capacity;  // every leaving row is evicted at its boundary
    opts[t].store = t == 0 ? store_a : store_b;
  }
  training_cache<std::int64_t, Space> tc({}, opts);  // write-behind on (the default)
  const std::vector<std::int64_t> a1 = {1, 2, 3, 4, 5}, a2 = {11, 12, 13, 14, 15};
  const std::vector<std::int64_t> b1 = {10, 20, 21}, b2 = {20, 21, 22, 23, 24, 25, 26, 27};
  std::vector<std::int64_t> b3 = b2;
  b3.back() = 10;  // key 10 comes back at the next pass
  EMBCACHE_ASSERT_OK(tc.begin_pass({a1, b1}));
  const std::int64_t ten = 10;
  const std::vector<float> trained(dim, 9.0f);
  EMBCACHE_ASSERT_OK(tc.assign(1, &ten, 1, trained.data()));
  // Every row of both tables leaves (the new rows are dirty): the flusher pushes "a", then "b".
  store_a->close_push_gate();
  EMBCACHE_ASSERT_OK(tc.begin_pass({a2, b2}));
  ASSERT_TRUE(store_a->wait_for_blocked_push());
  std::int64_t absent = 10;
  bool in_b = true;
  EMBCACHE_ASSERT_OK(store_b->contains(&absent, 1, &in_b));
  ASSERT_FALSE(in_b);  // key 10's trained row is still on its way to "b"
  store_b->close_gate();
  EMBCACHE_ASSERT_OK(tc.prefetch({a2, b3}));  // "a": nothing to stage; "b": key 10
  // A pull of "b" before "b"'s write-behind is the hazard; the worker must wait for the flusher.
  const bool staged_too_early = store_b->wait_for_blocked_pull(std::chrono::milliseconds(500));
  EXPECT_FALSE(staged_too_early) << "staging pulled key 10 while its write-back was pending";
  store_a->open_push_gate();
  ASSERT_TRUE(store_b->wait_for_blocked_pull());  // the staging pull, now after the push
  store_b->open_gate();
  EMBCACHE_ASSERT_OK(tc.begin_pass({a2, b3}));
  EXPECT_EQ(tc.counters().last[1].rows_staged, 1u);
  std::vector<float> row(dim);
  EMBCACHE_ASSERT_OK(tc.read(1, &ten, 1, row.data(), nullptr));
  EXPECT_EQ(row, trained);
}

// A key staged early, then trained and written back by later passes, comes in with its
// written-back row, not the older staged one.
TYPED_TEST_P(conformance, a_key_staged_again_after_its_write_back_comes_back_with_it) {
  using Space = TypeParam;
  auto o = table_of("t", dim, 128);
  o.max_resident = o.capacity;  // every leaving row is evicted at its boundary
  training_cache<std::int64_t, Space> tc({}, {o});
  std::vector<std::int64_t> k1 = {1, 2, 3}, k2 = {10, 11, 12}, k3 = {20, 21}, k4 = {10, 30};
  EMBCACHE_ASSERT_OK(tc.begin_pass({k1}));
  // Stage pass 4 far ahead: keys 10 and 30 are not resident, so both are staged (initialized).
  EMBCACHE_ASSERT_OK(tc.prefetch({k4}));
  // Fill the cache so that key 10 is evicted (written back) before pass 4.
  EMBCACHE_ASSERT_OK(tc.begin_pass({k2}));
  std::vector<float> trained(dim, 9.0f);
  std::int64_t ten = 10;
  EMBCACHE_ASSERT_OK(tc.assign(0, &ten, 1, trained.data()));
  std::vector<std::int64_t> fill;
  for (int i = 100; i < 228; ++i) fill.push_back(i);
  EMBCACHE_ASSERT_OK(tc.begin_pass({fill}));  // evicts everything else: key 10 written back
  std::vector<float> row(dim);
  bool found = false;
  EMBCACHE_ASSERT_OK(tc.store(0).pull(&ten, 1, row.data(), &found, nullptr));
  ASSERT_TRUE(found);
  ASSERT_EQ(row, trained);
  // This pass does not use the staging (it was consumed by the pass above): re-prefetch the
  // same keyset now, then write key 10 again at the next boundary.
  EMBCACHE_ASSERT_OK(tc.prefetch({k4}));
  EMBCACHE_ASSERT_OK(tc.begin_pass({k2}));  // key 10 resident again, from the store
  std::vector<float> trained2(dim, 11.0f);
  EMBCACHE_ASSERT_OK(tc.assign(0, &ten, 1, trained2.data()));
  EMBCACHE_ASSERT_OK(tc.begin_pass({fill}));  // key 10 written back again
  EMBCACHE_ASSERT_OK(tc.begin_pass({k4}));    // no staging left: pulls
  EMBCACHE_ASSERT_OK(tc.read(0, &ten, 1, row.data(), nullptr));
  EXPECT_EQ(row, trained2);
}

// The same hazard with the staging still held: a write-back of a staged key after staging began
// makes begin_pass re-pull it.
TYPED_TEST_P(conformance, write_back_after_staging_forces_a_re_pull) {
  using Space = TypeParam;
  auto o = table_of("t", dim, 128);
  o.max_resident = o.capacity;  // every leaving row is evicted at its boundary
  training_cache<std::int64_t, Space> tc({}, {o});
  std::vector<std::int64_t> k1 = {10, 11, 12};
  EMBCACHE_ASSERT_OK(tc.begin_pass({k1}));
  std::vector<std::int64_t> next = {10, 40, 41};
  std::vector<float> old_row(dim);
  std::int64_t ten = 10;
  // Make key 10 non-resident, with a store row, then stage it.
  std::vector<float> v1(dim, 1.0f);
  EMBCACHE_ASSERT_OK(tc.assign(0, &ten, 1, v1.data()));
  std::vector<std::int64_t> fill;
  for (int i = 100; i < 228; ++i) fill.push_back(i);
  EMBCACHE_ASSERT_OK(tc.begin_pass({fill}));
  EMBCACHE_ASSERT_OK(tc.prefetch({next}));  // stages key 10 with row v1
  // Before begin_pass(next), key 10 is written to the store again (erase + tombstone here).
  EMBCACHE_ASSERT_OK(tc.erase(0, &ten, 1));
  EMBCACHE_ASSERT_OK(tc.begin_pass({next}));
  const auto& c = tc.counters().last[0];
  EXPECT_EQ(c.rows_restaged, 1u);
  EXPECT_EQ(c.rows_staged, 2u);
  std::vector<float> row(dim);
  EMBCACHE_ASSERT_OK(tc.read(0, &ten, 1, row.data(), nullptr));
  EXPECT_NE(row, v1);  // erased: re-initialized, the staged copy was not used
}

// begin_pass reuses the hits that prefetch computed only while nothing entered or left: a resident
// key erased after prefetch must be brought back by begin_pass.
TYPED_TEST_P(conformance, a_key_erased_after_prefetch_is_resident_after_begin_pass) {
  using Space = TypeParam;
  auto o = table_of("t", dim, 16);
  training_cache<std::int64_t, Space> tc({}, {o});
  const std::vector<std::int64_t> k1 = {1, 2, 3}, k2 = {1, 2, 3, 4};
  EMBCACHE_ASSERT_OK(tc.begin_pass({k1}));
  EMBCACHE_ASSERT_OK(tc.prefetch({k2}));  // hits 1, 2, 3; stages 4
  const std::int64_t two = 2;
  EMBCACHE_ASSERT_OK(tc.erase(0, &two, 1));
  EMBCACHE_ASSERT_OK(tc.begin_pass({k2}));
  const auto& c = tc.counters().last[0];
  EXPECT_EQ(c.hits, 2u);
  EXPECT_EQ(c.misses, 2u);
  EXPECT_EQ(c.rows_staged, 1u);
  EXPECT_EQ(c.rows_initialized, 2u);
  std::vector<std::int64_t> slots;
  EMBCACHE_ASSERT_OK((cache_access<std::int64_t, Space>(tc, 0).lookup_slots(k2, &slots)));
  for (std::size_t i = 0; i < k2.size(); ++i) EXPECT_GE(slots[i], 0) << "key " << k2[i];
  EXPECT_EQ(tc.cache(0).size(), 4u);
}

// --- write-behind --------------------------------------------------------------------------------

// One Adam table of capacity 64 on a gated store, holding pass {0..39} with rows set to known
// values (all dirty, all of one version). The next keyset {40..79} makes 16 of them leave: keys
// 0..15 (oldest version first, then smallest key).
template <class Space>
struct wb_fixture {
  std::shared_ptr<gated_store<std::int64_t>> store =
      std::make_shared<gated_store<std::int64_t>>(dim * 3);
  std::unique_ptr<training_cache<std::int64_t, Space>> tc;
  std::vector<std::int64_t> a, b;
  std::vector<float> rows;  // the rows given to a
  explicit wb_fixture(training_cache_options opts = {}) {
    auto o = table_of("t", dim, 64, optimizer_kind::adam);
    o.max_resident = o.capacity;  // every leaving row is evicted at its boundary
    o.store = store;
    tc = std::make_unique<training_cache<std::int64_t, Space>>(opts, std::vector{o});
    for (int i = 0; i < 40; ++i) a.push_back(i);
    for (int i = 40; i < 80; ++i) b.push_back(i);
    rows.resize(a.size() * dim * 3);
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = 0.5f + float(i);
    EMBCACHE_EXPECT_OK(tc->begin_pass({a}));
    EMBCACHE_EXPECT_OK(tc->assign(0, a.data(), a.size(), rows.data()));
  }
  // The store holds the first 16 rows given to a (the ones evicted at the boundary to b), each
  // with the values assigned before it left.
  void expect_store_holds_the_evicted_rows() const {
    const auto m = store_model(*tc, 0);
    for (int i = 0; i < 16; ++i) {
      const std::vector<float> want(rows.begin() + i * dim * 3, rows.begin() + (i + 1) * dim * 3);
      ASSERT_EQ(m.count(i), 1u);
      EXPECT_EQ(m.at(i), want) << "key " << i;
    }
  }
  // Opens the push gate from another thread after a while, so that a call of the caller's thread
  // that wrongly touches the store before the pending push shows up in
  // calls_during_blocked_push(); a call that rightly waits for the push returns once it is open.
  std::thread open_later() {
    return std::thread([s = store] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      s->open_push_gate();
    });
  }
  // begin_pass(b) with the push gate closed: returns with the write-back of a held at the gate.
  void leave_with_push_held() {
    store->close_push_gate();
    EMBCACHE_ASSERT_OK(tc->begin_pass({b}));
    ASSERT_TRUE(store->wait_for_blocked_push());
    EXPECT_NE(store->last_push_thread(), std::this_thread::get_id());
    EXPECT_EQ(tc->counters().last[0].rows_evicted, 16u);  // 40 + 40 - 64
    EXPECT_EQ(tc->counters().last[0].rows_pushed, 16u);
  }
};

TYPED_TEST_P(conformance, begin_pass_returns_while_the_write_back_is_pushed_behind) {
  using Space = TypeParam;
  wb_fixture<Space> f;
  f.leave_with_push_held();
  // The caller trains the next pass while the push is held in the store.
  train_pass(*f.tc, {f.b}, 1);
  EXPECT_TRUE(f.store->push_held());
  EXPECT_EQ(f.store->calls_during_blocked_push(), 0u);
  auto opener = f.open_later();
  EMBCACHE_ASSERT_OK(f.tc->end_training());  // waits for the push
  opener.join();
  EXPECT_EQ(f.store->calls_during_blocked_push(), 0u);
  f.expect_store_holds_the_evicted_rows();
}

// A row written behind and needed again by the very next keyset, without and with prefetch.
TYPED_TEST_P(conformance, a_row_written_behind_comes_back_with_its_latest_value) {
  using Space = TypeParam;
  for (bool prefetch : {false, true}) {
    SCOPED_TRACE(prefetch ? "prefetch" : "no prefetch");
    wb_fixture<Space> f;
    f.leave_with_push_held();
    if (prefetch) {
      EMBCACHE_ASSERT_OK(f.tc->prefetch({f.a}));  // staging must wait for the held push ...
      EXPECT_TRUE(f.store->push_held());          // ... but not the caller
    }
    auto opener = f.open_later();
    EMBCACHE_ASSERT_OK(f.tc->begin_pass({f.a}));
    opener.join();
    EXPECT_EQ(f.store->calls_during_blocked_push(), 0u);
    const auto& c = f.tc->counters().last[0];
    EXPECT_EQ(c.misses, 16u);
    EXPECT_EQ(c.rows_staged, prefetch ? 16u : 0u);
    EXPECT_EQ(c.rows_restaged, 0u);  // the write-behind was in before staging read the store
    EXPECT_EQ(c.rows_pulled, prefetch ? 0u : 16u);
    EXPECT_EQ(c.rows_initialized, 0u);
    std::vector<float> got(f.rows.size());
    EMBCACHE_ASSERT_OK(f.tc->read(0, f.a.data(), f.a.size(), got.data(), nullptr));
    EXPECT_EQ(got, f.rows);
  }
}

// read() of a row on its way to the store, export and erase while the push is held.
TYPED_TEST_P(conformance, reads_exports_and_erases_wait_for_a_pending_write_behind) {
  using Space = TypeParam;
  {
    wb_fixture<Space> f;
    f.leave_with_push_held();
    auto opener = f.open_later();
    std::vector<float> got(dim * 3);
    bool found = false;
    const std::int64_t k = 3;
    EMBCACHE_ASSERT_OK(f.tc->read(0, &k, 1, got.data(), &found));
    opener.join();
    EXPECT_EQ(f.store->calls_during_blocked_push(), 0u);
    EXPECT_TRUE(found);
    EXPECT_EQ(got, std::vector<float>(f.rows.begin() + 3 * dim * 3, f.rows.begin() + 4 * dim * 3));
  }
  {
    wb_fixture<Space> f;
    f.leave_with_push_held();
    auto opener = f.open_later();
    auto d = f.tc->export_incremental(true);
    opener.join();
    EMBCACHE_ASSERT_OK(d);
    EXPECT_EQ(f.store->calls_during_blocked_push(), 0u);
    // The 40 assigned rows and the 40 new rows of b changed; 0..15 come from the store.
    ASSERT_EQ(d.value()[0].keys.size(), 80u);
    EXPECT_EQ(d.value()[0].keys[0], 0);
    EXPECT_EQ(std::vector<float>(d.value()[0].vectors.begin(), d.value()[0].vectors.begin() + dim),
              std::vector<float>(f.rows.begin(), f.rows.begin() + dim));
  }
  {
    wb_fixture<Space> f;
    f.leave_with_push_held();
    auto opener = f.open_later();
    const std::int64_t k = 5;  // left at the boundary, its push is held
    EMBCACHE_ASSERT_OK(f.tc->erase(0, &k, 1));
    opener.join();
    EXPECT_EQ(f.store->calls_during_blocked_push(), 0u);
    EMBCACHE_ASSERT_OK(f.tc->end_training());
    bool found = true;
    std::vector<float> got(dim * 3);
    EMBCACHE_ASSERT_OK(f.tc->read(0, &k, 1, got.data(), &found));
    EXPECT_FALSE(found);  // the held push did not bring it back
    EXPECT_EQ(store_model(*f.tc, 0).count(5), 0u);
  }
}

// load() while a write-behind is held: the old rows must not land on the loaded model.
TYPED_TEST_P(conformance, load_while_a_write_behind_is_pending_keeps_the_loaded_model) {
  using Space = TypeParam;
  temp_dir dir;
  wb_fixture<Space> f;
  EMBCACHE_ASSERT_OK(f.tc->save(dir.path() + "/ckpt"));
  const auto saved = store_model(*f.tc, 0);
  std::vector<float> other(f.rows.size(), -3.0f);
  EMBCACHE_ASSERT_OK(f.tc->assign(0, f.a.data(), f.a.size(), other.data()));
  f.leave_with_push_held();
  auto opener = f.open_later();
  EMBCACHE_ASSERT_OK(f.tc->load(dir.path() + "/ckpt"));
  opener.join();
  EXPECT_TRUE(store_model(*f.tc, 0) == saved);
}

// A failed background push loses nothing: the rows stay pending, the next call reports the error,
// and a later call pushes them.
TYPED_TEST_P(conformance, a_failed_write_behind_is_reported_and_retried) {
  using Space = TypeParam;
  wb_fixture<Space> f;
  f.store->fail_pushes(2);  // the background push and the first retry
  EMBCACHE_ASSERT_OK(f.tc->begin_pass({f.b}));
  const status s = f.tc->end_training();
  EXPECT_EQ(s.code(), status_code::io_error);
  EXPECT_NE(s.to_string().find("write-behind of table 't'"), std::string::npos) << s.to_string();
  EMBCACHE_ASSERT_OK(f.tc->end_training());
  f.expect_store_holds_the_evicted_rows();
}

// A store push that throws in the flusher's thread ends neither the process nor a row: the next
// call reports it as a status naming the table, and the call after pushes the pending rows.
TYPED_TEST_P(conformance, an_exception_in_the_background_push_is_a_status_of_the_next_call) {
  using Space = TypeParam;
  wb_fixture<Space> f;
  f.store->throw_on_pushes(1);  // the background push
  EMBCACHE_ASSERT_OK(f.tc->begin_pass({f.b}));
  (void)f.tc->store(0);  // returns no status: leaves the report to the next call
  const status s = f.tc->end_training();
  EXPECT_EQ(s.code(), status_code::internal);
  EXPECT_EQ(s.message(), "write-behind of table 't' (background push): injected push exception")
      << s.to_string();
  EMBCACHE_ASSERT_OK(f.tc->end_training());
  f.expect_store_holds_the_evicted_rows();
}

// A store push that throws in the caller's thread is a status of the call, named after it.
TYPED_TEST_P(conformance, an_exception_of_the_store_is_a_status_of_the_public_call) {
  using Space = TypeParam;
  wb_fixture<Space> f;
  f.store->throw_on_pushes(1);
  const status s = f.tc->end_training();  // the write-back of the 40 dirty rows
  EXPECT_EQ(s.code(), status_code::internal);
  EXPECT_EQ(s.message(), "training_cache::end_training: injected push exception") << s.to_string();
  EMBCACHE_ASSERT_OK(f.tc->end_training());
  EXPECT_EQ(store_model(*f.tc, 0).size(), 40u);
}

// Write-behind changes when rows reach the store, never which rows: the scripted passes leave the
// same store with it on and off, with and without prefetch.
TYPED_TEST_P(conformance, write_behind_and_prefetch_leave_the_same_store_as_synchronous_swaps) {
  using Space = TypeParam;
  const auto passes = script<std::int64_t>(400, 120, 8);
  auto run = [&](bool write_behind, bool prefetch) {
    training_cache_options opts;
    opts.write_behind = write_behind;
    training_cache<std::int64_t, Space> tc(opts, two_tables<std::int64_t>(150, 130));
    for (std::size_t p = 0; p < passes.size(); ++p) {
      EMBCACHE_EXPECT_OK(tc.begin_pass(passes[p]));
      if (prefetch && p + 1 < passes.size()) EMBCACHE_EXPECT_OK(tc.prefetch(passes[p + 1]));
      train_pass(tc, passes[p], int(p));
    }
    EMBCACHE_EXPECT_OK(tc.end_training());
    EXPECT_GT(tc.counters().total[0].rows_pushed, 0u);
    return std::make_pair(store_model(tc, 0), store_model(tc, 1));
  };
  const auto sync = run(false, false);
  EXPECT_TRUE(run(true, false) == sync);
  EXPECT_TRUE(run(true, true) == sync);
  EXPECT_TRUE(run(false, true) == sync);
}

// --- early install (prefetch with room) ----------------------------------------------------------

// A host store holding keys [0, n) with known rows, version 1.
inline std::shared_ptr<host_store<std::int64_t>> filled_store(std::int64_t n,
                                                              std::int64_t step = 1) {
  host_store_options ho;
  ho.table_name = "t";
  ho.row_width = dim * 3;
  auto s = std::make_shared<host_store<std::int64_t>>(ho);
  for (std::int64_t k = 0; k < n; k += step) {
    std::vector<float> row(dim * 3);
    for (std::size_t j = 0; j < row.size(); ++j) row[j] = float(k) + float(j) * 0.01f;
    const std::uint64_t v = 1;
    EMBCACHE_EXPECT_OK(s->push(&k, 1, row.data(), &v));
  }
  return s;
}

inline std::vector<std::int64_t> range_keys(std::int64_t from, std::int64_t to) {
  std::vector<std::int64_t> k;
  for (std::int64_t i = from; i < to; ++i) k.push_back(i);
  return k;
}

template <class Space>
std::set<std::int64_t> resident_keys(training_cache<std::int64_t, Space>& tc) {
  const auto all = export_filter::all();
  const auto ex = tc.cache(0).export_to_host(all).value();
  return std::set<std::int64_t>(ex.keys.begin(), ex.keys.end());
}

// --- the staging bound ---------------------------------------------------------------------------

// A prefetch stages at most staging_bytes of rows over all tables: table "a" (Adam, 12 floats a
// row) gets the first 30 of its missing rows, table "b" none; begin_pass pulls the rest. The model
// is the one of unbounded staging and of no prefetch at all.
TYPED_TEST_P(conformance, a_keyset_larger_than_the_staging_trains_like_an_unbounded_one) {
  using Space = TypeParam;
  const auto passes = script<std::int64_t>(400, 120, 8);
  const std::size_t row_a = dim * 3 * sizeof(float);
  auto run = [&](bool prefetch, std::size_t staging_bytes, std::size_t max_staged_a,
                 std::size_t batch = training_cache_options{}.prefetch_batch) {
    training_cache_options opts;
    opts.staging_bytes = staging_bytes;
    opts.prefetch_batch = batch;  // also the chunk in which begin_pass brings rows in
    training_cache<std::int64_t, Space> tc(opts, two_tables<std::int64_t>(150, 130));
    std::uint64_t pulled_after_prefetch = 0;
    for (std::size_t p = 0; p < passes.size(); ++p) {
      EMBCACHE_EXPECT_OK(tc.begin_pass(passes[p]));
      const auto& last = tc.counters().last;
      EXPECT_LE(last[0].rows_staged, max_staged_a) << "pass " << p;
      if (staging_bytes < row_a) {
        EXPECT_EQ(last[0].rows_staged + last[1].rows_staged, 0u) << "pass " << p;
      }
      if (p > 0) pulled_after_prefetch += last[0].rows_pulled + last[1].rows_pulled;
      if (prefetch && p + 1 < passes.size()) EMBCACHE_EXPECT_OK(tc.prefetch(passes[p + 1]));
      train_pass(tc, passes[p], int(p));
    }
    EMBCACHE_EXPECT_OK(tc.end_training());
    return std::make_tuple(store_model(tc, 0), store_model(tc, 1), pulled_after_prefetch);
  };
  const auto unbounded = run(true, training_cache_options{}.staging_bytes, ~std::size_t{0});
  const auto none = run(false, training_cache_options{}.staging_bytes, ~std::size_t{0});
  const auto bounded = run(true, 30 * row_a, 30);
  const auto zero = run(true, 0, 0);
  EXPECT_TRUE(std::get<0>(bounded) == std::get<0>(unbounded));
  EXPECT_TRUE(std::get<1>(bounded) == std::get<1>(unbounded));
  EXPECT_TRUE(std::get<0>(zero) == std::get<0>(unbounded));
  EXPECT_TRUE(std::get<1>(zero) == std::get<1>(unbounded));
  EXPECT_TRUE(std::get<0>(none) == std::get<0>(unbounded));
  EXPECT_TRUE(std::get<1>(none) == std::get<1>(unbounded));
  EXPECT_GT(std::get<2>(bounded), std::get<2>(unbounded));  // begin_pass pulled what was not staged
  // begin_pass brings the missing rows in by chunks of prefetch_batch rows, staged and pulled
  // ones mixed within a chunk: the same model.
  const auto chunked = run(true, 30 * row_a, 30, 7);
  const auto chunked_none = run(false, training_cache_options{}.staging_bytes, ~std::size_t{0}, 7);
  for (const auto& m : {chunked, chunked_none}) {
    EXPECT_TRUE(std::get<0>(m) == std::get<0>(unbounded));
    EXPECT_TRUE(std::get<1>(m) == std::get<1>(unbounded));
  }
  EXPECT_EQ(std::get<2>(chunked), std::get<2>(bounded));
}

// move_staged_rows: the worker writes the staged rows into the caches' spare rows and begin_pass
// moves them in by index; the model is the one of copied rows, with the slack's early install
// and without, and with a staging too small for a keyset (then begin_pass copies, as before).
TYPED_TEST_P(conformance, staged_rows_moved_in_train_like_copied_ones) {
  using Space = TypeParam;
  const auto passes = script<std::int64_t>(400, 120, 8);
  const std::size_t row_a = dim * 3 * sizeof(float);
  auto run = [&](bool moved, bool tight, std::size_t staging_bytes) {
    training_cache_options opts;
    opts.move_staged_rows = moved;
    opts.staging_bytes = staging_bytes;
    auto tables = two_tables<std::int64_t>(150, 130);
    for (auto& o : tables) o.max_resident = tight ? o.capacity : 0;
    training_cache<std::int64_t, Space> tc(opts, tables);
    const std::size_t spare_a = moved ? std::min<std::size_t>(300, staging_bytes / row_a) : 0;
    EXPECT_EQ(tc.cache(0).row_count(), tc.cache(0).slots() + spare_a);
    for (std::size_t p = 0; p < passes.size(); ++p) {
      EMBCACHE_EXPECT_OK(tc.begin_pass(passes[p]));
      if (p + 1 < passes.size()) EMBCACHE_EXPECT_OK(tc.prefetch(passes[p + 1]));
      train_pass(tc, passes[p], int(p));
    }
    EMBCACHE_EXPECT_OK(tc.end_training());
    const auto& total = tc.counters().total;
    return std::make_tuple(store_model(tc, 0), store_model(tc, 1), total[0].rows_moved,
                           total[0].rows_staged, total[0].rows_detached, total[0].rows_pushed);
  };
  {  // Unset, the option moves in the host space and copies in the cuda space; never on demand.
    const auto tables = two_tables<std::int64_t>(150, 130);
    training_cache<std::int64_t, Space> by_default(training_cache_options{}, tables);
    EXPECT_EQ(by_default.cache(0).row_count() > by_default.cache(0).slots(),
              !is_cuda_space_v<Space>);
    training_cache_options od;
    od.mode = cache_mode::on_demand;
    od.move_staged_rows = true;
    training_cache<std::int64_t, Space> on_demand(od, tables);
    EXPECT_EQ(on_demand.cache(0).row_count(), on_demand.cache(0).slots());
  }
  const std::size_t all = training_cache_options{}.staging_bytes;
  for (bool tight : {true, false}) {
    const auto copied = run(false, tight, all);
    const auto moved = run(true, tight, all);
    EXPECT_TRUE(std::get<0>(moved) == std::get<0>(copied)) << tight;
    EXPECT_TRUE(std::get<1>(moved) == std::get<1>(copied)) << tight;
    EXPECT_EQ(std::get<2>(copied), 0u);
    EXPECT_GT(std::get<2>(moved), 0u) << tight;
    EXPECT_EQ(std::get<3>(moved), std::get<3>(copied)) << tight;
    // Every boundary has leavers without room (some with the slack): the dirty ones moved out.
    EXPECT_EQ(std::get<4>(copied), 0u);
    if (tight) EXPECT_GT(std::get<4>(moved), 0u);
    EXPECT_LE(std::get<4>(moved), std::get<5>(moved));
    EXPECT_EQ(std::get<5>(moved), std::get<5>(copied)) << tight;
  }
  // Interrupted: saved after pass 4 (a prefetch pending, leavers written behind), loaded into a
  // new cache with the option, trained on: every row as in the uninterrupted run.
  {
    const auto whole = run(true, true, all);
    temp_dir dir;
    const std::string ckpt = dir.path() + "/ckpt";
    training_cache_options opts;
    opts.move_staged_rows = true;
    auto tables = two_tables<std::int64_t>(150, 130);
    for (auto& o : tables) o.max_resident = o.capacity;
    {
      training_cache<std::int64_t, Space> first(opts, tables);
      for (std::size_t p = 0; p <= 4; ++p) {
        EMBCACHE_ASSERT_OK(first.begin_pass(passes[p]));
        EMBCACHE_ASSERT_OK(first.prefetch(passes[p + 1]));
        train_pass(first, passes[p], int(p));
      }
      EMBCACHE_ASSERT_OK(first.save(ckpt));
    }
    training_cache<std::int64_t, Space> resumed(opts, tables);
    EMBCACHE_ASSERT_OK(resumed.load(ckpt));
    for (std::size_t p = 5; p < passes.size(); ++p) {
      EMBCACHE_ASSERT_OK(resumed.begin_pass(passes[p]));
      if (p + 1 < passes.size()) EMBCACHE_ASSERT_OK(resumed.prefetch(passes[p + 1]));
      train_pass(resumed, passes[p], int(p));
    }
    EMBCACHE_ASSERT_OK(resumed.end_training());
    EXPECT_GT(resumed.counters().total[0].rows_moved, 0u);
    EXPECT_TRUE(store_model(resumed, 0) == std::get<0>(whole));
    EXPECT_TRUE(store_model(resumed, 1) == std::get<1>(whole));
  }
  // Spare rows for 30 rows of table "a" and none of "b": the keysets that do not fit are copied.
  const auto copied = run(false, true, 30 * row_a);
  const auto small = run(true, true, 30 * row_a);
  EXPECT_TRUE(std::get<0>(small) == std::get<0>(copied));
  EXPECT_TRUE(std::get<1>(small) == std::get<1>(copied));
}

// Exactly the rows that fit in staging_bytes are staged (the first missing keys); begin_pass
// pulls the others, and every row comes in with the store's values.
TYPED_TEST_P(conformance, staging_never_exceeds_its_bound) {
  using Space = TypeParam;
  auto o = table_of("t", dim, 256, optimizer_kind::adam);
  o.store = filled_store(300);
  const std::size_t row_bytes = dim * 3 * sizeof(float);
  training_cache_options opts;
  opts.staging_bytes = 50 * row_bytes + row_bytes - 1;  // room for 50 rows, not 51
  training_cache<std::int64_t, Space> tc(opts, {o});
  const auto first = range_keys(0, 20), next = range_keys(100, 300);
  EMBCACHE_ASSERT_OK(tc.begin_pass({first}));
  EMBCACHE_ASSERT_OK(tc.prefetch({next}));
  EMBCACHE_ASSERT_OK(tc.begin_pass({next}));
  const auto& c = tc.counters().last[0];
  EXPECT_EQ(c.rows_staged, 50u);
  EXPECT_EQ(c.rows_pulled, 150u);
  EXPECT_EQ(c.rows_initialized, 0u);
  std::vector<float> got(next.size() * dim * 3);
  EMBCACHE_ASSERT_OK(tc.read(0, next.data(), next.size(), got.data(), nullptr));
  for (std::size_t i = 0; i < next.size(); ++i) {
    for (std::size_t j = 0; j < dim * 3; ++j) {
      ASSERT_EQ(got[i * dim * 3 + j], float(next[i]) + float(j) * 0.01f) << "key " << next[i];
    }
  }
}

// With more missing keys than the staging holds, its room goes to the rows the store has (they
// need its reads); the keys it lacks are initialized by begin_pass, which then pulls nothing.
// Every row comes in as without prefetch.
TYPED_TEST_P(conformance,
             a_short_staging_holds_the_stored_rows_and_leaves_new_keys_to_the_boundary) {
  using Space = TypeParam;
  const std::size_t row_bytes = dim * 3 * sizeof(float);
  const auto first = range_keys(0, 20);
  const auto next = range_keys(250, 370);  // 250..299 stored, 300..369 new
  auto run = [&](bool prefetch) {
    auto o = table_of("t", dim, 256, optimizer_kind::adam);
    o.store = filled_store(300);
    training_cache_options opts;
    opts.staging_bytes = 60 * row_bytes;  // room for 60 of the 120 missing rows
    training_cache<std::int64_t, Space> tc(opts, {o});
    EMBCACHE_EXPECT_OK(tc.begin_pass({first}));
    if (prefetch) EMBCACHE_EXPECT_OK(tc.prefetch({next}));
    EMBCACHE_EXPECT_OK(tc.begin_pass({next}));
    const table_counters c = tc.counters().last[0];
    std::vector<float> got(next.size() * dim * 3);
    EMBCACHE_EXPECT_OK(tc.read(0, next.data(), next.size(), got.data(), nullptr));
    return std::make_pair(c, got);
  };
  const auto [staged, rows] = run(true);
  EXPECT_EQ(staged.rows_staged, 50u);  // every stored row, in the staging or inserted early
  EXPECT_EQ(staged.rows_pulled, 0u);
  EXPECT_EQ(staged.rows_initialized, 70u);
  EXPECT_EQ(staged.misses, 120u);
  const auto [unstaged, expected] = run(false);
  EXPECT_EQ(unstaged.rows_pulled, 120u);
  EXPECT_TRUE(rows == expected);
  for (std::size_t i = 0; i < 50; ++i) {
    for (std::size_t j = 0; j < dim * 3; ++j) {
      ASSERT_EQ(rows[i * dim * 3 + j], float(next[i]) + float(j) * 0.01f) << "key " << next[i];
    }
  }
}

// The caller's lookups on cache(t) run beside the prefetch worker's early inserts with no lock
// between them (both hold the table's lock for reading): the worker publishes each new slot's
// state byte with a release store while the caller's probes read the state bytes, which must be
// atomic loads (a plain vector load there is a data race that preset tsan reports). A key is
// absent until published, then found; its row is read once the worker is done (begin_pass).
TYPED_TEST_P(conformance, lookups_beside_the_workers_early_inserts_find_keys_once_published) {
  using Space = TypeParam;
  auto store = std::make_shared<gated_store<std::int64_t>>(dim * 3);
  auto o = table_of("t", dim, 256, optimizer_kind::adam);
  o.store = store;
  training_cache<std::int64_t, Space> tc({}, {o});
  const auto current = range_keys(0, 50), next = range_keys(0, 100), arriving = range_keys(50, 100);
  std::vector<float> rows(arriving.size() * dim * 3);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = 0.25f + float(i);
  const std::vector<std::uint64_t> ones(arriving.size(), 1);
  EMBCACHE_ASSERT_OK(store->push(arriving.data(), arriving.size(), rows.data(), ones.data()));
  EMBCACHE_ASSERT_OK(tc.begin_pass({current}));
  store->close_gate();
  EMBCACHE_ASSERT_OK(tc.prefetch({next}));
  ASSERT_TRUE(store->wait_for_blocked_pull());
  cache_access<std::int64_t, Space> cache(tc, 0);
  std::vector<std::int64_t> slots;
  EMBCACHE_ASSERT_OK(cache.lookup_slots(arriving, &slots));
  for (std::size_t i = 0; i < slots.size(); ++i) EXPECT_EQ(slots[i], -1) << "key " << arriving[i];
  store->open_gate();
  // Probes while the worker inserts, until every arriving key is in (a minute against a hang).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  bool all_in = false;
  while (!all_in && std::chrono::steady_clock::now() < give_up) {
    EMBCACHE_ASSERT_OK(cache.lookup_slots(arriving, &slots));
    all_in = std::all_of(slots.begin(), slots.end(), [](std::int64_t s) { return s >= 0; });
    if (!all_in) std::this_thread::yield();
  }
  ASSERT_TRUE(all_in);
  EMBCACHE_ASSERT_OK(tc.begin_pass({next}));
  const auto& c = tc.counters().last[0];
  EXPECT_EQ(c.rows_staged, 50u);  // all inserted early by the worker
  EXPECT_EQ(c.rows_pulled, 0u);
  std::vector<std::int64_t> after;
  EMBCACHE_ASSERT_OK(cache.lookup_slots(arriving, &after));
  EXPECT_EQ(after, slots);
  std::vector<float> got(rows.size());
  EMBCACHE_ASSERT_OK(tc.read(0, arriving.data(), arriving.size(), got.data(), nullptr));
  EXPECT_EQ(got, rows);
}

// With room in the cache, the prefetch worker evicts rows outside both the current and the next
// keyset (oldest version first, then smallest key) as far as the next keyset needs, and inserts
// the staged rows: exactly the next keyset's missing rows, nothing else.
TYPED_TEST_P(conformance, prefetch_inserts_exactly_the_next_keysets_missing_rows_early) {
  using Space = TypeParam;
  auto o = table_of("t", dim, 110, optimizer_kind::adam);
  o.max_resident = o.capacity;  // every leaving row is evicted at its boundary
  o.store = filled_store(200);
  training_cache<std::int64_t, Space> tc({}, {o});
  const auto a = range_keys(0, 60), b = range_keys(40, 100), c = range_keys(80, 140);
  EMBCACHE_ASSERT_OK(tc.begin_pass({a}));
  train_pass(tc, {a}, 0);
  EMBCACHE_ASSERT_OK(tc.begin_pass({b}));
  train_pass(tc, {b}, 1);
  const auto first = range_keys(0, 100);
  ASSERT_EQ(resident_keys(tc), std::set<std::int64_t>(first.begin(), first.end()));
  // Frozen rows: 0..39 (in neither b nor c); 100 + 40 - 110 = 30 of them must go: the 26 that pass
  // 0 left as pulled (version 1), then 4 trained ones.
  const auto all = export_filter::all();
  const auto before = tc.cache(0).export_to_host(all).value();
  std::vector<std::pair<std::uint64_t, std::int64_t>> frozen;
  for (std::size_t i = 0; i < before.keys.size(); ++i) {
    if (before.keys[i] < 40) frozen.push_back({before.versions[i], before.keys[i]});
  }
  std::sort(frozen.begin(), frozen.end());
  std::set<std::int64_t> evicted;
  std::size_t dirty = 0;
  for (std::size_t i = 0; i < 30; ++i) {
    evicted.insert(frozen[i].second);
    dirty += frozen[i].first > 1;  // version 1: as pulled, clean
  }
  ASSERT_EQ(dirty, 4u);
  std::vector<float> frozen_rows(30 * dim * 3);
  {
    std::vector<std::int64_t> ek(evicted.begin(), evicted.end());
    EMBCACHE_ASSERT_OK(tc.read(0, ek.data(), ek.size(), frozen_rows.data(), nullptr));
  }
  EMBCACHE_ASSERT_OK(tc.prefetch({c}));
  (void)tc.store(0);  // joins the worker
  std::set<std::int64_t> want;
  for (std::int64_t k = 0; k < 140; ++k) {
    if (!evicted.count(k)) want.insert(k);
  }
  EXPECT_EQ(resident_keys(tc), want);
  // The evicted rows reached the store with their trained values.
  {
    std::vector<std::int64_t> ek(evicted.begin(), evicted.end());
    std::vector<float> got(ek.size() * dim * 3);
    std::unique_ptr<bool[]> found(new bool[ek.size()]);
    EMBCACHE_ASSERT_OK(tc.store(0).pull(ek.data(), ek.size(), got.data(), found.get(), nullptr));
    EXPECT_EQ(got, frozen_rows);
  }
  EMBCACHE_ASSERT_OK(tc.begin_pass({c}));
  const auto& k = tc.counters().last[0];
  EXPECT_EQ(k.hits, 20u);
  EXPECT_EQ(k.misses, 40u);
  EXPECT_EQ(k.rows_staged, 40u);
  EXPECT_EQ(k.rows_pulled, 0u);
  EXPECT_EQ(k.rows_initialized, 0u);
  EXPECT_EQ(k.rows_evicted, 30u);
  EXPECT_EQ(k.rows_pushed, dirty);
  EXPECT_EQ(resident_keys(tc), want);  // the boundary had nothing left to move
  // The early rows are the store's rows, byte for byte.
  std::vector<float> got(40 * dim * 3), ref(40 * dim * 3);
  const auto fresh = range_keys(100, 140);
  EMBCACHE_ASSERT_OK(tc.read(0, fresh.data(), fresh.size(), got.data(), nullptr));
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    for (std::size_t j = 0; j < dim * 3; ++j) {
      ref[i * dim * 3 + j] = float(fresh[i]) + float(j) * 0.01f;
    }
  }
  EXPECT_EQ(got, ref);
}

// The table's slack holds the next pass's new rows: with max_resident above the keyset, the
// prefetch worker installs them during the pass, the boundary moves no row, and the rows that left
// stay resident (readable, dirty) until a later worker writes them back in the background.
TYPED_TEST_P(conformance, leaving_rows_wait_in_the_slack_and_leave_in_the_background) {
  using Space = TypeParam;
  auto o = table_of("t", dim, 100, optimizer_kind::adam);
  o.slots = 128;
  o.max_resident = 115;
  o.store = filled_store(200);
  training_cache<std::int64_t, Space> tc({}, {o});
  const auto a = range_keys(0, 100), b = range_keys(10, 110), c = range_keys(20, 120);
  auto train_all = [&](const std::vector<std::int64_t>& keys) {  // every row updated: dirty
    std::vector<float> rows(keys.size() * dim * 3);
    EMBCACHE_ASSERT_OK(tc.read(0, keys.data(), keys.size(), rows.data(), nullptr));
    for (auto& x : rows) x += 1.0f;
    EMBCACHE_ASSERT_OK(tc.assign(0, keys.data(), keys.size(), rows.data()));
  };
  EMBCACHE_ASSERT_OK(tc.begin_pass({a}));
  EMBCACHE_ASSERT_OK(tc.prefetch({b}));
  train_all(a);
  const auto left = range_keys(0, 10);
  std::vector<float> trained(left.size() * dim * 3);
  EMBCACHE_ASSERT_OK(tc.read(0, left.data(), left.size(), trained.data(), nullptr));
  EMBCACHE_ASSERT_OK(tc.begin_pass({b}));
  {
    const auto& k = tc.counters().last[0];
    EXPECT_EQ(k.misses, 10u);
    EXPECT_EQ(k.rows_staged, 10u);  // all installed by the worker
    EXPECT_EQ(k.rows_evicted, 0u);
    EXPECT_EQ(k.rows_pushed, 0u);
    EXPECT_EQ(k.seconds_write_back, 0.0);  // the boundary gathered nothing
  }
  const auto first = range_keys(0, 110);
  EXPECT_EQ(resident_keys(tc), std::set<std::int64_t>(first.begin(), first.end()));
  // The rows that left are still the newest copies: on the device, not in the store yet.
  std::vector<float> got(trained.size());
  EMBCACHE_ASSERT_OK(tc.read(0, left.data(), left.size(), got.data(), nullptr));
  EXPECT_EQ(got, trained);
  std::vector<float> stored(trained.size());
  std::unique_ptr<bool[]> found(new bool[left.size()]);
  EMBCACHE_ASSERT_OK(
      tc.store(0).pull(left.data(), left.size(), stored.data(), found.get(), nullptr));
  EXPECT_NE(stored, trained);
  // The next worker evicts them (oldest version first, then smallest key: 0..4) as far as pass
  // c's new rows need room, 110 + 10 - 115 = 5, and pushes them to the store first.
  EMBCACHE_ASSERT_OK(tc.prefetch({c}));
  train_all(b);
  EMBCACHE_ASSERT_OK(tc.begin_pass({c}));
  {
    const auto& k = tc.counters().last[0];
    EXPECT_EQ(k.rows_evicted, 5u);
    EXPECT_EQ(k.rows_pushed, 5u);
    EXPECT_EQ(k.misses, 10u);
  }
  EXPECT_EQ(tc.cache(0).size(), 115u);
  const auto now = range_keys(5, 120);
  EXPECT_EQ(resident_keys(tc), std::set<std::int64_t>(now.begin(), now.end()));
  EMBCACHE_ASSERT_OK(tc.store(0).pull(left.data(), 5, stored.data(), found.get(), nullptr));
  EXPECT_TRUE(std::equal(stored.begin(), stored.begin() + 5 * dim * 3, trained.begin()));
  EMBCACHE_ASSERT_OK(tc.end_training());
  EMBCACHE_ASSERT_OK(
      tc.store(0).pull(left.data(), left.size(), stored.data(), found.get(), nullptr));
  EXPECT_EQ(stored, trained);  // rows 0..9 were not trained after pass a
}

TYPED_TEST_P(conformance, max_resident_outside_capacity_and_slots_is_refused) {
  using Space = TypeParam;
  auto o = table_of("t", dim, 100);
  o.slots = 128;
  for (std::size_t bad : {std::size_t{99}, std::size_t{129}}) {
    o.max_resident = bad;
    try {
      training_cache<std::int64_t, Space> tc({}, {o});
      ADD_FAILURE() << "max_resident " << bad << " accepted";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), status_code::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("max_resident"), std::string::npos) << e.what();
    }
  }
}

// Rotating keysets over a store that holds every other key: early eviction and early insertion
// (and initialized rows left to the boundary) change where rows are, never the model or the
// exports. Cache sizes: keyset-sized without slack (nothing early), keyset-sized with the table's
// slack, and larger.
TYPED_TEST_P(conformance, early_install_keeps_the_model_and_the_exports) {
  using Space = TypeParam;
  auto run = [](std::size_t cap, bool prefetch, bool write_behind, bool tight = false) {
    auto o = table_of("t", dim, cap, optimizer_kind::adam);
    o.max_resident = tight ? cap : 0;
    o.store = filled_store(600, 2);
    training_cache_options opts;
    opts.write_behind = write_behind;
    training_cache<std::int64_t, Space> tc(opts, {o});
    std::map<std::int64_t, std::vector<float>> exported = store_model(tc, 0);
    auto keyset = [](int p) { return range_keys(p * 37, p * 37 + 100); };
    const int passes = 12;
    for (int p = 0; p < passes; ++p) {
      EMBCACHE_EXPECT_OK(tc.begin_pass({keyset(p)}));
      if (prefetch && p + 1 < passes) EMBCACHE_EXPECT_OK(tc.prefetch({keyset(p + 1)}));
      train_pass(tc, {keyset(p)}, p);
      if (p % 3 == 1) {
        auto d = tc.export_incremental(true);
        EMBCACHE_EXPECT_OK(d);
        const auto& t = d.value()[0];
        for (std::size_t i = 0; i < t.keys.size(); ++i) {
          auto& row = exported[t.keys[i]];
          row.assign(t.vectors.begin() + i * dim, t.vectors.begin() + (i + 1) * dim);
          row.insert(row.end(), t.states.begin() + i * 2 * dim,
                     t.states.begin() + (i + 1) * 2 * dim);
        }
      }
    }
    auto d = tc.export_incremental(true);
    EMBCACHE_EXPECT_OK(d);
    const auto& t = d.value()[0];
    for (std::size_t i = 0; i < t.keys.size(); ++i) {
      auto& row = exported[t.keys[i]];
      row.assign(t.vectors.begin() + i * dim, t.vectors.begin() + (i + 1) * dim);
      row.insert(row.end(), t.states.begin() + i * 2 * dim, t.states.begin() + (i + 1) * 2 * dim);
    }
    EMBCACHE_EXPECT_OK(tc.end_training());
    const auto m = store_model(tc, 0);
    EXPECT_TRUE(exported == m) << "cap " << cap << " prefetch " << prefetch;
    return std::make_pair(m, tc.counters().total[0]);
  };
  const auto [sync, cs] = run(100, false, false, true);
  for (std::size_t cap : {0, 100, 140, 180}) {  // 0: 100 without slack
    const bool tight = cap == 0;
    if (tight) cap = 100;
    for (bool wb : {false, true}) {
      SCOPED_TRACE("cap " + std::to_string(cap) + (tight ? " tight" : "") +
                   (wb ? " write-behind" : ""));
      const auto [pref, cp] = run(cap, true, wb, tight);
      EXPECT_TRUE(pref == sync);
      EXPECT_EQ(cp.rows_initialized, cs.rows_initialized);
      EXPECT_EQ(cp.hits + cp.misses, cs.hits + cs.misses);
      if (!tight) {
        EXPECT_GT(cp.rows_staged, 0u);
        EXPECT_GT(cp.rows_evicted, 0u);
      }
    }
  }
}

// A prefetch replaced by another, or followed by a begin_pass of other keysets, leaves the same
// model as no prefetch at all (the worker's early install and marks of the unused one included).
TYPED_TEST_P(conformance, replaced_and_unused_prefetches_keep_the_model) {
  using Space = TypeParam;
  auto run = [](bool prefetch) {
    auto o = table_of("t", dim, 160, optimizer_kind::adam);
    o.store = filled_store(700, 3);
    training_cache<std::int64_t, Space> tc({}, {o});
    auto keyset = [](int p) { return range_keys(p * 41, p * 41 + 100); };
    for (int p = 0; p < 12; ++p) {
      EMBCACHE_EXPECT_OK(tc.begin_pass({keyset(p)}));
      if (prefetch) {
        EMBCACHE_EXPECT_OK(tc.prefetch({keyset(p + 3)}));  // a decoy, replaced below or unused
        if (p % 3 != 2) EMBCACHE_EXPECT_OK(tc.prefetch({keyset(p + 1)}));
      }
      train_pass(tc, {keyset(p)}, p);
    }
    EMBCACHE_EXPECT_OK(tc.end_training());
    return store_model(tc, 0);
  };
  const auto sync = run(false);
  EXPECT_TRUE(run(true) == sync);
}

// --- on-demand -----------------------------------------------------------------------------------

TYPED_TEST_P(conformance, on_demand_small_cache_equals_full_cache) {
  using Space = TypeParam;
  auto run = [](std::size_t cap) {
    training_cache_options opts;
    opts.mode = cache_mode::on_demand;
    auto o = table_of("t", dim, cap, optimizer_kind::adam);
    training_cache<std::int64_t, Space> tc(opts, {o});
    std::mt19937_64 rng(3);
    cache_access<std::int64_t, Space> rows(tc, 0);  // the rows in place, in the space's memory
    for (int b = 0; b < 40; ++b) {
      std::vector<std::int64_t> keys(60);
      for (auto& k : keys) k = std::int64_t(rng() % 1000);
      std::vector<std::int64_t> slots(keys.size());
      EMBCACHE_EXPECT_OK(tc.lookup(0, keys.data(), keys.size(), slots.data()));
      std::vector<std::int64_t> uniq;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        EXPECT_GE(slots[i], 0);
        if (slots[i] < 0) continue;
        // Once per distinct key (a repeat in the batch shares the slot).
        if (std::find(uniq.begin(), uniq.end(), slots[i]) != uniq.end()) continue;
        uniq.push_back(slots[i]);
        std::vector<float> row = rows.row(slots[i]);
        for (auto& x : row) x = x * 0.5f + float(b % 7);
        rows.set_row(slots[i], row);
      }
      rows.mark_updated(uniq);
    }
    EMBCACHE_EXPECT_OK(tc.end_training());
    return std::make_pair(store_model(tc, 0), tc.counters().total[0]);
  };
  const auto [full, cf] = run(2048);
  const auto [small, cs] = run(128);
  EXPECT_EQ(cf.rows_evicted, 0u);
  EXPECT_GT(cs.rows_evicted, 0u);
  EXPECT_GT(cs.rows_pushed, 0u);
  EXPECT_TRUE(full == small);

  training_cache_options opts;
  opts.mode = cache_mode::on_demand;
  auto o = table_of("t", dim, 128);
  training_cache<std::int64_t, Space> tc(opts, {o});
  std::vector<std::int64_t> many(200);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = std::int64_t(i);
  EXPECT_EQ(tc.lookup(0, many.data(), many.size(), nullptr).code(), status_code::capacity_exceeded);
  EXPECT_EQ(tc.cache(0).size(), 0u);
}

// An on-demand table of 2 buckets (capacity 200: 250 slots, rounded up to 256) and 257 keys
// whose home is bucket 0: the first 128 fill it (trained, so dirty, with known rows), the other
// 129 evict all of them and one finds no room.
template <class Space>
struct full_bucket_fixture {
  std::shared_ptr<gated_store<std::int64_t>> store =
      std::make_shared<gated_store<std::int64_t>>(dim);
  std::unique_ptr<training_cache<std::int64_t, Space>> tc;
  std::vector<std::int64_t> first, second;
  std::vector<float> rows;  // the rows given to `first`
  full_bucket_fixture() {
    training_cache_options opts;
    opts.mode = cache_mode::on_demand;
    auto o = table_of("t", dim, 200);
    o.store = store;
    tc = std::make_unique<training_cache<std::int64_t, Space>>(opts, std::vector{o});
    EXPECT_EQ(tc->cache(0).slots(), 256u);
    const auto hashing = tc->cache(0).ref();  // hash() only reads the view's sizes: host code
    for (std::int64_t k = 0; first.size() + second.size() < 257; ++k) {
      if (hashing.hash(k).home != 0) continue;
      (first.size() < 128 ? first : second).push_back(k);
    }
    std::vector<std::int64_t> slots(first.size());
    EMBCACHE_EXPECT_OK(tc->lookup(0, first.data(), first.size(), slots.data()));
    rows.resize(first.size() * dim);
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = 1.5f + float(i);
    EMBCACHE_EXPECT_OK(tc->assign(0, first.data(), first.size(), rows.data()));
  }
  // Every row of `first` is in the store with the value assigned to it.
  void expect_first_in_store() {
    const auto m = store_model(*tc, 0);
    for (std::size_t i = 0; i < first.size(); ++i) {
      ASSERT_EQ(m.count(first[i]), 1u) << "key " << first[i];
      EXPECT_EQ(m.at(first[i]),
                std::vector<float>(rows.begin() + i * dim, rows.begin() + (i + 1) * dim))
          << "key " << first[i];
    }
  }
};

// A batch whose last key finds no room still writes back the dirty rows it evicted, then reports
// capacity_exceeded; the keys that fit are resident.
TYPED_TEST_P(conformance, a_lookup_without_room_writes_its_evicted_rows_back_first) {
  using Space = TypeParam;
  full_bucket_fixture<Space> f;
  std::vector<std::int64_t> slots(f.second.size());
  const status s = f.tc->lookup(0, f.second.data(), f.second.size(), slots.data());
  EXPECT_EQ(s.code(), status_code::capacity_exceeded);
  EXPECT_NE(s.message().find("no room for 1 of 129 distinct keys in table 't' (first: key " +
                             std::to_string(f.second.back()) + ";"),
            std::string::npos)
      << s.to_string();
  for (std::size_t i = 0; i + 1 < slots.size(); ++i) EXPECT_GE(slots[i], 0) << "key " << i;
  EXPECT_EQ(slots.back(), -1);
  const auto& c = f.tc->counters().last[0];
  EXPECT_EQ(c.misses, 129u);
  EXPECT_EQ(c.rows_evicted, 128u);
  EXPECT_EQ(c.rows_pushed, 128u);
  EXPECT_EQ(f.tc->cache(0).size(), 128u);
  f.expect_first_in_store();
}

// A failed write-back of the rows a lookup evicted loses none: they wait as write-behind rows and
// the next call that needs the store pushes them. A store that throws instead is handled alike.
TYPED_TEST_P(conformance, a_failed_write_back_of_evicted_rows_is_retried_by_the_next_call) {
  using Space = TypeParam;
  for (const bool throws : {false, true}) {
    SCOPED_TRACE(throws ? "push throws" : "push fails");
    full_bucket_fixture<Space> f;
    f.second.pop_back();  // every key fits
    if (throws) {
      f.store->throw_on_pushes(1);
    } else {
      f.store->fail_pushes(1);
    }
    const status s = f.tc->lookup(0, f.second.data(), f.second.size(), nullptr);
    EXPECT_EQ(s.code(), throws ? status_code::internal : status_code::io_error);
    EXPECT_EQ(s.message(), std::string("write-back of the rows evicted by lookup in table 't': ") +
                               (throws ? "injected push exception" : "injected push failure"))
        << s.to_string();
    EXPECT_EQ(f.tc->counters().last[0].rows_evicted, 128u);
    EMBCACHE_ASSERT_OK(f.tc->end_training());
    f.expect_first_in_store();
  }
}

// --- crash during save ---------------------------------------------------------------------------

template <class Space>
std::unique_ptr<training_cache<std::int64_t, Space>> make_crash_model() {
  auto o = table_of("emb", 16, 20000, optimizer_kind::adam);
  auto tc = std::make_unique<training_cache<std::int64_t, Space>>(training_cache_options{},
                                                                  std::vector{o});
  std::vector<std::int64_t> keys(20000);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = std::int64_t(i) * 11;
  tc->begin_pass({keys}).throw_if_error();
  return tc;
}

// Run by the child of the test below (the same suite, so the same space): saves in a loop until
// killed.
TYPED_TEST_P(conformance, child_saves_in_a_loop) {
  using Space = TypeParam;
  const char* dir = std::getenv("EMBCACHE_SAVE_LOOP_DIR");
  if (!dir) GTEST_SKIP() << "only run as the child of kill_during_save_keeps_previous_save";
  auto tc = make_crash_model<Space>();
  for (;;) tc->save(dir).throw_if_error();
}

TYPED_TEST_P(conformance, kill_during_save_keeps_previous_save) {
  using Space = TypeParam;
  temp_dir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  {
    auto tc = make_crash_model<Space>();
    EMBCACHE_ASSERT_OK(tc->save(ckpt));
  }
  auto reference = [&] {
    auto tc = make_crash_model<Space>();
    EMBCACHE_EXPECT_OK(tc->end_training());
    return store_model(*tc, 0);
  }();
  const std::string env = "EMBCACHE_SAVE_LOOP_DIR=" + ckpt;
  const std::string filter =
      std::string("--gtest_filter=") +
      ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() +
      ".child_saves_in_a_loop";
  // A child in the cuda space first sets up its device: give it that long too.
  const int startup_ms = is_cuda_space_v<Space> ? 1000 : 0;
  std::mt19937 rng(1);
  for (int round = 0; round < 4; ++round) {
    std::vector<char*> envp;
    for (char** e = environ; *e; ++e) envp.push_back(*e);
    envp.push_back(const_cast<char*>(env.c_str()));
    envp.push_back(nullptr);
    char exe[] = "/proc/self/exe";
    char* argv[] = {exe, const_cast<char*>(filter.c_str()), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(startup_ms + 150 + rng() % 250));
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
    ASSERT_TRUE(WIFSIGNALED(st)) << "the child ended by itself: " << st;
    auto o = table_of("emb", 16, 128, optimizer_kind::adam);
    training_cache<std::int64_t, Space> loaded({}, {o});
    const status s = loaded.load(ckpt);
    EMBCACHE_ASSERT_OK(s) << "round " << round << ": " << s.to_string();
    EXPECT_TRUE(store_model(loaded, 0) == reference);
  }
}

// --- one script in every space -------------------------------------------------------------------
// Keyset passes with prefetch and write-behind, row updates (through read/assign and in place on
// the space's rows), erases and exports; and on-demand batches. The space under test must leave
// the same exports, the same store and the same saved model as the host space (in the host space
// this checks that the script is deterministic), and a small cache the same store as a full one.

template <class Key, class Space>
std::unique_ptr<training_cache<Key, Space>> make_script_cache(cache_mode mode, std::size_t capacity,
                                                              bool tight = false) {
  training_cache_options o;
  o.mode = mode;
  o.prefetch_batch = 64;  // several staging batches, so the early install runs batch by batch
  table_options<Key> a;
  a.name = "a";
  a.dim = 8;
  a.optimizer.kind = optimizer_kind::adam;
  a.capacity = capacity;
  a.init.seed = 3;
  table_options<Key> b;
  b.name = "b";
  b.dim = 5;  // a row width (15) that is not a multiple of a vector width
  b.optimizer.kind = optimizer_kind::adagrad;
  b.capacity = capacity;
  b.init.seed = 3;
  if (tight) a.max_resident = b.max_resident = capacity;  // evict every leaving row at once
  return std::make_unique<training_cache<Key, Space>>(o, std::vector{a, b});
}

// Updates a third of `keys` in place (read, change, assign), as a training step would.
template <class Key, class Space>
void train_step(training_cache<Key, Space>& tc, std::size_t t, const std::vector<Key>& keys,
                int step) {
  std::vector<Key> some;
  for (Key k : keys) {
    if ((static_cast<std::uint64_t>(k) * 2654435761u + std::uint64_t(step)) % 3 == 0) {
      some.push_back(k);
    }
  }
  const std::size_t w = tc.row_width(t);
  std::vector<float> rows(some.size() * w);
  std::unique_ptr<bool[]> found(new bool[some.size() + 1]);
  EMBCACHE_ASSERT_OK(tc.read(t, some.data(), some.size(), rows.data(), found.get()));
  for (std::size_t i = 0; i < some.size(); ++i) {
    ASSERT_TRUE(found[i]) << "key " << some[i];
    for (std::size_t j = 0; j < w; ++j) {
      rows[i * w + j] = rows[i * w + j] * 0.5f + 0.125f * float(step + 1) + float(j) * 1e-3f;
    }
  }
  EMBCACHE_ASSERT_OK(tc.assign(t, some.data(), some.size(), rows.data()));
}

// An update made in the space's memory, as a training kernel would: the rows of `keys` are marked
// updated through the cache's own calls.
template <class Key, class Space>
void mark_in_place(training_cache<Key, Space>& tc, std::size_t t, const std::vector<Key>& keys) {
  cache_access<Key, Space> cache(tc, t);
  std::vector<std::int64_t> slots;
  EMBCACHE_ASSERT_OK(cache.lookup_slots(keys, &slots));
  cache.mark_updated(slots);
}

// What a script leaves: every export, the final stores, and the stores after save + load.
template <class Key>
struct outcome {
  std::vector<std::vector<float>> reads;  // rows read back, resident or not
  std::vector<std::vector<table_delta<Key>>> exports;
  std::vector<model<Key>> stores;
  std::vector<model<Key>> reloaded;
  std::vector<table_counters> totals;
};

template <class Key>
std::vector<std::vector<Key>> script_keysets(std::mt19937_64& rng, std::size_t per_table) {
  std::vector<std::vector<Key>> ks(2);
  for (auto& k : ks) {
    while (k.size() < per_table) k.push_back(static_cast<Key>(rng() % 1500) * 5 + 2);
  }
  return ks;
}

// Keyset passes, each prefetching the next, with updates, an erase and an export per pass; then
// a save, loaded into a host-space cache.
template <class Key, class Space>
outcome<Key> run_keyset_script(std::size_t capacity, const std::string& dir, bool tight = false) {
  auto tc = make_script_cache<Key, Space>(cache_mode::keyset, capacity, tight);
  std::mt19937_64 rng(11);
  std::vector<std::vector<std::vector<Key>>> passes;
  for (int p = 0; p < 7; ++p) passes.push_back(script_keysets<Key>(rng, 300));
  outcome<Key> out;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    EXPECT_TRUE(tc->begin_pass(passes[p]).ok()) << "pass " << p;
    if (p + 1 < passes.size()) EXPECT_TRUE(tc->prefetch(passes[p + 1]).ok());
    for (std::size_t t = 0; t < 2; ++t) train_step(*tc, t, passes[p][t], int(p));
    // While the prefetch runs: an in-place update of table b's keyset, and a read that mixes
    // resident keys with keys of the previous pass (some left the cache, some never existed).
    mark_in_place(*tc, 1, passes[p][1]);
    if (p > 0) {
      std::vector<Key> mixed(passes[p - 1][0].begin(), passes[p - 1][0].begin() + 40);
      mixed.insert(mixed.end(), passes[p][0].begin(), passes[p][0].begin() + 20);
      mixed.push_back(Key{3});  // never in any keyset (keys are 2 mod 5)
      std::vector<float> rows(mixed.size() * tc->row_width(0), -1.0f);
      std::unique_ptr<bool[]> found(new bool[mixed.size()]);
      EXPECT_TRUE(tc->read(0, mixed.data(), mixed.size(), rows.data(), found.get()).ok());
      EXPECT_FALSE(found[mixed.size() - 1]);
      for (std::size_t i = 0; i < mixed.size(); ++i) rows.push_back(found[i] ? 1.0f : 0.0f);
      out.reads.push_back(std::move(rows));
    }
    if (p % 3 == 1) {
      const Key gone[2] = {passes[p][0][0], passes[p][0][1]};
      EXPECT_TRUE(tc->erase(0, gone, 2).ok());
    }
    auto d = tc->export_incremental(true);
    EXPECT_TRUE(d.ok());
    if (d.ok()) out.exports.push_back(std::move(d).value());
  }
  EXPECT_TRUE(tc->save(dir).ok());
  for (std::size_t t = 0; t < 2; ++t) {
    out.stores.push_back(store_model(*tc, t));
    out.totals.push_back(tc->counters().total[t]);
  }
  auto back = make_script_cache<Key, host_space>(cache_mode::keyset, capacity);
  EXPECT_TRUE(back->load(dir).ok());
  for (std::size_t t = 0; t < 2; ++t) out.reloaded.push_back(store_model(*back, t));
  return out;
}

// On-demand batches in a cache that holds half a batch's worth of history: misses are pulled and
// victims written back by score.
template <class Key, class Space>
outcome<Key> run_on_demand_script() {
  auto tc = make_script_cache<Key, Space>(cache_mode::on_demand, 160);
  std::mt19937_64 rng(5);
  outcome<Key> out;
  for (int b = 0; b < 12; ++b) {
    for (std::size_t t = 0; t < 2; ++t) {
      std::vector<Key> batch;
      for (int i = 0; i < 120; ++i) batch.push_back(static_cast<Key>(rng() % 600) * 3 + 1);
      std::vector<std::int64_t> slots(batch.size());
      EXPECT_TRUE(tc->lookup(t, batch.data(), batch.size(), slots.data()).ok());
      for (auto s : slots) EXPECT_GE(s, 0);
      train_step(*tc, t, batch, b);
    }
    if (b % 4 == 3) {
      auto d = tc->export_incremental(false);
      EXPECT_TRUE(d.ok());
      if (d.ok()) out.exports.push_back(std::move(d).value());
    }
  }
  EXPECT_TRUE(tc->end_training().ok());
  for (std::size_t t = 0; t < 2; ++t) {
    out.stores.push_back(store_model(*tc, t));
    out.totals.push_back(tc->counters().total[t]);
  }
  return out;
}

template <class Key>
std::uint64_t rows_evicted(const outcome<Key>& o) {
  std::uint64_t n = 0;
  for (const auto& c : o.totals) n += c.rows_evicted;
  return n;
}

template <class Key>
void expect_same_exports(const outcome<Key>& a, const outcome<Key>& b) {
  ASSERT_EQ(a.exports.size(), b.exports.size());
  for (std::size_t e = 0; e < a.exports.size(); ++e) {
    ASSERT_EQ(a.exports[e].size(), b.exports[e].size());
    for (std::size_t t = 0; t < a.exports[e].size(); ++t) {
      const auto& x = a.exports[e][t];
      const auto& y = b.exports[e][t];
      EXPECT_EQ(x.keys, y.keys) << "export " << e << " table " << t;
      EXPECT_EQ(x.vectors, y.vectors) << "export " << e << " table " << t;
      EXPECT_EQ(x.states, y.states) << "export " << e << " table " << t;
      // Versions are not compared: the prefetch worker's calls take versions too, and how far it
      // got before the caller's next call depends on timing.
      EXPECT_EQ(x.erased, y.erased) << "export " << e << " table " << t;
    }
  }
}

// Without a prefetch worker the moves are deterministic too.
template <class Key>
void expect_same_moves(const outcome<Key>& a, const outcome<Key>& b) {
  ASSERT_EQ(a.totals.size(), b.totals.size());
  for (std::size_t t = 0; t < a.totals.size(); ++t) {
    EXPECT_EQ(a.totals[t].hits, b.totals[t].hits) << "table " << t;
    EXPECT_EQ(a.totals[t].misses, b.totals[t].misses) << "table " << t;
    EXPECT_EQ(a.totals[t].rows_pushed, b.totals[t].rows_pushed) << "table " << t;
    EXPECT_EQ(a.totals[t].rows_evicted, b.totals[t].rows_evicted) << "table " << t;
    EXPECT_EQ(a.totals[t].rows_initialized, b.totals[t].rows_initialized) << "table " << t;
  }
}

// Same script, same model: exports, stores, and a save that loads on the host. (How much the
// prefetch worker did before each boundary depends on timing, so counters are not compared here.)
TYPED_TEST_P(conformance, keyset_passes_match_the_host_space) {
  using Space = TypeParam;
  temp_dir d;
  const auto ref = run_keyset_script<std::int64_t, host_space>(400, d.path() + "/host");
  const auto got = run_keyset_script<std::int64_t, Space>(400, d.path() + "/space");
  expect_same_exports(ref, got);
  EXPECT_EQ(ref.reads, got.reads);
  EXPECT_EQ(ref.stores, got.stores);
  EXPECT_EQ(got.stores, got.reloaded);
  for (const auto& m : got.stores) EXPECT_GT(m.size(), 1000u);
  // Every leaving row evicted at its boundary (max_resident = capacity): the same model.
  const auto tight = run_keyset_script<std::int64_t, Space>(400, d.path() + "/tight", true);
  expect_same_exports(ref, tight);
  EXPECT_EQ(ref.reads, tight.reads);
  EXPECT_EQ(ref.stores, tight.stores);
}

// Swap transparency in the space: a cache that holds one keyset (with room for the next pass's
// new keys) leaves the same store as one that holds every key.
TYPED_TEST_P(conformance, small_cache_leaves_the_same_store_as_a_full_one) {
  using Space = TypeParam;
  temp_dir d;
  const auto small = run_keyset_script<std::uint32_t, Space>(300, d.path() + "/small");
  const auto full = run_keyset_script<std::uint32_t, Space>(8000, d.path() + "/full");
  EXPECT_EQ(small.stores, full.stores);
  EXPECT_GT(rows_evicted(small), 0u);  // the small cache did swap
}

TYPED_TEST_P(conformance, on_demand_batches_match_the_host_space) {
  using Space = TypeParam;
  const auto ref = run_on_demand_script<std::int64_t, host_space>();
  const auto got = run_on_demand_script<std::int64_t, Space>();
  expect_same_exports(ref, got);
  expect_same_moves(ref, got);
  EXPECT_EQ(ref.stores, got.stores);
  EXPECT_GT(rows_evicted(got), 0u);
}

REGISTER_TYPED_TEST_SUITE_P(stores, swap_transparency_small_cache_equals_full_cache,
                            export_base_plus_deltas_equals_model,
                            save_load_round_trip_and_refusals);

REGISTER_TYPED_TEST_SUITE_P(
    conformance, a_failed_delta_write_loses_no_row,
    an_export_takes_a_given_delta_number_past_the_folder_s_last, save_reports_its_progress_by_rows,
    loads_a_plain_hugectr_folder, keyset_errors_are_clear_and_change_nothing,
    begin_pass_moves_only_the_difference, prefetch_stages_in_the_background_while_the_caller_trains,
    a_keyset_larger_than_the_staging_trains_like_an_unbounded_one, staging_never_exceeds_its_bound,
    staged_rows_moved_in_train_like_copied_ones,
    a_short_staging_holds_the_stored_rows_and_leaves_new_keys_to_the_boundary,
    staged_rows_are_never_older_than_a_write_back,
    a_key_staged_again_after_its_write_back_comes_back_with_it,
    write_back_after_staging_forces_a_re_pull,
    a_key_erased_after_prefetch_is_resident_after_begin_pass,
    begin_pass_returns_while_the_write_back_is_pushed_behind,
    a_row_written_behind_comes_back_with_its_latest_value,
    reads_exports_and_erases_wait_for_a_pending_write_behind,
    load_while_a_write_behind_is_pending_keeps_the_loaded_model,
    a_failed_write_behind_is_reported_and_retried,
    an_exception_in_the_background_push_is_a_status_of_the_next_call,
    an_exception_of_the_store_is_a_status_of_the_public_call,
    write_behind_and_prefetch_leave_the_same_store_as_synchronous_swaps,
    prefetch_inserts_exactly_the_next_keysets_missing_rows_early,
    lookups_beside_the_workers_early_inserts_find_keys_once_published,
    leaving_rows_wait_in_the_slack_and_leave_in_the_background,
    max_resident_outside_capacity_and_slots_is_refused,
    early_install_keeps_the_model_and_the_exports, replaced_and_unused_prefetches_keep_the_model,
    on_demand_small_cache_equals_full_cache,
    a_lookup_without_room_writes_its_evicted_rows_back_first,
    a_failed_write_back_of_evicted_rows_is_retried_by_the_next_call, child_saves_in_a_loop,
    kill_during_save_keeps_previous_save, keyset_passes_match_the_host_space,
    small_cache_leaves_the_same_store_as_a_full_one, on_demand_batches_match_the_host_space);

}  // namespace embcache::testing::training_suite
