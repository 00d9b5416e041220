// The schema's JSON form, shared by embcache-prep's schema file and the manifest's "schema".
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "embcache/dataset_schema.hpp"

namespace embcache::detail {

/// Reads a schema object `j`; errors are invalid_argument "<origin>: <field>.<member>: ...".
status schema_from_json(const nlohmann::json& j, const std::string& origin,
                        const std::string& field, dataset_schema& out);

/// The schema as a JSON object (label_column, dense, categorical).
nlohmann::ordered_json schema_to_json(const dataset_schema& schema);

}  // namespace embcache::detail
