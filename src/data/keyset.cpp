#include "embcache/keyset.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <iterator>

#include "common/durable_file.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "keyset and shard files are little-endian; big-endian hosts need byte swaps");

namespace embcache {

namespace {

// The name of enumerator `value` of an enumeration numbered from 1 (the values of the files'
// header bytes) whose names are `names`, in order; nullptr for any other value.
template <class Enum, std::size_t N>
const char* enum_name(Enum value, const char* const (&names)[N]) noexcept {
  const auto i = static_cast<std::size_t>(value);
  return i >= 1 && i <= N ? names[i - 1] : nullptr;
}

constexpr const char* key_type_names[] = {"int64", "uint32"};
constexpr const char* keyset_format_names[] = {"embcache", "hugectr_raw"};

// The key type of a keyset header's raw byte, or nullptr when it names none.
const char* key_type_name_of_byte(std::uint8_t raw) {
  return enum_name(static_cast<key_type>(raw), key_type_names);
}

}  // namespace

const char* to_string(key_type t) noexcept {
  const char* name = enum_name(t, key_type_names);
  return name ? name : "unknown";
}

bool key_type_from_name(const std::string& name, key_type* out) noexcept {
  for (std::size_t i = 0; i < std::size(key_type_names); ++i)
    if (name == key_type_names[i]) {
      *out = static_cast<key_type>(i + 1);
      return true;
    }
  return false;
}

const char* to_string(keyset_format f) noexcept {
  const char* name = enum_name(f, keyset_format_names);
  return name ? name : "unknown";
}

template <class Key>
status write_keyset(const std::string& path, const Key* keys, std::size_t n, keyset_format fmt) {
  if (fmt != keyset_format::embcache && fmt != keyset_format::hugectr_raw) {
    return status::invalid_argument("write_keyset '" + path + "': unknown keyset format " +
                                    std::to_string(static_cast<int>(fmt)));
  }
  std::vector<Key> sorted(keys, keys + n);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  const std::size_t bytes = sorted.size() * sizeof(Key);

  detail::durable_file_writer out;
  EMBCACHE_RETURN_IF_ERROR(out.open(path));
  if (fmt == keyset_format::embcache) {
    unsigned char header[keyset_header_size] = {};
    std::memcpy(header, keyset_magic, 8);
    const std::uint16_t version = keyset_format_version;
    std::memcpy(header + 8, &version, 2);
    header[10] = static_cast<unsigned char>(key_type_of<Key>());
    const std::uint64_t count = sorted.size();
    std::memcpy(header + 16, &count, 8);
    const std::uint64_t checksum = XXH64(sorted.data(), bytes, 0);
    std::memcpy(header + 24, &checksum, 8);
    EMBCACHE_RETURN_IF_ERROR(out.write(header, sizeof(header)));
  }
  EMBCACHE_RETURN_IF_ERROR(out.write(sorted.data(), bytes));
  return out.commit();
}

template <class Key>
result<std::vector<Key>> read_keyset(const std::string& path, keyset_format fmt) {
  auto bytes_or = detail::read_file_bytes(path);
  if (!bytes_or.ok()) return bytes_or.get_status().with_context("read_keyset");
  const std::vector<char>& bytes = bytes_or.value();
  const std::string where = "keyset '" + path + "'";

  if (fmt == keyset_format::hugectr_raw) {
    if (bytes.size() % sizeof(Key) != 0) {
      return status::corruption(where + ": size " + std::to_string(bytes.size()) +
                                " bytes is not a multiple of the key size " +
                                std::to_string(sizeof(Key)) + " (truncated or wrong key type)");
    }
    std::vector<Key> keys(bytes.size() / sizeof(Key));
    if (!keys.empty()) std::memcpy(keys.data(), bytes.data(), bytes.size());
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    return keys;
  }
  if (fmt != keyset_format::embcache) {
    return status::invalid_argument(where + ": unknown keyset format " +
                                    std::to_string(static_cast<int>(fmt)));
  }

  if (bytes.size() < keyset_header_size) {
    return status::corruption(where + ": " + std::to_string(bytes.size()) +
                              " bytes, shorter than the " + std::to_string(keyset_header_size) +
                              "-byte header (truncated)");
  }
  if (std::memcmp(bytes.data(), keyset_magic, 8) != 0) {
    return status::corruption(where +
                              ": bad magic (expected 'EMBKEYS1'; a raw HugeCTR keyset "
                              "needs keyset_format::hugectr_raw)");
  }
  std::uint16_t version = 0;
  std::memcpy(&version, bytes.data() + 8, 2);
  if (version != keyset_format_version) {
    return status::unsupported(where + ": format version " + std::to_string(version) +
                               ", this build reads version " +
                               std::to_string(keyset_format_version));
  }
  const auto raw_type = static_cast<std::uint8_t>(bytes[10]);
  if (raw_type != static_cast<std::uint8_t>(key_type_of<Key>())) {
    const char* name = key_type_name_of_byte(raw_type);
    return status::invalid_argument(
        where + ": holds " +
        (name ? std::string(name) : "unknown (" + std::to_string(raw_type) + ")") + " keys, but " +
        to_string(key_type_of<Key>()) + " keys were requested");
  }
  std::uint64_t count = 0;
  std::uint64_t checksum = 0;
  std::memcpy(&count, bytes.data() + 16, 8);
  std::memcpy(&checksum, bytes.data() + 24, 8);
  const std::uint64_t payload = bytes.size() - keyset_header_size;
  std::uint64_t expected = 0;
  if (__builtin_mul_overflow(count, std::uint64_t{sizeof(Key)}, &expected)) {
    return status::corruption(where + ": header field count = " + std::to_string(count) +
                              " keys of " + std::to_string(sizeof(Key)) +
                              " bytes overflows 64 bits, but " + std::to_string(payload) +
                              " bytes follow the header (truncated)");
  }
  if (payload != expected) {
    return status::corruption(where + ": header says " + std::to_string(count) + " keys (" +
                              std::to_string(expected) + " bytes) but " + std::to_string(payload) +
                              " bytes follow the header" +
                              (payload < expected ? " (truncated)" : " (oversized)"));
  }
  const char* data = bytes.data() + keyset_header_size;
  if (XXH64(data, payload, 0) != checksum) {
    return status::corruption(where + ": checksum mismatch (the keys are damaged)");
  }
  std::vector<Key> keys(count);
  if (count) std::memcpy(keys.data(), data, payload);
  for (std::size_t i = 1; i < keys.size(); ++i) {
    if (!(keys[i - 1] < keys[i])) {
      return status::corruption(where + ": keys not strictly increasing at index " +
                                std::to_string(i));
    }
  }
  return keys;
}

template status write_keyset<std::int64_t>(const std::string&, const std::int64_t*, std::size_t,
                                           keyset_format);
template status write_keyset<std::uint32_t>(const std::string&, const std::uint32_t*, std::size_t,
                                            keyset_format);
template result<std::vector<std::int64_t>> read_keyset<std::int64_t>(const std::string&,
                                                                     keyset_format);
template result<std::vector<std::uint32_t>> read_keyset<std::uint32_t>(const std::string&,
                                                                       keyset_format);

}  // namespace embcache
