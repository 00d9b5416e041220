// Reading model and delta folders (model_folder.hpp): the one manifest reader and validator, the
// files of a table checked against it, plain HugeCTR folders, and the checks of the rows.
// Compiled as part of model_folder.cpp: one translation unit for the module, so that
// nlohmann-json is parsed once.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/durable_file.hpp"
#include "common/memory_check.hpp"
#include "format/checked_io.hpp"
#include "format/model_folder.hpp"

namespace embcache::detail {

namespace {

namespace fs = std::filesystem;

// Far above any real manifest (a few hundred bytes per table).
constexpr std::uint64_t max_manifest_bytes = std::uint64_t{64} << 20;
// Bounds that keep a row's byte count far from overflow; far above any real table.
constexpr std::uint64_t max_dim = std::uint64_t{1} << 20;

result<std::uint64_t> regular_file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno_status("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) return status::corruption("'" + path + "' is not a regular file");
  return static_cast<std::uint64_t>(st.st_size);
}

// Reads exactly `bytes` (already checked against the file's size) into `out`, hashing them; a
// file that changed size since is refused.
template <class T>
status read_items(const std::string& path, std::uint64_t bytes, std::vector<T>* out,
                  std::uint64_t* digest) {
  if (bytes % sizeof(T) != 0 || bytes / sizeof(T) > out->max_size()) {
    return status::corruption("'" + path + "' has " + std::to_string(bytes) +
                              " bytes, not a whole number of " + std::to_string(sizeof(T)) +
                              "-byte items");
  }
  // A size that agrees with its manifest can still be more than this machine holds.
  EMBCACHE_RETURN_IF_ERROR(check_fits_in_memory("reading '" + path + "'", bytes));
  out->assign(static_cast<std::size_t>(bytes / sizeof(T)), T{});
  checked_file_reader r;
  std::uint64_t size = 0;
  EMBCACHE_RETURN_IF_ERROR(r.open(path, &size));
  if (size != bytes) {
    return status::corruption("'" + path + "' changed size to " + std::to_string(size) +
                              " bytes while being read, expected " + std::to_string(bytes));
  }
  EMBCACHE_RETURN_IF_ERROR(r.read(out->data(), static_cast<std::size_t>(bytes)));
  if (digest) *digest = r.digest();
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

// A save's optional `expiry` object of a table (model_folder.hpp): boundaries, then at most that
// many (and at most 2^32: ttl_passes is 32-bit) non-decreasing pass versions, none above the
// table's version.
status read_expiry_clock(const fields& f, const nlohmann::json& e, manifest_table* t) {
  const auto it = e.find("expiry");
  if (it == e.end()) return {};
  const std::string at = t->at + "expiry.";
  if (!it->is_object()) return f.bad(t->at + "expiry", "an object");
  EMBCACHE_RETURN_IF_ERROR(f.u64(*it, "boundaries", at, &t->expiry.boundaries));
  const auto pv = it->find("pass_versions");
  if (pv == it->end() || !pv->is_array()) return f.bad(at + "pass_versions", "an array");
  if (pv->size() > t->expiry.boundaries || pv->size() > (std::uint64_t{1} << 32)) {
    return f.bad(at + "pass_versions", "an array of at most 'boundaries' values");
  }
  std::uint64_t prev = 0;
  t->expiry.versions.reserve(pv->size());
  for (const auto& v : *pv) {
    if (!v.is_number_unsigned()) return f.bad(at + "pass_versions", "unsigned integers");
    const std::uint64_t x = v.get<std::uint64_t>();
    if (x < prev || x > t->version) {
      return f.bad(at + "pass_versions", "non-decreasing and at most the table's version");
    }
    t->expiry.versions.push_back(x);
    prev = x;
  }
  // The steps rule's clock: optional (saves without ttl_steps, or before its first step).
  if (it->contains("steps")) {
    EMBCACHE_RETURN_IF_ERROR(f.u64(*it, "steps", at, &t->expiry.steps));
    const auto sv = it->find("step_versions");
    if (sv == it->end() || !sv->is_array()) return f.bad(at + "step_versions", "an array");
    if (sv->size() > t->expiry.steps) {
      return f.bad(at + "step_versions", "an array of at most 'steps' values");
    }
    prev = 0;
    t->expiry.step_versions.reserve(sv->size());
    for (const auto& v : *sv) {
      if (!v.is_number_unsigned()) return f.bad(at + "step_versions", "unsigned integers");
      const std::uint64_t x = v.get<std::uint64_t>();
      if (x < prev || x > t->version) {
        return f.bad(at + "step_versions", "non-decreasing and at most the table's version");
      }
      t->expiry.step_versions.push_back(x);
      prev = x;
    }
  }
  t->has_expiry = true;
  return {};
}

status read_manifest_table(const fields& f, const nlohmann::json& e, folder_kind kind,
                           manifest_table* t) {
  const std::string& at = t->at;
  EMBCACHE_RETURN_IF_ERROR(f.u64(e, "dim", at, &t->dim));
  EMBCACHE_RETURN_IF_ERROR(f.u64(e, "state_width", at, &t->state_width));
  EMBCACHE_RETURN_IF_ERROR(f.str(e, "optimizer", at, &t->optimizer));
  EMBCACHE_RETURN_IF_ERROR(f.u64(e, "count", at, &t->count));
  if (kind == folder_kind::delta) {
    EMBCACHE_RETURN_IF_ERROR(f.u64(e, "erased", at, &t->erased));
    EMBCACHE_RETURN_IF_ERROR(f.u64(e, "since_version", at, &t->since_version));
    EMBCACHE_RETURN_IF_ERROR(f.u64(e, "until_version", at, &t->version));
    if (t->since_version > t->version) {
      return status::corruption("'" + f.path + "': " + at + "since_version " +
                                std::to_string(t->since_version) + " is above " + at +
                                "until_version " + std::to_string(t->version));
    }
  } else {
    EMBCACHE_RETURN_IF_ERROR(f.u64(e, "version", at, &t->version));
    EMBCACHE_RETURN_IF_ERROR(read_expiry_clock(f, e, t));
  }
  const auto files = e.find("files");
  if (files == e.end() || !files->is_object()) return f.bad(at + "files", "an object");
  t->files = *files;
  return {};
}

// One listed file of a table: its manifest entry against the size its count gives and the
// file's real size, then its content against its checksum.
template <class T>
status read_listed_file(const fields& f, const manifest_table& t, const std::string& folder,
                        const std::string& name, std::uint64_t count, std::uint64_t per_row,
                        const char* per_row_field, std::vector<T>* out) {
  const std::string& at = t.at;
  const std::string fat = at + "files." + name;
  const auto fe = t.files.find(name);
  if (fe == t.files.end() || !fe->is_object()) return f.bad(fat, "an object");
  std::uint64_t bytes = 0, want_digest = 0;
  std::string digest_text;
  EMBCACHE_RETURN_IF_ERROR(f.u64(*fe, "bytes", fat + ".", &bytes));
  EMBCACHE_RETURN_IF_ERROR(f.str(*fe, "xxh64", fat + ".", &digest_text));
  if (!parse_hex64(digest_text, &want_digest)) return f.bad(fat + ".xxh64", "16 hex digits");
  const std::string sizes =
      at + (name == "erased" ? "erased " : "count ") + std::to_string(count) +
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
  auto actual = regular_file_size(path);
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
    return status::corruption("'" + path + "' has checksum " + hex64(digest) + ", '" + f.path +
                              "' says \"" + digest_text + "\" (" + fat + ".xxh64)");
  }
  return {};
}

// Scatters one part of the state (`width` floats a row) into the interleaved states.
void interleave(const std::vector<float>& part, const table_rows::state_part& p,
                std::size_t state_width, std::vector<float>* states) {
  const std::size_t n = p.width ? part.size() / p.width : 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::copy(part.begin() + i * p.width, part.begin() + (i + 1) * p.width,
              states->begin() + i * state_width + p.offset);
  }
}

// Reads an optional file of a plain HugeCTR table folder holding `per_row` items of T for each
// of `n` rows; false in `*found` when it is absent. Sizes are checked before reading.
template <class T>
status read_hugectr_rows(const std::string& path, std::uint64_t n, std::uint64_t per_row,
                         std::vector<T>* out, bool* found) {
  std::error_code ec;
  *found = fs::exists(path, ec);
  if (!*found) return {};
  auto bytes = regular_file_size(path);
  if (!bytes.ok()) return bytes.get_status();
  std::uint64_t expect = 0;
  if (!checked_mul(n, per_row, &expect) || !checked_mul(expect, sizeof(T), &expect)) {
    return status::corruption("the size of '" + path + "' for " + std::to_string(n) + " keys of " +
                              std::to_string(per_row) + " items overflows 64 bits");
  }
  if (bytes.value() != expect) {
    return status::corruption("'" + path + "' has " + std::to_string(bytes.value()) + " bytes; " +
                              std::to_string(n) + " keys need " + std::to_string(n) + " * " +
                              std::to_string(per_row) + " * " + std::to_string(sizeof(T)) +
                              (bytes.value() < expect ? " (truncated)" : ""));
  }
  return read_items(path, expect, out, nullptr);
}

// A key repeated in `keys` (unless allowed) or outside the key type: invalid_argument naming the
// file and the key.
status check_keys(const std::vector<std::int64_t>& keys, const std::string& path,
                  const row_rules& rules, bool allow_duplicates,
                  std::vector<std::int64_t>* sorted) {
  *sorted = keys;
  std::sort(sorted->begin(), sorted->end());
  if (!allow_duplicates) {
    const auto dup = std::adjacent_find(sorted->begin(), sorted->end());
    if (dup != sorted->end()) {
      return status::invalid_argument("'" + path + "' repeats key " + std::to_string(*dup) +
                                      "; expected each key once" + rules.duplicate_hint);
    }
  }
  if (rules.key_type == key_type::uint32 && !sorted->empty() &&
      (sorted->front() < 0 || sorted->back() > std::int64_t{0xffffffff})) {
    const std::int64_t k = sorted->front() < 0 ? sorted->front() : sorted->back();
    return status::invalid_argument("'" + path + "' holds key " + std::to_string(k) +
                                    ", outside the key type uint32");
  }
  return {};
}

// The first non-finite float of `values` (rows of `width`, floats [offset, offset + part) of each
// row from the file `path`), naming the row's key.
status check_finite(const std::vector<float>& values, std::size_t width, std::size_t offset,
                    std::size_t part, const std::vector<std::int64_t>& keys,
                    const std::string& path, const std::string& hint) {
  for (std::size_t i = 0; i < keys.size(); ++i) {
    for (std::size_t j = 0; j < part; ++j) {
      const float v = values[i * width + offset + j];
      if (std::isfinite(v)) continue;
      return status::invalid_argument("'" + path + "' holds " + std::to_string(v) + " for key " +
                                      std::to_string(keys[i]) + " (float " + std::to_string(j) +
                                      " of its row); expected finite floats" + hint);
    }
  }
  return {};
}

}  // namespace

result<folder_manifest> read_folder_manifest(const std::string& dir_in, folder_kind kind) {
  folder_manifest m;
  m.kind = kind;
  m.dir = strip_slashes(dir_in);
  m.path = m.dir + "/manifest.json";
  const fields f{m.path};
  auto size = regular_file_size(f.path);
  if (!size.ok()) return size.get_status();
  if (size.value() > max_manifest_bytes) {
    return status::corruption("'" + f.path + "' has " + std::to_string(size.value()) +
                              " bytes, more than the " + std::to_string(max_manifest_bytes) +
                              " a manifest may have");
  }
  std::vector<char> text;
  EMBCACHE_RETURN_IF_ERROR(read_items(f.path, size.value(), &text, nullptr));
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return status::corruption("'" + f.path + "' is not a JSON object");
  }
  const char* want_format = kind == folder_kind::delta ? "embcache-delta" : "embcache-model";
  std::string format;
  EMBCACHE_RETURN_IF_ERROR(f.str(j, "format", "", &format));
  if (format != want_format) {
    return status::invalid_argument("'" + f.path + "' has format '" + format + "', expected '" +
                                    want_format + "'");
  }
  const auto fv = j.find("format_version");
  if (fv == j.end() || !fv->is_number_integer()) return f.bad("format_version", "an integer");
  if (!fv->is_number_unsigned() ||
      fv->get<std::uint64_t>() != static_cast<std::uint64_t>(model_format_version)) {
    return status::unsupported("'" + f.path + "' has format_version " + fv->dump() + ", expected " +
                               std::to_string(model_format_version));
  }
  std::string key_name;
  EMBCACHE_RETURN_IF_ERROR(f.str(j, "key_type", "", &key_name));
  if (!key_type_from_name(key_name, &m.key_type)) {
    return status::invalid_argument("'" + f.path + "' has key_type '" + key_name +
                                    "', expected 'int64' or 'uint32'");
  }
  if (kind == folder_kind::delta) {
    EMBCACHE_RETURN_IF_ERROR(f.u64(j, "sequence", "", &m.sequence));
  } else if (j.contains("applied_delta")) {
    EMBCACHE_RETURN_IF_ERROR(f.u64(j, "applied_delta", "", &m.sequence));
  }
  if (j.contains("run_id")) {  // written since run identities exist; older folders have none
    EMBCACHE_RETURN_IF_ERROR(f.str(j, "run_id", "", &m.run_id));
    if (!is_run_id(m.run_id)) return f.bad("run_id", "32 lowercase hex digits");
  }
  const auto tables = j.find("tables");
  if (tables == j.end() || !tables->is_array()) return f.bad("tables", "an array");
  m.tables.resize(tables->size());
  for (std::size_t i = 0; i < tables->size(); ++i) {
    manifest_table& t = m.tables[i];
    t.at = "tables[" + std::to_string(i) + "].";
    const nlohmann::json& e = (*tables)[i];
    if (!e.is_object()) return f.bad(t.at.substr(0, t.at.size() - 1), "an object");
    EMBCACHE_RETURN_IF_ERROR(f.str(e, "name", t.at, &t.name));
    if (!usable_folder_name(t.name)) return f.bad(t.at + "name", "a folder name (no '/')");
    for (std::size_t k = 0; k < i; ++k) {
      if (m.tables[k].name == t.name) {
        return status::corruption("'" + f.path + "' lists table '" + t.name + "' twice");
      }
    }
    EMBCACHE_RETURN_IF_ERROR(read_manifest_table(f, e, kind, &t));
  }
  return m;
}

status match_schema(const folder_manifest& m, embcache::key_type key_type,
                    const std::vector<table_schema>& want, std::vector<std::size_t>* order) {
  if (m.key_type != key_type) {
    return status::invalid_argument("'" + m.path + "' holds " + to_string(m.key_type) +
                                    " keys, expected " + to_string(key_type));
  }
  if (m.tables.size() != want.size()) {
    return status::invalid_argument("'" + m.path + "' has " + std::to_string(m.tables.size()) +
                                    " tables, the cache " + std::to_string(want.size()));
  }
  order->clear();
  for (const table_schema& w : want) {
    const std::string where = "table '" + w.name + "' of '" + m.dir + "'";
    const auto it = std::find_if(m.tables.begin(), m.tables.end(),
                                 [&](const manifest_table& t) { return t.name == w.name; });
    if (it == m.tables.end()) return status::not_found(where + " is missing");
    if (it->dim != w.dim || it->state_width != w.state_width ||
        it->optimizer != to_string(w.optimizer)) {
      return status::invalid_argument(where + " has dim " + std::to_string(it->dim) +
                                      ", state width " + std::to_string(it->state_width) +
                                      ", optimizer " + it->optimizer + "; expected " +
                                      std::to_string(w.dim) + ", " + std::to_string(w.state_width) +
                                      ", " + to_string(w.optimizer));
    }
    order->push_back(static_cast<std::size_t>(it - m.tables.begin()));
  }
  return {};
}

status check_table_shape(const folder_manifest& m, const manifest_table& t) {
  const fields f{m.path};
  if (t.dim == 0 || t.dim > max_dim) return f.bad(t.at + "dim", "an integer in [1, 1048576]");
  if (t.state_width > 2 * t.dim) return f.bad(t.at + "state_width", "at most 2 * dim");
  return {};
}

status read_listed_table(const folder_manifest& m, const manifest_table& t, table_rows* out) {
  const fields f{m.path};
  const bool delta = m.kind == folder_kind::delta;
  table_rows& r = *out;
  r.folder = m.dir + "/" + t.name;
  r.version = t.version;
  r.has_expiry = t.has_expiry;
  r.expiry = t.expiry;
  EMBCACHE_RETURN_IF_ERROR(read_listed_file(f, t, r.folder, "key", t.count, 1, nullptr, &r.keys));
  // The key file holds count keys: the table's other arrays (vectors, versions, state, slot ids
  // and one optimizer part at a time) must fit too, before any of them is allocated.
  std::uint64_t row_bytes = 0, table_bytes = 0;
  if (!checked_mul(t.dim, 8, &row_bytes) || !checked_mul(t.state_width, 4, &table_bytes) ||
      !checked_mul(t.count, row_bytes + table_bytes + 24, &table_bytes))
    table_bytes = UINT64_MAX;
  EMBCACHE_RETURN_IF_ERROR(check_fits_in_memory("'" + f.path + "': " + t.at + "count " +
                                                    std::to_string(t.count) + " (table '" + t.name +
                                                    "' of dim " + std::to_string(t.dim) + ")",
                                                table_bytes));
  EMBCACHE_RETURN_IF_ERROR(
      read_listed_file(f, t, r.folder, "emb_vector", t.count, t.dim, "dim", &r.vectors));
  EMBCACHE_RETURN_IF_ERROR(
      read_listed_file(f, t, r.folder, "version", t.count, 1, nullptr, &r.versions));
  // A delta holds its state as one opt_state, when exported with it; so did saves of earlier
  // versions. A save now holds HugeCTR's optimizer files.
  r.parts.clear();
  r.state_width = static_cast<std::size_t>(t.state_width);
  if (t.files.contains("opt_state") || (delta && t.state_width > 0)) {
    r.parts.push_back({"opt_state", 0, r.state_width});
  } else if (t.state_width > 0) {
    optimizer_kind kind{};
    if (!optimizer_kind_from_string(t.optimizer, &kind)) {
      return f.bad(t.at + "optimizer", "sgd, adagrad, adam or ftrl");
    }
    const auto names = hugectr_state_files(kind);
    if (names.size() * t.dim != t.state_width) {
      return status::corruption("'" + f.path + "': " + t.at + "state_width " +
                                std::to_string(t.state_width) + " does not match optimizer " +
                                t.optimizer + " and dim " + std::to_string(t.dim) + " (" +
                                std::to_string(names.size()) + " state files of dim floats)");
    }
    for (std::size_t p = 0; p < names.size(); ++p) {
      r.parts.push_back({names[p], p * r.state_width / names.size(), r.state_width / names.size()});
    }
  }
  if (r.parts.size() == 1) {
    EMBCACHE_RETURN_IF_ERROR(
        read_listed_file(f, t, r.folder, r.parts[0].file, t.count, r.parts[0].width,
                         r.parts[0].file == "opt_state" ? "state_width" : "dim", &r.states));
  } else if (!r.parts.empty()) {
    // count * dim * 4 bytes were checked against a file already (emb_vector); state_width <= 2 dim.
    r.states.assign(static_cast<std::size_t>(t.count) * r.state_width, 0.0f);
    std::vector<float> part;
    for (const auto& p : r.parts) {
      EMBCACHE_RETURN_IF_ERROR(
          read_listed_file(f, t, r.folder, p.file, t.count, p.width, "dim", &part));
      interleave(part, p, r.state_width, &r.states);
    }
  }
  r.has_slot_ids = t.files.contains("slot_id");  // a delta's when every row of it had one
  if (r.has_slot_ids) {
    EMBCACHE_RETURN_IF_ERROR(
        read_listed_file(f, t, r.folder, "slot_id", t.count, 1, nullptr, &r.slot_ids));
  }
  if (delta) {
    EMBCACHE_RETURN_IF_ERROR(
        read_listed_file(f, t, r.folder, "erased", t.erased, 1, nullptr, &r.erased));
  }
  return {};
}

status read_listed_words(const folder_manifest& m, const manifest_table& t, const std::string& name,
                         std::uint64_t words, std::vector<std::uint32_t>* out) {
  return read_listed_file(fields{m.path}, t, m.dir + "/" + t.name, name, words, 1, nullptr, out);
}

status read_hugectr_table(const std::string& folder, std::size_t dim, optimizer_kind optimizer,
                          table_rows* out) {
  table_rows& r = *out;
  r.folder = folder;
  const std::string key_path = folder + "/key", vec_path = folder + "/emb_vector";
  auto key_bytes = regular_file_size(key_path);
  if (!key_bytes.ok()) return key_bytes.get_status();
  if (key_bytes.value() % 8 != 0) {
    return status::corruption("'" + key_path + "' has " + std::to_string(key_bytes.value()) +
                              " bytes, not a multiple of 8 (int64 keys)");
  }
  const std::uint64_t n = key_bytes.value() / 8;
  auto vec_bytes = regular_file_size(vec_path);
  if (!vec_bytes.ok()) return vec_bytes.get_status();
  std::uint64_t expect = 0;
  if (!checked_mul(n, dim, &expect) || !checked_mul(expect, 4, &expect) ||
      vec_bytes.value() != expect) {
    return status::invalid_argument("'" + vec_path + "' has " + std::to_string(vec_bytes.value()) +
                                    " bytes; " + std::to_string(n) + " keys of dim " +
                                    std::to_string(dim) + " need " + std::to_string(n) + " * " +
                                    std::to_string(dim) + " * 4");
  }
  EMBCACHE_RETURN_IF_ERROR(read_items(key_path, key_bytes.value(), &r.keys, nullptr));
  EMBCACHE_RETURN_IF_ERROR(read_items(vec_path, expect, &r.vectors, nullptr));
  EMBCACHE_RETURN_IF_ERROR(
      read_hugectr_rows(folder + "/slot_id", n, 1, &r.slot_ids, &r.has_slot_ids));
  const auto names = hugectr_state_files(optimizer);
  r.parts.clear();
  r.state_width = names.size() * dim;
  r.states.assign(static_cast<std::size_t>(n) * r.state_width, 0.0f);
  std::string present, absent;
  std::vector<float> values;
  for (std::size_t p = 0; p < names.size(); ++p) {
    table_rows::state_part part{names[p], p * dim, dim};
    bool found = false;
    EMBCACHE_RETURN_IF_ERROR(read_hugectr_rows(folder + "/" + names[p], n, dim, &values, &found));
    (found ? present : absent) = names[p];
    if (!found) continue;
    interleave(values, part, r.state_width, &r.states);
    r.parts.push_back(std::move(part));
  }
  if (!present.empty() && !absent.empty()) {
    return status::corruption("'" + folder + "/" + absent + "' is missing while '" + present +
                              "' is there; the " + to_string(optimizer) +
                              " state needs all its files (or none: state initialized)");
  }
  if (r.parts.empty()) {
    r.state_width = 0;
    r.states.clear();
  }
  r.versions.assign(r.keys.size(), 1);
  r.version = 1;
  return {};
}

status check_table_rows(const table_rows& r, std::size_t dim, const row_rules& rules) {
  std::vector<std::int64_t> sorted, sorted_erased;
  EMBCACHE_RETURN_IF_ERROR(
      check_keys(r.keys, r.folder + "/key", rules, rules.allow_duplicate_keys, &sorted));
  if (!rules.allow_non_finite) {
    EMBCACHE_RETURN_IF_ERROR(check_finite(r.vectors, dim, 0, dim, r.keys, r.folder + "/emb_vector",
                                          rules.non_finite_hint));
    for (const auto& p : r.parts) {
      EMBCACHE_RETURN_IF_ERROR(check_finite(r.states, r.state_width, p.offset, p.width, r.keys,
                                            r.folder + "/" + p.file, rules.non_finite_hint));
    }
  }
  if (r.erased.empty()) return {};
  EMBCACHE_RETURN_IF_ERROR(
      check_keys(r.erased, r.folder + "/erased", rules, false, &sorted_erased));
  for (const std::int64_t k : sorted_erased) {
    if (std::binary_search(sorted.begin(), sorted.end(), k)) {
      return status::invalid_argument("'" + r.folder + "': key " + std::to_string(k) +
                                      " is both a row ('key') and a tombstone ('erased')");
    }
  }
  return {};
}

}  // namespace embcache::detail
