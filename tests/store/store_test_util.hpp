// Shared helpers of the store tests: scratch folders, deterministic rows, a small tmpfs.
#pragma once

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"

namespace embcache::test {

/// A fresh folder removed (with what is in it) at the end of the scope
/// (tests/common/temp_dir.hpp).
struct scratch_dir : testing::temp_dir {
  scratch_dir() : testing::temp_dir("embcache_store") {}
};

/// A tmpfs of `bytes` mounted on a scratch folder; ok() is false where mounting is not allowed.
class small_tmpfs {
 public:
  explicit small_tmpfs(std::size_t bytes) {
    std::string opts = "size=" + std::to_string(bytes);
    mounted_ = ::mount("tmpfs", dir_.path().c_str(), "tmpfs", 0, opts.c_str()) == 0;
  }
  ~small_tmpfs() {
    if (mounted_) {
      std::error_code ec;
      for (auto& e : std::filesystem::directory_iterator(dir_.path(), ec))
        std::filesystem::remove_all(e.path(), ec);
      ::umount2(dir_.path().c_str(), MNT_DETACH);
    }
  }
  bool ok() const { return mounted_; }
  std::string sub(const std::string& name) const { return dir_.sub(name); }

 private:
  scratch_dir dir_;
  bool mounted_ = false;
};

/// The value a test writes at column j of the row of `key`, varied by `salt`.
template <class Key>
float row_value(Key key, std::size_t j, int salt) {
  const auto k = static_cast<std::uint64_t>(key);
  return static_cast<float>((k * 2654435761u + j * 40503u + static_cast<unsigned>(salt) * 977u) %
                            100003u) *
         0.25f;
}

template <class Key>
std::vector<float> make_rows(const std::vector<Key>& keys, std::size_t width, int salt) {
  std::vector<float> rows(keys.size() * width);
  for (std::size_t i = 0; i < keys.size(); ++i)
    for (std::size_t j = 0; j < width; ++j) rows[i * width + j] = row_value(keys[i], j, salt);
  return rows;
}

/// Distinct keys spread over the whole key range (negative ones too for signed keys).
template <class Key>
std::vector<Key> make_keys(std::size_t n, std::uint64_t seed = 1) {
  std::vector<Key> keys(n);
  for (std::size_t i = 0; i < n; ++i) {
    // An odd multiplier is a bijection on 64 and on 32 bits; seeds keep 2^20 keys apart.
    std::uint64_t u = (i + (seed << 20)) * 0x9E3779B97F4A7C15ULL;
    keys[i] = static_cast<Key>(u);
  }
  return keys;
}

inline void flip_byte(const std::string& path, std::uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5A);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

}  // namespace embcache::test
