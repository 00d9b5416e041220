// Reading model and delta folders: every size checked against the manifest and the file before a
// byte is read, every file against its checksum, every row for repeats and non-finite floats.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "embcache/serving.hpp"

#include "embcache/optimizers.hpp"
#include "embcache/training_cache.hpp"
#include "common/durable_file.hpp"
#include "store_io.hpp"

namespace embcache {

namespace {

namespace fs = std::filesystem;
using detail::checked_mul;

// Far above any real manifest (a few hundred bytes per table).
constexpr std::uint64_t max_manifest_bytes = std::uint64_t{64} << 20;
// Bounds that keep a row's byte count far from overflow; far above any real table.
constexpr std::uint64_t max_dim = std::uint64_t{1} << 20;

result<std::uint64_t> file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return detail::errno_status("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) return status::corruption("'" + path + "' is not a regular file");
  return static_cast<std::uint64_t>(st.st_size);
}

// Reads exactly `bytes` (already checked against the file's size) into `out`, hashing them.
template <class T>
status read_items(const std::string& path, std::uint64_t bytes, std::vector<T>* out,
                  std::uint64_t* digest) {
  if (bytes % sizeof(T) != 0 || bytes / sizeof(T) > out->max_size()) {
    return status::corruption("'" + path + "' has " + std::to_string(bytes) +
                              " bytes, not a whole number of " + std::to_string(sizeof(T)) +
                              "-byte items");
  }
  out->assign(static_cast<std::size_t>(bytes / sizeof(T)), T{});
  detail::checked_file_reader r;
  std::uint64_t size = 0;
  EMBCACHE_RETURN_IF_ERROR(r.open(path, &size));
  if (size != bytes) {
    return status::corruption("'" + path + "' changed size to " + std::to_string(size) +
                              " bytes while being read, expected " + std::to_string(bytes));
  }
  EMBCACHE_RETURN_IF_ERROR(r.read(out->data(), static_cast<std::size_t>(bytes)));
  *digest = r.digest();
  return {};
}

// Field readers that name the manifest and the field in every refusal.
struct fields {
  std::string path;

  status bad(const std::string& field, const char* what) const {
    return status::corruption("'" + path + "': field '" + field + "' must be " + what);
  }
  status str(const nlohmann::json& o, const char* name, const std::string& at,
             std::string* out) const {
    const auto it = o.find(name);
    if (it == o.end() || !it->is_string()) return bad(at + name, "a string");
    *out = it->get<std::string>();
    return {};
  }
  status u64(const nlohmann::json& o, const char* name, const std::string& at,
             std::uint64_t* out) const {
    const auto it = o.find(name);
    if (it == o.end() || !it->is_number_unsigned()) return bad(at + name, "an unsigned integer");
    *out = it->get<std::uint64_t>();
    return {};
  }
};

bool usable_folder_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos &&
         n.find('\0') == std::string::npos;
}

// One file of a table: its manifest entry checked against the size its count gives and the
// file's real size, then read and checked against its checksum.
template <class T>
status read_table_file(const fields& f, const nlohmann::json& files, const std::string& at,
                       const std::string& folder, const char* name, std::uint64_t count,
                       std::uint64_t per_row, const char* per_row_field, std::vector<T>* out) {
  const std::string fat = at + "files." + name;
  const auto fe = files.find(name);
  if (fe == files.end() || !fe->is_object()) return f.bad(fat, "an object");
  std::uint64_t bytes = 0, want_digest = 0;
  std::string digest_text;
  EMBCACHE_RETURN_IF_ERROR(f.u64(*fe, "bytes", fat + ".", &bytes));
  EMBCACHE_RETURN_IF_ERROR(f.str(*fe, "xxh64", fat + ".", &digest_text));
  if (!detail::parse_hex64(digest_text, &want_digest)) {
    return f.bad(fat + ".xxh64", "16 hex digits");
  }
  const std::string sizes =
      at + (std::strcmp(name, "erased") == 0 ? "erased " : "count ") + std::to_string(count) +
      (per_row_field ? " and " + at + per_row_field + " " + std::to_string(per_row) : "") + " (" +
      std::to_string(sizeof(T)) + "-byte items)";
  std::uint64_t expect = 0;
  if (!checked_mul(count, per_row, &expect) || !checked_mul(expect, sizeof(T), &expect)) {
    return status::corruption("'" + f.path + "': the size of '" + name + "' given by " + sizes +
                              " overflows 64 bits");
  }
  if (bytes != expect) {
    return status::corruption("'" + f.path + "': " + fat + ".bytes is " + std::to_string(bytes) +
                              ", expected " + std::to_string(expect) + " from " + sizes);
  }
  const std::string path = folder + "/" + name;
  auto actual = file_size(path);
  if (!actual.ok()) return actual.get_status();
  if (actual.value() != expect) {
    return status::corruption("'" + path + "' is " + std::to_string(actual.value()) +
                              " bytes, expected " + std::to_string(expect) + " from " + sizes +
                              " of '" + f.path + "'" +
                              (actual.value() < expect ? " (truncated)" : ""));
  }
  std::uint64_t digest = 0;
  EMBCACHE_RETURN_IF_ERROR(read_items(path, expect, out, &digest));
  if (digest != want_digest) {
    return status::corruption("'" + path + "' has checksum " + detail::hex64(digest) + ", '" +
                              f.path + "' says \"" + digest_text + "\" (" + fat + ".xxh64)");
  }
  return {};
}

status check_finite(const std::vector<float>& v, std::size_t width,
                    const std::vector<std::int64_t>& keys, const std::string& path) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      return status::invalid_argument("'" + path + "' holds " + std::to_string(v[i]) + " for key " +
                                      std::to_string(keys[i / width]) + " (float " +
                                      std::to_string(i % width) + " of its row); expected finite");
    }
  }
  return {};
}

// A key repeated in `keys`, or outside the key type: invalid_argument naming the file and key.
status check_keys(const std::vector<std::int64_t>& keys, const std::string& key_type,
                  const std::string& path, std::vector<std::int64_t>* sorted) {
  *sorted = keys;
  std::sort(sorted->begin(), sorted->end());
  const auto dup = std::adjacent_find(sorted->begin(), sorted->end());
  if (dup != sorted->end()) {
    return status::invalid_argument("'" + path + "' repeats key " + std::to_string(*dup) +
                                    "; expected each key once");
  }
  if (key_type == "uint32" && !sorted->empty() &&
      (sorted->front() < 0 || sorted->back() > std::int64_t{0xffffffff})) {
    const std::int64_t k = sorted->front() < 0 ? sorted->front() : sorted->back();
    return status::invalid_argument("'" + path + "' holds key " + std::to_string(k) +
                                    ", outside the key type uint32");
  }
  return {};
}

// The state of a save's table from HugeCTR's optimizer files (hugectr_state_files), each
// float32[count][dim], interleaved into rows of state_width floats.
status read_state_files(const fields& f, const nlohmann::json& files, const std::string& at,
                        const std::string& folder, std::uint64_t count, folder_table* t) {
  optimizer_kind kind{};
  if (!optimizer_kind_from_string(t->optimizer, &kind)) {
    return f.bad(at + "optimizer", "sgd, adagrad, adam or ftrl");
  }
  const auto names = hugectr_state_files(kind);
  if (names.size() * t->dim != t->state_width) {
    return status::corruption("'" + f.path + "': " + at + "state_width " +
                              std::to_string(t->state_width) + " does not match optimizer " +
                              t->optimizer + " and dim " + std::to_string(t->dim) + " (" +
                              std::to_string(names.size()) + " state files of dim floats)");
  }
  // count * dim * 4 bytes were checked against a file already (emb_vector); state_width <= 2 dim.
  t->states.assign(static_cast<std::size_t>(count) * t->state_width, 0.0f);
  std::vector<float> part;
  for (std::size_t p = 0; p < names.size(); ++p) {
    EMBCACHE_RETURN_IF_ERROR(
        read_table_file(f, files, at, folder, names[p], count, t->dim, "dim", &part));
    for (std::size_t i = 0; i < count; ++i) {
      std::copy(part.begin() + i * t->dim, part.begin() + (i + 1) * t->dim,
                t->states.begin() + i * t->state_width + p * t->dim);
    }
  }
  return {};
}

status read_table(const fields& f, const nlohmann::json& e, const std::string& at,
                  const std::string& dir, bool is_delta, const std::string& key_type,
                  folder_table* t) {
  std::uint64_t dim = 0, state_width = 0, count = 0, erased = 0;
  EMBCACHE_RETURN_IF_ERROR(f.u64(e, "dim", at, &dim));
  EMBCACHE_RETURN_IF_ERROR(f.u64(e, "state_width", at, &state_width));
  EMBCACHE_RETURN_IF_ERROR(f.str(e, "optimizer", at, &t->optimizer));
  EMBCACHE_RETURN_IF_ERROR(f.u64(e, "count", at, &count));
  if (dim == 0 || dim > max_dim) return f.bad(at + "dim", "an integer in [1, 1048576]");
  if (state_width > 2 * dim) return f.bad(at + "state_width", "at most 2 * dim");
  t->dim = static_cast<std::size_t>(dim);
  t->state_width = static_cast<std::size_t>(state_width);
  if (is_delta) {
    EMBCACHE_RETURN_IF_ERROR(f.u64(e, "erased", at, &erased));
    EMBCACHE_RETURN_IF_ERROR(f.u64(e, "since_version", at, &t->since_version));
    EMBCACHE_RETURN_IF_ERROR(f.u64(e, "until_version", at, &t->version));
    if (t->since_version > t->version) {
      return status::corruption("'" + f.path + "': " + at + "since_version " +
                                std::to_string(t->since_version) + " is above " + at +
                                "until_version " + std::to_string(t->version));
    }
  } else {
    EMBCACHE_RETURN_IF_ERROR(f.u64(e, "version", at, &t->version));
  }
  const auto files = e.find("files");
  if (files == e.end() || !files->is_object()) return f.bad(at + "files", "an object");
  const std::string folder = dir + "/" + t->name;
  EMBCACHE_RETURN_IF_ERROR(
      read_table_file(f, *files, at, folder, "key", count, 1, nullptr, &t->keys));
  EMBCACHE_RETURN_IF_ERROR(
      read_table_file(f, *files, at, folder, "emb_vector", count, dim, "dim", &t->vectors));
  EMBCACHE_RETURN_IF_ERROR(
      read_table_file(f, *files, at, folder, "version", count, 1, nullptr, &t->versions));
  // A delta holds its state as one opt_state, when exported with it; so did saves of earlier
  // versions (always, empty for state width 0). A save now holds HugeCTR's optimizer files.
  if (files->contains("opt_state") || (is_delta && state_width > 0)) {
    EMBCACHE_RETURN_IF_ERROR(read_table_file(f, *files, at, folder, "opt_state", count, state_width,
                                             "state_width", &t->states));
  } else if (!is_delta && state_width > 0) {
    EMBCACHE_RETURN_IF_ERROR(read_state_files(f, *files, at, folder, count, t));
  }
  if (!is_delta && files->contains("slot_id")) {
    EMBCACHE_RETURN_IF_ERROR(
        read_table_file(f, *files, at, folder, "slot_id", count, 1, nullptr, &t->slot_ids));
  }
  std::vector<std::int64_t> sorted, sorted_erased;
  EMBCACHE_RETURN_IF_ERROR(check_keys(t->keys, key_type, folder + "/key", &sorted));
  EMBCACHE_RETURN_IF_ERROR(check_finite(t->vectors, t->dim, t->keys, folder + "/emb_vector"));
  if (t->state_width > 0) {
    EMBCACHE_RETURN_IF_ERROR(
        check_finite(t->states, t->state_width, t->keys, folder + "/opt_state"));
  }
  if (is_delta) {
    EMBCACHE_RETURN_IF_ERROR(
        read_table_file(f, *files, at, folder, "erased", erased, 1, nullptr, &t->erased));
    EMBCACHE_RETURN_IF_ERROR(check_keys(t->erased, key_type, folder + "/erased", &sorted_erased));
    for (std::int64_t k : sorted_erased) {
      if (std::binary_search(sorted.begin(), sorted.end(), k)) {
        return status::invalid_argument("'" + folder + "': key " + std::to_string(k) +
                                        " is both a row ('key') and a tombstone ('erased')");
      }
    }
  }
  return {};
}

result<model_folder> read_folder(const std::string& dir_in, bool is_delta) {
  model_folder m;
  m.is_delta = is_delta;
  m.path = detail::strip_slashes(dir_in);
  const fields f{m.path + "/manifest.json"};
  auto size = file_size(f.path);
  if (!size.ok()) return size.get_status();
  if (size.value() > max_manifest_bytes) {
    return status::corruption("'" + f.path + "' has " + std::to_string(size.value()) +
                              " bytes, more than the " + std::to_string(max_manifest_bytes) +
                              " a manifest may have");
  }
  std::vector<char> text;
  std::uint64_t ignored = 0;
  EMBCACHE_RETURN_IF_ERROR(read_items(f.path, size.value(), &text, &ignored));
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return status::corruption("'" + f.path + "' is not a JSON object");
  }
  const char* want_format = is_delta ? "embcache-delta" : "embcache-model";
  std::string format;
  EMBCACHE_RETURN_IF_ERROR(f.str(j, "format", "", &format));
  if (format != want_format) {
    return status::invalid_argument("'" + f.path + "' has format '" + format + "', expected '" +
                                    want_format + "'");
  }
  std::uint64_t format_version = 0;
  EMBCACHE_RETURN_IF_ERROR(f.u64(j, "format_version", "", &format_version));
  if (format_version != static_cast<std::uint64_t>(model_format_version)) {
    return status::unsupported("'" + f.path + "' has format_version " +
                               std::to_string(format_version) + ", expected " +
                               std::to_string(model_format_version));
  }
  EMBCACHE_RETURN_IF_ERROR(f.str(j, "key_type", "", &m.key_type));
  if (m.key_type != "int64" && m.key_type != "uint32") {
    return status::invalid_argument("'" + f.path + "' has key_type '" + m.key_type +
                                    "', expected 'int64' or 'uint32'");
  }
  if (is_delta) {
    EMBCACHE_RETURN_IF_ERROR(f.u64(j, "sequence", "", &m.sequence));
  } else if (j.contains("applied_delta")) {
    EMBCACHE_RETURN_IF_ERROR(f.u64(j, "applied_delta", "", &m.sequence));
  }
  const auto tables = j.find("tables");
  if (tables == j.end() || !tables->is_array()) return f.bad("tables", "an array");
  m.tables.resize(tables->size());
  for (std::size_t i = 0; i < tables->size(); ++i) {
    const std::string at = "tables[" + std::to_string(i) + "].";
    if (!(*tables)[i].is_object()) return f.bad(at.substr(0, at.size() - 1), "an object");
    folder_table& t = m.tables[i];
    EMBCACHE_RETURN_IF_ERROR(f.str((*tables)[i], "name", at, &t.name));
    if (!usable_folder_name(t.name)) return f.bad(at + "name", "a folder name (no '/')");
    for (std::size_t k = 0; k < i; ++k) {
      if (m.tables[k].name == t.name) {
        return status::corruption("'" + f.path + "' lists table '" + t.name + "' twice");
      }
    }
    EMBCACHE_RETURN_IF_ERROR(read_table(f, (*tables)[i], at, m.path, is_delta, m.key_type, &t)
                                 .with_context("table '" + t.name + "' of '" + m.path + "'"));
  }
  return m;
}

}  // namespace

std::string model_folder_of(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir + "/manifest.json", ec) && fs::exists(dir + "/sparse/manifest.json", ec))
    return dir + "/sparse";
  return dir;
}

result<model_folder> read_model_folder(const std::string& dir) { return read_folder(dir, false); }

result<model_folder> read_delta_folder(const std::string& dir) { return read_folder(dir, true); }

result<std::vector<delta_entry>> list_deltas(const std::string& deltas_dir) {
  std::error_code ec;
  if (!fs::is_directory(deltas_dir, ec)) {
    return status::not_found("deltas folder '" + deltas_dir + "' does not exist");
  }
  std::vector<delta_entry> out;
  for (const auto& e : fs::directory_iterator(deltas_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("delta-", 0) != 0 || name.size() < 12 || name.size() > 25) continue;
    const std::string digits = name.substr(6);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    errno = 0;
    const unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
    if (errno == ERANGE) continue;
    out.push_back({v, (fs::path(deltas_dir) / name).string()});
  }
  if (ec) return status::io_error("cannot list '" + deltas_dir + "': " + ec.message());
  std::sort(out.begin(), out.end(),
            [](const delta_entry& a, const delta_entry& b) { return a.sequence < b.sequence; });
  for (std::size_t i = 1; i < out.size(); ++i) {
    if (out[i].sequence == out[i - 1].sequence) {
      return status::invalid_argument("'" + out[i - 1].path + "' and '" + out[i].path +
                                      "' have the same number");
    }
  }
  return out;
}

}  // namespace embcache
