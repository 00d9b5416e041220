// Reading a sharded save's manifest back: every field checked and named in its error, the
// expiry clocks mapped onto another number of ranks, the admission sketch read and verified.
// Writing the save: sharded_save.cpp.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/sharded_manifest_format.hpp"
#include "embcache/distributed/ownership.hpp"
#include "embcache/distributed/sharded_save.hpp"
#include "format/checked_io.hpp"
#include "format/model_folder.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;

// More ranks than this in a manifest is a damaged file, not a job.
constexpr std::uint64_t max_world_size = std::uint64_t{1} << 20;

// The values of every part's expiry clock (pass versions, then step versions) put in one order
// that keeps every part's strict order of its own values: ordered by the sum over the parts of
// each value's rank among its part's values (a value smaller than another in one part is at most
// as large in every part, since every rank records its clock at the same moments, so its sum is
// smaller), ties by kind and index. position[i] is entry i's place in it, from 1.
std::vector<std::uint64_t> clock_positions(const sharded_manifest& m) {
  const std::size_t k = m.parts[0].expiry.versions.size();
  const std::size_t n = k + m.parts[0].expiry.step_versions.size();
  const auto value = [&](const expiry_clock& c, std::size_t i) {
    return i < k ? c.versions[i] : c.step_versions[i - k];
  };
  std::vector<std::uint64_t> key(n, 0);
  std::vector<std::uint64_t> sorted(n);
  for (const sharded_part& p : m.parts) {
    for (std::size_t i = 0; i < n; ++i) sorted[i] = value(p.expiry, i);
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < n; ++i)
      key[i] += static_cast<std::uint64_t>(
          std::lower_bound(sorted.begin(), sorted.end(), value(p.expiry, i)) - sorted.begin());
  }
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return key[a] < key[b]; });
  std::vector<std::uint64_t> position(n);
  for (std::size_t i = 0; i < n; ++i) position[order[i]] = i + 1;
  return position;
}

}  // namespace

result<sharded_manifest> read_sharded_manifest(const std::string& dir_in) {
  const std::string dir = detail::strip_slashes(dir_in);
  const std::string path = dir + "/manifest.json";
  const std::string who = "read_sharded_manifest: '" + path + "'";
  std::error_code ec;
  std::ifstream in(path);
  if (!in) {
    if (!fs::exists(path, ec))
      return status::not_found(who + " is missing (no complete sharded save in '" + dir + "')");
    return status::io_error(who + " cannot be read");
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json m = nlohmann::json::parse(text.str(), nullptr, false);
  if (m.is_discarded() || !m.is_object()) return status::corruption(who + " is not valid JSON");
  auto bad = [&](const std::string& field, const std::string& why) {
    return status::corruption(who + ": field '" + field + "' " + why);
  };
  auto string_field = [&](const char* name, std::string* out) -> status {
    auto it = m.find(name);
    if (it == m.end() || !it->is_string()) return bad(name, "is missing or not a string");
    *out = it->get<std::string>();
    return {};
  };
  auto count_field = [&](const nlohmann::json& obj, const std::string& name, const char* key,
                         std::uint64_t* out) -> status {
    auto it = obj.find(key);
    if (it == obj.end() || !it->is_number_unsigned())
      return bad(name, "is missing or not an unsigned integer");
    *out = it->get<std::uint64_t>();
    return {};
  };

  sharded_manifest out;
  std::string format, key_type, owner;
  EMBCACHE_RETURN_IF_ERROR(string_field("format", &format));
  if (format != detail::sharded_manifest_format)
    return status::invalid_argument(who + ": field 'format' is '" + format + "', expected '" +
                                    detail::sharded_manifest_format + "'");
  std::uint64_t version = 0, dim = 0, width = 0, blocks = 0, world = 0;
  EMBCACHE_RETURN_IF_ERROR(count_field(m, "format_version", "format_version", &version));
  if (version != detail::sharded_manifest_format_version)
    return status::unsupported(who + ": field 'format_version' is " + std::to_string(version) +
                               ", this build reads " +
                               std::to_string(detail::sharded_manifest_format_version));
  EMBCACHE_RETURN_IF_ERROR(string_field("table_name", &out.info.table_name));
  EMBCACHE_RETURN_IF_ERROR(string_field("key_type", &key_type));
  if (!key_type_from_name(key_type, &out.key_type))
    return status::invalid_argument(who + ": field 'key_type' is '" + key_type +
                                    "', expected 'int64' or 'uint32'");
  EMBCACHE_RETURN_IF_ERROR(string_field("optimizer", &out.info.optimizer));
  EMBCACHE_RETURN_IF_ERROR(string_field("owner_function", &owner));
  if (owner != owner_function_name)
    return status::unsupported(who + ": field 'owner_function' is '" + owner +
                               "', this build shards by '" + owner_function_name + "'");
  EMBCACHE_RETURN_IF_ERROR(count_field(m, "dim", "dim", &dim));
  EMBCACHE_RETURN_IF_ERROR(count_field(m, "row_width", "row_width", &width));
  EMBCACHE_RETURN_IF_ERROR(count_field(m, "step", "step", &out.info.step));
  EMBCACHE_RETURN_IF_ERROR(count_field(m, "num_blocks", "num_blocks", &blocks));
  EMBCACHE_RETURN_IF_ERROR(count_field(m, "world_size", "world_size", &world));
  EMBCACHE_RETURN_IF_ERROR(count_field(m, "generation", "generation", &out.generation));
  // Optional: saves written before run identities existed have none (accepted as unknown).
  if (m.contains("run_id")) {
    EMBCACHE_RETURN_IF_ERROR(string_field("run_id", &out.info.run_id));
    if (!detail::is_run_id(out.info.run_id))
      return bad("run_id", "is '" + out.info.run_id + "', expected 32 lowercase hex digits");
  }
  if (m.contains("applied_delta"))
    EMBCACHE_RETURN_IF_ERROR(
        count_field(m, "applied_delta", "applied_delta", &out.info.applied_delta));
  // Widths become allocation sizes (rows * width * 4 bytes): bound them before any use.
  if (dim == 0 || width < dim || width > (std::uint64_t{1} << 24))
    return bad("row_width", "is " + std::to_string(width) + " for dim " + std::to_string(dim) +
                                ", expected dim in [1, row_width] and row_width <= 2^24");
  if (world == 0 || world > max_world_size)
    return bad("world_size", "is " + std::to_string(world) + ", expected 1 to 2^20");
  if (blocks == 0 || blocks % world != 0)
    return bad("num_blocks", "is " + std::to_string(blocks) +
                                 ", expected a positive multiple of world_size " +
                                 std::to_string(world));
  out.info.dim = static_cast<std::size_t>(dim);
  out.info.row_width = static_cast<std::size_t>(width);
  out.info.num_blocks = static_cast<std::size_t>(blocks);
  out.world_size = static_cast<int>(world);

  auto parts = m.find("parts");
  if (parts == m.end() || !parts->is_array()) return bad("parts", "is missing or not an array");
  if (parts->size() != world)
    return bad("parts", "has " + std::to_string(parts->size()) + " entries, world_size is " +
                            std::to_string(world));
  for (std::size_t r = 0; r < parts->size(); ++r) {
    const nlohmann::json& p = (*parts)[r];
    const std::string name = "parts[" + std::to_string(r) + "]";
    if (!p.is_object()) return bad(name, "is not an object");
    std::uint64_t prank = 0, rows = 0;
    EMBCACHE_RETURN_IF_ERROR(count_field(p, name + ".rank", "rank", &prank));
    if (prank != r)
      return bad(name + ".rank", "is " + std::to_string(prank) + ", expected " + std::to_string(r) +
                                     " (parts in rank order)");
    EMBCACHE_RETURN_IF_ERROR(count_field(p, name + ".rows", "rows", &rows));
    auto pp = p.find("path");
    if (pp == p.end() || !pp->is_string()) return bad(name + ".path", "is missing or not a string");
    // Only the layout's own path is accepted: a manifest never points outside its folder.
    const std::string expect = sharded_part_path(out.generation, static_cast<int>(r));
    if (pp->get<std::string>() != expect)
      return bad(name + ".path", "is '" + pp->get<std::string>() + "', expected '" + expect + "'");
    if (__builtin_add_overflow(out.total_rows, rows, &out.total_rows))
      return bad(name + ".rows", "makes the total row count overflow 64 bits");
    sharded_part part;
    part.path = expect;
    part.rows = rows;
    if (auto e = p.find("expiry"); e != p.end()) {
      const std::string at = name + ".expiry";
      if (!e->is_object()) return bad(at, "is not an object");
      EMBCACHE_RETURN_IF_ERROR(
          count_field(*e, at + ".boundaries", "boundaries", &part.expiry.boundaries));
      const auto pv = e->find("pass_versions");
      if (pv == e->end() || !pv->is_array() || pv->size() > part.expiry.boundaries ||
          pv->size() > (std::uint64_t{1} << 32))
        return bad(at + ".pass_versions", "is not an array of at most 'boundaries' values");
      for (const auto& v : *pv) {
        if (!v.is_number_unsigned() ||
            (!part.expiry.versions.empty() && v.get<std::uint64_t>() < part.expiry.versions.back()))
          return bad(at + ".pass_versions", "is not non-decreasing unsigned integers");
        part.expiry.versions.push_back(v.get<std::uint64_t>());
      }
      if (e->contains("steps")) {
        EMBCACHE_RETURN_IF_ERROR(count_field(*e, at + ".steps", "steps", &part.expiry.steps));
        const auto sv = e->find("step_versions");
        if (sv == e->end() || !sv->is_array() || sv->size() > part.expiry.steps ||
            sv->size() > max_ttl_steps)
          return bad(at + ".step_versions", "is not an array of at most 'steps' (and at most " +
                                                std::to_string(max_ttl_steps) + ") values");
        for (const auto& v : *sv) {
          if (!v.is_number_unsigned() ||
              (!part.expiry.step_versions.empty() &&
               v.get<std::uint64_t>() < part.expiry.step_versions.back()))
            return bad(at + ".step_versions", "is not non-decreasing unsigned integers");
          part.expiry.step_versions.push_back(v.get<std::uint64_t>());
        }
      }
      part.has_expiry = true;
    }
    // Every rank counted the same boundaries; a load on another number of ranks relies on it.
    if (r > 0 && (part.has_expiry != out.parts[0].has_expiry ||
                  part.expiry.boundaries != out.parts[0].expiry.boundaries ||
                  part.expiry.versions.size() != out.parts[0].expiry.versions.size() ||
                  part.expiry.steps != out.parts[0].expiry.steps ||
                  part.expiry.step_versions.size() != out.parts[0].expiry.step_versions.size()))
      return bad(name + ".expiry",
                 "differs from parts[0].expiry in presence, boundaries, steps or counts");
    out.parts.push_back(std::move(part));
  }
  if (auto a = m.find("admission"); a != m.end()) {
    if (!a->is_object()) return bad("admission", "is not an object");
    auto ap = a->find("path");
    const std::string expect = detail::sharded_admission_path(out.generation);
    if (ap == a->end() || !ap->is_string() || ap->get<std::string>() != expect)
      return bad("admission.path", "is missing or not '" + expect + "'");
    EMBCACHE_RETURN_IF_ERROR(count_field(*a, "admission.bytes", "bytes", &out.admission.bytes));
    if (out.admission.bytes % sizeof(std::uint32_t) != 0)
      return bad("admission.bytes", "is " + std::to_string(out.admission.bytes) +
                                        ", not a multiple of 4 (32-bit counters)");
    auto ax = a->find("xxh64");
    if (ax == a->end() || !ax->is_string() ||
        !detail::parse_hex64(ax->get<std::string>(), &out.admission.xxh64))
      return bad("admission.xxh64", "is missing or not 16 hex digits");
    out.admission.path = expect;
  }
  return out;
}

expiry_clock resumed_expiry_clock(const sharded_manifest& m, int rank, int world) {
  if (m.parts.empty() || !m.parts[0].has_expiry) return {};
  if (world == m.world_size && rank >= 0 && rank < world)
    return m.parts[static_cast<std::size_t>(rank)].expiry;
  const std::vector<std::uint64_t> position = clock_positions(m);
  const std::size_t k = m.parts[0].expiry.versions.size();
  expiry_clock c;
  c.boundaries = m.parts[0].expiry.boundaries;
  c.versions.assign(position.begin(), position.begin() + static_cast<std::ptrdiff_t>(k));
  c.steps = m.parts[0].expiry.steps;
  c.step_versions.assign(position.begin() + static_cast<std::ptrdiff_t>(k), position.end());
  return c;
}

result<std::vector<std::uint32_t>> read_sharded_admission(const std::string& dir_in,
                                                          const sharded_manifest& m,
                                                          std::size_t words) {
  std::vector<std::uint32_t> out;
  if (m.admission.path.empty() || words == 0) return out;
  const std::string path = detail::strip_slashes(dir_in) + "/" + m.admission.path;
  const std::string who = "read_sharded_admission: '" + path + "'";
  if (m.admission.bytes / sizeof(std::uint32_t) != words)
    return status::invalid_argument(
        who + " holds " + std::to_string(m.admission.bytes / sizeof(std::uint32_t)) +
        " words (manifest field 'admission.bytes'), this table's sketch " + std::to_string(words) +
        " (another sketch_width or sketch_depth)");
  detail::checked_file_reader in;
  std::uint64_t size = 0;
  EMBCACHE_RETURN_IF_ERROR(in.open(path, &size));
  if (size != m.admission.bytes)
    return status::corruption(who + " has " + std::to_string(size) +
                              " bytes, the manifest's 'admission.bytes' says " +
                              std::to_string(m.admission.bytes));
  out.resize(words);
  EMBCACHE_RETURN_IF_ERROR(in.read(out.data(), words * sizeof(std::uint32_t)));
  if (in.digest() != m.admission.xxh64)
    return status::corruption(who + ": xxh64 " + detail::hex64(in.digest()) +
                              ", the manifest's 'admission.xxh64' says " +
                              detail::hex64(m.admission.xxh64));
  return out;
}

}  // namespace embcache
