// Conformance suite: every param_store implementation must pass it unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <set>

#include "common/sanitizers.hpp"
#include "embcache/host_store.hpp"
#include "embcache/log_store.hpp"
#include "embcache/tiered_store.hpp"
#include "store_test_util.hpp"
#if EMBCACHE_TEST_ROCKSDB
#include "common/status_assertions.hpp"
#include "embcache/rocksdb_store.hpp"
#endif

namespace embcache::test {
namespace {

namespace fs = std::filesystem;

template <class Key>
struct host_traits {
  using key_type = Key;
  static constexpr bool is_host = true;
  static std::unique_ptr<param_store<Key>> make(const std::string&, const std::string& table,
                                                std::size_t width) {
    host_store_options o;
    o.table_name = table;
    o.row_width = width;
    return std::make_unique<host_store<Key>>(o);
  }
  static result<std::unique_ptr<param_store<Key>>> reopen(const std::string& dir,
                                                          const std::string& table,
                                                          std::size_t width) {
    host_store_options o;
    o.table_name = table;
    o.row_width = width;
    auto r = host_store<Key>::open(dir, o);
    if (!r.ok()) return r.get_status();
    return std::unique_ptr<param_store<Key>>(std::move(r).value());
  }
  // Damages the rows file without changing its size: only the checksum can tell.
  static void corrupt(const std::string& dir) { flip_byte(dir + "/rows.bin", 5); }
  static void truncate(const std::string& dir) {
    fs::resize_file(dir + "/rows.bin", fs::file_size(dir + "/rows.bin") - 3);
  }
};

// The log store with small segments, buffers and reads: the suite's batches span several
// segments, writes and preads, and cleaning runs (max_space_amplification at its least). With
// `Direct`, through O_DIRECT where the scratch folder's file system allows it.
template <class Key, bool Direct = false>
struct log_traits {
  using key_type = Key;
  static constexpr bool is_host = false;
  static log_store_options options(const std::string& path, const std::string& table,
                                   std::size_t width) {
    log_store_options o;
    o.path = path;
    o.table_name = table;
    o.row_width = width;
    o.segment_bytes = 1 << 20;
    o.max_space_amplification = 1.25;
    o.write_buffer_bytes = 4096;
    o.max_read_bytes = 2048;
    o.read_gap_bytes = 256;
    o.read_threads = 3;
    o.direct_io = Direct && direct_io_supported(path);
    return o;
  }
  static std::unique_ptr<param_store<Key>> make(const std::string& dir, const std::string& table,
                                                std::size_t width) {
    auto r = log_store<Key>::open(options(dir + "/live_log", table, width));
    r.get_status().throw_if_error();
    return std::move(r).value();
  }
  static result<std::unique_ptr<param_store<Key>>> reopen(const std::string& dir,
                                                          const std::string& table,
                                                          std::size_t width) {
    auto o = options(dir, table, width);
    o.create_if_missing = false;
    auto r = log_store<Key>::open(o);
    if (!r.ok()) return r.get_status();
    return std::unique_ptr<param_store<Key>>(std::move(r).value());
  }
  // A byte of a row inside the durable part: only the checksum can tell.
  static void corrupt(const std::string& dir) { flip_byte(dir + "/seg-00000001.log", 45); }
  static void truncate(const std::string& dir) {
    const std::string seg = dir + "/seg-00000001.log";
    fs::resize_file(seg, fs::file_size(seg) - 3);
  }
};

#if EMBCACHE_TEST_ROCKSDB
// With `Ingest`, every push, however small, is written as SST files and ingested
// (rocksdb_store_options::ingest_bytes): the other way rows reach the table. `Path` is how
// pulls read (rocksdb_store_options::read_path): the suite runs each one.
template <class Key, bool Ingest = false, rocksdb_read_path Path = rocksdb_read_path::automatic>
struct rocksdb_traits {
  using key_type = Key;
  static constexpr bool is_host = false;
  static rocksdb_store_options options(const std::string& path, const std::string& table,
                                       std::size_t width) {
    rocksdb_store_options o;
    o.path = path;
    o.table_name = table;
    o.row_width = width;
    o.block_cache_bytes = 8 << 20;
    o.write_buffer_bytes = 4 << 20;
    o.batch_keys = 64;  // several MultiGet / WriteBatch per test batch
    if (Ingest) o.ingest_bytes = 1;
    o.read_path = Path;
    o.scan_batch_keys = 64;  // several scans per test batch
    return o;
  }
  static std::unique_ptr<param_store<Key>> make(const std::string& dir, const std::string& table,
                                                std::size_t width) {
    auto r = rocksdb_store<Key>::open(options(dir + "/live_db", table, width));
    r.get_status().throw_if_error();
    return std::move(r).value();
  }
  static result<std::unique_ptr<param_store<Key>>> reopen(const std::string& dir,
                                                          const std::string& table,
                                                          std::size_t width) {
    auto o = options(dir, table, width);
    o.create_if_missing = false;
    o.existing_rows = existing_rows_policy::reuse;  // a checkpoint is opened for its rows
    auto r = rocksdb_store<Key>::open(o);
    if (!r.ok()) return r.get_status();
    return std::unique_ptr<param_store<Key>>(std::move(r).value());
  }
  static std::string file_starting(const std::string& dir, const std::string& prefix,
                                   const std::string& suffix = "") {
    for (auto& e : fs::directory_iterator(dir)) {
      auto n = e.path().filename().string();
      if (n.rfind(prefix, 0) == 0 && n.size() >= suffix.size() &&
          n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
        return e.path().string();
    }
    return {};
  }
  // Garbles the MANIFEST: the file that says which SST files make the database.
  static void corrupt(const std::string& dir) {
    auto m = file_starting(dir, "MANIFEST-");
    ASSERT_FALSE(m.empty());
    for (std::uint64_t off = 0; off < fs::file_size(m); off += 7) flip_byte(m, off);
  }
  static void truncate(const std::string& dir) {
    auto sst = file_starting(dir, "", ".sst");
    ASSERT_FALSE(sst.empty());
    fs::resize_file(sst, fs::file_size(sst) / 2);
  }
};

#endif

// A DRAM tier of 64 rows in front of the store of `Lower`: every test's batch overflows it, so
// the suite runs through demotions and write-downs.
template <class Lower>
struct tiered_traits {
  using key_type = typename Lower::key_type;
  using Key = key_type;
  static constexpr bool is_host = false;
  static std::unique_ptr<param_store<Key>> over(std::unique_ptr<param_store<Key>> lower) {
    tiered_store_options<Key> o;
    o.dram_bytes = 64 * tiered_store<Key>::dram_row_bytes(lower->row_width());
    o.write_down_rows = 50;  // several pushes per write-down
    o.lower = std::move(lower);
    auto r = tiered_store<Key>::open(std::move(o));
    r.get_status().throw_if_error();
    return std::move(r).value();
  }
  static std::unique_ptr<param_store<Key>> make(const std::string& dir, const std::string& table,
                                                std::size_t width) {
    return over(Lower::make(dir, table, width));
  }
  static result<std::unique_ptr<param_store<Key>>> reopen(const std::string& dir,
                                                          const std::string& table,
                                                          std::size_t width) {
    auto r = Lower::reopen(dir, table, width);
    if (!r.ok()) return r.get_status();
    return over(std::move(r).value());
  }
  static void corrupt(const std::string& dir) { Lower::corrupt(dir); }
  static void truncate(const std::string& dir) { Lower::truncate(dir); }
};

template <class Traits>
class store_conformance : public ::testing::Test {
 protected:
  using Key = typename Traits::key_type;
  static constexpr std::size_t width = 6;

  void SetUp() override { store_ = Traits::make(dir_.path(), "clicks", width); }

  void push(const std::vector<Key>& keys, const std::vector<float>& rows,
            const std::uint64_t* versions = nullptr) {
    EMBCACHE_ASSERT_OK(store_->push(keys.data(), keys.size(), rows.data(), versions));
  }

  // Pulls `keys` and checks that each present one holds exactly row_value(key, ., salt).
  void expect_rows(param_store<Key>& s, const std::vector<Key>& keys, int salt) {
    std::vector<float> out(keys.size() * width, -1.f);
    std::unique_ptr<bool[]> found(new bool[keys.size()]);
    EMBCACHE_ASSERT_OK(s.pull(keys.data(), keys.size(), out.data(), found.get()));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      ASSERT_TRUE(found[i]) << "key " << keys[i];
      for (std::size_t j = 0; j < width; ++j)
        ASSERT_EQ(out[i * width + j], row_value(keys[i], j, salt)) << "key " << keys[i];
    }
  }

  std::map<Key, std::pair<std::vector<float>, std::uint64_t>> dump(param_store<Key>& s,
                                                                   std::size_t batch = 5) {
    std::map<Key, std::pair<std::vector<float>, std::uint64_t>> all;
    status st = s.for_each(
        batch, [&](const Key* k, const float* r, const std::uint64_t* v, std::size_t n) -> status {
          EXPECT_LE(n, batch);
          EXPECT_GT(n, 0u);
          for (std::size_t i = 0; i < n; ++i) {
            bool inserted =
                all.emplace(k[i], std::make_pair(
                                      std::vector<float>(r + i * width, r + (i + 1) * width), v[i]))
                    .second;
            EXPECT_TRUE(inserted) << "key visited twice: " << k[i];
          }
          return {};
        });
    EMBCACHE_EXPECT_OK(st);
    return all;
  }

  scratch_dir dir_;
  std::unique_ptr<param_store<Key>> store_;
};

using store_types =
    ::testing::Types<host_traits<std::int64_t>, host_traits<std::uint32_t>,
                     tiered_traits<host_traits<std::uint32_t>>, log_traits<std::int64_t>,
                     log_traits<std::uint32_t, true>, tiered_traits<log_traits<std::int64_t>>
#if EMBCACHE_TEST_ROCKSDB
                     ,
                     rocksdb_traits<std::int64_t>,
                     rocksdb_traits<std::uint32_t, false, rocksdb_read_path::scan>,
                     rocksdb_traits<std::int64_t, true, rocksdb_read_path::multi_get>,
                     tiered_traits<rocksdb_traits<std::int64_t>>
#endif
                     >;
TYPED_TEST_SUITE(store_conformance, store_types);

TYPED_TEST(store_conformance, round_trip_with_missing_keys) {
  using Key = typename TestFixture::Key;
  auto keys = make_keys<Key>(1000);
  this->push(keys, make_rows(keys, this->width, 1));
  EXPECT_EQ(this->store_->size(), 1000u);
  EXPECT_EQ(this->store_->max_version(), 1u);
  EXPECT_EQ(this->store_->row_width(), this->width);
  EXPECT_EQ(this->store_->table_name(), "clicks");

  // Every other query key is absent; absent rows stay untouched.
  auto absent = make_keys<Key>(500, 7);
  std::vector<Key> query;
  for (std::size_t i = 0; i < 500; ++i) {
    query.push_back(keys[999 - i]);
    query.push_back(absent[i]);
  }
  std::vector<float> out(query.size() * this->width, -7.f);
  std::unique_ptr<bool[]> found(new bool[query.size()]);
  std::vector<std::uint64_t> versions(query.size(), 99);
  EMBCACHE_ASSERT_OK(
      this->store_->pull(query.data(), query.size(), out.data(), found.get(), versions.data()));
  for (std::size_t i = 0; i < query.size(); ++i) {
    const bool present = i % 2 == 0;
    ASSERT_EQ(found[i], present) << i;
    for (std::size_t j = 0; j < this->width; ++j)
      ASSERT_EQ(out[i * this->width + j], present ? row_value(query[i], j, 1) : -7.f);
    ASSERT_EQ(versions[i], present ? 1u : 99u);
  }
  this->expect_rows(*this->store_, keys, 1);
}

TYPED_TEST(store_conformance, extreme_key_values_are_ordinary_keys) {
  using Key = typename TestFixture::Key;
  using lim = std::numeric_limits<Key>;
  // -1 and min for signed keys; the top bit alone for unsigned ones.
  std::vector<Key> keys{0,
                        1,
                        lim::max(),
                        static_cast<Key>(lim::max() - 1),
                        std::is_signed_v<Key> ? static_cast<Key>(-1) : Key{2},
                        std::is_signed_v<Key> ? lim::min() : static_cast<Key>(Key{1} << 31)};
  this->push(keys, make_rows(keys, this->width, 3));
  EXPECT_EQ(this->store_->size(), keys.size());
  this->expect_rows(*this->store_, keys, 3);
  auto all = this->dump(*this->store_);
  EXPECT_EQ(all.size(), keys.size());
}

TYPED_TEST(store_conformance, overwrite_keeps_size_and_bumps_versions) {
  using Key = typename TestFixture::Key;
  auto keys = make_keys<Key>(300);
  this->push(keys, make_rows(keys, this->width, 1));
  std::vector<Key> half(keys.begin(), keys.begin() + 150);
  this->push(half, make_rows(half, this->width, 2));
  EXPECT_EQ(this->store_->size(), 300u);
  EXPECT_EQ(this->store_->max_version(), 2u);
  this->expect_rows(*this->store_, half, 2);
  this->expect_rows(*this->store_, std::vector<Key>(keys.begin() + 150, keys.end()), 1);
  auto all = this->dump(*this->store_);
  ASSERT_EQ(all.size(), 300u);
  for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(all[keys[i]].second, i < 150 ? 2u : 1u);
}

TYPED_TEST(store_conformance, erase_counts_only_present_keys) {
  using Key = typename TestFixture::Key;
  auto keys = make_keys<Key>(200);
  this->push(keys, make_rows(keys, this->width, 1));
  auto absent = make_keys<Key>(10, 9);
  std::vector<Key> gone(keys.begin(), keys.begin() + 50);
  std::vector<Key> to_erase = gone;
  to_erase.insert(to_erase.end(), absent.begin(), absent.end());
  to_erase.push_back(gone[0]);  // repeated: erased once
  std::size_t erased = 12345;
  EMBCACHE_ASSERT_OK(this->store_->erase(to_erase.data(), to_erase.size(), &erased));
  EXPECT_EQ(erased, 50u);
  EXPECT_EQ(this->store_->size(), 150u);
  std::unique_ptr<bool[]> found(new bool[keys.size()]);
  EMBCACHE_ASSERT_OK(this->store_->contains(keys.data(), keys.size(), found.get()));
  for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(found[i], i >= 50) << i;
  // Erased keys can come back, with their new row.
  this->push(gone, make_rows(gone, this->width, 4));
  EXPECT_EQ(this->store_->size(), 200u);
  this->expect_rows(*this->store_, gone, 4);
  this->expect_rows(*this->store_, std::vector<Key>(keys.begin() + 50, keys.end()), 1);
  EMBCACHE_ASSERT_OK(this->store_->erase(keys.data(), keys.size(), &erased));
  EXPECT_EQ(erased, 200u);
  EXPECT_EQ(this->store_->size(), 0u);
  EXPECT_TRUE(this->dump(*this->store_).empty());
}

TYPED_TEST(store_conformance, empty_batches_are_no_ops) {
  auto* s = this->store_.get();
  EMBCACHE_EXPECT_OK(s->push(nullptr, 0, nullptr));
  EMBCACHE_EXPECT_OK(s->pull(nullptr, 0, nullptr, nullptr));
  EMBCACHE_EXPECT_OK(s->contains(nullptr, 0, nullptr));
  std::size_t erased = 5;
  EMBCACHE_EXPECT_OK(s->erase(nullptr, 0, &erased));
  EXPECT_EQ(erased, 0u);
  EXPECT_EQ(s->size(), 0u);
  EXPECT_EQ(s->max_version(), 0u);  // an empty push stamps nothing
  int calls = 0;
  EMBCACHE_EXPECT_OK(s->for_each(10, [&](auto, auto, auto, std::size_t) -> status {
    ++calls;
    return {};
  }));
  EXPECT_EQ(calls, 0);
}

TYPED_TEST(store_conformance, null_pointers_with_keys_are_invalid_arguments) {
  using Key = typename TestFixture::Key;
  Key k = 5;
  float row[TestFixture::width] = {};
  bool found = false;
  EXPECT_EQ(this->store_->push(nullptr, 1, row).code(), status_code::invalid_argument);
  EXPECT_EQ(this->store_->push(&k, 1, nullptr).code(), status_code::invalid_argument);
  EXPECT_EQ(this->store_->pull(&k, 1, row, nullptr).code(), status_code::invalid_argument);
  EXPECT_EQ(this->store_->for_each(0, [](auto, auto, auto, auto) { return status{}; }).code(),
            status_code::invalid_argument);
  EXPECT_EQ(this->store_->size(), 0u);
  EMBCACHE_EXPECT_OK(this->store_->contains(&k, 1, &found));
  EXPECT_FALSE(found);
}

TYPED_TEST(store_conformance, repeated_key_in_a_batch_last_occurrence_wins) {
  using Key = typename TestFixture::Key;
  constexpr std::size_t w = TestFixture::width;
  // Keys 10, 20, 10, 30, 10 with rows of salts 1..5: key 10 ends with salt 5.
  std::vector<Key> keys{10, 20, 10, 30, 10};
  std::vector<float> rows(keys.size() * w);
  for (std::size_t i = 0; i < keys.size(); ++i)
    for (std::size_t j = 0; j < w; ++j) rows[i * w + j] = row_value(keys[i], j, int(i) + 1);
  std::vector<std::uint64_t> versions{7, 8, 9, 10, 11};
  EMBCACHE_ASSERT_OK(this->store_->push(keys.data(), keys.size(), rows.data(), versions.data()));
  EXPECT_EQ(this->store_->size(), 3u);
  EXPECT_EQ(this->store_->max_version(), 11u);
  // A repeated key in a pull gets its row at every position.
  std::vector<Key> query{10, 10, 20, 10};
  std::vector<float> out(query.size() * w);
  std::unique_ptr<bool[]> found(new bool[query.size()]);
  std::vector<std::uint64_t> ver(query.size());
  EMBCACHE_ASSERT_OK(
      this->store_->pull(query.data(), query.size(), out.data(), found.get(), ver.data()));
  const int salt_of[] = {5, 5, 2, 5};
  const std::uint64_t ver_of[] = {11, 11, 8, 11};
  for (std::size_t i = 0; i < query.size(); ++i) {
    EXPECT_TRUE(found[i]);
    EXPECT_EQ(ver[i], ver_of[i]);
    for (std::size_t j = 0; j < w; ++j)
      EXPECT_EQ(out[i * w + j], row_value(query[i], j, salt_of[i]));
  }
}

TYPED_TEST(store_conformance, versions_and_changed_since) {
  using Key = typename TestFixture::Key;
  auto keys = make_keys<Key>(100);
  std::vector<std::uint64_t> v(100);
  for (std::size_t i = 0; i < 100; ++i) v[i] = 10 + i % 5;  // 10..14
  this->push(keys, make_rows(keys, this->width, 1), v.data());
  EXPECT_EQ(this->store_->max_version(), 14u);
  std::vector<Key> some(keys.begin(), keys.begin() + 7);
  this->push(some, make_rows(some, this->width, 2));  // stamped 15
  EXPECT_EQ(this->store_->max_version(), 15u);

  std::set<Key> expect;
  for (std::size_t i = 0; i < 100; ++i)
    if (i < 7 || v[i] > 12) expect.insert(keys[i]);
  std::set<Key> got;
  EMBCACHE_ASSERT_OK(this->store_->for_each_changed_since(
      12, 4, [&](const Key* k, const float* r, const std::uint64_t* ver, std::size_t n) -> status {
        for (std::size_t i = 0; i < n; ++i) {
          EXPECT_GT(ver[i], 12u);
          EXPECT_TRUE(got.insert(k[i]).second);
          const bool fresh = ver[i] == 15;
          EXPECT_EQ(r[i * TestFixture::width], row_value(k[i], 0, fresh ? 2 : 1));
        }
        return {};
      }));
  EXPECT_EQ(got, expect);
}

TYPED_TEST(store_conformance, for_each_stops_at_the_first_error) {
  using Key = typename TestFixture::Key;
  auto keys = make_keys<Key>(50);
  this->push(keys, make_rows(keys, this->width, 1));
  int calls = 0;
  status st = this->store_->for_each(10, [&](auto, auto, auto, std::size_t n) -> status {
    EXPECT_EQ(n, 10u);
    return ++calls == 2 ? status::io_error("sink full") : status{};
  });
  EXPECT_EQ(st.code(), status_code::io_error);
  EXPECT_EQ(st.message(), "sink full");
  EXPECT_EQ(calls, 2);
}

TYPED_TEST(store_conformance, checkpoint_then_reopen_holds_exactly_the_checkpoint) {
  using Key = typename TestFixture::Key;
  auto keys = make_keys<Key>(2000);
  this->push(keys, make_rows(keys, this->width, 1));
  std::size_t erased = 0;
  EMBCACHE_ASSERT_OK(this->store_->erase(keys.data(), 100, &erased));
  std::vector<Key> upd(keys.begin() + 100, keys.begin() + 200);
  this->push(upd, make_rows(upd, this->width, 2));
  auto before = this->dump(*this->store_);
  const std::string cp = this->dir_.sub("cp1");
  EMBCACHE_ASSERT_OK(this->store_->checkpoint(cp));
  // Changes after the checkpoint are not in it.
  auto later = make_keys<Key>(10, 3);
  this->push(later, make_rows(later, this->width, 3));
  EMBCACHE_ASSERT_OK(this->store_->erase(keys.data() + 500, 10));

  auto reopened = TypeParam::reopen(cp, "clicks", this->width);
  EMBCACHE_ASSERT_OK(reopened);
  auto& r = *reopened.value();
  EXPECT_EQ(r.size(), 1900u);
  EXPECT_EQ(r.max_version(), 2u);
  EXPECT_EQ(this->dump(r), before);
  // The reopened store is a working store: a push stamps max_version + 1.
  r.push(later.data(), 1, make_rows(later, this->width, 3).data()).throw_if_error();
  EXPECT_EQ(r.max_version(), 3u);
}

TYPED_TEST(store_conformance, checkpoint_refuses_a_non_empty_folder_and_accepts_an_empty_one) {
  using Key = typename TestFixture::Key;
  auto keys = make_keys<Key>(10);
  this->push(keys, make_rows(keys, this->width, 1));
  const std::string busy = this->dir_.sub("busy");
  fs::create_directories(busy + "/x");
  EXPECT_EQ(this->store_->checkpoint(busy).code(), status_code::invalid_argument);
  EXPECT_TRUE(fs::exists(busy + "/x"));
  const std::string empty = this->dir_.sub("empty");
  fs::create_directories(empty);
  EMBCACHE_ASSERT_OK(this->store_->checkpoint(empty + "/"));
  auto r = TypeParam::reopen(empty, "clicks", this->width);
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(r.value()->size(), 10u);
}

TYPED_TEST(store_conformance, reopen_refuses_bad_folders_with_a_clear_status) {
  using Key = typename TestFixture::Key;
  auto keys = make_keys<Key>(3000);
  this->push(keys, make_rows(keys, this->width, 1));
  const std::string cp = this->dir_.sub("cp");
  EMBCACHE_ASSERT_OK(this->store_->checkpoint(cp));

  auto wrong_width = TypeParam::reopen(cp, "clicks", this->width + 1);
  EXPECT_EQ(wrong_width.get_status().code(), status_code::invalid_argument);
  EXPECT_NE(wrong_width.get_status().message().find("expected 7"), std::string::npos)
      << wrong_width.get_status().message();
  auto other_table = TypeParam::reopen(cp, "views", this->width);
  EXPECT_EQ(other_table.get_status().code(), status_code::not_found);
  EXPECT_NE(other_table.get_status().message().find("views"), std::string::npos);
  auto missing = TypeParam::reopen(this->dir_.sub("nothing_here"), "clicks", this->width);
  EXPECT_EQ(missing.get_status().code(), status_code::not_found);

  // Copies of the checkpoint, each damaged one way.
  const std::string bad = this->dir_.sub("bad"), cut = this->dir_.sub("cut");
  fs::copy(cp, bad, fs::copy_options::recursive);
  fs::copy(cp, cut, fs::copy_options::recursive);
  TypeParam::corrupt(bad);
  TypeParam::truncate(cut);
  auto corrupted = TypeParam::reopen(bad, "clicks", this->width);
  EXPECT_EQ(corrupted.get_status().code(), status_code::corruption)
      << corrupted.get_status().to_string();
  auto truncated = TypeParam::reopen(cut, "clicks", this->width);
  EXPECT_EQ(truncated.get_status().code(), status_code::corruption)
      << truncated.get_status().to_string();

  // Nothing stored was lost along the way.
  auto good = TypeParam::reopen(cp, "clicks", this->width);
  EMBCACHE_ASSERT_OK(good);
  this->expect_rows(*good.value(), keys, 1);
  this->expect_rows(*this->store_, keys, 1);
}

TYPED_TEST(store_conformance, checkpoint_onto_a_full_disk_is_out_of_space_and_loses_nothing) {
  using Key = typename TestFixture::Key;
  small_tmpfs disk(256 << 10);
  if (!disk.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  auto keys = make_keys<Key>(40000);  // ~1.2 MB of rows and versions
  this->push(keys, make_rows(keys, this->width, 1));
  const std::string cp = disk.sub("cp");
  status st = this->store_->checkpoint(cp);
  EXPECT_EQ(st.code(), status_code::out_of_space) << st.to_string();
  EXPECT_FALSE(fs::exists(cp));
  EXPECT_EQ(this->store_->size(), 40000u);
  this->expect_rows(*this->store_, keys, 1);
  // The store still checkpoints where there is room.
  EMBCACHE_ASSERT_OK(this->store_->checkpoint(this->dir_.sub("roomy")));
}

TYPED_TEST(store_conformance, ten_million_rows) {
  using Key = typename TestFixture::Key;
  if (!TypeParam::is_host || sizeof(Key) != 8)
    GTEST_SKIP() << "10M rows run on the host store with int64 keys only (time budget)";
#ifdef EMBCACHE_TEST_SANITIZED
  // The same code paths as the smaller cases, 10x slower under a sanitizer: the unsanitized
  // build runs the 10M rows.
  GTEST_SKIP() << "10M rows run in the unsanitized build only (time budget)";
#endif
  constexpr std::size_t n = 10'000'000, w = 4;
  auto s = TypeParam::make(this->dir_.path(), "big", w);
  std::vector<Key> keys(n);
  std::vector<float> rows(n * w);
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = static_cast<Key>(i * 2654435761u + 17);
    for (std::size_t j = 0; j < w; ++j) rows[i * w + j] = static_cast<float>(i * w + j);
  }
  EMBCACHE_ASSERT_OK(s->push(keys.data(), n, rows.data()));
  EXPECT_EQ(s->size(), n);
  std::reverse(keys.begin(), keys.end());
  std::vector<float> out(n * w, -1.f);
  std::unique_ptr<bool[]> found(new bool[n]);
  EMBCACHE_ASSERT_OK(s->pull(keys.data(), n, out.data(), found.get()));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t src = n - 1 - i;
    bad += !found[i];
    for (std::size_t j = 0; j < w; ++j) bad += out[i * w + j] != static_cast<float>(src * w + j);
  }
  EXPECT_EQ(bad, 0u);
  std::size_t erased = 0;
  EMBCACHE_ASSERT_OK(s->erase(keys.data(), n / 2, &erased));
  EXPECT_EQ(erased, n / 2);
  EXPECT_EQ(s->size(), n - n / 2);
}

}  // namespace
}  // namespace embcache::test
