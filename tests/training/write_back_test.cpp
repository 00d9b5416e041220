// training_cache_options::write_back_bytes: end_training() writes the resident dirty rows back in
// chunks of that size, and a boundary writes behind at most that much (the leavers past it are
// pushed by begin_pass). Whatever the size, the store ends with the same rows, versions and
// export as with one chunk.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/status_assertions.hpp"
#include "common/temp_dir.hpp"
#include "embcache/host_store.hpp"
#include "embcache/training_cache.hpp"
#include "test_util.hpp"
#include "training/table_state.hpp"

// --- large aligned allocations, counted while armed ------------------------------------------
// The training cache's row buffers (staging, write-behind) come from host_allocate, an aligned
// operator new: this binary's aligned forms count those of at least g_large_bytes while a test
// arms them (the unaligned forms stay the library's).
namespace {
std::atomic<bool> g_counting{false};
std::atomic<std::size_t> g_large_bytes{0}, g_large_count{0};

void* aligned_new(std::size_t n, std::align_val_t a) {
  const std::size_t align = static_cast<std::size_t>(a);
  if (g_counting.load() && n >= g_large_bytes.load()) ++g_large_count;
  void* p = std::aligned_alloc(align, (std::max<std::size_t>(n, 1) + align - 1) / align * align);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n, std::align_val_t a) { return aligned_new(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return aligned_new(n, a); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return aligned_new(n, a);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return aligned_new(n, a);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace embcache::testing {
namespace {

constexpr std::size_t dim = 4;

// Every stored row with its version.
using stored_rows = std::map<std::int64_t, std::pair<std::vector<float>, std::uint64_t>>;

stored_rows stored_of(param_store<std::int64_t>& store) {
  stored_rows out;
  EXPECT_TRUE(store
                  .for_each(7,
                            [&](const std::int64_t* k, const float* rows,
                                const std::uint64_t* versions, std::size_t n) {
                              for (std::size_t i = 0; i < n; ++i)
                                out[k[i]] = {
                                    std::vector<float>(rows + i * dim, rows + (i + 1) * dim),
                                    versions[i]};
                              return status{};
                            })
                  .ok());
  return out;
}

// The table over its store, with the write-back options under test.
cache_over_host_store cache_over_store(std::size_t write_back_bytes, bool write_behind) {
  training_cache_options co;
  co.write_back_bytes = write_back_bytes;
  co.write_behind = write_behind;
  return cache_over_host_store(dim, 16, co);
}

struct run_result {
  stored_rows stored;
  std::vector<std::uint64_t> pushed, evicted;  // per pass and after end_training (total)
  std::vector<std::int64_t> delta_keys;
  std::vector<std::uint64_t> delta_versions;
};

// Passes of 12 keys over a cache of 16 rows, each keyset 8 keys past the last, so that the
// boundaries evict dirty rows; every pass rewrites its rows; then end_training (or save into
// `save_dir`) and an export.
run_result train(std::size_t write_back_bytes, bool write_behind, bool prefetch,
                 const std::string& save_dir = "") {
  cache_over_host_store f = cache_over_store(write_back_bytes, write_behind);
  training_cache<std::int64_t>& tc = *f.tc;
  run_result r;
  const auto keyset = [](int p) {
    std::vector<std::int64_t> k;
    for (std::int64_t i = 0; i < 12; ++i) k.push_back(p * 8 + i);
    return k;
  };
  constexpr int passes = 5;
  for (int p = 0; p < passes; ++p) {
    const auto keys = keyset(p);
    EXPECT_TRUE(tc.begin_pass({keys}).ok());
    if (prefetch && p + 1 < passes) EXPECT_TRUE(tc.prefetch({keyset(p + 1)}).ok());
    std::vector<float> rows(keys.size() * dim);
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = float(p * 1000 + int(i));
    EXPECT_TRUE(tc.assign(0, keys.data(), keys.size(), rows.data()).ok());
    r.pushed.push_back(tc.counters().last[0].rows_pushed);
    r.evicted.push_back(tc.counters().last[0].rows_evicted);
  }
  EXPECT_TRUE(save_dir.empty() ? tc.end_training().ok() : tc.save(save_dir).ok());
  r.pushed.push_back(tc.counters().total[0].rows_pushed);
  r.evicted.push_back(tc.counters().total[0].rows_evicted);
  r.stored = stored_of(*f.store);
  auto d = tc.export_incremental();
  EXPECT_TRUE(d.ok());
  if (d.ok()) {
    r.delta_keys = d.value()[0].keys;
    r.delta_versions = d.value()[0].versions;
  }
  return r;
}

// With prefetch the worker's early installs and evictions take turns with the caller as the
// threads run, and each takes a value of the table's version clock: the rows, the keys and the
// counts are the same in every run, the version stamps only without prefetch.
void expect_same(const run_result& a, const run_result& b, bool prefetch) {
  if (prefetch) {
    ASSERT_EQ(a.stored.size(), b.stored.size());
    for (const auto& [key, row] : a.stored) {
      const auto it = b.stored.find(key);
      ASSERT_NE(it, b.stored.end()) << key;
      EXPECT_EQ(row.first, it->second.first) << key;
    }
  } else {
    EXPECT_EQ(a.stored, b.stored);
    EXPECT_EQ(a.delta_versions, b.delta_versions);
  }
  EXPECT_EQ(a.pushed, b.pushed);
  EXPECT_EQ(a.evicted, b.evicted);
  EXPECT_EQ(a.delta_keys, b.delta_keys);
}

TEST(training_cache_write_back, one_row_chunks_store_the_same_rows_as_one_chunk) {
  for (const bool write_behind : {true, false}) {
    for (const bool prefetch : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "write_behind " << write_behind << ", prefetch " << prefetch);
      const run_result whole = train(std::size_t{1} << 20, write_behind, prefetch);
      // Every key of the 5 passes is stored: 8 * 4 + 12.
      ASSERT_EQ(whole.stored.size(), 44u);
      // 1 byte: one row per chunk; 3 rows of 16 bytes: a chunk of 3 (not a divisor of 8 or 12).
      expect_same(whole, train(1, write_behind, prefetch), prefetch);
      expect_same(whole, train(3 * dim * sizeof(float), write_behind, prefetch), prefetch);
    }
  }
}

TEST(training_cache_write_back, one_row_chunks_store_the_last_row_of_every_key) {
  const run_result r = train(dim * sizeof(float), true, false);
  ASSERT_EQ(r.stored.size(), 44u);
  EXPECT_GE(r.pushed.back(), 44u);  // every key was dirty once at least
  EXPECT_GT(r.evicted.back(), 0u);  // the boundaries evicted: their leavers went in chunks too
  for (const auto& [key, row] : r.stored) {
    const int pass = key < 40 ? int(key / 8) : 4;  // the last pass that wrote the key
    EXPECT_EQ(row.first[0], float(pass * 1000 + int(key - pass * 8) * int(dim))) << "key " << key;
  }
}

TEST(training_cache_write_back, save_and_load_in_one_row_chunks_keep_every_row) {
  temp_dir dir("embcache_write_back");
  const run_result saved = train(1, true, true, dir.sub("save"));
  ASSERT_EQ(saved.stored.size(), 44u);
  for (const std::size_t bytes : {std::size_t{1}, std::size_t{1} << 20}) {
    cache_over_host_store f = cache_over_store(bytes, true);
    ASSERT_TRUE(f.tc->load(dir.sub("save")).ok());
    EXPECT_EQ(stored_of(*f.store), saved.stored) << bytes << " bytes";
  }
}

// The log of keys written back (what the next export takes from the store) is compacted once it
// doubles: a run that never exports keeps about two entries per key, not one per write-back, and
// the entries an export collected and has not committed stay its prefix.
TEST(training_cache_write_back, the_export_log_stays_bounded_and_keeps_a_collected_prefix) {
  detail::export_log<std::int64_t> log;
  constexpr std::size_t slack = detail::export_log<std::int64_t>::compact_slack;
  std::vector<std::int64_t> keys(1000);
  for (std::size_t round = 0; round < 3 * slack / keys.size(); ++round) {
    for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = std::int64_t((i * 7919 + round) % 1500);
    log.note_written(keys.begin(), keys.end());
    log.compact_if_grown();
    ASSERT_LT(log.written.size(), 2 * 1500 + slack + keys.size()) << "round " << round;
  }
  std::set<std::int64_t> all(log.written.begin(), log.written.end());
  EXPECT_EQ(all.size(), 1500u);  // compacted, nothing lost
  // An export collects the log as it is; keys logged after it go past that prefix, compacted
  // or not; committing drops exactly the prefix.
  const std::vector<std::int64_t> prefix = log.written;
  log.collected(prefix.size());
  for (std::size_t round = 0; round < 2 * slack / keys.size(); ++round) {
    for (std::size_t i = 0; i < keys.size(); ++i)
      keys[i] = std::int64_t(2000 + (i + round * 1000) % 1200);
    log.note_written(keys.begin(), keys.end());
    log.compact_if_grown();
  }
  ASSERT_GT(log.written.size(), prefix.size());
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), log.written.begin()));
  log.committed(prefix.size());
  const std::set<std::int64_t> rest(log.written.begin(), log.written.end());
  EXPECT_EQ(rest.size(), 1200u);
  EXPECT_EQ(*rest.begin(), 2000);
  EXPECT_EQ(log.pending, 0u);
}

// End to end: many write-backs without an export, then one export: every key written, once.
// Without prefetch the boundary compacts the log; with it, the next prefetch's worker does.
TEST(training_cache_write_back, an_export_after_many_unexported_write_backs_has_every_key_once) {
  for (const bool prefetch : {false, true}) {
    cache_over_host_store f(dim, 1000);
    training_cache<std::int64_t>& tc = *f.tc;
    const std::size_t passes = 2 * detail::export_log<std::int64_t>::compact_slack / 1000 + 4;
    const auto keyset = [](std::size_t p) {
      std::vector<std::int64_t> keys(1000);
      for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = std::int64_t(i + 1000 * (p % 3));
      return keys;
    };
    std::vector<float> rows(1000 * dim);
    for (std::size_t p = 0; p < passes; ++p) {
      const auto keys = keyset(p);
      ASSERT_TRUE(tc.begin_pass({keys}).ok());
      if (prefetch) ASSERT_TRUE(tc.prefetch({keyset(p + 1)}).ok());
      for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = float(p + i);
      ASSERT_TRUE(tc.assign(0, keys.data(), keys.size(), rows.data()).ok());
    }
    auto d = tc.export_incremental();
    ASSERT_TRUE(d.ok());
    std::vector<std::int64_t> got = d.value()[0].keys;
    std::sort(got.begin(), got.end());
    ASSERT_EQ(got.size(), 3000u) << "prefetch " << prefetch;
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], std::int64_t(i));
  }
}

// With prefetch and write-behind, every row leaving at every boundary (room 0, no overlap), the
// boundary gathers the leavers into the buffer the flusher pushed last pass (free by then): in
// steady state no pass allocates a row buffer, neither the worker (which sized a gather buffer of
// every leaving row whenever the spare was the smaller of the two) nor the boundary.
TEST(training_cache_write_back, steady_boundaries_reuse_one_write_behind_buffer) {
  constexpr std::size_t wide = 64, n = 64;  // 16 KiB of leaving rows, more than any key array
  host_store_options so;
  so.table_name = "t";
  so.row_width = wide;
  auto store = std::make_shared<host_store<std::int64_t>>(so);
  {
    // Every key's row in the store first (a continued run): the store does not grow meanwhile.
    std::vector<std::int64_t> all(10 * n);
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = std::int64_t(i);
    const std::vector<float> zero(all.size() * wide, 0.0f);
    const std::vector<std::uint64_t> one(all.size(), 1);
    ASSERT_TRUE(store->push(all.data(), all.size(), zero.data(), one.data()).ok());
  }
  table_options<std::int64_t> o;
  o.name = "t";
  o.dim = wide;
  o.capacity = n;
  o.max_resident = n;
  o.store = store;
  training_cache_options co;
  co.write_behind = true;
  training_cache<std::int64_t> tc(co, std::vector{o});
  const auto keyset = [](std::size_t p) {
    std::vector<std::int64_t> keys(n);
    for (std::size_t i = 0; i < n; ++i) keys[i] = std::int64_t(p * n + i);
    return keys;
  };
  std::vector<float> rows(n * wide);
  g_large_bytes = n * wide * sizeof(float);
  std::vector<std::size_t> allocated;
  for (std::size_t p = 0; p < 8; ++p) {
    const auto keys = keyset(p);
    if (p == 0) ASSERT_TRUE(tc.begin_pass({keys}).ok());
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = float(p + i);
    ASSERT_TRUE(tc.assign(0, keys.data(), n, rows.data()).ok());  // every row dirty
    // From the prefetch of the next pass to its boundary: the worker's staging and the boundary.
    g_large_count = 0;
    g_counting = true;
    const status s = tc.prefetch({keyset(p + 1)});
    const status b = s.ok() ? tc.begin_pass({keyset(p + 1)}) : s;
    g_counting = false;
    ASSERT_TRUE(b.ok()) << b.to_string();
    ASSERT_EQ(tc.counters().last[0].rows_evicted, n) << "pass " << p;
    allocated.push_back(g_large_count.load());
  }
  ASSERT_TRUE(tc.end_training().ok());
  // The first boundaries size the buffers (the staging, the gather); then none.
  for (std::size_t p = 3; p < allocated.size(); ++p) EXPECT_EQ(allocated[p], 0u) << "pass " << p;
}

}  // namespace
}  // namespace embcache::testing
