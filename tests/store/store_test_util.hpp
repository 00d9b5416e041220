// Shared helpers of the store tests: scratch folders, deterministic rows, a small tmpfs.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/temp_dir.hpp"

namespace embcache::test {

/// A fresh folder removed (with what is in it) at the end of the scope
/// (tests/common/temp_dir.hpp).
struct scratch_dir : testing::temp_dir {
  scratch_dir() : testing::temp_dir("embcache_store") {}
};

/// The crash tests' parent side: runs the disabled test `child_test` of this binary in a child
/// process with EMBCACHE_CRASH_DIR=`dir` (and `extra_env`, NAME=VALUE, when not empty), waits (15 s
/// at most) for the child to write `dir/ready`, lets it push for 400 ms more, then kills it with
/// SIGKILL. A fatal test failure when the child exits early, never gets ready or is not killed
/// (check with ASSERT_NO_FATAL_FAILURE).
inline void run_child_until_killed(const scratch_dir& dir, const std::string& child_test,
                                   const std::string& extra_env = "") {
  // Everything the child needs is built before fork: between fork and exec only
  // async-signal-safe calls are allowed.
  const std::string env_dir = "EMBCACHE_CRASH_DIR=" + dir.path();
  const std::string filter = "--gtest_filter=" + child_test;
  char* const envp[] = {const_cast<char*>(env_dir.c_str()),
                        extra_env.empty() ? nullptr : const_cast<char*>(extra_env.c_str()),
                        nullptr};
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execle("/proc/self/exe", "store_tests", filter.c_str(), "--gtest_also_run_disabled_tests",
             static_cast<char*>(nullptr), envp);
    ::_exit(127);
  }
  const std::string ready = dir.sub("ready");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (!std::filesystem::exists(ready) && std::chrono::steady_clock::now() < deadline) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) FAIL() << "the child exited early, status " << st;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!std::filesystem::exists(ready)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    FAIL() << "the child " << child_test << " never wrote " << ready;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // in the middle of pushes
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "child status " << st;
}

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
