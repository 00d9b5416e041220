// The host store's checkpoint folder (manifest.json + keys.bin, versions.bin, rows.bin):
// host_store::checkpoint and host_store::open. Part of host_store.cpp, which includes it.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "embcache/host_store.hpp"
#include "host_shard.hpp"
#include "common/durable_file.hpp"
#include "format/checked_io.hpp"

namespace embcache {

namespace {

constexpr const char* manifest_format = "embcache.host_store";
constexpr int manifest_format_version = 1;

}  // namespace

template <class Key>
status host_store<Key>::checkpoint(const std::string& dir_in) {
  namespace fs = std::filesystem;
  const std::string who = "host_store::checkpoint of table '" + options_.table_name + "'";
  const std::string dir = detail::strip_slashes(dir_in);
  EMBCACHE_RETURN_IF_ERROR(detail::check_checkpoint_target(dir, who.c_str()));
  const std::string tmp = dir + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) {
    return detail::errno_status(who + ": cannot create folder", tmp, ec.value());
  }
  auto body = [&]() -> status {
    constexpr auto in_folder = detail::file_placement::in_staged_folder;
    detail::durable_file_writer keys_w, versions_w, rows_w;
    EMBCACHE_RETURN_IF_ERROR(keys_w.open(tmp + "/keys.bin", in_folder));
    EMBCACHE_RETURN_IF_ERROR(versions_w.open(tmp + "/versions.bin", in_folder));
    EMBCACHE_RETURN_IF_ERROR(rows_w.open(tmp + "/rows.bin", in_folder));
    std::size_t count = 0;
    EMBCACHE_RETURN_IF_ERROR(this->for_each(
        std::size_t{1} << 16,
        [&](const Key* k, const float* r, const std::uint64_t* v, std::size_t n) -> status {
          EMBCACHE_RETURN_IF_ERROR(keys_w.write(k, n * sizeof(Key)));
          EMBCACHE_RETURN_IF_ERROR(versions_w.write(v, n * sizeof(std::uint64_t)));
          EMBCACHE_RETURN_IF_ERROR(rows_w.write(r, n * options_.row_width * sizeof(float)));
          count += n;
          return {};
        }));
    EMBCACHE_RETURN_IF_ERROR(keys_w.commit());
    EMBCACHE_RETURN_IF_ERROR(versions_w.commit());
    EMBCACHE_RETURN_IF_ERROR(rows_w.commit());
    nlohmann::json m;
    m["format"] = manifest_format;
    m["format_version"] = manifest_format_version;
    m["table_name"] = options_.table_name;
    m["key_type"] = key_type_name<Key>();
    m["row_width"] = options_.row_width;
    m["count"] = count;
    m["max_version"] = max_version_;
    auto file_entry = [](const detail::durable_file_writer& w) {
      return nlohmann::json{{"bytes", w.bytes()}, {"xxh64", detail::hex64(w.digest())}};
    };
    m["files"] = {{"keys.bin", file_entry(keys_w)},
                  {"versions.bin", file_entry(versions_w)},
                  {"rows.bin", file_entry(rows_w)}};
    const std::string text = m.dump(2) + "\n";
    detail::durable_file_writer mw;
    EMBCACHE_RETURN_IF_ERROR(mw.open(tmp + "/manifest.json", in_folder));
    EMBCACHE_RETURN_IF_ERROR(mw.write(text.data(), text.size()));
    EMBCACHE_RETURN_IF_ERROR(mw.commit());
    // The target is absent or an empty folder (check_checkpoint_target): `dir` is either
    // complete or absent.
    return detail::publish_folder(tmp, dir);
  };
  status st = body();
  if (!st.ok()) {
    fs::remove_all(tmp, ec);
    return st.with_context(who);
  }
  return st;
}

template <class Key>
result<std::unique_ptr<host_store<Key>>> host_store<Key>::open(const std::string& dir_in,
                                                               host_store_options options) {
  namespace fs = std::filesystem;
  const std::string dir = detail::strip_slashes(dir_in);
  const std::string who =
      "host_store::open of '" + dir + "' for table '" + options.table_name + "'";
  if (options.row_width == 0) return status::invalid_argument(who + ": row_width must be > 0");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return status::not_found(who + ": no such folder");
  const std::string manifest_path = dir + "/manifest.json";
  std::ifstream in(manifest_path);
  if (!in) {
    if (!fs::exists(manifest_path, ec))
      return status::not_found(who + ": '" + manifest_path +
                               "' is missing (not a host_store checkpoint, or an incomplete one)");
    return status::io_error(who + ": cannot read '" + manifest_path + "'");
  }
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json m = nlohmann::json::parse(text.str(), nullptr, false);
  if (m.is_discarded() || !m.is_object())
    return status::corruption(who + ": '" + manifest_path + "' is not valid JSON");
  auto field = [&](const char* name, nlohmann::json::value_t type, bool is_number) -> status {
    auto it = m.find(name);
    if (it == m.end() || (is_number ? !it->is_number_unsigned() : it->type() != type))
      return status::corruption(who + ": '" + manifest_path + "' lacks a valid '" + name + "'");
    return {};
  };
  using vt = nlohmann::json::value_t;
  for (const char* f : {"format", "table_name", "key_type"})
    EMBCACHE_RETURN_IF_ERROR(field(f, vt::string, false));
  for (const char* f : {"format_version", "row_width", "count", "max_version"})
    EMBCACHE_RETURN_IF_ERROR(field(f, vt::number_unsigned, true));
  EMBCACHE_RETURN_IF_ERROR(field("files", vt::object, false));
  if (m["format"] != manifest_format)
    return status::invalid_argument(who + ": '" + manifest_path + "' has format '" +
                                    m["format"].get<std::string>() + "', expected '" +
                                    manifest_format + "'");
  if (m["format_version"].get<std::uint64_t>() != std::uint64_t{manifest_format_version})
    return status::unsupported(who + ": format_version " + m["format_version"].dump() +
                               ", this build reads " + std::to_string(manifest_format_version));
  const std::string table = m["table_name"].get<std::string>();
  if (table != options.table_name)
    return status::not_found(who + ": the folder holds table '" + table + "', not '" +
                             options.table_name + "'");
  const std::string key_name = m["key_type"].get<std::string>();
  key_type keys{};
  if (!key_type_from_name(key_name, &keys) || keys != key_type_of<Key>())
    return status::invalid_argument(who + ": the folder holds " + key_name + " keys, expected " +
                                    key_type_name<Key>());
  const std::size_t width = m["row_width"].get<std::size_t>();
  if (width != options.row_width)
    return status::invalid_argument(who + ": the folder holds rows of " + std::to_string(width) +
                                    " floats, expected " + std::to_string(options.row_width));
  const std::uint64_t count = m["count"].get<std::uint64_t>();
  const std::uint64_t max_version = m["max_version"].get<std::uint64_t>();

  struct input {
    const char* name;
    std::size_t elem_bytes;
    detail::checked_file_reader reader;
    std::uint64_t expected_digest = 0;
  };
  input inputs[3] = {{"keys.bin", sizeof(Key), {}, 0},
                     {"versions.bin", sizeof(std::uint64_t), {}, 0},
                     {"rows.bin", width * sizeof(float), {}, 0}};
  for (auto& f : inputs) {
    const std::string path = dir + "/" + f.name;
    nlohmann::json::iterator entry = m["files"].find(std::string(f.name));
    if (entry == m["files"].end() || !entry->is_object() ||
        !(*entry)["bytes"].is_number_unsigned() || !(*entry)["xxh64"].is_string())
      return status::corruption(who + ": '" + manifest_path + "' lacks a valid entry for '" +
                                f.name + "'");
    std::uint64_t expect = 0;
    if (!detail::checked_mul(count, f.elem_bytes, &expect))
      return status::corruption(who + ": '" + manifest_path + "' gives count " +
                                std::to_string(count) + ": " + f.name + " would hold " +
                                std::to_string(count) + " * " + std::to_string(f.elem_bytes) +
                                " bytes, which overflows 64 bits");
    if ((*entry)["bytes"].get<std::uint64_t>() != expect)
      return status::corruption(who + ": '" + manifest_path + "' gives files." + f.name +
                                ".bytes " + (*entry)["bytes"].dump() + ", expected " +
                                std::to_string(expect) + " for count " + std::to_string(count));
    const std::string hex = (*entry)["xxh64"].get<std::string>();
    if (!detail::parse_hex64(hex, &f.expected_digest))
      return status::corruption(who + ": '" + manifest_path + "' has a malformed files." + f.name +
                                ".xxh64 \"" + hex + "\", expected 16 hex digits");
    std::uint64_t size = 0;
    EMBCACHE_RETURN_IF_ERROR(f.reader.open(path, &size).with_context(who));
    if (size != expect)
      return status::corruption(who + ": '" + path + "' is " + std::to_string(size) +
                                " bytes, expected " + std::to_string(expect) +
                                (size < expect ? " (truncated)" : ""));
  }

  options.expected_rows = std::max<std::size_t>(options.expected_rows, count);
  auto store = std::make_unique<host_store<Key>>(options);
  constexpr std::size_t batch = std::size_t{1} << 16;
  std::vector<Key> k(std::min<std::uint64_t>(batch, count));
  std::vector<std::uint64_t> v(k.size());
  std::vector<float> r(k.size() * width);
  for (std::uint64_t done = 0; done < count;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(batch, count - done));
    EMBCACHE_RETURN_IF_ERROR(inputs[0].reader.read(k.data(), n * sizeof(Key)).with_context(who));
    EMBCACHE_RETURN_IF_ERROR(
        inputs[1].reader.read(v.data(), n * sizeof(std::uint64_t)).with_context(who));
    EMBCACHE_RETURN_IF_ERROR(
        inputs[2].reader.read(r.data(), n * width * sizeof(float)).with_context(who));
    EMBCACHE_RETURN_IF_ERROR(store->push(k.data(), n, r.data(), v.data()).with_context(who));
    done += n;
  }
  for (auto& f : inputs) {
    const std::uint64_t got = f.reader.digest();
    if (got != f.expected_digest)
      return status::corruption(who + ": checksum mismatch in '" + dir + "/" + f.name +
                                "': manifest says " + detail::hex64(f.expected_digest) +
                                ", the file hashes to " + detail::hex64(got));
  }
  if (store->size() != count)
    return status::corruption(who + ": '" + dir +
                              "/keys.bin' repeats keys: " + std::to_string(count) + " rows hold " +
                              std::to_string(store->size()) + " distinct keys");
  store->max_version_ = std::max(store->max_version_, max_version);
  return store;
}

}  // namespace embcache
