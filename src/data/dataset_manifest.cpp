// Reading and validating a dataset folder's manifest.json (read_dataset_manifest).
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/durable_file.hpp"
#include "common/strict_json.hpp"
#include "dataset_files.hpp"
#include "embcache/keyset.hpp"
#include "embcache/shard.hpp"
#include "schema_json.hpp"

namespace embcache {

namespace fs = std::filesystem;

namespace {

// Typed access to manifest fields: each error names the file, the field and what was expected.
class manifest_fields {
 public:
  explicit manifest_fields(std::string path) : path_(std::move(path)) {}

  status fail(const std::string& field, const std::string& what) const {
    return status::corruption("'" + path_ + "': field " + field + " " + what);
  }
  static std::string shown(const nlohmann::json& v) {
    std::string t = v.dump();
    if (t.size() > 40) t = t.substr(0, 40) + "...";
    return t;
  }
  status member(const nlohmann::json& obj, const std::string& key, const std::string& field,
                const nlohmann::json*& out) const {
    auto it = obj.find(key);
    if (it == obj.end()) return fail(field, "is missing");
    out = &*it;
    return {};
  }
  status count(const nlohmann::json& obj, const std::string& key, const std::string& field,
               std::uint64_t& out) const {
    const nlohmann::json* v = nullptr;
    EMBCACHE_RETURN_IF_ERROR(member(obj, key, field, v));
    return count_value(*v, field, out);
  }
  status count_value(const nlohmann::json& v, const std::string& field, std::uint64_t& out) const {
    // Negative integers parse as number_integer and fractions as number_float: both refused.
    if (!v.is_number_unsigned()) {
      return fail(field, "is " + shown(v) + ", expected a non-negative integer");
    }
    out = v.get<std::uint64_t>();
    return {};
  }
  status text(const nlohmann::json& obj, const std::string& key, const std::string& field,
              std::string& out) const {
    const nlohmann::json* v = nullptr;
    EMBCACHE_RETURN_IF_ERROR(member(obj, key, field, v));
    if (!v->is_string()) return fail(field, "is " + shown(*v) + ", expected a string");
    out = v->get<std::string>();
    return {};
  }
  // A file of the dataset: a plain name inside the folder, never a path out of it.
  status file_name(const nlohmann::json& obj, const std::string& key, const std::string& field,
                   const std::string& dir, std::string& out) const {
    std::string name;
    EMBCACHE_RETURN_IF_ERROR(text(obj, key, field, name));
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos) {
      return fail(field, "is " + shown(obj.at(key)) + ", expected a file name in the folder");
    }
    out = (fs::path(dir) / name).string();
    return {};
  }

 private:
  std::string path_;
};

// A shard's keyset sizes, when recorded: "keys" (at most rows * 26 distinct keys) and, with
// crossing, "crossed_keys" (at most rows * crossed_per_row).
status key_counts(const manifest_fields& f, const nlohmann::json& e, const std::string& at,
                  std::size_t num_slots, std::size_t num_crossed, shard_files& sf) {
  if (!e.contains("keys")) {
    if (e.contains("crossed_keys"))
      return f.fail(at + ".keys", "is missing, but crossed_keys is not");
    return {};
  }
  if (num_crossed == 0 && e.contains("crossed_keys")) {
    return f.fail(at + ".crossed_keys", "is present, but crossed_per_row is 0");
  }
  EMBCACHE_RETURN_IF_ERROR(f.count(e, "keys", at + ".keys", sf.keys));
  if (num_crossed > 0) {
    EMBCACHE_RETURN_IF_ERROR(f.count(e, "crossed_keys", at + ".crossed_keys", sf.crossed_keys));
  }
  const struct {
    const char* name;
    std::uint64_t value, per_row;
  } counts[] = {{"keys", sf.keys, num_slots}, {"crossed_keys", sf.crossed_keys, num_crossed}};
  for (const auto& c : counts) {
    std::uint64_t most = 0;
    if (!__builtin_mul_overflow(sf.rows, c.per_row, &most) && c.value > most) {
      return f.fail(at + "." + c.name, "is " + std::to_string(c.value) + ", more than the " +
                                           std::to_string(most) + " keys its " +
                                           std::to_string(sf.rows) + " rows hold");
    }
  }
  sf.has_key_counts = true;
  return {};
}

status parse_manifest(const nlohmann::json& j, const std::string& dir, const std::string& path,
                      dataset_summary& s) {
  const manifest_fields f(path);
  if (!j.is_object()) return status::corruption("'" + path + "': not a JSON object");
  std::string format;
  EMBCACHE_RETURN_IF_ERROR(f.text(j, "format", "format", format));
  std::uint64_t version = 0;
  EMBCACHE_RETURN_IF_ERROR(f.count(j, "version", "version", version));
  if (format != "embcache-dataset" || version != 1) {
    return status::unsupported("'" + path + "': format '" + format + "' version " +
                               std::to_string(version) +
                               ", expected an embcache-dataset manifest of version 1");
  }
  EMBCACHE_RETURN_IF_ERROR(f.count(j, "rows", "rows", s.rows));
  const nlohmann::json* mean = nullptr;
  EMBCACHE_RETURN_IF_ERROR(f.member(j, "label_mean", "label_mean", mean));
  if (!mean->is_number() || !(mean->get<double>() >= 0.0 && mean->get<double>() <= 1.0)) {
    return f.fail("label_mean", "is " + f.shown(*mean) + ", expected a number in [0, 1]");
  }
  s.label_mean = mean->get<double>();
  std::uint64_t dense = 0, slots = 0, crossed = 0;
  EMBCACHE_RETURN_IF_ERROR(f.count(j, "dense_count", "dense_count", dense));
  EMBCACHE_RETURN_IF_ERROR(f.count(j, "slot_count", "slot_count", slots));
  // No schema: the dataset predates schemas and is Criteo's.
  if (j.contains("schema")) {
    const status schema =
        detail::schema_from_json(j.at("schema"), "'" + path + "'", "field schema", s.schema);
    if (!schema.ok()) return status::corruption(schema.message());
  }
  if (dense != s.schema.num_dense() || slots != s.schema.num_categorical()) {
    return status::corruption("'" + path + "': fields dense_count = " + std::to_string(dense) +
                              ", slot_count = " + std::to_string(slots) + ", but the schema has " +
                              std::to_string(s.schema.num_dense()) + " dense and " +
                              std::to_string(s.schema.num_categorical()) + " categorical fields");
  }
  const std::size_t num_slots = s.schema.num_categorical();
  EMBCACHE_RETURN_IF_ERROR(f.count(j, "crossed_per_row", "crossed_per_row", crossed));
  if (crossed > 0xffff) {
    return f.fail("crossed_per_row", "is " + std::to_string(crossed) + ", at most 65535");
  }
  s.num_crossed = static_cast<std::size_t>(crossed);
  std::string text;
  EMBCACHE_RETURN_IF_ERROR(f.text(j, "keyset_format", "keyset_format", text));
  if (text == "embcache") {
    s.keyset = keyset_format::embcache;
  } else if (text == "hugectr_raw") {
    s.keyset = keyset_format::hugectr_raw;
  } else {
    return f.fail("keyset_format", "is '" + text + "', expected 'embcache' or 'hugectr_raw'");
  }
  EMBCACHE_RETURN_IF_ERROR(f.text(j, "key_type", "key_type", text));
  if (text != key_type_name<std::int64_t>())
    return f.fail("key_type",
                  "is '" + text + "', expected '" + key_type_name<std::int64_t>() + "'");
  if (j.contains("unique_keys_per_slot")) {
    const nlohmann::json& u = j.at("unique_keys_per_slot");
    if (!u.is_array() || u.size() != num_slots) {
      return f.fail("unique_keys_per_slot", "is " + f.shown(u) + ", expected an array of " +
                                                std::to_string(num_slots) + " counts");
    }
    s.unique_keys.assign(num_slots, 0);
    for (std::size_t i = 0; i < num_slots; ++i) {
      EMBCACHE_RETURN_IF_ERROR(
          f.count_value(u[i], "unique_keys_per_slot[" + std::to_string(i) + "]", s.unique_keys[i]));
    }
    EMBCACHE_RETURN_IF_ERROR(
        f.count(j, "unique_crossed_keys", "unique_crossed_keys", s.unique_crossed_keys));
    s.has_unique_stats = true;
  }
  const nlohmann::json* shards = nullptr;
  EMBCACHE_RETURN_IF_ERROR(f.member(j, "shards", "shards", shards));
  if (!shards->is_array()) {
    return f.fail("shards", "is " + f.shown(*shards) + ", expected an array");
  }
  std::uint64_t total = 0;
  const std::uint64_t record_size =
      shard_record_size(s.schema.num_dense(), num_slots, s.num_crossed);
  for (std::size_t i = 0; i < shards->size(); ++i) {
    const nlohmann::json& e = (*shards)[i];
    const std::string at = "shards[" + std::to_string(i) + "]";
    if (!e.is_object()) return f.fail(at, "is " + f.shown(e) + ", expected an object");
    shard_files sf;
    EMBCACHE_RETURN_IF_ERROR(f.file_name(e, "file", at + ".file", dir, sf.shard));
    EMBCACHE_RETURN_IF_ERROR(f.file_name(e, "keyset", at + ".keyset", dir, sf.keyset));
    if (s.num_crossed > 0) {
      EMBCACHE_RETURN_IF_ERROR(
          f.file_name(e, "crossed_keyset", at + ".crossed_keyset", dir, sf.crossed_keyset));
    } else if (e.contains("crossed_keyset")) {
      return f.fail(at + ".crossed_keyset", "is present, but crossed_per_row is 0");
    }
    EMBCACHE_RETURN_IF_ERROR(f.count(e, "rows", at + ".rows", sf.rows));
    // The rows must fit the shard file when it is there (a missing one is the reader's error).
    std::error_code ec;
    const std::uint64_t size = fs::file_size(sf.shard, ec);
    std::uint64_t payload = 0, expected = 0;
    if (__builtin_mul_overflow(sf.rows, record_size, &payload) ||
        __builtin_add_overflow(payload, std::uint64_t{shard_header_size}, &expected) ||
        (!ec && size != expected)) {
      return f.fail(at + ".rows",
                    "is " + std::to_string(sf.rows) + ", but shard '" + sf.shard + "' has " +
                        (ec ? "no size" : std::to_string(size)) + " bytes" +
                        (ec ? "" : " (" + std::to_string(record_size) + "-byte records)"));
    }
    EMBCACHE_RETURN_IF_ERROR(key_counts(f, e, at, num_slots, s.num_crossed, sf));
    if (__builtin_add_overflow(total, sf.rows, &total)) {
      return f.fail("shards", "rows add up to more than 2^64");
    }
    s.shards.push_back(std::move(sf));
  }
  if (total != s.rows) {
    return f.fail("rows", "is " + std::to_string(s.rows) + ", but the shards hold " +
                              std::to_string(total) + " rows");
  }
  if (j.contains("producer")) {
    const nlohmann::json& p = j.at("producer");
    if (!p.is_object()) return f.fail("producer", "is " + f.shown(p) + ", expected an object");
    for (const auto& [k, v] : p.items()) {
      if (!v.is_string()) {
        return f.fail("producer." + k, "is " + f.shown(v) + ", expected a string");
      }
      s.producer.emplace_back(k, v.get<std::string>());
    }
  }
  return {};
}

}  // namespace

result<dataset_summary> read_dataset_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / detail::dataset_manifest_file).string();
  auto bytes = detail::read_file_bytes(path);
  if (!bytes.ok()) return bytes.get_status();
  const std::vector<char>& b = bytes.value();
  dataset_summary s;
  // A key given twice would be read as its last value without a word: refused, named.
  auto parsed = detail::parse_json_unique_keys(std::string_view(b.data(), b.size()),
                                               "'" + path + "'", "manifest");
  if (!parsed.ok()) return status::corruption(parsed.get_status().message());
  try {
    const auto& j = parsed.value();
    EMBCACHE_RETURN_IF_ERROR(parse_manifest(j, dir, path, s));
  } catch (const nlohmann::json::exception& e) {
    return status::corruption("'" + path + "': " + e.what());
  }
  return s;
}

}  // namespace embcache
