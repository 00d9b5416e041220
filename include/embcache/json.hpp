/// @file json.hpp
/// @brief JSON forms of the training cache's counters (nlohmann::json's to_json), kept out of the
/// core headers so that a user of the cache does not need nlohmann-json to compile against it.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "embcache/training_cache.hpp"

namespace embcache {

/// JSON of counters: {"hits": ..., ...}, one field per member of table_counters; keys_admitted and
/// keys_refused only when one of them is not 0 (admission on), so that they change nothing else.
void to_json(nlohmann::json& j, const table_counters& c);
/// JSON of all counters: {"passes": n, "tables": {"name": {"last": {...}, "total": {...}}}}.
void to_json(nlohmann::json& j, const cache_counters& c);

}  // namespace embcache
