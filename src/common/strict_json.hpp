// JSON parsing for the files a user writes or a tool reads back (configurations, manifests):
// nlohmann::json keeps the last of two equal keys of an object without a word, so a mistyped
// configuration ("dim" given twice) would train with a value its author did not mean.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "embcache/status.hpp"

namespace embcache::detail {

/// Parses `text` as JSON, refusing an object that holds a key twice. Errors are
/// invalid_argument: "<origin>: not valid JSON: <parser's message>" or "<origin>: duplicate key
/// \"k\" in <root>.a[2].b (JSON keys must be unique)", the place written from `root` (say
/// "config") as the trainer configuration's field paths are.
result<nlohmann::json> parse_json_unique_keys(std::string_view text, const std::string& origin,
                                              const std::string& root);

}  // namespace embcache::detail
