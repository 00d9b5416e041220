/// @file json.hpp
/// @brief JSON forms of the training cache's counters (nlohmann::json's to_json), kept out of the
/// core headers so that a user of the cache does not need nlohmann-json to compile against it.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "embcache/training_cache.hpp"

namespace embcache {

/// JSON of counters: {"hits": ..., ...}, one field per member of table_counters; the policies'
/// counters only when on: keys_admitted and keys_refused when one of them is not 0 (admission),
/// rows_expired when not 0 (expiry), so that they change nothing else.
void to_json(nlohmann::json& j, const table_counters& c);
/// JSON of all counters: {"passes": n, "tables": {"name": {"last": {...}, "total": {...}}}}.
void to_json(nlohmann::json& j, const cache_counters& c);

}  // namespace embcache
