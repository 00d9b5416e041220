// Internal file helpers of the data part: atomic writes and whole-file reads with statuses
// that name the path and the errno.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "embcache/status.hpp"

namespace embcache::detail {

/// A status for a failed system call on `path` (ENOSPC/EDQUOT map to out_of_space, ENOENT to
/// not_found, everything else to io_error).
status errno_status(const std::string& what, const std::string& path, int err);

/// Writes a file through a temporary beside it, then fsync + rename + fsync of the folder, so
/// readers see either the previous file or the complete new one. Destroying an uncommitted
/// writer removes the temporary.
class atomic_file_writer {
 public:
  atomic_file_writer() = default;
  atomic_file_writer(const atomic_file_writer&) = delete;
  atomic_file_writer& operator=(const atomic_file_writer&) = delete;
  ~atomic_file_writer();

  [[nodiscard]] status open(const std::string& path);
  /// Appends `n` bytes (buffered).
  [[nodiscard]] status write(const void* data, std::size_t n);
  /// Overwrites `n` bytes at `offset` of what was already written (flushes first).
  [[nodiscard]] status write_at(std::uint64_t offset, const void* data, std::size_t n);
  [[nodiscard]] status commit();
  /// Removes the temporary; no-op when nothing is open.
  void abort() noexcept;
  const std::string& path() const noexcept { return path_; }

 private:
  [[nodiscard]] status flush();

  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  std::vector<char> buf_;
};

/// An exclusive advisory lock (flock) on a lock file, held until unlock() or destruction.
/// Another process (or another open of the file) cannot take it meanwhile.
class file_lock {
 public:
  file_lock() = default;
  file_lock(const file_lock&) = delete;
  file_lock& operator=(const file_lock&) = delete;
  ~file_lock() { unlock(); }

  /// Creates `path` when missing and locks it without waiting; when another holder has it,
  /// fails with invalid_argument "`holder` is in use by another process (lock 'path' is held)".
  [[nodiscard]] status try_lock(const std::string& path, const std::string& holder);
  void unlock() noexcept;

 private:
  int fd_ = -1;
};

/// The whole content of `path` (not_found when it does not exist).
result<std::vector<char>> read_file_bytes(const std::string& path);

}  // namespace embcache::detail
