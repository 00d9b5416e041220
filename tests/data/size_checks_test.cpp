// Size fields of shards, keysets and manifests against the real file sizes: a header that
// claims more than the file holds is refused with a message naming the file and the field, even
// when its checksum is valid and its products overflow 64 bits.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "common/status_assertions.hpp"
#include "embcache/keyset.hpp"
#include "embcache/shard.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

using test::contains;
using test::read_bytes;
using test::scratch_dir;
using test::write_bytes;
using test::write_text;

criteo_sample sample(int i) {
  criteo_sample s;
  s.label = static_cast<float>(i % 2);
  for (std::size_t j = 0; j < criteo_dense_count; ++j) s.dense[j] = static_cast<float>(i + j);
  for (std::size_t j = 0; j < criteo_slot_count; ++j) s.keys[j] = 100 * i + j;
  return s;
}

void write_one_shard(const std::string& path, int rows) {
  auto w = shard_writer::create(path, 0);
  EMBCACHE_ASSERT_OK(w);
  for (int i = 0; i < rows; ++i) EMBCACHE_ASSERT_OK(w.value()->append(sample(i)));
  EMBCACHE_ASSERT_OK(w.value()->finish());
}

// Sets the header's row count and recomputes the header checksum, as a forger would.
void set_rows_with_valid_checksum(const std::string& path, std::uint64_t rows) {
  std::vector<char> b = read_bytes(path);
  ASSERT_GE(b.size(), shard_header_size);
  std::memcpy(b.data() + 16, &rows, 8);
  const std::uint64_t h = XXH64(b.data(), 56, 0);
  std::memcpy(b.data() + 56, &h, 8);
  write_bytes(path, b);
}

// ---- shards ---------------------------------------------------------------------------------

TEST(size_checks, shard_row_count_that_overflows_is_refused) {
  scratch_dir dir;
  const std::string path = dir / "s.bin";
  write_one_shard(path, 1);
  const std::uint64_t record = shard_record_size(0);
  ASSERT_EQ(record, 264u);  // 8 * 33: (1 + 2^61) records of it wrap around to one record
  set_rows_with_valid_checksum(path, (std::uint64_t{1} << 61) + 1);

  auto h = read_shard_header(path);
  ASSERT_EQ(h.get_status().code(), status_code::corruption) << h.get_status().to_string();
  EXPECT_TRUE(contains(h.get_status().message(), path));
  EXPECT_TRUE(contains(h.get_status().message(), "rows = 2305843009213693953"))
      << h.get_status().message();
  EXPECT_TRUE(contains(h.get_status().message(), "overflows")) << h.get_status().message();

  auto d = read_shard(path);
  ASSERT_EQ(d.get_status().code(), status_code::corruption);
  EXPECT_TRUE(contains(d.get_status().message(), "overflows"));

  auto r = shard_reader::open({path}, {});
  ASSERT_EQ(r.get_status().code(), status_code::corruption);
  EXPECT_TRUE(contains(r.get_status().message(), path));
}

TEST(size_checks, shard_row_count_beyond_the_file_is_truncation) {
  scratch_dir dir;
  const std::string path = dir / "s.bin";
  write_one_shard(path, 3);
  set_rows_with_valid_checksum(path, 4);
  auto h = read_shard_header(path);
  ASSERT_EQ(h.get_status().code(), status_code::corruption);
  EXPECT_TRUE(contains(h.get_status().message(), "(truncated)")) << h.get_status().message();
  set_rows_with_valid_checksum(path, 2);
  auto d = read_shard(path);
  ASSERT_EQ(d.get_status().code(), status_code::corruption);
  EXPECT_TRUE(contains(d.get_status().message(),
                       "header says 2 records (592 bytes) but the file "
                       "has 856 bytes"))
      << d.get_status().message();
}

TEST(size_checks, folder_given_as_shard_or_keyset_is_named) {
  scratch_dir dir;
  auto h = read_shard_header(dir.path());
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(contains(h.get_status().message(), "not a regular file"))
      << h.get_status().to_string();
  auto k = read_keyset<std::int64_t>(dir.path());
  ASSERT_FALSE(k.ok());
  EXPECT_TRUE(contains(k.get_status().message(), "not a regular file"))
      << k.get_status().to_string();
}

// ---- keysets --------------------------------------------------------------------------------

// Our keyset holding `keys`, with the header's count replaced by `count`.
void write_keyset_claiming(const std::string& path, const std::vector<std::int64_t>& keys,
                           std::uint64_t count) {
  EMBCACHE_ASSERT_OK(write_keyset(path, keys.data(), keys.size()));
  std::vector<char> b = read_bytes(path);
  std::memcpy(b.data() + 16, &count, 8);
  write_bytes(path, b);
}

TEST(size_checks, keyset_count_that_overflows_is_truncation_not_a_wrapped_size) {
  scratch_dir dir;
  const std::string path = dir / "k";
  // (2^61 + 1) * 8 wraps around to 8 bytes: exactly the one key that follows the header.
  write_keyset_claiming(path, {5}, (std::uint64_t{1} << 61) + 1);
  auto k = read_keyset<std::int64_t>(path);
  ASSERT_EQ(k.get_status().code(), status_code::corruption);
  const std::string m = k.get_status().message();
  EXPECT_TRUE(contains(m, path)) << m;
  EXPECT_TRUE(contains(m, "count = 2305843009213693953")) << m;
  EXPECT_TRUE(contains(m, "overflows")) << m;
  EXPECT_TRUE(contains(m, "(truncated)")) << m;
  EXPECT_FALSE(contains(m, "(8 bytes)")) << m;  // never the wrapped size
}

TEST(size_checks, keyset_count_against_the_payload_both_ways) {
  scratch_dir dir;
  const std::string path = dir / "k";
  write_keyset_claiming(path, {1, 2, 3}, 4);
  auto more = read_keyset<std::int64_t>(path);
  ASSERT_EQ(more.get_status().code(), status_code::corruption);
  EXPECT_TRUE(contains(more.get_status().message(),
                       "header says 4 keys (32 bytes) but 24 bytes follow the header (truncated)"))
      << more.get_status().message();
  write_keyset_claiming(path, {1, 2, 3}, 2);
  auto fewer = read_keyset<std::int64_t>(path);
  ASSERT_EQ(fewer.get_status().code(), status_code::corruption);
  EXPECT_TRUE(contains(fewer.get_status().message(),
                       "header says 2 keys (16 bytes) but 24 bytes follow the header (oversized)"))
      << fewer.get_status().message();
  // uint32 keysets: the same checks with 4-byte keys.
  const std::vector<std::uint32_t> small = {7, 9};
  EMBCACHE_ASSERT_OK(write_keyset(path, small.data(), small.size()));
  std::vector<char> b = read_bytes(path);
  const std::uint64_t huge = (std::uint64_t{1} << 62) + 2;  // * 4 wraps around to 8
  std::memcpy(b.data() + 16, &huge, 8);
  write_bytes(path, b);
  auto u = read_keyset<std::uint32_t>(path);
  ASSERT_EQ(u.get_status().code(), status_code::corruption);
  EXPECT_TRUE(contains(u.get_status().message(), "overflows")) << u.get_status().message();
}

TEST(size_checks, raw_keyset_of_an_odd_size_is_refused) {
  scratch_dir dir;
  const std::string path = dir / "raw";
  write_bytes(path, std::vector<char>(12, 1));
  auto k = read_keyset<std::int64_t>(path, keyset_format::hugectr_raw);
  ASSERT_EQ(k.get_status().code(), status_code::corruption);
  EXPECT_TRUE(contains(k.get_status().message(), "not a multiple of the key size 8"));
  auto u = read_keyset<std::uint32_t>(path, keyset_format::hugectr_raw);
  EMBCACHE_ASSERT_OK(u);
  EXPECT_EQ(u.value().size(), 1u);  // three equal keys
}

// ---- manifests ------------------------------------------------------------------------------

// A real two-shard dataset; tests then edit its manifest.json text.
class manifest_checks : public ::testing::Test {
 protected:
  void SetUp() override {
    dataset_writer_options o;
    o.output_dir = dir_ / "ds";
    o.rows_per_shard = 2;
    auto w = dataset_writer::create(o);
    EMBCACHE_ASSERT_OK(w);
    for (int i = 0; i < 3; ++i) EMBCACHE_ASSERT_OK(w.value()->append(sample(i)));
    EMBCACHE_ASSERT_OK(w.value()->finish({{"tool", "test"}}));
    auto b = read_bytes(manifest());
    text_.assign(b.begin(), b.end());
    EMBCACHE_ASSERT_OK(read_dataset_manifest(dir_ / "ds"));
  }
  std::string manifest() const { return dir_ / "ds/manifest.json"; }
  // The manifest with the first `from` replaced by `to`; the error it gives.
  status with(const std::string& from, const std::string& to) {
    std::string t = text_;
    const auto at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) t.replace(at, from.size(), to);
    write_text(manifest(), t);
    auto r = read_dataset_manifest(dir_ / "ds");
    return r.ok() ? status{} : r.get_status();
  }
  void expect_refused(const std::string& from, const std::string& to, const std::string& says) {
    const status s = with(from, to);
    EXPECT_EQ(s.code(), status_code::corruption) << from << " -> " << to << ": " << s.to_string();
    EXPECT_TRUE(contains(s.message(), manifest())) << s.message();
    EXPECT_TRUE(contains(s.message(), says)) << from << " -> " << to << ": " << s.message();
  }

  scratch_dir dir_;
  std::string text_;
};

TEST_F(manifest_checks, negative_and_fractional_counts_are_refused) {
  expect_refused("\"rows\": 3", "\"rows\": -3",
                 "field rows is -3, expected a non-negative integer");
  expect_refused("\"rows\": 3", "\"rows\": 3.5", "field rows is 3.5");
  expect_refused("\"crossed_per_row\": 0", "\"crossed_per_row\": -1",
                 "field crossed_per_row is -1");
  expect_refused("\"rows\": 2", "\"rows\": -2", "field shards[0].rows is -2");
}

TEST_F(manifest_checks, huge_counts_are_refused) {
  // 2^32 + 1 would read as version 1 through a 32-bit int.
  const status v = with("\"version\": 1", "\"version\": 4294967297");
  EXPECT_EQ(v.code(), status_code::unsupported) << v.to_string();
  expect_refused("\"crossed_per_row\": 0", "\"crossed_per_row\": 70000",
                 "field crossed_per_row is 70000, at most 65535");
  expect_refused("\"rows\": 2", "\"rows\": 18446744073709551615",
                 "field shards[0].rows is 18446744073709551615");
  expect_refused("\"rows\": 3", "\"rows\": 4", "field rows is 4, but the shards hold 3 rows");
}

TEST_F(manifest_checks, keyset_sizes_are_recorded_and_checked) {
  auto m = read_dataset_manifest(dir_ / "ds");
  EMBCACHE_ASSERT_OK(m);
  const shard_files& f = m.value().shards[0];
  EXPECT_TRUE(f.has_key_counts);
  auto k = read_keyset<std::int64_t>(f.keyset);
  EMBCACHE_ASSERT_OK(k);
  EXPECT_EQ(f.keys, k.value().size());
  EXPECT_GT(f.keys, 0u);
  const std::string keys = "\"keys\": " + std::to_string(f.keys);
  expect_refused(keys, "\"keys\": 53",
                 "field shards[0].keys is 53, more than the 52 keys its 2 rows hold");
  expect_refused(keys, "\"keys\": -1", "field shards[0].keys is -1, expected a non-negative");
  expect_refused(keys, keys + ", \"crossed_keys\": 0",
                 "field shards[0].crossed_keys is present, but crossed_per_row is 0");
  // A manifest written before the sizes were recorded still reads, without them.
  EMBCACHE_ASSERT_OK(with(",\n      " + keys, ""));
  auto old = read_dataset_manifest(dir_ / "ds");
  EMBCACHE_ASSERT_OK(old);
  EXPECT_FALSE(old.value().shards[0].has_key_counts);
  EXPECT_TRUE(old.value().shards[1].has_key_counts);
}

TEST_F(manifest_checks, shard_rows_must_match_the_shard_file) {
  // Both shards claim one row and the total says 2: consistent, but the first file holds two.
  std::string t = text_;
  t.replace(t.find("\"rows\": 2"), 9, "\"rows\": 1");
  t.replace(t.find("\"rows\": 3"), 9, "\"rows\": 2");
  write_text(manifest(), t);
  auto r = read_dataset_manifest(dir_ / "ds");
  ASSERT_EQ(r.get_status().code(), status_code::corruption);
  EXPECT_TRUE(contains(r.get_status().message(), "field shards[0].rows is 1, but shard '"))
      << r.get_status().message();
  EXPECT_TRUE(contains(r.get_status().message(), "has 592 bytes")) << r.get_status().message();
}

TEST_F(manifest_checks, wrong_types_are_refused_by_field) {
  expect_refused("\"rows\": 3", "\"rows\": \"3\"", "field rows is \"3\"");
  expect_refused("\"label_mean\": ", "\"label_mean\": \"x\", \"was_label_mean\": ",
                 "field label_mean is \"x\", expected a number in [0, 1]");
  expect_refused("\"keyset_format\": \"embcache\"", "\"keyset_format\": 1",
                 "field keyset_format is 1, expected a string");
  expect_refused("\"key_type\": \"int64\"", "\"key_type\": \"uint32\"",
                 "field key_type is 'uint32', expected 'int64'");
  expect_refused("\"shards\": [", "\"shards\": {\"a\": 1}, \"was_shards\": [",
                 "field shards is {\"a\":1}, expected an array");
  expect_refused("\"file\": \"shard-00000.bin\"", "\"file\": 7",
                 "field shards[0].file is 7, expected a string");
  expect_refused("\"file\": \"shard-00000.bin\"", "\"file\": \"../outside.bin\"",
                 "field shards[0].file is \"../outside.bin\", expected a file name");
  expect_refused("\"unique_keys_per_slot\": [", "\"unique_keys_per_slot\": [1, ",
                 "field unique_keys_per_slot is [1,");
  expect_refused("\"tool\": \"test\"", "\"tool\": 5",
                 "field producer.tool is 5, expected a string");
  const status top = [&] {
    write_text(manifest(), "[1, 2]");
    return read_dataset_manifest(dir_ / "ds").get_status();
  }();
  EXPECT_EQ(top.code(), status_code::corruption);
  EXPECT_TRUE(contains(top.message(), "not a JSON object")) << top.message();
}

TEST_F(manifest_checks, a_key_given_twice_is_refused_naming_it_and_its_place) {
  expect_refused("\"rows\": 3", "\"rows\": 3, \"rows\": 2",
                 "duplicate key \"rows\" in manifest (JSON keys must be unique)");
  expect_refused("\"file\": \"shard-00000.bin\"",
                 "\"file\": \"shard-00000.bin\", \"file\": \"shard-00001.bin\"",
                 "duplicate key \"file\" in manifest.shards[0] (JSON keys must be unique)");
}

}  // namespace
}  // namespace embcache
