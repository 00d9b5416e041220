// Host-space instantiations of the training cache, and its counters (their JSON form is declared
// in embcache/json.hpp).
#include <nlohmann/json.hpp>

#include "embcache/json.hpp"
#include "training/training_cache_definitions.hpp"

namespace embcache {

table_counters& table_counters::operator+=(const table_counters& o) {
  hits += o.hits;
  misses += o.misses;
  rows_pulled += o.rows_pulled;
  rows_staged += o.rows_staged;
  rows_restaged += o.rows_restaged;
  rows_initialized += o.rows_initialized;
  rows_pushed += o.rows_pushed;
  rows_evicted += o.rows_evicted;
  bytes_store_to_cache += o.bytes_store_to_cache;
  bytes_cache_to_store += o.bytes_cache_to_store;
  seconds_swap_in += o.seconds_swap_in;
  seconds_write_back += o.seconds_write_back;
  seconds_prefetch_wait += o.seconds_prefetch_wait;
  seconds_staging += o.seconds_staging;
  seconds_write_behind += o.seconds_write_behind;
  return *this;
}

void to_json(nlohmann::json& j, const table_counters& c) {
  j = nlohmann::json{{"hits", c.hits},
                     {"misses", c.misses},
                     {"rows_pulled", c.rows_pulled},
                     {"rows_staged", c.rows_staged},
                     {"rows_restaged", c.rows_restaged},
                     {"rows_initialized", c.rows_initialized},
                     {"rows_pushed", c.rows_pushed},
                     {"rows_evicted", c.rows_evicted},
                     {"bytes_store_to_cache", c.bytes_store_to_cache},
                     {"bytes_cache_to_store", c.bytes_cache_to_store},
                     {"seconds_swap_in", c.seconds_swap_in},
                     {"seconds_write_back", c.seconds_write_back},
                     {"seconds_prefetch_wait", c.seconds_prefetch_wait},
                     {"seconds_staging", c.seconds_staging},
                     {"seconds_write_behind", c.seconds_write_behind}};
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
