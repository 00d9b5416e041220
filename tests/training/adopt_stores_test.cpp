// training_cache::adopt_stores: rows that reach a table's store without the cache (a sharded
// save loaded into the stores of a keyset-mode run does this) keep their versions, so the cache's
// clock must pass them, or a row updated afterwards looks older than its stored copy: clean, never
// written back, never exported. adopt_store_writes: rows pushed into the store from outside the
// cache are exported as the cache's.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status_assertions.hpp"
#include "embcache/host_store.hpp"
#include "embcache/training_cache.hpp"
#include "test_util.hpp"

namespace embcache::testing {
namespace {

constexpr std::size_t dim = 4;

// A table whose store holds the rows of a save written at version 50, pushed behind the cache's
// back.
struct outside_load : cache_over_host_store {
  std::vector<std::int64_t> keys{0, 1, 2, 3, 4, 5, 6, 7};

  outside_load() : cache_over_host_store(dim, 16) {
    const std::vector<float> rows(keys.size() * dim, 1.0f);
    const std::vector<std::uint64_t> versions(keys.size(), 50);
    EMBCACHE_EXPECT_OK(store->push(keys.data(), keys.size(), rows.data(), versions.data()));
  }
};

TEST(training_cache_adopt_stores, rows_updated_after_an_outside_load_are_written_back_and_exported) {
  outside_load f;
  EMBCACHE_ASSERT_OK(f.tc->adopt_stores());
  EXPECT_EQ(f.tc->cache(0).version(), 50u);
  EMBCACHE_ASSERT_OK(f.tc->begin_pass({f.keys}));
  const std::vector<float> updated(4 * dim, 2.0f);
  EMBCACHE_ASSERT_OK(f.tc->assign(0, f.keys.data(), 4, updated.data()));  // keys 0..3
  EMBCACHE_ASSERT_OK(f.tc->end_training());
  const auto m = store_model(*f.tc, 0);
  ASSERT_EQ(m.size(), 8u);
  for (std::int64_t k = 0; k < 8; ++k)
    EXPECT_EQ(m.at(k), std::vector<float>(dim, k < 4 ? 2.0f : 1.0f)) << "key " << k;
  // The next export starts at the loaded rows: only the four updated ones, newer than 50.
  auto d = f.tc->export_incremental();
  EMBCACHE_ASSERT_OK(d);
  ASSERT_EQ(d.value().size(), 1u);
  const table_delta<std::int64_t>& t = d.value()[0];
  EXPECT_EQ(t.since_version, 50u);
  EXPECT_GT(t.until_version, 50u);
  EXPECT_EQ(t.until_version, f.tc->cache(0).version());
  EXPECT_EQ(t.keys, (std::vector<std::int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(t.versions, (std::vector<std::uint64_t>(4, t.until_version)));
  EXPECT_TRUE(t.erased.empty());
}

TEST(training_cache_adopt_stores, a_table_with_resident_rows_is_refused_and_unchanged) {
  outside_load f;
  EMBCACHE_ASSERT_OK(f.tc->begin_pass({{100, 101}}));
  const std::uint64_t before = f.tc->cache(0).version();
  const status s = f.tc->adopt_stores();
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_NE(s.message().find("adopt_stores: table 't' holds 2 resident rows"), std::string::npos)
      << s.to_string();
  EXPECT_EQ(f.tc->cache(0).version(), before);
}

// training_cache::adopt_store_writes: rows pushed into the store from outside the cache (the
// trainer's host-hybrid mode) are the next export's, read from the store, with the keys erased
// since as its tombstones; a second call before that export (a save makes one) repeats and loses
// nothing, and the export keeps its position (adopt_stores would move it).
TEST(training_cache_adopt_stores, rows_pushed_into_the_store_are_exported_with_the_erased_keys) {
  outside_load f;
  EMBCACHE_ASSERT_OK(f.tc->adopt_stores());  // the export starts at the loaded rows (50)
  const std::vector<std::int64_t> pushed{2, 3, 9}, more{9, 12}, gone{3, 5};
  const std::vector<float> rows(3 * dim, 3.0f);
  EMBCACHE_ASSERT_OK(f.store->push(pushed.data(), 3, rows.data()));  // stamped 51
  EMBCACHE_ASSERT_OK(f.tc->adopt_store_writes());
  EXPECT_EQ(f.tc->cache(0).version(), 51u);
  EMBCACHE_ASSERT_OK(f.tc->erase(0, gone.data(), gone.size()));
  EMBCACHE_ASSERT_OK(f.store->push(more.data(), 2, rows.data()));  // stamped 52
  EMBCACHE_ASSERT_OK(f.tc->adopt_store_writes());
  EXPECT_EQ(f.tc->cache(0).version(), 52u);
  auto d = f.tc->export_incremental();
  EMBCACHE_ASSERT_OK(d);
  ASSERT_EQ(d.value().size(), 1u);
  const table_delta<std::int64_t>& t = d.value()[0];
  EXPECT_EQ(t.since_version, 50u);
  EXPECT_EQ(t.until_version, 52u);
  EXPECT_EQ(t.keys, (std::vector<std::int64_t>{2, 9, 12}));
  EXPECT_EQ(t.versions, (std::vector<std::uint64_t>{51, 52, 52}));
  EXPECT_EQ(t.vectors, std::vector<float>(3 * dim, 3.0f));
  EXPECT_EQ(t.erased, (std::vector<std::int64_t>{3, 5}));
  // Nothing new: an empty delta from 52.
  EMBCACHE_ASSERT_OK(f.tc->adopt_store_writes());
  auto next = f.tc->export_incremental();
  EMBCACHE_ASSERT_OK(next);
  EXPECT_EQ(next.value()[0].since_version, 52u);
  EXPECT_TRUE(next.value()[0].keys.empty());
  EXPECT_TRUE(next.value()[0].erased.empty());
  // Resident rows: refused, nothing changes.
  EMBCACHE_ASSERT_OK(f.tc->begin_pass({{100}}));
  const status s = f.tc->adopt_store_writes();
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_NE(s.message().find("adopt_store_writes: table 't' holds 1 resident rows"),
            std::string::npos)
      << s.to_string();
}

}  // namespace
}  // namespace embcache::testing
