// Private helpers of the stores: checksummed, fsynced files and folder renames.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "embcache/status.hpp"

namespace embcache::detail {

/// Status for a failed system call on `path`: out_of_space for ENOSPC/EDQUOT, not_found for
/// ENOENT, io_error otherwise; the message names the operation, the path and errno's text.
status errno_status(int err, const std::string& what, const std::string& path);

/// Buffered writer that hashes what it writes (xxHash64, seed 0) and fsyncs on finish().
class checked_file_writer {
 public:
  checked_file_writer();
  ~checked_file_writer();
  checked_file_writer(const checked_file_writer&) = delete;
  checked_file_writer& operator=(const checked_file_writer&) = delete;

  status open(const std::string& path);
  status append(const void* data, std::size_t bytes);
  /// Writes what is buffered, fsyncs and closes.
  status finish();
  std::uint64_t bytes() const noexcept { return bytes_; }
  std::uint64_t digest() const noexcept;

 private:
  status write_buffer();

  std::string path_;
  int fd_ = -1;
  std::vector<char> buffer_;
  std::size_t used_ = 0;
  std::uint64_t bytes_ = 0;
  void* hash_state_ = nullptr;
};

/// Reader that hashes what it reads; a short read is corruption (the file is truncated).
class checked_file_reader {
 public:
  checked_file_reader();
  ~checked_file_reader();
  checked_file_reader(const checked_file_reader&) = delete;
  checked_file_reader& operator=(const checked_file_reader&) = delete;

  /// Opens `path`; `size_out` gets its size in bytes.
  status open(const std::string& path, std::uint64_t* size_out);
  status read(void* data, std::size_t bytes);
  std::uint64_t digest() const noexcept;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t offset_ = 0;
  void* hash_state_ = nullptr;
};

/// xxHash64 digest as 16 lower-case hex digits.
std::string hex64(std::uint64_t v);

/// Parses exactly 16 hex digits (what hex64 writes) into `out`; false for anything else (a sign,
/// a "0x" prefix, spaces, another length).
bool parse_hex64(const std::string& text, std::uint64_t* out);

/// `*out = a * b`; false when the product overflows 64 bits (sizes taken from a manifest are
/// multiplied through this before they are compared with a file's size).
inline bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

/// fsyncs a folder so that entries created or renamed in it are durable.
status sync_dir(const std::string& dir);

/// Checks that `dir` does not exist or is an empty folder (the target of a checkpoint).
status check_checkpoint_target(const std::string& dir, const char* who);

/// `dir` without trailing slashes.
std::string strip_slashes(std::string dir);

/// Parent folder of `dir` ("." when it has none).
std::string parent_dir(const std::string& dir);

}  // namespace embcache::detail
