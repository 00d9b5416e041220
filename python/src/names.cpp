#include "names.hpp"

#include <utility>

namespace embcache::python {

void bad_choice(const char* what, const char* choices, const std::string& got) {
  throw py::value_error(std::string(what) + ": expected one of " + choices + ", got '" + got + "'");
}

init_kind init_kind_of(const std::string& s) {
  if (s == "uniform") return init_kind::uniform;
  if (s == "normal") return init_kind::normal;
  if (s == "constant") return init_kind::constant;
  bad_choice("init", "'uniform', 'normal', 'constant'", s);
}

score_policy score_policy_of(const std::string& s) {
  if (s == "lru") return score_policy::lru;
  if (s == "lfu") return score_policy::lfu;
  bad_choice("scores", "'lru', 'lfu'", s);
}

combiner combiner_of(const std::string& s) {
  if (s == "sum") return combiner::sum;
  if (s == "mean") return combiner::mean;
  bad_choice("mode", "'sum', 'mean'", s);
}

cache_mode cache_mode_of(const std::string& s) {
  if (s == "keyset") return cache_mode::keyset;
  if (s == "on_demand") return cache_mode::on_demand;
  bad_choice("mode", "'keyset', 'on_demand'", s);
}

keyset_format keyset_format_of(const std::string& s) {
  if (s == "embcache") return keyset_format::embcache;
  if (s == "hugectr_raw") return keyset_format::hugectr_raw;
  bad_choice("keyset_format", "'embcache', 'hugectr_raw'", s);
}

optimizer_kind optimizer_kind_of(const std::string& s) {
  optimizer_kind k{};
  if (!optimizer_kind_from_string(s, &k))
    bad_choice("optimizer.kind", "'sgd', 'adagrad', 'adam', 'ftrl'", s);
  return k;
}

existing_rows_policy existing_rows_policy_of(const std::string& s) {
  if (s == "refuse") return existing_rows_policy::refuse;
  if (s == "reuse") return existing_rows_policy::reuse;
  bad_choice("existing_rows", "'refuse', 'reuse'", s);
}

rocksdb_read_path rocksdb_read_path_of(const std::string& s) {
  if (s == "automatic") return rocksdb_read_path::automatic;
  if (s == "multi_get") return rocksdb_read_path::multi_get;
  if (s == "scan") return rocksdb_read_path::scan;
  bad_choice("read_path", "'automatic', 'multi_get', 'scan'", s);
}

const char* to_string(init_kind k) noexcept {
  switch (k) {
    case init_kind::uniform:
      return "uniform";
    case init_kind::normal:
      return "normal";
    case init_kind::constant:
      return "constant";
  }
  return "unknown";
}

const char* to_string(score_policy p) noexcept { return p == score_policy::lfu ? "lfu" : "lru"; }

const char* to_string(cache_mode m) noexcept {
  return m == cache_mode::on_demand ? "on_demand" : "keyset";
}

namespace {

// The float fields of optimizer_options, by name.
const std::pair<const char*, float optimizer_options::*> float_fields[] = {
    {"learning_rate", &optimizer_options::learning_rate},
    {"beta1", &optimizer_options::beta1},
    {"beta2", &optimizer_options::beta2},
    {"epsilon", &optimizer_options::epsilon},
    {"adagrad_initial_accumulator", &optimizer_options::adagrad_initial_accumulator},
    {"ftrl_alpha", &optimizer_options::ftrl_alpha},
    {"ftrl_beta", &optimizer_options::ftrl_beta},
    {"ftrl_l1", &optimizer_options::ftrl_l1},
    {"ftrl_l2", &optimizer_options::ftrl_l2},
    {"ftrl_lr_power", &optimizer_options::ftrl_lr_power},
    {"ftrl_initial_accumulator", &optimizer_options::ftrl_initial_accumulator},
};

}  // namespace

optimizer_options optimizer_options_of(const py::dict& d) {
  optimizer_options o;
  for (const auto& item : d) {
    const std::string key = py::str(item.first);
    if (key == "kind") {
      o.kind = optimizer_kind_of(py::str(item.second));
      continue;
    }
    bool known = false;
    for (const auto& [name, field] : float_fields) {
      if (key == name) {
        try {
          o.*field = item.second.cast<float>();
        } catch (const py::cast_error&) {
          throw py::type_error("optimizer." + key + ": expected a number");
        }
        known = true;
      }
    }
    if (!known) throw py::value_error("optimizer: unknown field '" + key + "'");
  }
  return o;
}

py::dict to_dict(const optimizer_options& o) {
  py::dict d;
  d["kind"] = embcache::to_string(o.kind);
  for (const auto& [name, field] : float_fields) d[name] = o.*field;
  return d;
}

cache_options cache_options_of(std::size_t slots, std::size_t dim, std::size_t state_width,
                               const std::string& init, float init_scale, std::uint64_t seed,
                               float state_value, const std::string& scores) {
  cache_options o;
  o.slots = slots;
  o.dim = dim;
  o.state_width = state_width;
  o.init.kind = init_kind_of(init);
  o.init.scale = init_scale;
  o.init.seed = seed;
  o.init.state_value = state_value;
  o.scores = score_policy_of(scores);
  return o;
}

namespace {

// One field of a policy dict: `item`'s value as T, TypeError naming `what`.`key` otherwise.
template <class T>
T field_value(const py::handle& value, const char* what, const std::string& key,
              const char* expected) {
  // A bool is an int in Python: refused, so that {"min_count": True} is not 1.
  if (py::isinstance<py::bool_>(value))
    throw py::type_error(std::string(what) + "." + key + ": expected " + expected);
  try {
    return value.cast<T>();
  } catch (const py::cast_error&) {
    throw py::type_error(std::string(what) + "." + key + ": expected " + expected);
  }
}

py::dict dict_of(const py::object& d, const char* what) {
  if (d.is_none()) return py::dict();
  if (!py::isinstance<py::dict>(d))
    throw py::type_error(std::string(what) + ": expected a dict or None");
  return d.cast<py::dict>();
}

}  // namespace

admission_options admission_options_of(const py::object& obj) {
  admission_options o;
  for (const auto& item : dict_of(obj, "admission")) {
    const std::string key = py::str(item.first);
    if (key == "min_count") {
      o.min_count = field_value<std::uint32_t>(item.second, "admission", key, "an int >= 0");
    } else if (key == "probability") {
      o.probability = field_value<double>(item.second, "admission", key, "a number");
    } else if (key == "sketch_width") {
      o.sketch_width = field_value<std::uint64_t>(item.second, "admission", key, "an int >= 1");
    } else if (key == "sketch_depth") {
      o.sketch_depth = field_value<std::uint32_t>(item.second, "admission", key, "an int >= 1");
    } else if (key == "seed") {
      o.seed = field_value<std::uint64_t>(item.second, "admission", key, "an int >= 0");
    } else if (key == "default_row") {
      const auto v = field_value<std::string>(item.second, "admission", key, "'zeros' or 'slot'");
      if (v == "zeros") {
        o.default_row = refused_row::zeros;
      } else if (v == "slot") {
        o.default_row = refused_row::slot;
      } else {
        throw py::value_error("admission.default_row: expected 'zeros' or 'slot', got '" + v + "'");
      }
    } else {
      throw py::value_error(
          "admission: unknown field '" + key +
          "' (min_count, probability, sketch_width, sketch_depth, seed, default_row)");
    }
  }
  return o;
}

expiry_options expiry_options_of(const py::object& obj) {
  expiry_options o;
  for (const auto& item : dict_of(obj, "expiry")) {
    const std::string key = py::str(item.first);
    if (key == "ttl_passes") {
      o.ttl_passes = field_value<std::uint32_t>(item.second, "expiry", key, "an int >= 0");
    } else if (key == "ttl_steps") {
      o.ttl_steps = field_value<std::uint64_t>(item.second, "expiry", key, "an int >= 0");
    } else if (key == "min_l2_norm") {
      o.min_l2_norm = field_value<float>(item.second, "expiry", key, "a number");
    } else {
      throw py::value_error("expiry: unknown field '" + key +
                            "' (ttl_passes, ttl_steps, min_l2_norm)");
    }
  }
  return o;
}

py::dict to_dict(const admission_options& o) {
  py::dict d;
  d["min_count"] = o.min_count;
  d["probability"] = o.probability;
  d["sketch_width"] = o.sketch_width;
  d["sketch_depth"] = o.sketch_depth;
  d["seed"] = o.seed;
  d["default_row"] = o.default_row == refused_row::slot ? "slot" : "zeros";
  return d;
}

py::dict to_dict(const expiry_options& o) {
  py::dict d;
  d["ttl_passes"] = o.ttl_passes;
  d["ttl_steps"] = o.ttl_steps;
  d["min_l2_norm"] = o.min_l2_norm;
  return d;
}

}  // namespace embcache::python
