// Host-space instantiations of the training cache, and its counters (their JSON form is declared
// in embcache/json.hpp).
#include <nlohmann/json.hpp>
#include <utility>

#include "embcache/json.hpp"
#include "training/training_cache_definitions.hpp"

namespace embcache {

namespace {
// The counters' fields, once: operator+= and to_json walk these lists.
constexpr std::pair<const char*, std::uint64_t table_counters::*> count_fields[] = {
    {"hits", &table_counters::hits},
    {"misses", &table_counters::misses},
    {"rows_pulled", &table_counters::rows_pulled},
    {"rows_staged", &table_counters::rows_staged},
    {"rows_restaged", &table_counters::rows_restaged},
    {"rows_initialized", &table_counters::rows_initialized},
    {"rows_pushed", &table_counters::rows_pushed},
    {"rows_evicted", &table_counters::rows_evicted},
    {"bytes_store_to_cache", &table_counters::bytes_store_to_cache},
    {"bytes_cache_to_store", &table_counters::bytes_cache_to_store}};
constexpr std::pair<const char*, double table_counters::*> seconds_fields[] = {
    {"seconds_swap_in", &table_counters::seconds_swap_in},
    {"seconds_write_back", &table_counters::seconds_write_back},
    {"seconds_prefetch_wait", &table_counters::seconds_prefetch_wait},
    {"seconds_staging", &table_counters::seconds_staging},
    {"seconds_write_behind", &table_counters::seconds_write_behind}};
// Counters of the per-table policies, in the JSON only when on, so that a table with its
// policies off writes the same JSON as before they existed: admission's two when one of them is
// not 0, expiry's when not 0.
constexpr std::pair<const char*, std::uint64_t table_counters::*> admission_fields[] = {
    {"keys_admitted", &table_counters::keys_admitted},
    {"keys_refused", &table_counters::keys_refused}};
constexpr std::pair<const char*, std::uint64_t table_counters::*> expiry_fields[] = {
    {"rows_expired", &table_counters::rows_expired}};
// move_staged_rows's, in the JSON only when not 0.
constexpr std::pair<const char*, std::uint64_t table_counters::*> moved_fields[] = {
    {"rows_moved", &table_counters::rows_moved}, {"rows_detached", &table_counters::rows_detached}};
}  // namespace

table_counters& table_counters::operator+=(const table_counters& o) {
  for (const auto& [name, field] : count_fields) this->*field += o.*field;
  for (const auto& [name, field] : seconds_fields) this->*field += o.*field;
  for (const auto& [name, field] : admission_fields) this->*field += o.*field;
  for (const auto& [name, field] : expiry_fields) this->*field += o.*field;
  for (const auto& [name, field] : moved_fields) this->*field += o.*field;
  return *this;
}

void to_json(nlohmann::json& j, const table_counters& c) {
  j = nlohmann::json::object();
  for (const auto& [name, field] : count_fields) j[name] = c.*field;
  for (const auto& [name, field] : seconds_fields) j[name] = c.*field;
  if (c.keys_admitted != 0 || c.keys_refused != 0)
    for (const auto& [name, field] : admission_fields) j[name] = c.*field;
  for (const auto& [name, field] : expiry_fields) {
    if (c.*field != 0) j[name] = c.*field;
  }
  for (const auto& [name, field] : moved_fields) {
    if (c.*field != 0) j[name] = c.*field;
  }
}

void to_json(nlohmann::json& j, const cache_counters& c) {
  nlohmann::json tables = nlohmann::json::object();
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    tables[c.tables[t]] = {{"last", c.last[t]}, {"total", c.total[t]}};
  }
  j = nlohmann::json{{"passes", c.passes}, {"tables", tables}};
}

template class training_cache<std::int64_t, host_space>;
template class training_cache<std::uint32_t, host_space>;

}  // namespace embcache
