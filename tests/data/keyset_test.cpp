#include "embcache/keyset.hpp"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>

#include "common/status_assertions.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

using test::read_bytes;
using test::scratch_dir;
using test::write_bytes;

TEST(keyset, writes_sorted_unique_keys_and_reads_them_back) {
  scratch_dir dir;
  const std::vector<std::int64_t> keys = {42, -7, 42, 5, 1LL << 60, -7, 0};
  EMBCACHE_ASSERT_OK(write_keyset(dir / "k", keys.data(), keys.size()));
  auto back = read_keyset<std::int64_t>(dir / "k");
  EMBCACHE_ASSERT_OK(back);
  EXPECT_EQ(back.value(), (std::vector<std::int64_t>{-7, 0, 5, 42, 1LL << 60}));
  EXPECT_EQ(keys[0], 42);  // the input is left alone
  EXPECT_EQ(std::filesystem::file_size(dir / "k"), keyset_header_size + 5 * 8);
  // Nothing but the file itself is left in the folder (the temporary was renamed).
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            1);
}

TEST(keyset, header_layout_is_the_documented_one) {
  scratch_dir dir;
  const std::vector<std::uint32_t> keys = {3, 1, 2};
  EMBCACHE_ASSERT_OK(write_keyset(dir / "k", keys.data(), keys.size()));
  const auto b = read_bytes(dir / "k");
  ASSERT_EQ(b.size(), 32u + 12u);
  EXPECT_EQ(std::string(b.data(), 8), "EMBKEYS1");
  EXPECT_EQ(b[8], 1);
  EXPECT_EQ(b[9], 0);
  EXPECT_EQ(b[10], 2);  // uint32
  std::uint64_t count;
  std::memcpy(&count, b.data() + 16, 8);
  EXPECT_EQ(count, 3u);
  std::uint32_t first;
  std::memcpy(&first, b.data() + 32, 4);
  EXPECT_EQ(first, 1u);
}

TEST(keyset, empty_keyset_round_trips) {
  scratch_dir dir;
  EMBCACHE_ASSERT_OK(write_keyset<std::int64_t>(dir / "k", nullptr, 0));
  auto back = read_keyset<std::int64_t>(dir / "k");
  EMBCACHE_ASSERT_OK(back);
  EXPECT_TRUE(back.value().empty());
}

TEST(keyset, raw_format_is_bare_little_endian_keys) {
  scratch_dir dir;
  const std::vector<std::int64_t> keys = {9, 1, 9, 4};
  EMBCACHE_ASSERT_OK(
      write_keyset(dir / "raw", keys.data(), keys.size(), keyset_format::hugectr_raw));
  const auto b = read_bytes(dir / "raw");
  ASSERT_EQ(b.size(), 24u);
  std::int64_t got[3];
  std::memcpy(got, b.data(), 24);
  EXPECT_EQ(got[0], 1);
  EXPECT_EQ(got[1], 4);
  EXPECT_EQ(got[2], 9);

  // A raw file from elsewhere may be unsorted and hold duplicates.
  const std::uint32_t unsorted[5] = {7, 3, 7, 1, 3};
  std::vector<char> raw(sizeof(unsorted));
  std::memcpy(raw.data(), unsorted, sizeof(unsorted));
  write_bytes(dir / "raw32", raw);
  auto back = read_keyset<std::uint32_t>(dir / "raw32", keyset_format::hugectr_raw);
  EMBCACHE_ASSERT_OK(back);
  EXPECT_EQ(back.value(), (std::vector<std::uint32_t>{1, 3, 7}));

  raw.pop_back();
  write_bytes(dir / "raw32", raw);
  auto bad = read_keyset<std::uint32_t>(dir / "raw32", keyset_format::hugectr_raw);
  EXPECT_EQ(bad.get_status().code(), status_code::corruption);
  EXPECT_NE(bad.get_status().message().find("not a multiple of the key size 4"), std::string::npos);
}

TEST(keyset, key_type_mismatch_names_file_and_both_types) {
  scratch_dir dir;
  const std::int64_t keys[2] = {1, 2};
  EMBCACHE_ASSERT_OK(write_keyset(dir / "k64", keys, 2));
  auto r = read_keyset<std::uint32_t>(dir / "k64");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.get_status().code(), status_code::invalid_argument);
  const std::string& m = r.get_status().message();
  EXPECT_NE(m.find(dir / "k64"), std::string::npos) << m;
  EXPECT_NE(m.find("holds int64 keys, but uint32 keys were requested"), std::string::npos) << m;
}

TEST(keyset, truncated_file_is_corruption) {
  scratch_dir dir;
  const std::int64_t keys[4] = {1, 2, 3, 4};
  EMBCACHE_ASSERT_OK(write_keyset(dir / "k", keys, 4));
  auto b = read_bytes(dir / "k");
  b.resize(b.size() - 3);
  write_bytes(dir / "k", b);
  auto r = read_keyset<std::int64_t>(dir / "k");
  EXPECT_EQ(r.get_status().code(), status_code::corruption);
  EXPECT_NE(r.get_status().message().find("header says 4 keys (32 bytes) but 29 bytes follow the "
                                          "header (truncated)"),
            std::string::npos)
      << r.get_status().message();

  b.resize(10);
  write_bytes(dir / "k", b);
  r = read_keyset<std::int64_t>(dir / "k");
  EXPECT_EQ(r.get_status().code(), status_code::corruption);
  EXPECT_NE(r.get_status().message().find("shorter than the 32-byte header"), std::string::npos);
}

TEST(keyset, damaged_keys_fail_the_checksum) {
  scratch_dir dir;
  const std::int64_t keys[4] = {1, 2, 3, 4};
  EMBCACHE_ASSERT_OK(write_keyset(dir / "k", keys, 4));
  auto b = read_bytes(dir / "k");
  b[32 + 8] ^= 0x40;
  write_bytes(dir / "k", b);
  auto r = read_keyset<std::int64_t>(dir / "k");
  EXPECT_EQ(r.get_status().code(), status_code::corruption);
  EXPECT_NE(r.get_status().message().find("checksum mismatch"), std::string::npos);
}

TEST(keyset, bad_magic_version_and_order_are_refused) {
  scratch_dir dir;
  const std::int64_t keys[3] = {1, 2, 3};
  EMBCACHE_ASSERT_OK(write_keyset(dir / "k", keys, 3));
  const auto good = read_bytes(dir / "k");

  auto b = good;
  b[0] = 'X';
  write_bytes(dir / "k", b);
  EXPECT_EQ(read_keyset<std::int64_t>(dir / "k").get_status().code(), status_code::corruption);

  b = good;
  b[8] = 2;
  write_bytes(dir / "k", b);
  auto r = read_keyset<std::int64_t>(dir / "k");
  EXPECT_EQ(r.get_status().code(), status_code::unsupported);
  EXPECT_NE(r.get_status().message().find("format version 2"), std::string::npos);

  // Keys out of order under a valid checksum (a writer bug) are still refused.
  b = good;
  const std::int64_t swapped[3] = {2, 1, 3};
  std::memcpy(b.data() + 32, swapped, 24);
  const std::uint64_t sum = XXH64(swapped, sizeof(swapped), 0);
  std::memcpy(b.data() + 24, &sum, 8);
  write_bytes(dir / "k", b);
  r = read_keyset<std::int64_t>(dir / "k");
  EXPECT_EQ(r.get_status().code(), status_code::corruption);
  EXPECT_NE(r.get_status().message().find("not strictly increasing at index 1"), std::string::npos)
      << r.get_status().message();
}

TEST(keyset, missing_file_is_not_found) {
  scratch_dir dir;
  auto r = read_keyset<std::int64_t>(dir / "nope");
  EXPECT_EQ(r.get_status().code(), status_code::not_found);
  EXPECT_NE(r.get_status().message().find(dir / "nope"), std::string::npos);
}

TEST(keyset, writing_into_a_missing_folder_is_an_error) {
  scratch_dir dir;
  const std::int64_t keys[1] = {1};
  status s = write_keyset(dir / "no/such/folder/k", keys, 1);
  EXPECT_EQ(s.code(), status_code::not_found);
}

}  // namespace
}  // namespace embcache
