// The training cache in the cuda space against the host space (the cuda cases skip without a
// device): one script of passes with prefetch and write-behind, row updates, erases and exports
// leaves the same exports, the same store and the same saved model in both spaces, and a small
// device cache leaves the same store as a full one. The host-against-host cases check the script
// itself and run anywhere.
#include "embcache/training_cache.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../training/test_util.hpp"
#include "embcache/buffer.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;

using testing::model;
using testing::store_model;

struct temp_dir {
  std::string path;
  explicit temp_dir(const std::string& name)
      : path((fs::temp_directory_path() /
              ("embcache_tc_cuda_" + name + "_" + std::to_string(::getpid())))
                 .string()) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

template <class Key, class Space>
std::unique_ptr<training_cache<Key, Space>> make_cache(cache_mode mode, std::size_t capacity,
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
void train(training_cache<Key, Space>& tc, std::size_t t, const std::vector<Key>& keys, int step) {
  std::vector<Key> some;
  for (Key k : keys) {
    if ((static_cast<std::uint64_t>(k) * 2654435761u + std::uint64_t(step)) % 3 == 0) {
      some.push_back(k);
    }
  }
  const std::size_t w = tc.row_width(t);
  std::vector<float> rows(some.size() * w);
  std::unique_ptr<bool[]> found(new bool[some.size() + 1]);
  ASSERT_TRUE(tc.read(t, some.data(), some.size(), rows.data(), found.get()).ok());
  for (std::size_t i = 0; i < some.size(); ++i) {
    ASSERT_TRUE(found[i]) << "key " << some[i];
    for (std::size_t j = 0; j < w; ++j) {
      rows[i * w + j] = rows[i * w + j] * 0.5f + 0.125f * float(step + 1) + float(j) * 1e-3f;
    }
  }
  ASSERT_TRUE(tc.assign(t, some.data(), some.size(), rows.data()).ok());
}

// An update made on the device, as a training kernel would: the rows of `keys` are marked
// updated through the cache's own calls (device pointers in the cuda space).
template <class Key, class Space>
void mark_on_device(training_cache<Key, Space>& tc, std::size_t t, const std::vector<Key>& keys) {
  auto& cache = tc.cache(t);
  const std::size_t n = keys.size();
  buffer<Key, Space> k(n, cache.space());
  buffer<std::int64_t, Space> slots(n, cache.space());
  k.copy_from_host(keys.data(), n);
  ASSERT_TRUE(cache.lookup_slots(k.data(), n, slots.data()).ok());
  cache.mark_updated(slots.data(), n);
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
std::vector<std::vector<Key>> keysets(std::mt19937_64& rng, std::size_t per_table) {
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
  auto tc = make_cache<Key, Space>(cache_mode::keyset, capacity, tight);
  std::mt19937_64 rng(11);
  std::vector<std::vector<std::vector<Key>>> passes;
  for (int p = 0; p < 7; ++p) passes.push_back(keysets<Key>(rng, 300));
  outcome<Key> out;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    EXPECT_TRUE(tc->begin_pass(passes[p]).ok()) << "pass " << p;
    if (p + 1 < passes.size()) EXPECT_TRUE(tc->prefetch(passes[p + 1]).ok());
    for (std::size_t t = 0; t < 2; ++t) train(*tc, t, passes[p][t], int(p));
    // While the prefetch runs: a device-side update of table b's keyset, and a read that mixes
    // resident keys with keys of the previous pass (some left the device, some never existed).
    mark_on_device(*tc, 1, passes[p][1]);
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
  auto back = make_cache<Key, host_space>(cache_mode::keyset, capacity);
  EXPECT_TRUE(back->load(dir).ok());
  for (std::size_t t = 0; t < 2; ++t) out.reloaded.push_back(store_model(*back, t));
  return out;
}

// On-demand batches in a cache that holds half a batch's worth of history: misses are pulled and
// victims written back by score.
template <class Key, class Space>
outcome<Key> run_on_demand_script() {
  auto tc = make_cache<Key, Space>(cache_mode::on_demand, 160);
  std::mt19937_64 rng(5);
  outcome<Key> out;
  for (int b = 0; b < 12; ++b) {
    for (std::size_t t = 0; t < 2; ++t) {
      std::vector<Key> batch;
      for (int i = 0; i < 120; ++i) batch.push_back(static_cast<Key>(rng() % 600) * 3 + 1);
      std::vector<std::int64_t> slots(batch.size());
      EXPECT_TRUE(tc->lookup(t, batch.data(), batch.size(), slots.data()).ok());
      for (auto s : slots) EXPECT_GE(s, 0);
      train(*tc, t, batch, b);
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

template <class Space>
void require_space() {
  if constexpr (is_cuda_space_v<Space>) {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  }
}

template <class Space>
class training_cache_spaces : public ::testing::Test {};
using spaces = ::testing::Types<host_space, cuda_space>;
TYPED_TEST_SUITE(training_cache_spaces, spaces);

// Same script, same model: exports, stores, and a save that loads on the host. (How much the
// prefetch worker did before each boundary depends on timing, so counters are not compared here.)
TYPED_TEST(training_cache_spaces, keyset_passes_match_the_host_space) {
  require_space<TypeParam>();
  if (::testing::Test::IsSkipped()) return;
  temp_dir d("keyset");
  const auto ref = run_keyset_script<std::int64_t, host_space>(400, d.path + "/host");
  const auto got = run_keyset_script<std::int64_t, TypeParam>(400, d.path + "/space");
  expect_same_exports(ref, got);
  EXPECT_EQ(ref.reads, got.reads);
  EXPECT_EQ(ref.stores, got.stores);
  EXPECT_EQ(got.stores, got.reloaded);
  for (const auto& m : got.stores) EXPECT_GT(m.size(), 1000u);
  // Every leaving row evicted at its boundary (max_resident = capacity): the same model.
  const auto tight = run_keyset_script<std::int64_t, TypeParam>(400, d.path + "/tight", true);
  expect_same_exports(ref, tight);
  EXPECT_EQ(ref.reads, tight.reads);
  EXPECT_EQ(ref.stores, tight.stores);
}

// Swap transparency in the space: a cache that holds one keyset (with room for the next pass's
// new keys) leaves the same store as one that holds every key.
TYPED_TEST(training_cache_spaces, small_cache_leaves_the_same_store_as_a_full_one) {
  require_space<TypeParam>();
  if (::testing::Test::IsSkipped()) return;
  temp_dir d("transparency");
  const auto small = run_keyset_script<std::uint32_t, TypeParam>(300, d.path + "/small");
  const auto full = run_keyset_script<std::uint32_t, TypeParam>(8000, d.path + "/full");
  EXPECT_EQ(small.stores, full.stores);
  EXPECT_GT(rows_evicted(small), 0u);  // the small cache did swap
}

TYPED_TEST(training_cache_spaces, on_demand_batches_match_the_host_space) {
  require_space<TypeParam>();
  if (::testing::Test::IsSkipped()) return;
  const auto ref = run_on_demand_script<std::int64_t, host_space>();
  const auto got = run_on_demand_script<std::int64_t, TypeParam>();
  expect_same_exports(ref, got);
  expect_same_moves(ref, got);
  EXPECT_EQ(ref.stores, got.stores);
  EXPECT_GT(rows_evicted(got), 0u);
}

TEST(training_cache_cuda, without_a_device_construction_is_refused_clearly) {
  if (cuda_device_available()) GTEST_SKIP() << "a CUDA device is present";
  try {
    make_cache<std::int64_t, cuda_space>(cache_mode::keyset, 10);
    FAIL() << "constructed without a device";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), status_code::unsupported);
    EXPECT_NE(std::string(e.what()).find("CUDA device"), std::string::npos);
  }
}

}  // namespace
}  // namespace embcache
