// Tests of what only one store has: host memory bounds and checkpoint files, RocksDB sharing,
// ordering, reopening and crash recovery.
#include <gtest/gtest.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <thread>

#include "embcache/host_store.hpp"
#include "store_test_util.hpp"
#define XXH_INLINE_ALL
#include <xxhash.h>
#if EMBCACHE_TEST_ROCKSDB
#include "common/status_assertions.hpp"
#include "embcache/rocksdb_store.hpp"
#endif

// --- allocation accounting: every operator new of this binary goes through here ------------
// Counted in malloc's usable sizes (what the allocator really hands out), without headers, so
// that code which asks malloc_usable_size about its own blocks (RocksDB does) keeps working.
namespace {
std::atomic<long long> g_live_bytes{0};

void* counted_alloc(std::size_t n, std::size_t align) {
  void* p =
      align <= alignof(std::max_align_t)
          ? std::malloc(n ? n : 1)
          : std::aligned_alloc(align, (std::max<std::size_t>(n, 1) + align - 1) / align * align);
  if (p) g_live_bytes += static_cast<long long>(::malloc_usable_size(p));
  return p;
}

void counted_free(void* p, std::size_t) noexcept {
  if (!p) return;
  g_live_bytes -= static_cast<long long>(::malloc_usable_size(p));
  std::free(p);
}

void* counted_new(std::size_t n, std::size_t align) {
  void* p = counted_alloc(n, align);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) { return counted_new(n, 0); }
void* operator new[](std::size_t n) { return counted_new(n, 0); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) {
  return counted_new(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return counted_new(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { counted_free(p, 0); }
void operator delete[](void* p) noexcept { counted_free(p, 0); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p, 0); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p, 0); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p, 0); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p, 0); }
void operator delete(void* p, std::align_val_t a) noexcept {
  counted_free(p, static_cast<std::size_t>(a));
}
void operator delete[](void* p, std::align_val_t a) noexcept {
  counted_free(p, static_cast<std::size_t>(a));
}
void operator delete(void* p, std::size_t, std::align_val_t a) noexcept {
  counted_free(p, static_cast<std::size_t>(a));
}
void operator delete[](void* p, std::size_t, std::align_val_t a) noexcept {
  counted_free(p, static_cast<std::size_t>(a));
}

namespace embcache::test {
namespace {

namespace fs = std::filesystem;

// --- host store -------------------------------------------------------------------------------

TEST(host_store, allocated_bytes_stay_within_the_documented_bound) {
  constexpr std::size_t w = 192, n = 200'000;  // dim 64 with Adam state
  host_store_options o;
  o.table_name = "t";
  o.row_width = w;
  {  // first use of the thread pool allocates on its own; keep that out of the count
    host_store<std::int64_t> warm(o);
    auto k = make_keys<std::int64_t>(5000);
    EMBCACHE_ASSERT_OK(warm.push(k.data(), k.size(), make_rows(k, w, 1).data()));
  }
  auto keys = make_keys<std::int64_t>(n);
  auto rows = make_rows(keys, w, 1);
  const long long before = g_live_bytes.load();
  auto store = std::make_unique<host_store<std::int64_t>>(o);
  EMBCACHE_ASSERT_OK(store->push(keys.data(), n, rows.data()));
  const long long allocated = g_live_bytes.load() - before;
  const std::size_t row_bytes = w * sizeof(float);
  const std::size_t fixed = o.num_shards * (o.min_chunk_bytes + row_bytes + 8 + 16 * 16 + 4096 +
                                            sizeof(std::size_t) * 64) +
                            4096;
  // The documented bound: 10.9% over the rows' bytes at this width, plus the fixed part.
  const double documented = 1.109 * double(n) * double(row_bytes) + double(fixed);
  EXPECT_GE(allocated, static_cast<long long>(n * row_bytes));
  EXPECT_LE(allocated, static_cast<long long>(host_store<std::int64_t>::memory_bound(n, o)));
  EXPECT_LE(double(host_store<std::int64_t>::memory_bound(n, o)), documented);
  // memory_bytes() reports what the store asked for; malloc's own rounding adds under 1%.
  EXPECT_LE(static_cast<long long>(store->memory_bytes()), allocated);
  EXPECT_LE(double(allocated), 1.01 * double(store->memory_bytes()));

  // Erased rows are reused: the slab does not grow when as many new keys come back.
  const std::size_t before_churn = store->memory_bytes();
  std::size_t erased = 0;
  EMBCACHE_ASSERT_OK(store->erase(keys.data(), n / 2, &erased));
  ASSERT_EQ(erased, n / 2);
  {
    auto fresh = make_keys<std::int64_t>(n / 2, 77);
    EMBCACHE_ASSERT_OK(store->push(fresh.data(), fresh.size(), make_rows(fresh, w, 2).data()));
  }
  EXPECT_EQ(store->size(), n);
  EXPECT_LE(store->memory_bytes(),
            std::max(before_churn, host_store<std::int64_t>::memory_bound(n, o)) + 8 * n / 2);
  store.reset();
  EXPECT_EQ(g_live_bytes.load(), before);  // nothing leaked
}

TEST(host_store, a_single_shard_works) {
  host_store_options o;
  o.row_width = 3;
  o.num_shards = 1;
  host_store<std::uint32_t> s(o);
  auto keys = make_keys<std::uint32_t>(5000);
  EMBCACHE_ASSERT_OK(s.push(keys.data(), keys.size(), make_rows(keys, 3, 1).data()));
  std::vector<float> out(keys.size() * 3);
  std::unique_ptr<bool[]> found(new bool[keys.size()]);
  EMBCACHE_ASSERT_OK(s.pull(keys.data(), keys.size(), out.data(), found.get()));
  EXPECT_EQ(out, make_rows(keys, 3, 1));
  EXPECT_EQ(s.options().num_shards, 1u);
}

TEST(host_store, zero_row_width_is_misuse) {
  EXPECT_THROW(host_store<std::int64_t>(host_store_options{}), embcache::error);
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(host_store, checkpoint_folder_holds_a_manifest_with_checksums) {
  scratch_dir dir;
  host_store_options o;
  o.table_name = "ads";
  o.row_width = 5;
  host_store<std::int64_t> s(o);
  auto keys = make_keys<std::int64_t>(1234);
  std::vector<std::uint64_t> v(keys.size(), 41);
  EMBCACHE_ASSERT_OK(s.push(keys.data(), keys.size(), make_rows(keys, 5, 1).data(), v.data()));
  EMBCACHE_ASSERT_OK(s.checkpoint(dir.sub("cp")));
  std::set<std::string> files;
  for (auto& e : fs::directory_iterator(dir.path())) files.insert(e.path().filename().string());
  EXPECT_EQ(files, std::set<std::string>{"cp"});  // no temporary folder left
  auto m = nlohmann::json::parse(file_text(dir.sub("cp/manifest.json")));
  EXPECT_EQ(m["format"], "embcache.host_store");
  EXPECT_EQ(m["format_version"], 1);
  EXPECT_EQ(m["table_name"], "ads");
  EXPECT_EQ(m["key_type"], "int64");
  EXPECT_EQ(m["row_width"], 5);
  EXPECT_EQ(m["count"], 1234);
  EXPECT_EQ(m["max_version"], 41);
  const std::pair<const char*, std::size_t> expect[] = {
      {"keys.bin", 1234 * 8}, {"versions.bin", 1234 * 8}, {"rows.bin", 1234 * 5 * 4}};
  for (auto& [name, bytes] : expect) {
    const std::string data = file_text(dir.sub(std::string("cp/") + name));
    EXPECT_EQ(data.size(), bytes) << name;
    EXPECT_EQ(m["files"][name]["bytes"], bytes);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx",
                  static_cast<unsigned long long>(XXH64(data.data(), data.size(), 0)));
    EXPECT_EQ(m["files"][name]["xxh64"], hex) << name;
  }
}

TEST(host_store, open_refuses_other_key_types_and_bad_manifests) {
  scratch_dir dir;
  host_store_options o;
  o.table_name = "ads";
  o.row_width = 2;
  host_store<std::int64_t> s(o);
  std::int64_t k = 3;
  float row[2] = {1.f, 2.f};
  EMBCACHE_ASSERT_OK(s.push(&k, 1, row));
  EMBCACHE_ASSERT_OK(s.checkpoint(dir.sub("cp")));
  auto as_u32 = host_store<std::uint32_t>::open(dir.sub("cp"), o);
  EXPECT_EQ(as_u32.get_status().code(), status_code::invalid_argument);
  EXPECT_NE(as_u32.get_status().message().find("int64 keys, expected uint32"), std::string::npos);
  { std::ofstream(dir.sub("cp/manifest.json"), std::ios::trunc) << "{\"format\": "; }
  auto garbled = host_store<std::int64_t>::open(dir.sub("cp"), o);
  EXPECT_EQ(garbled.get_status().code(), status_code::corruption);
  fs::remove(dir.sub("cp/manifest.json"));
  auto none = host_store<std::int64_t>::open(dir.sub("cp"), o);
  EXPECT_EQ(none.get_status().code(), status_code::not_found);
}

// Manifest fields whose products with the row sizes wrap around 64 bits must not pass the size
// checks: count = 2^61 + n gives n rows' worth of bytes for every file once wrapped.
TEST(host_store, open_refuses_manifest_sizes_that_overflow_or_are_malformed) {
  scratch_dir dir;
  host_store_options o;
  o.table_name = "ads";
  o.row_width = 4;
  host_store<std::int64_t> s(o);
  auto keys = make_keys<std::int64_t>(100);
  EMBCACHE_ASSERT_OK(s.push(keys.data(), keys.size(), make_rows(keys, 4, 1).data()));
  EMBCACHE_ASSERT_OK(s.checkpoint(dir.sub("cp")));
  const std::string mpath = dir.sub("cp/manifest.json");
  const auto good = nlohmann::json::parse(file_text(mpath));
  struct bad_case {
    const char* what;
    void (*edit)(nlohmann::json&);
    status_code code;
    const char* names;
  };
  const bad_case cases[] = {
      {"count wraps", [](nlohmann::json& m) { m["count"] = (std::uint64_t{1} << 61) + 100; },
       status_code::corruption, "gives count 2305843009213694052: keys.bin would hold"},
      {"count at the maximum",
       [](nlohmann::json& m) { m["count"] = std::numeric_limits<std::uint64_t>::max(); },
       status_code::corruption, "overflows 64 bits"},
      {"bytes disagree", [](nlohmann::json& m) { m["files"]["rows.bin"]["bytes"] = 12; },
       status_code::corruption, "files.rows.bin.bytes 12, expected 1600 for count 100"},
      {"xxh64 with a prefix",
       [](nlohmann::json& m) { m["files"]["keys.bin"]["xxh64"] = "0x00000000000001"; },
       status_code::corruption, "malformed files.keys.bin.xxh64"},
      {"format_version wraps an int",
       [](nlohmann::json& m) { m["format_version"] = (std::uint64_t{1} << 32) + 1; },
       status_code::unsupported, "format_version 4294967297"},
  };
  for (const auto& c : cases) {
    auto m = good;
    c.edit(m);
    { std::ofstream(mpath, std::ios::trunc) << m.dump(); }
    auto r = host_store<std::int64_t>::open(dir.sub("cp"), o);
    EXPECT_EQ(r.get_status().code(), c.code) << c.what << ": " << r.get_status().to_string();
    EXPECT_NE(r.get_status().message().find(c.names), std::string::npos)
        << c.what << ": " << r.get_status().message();
  }
  { std::ofstream(mpath, std::ios::trunc) << good.dump(); }
  auto r = host_store<std::int64_t>::open(dir.sub("cp"), o);
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(r.value()->size(), 100u);
}

// --- RocksDB store ----------------------------------------------------------------------------
#if EMBCACHE_TEST_ROCKSDB

rocksdb_store_options small_options(const std::string& path, const std::string& table,
                                    std::size_t width) {
  rocksdb_store_options o;
  o.path = path;
  o.table_name = table;
  o.row_width = width;
  o.block_cache_bytes = 8 << 20;
  o.write_buffer_bytes = 1 << 20;
  o.batch_keys = 256;
  return o;
}

// Options that open a table holding rows (a checkpoint, the live database reopened).
rocksdb_store_options reusing(rocksdb_store_options o) {
  o.existing_rows = existing_rows_policy::reuse;
  return o;
}

template <class Key>
std::unique_ptr<rocksdb_store<Key>> must_open(const rocksdb_store_options& o) {
  auto r = rocksdb_store<Key>::open(o);
  EMBCACHE_EXPECT_OK(r);
  r.get_status().throw_if_error();
  return std::move(r).value();
}

TEST(rocksdb_store, tables_share_one_database_and_one_checkpoint) {
  scratch_dir dir;
  auto db = rocksdb_database::open(small_options(dir.sub("db"), "", 0));
  EMBCACHE_ASSERT_OK(db);
  auto a = rocksdb_store<std::int64_t>::open(db.value(), small_options("", "users", 4));
  auto b = rocksdb_store<std::uint32_t>::open(db.value(), small_options("", "items", 8));
  EMBCACHE_ASSERT_OK(a);
  EMBCACHE_ASSERT_OK(b);
  auto ka = make_keys<std::int64_t>(500);
  auto kb = make_keys<std::uint32_t>(300, 5);
  EMBCACHE_ASSERT_OK(a.value()->push(ka.data(), ka.size(), make_rows(ka, 4, 1).data()));
  EMBCACHE_ASSERT_OK(b.value()->push(kb.data(), kb.size(), make_rows(kb, 8, 2).data()));
  EXPECT_EQ(db.value()->tables(), (std::vector<std::string>{"items", "users"}));
  auto again = rocksdb_store<std::int64_t>::open(db.value(), small_options("", "users", 4));
  EXPECT_EQ(again.get_status().code(), status_code::invalid_argument);
  EMBCACHE_ASSERT_OK(a.value()->checkpoint(dir.sub("cp")));
  a.value().reset();
  b.value().reset();

  auto cp_b = must_open<std::uint32_t>(reusing(small_options(dir.sub("cp"), "items", 8)));
  EXPECT_EQ(cp_b->size(), 300u);
  std::vector<float> out(kb.size() * 8);
  std::unique_ptr<bool[]> found(new bool[kb.size()]);
  EMBCACHE_ASSERT_OK(cp_b->pull(kb.data(), kb.size(), out.data(), found.get()));
  EXPECT_EQ(out, make_rows(kb, 8, 2));
}

// The schema recorded at creation (key type, dim, optimizer, state width, row width) is checked
// at every open: a row width that happens to match does not let another layout through.
TEST(rocksdb_store, a_table_refuses_a_caller_with_another_schema) {
  scratch_dir dir;
  auto o = small_options(dir.sub("db"), "emb", 12);
  o.dim = 4;
  o.optimizer = "adam";
  auto keys = make_keys<std::int64_t>(50);
  {
    auto s = must_open<std::int64_t>(o);
    EMBCACHE_ASSERT_OK(s->push(keys.data(), keys.size(), make_rows(keys, 12, 1).data()));
    EMBCACHE_ASSERT_OK(s->checkpoint(dir.sub("cp")));
  }
  const std::string recorded =
      "schema {int64 keys, dim 4, optimizer adam (state width 8), rows of 12 floats, format "
      "version 2}";
  struct other_case {
    std::size_t dim;
    const char* optimizer;
    const char* expects;
  };
  for (const auto& c : {other_case{6, "adagrad", "dim 6, optimizer adagrad (state width 6)"},
                        other_case{4, "ftrl", "dim 4, optimizer ftrl (state width 8)"},
                        other_case{0, "", "dim 12, optimizer none (state width 0)"}}) {
    for (const char* where : {"db", "cp"}) {
      auto other = reusing(small_options(dir.sub(where), "emb", 12));
      other.dim = c.dim;
      other.optimizer = c.optimizer;
      auto r = rocksdb_store<std::int64_t>::open(other);
      ASSERT_EQ(r.get_status().code(), status_code::invalid_argument)
          << where << " " << c.expects << ": " << r.get_status().to_string();
      const std::string m = r.get_status().message();
      EXPECT_NE(m.find("table 'emb' in '" + dir.sub(where) + "'"), std::string::npos) << m;
      EXPECT_NE(m.find("same row width, another layout; the table was created with " + recorded),
                std::string::npos)
          << m;
      EXPECT_NE(m.find(std::string("the caller expects {int64 keys, ") + c.expects),
                std::string::npos)
          << m;
    }
  }
  // An empty table keeps the schema it was created with, too.
  {
    auto e = small_options(dir.sub("db"), "empty", 12);
    e.dim = 4;
    e.optimizer = "adam";
    must_open<std::int64_t>(e);
    e.dim = 6;
    auto r = rocksdb_store<std::int64_t>::open(e);
    EXPECT_EQ(r.get_status().code(), status_code::invalid_argument) << r.get_status().to_string();
  }
  auto bad = o;
  bad.dim = 13;
  EXPECT_EQ(rocksdb_store<std::int64_t>::open(bad).get_status().code(),
            status_code::invalid_argument);
  // The caller of the recorded schema gets the rows.
  auto same = must_open<std::int64_t>(reusing(o));
  std::vector<float> out(keys.size() * 12);
  std::unique_ptr<bool[]> found(new bool[keys.size()]);
  EMBCACHE_ASSERT_OK(same->pull(keys.data(), keys.size(), out.data(), found.get()));
  EXPECT_EQ(out, make_rows(keys, 12, 1));
}

// A new run on a path that holds an earlier run's rows must not train from them silently.
TEST(rocksdb_store, a_table_holding_rows_opens_only_when_reuse_is_asked_for) {
  scratch_dir dir;
  auto o = small_options(dir.sub("db"), "t", 3);
  auto keys = make_keys<std::int64_t>(100);
  {
    auto s = must_open<std::int64_t>(o);
    EMBCACHE_ASSERT_OK(s->push(keys.data(), keys.size(), make_rows(keys, 3, 1).data()));
    EMBCACHE_ASSERT_OK(s->checkpoint(dir.sub("cp")));
  }
  const std::int64_t first_key = *std::min_element(keys.begin(), keys.end());
  for (const char* where : {"db", "cp"}) {
    auto r = rocksdb_store<std::int64_t>::open(small_options(dir.sub(where), "t", 3));
    ASSERT_EQ(r.get_status().code(), status_code::invalid_argument)
        << where << ": " << r.get_status().to_string();
    const std::string m = r.get_status().message();
    EXPECT_NE(m.find("table 't' in '" + dir.sub(where) + "'"), std::string::npos) << m;
    EXPECT_NE(m.find("already holds rows (the first is key " + std::to_string(first_key) + ")"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("existing_rows = reuse"), std::string::npos) << m;
  }
  {
    auto s = must_open<std::int64_t>(reusing(o));  // the refusals changed nothing
    EXPECT_EQ(s->size(), 100u);
    EMBCACHE_ASSERT_OK(s->erase(keys.data(), keys.size()));
  }
  // Empty again: a table that holds no rows opens without asking.
  auto s = must_open<std::int64_t>(o);
  EXPECT_EQ(s->size(), 0u);
}

TEST(rocksdb_store, iterates_in_numeric_key_order) {
  scratch_dir dir;
  auto s = must_open<std::int64_t>(small_options(dir.sub("db"), "t", 1));
  std::vector<std::int64_t> keys{7,
                                 -5,
                                 0,
                                 std::numeric_limits<std::int64_t>::min(),
                                 300,
                                 -1000,
                                 std::numeric_limits<std::int64_t>::max(),
                                 -1};
  EMBCACHE_ASSERT_OK(s->push(keys.data(), keys.size(), make_rows(keys, 1, 1).data()));
  std::vector<std::int64_t> seen;
  EMBCACHE_ASSERT_OK(s->for_each(3, [&](const std::int64_t* k, auto, auto, std::size_t n) {
    seen.insert(seen.end(), k, k + n);
    return status{};
  }));
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(seen, keys);
}

TEST(rocksdb_store, reopening_the_live_database_restores_rows_size_and_versions) {
  scratch_dir dir;
  auto keys = make_keys<std::int64_t>(4000);
  {
    auto s = must_open<std::int64_t>(small_options(dir.sub("db"), "t", 3));
    std::vector<std::uint64_t> v(keys.size(), 9);
    EMBCACHE_ASSERT_OK(s->push(keys.data(), keys.size(), make_rows(keys, 3, 1).data(), v.data()));
    EMBCACHE_ASSERT_OK(s->erase(keys.data(), 1000));
  }  // closing flushes: with the WAL off nothing else would keep the rows
  auto s = must_open<std::int64_t>(reusing(small_options(dir.sub("db"), "t", 3)));
  EXPECT_EQ(s->size(), 3000u);
  EXPECT_EQ(s->max_version(), 9u);
  std::vector<float> out(keys.size() * 3);
  std::unique_ptr<bool[]> found(new bool[keys.size()]);
  EMBCACHE_ASSERT_OK(s->pull(keys.data(), keys.size(), out.data(), found.get()));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(found[i], i >= 1000);
    if (found[i]) ASSERT_EQ(out[i * 3 + 2], row_value(keys[i], 2, 1));
  }
  s.reset();
  auto as_u32 = rocksdb_store<std::uint32_t>::open(small_options(dir.sub("db"), "t", 3));
  EXPECT_EQ(as_u32.get_status().code(), status_code::invalid_argument);
  EXPECT_NE(as_u32.get_status().message().find("int64 keys"), std::string::npos);
}

// Blind pushes (the default) leave the count to size(); count_on_push keeps it on every push.
// Either way, through the memtables or ingested, size() is exact after inserts, overwrites,
// repeats, erases and a reopen.
TEST(rocksdb_store, size_stays_exact_with_blind_and_counted_pushes) {
  for (int variant = 0; variant < 4; ++variant) {
    const bool counted = variant & 1, ingested = variant & 2;
    SCOPED_TRACE(std::string(counted ? "count_on_push" : "blind") +
                 (ingested ? ", ingested" : ", memtables"));
    scratch_dir dir;
    auto o = small_options(dir.sub("db"), "t", 2);
    o.push_batch_keys = 128;
    o.count_on_push = counted;
    if (ingested) o.ingest_bytes = 1;
    auto keys = make_keys<std::int64_t>(3000);
    std::vector<std::int64_t> first(keys.begin(), keys.begin() + 1000);
    // 500 already held, 1000 new, each repeated once.
    std::vector<std::int64_t> second(keys.begin() + 500, keys.begin() + 2000);
    second.insert(second.end(), keys.begin() + 500, keys.begin() + 2000);
    {
      auto s = must_open<std::int64_t>(o);
      EMBCACHE_ASSERT_OK(s->push(first.data(), first.size(), make_rows(first, 2, 1).data()));
      EXPECT_EQ(s->size(), 1000u);
      EMBCACHE_ASSERT_OK(s->push(second.data(), second.size(), make_rows(second, 2, 2).data()));
      EXPECT_EQ(s->size(), 2000u);
      std::size_t erased = 0;
      EMBCACHE_ASSERT_OK(s->erase(keys.data() + 1900, 200, &erased));  // 100 held, 100 absent
      EXPECT_EQ(erased, 100u);
      EXPECT_EQ(s->size(), 1900u);
      // Not asked for in between: the count is settled after the reopen.
      EMBCACHE_ASSERT_OK(s->push(keys.data(), 2500, make_rows(keys, 2, 3).data()));
      EMBCACHE_ASSERT_OK(s->erase(keys.data(), 10));
    }
    auto s = must_open<std::int64_t>(reusing(o));
    EXPECT_EQ(s->size(), 2490u);
    EMBCACHE_ASSERT_OK(s->push(keys.data(), 5, make_rows(keys, 2, 4).data()));
    EXPECT_EQ(s->size(), 2495u);
  }
}

// Pushes through the memtables and ingested ones (ingest_bytes) interleave: the later push of a
// key wins either way, the count and versions stay exact, and a reopen finds the same rows.
TEST(rocksdb_store, ingested_and_memtable_pushes_keep_their_order) {
  scratch_dir dir;
  auto o = small_options(dir.sub("db"), "t", 4);
  o.ingest_bytes = 1000 * (4 * sizeof(float) + 8);  // 1000 rows and more bypass the memtables
  auto keys = make_keys<std::int64_t>(3000);
  auto write = [&](rocksdb_store<std::int64_t>& s, std::size_t from, std::size_t n, int salt,
                   std::uint64_t version) {
    std::vector<std::int64_t> k(keys.begin() + from, keys.begin() + from + n);
    std::vector<std::uint64_t> v(n, version);
    EMBCACHE_ASSERT_OK(s.push(k.data(), n, make_rows(k, 4, salt).data(), v.data()));
  };
  // Salt per key after each step: memtable [0, 500), ingested [0, 2000), memtable [1500, 1800),
  // ingested [1700, 3000).
  {
    auto s = must_open<std::int64_t>(o);
    write(*s, 0, 500, 1, 1);
    write(*s, 0, 2000, 2, 2);
    write(*s, 1500, 300, 3, 3);
    write(*s, 1700, 1300, 4, 4);
    EXPECT_EQ(s->size(), 3000u);
    EXPECT_EQ(s->max_version(), 4u);
    // Nothing of the ingests is left outside the database.
    EXPECT_TRUE(std::filesystem::is_empty(dir.sub("db") + "/embcache-ingest"));
  }
  auto s = must_open<std::int64_t>(reusing(o));
  EXPECT_EQ(s->size(), 3000u);
  EXPECT_EQ(s->max_version(), 4u);
  std::vector<float> out(keys.size() * 4);
  std::vector<std::uint64_t> versions(keys.size());
  std::unique_ptr<bool[]> found(new bool[keys.size()]);
  EMBCACHE_ASSERT_OK(s->pull(keys.data(), keys.size(), out.data(), found.get(), versions.data()));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const int salt = i >= 1700 ? 4 : i >= 1500 ? 3 : 2;
    ASSERT_TRUE(found[i]) << i;
    ASSERT_EQ(versions[i], std::uint64_t(salt)) << i;
    for (std::size_t j = 0; j < 4; ++j) ASSERT_EQ(out[i * 4 + j], row_value(keys[i], j, salt)) << i;
  }
}

// low_priority_compaction: RocksDB's compaction threads ("rocksdb:low") run at nice 19 once they
// have taken a job. Level-0 files past the compaction trigger (4) make one.
TEST(rocksdb_store, low_priority_compaction_runs_compactions_at_nice_19) {
  scratch_dir dir;
  auto o = small_options(dir.sub("db"), "t", 4);
  o.low_priority_compaction = true;
  o.ingest_bytes = ~std::size_t{0};  // through the memtables: each flush() leaves a level-0 file
  auto s = must_open<std::int64_t>(o);
  const auto keys = make_keys<std::int64_t>(2000);
  const std::vector<std::uint64_t> versions(keys.size(), 1);
  for (int salt = 0; salt < 8; ++salt) {
    EMBCACHE_ASSERT_OK(
        s->push(keys.data(), keys.size(), make_rows(keys, 4, salt).data(), versions.data()));
    EMBCACHE_ASSERT_OK(s->flush());
  }
  // Threads named rocksdb:low at nice 19 (getpriority of a thread id: Linux keeps nice per
  // thread), polled until one has compacted (at most 20 s).
  auto lowered = [] {
    int seen = 0;
    for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream comm(t.path() / "comm");
      std::string name;
      std::getline(comm, name);
      if (name != "rocksdb:low") continue;
      const id_t tid = static_cast<id_t>(std::stoul(t.path().filename().string()));
      errno = 0;
      const int nice = ::getpriority(PRIO_PROCESS, tid);
      if (errno == 0 && nice == 19) ++seen;
    }
    return seen;
  };
  int seen = 0;
  for (int i = 0; i < 200 && (seen = lowered()) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_GT(seen, 0) << "no compaction thread at nice 19";
}

TEST(rocksdb_store, a_full_disk_under_the_live_database_is_out_of_space_and_loses_nothing) {
  small_tmpfs disk(3 << 20);
  if (!disk.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  auto o = small_options(disk.sub("db"), "t", 64);
  o.write_buffer_bytes = 256 << 10;
  auto s = must_open<std::int64_t>(o);
  auto keep = make_keys<std::int64_t>(1000);
  EMBCACHE_ASSERT_OK(s->push(keep.data(), keep.size(), make_rows(keep, 64, 1).data()));
  EMBCACHE_ASSERT_OK(s->flush());
  status failure;
  for (int round = 0; round < 40 && failure.ok(); ++round) {
    auto more = make_keys<std::int64_t>(2000, 100 + round);
    failure = s->push(more.data(), more.size(), make_rows(more, 64, 2).data());
    if (failure.ok()) failure = s->flush();
  }
  EXPECT_EQ(failure.code(), status_code::out_of_space) << failure.to_string();
  std::vector<float> out(keep.size() * 64);
  std::unique_ptr<bool[]> found(new bool[keep.size()]);
  EMBCACHE_ASSERT_OK(s->pull(keep.data(), keep.size(), out.data(), found.get()));
  for (std::size_t i = 0; i < keep.size(); ++i) ASSERT_TRUE(found[i]);
  EXPECT_EQ(out, make_rows(keep, 64, 1));
}

// The crash test runs this in a child process (this binary, re-executed), then kills it.
constexpr std::size_t crash_rows = 5000, crash_width = 16;

TEST(rocksdb_crash, DISABLED_child_pushes_until_killed) {
  const char* dir = std::getenv("EMBCACHE_CRASH_DIR");
  if (!dir) GTEST_SKIP() << "runs only as the child of rocksdb_crash.killed_while_pushing";
  auto o = small_options(std::string(dir) + "/live", "t", crash_width);
  o.space.max_threads = 2;
  // EMBCACHE_CRASH_INGEST: every push is ingested, the new keys of each round too, and counted
  // (so the last flush records an exact count): a reopen after the kill must see that rows
  // reached the disk after that flush and recount.
  if (std::getenv("EMBCACHE_CRASH_INGEST")) {
    o.ingest_bytes = 1;
    o.count_on_push = true;
  }
  auto s = must_open<std::int64_t>(o);
  auto keys = make_keys<std::int64_t>(crash_rows);
  EMBCACHE_ASSERT_OK(s->push(keys.data(), keys.size(), make_rows(keys, crash_width, 1).data()));
  EMBCACHE_ASSERT_OK(s->checkpoint(std::string(dir) + "/cp"));
  std::ofstream(std::string(dir) + "/ready") << "ready\n";
  for (int round = 2;; ++round) {
    // Overwrite the checkpointed rows and add new ones, with a flush now and then.
    auto more = make_keys<std::int64_t>(3000, round);
    EMBCACHE_ASSERT_OK(
        s->push(keys.data(), keys.size(), make_rows(keys, crash_width, round).data()));
    EMBCACHE_ASSERT_OK(
        s->push(more.data(), more.size(), make_rows(more, crash_width, round).data()));
    if (round % 5 == 0) EMBCACHE_ASSERT_OK(s->flush());
  }
}

// Killed while pushing through the memtables, or (ingest) while ingesting some pushes too.
void expect_the_last_checkpoint_after_a_kill(bool ingest) {
  SCOPED_TRACE(ingest ? "ingested and memtable pushes" : "memtable pushes");
  scratch_dir dir;
  ASSERT_NO_FATAL_FAILURE(run_child_until_killed(dir,
                                                 "rocksdb_crash.DISABLED_child_pushes_until_killed",
                                                 ingest ? "EMBCACHE_CRASH_INGEST=1" : ""));

  auto keys = make_keys<std::int64_t>(crash_rows);
  {
    auto o = small_options(dir.sub("cp"), "t", crash_width);
    o.create_if_missing = false;
    auto cp = must_open<std::int64_t>(reusing(o));
    EXPECT_EQ(cp->size(), crash_rows);
    EXPECT_EQ(cp->max_version(), 1u);
    std::vector<float> out(keys.size() * crash_width);
    std::unique_ptr<bool[]> found(new bool[keys.size()]);
    EMBCACHE_ASSERT_OK(cp->pull(keys.data(), keys.size(), out.data(), found.get()));
    for (std::size_t i = 0; i < keys.size(); ++i) ASSERT_TRUE(found[i]);
    EXPECT_EQ(out, make_rows(keys, crash_width, 1));
  }
  // The live database opens too; its size agrees with what it holds.
  auto o = small_options(dir.sub("live"), "t", crash_width);
  o.create_if_missing = false;
  auto live = must_open<std::int64_t>(reusing(o));
  std::size_t held = 0;
  EMBCACHE_ASSERT_OK(live->for_each(1000, [&](auto, auto, auto, std::size_t n) {
    held += n;
    return status{};
  }));
  EXPECT_EQ(live->size(), held);
  EXPECT_GE(held, crash_rows);
  std::unique_ptr<bool[]> found(new bool[keys.size()]);
  EMBCACHE_ASSERT_OK(live->contains(keys.data(), keys.size(), found.get()));
  for (std::size_t i = 0; i < keys.size(); ++i) ASSERT_TRUE(found[i]);
}

TEST(rocksdb_crash, killed_while_pushing_keeps_the_last_checkpoint) {
  expect_the_last_checkpoint_after_a_kill(false);
  expect_the_last_checkpoint_after_a_kill(true);
}

#endif  // EMBCACHE_TEST_ROCKSDB

}  // namespace
}  // namespace embcache::test
