// Reading the trainer's configuration from JSON: ranges, messages that name the field, and a
// reader of one object that refuses unknown fields. Shared by the files of the configuration
// (trainer_config.cpp, trainer_config_store.cpp); not a public header.
#pragma once

#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "embcache/status.hpp"

namespace embcache::detail {

using json = nlohmann::json;

/// A float as the JSON number with the fewest digits that reads back as the same float: 0.9f is
/// written 0.9, not 0.8999999761581421 (its exact double), and reading it back gives the same bits.
inline json float_json(float v) {
  if (!std::isfinite(v)) return json(v);  // the readers refuse these; written as nlohmann does
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return json(std::strtod(std::string(buf, r.ptr).c_str(), nullptr));
}

// The numeric limits of the configuration (docs/trainer.md lists them).
inline constexpr std::uint64_t max_rows = std::uint64_t{1} << 40;  // capacity, slots, max_resident
inline constexpr std::uint64_t max_count = std::uint64_t{1}
                                           << 50;  // eval_max_samples, log_interval
inline constexpr std::uint64_t max_batch = std::uint64_t{1} << 20;  // batch_size
inline constexpr std::uint64_t max_dim = 4096;                      // tables[i].dim
inline constexpr std::uint64_t max_width = std::uint64_t{1} << 16;  // model.hidden[i]
inline constexpr std::size_t max_layers = 32;                       // model.hidden's length
inline constexpr std::uint64_t max_threads = 4096;                  // threads, blas_threads
inline constexpr std::uint64_t max_world = std::uint64_t{1}
                                           << 20;  // world (as sharded saves allow)
inline constexpr std::uint64_t max_blocks = std::uint64_t{1} << 16;                  // num_blocks
inline constexpr std::uint64_t max_ttl_passes = 0xffffffffu;  // tables[i].expiry.ttl_passes
inline constexpr std::uint64_t max_u64 = std::numeric_limits<std::uint64_t>::max();  // seeds

// An inclusive integer range.
struct int_range {
  std::int64_t lo;
  std::uint64_t hi;
  std::string text() const {
    return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  }
  bool contains_unsigned(std::uint64_t v) const {
    return (lo <= 0 || v >= std::uint64_t(lo)) && v <= hi;
  }
};

// A range of finite numbers; an infinite bound means none on that side.
struct real_range {
  double lo, hi;
  bool lo_open, hi_open;
  bool contains(double v) const {
    if (!std::isfinite(v) || v < -double(FLT_MAX) || v > double(FLT_MAX)) return false;
    if (lo_open ? !(v > lo) : !(v >= lo)) return false;
    return hi_open ? v < hi : v <= hi;
  }
  std::string text() const {
    auto num = [](double v) {
      std::ostringstream ss;
      ss << v;
      return ss.str();
    };
    if (std::isinf(hi)) return "a finite number " + std::string(lo_open ? "> " : ">= ") + num(lo);
    if (std::isinf(lo)) return "a finite number " + std::string(hi_open ? "< " : "<= ") + num(hi);
    return "a number in " + std::string(lo_open ? "(" : "[") + num(lo) + ", " + num(hi) +
           (hi_open ? ")" : "]");
  }
};

inline constexpr double inf = std::numeric_limits<double>::infinity();
inline const real_range positive{0, inf, true, false};       // learning rates, epsilons, ftrl_alpha
inline const real_range non_negative{0, inf, false, false};  // accumulators, l1, l2, ftrl_beta
inline const real_range non_positive{-inf, 0, false, false};  // ftrl_lr_power
inline const real_range unit{0, 1, false, true};              // betas, dropout: [0, 1)
inline const real_range scale_range{0, 1000, false, false};   // init_scale

// "config.batch_size: expected an integer in [1, 1048576], got -1".
inline status range_error(const std::string& where, const std::string& expected,
                          const std::string& got) {
  return status::invalid_argument(where + ": expected " + expected + ", got " + got);
}

// A value for a message: scalars as JSON, arrays and objects by their type (no recursion into
// them, however deep they nest).
inline std::string shown(const json& v) {
  if (v.is_structured()) return std::string("an ") + v.type_name();
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

inline std::string shown(double v) {
  std::ostringstream ss;
  ss << v;
  return ss.str();
}

inline status check_int(const std::string& where, std::uint64_t v, const int_range& r) {
  return r.contains_unsigned(v) ? status{} : range_error(where, r.text(), std::to_string(v));
}

inline status check_real(const std::string& where, double v, const real_range& r) {
  return r.contains(v) ? status{} : range_error(where, r.text(), shown(v));
}

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
  // An integer field: a JSON integer (not 12.5, not 1e3) within `range`.
  template <class T>
  void get_int(const char* name, T& out, const int_range& range) {
    seen_.insert(name);
    if (!error_->ok() || !j_.is_object() || !j_.contains(name)) return;
    read_int(j_.at(name), path(name), out, range, error_);
  }
  // A real field: a JSON number within `range` (finite, and finite as a float).
  template <class T>
  void get_real(const char* name, T& out, const real_range& range) {
    seen_.insert(name);
    if (!error_->ok() || !j_.is_object() || !j_.contains(name)) return;
    const json& v = j_.at(name);
    if (!v.is_number() || !range.contains(v.get<double>())) {
      *error_ = range_error(path(name), range.text(), shown(v));
      return;
    }
    out = T(v.get<double>());
  }
  template <class T>
  static void read_int(const json& v, const std::string& where, T& out, const int_range& range,
                       status* error) {
    bool ok = v.is_number_integer();
    if (ok && v.is_number_unsigned()) {
      ok = range.contains_unsigned(v.get<std::uint64_t>());
    } else if (ok) {
      const std::int64_t x = v.get<std::int64_t>();
      ok = x >= range.lo && (x < 0 || range.contains_unsigned(std::uint64_t(x)));
    }
    if (!ok) {
      *error = range_error(where, range.text(), shown(v));
      return;
    }
    out = v.get<T>();
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

}  // namespace embcache::detail
