// The Redis serving store through hiredis: base and deltas pushed in transactions, rows read back
// with HMGET. docs/serving.md#redis-layout.
#include "embcache/redis.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

namespace embcache {

namespace {

using args = std::vector<std::string>;

struct reply_deleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using reply = std::unique_ptr<redisReply, reply_deleter>;

std::string where_of(const redis_options& o) {
  return "redis " + o.host + ":" + std::to_string(o.port);
}

bool parse_u64(const char* s, std::size_t n, std::uint64_t* out) {
  const auto [p, ec] = std::from_chars(s, s + n, *out);
  return n > 0 && ec == std::errc() && p == s + n;
}

}  // namespace

// One hiredis connection; every failure names the server and the command.
struct detail::redis_connection {
  redisContext* ctx = nullptr;
  std::string where;

  ~redis_connection() {
    if (ctx) redisFree(ctx);
  }

  static result<std::unique_ptr<redis_connection>> open(const redis_options& o) {
    auto c = std::make_unique<redis_connection>();
    c->where = where_of(o);
    const double t = o.timeout_seconds > 0 ? o.timeout_seconds : 10;
    timeval tv{static_cast<time_t>(t), static_cast<suseconds_t>((t - std::floor(t)) * 1e6)};
    c->ctx = redisConnectWithTimeout(o.host.c_str(), o.port, tv);
    if (!c->ctx || c->ctx->err) {
      return status::io_error(c->where +
                              ": cannot connect: " + (c->ctx ? c->ctx->errstr : "out of memory"));
    }
    if (redisSetTimeout(c->ctx, tv) != REDIS_OK)
      return status::io_error(c->where + ": cannot set the timeout");
    return c;
  }

  status append(const args& a) {
    std::vector<const char*> argv(a.size());
    std::vector<std::size_t> lens(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      argv[i] = a[i].data();
      lens[i] = a[i].size();
    }
    if (redisAppendCommandArgv(ctx, static_cast<int>(a.size()), argv.data(), lens.data()) !=
        REDIS_OK)
      return status::io_error(where + ": cannot send " + a[0] + ": " + ctx->errstr);
    return {};
  }

  result<reply> get(const std::string& command) {
    void* r = nullptr;
    if (redisGetReply(ctx, &r) != REDIS_OK || !r)
      return status::io_error(where + ": no reply to " + command + ": " + ctx->errstr);
    reply out(static_cast<redisReply*>(r));
    if (out->type == REDIS_REPLY_ERROR)
      return status::io_error(where + ": " + command +
                              " failed: " + std::string(out->str, out->len));
    return out;
  }

  // Sends every command, then reads every reply (one round trip for the lot).
  result<std::vector<reply>> pipeline(const std::vector<args>& cmds) {
    for (const auto& a : cmds) EMBCACHE_RETURN_IF_ERROR(append(a));
    std::vector<reply> out;
    status first;
    for (const auto& a : cmds) {
      auto r = get(a[0]);
      if (!r.ok() && first.ok()) first = r.get_status();
      if (r.ok()) out.push_back(std::move(r).value());
    }
    if (!first.ok()) return first;
    return out;
  }

  result<reply> run(const args& a) {
    EMBCACHE_RETURN_IF_ERROR(append(a));
    return get(a[0]);
  }
};

namespace {

using connection = detail::redis_connection;

std::string row_bytes(const float* row, std::size_t dim) {
  return std::string(reinterpret_cast<const char*>(row), dim * sizeof(float));
}

// Appends to `cmds` one `verb key field [value] ...` command per batch of rows.
void batched(std::vector<args>* cmds, const char* verb, const std::string& key,
             const std::vector<std::int64_t>& keys, const std::vector<float>* vectors,
             std::size_t dim, std::size_t batch) {
  batch = std::max<std::size_t>(batch, 1);
  for (std::size_t i = 0; i < keys.size(); i += batch) {
    args a = {verb, key};
    for (std::size_t j = i; j < std::min(keys.size(), i + batch); ++j) {
      a.push_back(std::to_string(keys[j]));
      if (vectors) a.push_back(row_bytes(vectors->data() + j * dim, dim));
    }
    cmds->push_back(std::move(a));
  }
}

// Runs MULTI, `cmds`, EXEC; io_error when EXEC aborts (a watched key changed) or a command fails.
status transaction(connection& c, std::vector<args> cmds, const std::string& what) {
  cmds.insert(cmds.begin(), args{"MULTI"});
  cmds.push_back({"EXEC"});
  auto replies = c.pipeline(cmds);
  if (!replies.ok()) return replies.get_status().with_context(what);
  const redisReply* exec = replies.value().back().get();
  if (exec->type == REDIS_REPLY_NIL)
    return status::io_error(c.where + ": " + what + " aborted: another writer changed the model");
  for (std::size_t i = 0; i < exec->elements; ++i) {
    if (exec->element[i]->type == REDIS_REPLY_ERROR)
      return status::io_error(c.where + ": " + what + ": " + cmds[i + 1][0] + " failed: " +
                              std::string(exec->element[i]->str, exec->element[i]->len));
  }
  return {};
}

result<redis_model> read_model(connection& c, const redis_options& o) {
  const std::string& p = o.prefix;
  auto replies =
      c.pipeline({{"GET", p + ":schema"}, {"GET", p + ":applied"}, {"HGETALL", p + ":versions"}});
  if (!replies.ok()) return replies.get_status();
  const auto& r = replies.value();
  if (r[0]->type != REDIS_REPLY_STRING || r[1]->type != REDIS_REPLY_STRING)
    return status::not_found(c.where + " holds no model under prefix '" + p + "'");
  redis_model m;
  const std::string at = c.where + ": '" + p + ":schema'";
  const nlohmann::json j = nlohmann::json::parse(r[0]->str, r[0]->str + r[0]->len, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "embcache-redis" ||
      !j.contains("tables") || !j["tables"].is_array() || !j.contains("key_type") ||
      !j["key_type"].is_string())
    return status::corruption(at + " is not an embcache-redis schema");
  m.key_type = j["key_type"].get<std::string>();
  for (const auto& t : j["tables"]) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("dim") ||
        !t["dim"].is_number_unsigned())
      return status::corruption(at + ": a table needs a string 'name' and an unsigned 'dim'");
    m.dims.emplace_back(t["name"].get<std::string>(), t["dim"].get<std::size_t>());
  }
  if (!parse_u64(r[1]->str, r[1]->len, &m.position.applied_delta))
    return status::corruption(c.where + ": '" + p + ":applied' is not a decimal number");
  for (const auto& [name, dim] : m.dims) m.position.versions.emplace_back(name, 0);
  for (std::size_t i = 0; i + 1 < r[2]->elements; i += 2) {
    const std::string name(r[2]->element[i]->str, r[2]->element[i]->len);
    for (auto& v : m.position.versions) {
      if (v.first == name &&
          !parse_u64(r[2]->element[i + 1]->str, r[2]->element[i + 1]->len, &v.second))
        return status::corruption(c.where + ": '" + p + ":versions' field '" + name +
                                  "' is not a decimal number");
    }
  }
  return m;
}

status push_base(connection& c, const redis_options& o, const model_folder& base,
                 const redis_model* old, redis_push_report* report) {
  const std::string& p = o.prefix;
  nlohmann::json tables = nlohmann::json::array();
  std::vector<args> staging, swap;
  args versions = {"HSET", p + ":versions"};
  for (const auto& t : base.tables) {
    const std::string stage = p + ":staging:" + t.name, live = p + ":table:" + t.name;
    staging.push_back({"DEL", stage});
    batched(&staging, "HSET", stage, t.keys, &t.vectors, t.dim, o.batch_rows);
    swap.push_back(t.keys.empty() ? args{"DEL", live} : args{"RENAME", stage, live});
    tables.push_back({{"name", t.name}, {"dim", t.dim}});
    versions.push_back(t.name);
    versions.push_back(std::to_string(t.version));
    report->rows_written += t.keys.size();
  }
  if (old) {  // tables of the previous model that this one lacks
    for (const auto& [name, dim] : old->dims) {
      if (std::none_of(base.tables.begin(), base.tables.end(),
                       [&](const folder_table& t) { return t.name == name; }))
        swap.push_back({"DEL", p + ":table:" + name});
    }
  }
  const nlohmann::json schema = {{"format", "embcache-redis"},
                                 {"format_version", 1},
                                 {"key_type", base.key_type},
                                 {"tables", tables}};
  swap.push_back({"SET", p + ":schema", schema.dump()});
  swap.push_back({"DEL", p + ":versions"});
  if (!base.tables.empty()) swap.push_back(versions);
  swap.push_back({"SET", p + ":applied", std::to_string(base.sequence)});
  auto staged = c.pipeline(staging);
  if (!staged.ok()) return staged.get_status().with_context("pushing base '" + base.path + "'");
  EMBCACHE_RETURN_IF_ERROR(transaction(c, swap, "swapping in base '" + base.path + "'"));
  report->base_pushed = true;
  return {};
}

status push_delta(connection& c, const redis_options& o, const redis_model& m,
                  const model_folder& d, const std::vector<bool>& apply,
                  redis_push_report* report) {
  const std::string& p = o.prefix;
  std::vector<args> cmds;
  args versions = {"HSET", p + ":versions"};
  for (std::size_t t = 0; t < d.tables.size(); ++t) {
    const folder_table& dt = d.tables[t];
    const auto dim = std::find_if(m.dims.begin(), m.dims.end(),
                                  [&](const auto& x) { return x.first == dt.name; });
    if (dim == m.dims.end() || dim->second != dt.dim)
      return status::invalid_argument("'" + d.path + "': table '" + dt.name + "' of dim " +
                                      std::to_string(dt.dim) + " is not in the store's schema");
    if (!apply[t]) continue;
    const std::string live = p + ":table:" + dt.name;
    batched(&cmds, "HDEL", live, dt.erased, nullptr, 0, o.batch_rows);
    batched(&cmds, "HSET", live, dt.keys, &dt.vectors, dt.dim, o.batch_rows);
    versions.push_back(dt.name);
    versions.push_back(std::to_string(dt.version));
    report->rows_written += dt.keys.size();
    report->keys_deleted += dt.erased.size();
  }
  if (versions.size() > 2) cmds.push_back(versions);
  cmds.push_back({"SET", p + ":applied", std::to_string(d.sequence)});
  // WATCH: a concurrent pusher that moves P:applied first makes this EXEC abort.
  EMBCACHE_RETURN_IF_ERROR(c.run({"WATCH", p + ":applied"}).get_status());
  auto now = c.run({"GET", p + ":applied"});
  if (!now.ok()) return now.get_status();
  std::uint64_t at = 0;
  if (now.value()->type != REDIS_REPLY_STRING ||
      !parse_u64(now.value()->str, now.value()->len, &at) || at != m.position.applied_delta) {
    c.run({"UNWATCH"}).ok();
    return status::io_error(c.where + ": '" + p + ":applied' changed while pushing '" + d.path +
                            "'");
  }
  return transaction(c, std::move(cmds), "pushing '" + d.path + "'");
}

}  // namespace

result<redis_options> parse_redis_address(const std::string& host_port, redis_options base) {
  const auto colon = host_port.rfind(':');
  std::uint64_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !parse_u64(host_port.data() + colon + 1, host_port.size() - colon - 1, &port) || port == 0 ||
      port > 65535)
    return status::invalid_argument("'" + host_port + "': expected HOST:PORT, PORT in 1..65535");
  base.host = host_port.substr(0, colon);
  base.port = static_cast<int>(port);
  return base;
}

result<redis_model> redis_read_model(const redis_options& options) {
  auto c = connection::open(options);
  if (!c.ok()) return c.get_status();
  return read_model(*c.value(), options);
}

result<redis_push_report> redis_push(const redis_options& options, const std::string& base_dir,
                                     const std::string& deltas_dir, const apply_options& apply,
                                     bool replace_base) {
  if (options.prefix.empty() || options.prefix.find_first_of(" \t\r\n") != std::string::npos)
    return status::invalid_argument("redis prefix '" + options.prefix + "': expected no spaces");
  auto c = connection::open(options);
  if (!c.ok()) return c.get_status();
  connection& conn = *c.value();
  redis_push_report report;
  auto held = read_model(conn, options);
  if (!held.ok() && held.get_status().code() != status_code::not_found) return held.get_status();
  if (!held.ok() || replace_base) {
    if (base_dir.empty())
      return status::invalid_argument(conn.where + " holds no model under prefix '" +
                                      options.prefix + "' and no base folder was given");
    auto base = read_model_folder(model_folder_of(base_dir));
    if (!base.ok()) return base.get_status().with_context("redis push: base");
    EMBCACHE_RETURN_IF_ERROR(
        push_base(conn, options, base.value(), held.ok() ? &held.value() : nullptr, &report));
    held = read_model(conn, options);
    if (!held.ok()) return held.get_status();
  }
  redis_model& m = held.value();
  report.from_delta = report.applied_delta = m.position.applied_delta;
  if (deltas_dir.empty()) return report;
  auto listed = list_deltas(deltas_dir);
  if (!listed.ok()) return listed.get_status().with_context("redis push");
  auto plan = plan_deltas(m.position, listed.value(), apply.until);
  if (!plan.ok()) return plan.get_status().with_context("redis push: " + conn.where);
  for (const delta_entry& e : plan.value()) {
    auto d = read_delta_folder(e.path);
    if (!d.ok()) return d.get_status().with_context("redis push");
    if (d.value().sequence != e.sequence || d.value().key_type != m.key_type)
      return status::invalid_argument("redis push: '" + e.path + "' has sequence " +
                                      std::to_string(d.value().sequence) + " and " +
                                      d.value().key_type + " keys; expected " +
                                      std::to_string(e.sequence) + " and " + m.key_type);
    model_position next = m.position;
    std::vector<bool> flags;
    EMBCACHE_RETURN_IF_ERROR(advance_position(next, d.value(), &flags).with_context("redis push"));
    EMBCACHE_RETURN_IF_ERROR(push_delta(conn, options, m, d.value(), flags, &report));
    m.position = std::move(next);
    report.applied_delta = e.sequence;
    report.deltas.push_back(e.sequence);
  }
  return report;
}

redis_rows::~redis_rows() = default;

result<std::unique_ptr<redis_rows>> redis_rows::connect(const redis_options& options) {
  std::unique_ptr<redis_rows> r(new redis_rows());
  auto c = detail::redis_connection::open(options);
  if (!c.ok()) return c.get_status();
  r->conn_ = std::move(c).value();
  r->options_ = options;
  auto m = read_model(*r->conn_, options);
  if (!m.ok()) return m.get_status();
  r->model_ = std::move(m).value();
  return r;
}

status redis_rows::lookup(const std::string& table, std::size_t dim, const std::int64_t* keys,
                          std::size_t n, float* rows, std::uint8_t* found) {
  const std::string key = options_.prefix + ":table:" + table;
  const std::size_t batch = std::max<std::size_t>(options_.batch_rows, 1);
  std::vector<args> cmds;
  for (std::size_t i = 0; i < n; i += batch) {
    args a = {"HMGET", key};
    for (std::size_t j = i; j < std::min(n, i + batch); ++j) a.push_back(std::to_string(keys[j]));
    cmds.push_back(std::move(a));
  }
  auto replies = conn_->pipeline(cmds);
  if (!replies.ok()) return replies.get_status();
  std::size_t j = 0;
  for (const auto& r : replies.value()) {
    for (std::size_t e = 0; e < r->elements && j < n; ++e, ++j) {
      const redisReply* v = r->element[e];
      found[j] = v->type == REDIS_REPLY_STRING;
      if (!found[j]) continue;
      if (v->len != dim * sizeof(float))
        return status::corruption(conn_->where + ": '" + key + "' field " +
                                  std::to_string(keys[j]) + " has " + std::to_string(v->len) +
                                  " bytes, expected " + std::to_string(dim * sizeof(float)) +
                                  " (dim " + std::to_string(dim) + ")");
      std::memcpy(rows + j * dim, v->str, dim * sizeof(float));
    }
  }
  return {};
}

}  // namespace embcache
