// The trainer's configuration: defaults, validation and JSON.
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "embcache/trainer/trainer.hpp"

namespace embcache {
namespace {

using json = nlohmann::json;

// Reads the fields of one JSON object, refusing unknown ones and values of the wrong type; the
// first error wins and names the field by its path ("config.tables[1].capacity").
class object_reader {
 public:
  object_reader(const json& j, std::string path, status* error)
      : j_(j), path_(std::move(path)), error_(error) {
    if (error_->ok() && !j_.is_object()) fail(path_, "expected an object");
  }
  ~object_reader() = default;

  template <class T>
  void get(const char* name, T& out) {
    seen_.insert(name);
    if (!error_->ok() || !j_.is_object() || !j_.contains(name)) return;
    try {
      out = j_.at(name).get<T>();
    } catch (const std::exception& e) {
      fail(path_ + "." + name, std::string("wrong type (") + j_.at(name).type_name() + ")");
    }
  }
  bool has(const char* name) const { return j_.is_object() && j_.contains(name); }
  const json& at(const char* name) {
    seen_.insert(name);
    return j_.at(name);
  }
  std::string path(const char* name) const { return path_ + "." + name; }
  void fail(const std::string& where, const std::string& what) {
    if (error_->ok()) *error_ = status::invalid_argument(where + ": " + what);
  }
  // Refuses fields never asked for (typos).
  void finish() {
    if (!error_->ok() || !j_.is_object()) return;
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!seen_.count(it.key())) fail(path_ + "." + it.key(), "unknown field");
  }

 private:
  const json& j_;
  std::string path_;
  status* error_;
  std::set<std::string> seen_;
};

result<trainer_mode> parse_mode(const std::string& s) {
  if (s == "keyset") return trainer_mode::keyset;
  if (s == "on_demand") return trainer_mode::on_demand;
  if (s == "host_hybrid") return trainer_mode::host_hybrid;
  return status::invalid_argument("\"" + s + "\" is not a mode (keyset, on_demand, host_hybrid)");
}

result<optimizer_kind> parse_kind(const std::string& s) {
  for (auto k :
       {optimizer_kind::sgd, optimizer_kind::adagrad, optimizer_kind::adam, optimizer_kind::ftrl})
    if (s == to_string(k)) return k;
  return status::invalid_argument("\"" + s + "\" is not an optimizer (sgd, adagrad, adam, ftrl)");
}

void read_optimizer(const json& j, const std::string& path, optimizer_options& o, status* err) {
  object_reader r(j, path, err);
  if (r.has("kind")) {
    std::string kind;
    r.get("kind", kind);
    if (err->ok()) {
      auto k = parse_kind(kind);
      if (!k.ok())
        r.fail(r.path("kind"), k.get_status().message());
      else
        o.kind = k.value();
    }
  }
  r.get("learning_rate", o.learning_rate);
  r.get("beta1", o.beta1);
  r.get("beta2", o.beta2);
  r.get("epsilon", o.epsilon);
  r.get("adagrad_initial_accumulator", o.adagrad_initial_accumulator);
  r.get("ftrl_alpha", o.ftrl_alpha);
  r.get("ftrl_beta", o.ftrl_beta);
  r.get("ftrl_l1", o.ftrl_l1);
  r.get("ftrl_l2", o.ftrl_l2);
  r.get("ftrl_lr_power", o.ftrl_lr_power);
  r.get("ftrl_initial_accumulator", o.ftrl_initial_accumulator);
  r.finish();
}

json optimizer_json(const optimizer_options& o) {
  return {{"kind", to_string(o.kind)},
          {"learning_rate", o.learning_rate},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"epsilon", o.epsilon},
          {"adagrad_initial_accumulator", o.adagrad_initial_accumulator},
          {"ftrl_alpha", o.ftrl_alpha},
          {"ftrl_beta", o.ftrl_beta},
          {"ftrl_l1", o.ftrl_l1},
          {"ftrl_l2", o.ftrl_l2},
          {"ftrl_lr_power", o.ftrl_lr_power},
          {"ftrl_initial_accumulator", o.ftrl_initial_accumulator}};
}

}  // namespace

const char* to_string(trainer_mode mode) noexcept {
  switch (mode) {
    case trainer_mode::keyset:
      return "keyset";
    case trainer_mode::on_demand:
      return "on_demand";
    case trainer_mode::host_hybrid:
      return "host_hybrid";
  }
  return "?";
}

std::vector<trainer_table_config> default_trainer_tables() {
  trainer_table_config wide;
  wide.name = "wide";
  wide.dim = 1;
  wide.optimizer = default_wide_optimizer();
  wide.init_scale = 0.0f;
  trainer_table_config deep;
  deep.name = "deep";
  return {wide, deep};
}

status validate(const trainer_config& c) {
  if (c.passes.empty()) return status::invalid_argument("config.passes: must hold at least 1 pass");
  for (std::size_t p = 0; p < c.passes.size(); ++p) {
    const std::string at = "config.passes[" + std::to_string(p) + "]";
    if (c.passes[p].shards.empty())
      return status::invalid_argument(at + ".shards: must hold at least 1 shard");
    for (std::size_t s = 0; s < c.passes[p].shards.size(); ++s)
      if (c.passes[p].shards[s].empty())
        return status::invalid_argument(at + ".shards[" + std::to_string(s) + "]: empty path");
  }
  if (c.tables.size() != 2)
    return status::invalid_argument(
        "config.tables: must hold 2 tables, \"wide\" and \"deep\" (has " +
        std::to_string(c.tables.size()) + ")");
  bool have_wide = false, have_deep = false;
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    const trainer_table_config& tc = c.tables[t];
    const std::string at = "config.tables[" + std::to_string(t) + "]";
    if (tc.name == "wide") {
      if (have_wide) return status::invalid_argument(at + ".name: \"wide\" appears twice");
      have_wide = true;
      if (tc.dim != 1) return status::invalid_argument(at + ".dim: the wide table's dim must be 1");
    } else if (tc.name == "deep") {
      if (have_deep) return status::invalid_argument(at + ".name: \"deep\" appears twice");
      have_deep = true;
      if (tc.dim < 1) return status::invalid_argument(at + ".dim: must be >= 1");
    } else {
      return status::invalid_argument(at + ".name: \"" + tc.name +
                                      "\" is not a table of the model (\"wide\" or \"deep\")");
    }
    if (tc.capacity < 1) return status::invalid_argument(at + ".capacity: must be >= 1");
    if (tc.slots != 0 && tc.slots < tc.capacity)
      return status::invalid_argument(at + ".slots: must be 0 (default) or >= capacity");
    if (tc.max_resident != 0 && tc.max_resident < tc.capacity)
      return status::invalid_argument(at + ".max_resident: must be 0 (default) or >= capacity");
    if (tc.max_resident != 0 && tc.slots != 0 && tc.max_resident > tc.slots)
      return status::invalid_argument(at + ".max_resident: must be <= slots");
    if (tc.store != "host" && tc.store != "rocksdb")
      return status::invalid_argument(at + ".store: \"" + tc.store +
                                      "\" is not a store (\"host\" or \"rocksdb\")");
    if (tc.store == "rocksdb" && tc.store_path.empty())
      return status::invalid_argument(at + ".store_path: required with store \"rocksdb\"");
    if (!(tc.init_scale >= 0.0f) || !std::isfinite(tc.init_scale))
      return status::invalid_argument(at + ".init_scale: must be a finite value >= 0");
    EMBCACHE_RETURN_IF_ERROR(check_options(tc.optimizer).with_context(at + ".optimizer"));
  }
  if (c.batch_size < 1) return status::invalid_argument("config.batch_size: must be >= 1");
  if (!(c.model.dropout >= 0.0f && c.model.dropout < 1.0f))
    return status::invalid_argument("config.model.dropout: must be in [0, 1)");
  for (std::size_t i = 0; i < c.model.hidden.size(); ++i)
    if (c.model.hidden[i] < 1)
      return status::invalid_argument("config.model.hidden[" + std::to_string(i) +
                                      "]: must be >= 1");
  if (!(c.model.adam.learning_rate > 0.0f))
    return status::invalid_argument("config.model.learning_rate: must be > 0");
  if (c.threads < 0) return status::invalid_argument("config.threads: must be >= 0");
  if (c.blas_threads < 0) return status::invalid_argument("config.blas_threads: must be >= 0");
  if (c.dense_device != "host" && c.dense_device != "cuda" && c.dense_device != "auto")
    return status::invalid_argument("config.dense_device: \"" + c.dense_device +
                                    "\" is not a device (host, cuda, auto)");
  if (c.mode == trainer_mode::host_hybrid && !c.export_dir.empty())
    return status::invalid_argument(
        "config.export_dir: incremental export needs a cache (mode keyset or on_demand)");
  return {};
}

result<trainer_config> trainer_config_from_json(const json& j) {
  trainer_config c;
  status err;
  object_reader r(j, "config", &err);
  if (r.has("mode")) {
    std::string m;
    r.get("mode", m);
    if (err.ok()) {
      auto mode = parse_mode(m);
      if (!mode.ok())
        r.fail("config.mode", mode.get_status().message());
      else
        c.mode = mode.value();
    }
  }
  r.get("data_dir", c.data_dir);
  if (r.has("passes") && err.ok()) {
    const json& ps = r.at("passes");
    if (!ps.is_array()) r.fail("config.passes", "expected an array of passes");
    for (std::size_t p = 0; err.ok() && p < ps.size(); ++p) {
      const std::string at = "config.passes[" + std::to_string(p) + "]";
      trainer_pass_config pass;
      // A pass is {"shards": [...]} or, for short, the array of shards itself.
      const json* shards = &ps[p];
      std::unique_ptr<object_reader> pr;
      if (ps[p].is_object()) {
        pr = std::make_unique<object_reader>(ps[p], at, &err);
        if (!ps[p].contains("shards")) r.fail(at + ".shards", "required");
        if (err.ok()) shards = &pr->at("shards");
        pr->finish();
      }
      if (err.ok() && !shards->is_array())
        r.fail(at, "expected an array of shard paths or {\"shards\": [...]}");
      for (std::size_t s = 0; err.ok() && s < shards->size(); ++s) {
        if (!(*shards)[s].is_string())
          r.fail(at + ".shards[" + std::to_string(s) + "]", "expected a path string");
        else
          pass.shards.push_back((*shards)[s].get<std::string>());
      }
      c.passes.push_back(std::move(pass));
    }
  }
  r.get("eval_shard", c.eval_shard);
  r.get("eval_max_samples", c.eval_max_samples);
  if (r.has("tables") && err.ok()) {
    const json& ts = r.at("tables");
    if (!ts.is_array()) r.fail("config.tables", "expected an array of tables");
    std::vector<trainer_table_config> defaults = default_trainer_tables();
    c.tables.clear();
    for (std::size_t t = 0; err.ok() && t < ts.size(); ++t) {
      const std::string at = "config.tables[" + std::to_string(t) + "]";
      object_reader tr(ts[t], at, &err);
      trainer_table_config tc;
      std::string name;
      tr.get("name", name);
      // A table named like a default starts from that default (wide: dim 1, FTRL).
      for (const auto& d : defaults)
        if (d.name == name) tc = d;
      tc.name = name;
      tr.get("dim", tc.dim);
      if (tr.has("optimizer") && err.ok())
        read_optimizer(tr.at("optimizer"), at + ".optimizer", tc.optimizer, &err);
      tr.get("capacity", tc.capacity);
      tr.get("slots", tc.slots);
      tr.get("max_resident", tc.max_resident);
      tr.get("store", tc.store);
      tr.get("store_path", tc.store_path);
      tr.get("init_scale", tc.init_scale);
      tr.finish();
      c.tables.push_back(tc);
    }
  }
  if (r.has("model") && err.ok()) {
    object_reader mr(r.at("model"), "config.model", &err);
    mr.get("hidden", c.model.hidden);
    mr.get("dropout", c.model.dropout);
    mr.get("seed", c.model.seed);
    mr.get("learning_rate", c.model.adam.learning_rate);
    mr.get("beta1", c.model.adam.beta1);
    mr.get("beta2", c.model.adam.beta2);
    mr.get("epsilon", c.model.adam.epsilon);
    mr.finish();
  }
  r.get("crossed", c.crossed);
  r.get("batch_size", c.batch_size);
  r.get("shuffle", c.shuffle);
  r.get("seed", c.seed);
  r.get("prefetch", c.prefetch);
  r.get("log_interval", c.log_interval);
  r.get("output_dir", c.output_dir);
  r.get("export_dir", c.export_dir);
  r.get("export_with_state", c.export_with_state);
  r.get("save_dir", c.save_dir);
  r.get("save_every_pass", c.save_every_pass);
  r.get("resume_from", c.resume_from);
  r.get("threads", c.threads);
  r.get("dense_device", c.dense_device);
  r.get("blas_threads", c.blas_threads);
  r.finish();
  if (!err.ok()) return err;
  EMBCACHE_RETURN_IF_ERROR(validate(c));
  return c;
}

result<trainer_config> load_trainer_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) return status::not_found(path + ": cannot open the configuration file");
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    return status::invalid_argument(path + ": not valid JSON: " + e.what());
  }
  auto c = trainer_config_from_json(j);
  if (!c.ok()) return c.get_status().with_context(path);
  return c;
}

void to_json(json& j, const trainer_config& c) {
  json passes = json::array();
  for (const auto& p : c.passes) passes.push_back({{"shards", p.shards}});
  json tables = json::array();
  for (const auto& t : c.tables)
    tables.push_back({{"name", t.name},
                      {"dim", t.dim},
                      {"optimizer", optimizer_json(t.optimizer)},
                      {"capacity", t.capacity},
                      {"slots", t.slots},
                      {"max_resident", t.max_resident},
                      {"store", t.store},
                      {"store_path", t.store_path},
                      {"init_scale", t.init_scale}});
  j = json{{"mode", to_string(c.mode)},
           {"data_dir", c.data_dir},
           {"passes", passes},
           {"eval_shard", c.eval_shard},
           {"eval_max_samples", c.eval_max_samples},
           {"tables", tables},
           {"model",
            {{"hidden", c.model.hidden},
             {"dropout", c.model.dropout},
             {"seed", c.model.seed},
             {"learning_rate", c.model.adam.learning_rate},
             {"beta1", c.model.adam.beta1},
             {"beta2", c.model.adam.beta2},
             {"epsilon", c.model.adam.epsilon}}},
           {"crossed", c.crossed},
           {"batch_size", c.batch_size},
           {"shuffle", c.shuffle},
           {"seed", c.seed},
           {"prefetch", c.prefetch},
           {"log_interval", c.log_interval},
           {"output_dir", c.output_dir},
           {"export_dir", c.export_dir},
           {"export_with_state", c.export_with_state},
           {"save_dir", c.save_dir},
           {"save_every_pass", c.save_every_pass},
           {"resume_from", c.resume_from},
           {"threads", c.threads},
           {"dense_device", c.dense_device},
           {"blas_threads", c.blas_threads}};
}

void to_json(json& j, const pass_metrics& m) {
  auto num = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  j = json{{"pass", m.pass},
           {"samples", m.samples},
           {"steps", m.steps},
           {"train_loss", num(m.train_loss)},
           {"eval_auc", num(m.eval_auc)},
           {"eval_logloss", num(m.eval_logloss)},
           {"swap_seconds", m.swap_seconds},
           {"rows_in", m.rows_in},
           {"rows_out", m.rows_out},
           {"hit_rate", num(m.hit_rate)},
           {"samples_per_s", m.samples_per_s},
           {"seconds", m.seconds},
           {"rows_exported", m.rows_exported},
           {"export_path", m.export_path}};
}

}  // namespace embcache
