// dataset_schema: Criteo's default, validation, and the JSON form.
#include "embcache/dataset_schema.hpp"

#include <set>

#include "common/strict_json.hpp"
#include "schema_json.hpp"

namespace embcache {

namespace {

std::vector<std::string> numbered(char prefix, std::size_t n) {
  std::vector<std::string> v;
  for (std::size_t i = 1; i <= n; ++i) v.push_back(prefix + std::to_string(i));
  return v;
}

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

std::string shown(const std::string& s) {
  std::string t;
  for (char c : s.substr(0, 24)) t += (c >= 32 && c < 127) ? c : '?';
  return "'" + t + (s.size() > 24 ? "...'" : "'");
}

status check_names(const std::vector<std::string>& names, const std::string& at,
                   std::set<std::string>& seen) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    const std::string here = at + "[" + std::to_string(i) + "]";
    if (n.empty() || n.size() > schema_max_name_bytes) {
      return status::invalid_argument(here + ": expected a name of 1 to " +
                                      std::to_string(schema_max_name_bytes) + " bytes, got " +
                                      std::to_string(n.size()));
    }
    for (char c : n) {
      if (!name_char(c)) {
        return status::invalid_argument(here + ": " + shown(n) +
                                        " holds a character other than letters, digits, '_', "
                                        "'-' and '.'");
      }
    }
    if (!seen.insert(n).second) {
      return status::invalid_argument(here + ": name " + shown(n) + " is used twice");
    }
  }
  return {};
}

}  // namespace

std::vector<std::string> criteo_dense_names() { return numbered('I', 13); }
std::vector<std::string> criteo_categorical_names() { return numbered('C', 26); }

bool dataset_schema::is_criteo() const { return *this == dataset_schema{}; }

const std::string& dataset_schema::column_name(std::size_t c) const {
  static const std::string label = "label";
  if (c == label_column) return label;
  const std::size_t j = c > label_column ? c - 1 : c;
  return j < dense.size() ? dense[j] : categorical[j - dense.size()];
}

status validate(const dataset_schema& s, const std::string& where) {
  if (s.categorical.empty() || s.categorical.size() > schema_max_categorical) {
    return status::invalid_argument(where + ".categorical: expected 1 to " +
                                    std::to_string(schema_max_categorical) + " names, got " +
                                    std::to_string(s.categorical.size()));
  }
  if (s.dense.size() > schema_max_dense) {
    return status::invalid_argument(where + ".dense: expected at most " +
                                    std::to_string(schema_max_dense) + " names, got " +
                                    std::to_string(s.dense.size()));
  }
  if (s.label_column >= s.num_columns()) {
    return status::invalid_argument(where + ".label_column: expected an integer in [0, " +
                                    std::to_string(s.num_columns() - 1) + "], got " +
                                    std::to_string(s.label_column));
  }
  std::set<std::string> seen{"label"};
  EMBCACHE_RETURN_IF_ERROR(check_names(s.dense, where + ".dense", seen));
  return check_names(s.categorical, where + ".categorical", seen);
}

std::string dataset_schema_to_json(const dataset_schema& schema) {
  return detail::schema_to_json(schema).dump(2) + "\n";
}

result<dataset_schema> parse_dataset_schema(std::string_view json, const std::string& origin) {
  auto parsed = detail::parse_json_unique_keys(json, origin, "schema");
  if (!parsed.ok()) return parsed.get_status();
  dataset_schema s;
  EMBCACHE_RETURN_IF_ERROR(detail::schema_from_json(parsed.value(), origin, "schema", s));
  return s;
}

namespace detail {

status schema_from_json(const nlohmann::json& j, const std::string& origin,
                        const std::string& field, dataset_schema& out) {
  const std::string at = origin + ": " + field;
  if (!j.is_object()) return status::invalid_argument(at + ": expected a JSON object");
  for (const auto& [k, v] : j.items()) {
    (void)v;
    if (k != "label_column" && k != "dense" && k != "categorical") {
      return status::invalid_argument(at + "." + k +
                                      ": unknown field (label_column, dense, categorical)");
    }
  }
  dataset_schema s;
  if (j.contains("label_column")) {
    const nlohmann::json& l = j.at("label_column");
    // Negative integers and fractions are other JSON number types: both refused.
    if (!l.is_number_unsigned() || l.get<std::uint64_t>() > schema_max_dense + 64) {
      return status::invalid_argument(at +
                                      ".label_column: expected a small non-negative "
                                      "integer, got " +
                                      l.dump().substr(0, 40));
    }
    s.label_column = static_cast<std::size_t>(l.get<std::uint64_t>());
  }
  const struct {
    const char* key;
    std::vector<std::string>* names;
    std::size_t most;
  } lists[] = {{"dense", &s.dense, schema_max_dense},
               {"categorical", &s.categorical, schema_max_categorical}};
  for (const auto& l : lists) {
    if (!j.contains(l.key)) return status::invalid_argument(at + "." + l.key + ": is missing");
    const nlohmann::json& a = j.at(l.key);
    if (!a.is_array()) {
      return status::invalid_argument(at + "." + l.key + ": expected an array of names, got " +
                                      a.dump().substr(0, 40));
    }
    // The size first: a huge array is refused before its strings are copied.
    if (a.size() > l.most) {
      return status::invalid_argument(at + "." + l.key + ": expected at most " +
                                      std::to_string(l.most) + " names, got " +
                                      std::to_string(a.size()));
    }
    l.names->clear();
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_string()) {
        return status::invalid_argument(at + "." + l.key + "[" + std::to_string(i) +
                                        "]: expected a string, got " + a[i].dump().substr(0, 40));
      }
      l.names->push_back(a[i].get<std::string>());
    }
  }
  EMBCACHE_RETURN_IF_ERROR(validate(s, at));
  out = std::move(s);
  return {};
}

nlohmann::ordered_json schema_to_json(const dataset_schema& schema) {
  nlohmann::ordered_json j;
  j["label_column"] = schema.label_column;
  j["dense"] = schema.dense;
  j["categorical"] = schema.categorical;
  return j;
}

}  // namespace detail

}  // namespace embcache
