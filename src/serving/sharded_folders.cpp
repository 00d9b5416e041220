// A sharded run's saves and deltas read as one model: the parts of a sharded save
// (distributed/sharded_save.hpp) merged into one model folder in memory, and the ranks' parts of
// a delta (`delta-N.parts.json` and `rank-R/delta-N/`, written by the trainer's sharded path)
// merged into one delta. Their position counts deltas: a save recording applied_delta S stands at
// version S in every table, delta N runs from version N - 1 to N; so plan_deltas and
// advance_position check their order as they check a single process's.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>

#include "common/durable_file.hpp"
#include "embcache/criteo.hpp"
#include "embcache/distributed/ownership.hpp"
#include "embcache/distributed/sharded_save.hpp"
#include "embcache/host_store.hpp"
#include "embcache/serving.hpp"
#include "format/checked_io.hpp"
#include "format/model_folder.hpp"

namespace embcache {

namespace {

namespace fs = std::filesystem;

constexpr const char* parts_suffix = ".parts.json";

// Rows sorted by key: keys, vectors, states, versions and slot ids permuted together.
void sort_rows(folder_table& t) {
  std::vector<std::size_t> order(t.keys.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return t.keys[a] < t.keys[b]; });
  folder_table s;
  const std::size_t dim = t.dim, sw = t.state_width;
  for (const std::size_t i : order) {
    s.keys.push_back(t.keys[i]);
    s.versions.push_back(t.versions[i]);
    s.vectors.insert(s.vectors.end(), t.vectors.begin() + i * dim,
                     t.vectors.begin() + (i + 1) * dim);
    if (sw)
      s.states.insert(s.states.end(), t.states.begin() + i * sw, t.states.begin() + (i + 1) * sw);
    if (!t.slot_ids.empty()) s.slot_ids.push_back(t.slot_ids[i]);
  }
  t.keys = std::move(s.keys);
  t.versions = std::move(s.versions);
  t.vectors = std::move(s.vectors);
  t.states = std::move(s.states);
  t.slot_ids = std::move(s.slot_ids);
}

// The rows of part `r` of a table's sharded save, appended to `t` (each key must be owned by r).
template <class Key>
status read_part(const std::string& part_dir, const sharded_manifest& m, int r, folder_table& t) {
  std::error_code ec;
  if (!fs::is_directory(part_dir, ec))
    return status::not_found("rank " + std::to_string(r) + "'s part '" + part_dir + "' is missing");
  if (fs::exists(part_dir + "/CURRENT", ec))
    return status::unsupported("rank " + std::to_string(r) + "'s part '" + part_dir +
                               "' is a RocksDB checkpoint; serving reads the parts host stores "
                               "write (load the save into a run with host stores and save again)");
  host_store_options o;
  o.table_name = m.info.table_name;
  o.row_width = m.info.row_width;
  auto store = host_store<Key>::open(part_dir, o);
  if (!store.ok()) return store.get_status().with_context("rank " + std::to_string(r) + "'s part");
  const std::uint64_t want = m.parts[static_cast<std::size_t>(r)].rows;
  if (store.value()->size() != want)
    return status::corruption("'" + part_dir + "' holds " + std::to_string(store.value()->size()) +
                              " rows, the manifest's parts[" + std::to_string(r) + "].rows says " +
                              std::to_string(want));
  const std::size_t width = m.info.row_width, dim = m.info.dim;
  return store.value()->for_each(
      std::size_t{1} << 16,
      [&](const Key* k, const float* rows, const std::uint64_t* v, std::size_t n) -> status {
        for (std::size_t i = 0; i < n; ++i) {
          if (owner_of(k[i], m.world_size) != r)
            return status::corruption("'" + part_dir + "' holds key " + std::to_string(k[i]) +
                                      ", which rank " +
                                      std::to_string(owner_of(k[i], m.world_size)) + " owns");
          t.keys.push_back(static_cast<std::int64_t>(k[i]));
          t.versions.push_back(v[i]);
          const float* row = rows + i * width;
          t.vectors.insert(t.vectors.end(), row, row + dim);
          t.states.insert(t.states.end(), row + dim, row + width);
        }
        return status{};
      });
}

// The table folders of a sharded save: the sub-folders of `dir` with a manifest.json.
std::vector<std::string> sharded_tables(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (fs::exists(dir + "/manifest.json", ec)) return out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (it->is_directory(e2) && fs::exists(it->path() / "manifest.json", e2))
      out.push_back(it->path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

status check_same(const std::string& what, const std::string& a, const std::string& b,
                  const std::string& where) {
  if (a == b) return {};
  return status::invalid_argument(where + ": " + what + " '" + b + "', the others '" + a + "'");
}

std::string rank_part(int rank, std::uint64_t sequence) {
  char name[64];
  std::snprintf(name, sizeof name, "rank-%05d/delta-%06llu", rank,
                static_cast<unsigned long long>(sequence));
  return name;
}

}  // namespace

std::string sharded_save_of(const std::string& dir_in) {
  // A model folder, or a trainer save of one process (its sparse/ is one), is not sharded.
  const std::string dir = model_folder_of(detail::strip_slashes(dir_in));
  std::error_code ec;
  if (fs::exists(dir + "/manifest.json", ec)) return {};
  for (const std::string& d : {dir, dir + "/sparse"})
    if (!sharded_tables(d).empty()) return d;
  return {};
}

result<std::vector<sharded_manifest>> read_sharded_manifests(const std::string& dir_in) {
  const std::string dir = detail::strip_slashes(dir_in);
  const std::vector<std::string> names = sharded_tables(dir);
  if (names.empty())
    return status::not_found("'" + dir + "' is not a sharded save (no <table>/manifest.json)");
  std::vector<sharded_manifest> out;
  for (const std::string& name : names) {
    const std::string tdir = dir + "/" + name;
    auto parsed = read_sharded_manifest(tdir);
    if (!parsed.ok()) return parsed.get_status();
    const sharded_manifest& m = parsed.value();
    const std::string where = "'" + tdir + "/manifest.json'";
    if (m.info.table_name != name)
      return status::corruption(where + ": field 'table_name' is '" + m.info.table_name +
                                "', its folder '" + name + "'");
    if (!out.empty()) {
      const sharded_manifest& first = out.front();
      EMBCACHE_RETURN_IF_ERROR(check_same("field 'key_type' is", to_string(first.key_type),
                                          to_string(m.key_type), where));
      EMBCACHE_RETURN_IF_ERROR(check_same("field 'run_id' is", first.info.run_id, m.info.run_id,
                                          where + " (tables of two runs)"));
      EMBCACHE_RETURN_IF_ERROR(check_same(
          "field 'applied_delta' is", std::to_string(first.info.applied_delta),
          std::to_string(m.info.applied_delta), where + " (tables saved at two points)"));
    }
    out.push_back(std::move(parsed).value());
  }
  return out;
}

result<model_folder> read_sharded_save(const std::string& dir_in) {
  const std::string dir = detail::strip_slashes(dir_in);
  auto manifests = read_sharded_manifests(dir);
  if (!manifests.ok()) return manifests.get_status();
  // A trainer save's keys carry their slot (criteo_key_tag), as its single-process saves write it.
  std::error_code ec;
  const bool trainer_save = fs::path(dir).filename() == "sparse" &&
                            fs::exists(fs::path(dir).parent_path() / "trainer.json", ec);
  model_folder out;
  out.path = dir;
  out.sharded = true;
  out.key_type = manifests.value().front().key_type;
  out.run_id = manifests.value().front().info.run_id;
  out.sequence = manifests.value().front().info.applied_delta;
  for (const sharded_manifest& m : manifests.value()) {
    const std::string tdir = dir + "/" + m.info.table_name;
    folder_table t;
    t.name = m.info.table_name;
    t.dim = m.info.dim;
    t.state_width = m.info.row_width - m.info.dim;
    t.optimizer = m.info.optimizer;
    t.version = m.info.applied_delta;
    for (int r = 0; r < m.world_size; ++r) {
      const std::string part = tdir + "/" + m.parts[static_cast<std::size_t>(r)].path;
      const status s = m.key_type == key_type::uint32 ? read_part<std::uint32_t>(part, m, r, t)
                                                      : read_part<std::int64_t>(part, m, r, t);
      EMBCACHE_RETURN_IF_ERROR(
          s.with_context("sharded save '" + dir + "', table '" + t.name + "'"));
    }
    if (trainer_save)
      for (const std::int64_t k : t.keys) t.slot_ids.push_back(criteo_key_tag(k));
    else
      t.rows_without_slot_id = t.keys.size();
    sort_rows(t);
    out.tables.push_back(std::move(t));
  }
  return out;
}

result<model_folder> read_sharded_delta(const std::string& parts_path) {
  const std::string who = "sharded delta '" + parts_path + "'";
  auto text = detail::read_file_bytes(parts_path);
  if (!text.ok()) return text.get_status().with_context(who);
  const nlohmann::json j =
      nlohmann::json::parse(text.value().begin(), text.value().end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return status::corruption(who + " is not valid JSON");
  auto bad = [&](const char* field, const char* expected) {
    return status::corruption(who + ": field '" + field + "' is missing or not " + expected);
  };
  auto f = j.find("format");
  if (f == j.end() || !f->is_string() || *f != "embcache.sharded_delta")
    return bad("format", "\"embcache.sharded_delta\"");
  if (!j.contains("format_version") || j["format_version"] != 1) return bad("format_version", "1");
  for (const char* u : {"sequence", "world_size"})
    if (!j.contains(u) || !j[u].is_number_unsigned()) return bad(u, "an unsigned integer");
  if (!j.contains("run_id") || !j["run_id"].is_string()) return bad("run_id", "a string");
  const std::uint64_t sequence = j["sequence"].get<std::uint64_t>();
  const std::uint64_t world = j["world_size"].get<std::uint64_t>();
  const std::string run_id = j["run_id"].get<std::string>();
  if (sequence == 0) return bad("sequence", "a positive integer");
  if (world == 0 || world > (std::uint64_t{1} << 20)) return bad("world_size", "in [1, 2^20]");
  const auto parts = j.find("parts");
  if (parts == j.end() || !parts->is_array() || parts->size() != world)
    return bad("parts", "an array of world_size entries");
  const std::string folder = fs::path(parts_path).parent_path().string();
  model_folder out;
  out.is_delta = true;
  out.sharded = true;
  out.path = parts_path;
  out.sequence = sequence;
  out.run_id = run_id;
  std::vector<bool> all_slots;
  for (int r = 0; r < static_cast<int>(world); ++r) {
    const std::string expect = rank_part(r, sequence);
    const nlohmann::json& p = (*parts)[static_cast<std::size_t>(r)];
    if (!p.is_string() || p.get<std::string>() != expect)
      return status::corruption(who + ": field 'parts[" + std::to_string(r) + "]' is " + p.dump() +
                                ", expected \"" + expect + "\"");
    const std::string path = folder + "/" + expect;
    std::error_code ec;
    if (!fs::exists(path + "/manifest.json", ec))
      return status::not_found(who + ": rank " + std::to_string(r) + "'s part '" + path +
                               "' is missing");
    auto d = read_delta_folder(path);
    if (!d.ok()) return d.get_status().with_context(who + ", rank " + std::to_string(r));
    const model_folder& part = d.value();
    const std::string where = who + ": rank " + std::to_string(r) + "'s part '" + path + "'";
    if (part.sequence != sequence)
      return status::corruption(where + " has sequence " + std::to_string(part.sequence) +
                                ", the parts file " + std::to_string(sequence));
    if (part.run_id != run_id)
      return status::invalid_argument(where + " belongs to run " + part.run_id +
                                      ", the parts file to run " + run_id +
                                      " (parts of different runs do not mix)");
    if (r == 0) {
      out.key_type = part.key_type;
      for (const folder_table& pt : part.tables) {
        folder_table t;
        t.name = pt.name;
        t.dim = pt.dim;
        t.state_width = pt.state_width;
        t.optimizer = pt.optimizer;
        t.since_version = sequence - 1;
        t.version = sequence;
        out.tables.push_back(std::move(t));
        all_slots.push_back(true);
      }
    }
    if (part.key_type != out.key_type)
      return status::invalid_argument(where + " holds " + to_string(part.key_type) +
                                      " keys, rank 0's " + to_string(out.key_type));
    if (part.tables.size() != out.tables.size())
      return status::invalid_argument(where + " has " + std::to_string(part.tables.size()) +
                                      " tables, rank 0's " + std::to_string(out.tables.size()));
    for (std::size_t i = 0; i < part.tables.size(); ++i) {
      const folder_table& pt = part.tables[i];
      folder_table& t = out.tables[i];
      if (pt.name != t.name || pt.dim != t.dim || pt.state_width != t.state_width ||
          pt.optimizer != t.optimizer)
        return status::invalid_argument(where + ": table " + std::to_string(i) + " is '" + pt.name +
                                        "' (dim " + std::to_string(pt.dim) + ", state width " +
                                        std::to_string(pt.state_width) + "), rank 0's '" + t.name +
                                        "' (dim " + std::to_string(t.dim) + ", state width " +
                                        std::to_string(t.state_width) + ")");
      for (const std::int64_t k : pt.keys) {
        const int owner = out.key_type == key_type::uint32
                              ? owner_of(static_cast<std::uint32_t>(k), static_cast<int>(world))
                              : owner_of(k, static_cast<int>(world));
        if (owner != r)
          return status::corruption(where + ": table '" + pt.name + "' holds key " +
                                    std::to_string(k) + ", which rank " + std::to_string(owner) +
                                    " owns");
      }
      t.keys.insert(t.keys.end(), pt.keys.begin(), pt.keys.end());
      t.vectors.insert(t.vectors.end(), pt.vectors.begin(), pt.vectors.end());
      t.states.insert(t.states.end(), pt.states.begin(), pt.states.end());
      t.versions.insert(t.versions.end(), pt.versions.begin(), pt.versions.end());
      t.erased.insert(t.erased.end(), pt.erased.begin(), pt.erased.end());
      if (pt.slot_ids.size() == pt.keys.size())
        t.slot_ids.insert(t.slot_ids.end(), pt.slot_ids.begin(), pt.slot_ids.end());
      else
        all_slots[i] = false;
    }
  }
  for (std::size_t i = 0; i < out.tables.size(); ++i) {
    folder_table& t = out.tables[i];
    if (!all_slots[i] || t.slot_ids.size() != t.keys.size()) t.slot_ids.clear();
    sort_rows(t);
    std::sort(t.erased.begin(), t.erased.end());
  }
  return out;
}

namespace {

// A list_deltas entry of a sharded run: its parts file.
bool is_sharded_delta_path(const std::string& path) {
  return path.size() > std::char_traits<char>::length(parts_suffix) &&
         path.compare(path.size() - std::char_traits<char>::length(parts_suffix), std::string::npos,
                      parts_suffix) == 0;
}

}  // namespace

result<model_folder> read_base(const std::string& dir_in) {
  const std::string dir = model_folder_of(detail::strip_slashes(dir_in));
  const std::string sharded = sharded_save_of(dir);
  if (!sharded.empty()) return read_sharded_save(sharded);
  return read_model_folder(dir);
}

result<model_folder> read_delta(const std::string& path) {
  if (is_sharded_delta_path(path)) return read_sharded_delta(path);
  return read_delta_folder(path);
}

}  // namespace embcache
