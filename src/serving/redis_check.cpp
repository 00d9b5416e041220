// The Redis store's address and its model checked against a trainer save before serving.
#include <algorithm>
#include <filesystem>

#include "embcache/distributed/sharded_save.hpp"
#include "embcache/redis.hpp"
#include "embcache/serving.hpp"
#include "format/model_folder.hpp"
#include "redis_detail.hpp"

namespace embcache {

using detail::parse_u64;
using detail::redis_where;

namespace {

// The manifests of a sharded save's tables as one model's: key type, run, per table its dim, rows
// and version (the save's applied_delta).
result<detail::folder_manifest> sharded_point(const std::string& dir) {
  auto tables = read_sharded_manifests(dir);
  if (!tables.ok()) return tables.get_status();
  detail::folder_manifest out;
  out.dir = dir;
  for (const sharded_manifest& m : tables.value()) {
    out.key_type = m.key_type;
    out.run_id = m.info.run_id;
    out.sequence = m.info.applied_delta;
    detail::manifest_table e;
    e.name = m.info.table_name;
    e.dim = m.info.dim;
    e.count = m.total_rows;
    e.version = m.info.applied_delta;
    out.tables.push_back(e);
  }
  return out;
}

}  // namespace

result<redis_options> parse_redis_address(const std::string& host_port, redis_options base) {
  const auto colon = host_port.rfind(':');
  std::uint64_t port = 0;
  const auto bad = [&] {
    return status::invalid_argument("'" + host_port +
                                    "': expected HOST:PORT or [IPV6]:PORT, PORT in 1..65535");
  };
  if (colon == std::string::npos || colon == 0 ||
      !parse_u64(host_port.data() + colon + 1, host_port.size() - colon - 1, &port) || port == 0 ||
      port > 65535)
    return bad();
  std::string host = host_port.substr(0, colon);
  if (host.front() == '[') {  // [::1]:6379
    if (host.size() < 3 || host.back() != ']') return bad();
    host = host.substr(1, host.size() - 2);
  } else if (host.find_first_of(":[]") != std::string::npos) {
    return bad();  // an IPv6 address needs its brackets
  }
  base.host = host;
  base.port = static_cast<int>(port);
  return base;
}

status redis_check_model(const redis_model& m, const redis_options& options,
                         const std::string& save_dir, bool allow_other_point) {
  const std::string where = redis_where(options) + " prefix '" + options.prefix + "'";
  const std::string sparse = model_folder_of(save_dir);
  std::error_code ec;
  result<detail::folder_manifest> f = status::internal("no manifest read");
  if (!sharded_save_of(save_dir).empty()) {
    // A sharded save: its tables' manifests, at the point of its applied_delta (the version a
    // store that applied its deltas holds, serving.md).
    f = sharded_point(sharded_save_of(save_dir));
  } else {
    if (!std::filesystem::exists(sparse + "/manifest.json", ec)) return {};
    f = detail::read_folder_manifest(sparse, detail::folder_kind::model);
  }
  if (!f.ok()) return f.get_status().with_context("checking the store against the save");
  const detail::folder_manifest& s = f.value();
  if (s.key_type != m.key_type)
    return status::invalid_argument(where + " holds " + to_string(m.key_type) +
                                    " keys, the save '" + s.dir + "' " + to_string(s.key_type));
  for (const auto& t : s.tables) {
    const auto it = std::find_if(m.dims.begin(), m.dims.end(),
                                 [&](const auto& x) { return x.first == t.name; });
    if (it == m.dims.end())
      return status::invalid_argument(where + " has no table '" + t.name + "' of the save '" +
                                      s.dir + "' in its schema");
    if (it->second != t.dim)
      return status::invalid_argument(where + ": table '" + t.name + "' has dim " +
                                      std::to_string(it->second) + ", the save '" + s.dir + "' " +
                                      std::to_string(t.dim));
    const std::size_t i = static_cast<std::size_t>(it - m.dims.begin());
    const std::int64_t now = m.rows[i].second;
    if (now == 0 && t.count > 0)
      return status::invalid_argument(where + ": table '" + t.name +
                                      "' holds no rows (key missing?), the save " +
                                      std::to_string(t.count));
  }
  if (!m.run_id.empty() && !s.run_id.empty() && m.run_id != s.run_id)
    return status::invalid_argument(where + " holds a model of run " + m.run_id + ", the save '" +
                                    s.dir + "' belongs to run " + s.run_id +
                                    " (its dense network would score another run's rows)");
  if (allow_other_point) return {};
  for (const auto& t : s.tables) {
    const auto it = std::find_if(m.position.versions.begin(), m.position.versions.end(),
                                 [&](const auto& x) { return x.first == t.name; });
    const std::uint64_t held = it == m.position.versions.end() ? 0 : it->second;
    if (held != t.version)
      return status::invalid_argument(
          where + ": table '" + t.name + "' stands at version " + std::to_string(held) +
          " (applied delta " + std::to_string(m.position.applied_delta) + "), the save '" + s.dir +
          "' at version " + std::to_string(t.version) +
          ": its dense network was trained with other rows (apply the deltas up to the save, or "
          "score with the save that matches the store; allow_other_point / --allow-other-point "
          "scores anyway)");
  }
  return {};
}

}  // namespace embcache
