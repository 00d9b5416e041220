// The configuration's admission fields (`tables[i].admission`, trainer_config_admission.cpp):
// what trainer_config.cpp calls to read, check and write them. Not a public header.
#pragma once

#include <string>

#include "config_reader.hpp"
#include "embcache/status.hpp"

namespace embcache {
struct trainer_config;
struct trainer_table_config;
}  // namespace embcache

namespace embcache::detail {

/// Reads a table's "admission" object ({"min_count", "probability", "sketch_width",
/// "sketch_depth", "seed", "default_row": "zeros" | "slot"}, each optional); `at` is the table's
/// path ("config.tables[1]").
void read_admission_fields(object_reader& r, const std::string& at, trainer_table_config& tc,
                           status* err);
/// Checks their ranges (every mode, sharded runs included, has admission).
[[nodiscard]] status validate_admission_fields(const trainer_table_config& tc,
                                               const std::string& at);
/// Writes them into the table's JSON object when any differs from the default.
void admission_fields_json(const trainer_table_config& tc, json& j);

}  // namespace embcache::detail
