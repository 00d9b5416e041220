/// @file keyset.hpp
/// @brief Keyset files: the sorted unique keys of one data file, read before each pass.
///
/// Two layouts are supported. `keyset_format::embcache` (ours) is a 32-byte little-endian
/// header followed by the keys:
///
/// | offset | size | field                                              |
/// |--------|------|----------------------------------------------------|
/// | 0      | 8    | magic `EMBKEYS1`                                   |
/// | 8      | 2    | format version (1)                                 |
/// | 10     | 1    | key type (`key_type`: 1 = int64, 2 = uint32)       |
/// | 11     | 5    | reserved, zero                                     |
/// | 16     | 8    | key count                                          |
/// | 24     | 8    | xxHash64 (seed 0) of the key bytes that follow     |
/// | 32     | ...  | keys, strictly increasing, `sizeof(Key)` bytes each |
///
/// `keyset_format::hugectr_raw` is HugeCTR's keyset file: the keys as native little-endian
/// integers of `sizeof(Key)` bytes, nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "embcache/status.hpp"

namespace embcache {

/// Integer type of the keys stored in a keyset file.
enum class key_type : std::uint8_t { int64 = 1, uint32 = 2 };

/// Layout of a keyset file.
enum class keyset_format : std::uint8_t {
  embcache = 1,     ///< header with magic, version, key type, count and checksum, then keys
  hugectr_raw = 2,  ///< bare little-endian keys, as HugeCTR's embedding training cache reads
};

/// The name of a key type ("int64", "uint32").
const char* to_string(key_type t) noexcept;
/// The name of a keyset format ("embcache", "hugectr_raw").
const char* to_string(keyset_format f) noexcept;

/// The key_type that stores `Key` (int64 for std::int64_t, uint32 for std::uint32_t).
template <class Key>
constexpr key_type key_type_of() noexcept;
template <>
constexpr key_type key_type_of<std::int64_t>() noexcept {
  return key_type::int64;
}
template <>
constexpr key_type key_type_of<std::uint32_t>() noexcept {
  return key_type::uint32;
}

/// The name of the key type that stores `Key` ("int64" for std::int64_t, "uint32" for
/// std::uint32_t): the one spelling of every file that records a key type (saves, deltas,
/// sharded saves, stores' metadata, dataset manifests).
template <class Key>
const char* key_type_name() noexcept {
  return to_string(key_type_of<Key>());
}

/// The key type named `name` ("int64" or "uint32"); false (and `*out` untouched) when `name`
/// names none.
bool key_type_from_name(const std::string& name, key_type* out) noexcept;

/// Magic bytes at the start of a keyset file in our format.
inline constexpr char keyset_magic[8] = {'E', 'M', 'B', 'K', 'E', 'Y', 'S', '1'};
/// Current version of our keyset format.
inline constexpr std::uint16_t keyset_format_version = 1;
/// Size in bytes of our keyset header.
inline constexpr std::size_t keyset_header_size = 32;

/// Writes the unique keys among `keys[0..n)` to `path`, sorted ascending. The input is not
/// modified (a copy is sorted). The write is atomic: a temporary file beside `path` is written,
/// fsynced and renamed, so a crash leaves either the old file or the complete new one.
/// Errors: io_error / out_of_space naming the path.
template <class Key>
status write_keyset(const std::string& path, const Key* keys, std::size_t n,
                    keyset_format fmt = keyset_format::embcache);

/// Reads a keyset file. In our format it checks the magic, the format version, the key type
/// (a file of another key type is refused with invalid_argument naming both types), the count
/// against the file size (truncated: corruption), the checksum and that the keys are strictly
/// increasing (corruption otherwise). In the raw format the file size must be a multiple of
/// `sizeof(Key)`; the keys are returned sorted and unique. A missing file gives not_found.
template <class Key>
result<std::vector<Key>> read_keyset(const std::string& path,
                                     keyset_format fmt = keyset_format::embcache);

extern template status write_keyset<std::int64_t>(const std::string&, const std::int64_t*,
                                                  std::size_t, keyset_format);
extern template status write_keyset<std::uint32_t>(const std::string&, const std::uint32_t*,
                                                   std::size_t, keyset_format);
extern template result<std::vector<std::int64_t>> read_keyset<std::int64_t>(const std::string&,
                                                                            keyset_format);
extern template result<std::vector<std::uint32_t>> read_keyset<std::uint32_t>(const std::string&,
                                                                              keyset_format);

}  // namespace embcache
