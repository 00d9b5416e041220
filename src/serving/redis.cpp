// The Redis serving store through hiredis: base and deltas pushed in transactions, rows read back
// with HMGET. docs/serving.md#redis-layout.
#include "embcache/redis.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "redis_detail.hpp"
#include "format/model_folder.hpp"

namespace embcache {

namespace {

using detail::parse_u64;
using detail::redis_where;
using args = std::vector<std::string>;

struct reply_deleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using reply = std::unique_ptr<redisReply, reply_deleter>;

}  // namespace

std::string detail::redis_where(const redis_options& o) {
  const bool v6 = o.host.find(':') != std::string::npos;
  return "redis " + (v6 ? "[" + o.host + "]" : o.host) + ":" + std::to_string(o.port);
}

bool detail::parse_u64(const char* s, std::size_t n, std::uint64_t* out) {
  const auto [p, ec] = std::from_chars(s, s + n, *out);
  return n > 0 && ec == std::errc() && p == s + n;
}

// One hiredis connection; every failure names the server and the command.
struct detail::redis_connection {
  redisContext* ctx = nullptr;
  std::string where;

  ~redis_connection() {
    if (ctx) redisFree(ctx);
  }

  static result<std::unique_ptr<redis_connection>> open(const redis_options& o) {
    auto c = std::make_unique<redis_connection>();
    c->where = redis_where(o);
    const double t = o.timeout_seconds > 0 ? o.timeout_seconds : 10;
    timeval tv{static_cast<time_t>(t), static_cast<suseconds_t>((t - std::floor(t)) * 1e6)};
    c->ctx = redisConnectWithTimeout(o.host.c_str(), o.port, tv);
    if (!c->ctx || c->ctx->err) {
      return status::io_error(c->where +
                              ": cannot connect: " + (c->ctx ? c->ctx->errstr : "out of memory"));
    }
    if (redisSetTimeout(c->ctx, tv) != REDIS_OK)
      return status::io_error(c->where + ": cannot set the timeout");
    if (!o.password.empty()) {  // the password itself never goes into a message
      auto r = c->run({"AUTH", o.password});
      if (!r.ok()) return r.get_status();
    }
    return c;
  }

  // The connection failed (server gone, reset, timeout): every later call fails the same way.
  status lost(const std::string& command) const {
    return status::io_error(where + ": lost the connection (no reply to " + command +
                            "): " + (ctx->err ? ctx->errstr : "unknown error"));
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
      return lost(a[0]);
    return {};
  }

  result<reply> get(const std::string& command) {
    void* r = nullptr;
    if (redisGetReply(ctx, &r) != REDIS_OK || !r) return lost(command);
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

std::string lease_ms(const redis_options& o) {
  const double s = o.lock_lease_seconds > 0 ? o.lock_lease_seconds : 60;
  return std::to_string(static_cast<std::uint64_t>(std::ceil(s * 1000)));
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

// Lua: renews the lock KEYS[1] for ARGV[2] ms when it still holds our token ARGV[1] (1), else 0.
constexpr const char* renew_script =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";
// Lua: deletes the lock KEYS[1] only when it still holds our token ARGV[1].
constexpr const char* release_script =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) "
    "else return 0 end";
// Lua: records in the hash KEYS[1] the rows of each table hash KEYS[i + 1] under name ARGV[i].
constexpr const char* count_script =
    "redis.call('DEL', KEYS[1]) for i = 2, #KEYS do "
    "redis.call('HSET', KEYS[1], ARGV[i - 1], redis.call('HLEN', KEYS[i])) end return 1";

// The one writer of a store: `P:lock` set to a random token with a lease (SET NX PX), renewed
// while the push goes on, released at the end only when it still holds the token.
class writer_lock {
 public:
  writer_lock(connection& c, const redis_options& o)
      : c_(c), o_(o), key_(o.prefix + ":lock"), token_(detail::new_run_id()) {}
  writer_lock(const writer_lock&) = delete;
  writer_lock& operator=(const writer_lock&) = delete;
  ~writer_lock() {
    if (held_) c_.run({"EVAL", release_script, "1", key_, token_}).ok();
  }
  [[nodiscard]] status acquire() {
    auto r = c_.run({"SET", key_, token_, "NX", "PX", lease_ms(o_)});
    if (!r.ok()) return r.get_status();
    if (r.value()->type == REDIS_REPLY_NIL)
      return status::invalid_argument(
          c_.where + " prefix '" + o_.prefix + "' is in use by another writer (lock '" + key_ +
          "' is held; it expires at most " + lease_ms(o_) + " ms after its writer stops)");
    held_ = true;
    return {};
  }
  [[nodiscard]] status renew() {
    auto r = c_.run({"EVAL", renew_script, "1", key_, token_, lease_ms(o_)});
    if (!r.ok()) return r.get_status();
    if (r.value()->type != REDIS_REPLY_INTEGER || r.value()->integer != 1) return lost();
    return {};
  }
  status lost() {
    held_ = false;
    return status::io_error(c_.where + ": lost the writer lock '" + key_ +
                            "' (its lease ran out or another writer took it): push stopped");
  }
  const std::string& key() const noexcept { return key_; }
  const std::string& token() const noexcept { return token_; }

 private:
  connection& c_;
  const redis_options& o_;
  std::string key_, token_;
  bool held_ = false;
};

// A key a transaction touches and the type it must have ("hash", "string"; `may_be_absent`), and
// the value it must hold when `equals` is set.
struct key_rule {
  key_rule(std::string k, std::string t, bool absent = true, std::string value = {})
      : key(std::move(k)), type(std::move(t)), may_be_absent(absent), equals(std::move(value)) {}
  std::string key, type;
  bool may_be_absent;
  std::string equals;
};

// Runs `cmds` in MULTI/EXEC all or nothing: WATCHes the lock and every key of `rules`, checks
// that the lock still holds our token and each key's type (so that no command of the transaction
// can fail inside EXEC, where Redis would run the others), renews the lock in the transaction, and
// reports an EXEC that aborted because a watched key changed.
status transaction(connection& c, const redis_options& o, writer_lock& lock,
                   const std::vector<key_rule>& rules, std::vector<args> cmds,
                   const std::string& what) {
  args watch = {"WATCH", lock.key()};
  std::vector<args> checks = {{"GET", lock.key()}};
  for (const auto& r : rules) {
    watch.push_back(r.key);
    checks.push_back({"TYPE", r.key});
    checks.push_back({"GET", r.equals.empty() ? lock.key() : r.key});
  }
  EMBCACHE_RETURN_IF_ERROR(c.run(watch).get_status().with_context(what));
  auto seen = c.pipeline(checks);
  if (!seen.ok()) return seen.get_status().with_context(what);
  const auto& v = seen.value();
  status bad;
  if (v[0]->type != REDIS_REPLY_STRING || std::string(v[0]->str, v[0]->len) != lock.token()) {
    bad = lock.lost();
  } else {
    for (std::size_t i = 0; i < rules.size() && bad.ok(); ++i) {
      const key_rule& r = rules[i];
      const redisReply* t = v[2 * i + 1].get();
      const redisReply* value = v[2 * i + 2].get();
      const std::string type(t->str ? t->str : "", t->len);
      if (type != r.type && !(type == "none" && r.may_be_absent)) {
        bad = status::io_error(c.where + ": " + what + ": '" + r.key + "' is " +
                               (type == "none" ? "missing" : "a " + type) + ", expected a " +
                               r.type + " (nothing of it was applied)");
      } else if (!r.equals.empty() &&
                 std::string(value->str ? value->str : "", value->len) != r.equals) {
        bad = status::io_error(c.where + ": '" + r.key + "' changed while " + what +
                               " (nothing of it was applied)");
      }
    }
  }
  if (!bad.ok()) {
    c.run({"UNWATCH"}).ok();
    return bad;
  }
  if (o.before_commit) o.before_commit(what);
  cmds.push_back({"PEXPIRE", lock.key(), lease_ms(o)});
  cmds.insert(cmds.begin(), args{"MULTI"});
  cmds.push_back({"EXEC"});
  auto replies = c.pipeline(cmds);
  if (!replies.ok()) return replies.get_status().with_context(what);
  const redisReply* exec = replies.value().back().get();
  if (exec->type == REDIS_REPLY_NIL)
    return status::io_error(c.where + ": " + what +
                            " aborted: another client changed the model meanwhile (nothing of it "
                            "was applied)");
  for (std::size_t i = 0; i < exec->elements; ++i) {
    if (exec->element[i]->type == REDIS_REPLY_ERROR)
      return status::io_error(c.where + ": " + what + ": " + cmds[i + 1][0] + " failed: " +
                              std::string(exec->element[i]->str, exec->element[i]->len));
  }
  return {};
}

// The EVAL of count_script over the tables of `names`, for the end of a transaction.
args count_rows(const std::string& p, const std::vector<std::string>& names) {
  args a = {"EVAL", count_script, std::to_string(names.size() + 1), p + ":rows"};
  for (const auto& n : names) a.push_back(p + ":table:" + n);
  for (const auto& n : names) a.push_back(n);
  return a;
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
  if (!key_type_from_name(j["key_type"].get<std::string>(), &m.key_type))
    return status::corruption(at + ": 'key_type' is '" + j["key_type"].get<std::string>() +
                              "', expected 'int64' or 'uint32'");
  if (j.contains("run_id")) {
    if (!j["run_id"].is_string() || !detail::is_run_id(j["run_id"].get<std::string>()))
      return status::corruption(at + ": 'run_id' must be 32 lowercase hex digits");
    m.run_id = j["run_id"].get<std::string>();
  }
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
  // The rows recorded and held, read in one transaction: a delta landing meanwhile changes both.
  std::vector<args> snap = {{"MULTI"}, {"HGETALL", p + ":rows"}};
  for (const auto& [name, dim] : m.dims) {
    m.rows.emplace_back(-1, 0);
    snap.push_back({"HLEN", p + ":table:" + name});
  }
  snap.push_back({"EXEC"});
  auto counted = c.pipeline(snap);
  if (!counted.ok()) return counted.get_status();
  const redisReply* e = counted.value().back().get();
  if (e->type != REDIS_REPLY_ARRAY || e->elements != m.dims.size() + 1 ||
      e->element[0]->type != REDIS_REPLY_ARRAY)
    return status::io_error(c.where + ": reading the row counts under prefix '" + p + "' failed");
  const redisReply* recorded = e->element[0];
  for (std::size_t i = 0; i + 1 < recorded->elements; i += 2) {
    const std::string name(recorded->element[i]->str, recorded->element[i]->len);
    std::uint64_t n = 0;
    for (std::size_t t = 0; t < m.dims.size(); ++t) {
      if (m.dims[t].first != name) continue;
      if (!parse_u64(recorded->element[i + 1]->str, recorded->element[i + 1]->len, &n) ||
          n > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
        return status::corruption(c.where + ": '" + p + ":rows' field '" + name +
                                  "' is not a decimal number");
      m.rows[t].first = static_cast<std::int64_t>(n);
    }
  }
  for (std::size_t t = 0; t < m.dims.size(); ++t) {
    if (e->element[t + 1]->type != REDIS_REPLY_INTEGER)
      return status::io_error(c.where + ": HLEN '" + p + ":table:" + m.dims[t].first +
                              "' failed (not a hash?)");
    m.rows[t].second = e->element[t + 1]->integer;
  }
  return m;
}

status push_base(connection& c, const redis_options& o, writer_lock& lock, const model_folder& base,
                 const redis_model* old, redis_push_report* report) {
  const std::string& p = o.prefix;
  nlohmann::json tables = nlohmann::json::array();
  std::vector<args> swap;
  std::vector<key_rule> rules = {{p + ":schema", "string"},
                                 {p + ":applied", "string"},
                                 {p + ":versions", "hash"},
                                 {p + ":rows", "hash"}};
  std::vector<std::string> names;
  args versions = {"HSET", p + ":versions"};
  // This writer's own staging hashes (named by its token), expiring with its lease: a writer
  // that dies leaves nothing behind for long, and two writers never share one.
  const std::size_t chunk = 64;  // HSETs between two renewals of the lock
  for (const auto& t : base.tables) {
    const std::string stage = p + ":staging:" + lock.token() + ":" + t.name,
                      live = p + ":table:" + t.name;
    std::vector<args> staging;
    batched(&staging, "HSET", stage, t.keys, &t.vectors, t.dim, o.batch_rows);
    for (std::size_t b = 0; b < staging.size(); b += chunk) {
      std::vector<args> part(staging.begin() + b,
                             staging.begin() + std::min(staging.size(), b + chunk));
      part.push_back({"PEXPIRE", stage, lease_ms(o)});
      auto staged = c.pipeline(part);
      if (!staged.ok()) return staged.get_status().with_context("pushing base '" + base.path + "'");
      EMBCACHE_RETURN_IF_ERROR(lock.renew());
    }
    rules.push_back({live, "hash"});
    if (t.keys.empty()) {
      swap.push_back({"DEL", live});
    } else {
      rules.push_back({stage, "hash", false});
      swap.push_back({"RENAME", stage, live});
      swap.push_back({"PERSIST", live});
    }
    tables.push_back({{"name", t.name}, {"dim", t.dim}});
    names.push_back(t.name);
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
  nlohmann::json schema = {{"format", "embcache-redis"},
                           {"format_version", 1},
                           {"key_type", to_string(base.key_type)},
                           {"tables", tables}};
  if (!base.run_id.empty()) schema["run_id"] = base.run_id;
  swap.push_back({"SET", p + ":schema", schema.dump()});
  swap.push_back({"DEL", p + ":versions"});
  if (!base.tables.empty()) swap.push_back(versions);
  swap.push_back({"SET", p + ":applied", std::to_string(base.sequence)});
  swap.push_back(count_rows(p, names));
  EMBCACHE_RETURN_IF_ERROR(
      transaction(c, o, lock, rules, std::move(swap), "swapping in base '" + base.path + "'"));
  report->base_pushed = true;
  return {};
}

status push_delta(connection& c, const redis_options& o, writer_lock& lock, const redis_model& m,
                  const model_folder& d, const std::vector<bool>& apply,
                  redis_push_report* report) {
  const std::string& p = o.prefix;
  std::vector<args> cmds;
  // The position the delta follows, checked under WATCH.
  std::vector<key_rule> rules = {
      {p + ":applied", "string", false, std::to_string(m.position.applied_delta)},
      {p + ":versions", "hash"}};
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
    rules.push_back({live, "hash"});
    batched(&cmds, "HDEL", live, dt.erased, nullptr, 0, o.batch_rows);
    batched(&cmds, "HSET", live, dt.keys, &dt.vectors, dt.dim, o.batch_rows);
    versions.push_back(dt.name);
    versions.push_back(std::to_string(dt.version));
    report->rows_written += dt.keys.size();
    report->keys_deleted += dt.erased.size();
  }
  if (versions.size() > 2) cmds.push_back(versions);
  cmds.push_back({"SET", p + ":applied", std::to_string(d.sequence)});
  std::vector<std::string> names;
  for (const auto& [name, dim] : m.dims) names.push_back(name);
  cmds.push_back(count_rows(p, names));
  return transaction(c, o, lock, rules, std::move(cmds), "pushing '" + d.path + "'");
}

// A folder of another run than the store's: refused, naming both (a side without a run identity,
// written by an earlier version, is not checked).
status check_run(const redis_model& m, const model_folder& f, const std::string& where) {
  if (m.run_id.empty() || f.run_id.empty() || m.run_id == f.run_id) return {};
  return status::invalid_argument("'" + f.path + "' belongs to run " + f.run_id +
                                  ", the model in " + where + " to run " + m.run_id +
                                  " (deltas and bases of different runs do not mix)");
}

}  // namespace

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
  writer_lock lock(conn, options);
  EMBCACHE_RETURN_IF_ERROR(lock.acquire());
  redis_push_report report;
  auto held = read_model(conn, options);
  if (!held.ok() && held.get_status().code() != status_code::not_found) return held.get_status();
  if (!held.ok() || replace_base) {
    if (base_dir.empty())
      return status::invalid_argument(conn.where + " holds no model under prefix '" +
                                      options.prefix + "' and no base folder was given");
    auto base = read_base(base_dir);
    if (!base.ok()) return base.get_status().with_context("redis push: base");
    EMBCACHE_RETURN_IF_ERROR(
        push_base(conn, options, lock, base.value(), held.ok() ? &held.value() : nullptr, &report));
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
    auto d = read_delta(e.path);
    if (!d.ok()) return d.get_status().with_context("redis push");
    if (d.value().sequence != e.sequence || d.value().key_type != m.key_type)
      return status::invalid_argument("redis push: '" + e.path + "' has sequence " +
                                      std::to_string(d.value().sequence) + " and " +
                                      to_string(d.value().key_type) + " keys; expected " +
                                      std::to_string(e.sequence) + " and " + to_string(m.key_type));
    EMBCACHE_RETURN_IF_ERROR(check_run(m, d.value(), conn.where).with_context("redis push"));
    report.run_unchecked = report.run_unchecked || m.run_id.empty() || d.value().run_id.empty();
    model_position next = m.position;
    std::vector<bool> flags;
    EMBCACHE_RETURN_IF_ERROR(advance_position(next, d.value(), &flags).with_context("redis push"));
    EMBCACHE_RETURN_IF_ERROR(push_delta(conn, options, lock, m, d.value(), flags, &report));
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
  const redis_model& mm = r->model_;
  for (std::size_t t = 0; t < mm.dims.size(); ++t) {
    const auto [recorded, now] = mm.rows[t];
    if (recorded >= 0 && recorded != now)
      return status::corruption(r->conn_->where + ": '" + options.prefix +
                                ":table:" + mm.dims[t].first + "' holds " + std::to_string(now) +
                                " rows, the last push left " + std::to_string(recorded) +
                                (now == 0 ? " (the key is missing: renamed or deleted?)" : ""));
  }
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
