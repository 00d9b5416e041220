// How the RocksDB store lays out its data: status mapping, keys as sortable big-endian bytes,
// and a table's schema. Part of rocksdb_store.cpp, which includes it.
#pragma once

#include <optional>
#include <string>

#include "embcache/keyset.hpp"
#include "embcache/rocksdb_store.hpp"
#include "embcache/status.hpp"

namespace embcache {
namespace {

constexpr const char* meta_prefix = "embcache.table.";
constexpr const char* meta_format = "embcache.rocksdb_store";
// 2: the metadata entry records the table's schema (dim, optimizer, state width) besides the
// key type and row width of version 1.
constexpr int meta_format_version = 2;

status from_rocksdb(const rocksdb::Status& s, const std::string& context) {
  if (s.ok()) return {};
  std::string m = context + ": " + s.ToString();
  if (s.IsNoSpace() || s.ToString().find("No space left") != std::string::npos)
    return status::out_of_space(m);
  if (s.IsCorruption()) return status::corruption(m);
  if (s.IsNotFound() || s.IsPathNotFound()) return status::not_found(m);
  if (s.IsInvalidArgument()) return status::invalid_argument(m);
  if (s.IsNotSupported()) return status::unsupported(m);
  return status::io_error(m);
}

// A key as an unsigned integer whose numeric order is the key's order.
template <class Key>
std::uint64_t sortable(Key k) {
  if constexpr (std::is_signed_v<Key>)
    return static_cast<std::uint64_t>(k) ^ (std::uint64_t{1} << 63);
  else
    return static_cast<std::uint64_t>(k);
}

template <class Key>
Key from_sortable(std::uint64_t u) {
  if constexpr (std::is_signed_v<Key>)
    return static_cast<Key>(u ^ (std::uint64_t{1} << 63));
  else
    return static_cast<Key>(u);
}

// Big-endian, so that RocksDB's bytewise order is the numeric order.
template <class Key>
void encode_key(std::uint64_t u, char* out) {
  for (std::size_t b = 0; b < sizeof(Key); ++b)
    out[b] = static_cast<char>(u >> (8 * (sizeof(Key) - 1 - b)));
}

template <class Key>
std::uint64_t decode_key(const char* in) {
  std::uint64_t u = 0;
  for (std::size_t b = 0; b < sizeof(Key); ++b) u = (u << 8) | static_cast<unsigned char>(in[b]);
  return u;
}

template <class Key>
std::string key_text(Key k) {
  return std::to_string(k);
}

// What a table's rows mean, as recorded in its metadata entry and as a caller expects it.
struct table_schema {
  std::optional<key_type> keys;  // none: the entry names no key type this build has
  std::string key_name;          // the key type as the entry spells it (messages)
  std::size_t dim = 0, state_width = 0, row_width = 0;
  std::string optimizer;
  std::uint64_t format_version = 0;

  // The key type named `name` (key_type_from_name), keeping the spelling.
  void set_key_type(const std::string& name) {
    key_name = name;
    key_type t{};
    if (key_type_from_name(name, &t)) keys = t;
  }
  bool same_layout(const table_schema& o) const {
    return keys == o.keys && dim == o.dim && state_width == o.state_width &&
           row_width == o.row_width && optimizer == o.optimizer;
  }
  std::string text() const {
    return "{" + key_name + " keys, dim " + std::to_string(dim) + ", optimizer " + optimizer +
           " (state width " + std::to_string(state_width) + "), rows of " +
           std::to_string(row_width) + " floats, format version " + std::to_string(format_version) +
           "}";
  }
};

}  // namespace

}  // namespace embcache
