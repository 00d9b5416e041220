// Private helpers of the stores and the folders they write: checksummed reads, digests as hex,
// overflow-checked sizes, checkpoint targets. Writing goes through common/durable_file.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "embcache/status.hpp"

namespace embcache::detail {

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

/// Checks that `dir` does not exist or is an empty folder (the target of a checkpoint).
status check_checkpoint_target(const std::string& dir, const char* who);

/// `dir` without trailing slashes.
std::string strip_slashes(std::string dir);

/// Parent folder of `dir` ("." when it has none).
std::string parent_dir(const std::string& dir);

}  // namespace embcache::detail
