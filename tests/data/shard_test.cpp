#include "embcache/shard.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <set>

#include "common/status_assertions.hpp"
#include "embcache/keyset.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

using test::read_bytes;
using test::scratch_dir;
using test::write_bytes;

// Sample i has distinct, recognisable values everywhere.
criteo_sample make_sample(int i) {
  criteo_sample s;
  s.label = static_cast<float>(i % 2);
  for (std::size_t j = 0; j < criteo_dense_count; ++j) s.dense[j] = i + 0.25f * j;
  for (std::size_t j = 0; j < criteo_slot_count; ++j) s.keys[j] = 1000 * (i % 5) + j;
  return s;
}

void make_crossed(int i, std::int64_t* out) {
  out[0] = -i;
  out[1] = 7 * i;
}

std::string write_shard(const std::string& path, int first, int n, std::size_t crossed = 2) {
  auto w = shard_writer::create(path, crossed);
  EMBCACHE_EXPECT_OK(w);
  for (int i = first; i < first + n; ++i) {
    std::int64_t c[2];
    make_crossed(i, c);
    EMBCACHE_EXPECT_OK(w.value()->append(make_sample(i), crossed ? c : nullptr));
  }
  EMBCACHE_EXPECT_OK(w.value()->finish());
  return path;
}

void expect_sample(const shard_batch& b, std::size_t k, int i) {
  const criteo_sample s = make_sample(i);
  EXPECT_EQ(b.labels[k], s.label);
  for (std::size_t j = 0; j < criteo_dense_count; ++j) {
    EXPECT_EQ(b.dense[k * criteo_dense_count + j], s.dense[j]);
  }
  for (std::size_t j = 0; j < criteo_slot_count; ++j) {
    EXPECT_EQ(b.keys[k * criteo_slot_count + j], s.keys[j]);
  }
  std::int64_t c[2];
  make_crossed(i, c);
  for (std::size_t j = 0; j < b.num_crossed; ++j) EXPECT_EQ(b.crossed[k * b.num_crossed + j], c[j]);
}

TEST(shard, writer_and_read_shard_round_trip) {
  scratch_dir dir;
  write_shard(dir / "s.bin", 0, 5);
  EXPECT_EQ(std::filesystem::file_size(dir / "s.bin"), 64u + 5 * (56 + 8 * 28));
  auto h = read_shard_header(dir / "s.bin");
  EMBCACHE_ASSERT_OK(h);
  EXPECT_EQ(h.value().rows, 5u);
  EXPECT_EQ(h.value().num_crossed, 2u);
  EXPECT_EQ(h.value().record_size, 56u + 8 * 28);
  auto d = read_shard(dir / "s.bin");
  EMBCACHE_ASSERT_OK(d);
  for (int i = 0; i < 5; ++i) {
    criteo_sample s;
    std::int64_t c[2];
    d.value().get(i, s, c);
    const criteo_sample e = make_sample(i);
    EXPECT_EQ(s.label, e.label);
    EXPECT_EQ(s.dense, e.dense);
    EXPECT_EQ(s.keys, e.keys);
    EXPECT_EQ(c[0], -i);
    EXPECT_EQ(c[1], 7 * i);
    EXPECT_EQ(d.value().label(i), e.label);
  }
}

TEST(shard_reader, batches_in_order_never_span_shards) {
  scratch_dir dir;
  const auto a = write_shard(dir / "a.bin", 0, 7);
  const auto b = write_shard(dir / "b.bin", 7, 5);
  for (bool ahead : {true, false}) {
    shard_reader_options o;
    o.batch_size = 3;
    o.read_ahead = ahead;
    auto r = shard_reader::open({a, b}, o);
    EMBCACHE_ASSERT_OK(r);
    EXPECT_EQ(r.value()->total_rows(), 12u);
    EXPECT_EQ(r.value()->num_shards(), 2u);
    EXPECT_EQ(r.value()->num_crossed(), 2u);
    std::vector<std::size_t> sizes, shards;
    int next = 0;
    shard_batch batch;
    while (true) {
      EMBCACHE_ASSERT_OK(r.value()->next(batch));
      if (batch.size == 0) break;
      sizes.push_back(batch.size);
      shards.push_back(batch.shard_index);
      for (std::size_t k = 0; k < batch.size; ++k) expect_sample(batch, k, next++);
    }
    EXPECT_EQ(sizes, (std::vector<std::size_t>{3, 3, 1, 3, 2}));
    EXPECT_EQ(shards, (std::vector<std::size_t>{0, 0, 0, 1, 1}));
    EXPECT_EQ(next, 12);
    // Exhausted stays exhausted.
    EMBCACHE_ASSERT_OK(r.value()->next(batch));
    EXPECT_EQ(batch.size, 0u);
  }
}

TEST(shard_reader, drop_last_skips_partial_batches) {
  scratch_dir dir;
  const auto a = write_shard(dir / "a.bin", 0, 7);
  const auto e = write_shard(dir / "e.bin", 7, 0);
  const auto b = write_shard(dir / "b.bin", 7, 2);
  const auto c = write_shard(dir / "c.bin", 9, 3);
  shard_reader_options o;
  o.batch_size = 3;
  o.drop_last = true;
  auto r = shard_reader::open({a, e, b, c}, o);
  EMBCACHE_ASSERT_OK(r);
  std::vector<std::size_t> shards;
  shard_batch batch;
  while (r.value()->next(batch).ok() && batch.size) {
    EXPECT_EQ(batch.size, 3u);
    shards.push_back(batch.shard_index);
  }
  EXPECT_EQ(shards, (std::vector<std::size_t>{0, 0, 3}));
}

std::vector<std::uint64_t> read_order(const std::vector<std::string>& paths,
                                      const shard_reader_options& o) {
  auto r = shard_reader::open(paths, o);
  EMBCACHE_EXPECT_OK(r);
  std::vector<std::uint64_t> order;
  shard_batch batch;
  while (r.value()->next(batch).ok() && batch.size) {
    for (std::size_t k = 0; k < batch.size; ++k) {
      order.push_back(batch.shard_index * 1000 + batch.rows[k]);
      // The row index says which sample it is: the data travels with it.
      expect_sample(batch, k, static_cast<int>(batch.shard_index * 50 + batch.rows[k]));
    }
  }
  return order;
}

TEST(shard_reader, seeded_shuffle_is_a_permutation_within_each_shard) {
  scratch_dir dir;
  const auto a = write_shard(dir / "a.bin", 0, 50);
  const auto b = write_shard(dir / "b.bin", 50, 50);
  shard_reader_options o;
  o.batch_size = 8;
  o.shuffle = true;
  o.seed = 11;
  const auto first = read_order({a, b}, o);
  ASSERT_EQ(first.size(), 100u);
  // Shard 0's rows all come before shard 1's, each shard's rows exactly once.
  std::vector<std::uint64_t> s0(first.begin(), first.begin() + 50);
  std::vector<std::uint64_t> s1(first.begin() + 50, first.end());
  std::sort(s0.begin(), s0.end());
  std::sort(s1.begin(), s1.end());
  std::vector<std::uint64_t> expect0(50), expect1(50);
  std::iota(expect0.begin(), expect0.end(), 0);
  std::iota(expect1.begin(), expect1.end(), 1000);
  EXPECT_EQ(s0, expect0);
  EXPECT_EQ(s1, expect1);
  std::vector<std::uint64_t> in_order(first.begin(), first.begin() + 50);
  EXPECT_NE(in_order, expect0);
  // Two shards with equal content still get different orders (the index is mixed in).
  std::vector<std::uint64_t> second_shard(first.begin() + 50, first.end());
  for (auto& x : second_shard) x -= 1000;
  EXPECT_NE(second_shard, in_order);

  EXPECT_EQ(read_order({a, b}, o), first);
  o.read_ahead = false;
  EXPECT_EQ(read_order({a, b}, o), first);
  o.seed = 12;
  EXPECT_NE(read_order({a, b}, o), first);
}

TEST(shard_reader, truncated_shard_is_refused_at_open) {
  scratch_dir dir;
  const auto a = write_shard(dir / "a.bin", 0, 4);
  auto bytes = read_bytes(a);
  bytes.resize(bytes.size() - 10);
  write_bytes(a, bytes);
  auto r = shard_reader::open({a});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.get_status().code(), status_code::corruption);
  EXPECT_NE(r.get_status().message().find(a), std::string::npos);
  EXPECT_NE(r.get_status().message().find("(truncated)"), std::string::npos);

  bytes.resize(20);
  write_bytes(a, bytes);
  EXPECT_EQ(shard_reader::open({a}).get_status().code(), status_code::corruption);
  EXPECT_EQ(shard_reader::open({dir / "missing.bin"}).get_status().code(), status_code::not_found);
}

TEST(shard_reader, damaged_record_stops_the_reader_at_that_shard) {
  scratch_dir dir;
  const auto a = write_shard(dir / "a.bin", 0, 4);
  const auto b = write_shard(dir / "b.bin", 4, 4);
  auto bytes = read_bytes(b);
  bytes[64 + 100] ^= 1;
  write_bytes(b, bytes);
  for (bool ahead : {true, false}) {
    shard_reader_options o;
    o.batch_size = 4;
    o.read_ahead = ahead;
    auto r = shard_reader::open({a, b}, o);
    EMBCACHE_ASSERT_OK(r);  // headers are intact
    shard_batch batch;
    EMBCACHE_ASSERT_OK(r.value()->next(batch));
    EXPECT_EQ(batch.size, 4u);
    status s = r.value()->next(batch);
    EXPECT_EQ(s.code(), status_code::corruption);
    EXPECT_NE(s.message().find(b), std::string::npos);
    EXPECT_NE(s.message().find("record checksum mismatch"), std::string::npos);
    EXPECT_EQ(batch.size, 0u);
    EXPECT_EQ(r.value()->next(batch).code(), status_code::corruption);
  }
  // A damaged header is caught by its own checksum.
  bytes = read_bytes(a);
  bytes[20] ^= 1;
  write_bytes(a, bytes);
  auto r = shard_reader::open({a});
  EXPECT_EQ(r.get_status().code(), status_code::corruption);
  EXPECT_NE(r.get_status().message().find("header checksum mismatch"), std::string::npos);
}

TEST(shard_reader, refuses_shards_with_different_layouts_and_zero_batch) {
  scratch_dir dir;
  const auto a = write_shard(dir / "a.bin", 0, 2, 2);
  const auto b = write_shard(dir / "b.bin", 0, 2, 0);
  auto r = shard_reader::open({a, b});
  EXPECT_EQ(r.get_status().code(), status_code::invalid_argument);
  shard_reader_options o;
  o.batch_size = 0;
  EXPECT_THROW((void)shard_reader::open({a}, o), error);
}

TEST(dataset_writer, splits_into_shards_with_one_keyset_each) {
  scratch_dir dir;
  dataset_writer_options o;
  o.output_dir = dir / "ds";
  o.rows_per_shard = 4;
  o.num_crossed = 2;
  auto w = dataset_writer::create(o);
  EMBCACHE_ASSERT_OK(w);
  for (int i = 0; i < 10; ++i) {
    std::int64_t c[2];
    make_crossed(i, c);
    EMBCACHE_ASSERT_OK(w.value()->append(make_sample(i), c));
  }
  EMBCACHE_ASSERT_OK(w.value()->finish({{"tool", "test"}}));
  const dataset_summary& s = w.value()->summary();
  EXPECT_EQ(s.rows, 10u);
  EXPECT_DOUBLE_EQ(s.label_mean, 0.5);
  ASSERT_EQ(s.shards.size(), 3u);
  EXPECT_EQ(s.shards[0].rows, 4u);
  EXPECT_EQ(s.shards[2].rows, 2u);
  EXPECT_EQ(s.shards[1].shard, (std::filesystem::path(o.output_dir) / "shard-00001.bin").string());
  EXPECT_EQ(s.shards[1].keyset,
            (std::filesystem::path(o.output_dir) / "shard-00001.keys").string());
  // Slot j holds 1000 * (i % 5) + j: five distinct values per slot over 10 rows.
  for (std::size_t j = 0; j < criteo_slot_count; ++j) EXPECT_EQ(s.unique_keys[j], 5u);
  EXPECT_EQ(s.unique_crossed_keys, 19u);  // -0 and 7*0 coincide

  for (const auto& f : s.shards) {
    auto d = read_shard(f.shard);
    EMBCACHE_ASSERT_OK(d);
    std::set<std::int64_t> keys, crossed;
    for (std::uint64_t i = 0; i < d.value().header.rows; ++i) {
      criteo_sample x;
      std::int64_t c[2];
      d.value().get(i, x, c);
      keys.insert(x.keys.begin(), x.keys.end());
      crossed.insert(c, c + 2);
    }
    auto k = read_keyset<std::int64_t>(f.keyset);
    EMBCACHE_ASSERT_OK(k);
    EXPECT_EQ(k.value(), std::vector<std::int64_t>(keys.begin(), keys.end()));
    auto kc = read_keyset<std::int64_t>(f.crossed_keyset);
    EMBCACHE_ASSERT_OK(kc);
    EXPECT_EQ(kc.value(), std::vector<std::int64_t>(crossed.begin(), crossed.end()));
  }

  auto m = read_dataset_manifest(o.output_dir);
  EMBCACHE_ASSERT_OK(m);
  EXPECT_EQ(m.value().rows, 10u);
  EXPECT_EQ(m.value().num_crossed, 2u);
  EXPECT_EQ(m.value().unique_keys, s.unique_keys);
  ASSERT_EQ(m.value().shards.size(), 3u);
  EXPECT_EQ(m.value().shards[2].crossed_keyset, s.shards[2].crossed_keyset);
  EXPECT_EQ(m.value().producer,
            (std::vector<std::pair<std::string, std::string>>{{"tool", "test"}}));
}

TEST(dataset_writer, refuses_an_existing_dataset_unless_overwriting) {
  scratch_dir dir;
  dataset_writer_options o;
  o.output_dir = dir / "ds";
  o.rows_per_shard = 2;
  auto w = dataset_writer::create(o);
  EMBCACHE_ASSERT_OK(w);
  for (int i = 0; i < 6; ++i) EMBCACHE_ASSERT_OK(w.value()->append(make_sample(i)));
  EMBCACHE_ASSERT_OK(w.value()->finish());
  ASSERT_TRUE(std::filesystem::exists(dir / "ds/shard-00002.bin"));

  auto again = dataset_writer::create(o);
  EXPECT_EQ(again.get_status().code(), status_code::invalid_argument);
  write_bytes(dir / "ds/notes.txt", {'x'});
  o.overwrite = true;
  again = dataset_writer::create(o);
  EMBCACHE_ASSERT_OK(again);
  EMBCACHE_ASSERT_OK(again.value()->append(make_sample(0)));
  EMBCACHE_ASSERT_OK(again.value()->finish());
  // Stale shards of the bigger run are gone; other files are left alone.
  EXPECT_FALSE(std::filesystem::exists(dir / "ds/shard-00002.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir / "ds/shard-00001.keys"));
  EXPECT_TRUE(std::filesystem::exists(dir / "ds/notes.txt"));
  EXPECT_EQ(read_dataset_manifest(o.output_dir).value().shards.size(), 1u);
}

}  // namespace
}  // namespace embcache
