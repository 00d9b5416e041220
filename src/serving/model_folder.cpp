// Reading model and delta folders for serving: the manifests and files through the one reader
// the training cache loads with (format/model_folder.hpp), and the folders of numbered deltas.
#include "format/model_folder.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "embcache/serving.hpp"

namespace embcache {

namespace {

namespace fs = std::filesystem;

// A folder through the one reader of model and delta folders (format/model_folder.hpp), with
// the checks that need no schema: shapes, repeated keys, key type, non-finite floats, tombstones.
result<model_folder> read_folder(const std::string& dir, detail::folder_kind kind) {
  auto manifest = detail::read_folder_manifest(dir, kind);
  if (!manifest.ok()) return manifest.get_status();
  const detail::folder_manifest& fm = manifest.value();
  model_folder m;
  m.is_delta = kind == detail::folder_kind::delta;
  m.path = fm.dir;
  m.key_type = fm.key_type;
  m.sequence = fm.sequence;
  m.run_id = fm.run_id;
  m.tables.resize(fm.tables.size());
  detail::row_rules rules;
  rules.key_type = fm.key_type;
  for (std::size_t i = 0; i < fm.tables.size(); ++i) {
    const detail::manifest_table& e = fm.tables[i];
    folder_table& t = m.tables[i];
    const std::string where = "table '" + e.name + "' of '" + m.path + "'";
    EMBCACHE_RETURN_IF_ERROR(detail::check_table_shape(fm, e).with_context(where));
    detail::table_rows rows;
    EMBCACHE_RETURN_IF_ERROR(detail::read_listed_table(fm, e, &rows).with_context(where));
    EMBCACHE_RETURN_IF_ERROR(
        detail::check_table_rows(rows, static_cast<std::size_t>(e.dim), rules).with_context(where));
    t.name = e.name;
    t.dim = static_cast<std::size_t>(e.dim);
    t.state_width = static_cast<std::size_t>(e.state_width);
    t.optimizer = e.optimizer;
    t.version = e.version;
    t.since_version = e.since_version;
    t.keys = std::move(rows.keys);
    t.vectors = std::move(rows.vectors);
    t.states = std::move(rows.states);
    t.versions = std::move(rows.versions);
    t.erased = std::move(rows.erased);
    t.slot_ids = std::move(rows.slot_ids);
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

result<model_folder> read_model_folder(const std::string& dir) {
  return read_folder(dir, detail::folder_kind::model);
}

result<model_folder> read_delta_folder(const std::string& dir) {
  return read_folder(dir, detail::folder_kind::delta);
}

result<std::vector<delta_entry>> list_deltas(const std::string& deltas_dir) {
  std::error_code ec;
  if (!fs::is_directory(deltas_dir, ec)) {
    return status::not_found("deltas folder '" + deltas_dir + "' does not exist");
  }
  std::vector<delta_entry> out;
  std::string sharded, single;  // one of each kind found
  for (const auto& e : fs::directory_iterator(deltas_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("delta-", 0) != 0 || name.size() < 12) continue;
    // A sharded run's export folder names each delta by its parts file.
    const std::string suffix = ".parts.json";
    const bool parts = name.size() > suffix.size() &&
                       name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    const std::string digits = name.substr(6, name.size() - 6 - (parts ? suffix.size() : 0));
    if (digits.size() < 6) continue;
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    // Named like a delta, it is one: a number too large for 64 bits is refused, not skipped.
    errno = 0;
    const unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
    if (errno == ERANGE)
      return status::invalid_argument("'" + (fs::path(deltas_dir) / name).string() +
                                      "': the delta number " + digits +
                                      " does not fit in 64 bits (at most 18446744073709551615)");
    out.push_back({v, (fs::path(deltas_dir) / name).string()});
    (parts ? sharded : single) = out.back().path;
  }
  if (!sharded.empty() && !single.empty())
    return status::invalid_argument(
        "deltas folder '" + deltas_dir + "' holds both delta folders ('" + single +
        "') and a sharded run's parts files ('" + sharded + "'): the exports of two runs");
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
