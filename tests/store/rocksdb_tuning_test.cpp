// The RocksDB store's tuning options for a table larger than memory: their checks, and every
// combination used for an SSD-bound table reading back exactly what was written.
#include <gtest/gtest.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "common/status_assertions.hpp"
#include "store_test_util.hpp"
#if EMBCACHE_TEST_ROCKSDB
#include <rocksdb/db.h>

#include "embcache/rocksdb_store.hpp"

namespace embcache::test {
namespace {

using key = std::int64_t;
constexpr std::size_t tuning_width = 24;

rocksdb_store_options base_options(const std::string& path) {
  rocksdb_store_options o;
  o.path = path;
  o.table_name = "t";
  o.row_width = tuning_width;
  o.block_cache_bytes = 1 << 20;
  o.write_buffer_bytes = 1 << 20;
  o.batch_keys = 64;
  return o;
}

void expect_invalid(const rocksdb_store_options& o, const std::string& field) {
  auto r = rocksdb_store<key>::open(o);
  EXPECT_EQ(r.get_status().code(), status_code::invalid_argument) << field;
  EXPECT_NE(r.get_status().message().find("rocksdb_store_options::" + field), std::string::npos)
      << r.get_status().message();
  auto db = rocksdb_database::open(o);
  EXPECT_EQ(db.get_status().code(), status_code::invalid_argument) << field;
}

TEST(rocksdb_tuning, bad_values_are_invalid_arguments_naming_the_field) {
  scratch_dir dir;
  auto o = base_options(dir.sub("db"));
  o.block_bytes = 100;
  expect_invalid(o, "block_bytes");
  o = base_options(dir.sub("db"));
  o.read_threads = -1;
  expect_invalid(o, "read_threads");
  o.read_threads = 1000;
  expect_invalid(o, "read_threads");
  o = base_options(dir.sub("db"));
  o.max_subcompactions = 0;
  expect_invalid(o, "max_subcompactions");
  o = base_options(dir.sub("db"));
  o.compaction = static_cast<rocksdb_compaction>(7);
  expect_invalid(o, "compaction");
  o = base_options(dir.sub("db"));
  o.bloom_bits_per_key = -3;
  expect_invalid(o, "bloom_bits_per_key");
  o = base_options(dir.sub("db"));
  o.read_path = static_cast<rocksdb_read_path>(9);
  expect_invalid(o, "read_path");
  o = base_options(dir.sub("db"));
  o.scan_batch_keys = 0;
  expect_invalid(o, "scan_batch_keys");
  o = base_options(dir.sub("db"));
  o.scan_readahead_bytes = std::size_t{65} << 20;
  expect_invalid(o, "scan_readahead_bytes");
  EXPECT_FALSE(std::filesystem::exists(dir.sub("db")));  // refused before anything was created
}

// Writes n rows in two flushed rounds (so reads go to SST files of more than one run), the
// second rewriting half of them, reads them back in shuffled order with absent keys between,
// reopens and reads again.
void round_trip(const rocksdb_store_options& o, std::size_t n = 20000) {
  const std::size_t width = o.row_width;
  const std::size_t half_n = n / 2;
  auto keys = make_keys<key>(n);
  {
    auto r = rocksdb_store<key>::open(o);
    EMBCACHE_ASSERT_OK(r);
    auto& s = *r.value();
    EMBCACHE_ASSERT_OK(s.push(keys.data(), keys.size(), make_rows(keys, width, 1).data()));
    EMBCACHE_ASSERT_OK(s.flush());
    std::vector<key> half(keys.begin(), keys.begin() + half_n);
    EMBCACHE_ASSERT_OK(s.push(half.data(), half.size(), make_rows(half, width, 2).data()));
    EMBCACHE_ASSERT_OK(s.flush());
  }
  auto ro = o;
  ro.existing_rows = existing_rows_policy::reuse;
  auto r = rocksdb_store<key>::open(ro);
  EMBCACHE_ASSERT_OK(r);
  auto& s = *r.value();
  EXPECT_EQ(s.size(), keys.size());
  std::vector<key> query = keys;
  auto absent = make_keys<key>(500, 3);
  query.insert(query.end(), absent.begin(), absent.end());
  std::shuffle(query.begin(), query.end(), std::mt19937_64(7));
  std::vector<float> out(query.size() * width);
  std::unique_ptr<bool[]> found(new bool[query.size()]);
  EMBCACHE_ASSERT_OK(s.pull(query.data(), query.size(), out.data(), found.get()));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < query.size(); ++i) {
    const auto rewritten_end = keys.begin() + static_cast<std::ptrdiff_t>(half_n);
    const bool rewritten = std::find(keys.begin(), rewritten_end, query[i]) != rewritten_end;
    const bool present = std::find(absent.begin(), absent.end(), query[i]) == absent.end();
    bad += found[i] != present;
    if (present)
      for (std::size_t j = 0; j < width; ++j)
        bad += out[i * width + j] != row_value(query[i], j, rewritten ? 2 : 1);
  }
  EXPECT_EQ(bad, 0u);
  std::size_t erased = 0;
  EMBCACHE_ASSERT_OK(s.erase(absent.data(), absent.size(), &erased));
  EXPECT_EQ(erased, 0u);
}

bool on_tmpfs(const std::string& path) {
  struct statfs f {};
  return ::statfs(path.c_str(), &f) == 0 && f.f_type == 0x01021994;  // TMPFS_MAGIC
}

TEST(rocksdb_tuning, ssd_bound_options_read_back_every_row) {
  scratch_dir dir;
  if (on_tmpfs(dir.path())) GTEST_SKIP() << "tmpfs has no direct I/O";
  auto o = base_options(dir.sub("db"));
  o.use_direct_reads = true;
  o.use_direct_io_for_flush_and_compaction = true;
  o.partition_index_and_filters = true;
  o.cache_index_and_filter_blocks = true;
  o.row_cache_bytes = 1 << 20;
  o.read_threads = 8;
  o.dynamic_level_bytes = true;
  o.max_subcompactions = 2;
  round_trip(o);
}

// Rows of 900 floats: one row per 4 KiB block, so each MultiGet batch reads up to 32 blocks of
// a file, which batched_direct_reads submits in windows of 16 (several per MultiRead). Both ways
// read back every row; so does a table of small rows (many per block, one block per read).
TEST(rocksdb_tuning, batched_direct_reads_read_back_every_row) {
  scratch_dir dir;
  if (on_tmpfs(dir.path())) GTEST_SKIP() << "tmpfs has no direct I/O";
  if (!rocksdb_batched_reads_available())
    std::printf("io_uring is not available here: both runs read one block at a time\n");
  for (const bool batched : {true, false})
    for (const std::size_t width : {std::size_t{900}, tuning_width}) {
      SCOPED_TRACE(std::string(batched ? "batched" : "one by one") + ", width " +
                   std::to_string(width));
      const auto before = rocksdb_batched_reads_done();
      auto o =
          base_options(dir.sub(std::string("db") + (batched ? "b" : "s") + std::to_string(width)));
      o.row_width = width;
      o.use_direct_reads = true;
      o.batched_direct_reads = batched;
      o.read_path = rocksdb_read_path::multi_get;  // the blocks a MultiGet reads
      o.batch_keys = 256;
      o.read_threads = 4;
      round_trip(o, width == tuning_width ? 20000 : 3000);
      const auto after = rocksdb_batched_reads_done();
      // The wide rows' reads went through the ring, several blocks at a time, where it can
      // be used; nothing did when the option is off.
      if (batched && width != tuning_width && rocksdb_batched_reads_available()) {
        EXPECT_GT(after.multi_reads, before.multi_reads);
        EXPECT_GT(after.blocks - before.blocks, 2 * (after.multi_reads - before.multi_reads));
      }
      if (!batched) EXPECT_EQ(after.blocks, before.blocks);
    }
}

// Pulls `keys` (rows of salt 1, `width` floats) and counts the rows that come back wrong.
std::size_t wrong_rows(rocksdb_store<key>& s, const std::vector<key>& keys, std::size_t width) {
  std::vector<float> out(keys.size() * width);
  std::unique_ptr<bool[]> found(new bool[keys.size()]);
  if (!s.pull(keys.data(), keys.size(), out.data(), found.get()).ok()) return keys.size();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    bool same = found[i];
    for (std::size_t j = 0; same && j < width; ++j)
      same = out[i * width + j] == row_value(keys[i], j, 1);
    bad += !same;
  }
  return bad;
}

// A ring set up before fork() is shared by both processes' copies of it: each must read
// through a ring of its own, or one reaps the other's completions (rows of the wrong reads, or
// reads still landing after their pull returned). Parent and child pull at the same time after
// the fork; with one read thread the caller's thread, the one that forks, does the reads (strace
// -f shows the child setting up its ring).
TEST(rocksdb_tuning, batched_direct_reads_work_in_a_forked_child_and_after_it) {
  scratch_dir dir;
  if (on_tmpfs(dir.path())) GTEST_SKIP() << "tmpfs has no direct I/O";
  if (!rocksdb_batched_reads_available()) GTEST_SKIP() << "io_uring is not available here";
  const std::size_t width = 900;
  auto o = base_options(dir.sub("db"));
  o.row_width = width;
  o.use_direct_reads = true;
  o.read_path = rocksdb_read_path::multi_get;  // the blocks a MultiGet reads
  o.read_threads = 1;
  auto r = rocksdb_store<key>::open(o);
  EMBCACHE_ASSERT_OK(r);
  auto& s = *r.value();
  auto keys = make_keys<key>(2000);
  EMBCACHE_ASSERT_OK(s.push(keys.data(), keys.size(), make_rows(keys, width, 1).data()));
  EMBCACHE_ASSERT_OK(s.flush());
  // Every other key in the table's order: blocks that are not neighbours, which RocksDB would
  // otherwise merge into one read.
  std::sort(keys.begin(), keys.end());
  std::vector<key> sparse;
  for (std::size_t i = 0; i < keys.size(); i += 2) sparse.push_back(keys[i]);
  keys = std::move(sparse);
  ASSERT_EQ(wrong_rows(s, keys, width), 0u);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  constexpr int pulls = 8;
  const auto before = rocksdb_batched_reads_done();
  if (child == 0) {
    ::alarm(60);  // a child stuck on a lock another thread held at the fork ends, and fails
    std::size_t bad = 0;
    for (int i = 0; i < pulls; ++i) bad += wrong_rows(s, keys, width);
    // Every pull of the child batched its reads: it had a ring of its own.
    const auto after = rocksdb_batched_reads_done();
    const bool batched = after.multi_reads - before.multi_reads >= pulls;
    ::_exit(bad != 0 ? 1 : batched ? 0 : 2);
  }
  std::size_t bad = 0;
  for (int i = 0; i < pulls; ++i) bad += wrong_rows(s, keys, width);
  EXPECT_GE(rocksdb_batched_reads_done().multi_reads - before.multi_reads, std::uint64_t{pulls});
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  // Exit code 1: wrong rows; 2: the child's pulls did not all batch.
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(wrong_rows(s, keys, width), 0u);
}

TEST(rocksdb_tuning, universal_compaction_and_a_set_block_size_read_back_every_row) {
  scratch_dir dir;
  auto o = base_options(dir.sub("db"));
  o.compaction = rocksdb_compaction::universal;
  o.block_bytes = 8192;
  o.partition_index_and_filters = true;
  o.bloom_bits_per_key = 0;
  o.read_threads = 3;
  round_trip(o);
}

// The mean data block of the SST files of `table` in the closed database at `path`.
double mean_block_bytes(const std::string& path, const std::string& table) {
  rocksdb::Options opt;
  std::vector<rocksdb::ColumnFamilyDescriptor> descs{
      {rocksdb::kDefaultColumnFamilyName, opt}, {"a", opt}, {"b", opt}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  EXPECT_TRUE(rocksdb::DB::OpenForReadOnly(opt, path, descs, &handles, &raw).ok());
  if (!raw) return 0;
  std::unique_ptr<rocksdb::DB> db(raw);
  rocksdb::TablePropertiesCollection props;
  EXPECT_TRUE(db->GetPropertiesOfAllTables(handles[table == "a" ? 1 : 2], &props).ok());
  double bytes = 0, blocks = 0;
  for (const auto& [file, p] : props) {
    bytes += static_cast<double>(p->data_size);
    blocks += static_cast<double>(p->num_data_blocks);
  }
  for (auto* h : handles) EXPECT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
  return blocks > 0 ? bytes / blocks : 0;
}

// Two tables of one database, one with 16 KiB blocks, one derived (4 KiB): reopened through the
// other's options, each keeps its blocks, for flushed and ingested rows alike; another nonzero
// size on reopening is refused naming both.
TEST(rocksdb_tuning, each_table_keeps_its_blocks_across_reopens) {
  scratch_dir dir;
  auto oa = base_options(dir.sub("db"));
  oa.table_name = "a";
  oa.block_bytes = 16384;
  auto ob = oa;
  ob.table_name = "b";
  ob.block_bytes = 0;
  // Opens the database through `opener`'s options, writes `n` rows into both tables, closes it;
  // then each table's files have its blocks.
  const auto write_both = [&](const rocksdb_store_options& opener, std::size_t n, int stamp) {
    const auto keys = make_keys<key>(n, stamp);
    {
      auto db = rocksdb_database::open(opener);
      EMBCACHE_ASSERT_OK(db);
      for (const auto* o : {&oa, &ob}) {
        auto r = rocksdb_store<key>::open(db.value(), *o);
        EMBCACHE_ASSERT_OK(r);
        EMBCACHE_ASSERT_OK(
            r.value()->push(keys.data(), keys.size(), make_rows(keys, tuning_width, stamp).data()));
        EMBCACHE_ASSERT_OK(r.value()->flush());
      }
    }
    EXPECT_GT(mean_block_bytes(dir.sub("db"), "a"), 8192.0);
    EXPECT_LT(mean_block_bytes(dir.sub("db"), "b"), 4096.0);
  };
  write_both(oa, 4000, 1);
  // Reopened through b's options, with a's block size left to the table; a push past the
  // write buffer (30000 rows of 104 bytes, 1 MiB) is ingested as SST files of a's blocks.
  for (auto* o : {&oa, &ob}) o->existing_rows = existing_rows_policy::reuse;
  oa.block_bytes = 0;
  write_both(ob, 30000, 2);
  oa.block_bytes = 8192;
  auto refused = rocksdb_store<key>::open(oa);
  EXPECT_EQ(refused.get_status().code(), status_code::invalid_argument);
  EXPECT_NE(refused.get_status().message().find(
                "the table's SST data blocks are 16384 bytes, set when it was created; "
                "block_bytes 8192 cannot change them (0 keeps them)"),
            std::string::npos)
      << refused.get_status().message();
}

// Rows in three sorted runs and the memtable (rewritten, erased and new keys among them), read
// by each path: dense pulls with absent keys between, a sparse pull, repeated keys, keys past
// both ends. Every path gives the rows of a map kept beside the table.
TEST(rocksdb_tuning, every_read_path_reads_the_rows_written) {
  scratch_dir dir;
  const std::size_t width = tuning_width, n = 6000;
  auto keys = make_keys<key>(n);
  std::map<key, int> salt;  // the model: each present key's rows salt
  for (const auto path :
       {rocksdb_read_path::multi_get, rocksdb_read_path::scan, rocksdb_read_path::automatic}) {
    SCOPED_TRACE("read path " + std::to_string(static_cast<int>(path)));
    auto o = base_options(dir.sub("db" + std::to_string(static_cast<int>(path))));
    o.read_path = path;
    o.scan_batch_keys = 100;
    o.scan_readahead_bytes = 8192;
    o.block_bytes = 1024;
    o.read_threads = 3;
    o.ingest_bytes = SIZE_MAX;
    auto r = rocksdb_store<key>::open(o);
    EMBCACHE_ASSERT_OK(r);
    auto& s = *r.value();
    salt.clear();
    const auto write = [&](std::size_t b, std::size_t e, std::size_t step, int v) {
      std::vector<key> k;
      for (std::size_t i = b; i < e; i += step) k.push_back(keys[i]);
      EMBCACHE_ASSERT_OK(s.push(k.data(), k.size(), make_rows(k, width, v).data()));
      for (key x : k) salt[x] = v;
    };
    write(0, n / 2, 1, 1);
    EMBCACHE_ASSERT_OK(s.flush());
    write(n / 4, n, 1, 2);
    EMBCACHE_ASSERT_OK(s.flush());
    write(0, n, 3, 3);
    EMBCACHE_ASSERT_OK(s.flush());
    write(1, n, 5, 4);  // in the memtable only
    std::vector<key> gone;
    for (std::size_t i = 2; i < n; i += 7) gone.push_back(keys[i]);
    EMBCACHE_ASSERT_OK(s.erase(gone.data(), gone.size()));
    for (key x : gone) salt.erase(x);
    auto absent = make_keys<key>(400, 3);
    std::vector<key> dense = keys;
    dense.insert(dense.end(), absent.begin(), absent.end());
    std::shuffle(dense.begin(), dense.end(), std::mt19937_64(7));
    std::vector<key> sparse;
    for (std::size_t i = 0; i < n; i += 301) sparse.push_back(keys[i]);
    std::vector<key> edges = {std::numeric_limits<key>::min(),
                              std::numeric_limits<key>::max(),
                              keys[10],
                              keys[10],
                              keys[11],
                              absent[0],
                              absent[0]};
    for (const auto* q : {&dense, &sparse, &edges}) {
      std::vector<float> out(q->size() * width, -1.0f);
      std::vector<std::uint64_t> vers(q->size());
      std::unique_ptr<bool[]> found(new bool[q->size()]);
      EMBCACHE_ASSERT_OK(s.pull(q->data(), q->size(), out.data(), found.get(), vers.data()));
      std::size_t bad = 0;
      for (std::size_t i = 0; i < q->size(); ++i) {
        const auto it = salt.find((*q)[i]);
        bad += found[i] != (it != salt.end());
        if (it != salt.end())
          for (std::size_t j = 0; j < width; ++j)
            bad += out[i * width + j] != row_value((*q)[i], j, it->second);
      }
      EXPECT_EQ(bad, 0u) << q->size() << " keys";
      std::unique_ptr<bool[]> there(new bool[q->size()]);
      EMBCACHE_ASSERT_OK(s.contains(q->data(), q->size(), there.get()));
      for (std::size_t i = 0; i < q->size(); ++i) bad += there[i] != found[i];
      EXPECT_EQ(bad, 0u) << "contains, " << q->size() << " keys";
    }
    const rocksdb_read_counts c = s.read_counts();
    if (path == rocksdb_read_path::multi_get) EXPECT_EQ(c.keys_scanned, 0u);
    if (path == rocksdb_read_path::scan) {
      EXPECT_EQ(c.keys_looked_up, 0u);
      EXPECT_GT(c.scan_seeks, 0u);  // the sparse pull moves on by seeks
    }
  }
}

// read_path automatic: a dense pull scans; pulls whose keys lie far apart in the table turn to
// point lookups once the scans' cost says so, with a scanned probe batch once in
// rocksdb_scan_probe_interval calls; dense pulls again are scanned again after a probe.
TEST(rocksdb_tuning, automatic_reads_scan_dense_pulls_and_look_up_sparse_ones) {
  scratch_dir dir;
  auto o = base_options(dir.sub("db"));
  o.scan_batch_keys = 8;
  std::vector<key> all(20000);
  std::iota(all.begin(), all.end(), key{0});
  auto r = rocksdb_store<key>::open(o);
  EMBCACHE_ASSERT_OK(r);
  auto& s = *r.value();
  EMBCACHE_ASSERT_OK(s.push(all.data(), all.size(), make_rows(all, tuning_width, 1).data()));
  EMBCACHE_ASSERT_OK(s.flush());
  std::vector<float> out(all.size() * tuning_width);
  std::unique_ptr<bool[]> found(new bool[all.size()]);
  const auto pull = [&](const std::vector<key>& q) {
    EMBCACHE_ASSERT_OK(s.pull(q.data(), q.size(), out.data(), found.get()));
    for (std::size_t i = 0; i < q.size(); ++i) ASSERT_TRUE(found[i]) << q[i];
  };
  pull(all);
  rocksdb_read_counts c = s.read_counts();
  EXPECT_EQ(c.keys_scanned, all.size());
  EXPECT_EQ(c.keys_looked_up, 0u);
  std::vector<key> sparse;  // 999 rows between neighbours: each key costs 16 steps and a seek
  for (key k = 0; k < 20000; k += 1000) sparse.push_back(k);
  for (int i = 0; i < 8; ++i) pull(sparse);
  const rocksdb_read_counts turned = s.read_counts();
  EXPECT_GT(turned.keys_looked_up, 0u) << "sparse pulls never turned to point lookups";
  for (std::uint32_t i = 0; i < 2 * rocksdb_scan_probe_interval; ++i) pull(sparse);
  c = s.read_counts();
  // Two probes of (at most rocksdb_scan_probe_keys) keys each, every other key looked up.
  const std::size_t probe = std::min<std::size_t>(sparse.size(), rocksdb_scan_probe_keys);
  EXPECT_EQ(c.keys_scanned - turned.keys_scanned, 2 * probe);
  EXPECT_EQ(c.keys_looked_up - turned.keys_looked_up,
            2 * rocksdb_scan_probe_interval * sparse.size() - 2 * probe);
  std::vector<key> dense(all.begin(), all.begin() + 4000);
  for (std::uint32_t i = 0; i < rocksdb_scan_probe_interval; ++i) pull(dense);
  c = s.read_counts();
  pull(dense);
  EXPECT_EQ(s.read_counts().keys_scanned - c.keys_scanned, dense.size())
      << "dense pulls were not scanned again";
}

}  // namespace
}  // namespace embcache::test
#endif  // EMBCACHE_TEST_ROCKSDB
