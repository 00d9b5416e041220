// The trainer's configuration: defaults, validation and JSON (the memory estimate is in
// trainer_memory.cpp, the datasets' expansion in trainer_datasets.cpp).
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/durable_file.hpp"
#include "common/strict_json.hpp"
#include "config_reader.hpp"
#include "embcache/criteo.hpp"
#include "embcache/shard.hpp"
#include "embcache/trainer/trainer.hpp"
#include "trainer_config_admission.hpp"
#include "trainer_config_store.hpp"

namespace embcache {
namespace {

using namespace detail;  // the reader (config_reader.hpp)

// The modes by name: to_string and the reader share this list.
constexpr std::pair<trainer_mode, const char*> mode_names[] = {
    {trainer_mode::keyset, "keyset"},
    {trainer_mode::on_demand, "on_demand"},
    {trainer_mode::host_hybrid, "host_hybrid"}};

result<trainer_mode> parse_mode(const std::string& s) {
  for (const auto& [mode, name] : mode_names)
    if (s == name) return mode;
  return status::invalid_argument("\"" + s + "\" is not a mode (keyset, on_demand, host_hybrid)");
}

// The real fields of optimizer_options with their ranges: read, checked and written from this
// one list.
struct optimizer_field {
  const char* name;
  float optimizer_options::*member;
  const real_range& range;
};
const optimizer_field optimizer_fields[] = {
    {"learning_rate", &optimizer_options::learning_rate, positive},
    {"beta1", &optimizer_options::beta1, unit},
    {"beta2", &optimizer_options::beta2, unit},
    {"epsilon", &optimizer_options::epsilon, non_negative},
    {"adagrad_initial_accumulator", &optimizer_options::adagrad_initial_accumulator, non_negative},
    {"ftrl_alpha", &optimizer_options::ftrl_alpha, positive},
    {"ftrl_beta", &optimizer_options::ftrl_beta, non_negative},
    {"ftrl_l1", &optimizer_options::ftrl_l1, non_negative},
    {"ftrl_l2", &optimizer_options::ftrl_l2, non_negative},
    {"ftrl_lr_power", &optimizer_options::ftrl_lr_power, non_positive},
    {"ftrl_initial_accumulator", &optimizer_options::ftrl_initial_accumulator, positive}};

void read_optimizer(const json& j, const std::string& path, optimizer_options& o, status* err) {
  object_reader r(j, path, err);
  if (r.has("kind")) {
    std::string kind;
    r.get("kind", kind);
    if (err->ok() && !optimizer_kind_from_string(kind, &o.kind))
      r.fail(r.path("kind"), "\"" + kind + "\" is not an optimizer (sgd, adagrad, adam, ftrl)");
  }
  for (const optimizer_field& f : optimizer_fields) r.get_real(f.name, o.*f.member, f.range);
  r.finish();
}

json optimizer_json(const optimizer_options& o) {
  json j = {{"kind", to_string(o.kind)}};
  for (const optimizer_field& f : optimizer_fields) j[f.name] = float_json(o.*f.member);
  return j;
}

// The ranges read_optimizer enforces, for optimizers built in code.
status check_optimizer_ranges(const optimizer_options& o, const std::string& at) {
  for (const optimizer_field& f : optimizer_fields)
    EMBCACHE_RETURN_IF_ERROR(check_real(at + "." + f.name, o.*f.member, f.range));
  return {};
}

std::string hidden_text() {
  return "an array of at most " + std::to_string(max_layers) + " widths, each " +
         int_range{1, max_width}.text();
}

status check_signed(const std::string& where, long long v, const int_range& r) {
  if (v < r.lo || (v >= 0 && !r.contains_unsigned(std::uint64_t(v))))
    return range_error(where, r.text(), std::to_string(v));
  return {};
}

// The top-level fields of one type: read, checked and written from these lists (the passes,
// tables, model and seed have code of their own).
template <class T>
struct config_field {
  const char* name;
  T trainer_config::*member;
};
template <class T>
struct ranged_field {
  const char* name;
  T trainer_config::*member;
  int_range range;
};
const config_field<std::string> text_fields[] = {
    {"data_dir", &trainer_config::data_dir},
    {"eval_shard", &trainer_config::eval_shard},
    {"output_dir", &trainer_config::output_dir},
    {"export_dir", &trainer_config::export_dir},
    {"save_dir", &trainer_config::save_dir},
    {"resume_from", &trainer_config::resume_from},
    {"start_from_hugectr", &trainer_config::start_from_hugectr}};
const config_field<device_choice> device_fields[] = {
    {"dense_device", &trainer_config::dense_device},
    {"embedding_device", &trainer_config::embedding_device}};
const config_field<bool> flag_fields[] = {{"crossed", &trainer_config::crossed},
                                          {"shuffle", &trainer_config::shuffle},
                                          {"prefetch", &trainer_config::prefetch},
                                          {"export_with_state", &trainer_config::export_with_state},
                                          {"save_every_pass", &trainer_config::save_every_pass}};
const ranged_field<std::size_t> count_fields[] = {
    {"eval_max_samples", &trainer_config::eval_max_samples, {0, max_count}},
    {"batch_size", &trainer_config::batch_size, {1, max_batch}},
    {"log_interval", &trainer_config::log_interval, {0, max_count}},
    {"num_blocks", &trainer_config::num_blocks, {1, max_blocks}},
    {"num_dense", &trainer_config::num_dense, {0, schema_max_dense}},
    {"num_slots", &trainer_config::num_slots, {1, schema_max_categorical}}};
const ranged_field<int> thread_fields[] = {
    {"threads", &trainer_config::threads, {0, max_threads}},
    {"blas_threads", &trainer_config::blas_threads, {0, max_threads}}};

}  // namespace

const char* to_string(trainer_mode mode) noexcept {
  for (const auto& [m, name] : mode_names)
    if (m == mode) return name;
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
    if (!c.passes[p].dataset.empty()) {
      if (!c.passes[p].shards.empty())
        return status::invalid_argument(at + ": names both shards and a dataset; give one of them");
      continue;
    }
    if (c.passes[p].shards.empty())
      return status::invalid_argument(at + ".shards: must hold at least 1 shard");
    for (std::size_t s = 0; s < c.passes[p].shards.size(); ++s)
      if (c.passes[p].shards[s].empty())
        return status::invalid_argument(at + ".shards[" + std::to_string(s) + "]: empty path");
  }
  if (!c.start_from_hugectr.empty() && !c.resume_from.empty())
    return status::invalid_argument(
        "config.start_from_hugectr: set together with config.resume_from; a run starts from a "
        "trainer save or from a HugeCTR sparse model folder, not both");
  if (c.num_dense > schema_max_dense)
    return status::invalid_argument("config.num_dense: expected an integer in [0, " +
                                    std::to_string(schema_max_dense) + "], got " +
                                    std::to_string(c.num_dense));
  if (c.num_slots == 0 || c.num_slots > schema_max_categorical)
    return status::invalid_argument("config.num_slots: expected an integer in [1, " +
                                    std::to_string(schema_max_categorical) + "], got " +
                                    std::to_string(c.num_slots));
  if (c.crossed && c.num_slots != criteo_slot_count)
    return status::invalid_argument(
        "config.crossed: crossed keys pair Criteo's 26 categorical slots, the data has " +
        std::to_string(c.num_slots));
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
      EMBCACHE_RETURN_IF_ERROR(check_int(at + ".dim", tc.dim, {1, max_dim}));
    } else {
      return status::invalid_argument(at + ".name: \"" + tc.name +
                                      "\" is not a table of the model (\"wide\" or \"deep\")");
    }
    EMBCACHE_RETURN_IF_ERROR(check_int(at + ".capacity", tc.capacity, {1, max_rows}));
    EMBCACHE_RETURN_IF_ERROR(check_int(at + ".slots", tc.slots, {0, max_rows}));
    EMBCACHE_RETURN_IF_ERROR(check_int(at + ".max_resident", tc.max_resident, {0, max_rows}));
    // With capacity "auto" the capacity is known once the datasets are read (resolve).
    if (tc.slots != 0 && !tc.capacity_auto && tc.slots < tc.capacity)
      return status::invalid_argument(at + ".slots: must be 0 (default) or >= capacity");
    if (tc.max_resident != 0 && !tc.capacity_auto && tc.max_resident < tc.capacity)
      return status::invalid_argument(at + ".max_resident: must be 0 (default) or >= capacity");
    if (tc.max_resident != 0 && tc.slots != 0 && tc.max_resident > tc.slots)
      return status::invalid_argument(at + ".max_resident: must be <= slots");
    EMBCACHE_RETURN_IF_ERROR(validate_store_fields(tc, at, c.memory_budget_bytes));
    EMBCACHE_RETURN_IF_ERROR(check_real(at + ".init_scale", tc.init_scale, scale_range));
    EMBCACHE_RETURN_IF_ERROR(check_optimizer_ranges(tc.optimizer, at + ".optimizer"));
    EMBCACHE_RETURN_IF_ERROR(check_options(tc.optimizer).with_context(at + ".optimizer"));
    EMBCACHE_RETURN_IF_ERROR(validate_admission_fields(tc, at));
    EMBCACHE_RETURN_IF_ERROR(
        check_real(at + ".expiry.min_l2_norm", tc.expiry.min_l2_norm, non_negative));
    EMBCACHE_RETURN_IF_ERROR(
        check_int(at + ".expiry.ttl_steps", tc.expiry.ttl_steps, {0, max_ttl_steps}));
  }
  for (const auto& f : count_fields)
    EMBCACHE_RETURN_IF_ERROR(check_int(std::string("config.") + f.name, c.*f.member, f.range));
  EMBCACHE_RETURN_IF_ERROR(check_real("config.model.dropout", c.model.dropout, unit));
  if (c.model.hidden.size() > max_layers)
    return range_error("config.model.hidden", hidden_text(),
                       std::to_string(c.model.hidden.size()) + " layers");
  for (std::size_t i = 0; i < c.model.hidden.size(); ++i)
    EMBCACHE_RETURN_IF_ERROR(check_int("config.model.hidden[" + std::to_string(i) + "]",
                                       c.model.hidden[i], {1, max_width}));
  EMBCACHE_RETURN_IF_ERROR(
      check_real("config.model.learning_rate", c.model.adam.learning_rate, positive));
  EMBCACHE_RETURN_IF_ERROR(check_real("config.model.beta1", c.model.adam.beta1, unit));
  EMBCACHE_RETURN_IF_ERROR(check_real("config.model.beta2", c.model.adam.beta2, unit));
  EMBCACHE_RETURN_IF_ERROR(check_real("config.model.epsilon", c.model.adam.epsilon, positive));
  for (const auto& f : thread_fields)
    EMBCACHE_RETURN_IF_ERROR(check_signed(std::string("config.") + f.name, c.*f.member, f.range));
  EMBCACHE_RETURN_IF_ERROR(check_signed("config.world", c.world, {0, max_world}));
  EMBCACHE_RETURN_IF_ERROR(validate_memory_fields(c));
  if (c.world > 1 && c.num_blocks % static_cast<std::size_t>(c.world) != 0)
    return status::invalid_argument("config.num_blocks: " + std::to_string(c.num_blocks) +
                                    " blocks do not split over config.world " +
                                    std::to_string(c.world) +
                                    " ranks (must be a multiple of the number of ranks)");
  if (c.world > 1 && c.mode == trainer_mode::on_demand)
    return status::invalid_argument(std::string("config.mode: \"") + to_string(c.mode) +
                                    "\" with config.world " + std::to_string(c.world) +
                                    ": a sharded run trains in mode \"keyset\" or \"host_hybrid\"");
  if (c.move_staged_rows.value_or(false) && (c.mode != trainer_mode::keyset || !c.prefetch))
    return status::invalid_argument(
        std::string("config.move_staged_rows: moves the rows the prefetch stages, so it needs "
                    "config.mode \"keyset\" with config.prefetch (got mode \"") +
        to_string(c.mode) + "\", prefetch " + (c.prefetch ? "true" : "false") + ")");
  for (const auto& f : device_fields)
    EMBCACHE_RETURN_IF_ERROR(check_device_choice(c.*f.member, std::string("config.") + f.name));
  if (c.mode == trainer_mode::host_hybrid && c.embedding_device == device_choice::cuda)
    return status::invalid_argument(
        "config.embedding_device: \"cuda\" with config.mode \"host_hybrid\": host-hybrid keeps "
        "the embeddings and their sparse optimizers on the host (use \"host\" or \"auto\", or "
        "mode \"keyset\" or \"on_demand\")");
  // A name too long for the file system would fail only when the first file is written, after
  // training: checked here. A save is published beside ".tmp" and ".old" siblings.
  EMBCACHE_RETURN_IF_ERROR(detail::check_output_path_length("config.save_dir", c.save_dir, 4));
  EMBCACHE_RETURN_IF_ERROR(detail::check_output_path_length("config.export_dir", c.export_dir, 0));
  EMBCACHE_RETURN_IF_ERROR(detail::check_output_path_length("config.output_dir", c.output_dir, 0));
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
  if (r.has("passes") && err.ok()) {
    const json& ps = r.at("passes");
    if (!ps.is_array()) r.fail("config.passes", "expected an array of passes");
    for (std::size_t p = 0; err.ok() && p < ps.size(); ++p) {
      const std::string at = "config.passes[" + std::to_string(p) + "]";
      trainer_pass_config pass;
      // A pass is {"shards": [...]} or {"dataset": "folder"} or, for short, the array of shards
      // or the folder itself.
      static const json no_shards = json::array();
      const json* shards = &ps[p];
      std::unique_ptr<object_reader> pr;
      if (ps[p].is_object()) {
        pr = std::make_unique<object_reader>(ps[p], at, &err);
        if (ps[p].contains("shards") && ps[p].contains("dataset"))
          r.fail(at, "names both shards and a dataset; give one of them");
        else if (!ps[p].contains("shards") && !ps[p].contains("dataset"))
          r.fail(at + ".shards", "required (or dataset, a dataset folder)");
        if (err.ok() && ps[p].contains("shards")) shards = &pr->at("shards");
        if (err.ok() && ps[p].contains("dataset")) {
          pr->get("dataset", pass.dataset);
          shards = &no_shards;
        }
        pr->finish();
      } else if (ps[p].is_string()) {
        pass.dataset = ps[p].get<std::string>();
        shards = &no_shards;
      }
      if (err.ok() && shards == &no_shards && pass.dataset.empty())
        r.fail(at + ".dataset", "empty path");
      if (err.ok() && !shards->is_array())
        r.fail(at,
               "expected an array of shard paths, a dataset folder, {\"shards\": [...]} or "
               "{\"dataset\": \"...\"}");
      for (std::size_t s = 0; err.ok() && s < shards->size(); ++s) {
        if (!(*shards)[s].is_string())
          r.fail(at + ".shards[" + std::to_string(s) + "]", "expected a path string");
        else
          pass.shards.push_back((*shards)[s].get<std::string>());
      }
      c.passes.push_back(std::move(pass));
    }
  }
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
      tr.get_int("dim", tc.dim, {1, max_dim});
      if (tr.has("optimizer") && err.ok())
        read_optimizer(tr.at("optimizer"), at + ".optimizer", tc.optimizer, &err);
      if (tr.has("capacity") && tr.at("capacity").is_string()) {
        std::string capacity;
        tr.get("capacity", capacity);
        if (capacity != "auto")
          tr.fail(tr.path("capacity"), "expected " + int_range{1, max_rows}.text() +
                                           " or \"auto\", got " + shown(json(capacity)));
        tc.capacity_auto = true;
      } else {
        tr.get_int("capacity", tc.capacity, {1, max_rows});
      }
      tr.get_int("slots", tc.slots, {0, max_rows});
      tr.get_int("max_resident", tc.max_resident, {0, max_rows});
      read_store_fields(tr, tc);
      tr.get_real("init_scale", tc.init_scale, scale_range);
      read_admission_fields(tr, at, tc, &err);
      if (tr.has("expiry") && err.ok()) {
        object_reader er(tr.at("expiry"), at + ".expiry", &err);
        er.get_int("ttl_passes", tc.expiry.ttl_passes, {0, max_ttl_passes});
        er.get_real("min_l2_norm", tc.expiry.min_l2_norm, non_negative);
        er.get_int("ttl_steps", tc.expiry.ttl_steps, {0, max_ttl_steps});
        er.finish();
      }
      tr.finish();
      c.tables.push_back(tc);
    }
  }
  if (r.has("model") && err.ok()) {
    object_reader mr(r.at("model"), "config.model", &err);
    if (mr.has("hidden") && err.ok()) {
      const json& h = mr.at("hidden");
      if (!h.is_array() || h.size() > max_layers) {
        err = range_error("config.model.hidden", hidden_text(), shown(h));
      } else {
        c.model.hidden.assign(h.size(), 0);
        for (std::size_t i = 0; err.ok() && i < h.size(); ++i)
          object_reader::read_int(h[i], "config.model.hidden[" + std::to_string(i) + "]",
                                  c.model.hidden[i], {1, max_width}, &err);
      }
    }
    mr.get_real("dropout", c.model.dropout, unit);
    mr.get_int("seed", c.model.seed, {0, max_u64});
    mr.get_real("learning_rate", c.model.adam.learning_rate, positive);
    mr.get_real("beta1", c.model.adam.beta1, unit);
    mr.get_real("beta2", c.model.adam.beta2, unit);
    mr.get_real("epsilon", c.model.adam.epsilon, positive);
    mr.finish();
  }
  r.get_int("seed", c.seed, {0, max_u64});
  // "world": "auto" (the launcher's) or a number of ranks.
  if (r.has("world") && r.at("world").is_string()) {
    std::string world;
    r.get("world", world);
    if (err.ok() && world != "auto")
      r.fail("config.world", "expected " + int_range{1, max_world}.text() + " or \"auto\", got " +
                                 shown(json(world)));
    c.world = 0;
  } else {
    r.get_int("world", c.world, {1, max_world});
  }
  for (const auto& f : text_fields) r.get(f.name, c.*f.member);
  for (const auto& f : device_fields) {
    if (!r.has(f.name)) continue;
    std::string name;
    r.get(f.name, name);
    if (err.ok() && !device_choice_from_name(name, &(c.*f.member)))
      r.fail(r.path(f.name), "\"" + name + "\" is not a device (host, cuda, auto)");
  }
  for (const auto& f : flag_fields) r.get(f.name, c.*f.member);
  if (r.has("move_staged_rows")) {  // absent: the default, which depends on where the caches are
    bool moved = false;
    r.get("move_staged_rows", moved);
    c.move_staged_rows = moved;
  }
  for (const auto& f : count_fields) r.get_int(f.name, c.*f.member, f.range);
  for (const auto& f : thread_fields) r.get_int(f.name, c.*f.member, f.range);
  read_memory_fields(r, c);
  r.finish();
  if (!err.ok()) return err;
  EMBCACHE_RETURN_IF_ERROR(validate(c));
  return c;
}

result<trainer_config> trainer_config_from_text(std::string_view text, const std::string& origin) {
  auto j = detail::parse_json_unique_keys(text, origin, "config");
  if (!j.ok()) return j.get_status();
  auto c = trainer_config_from_json(j.value());
  if (!c.ok()) return c.get_status().with_context(origin);
  return c;
}

result<trainer_config> load_trainer_config(const std::string& path) {
  // Bounded, and only a regular file: /dev/zero, a FIFO or a folder is refused, not read forever.
  auto text = detail::read_file_bytes(path, max_trainer_config_bytes);
  if (!text.ok()) {
    const status& s = text.get_status();
    if (s.code() == status_code::not_found)
      return status::not_found(path + ": cannot open the configuration file (" + s.message() + ")");
    return status(s.code(), "the configuration file: " + s.message());
  }
  return trainer_config_from_text(std::string_view(text.value().data(), text.value().size()), path);
}

void to_json(json& j, const trainer_config& c) {
  json passes = json::array();
  for (const auto& p : c.passes)
    passes.push_back(p.dataset.empty() ? json{{"shards", p.shards}} : json{{"dataset", p.dataset}});
  json tables = json::array();
  for (const auto& t : c.tables) {
    json tj = {{"name", t.name},
               {"dim", t.dim},
               {"optimizer", optimizer_json(t.optimizer)},
               {"capacity", t.capacity_auto ? json("auto") : json(t.capacity)},
               {"slots", t.slots},
               {"max_resident", t.max_resident},
               {"init_scale", float_json(t.init_scale)}};
    store_fields_json(t, tj);
    admission_fields_json(t, tj);
    if (t.expiry.enabled()) {
      tj["expiry"] = {{"ttl_passes", t.expiry.ttl_passes}, {"min_l2_norm", t.expiry.min_l2_norm}};
      if (t.expiry.ttl_steps != 0) tj["expiry"]["ttl_steps"] = t.expiry.ttl_steps;
    }
    tables.push_back(std::move(tj));
  }
  j = json{{"mode", to_string(c.mode)},
           {"passes", passes},
           {"tables", tables},
           {"model",
            {{"hidden", c.model.hidden},
             {"dropout", float_json(c.model.dropout)},
             {"seed", c.model.seed},
             {"learning_rate", float_json(c.model.adam.learning_rate)},
             {"beta1", float_json(c.model.adam.beta1)},
             {"beta2", float_json(c.model.adam.beta2)},
             {"epsilon", float_json(c.model.adam.epsilon)}}},
           {"seed", c.seed},
           {"world", c.world == 0 ? json("auto") : json(c.world)}};
  for (const auto& f : text_fields) j[f.name] = c.*f.member;
  for (const auto& f : device_fields) j[f.name] = to_string(c.*f.member);
  for (const auto& f : flag_fields) j[f.name] = c.*f.member;
  if (c.move_staged_rows) j["move_staged_rows"] = *c.move_staged_rows;
  for (const auto& f : count_fields) j[f.name] = c.*f.member;
  for (const auto& f : thread_fields) j[f.name] = c.*f.member;
  memory_fields_json(c, j);
}

}  // namespace embcache
