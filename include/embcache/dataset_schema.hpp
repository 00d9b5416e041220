/// @file dataset_schema.hpp
/// @brief The shape of a click log: which column is the label, how many dense (integer) and
/// categorical fields follow, and their names. Criteo's (label, I1..I13, C1..C26) is the default.
///
/// A TSV row of a schema has 1 + dense + categorical tab-separated columns: the label at
/// `label_column`, and in the other columns, in order, the dense fields and then the categorical
/// fields. `embcache-prep` parses rows of the schema it is given, writes it into the dataset's
/// manifest.json (field "schema"), and the shards record its counts in their headers; the trainer
/// sizes its Wide&Deep model from it. A manifest without a schema is Criteo's.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "embcache/status.hpp"

namespace embcache {

/// Most dense fields a schema may have.
inline constexpr std::size_t schema_max_dense = 1024;
/// Most categorical fields a schema may have: a key's tag (bits 56..61, criteo.hpp) is 1 + the
/// field's index, so 63 fields use every tag.
inline constexpr std::size_t schema_max_categorical = 63;
/// Longest name of a field, in bytes.
inline constexpr std::size_t schema_max_name_bytes = 64;

/// Criteo's dense field names, I1..I13.
std::vector<std::string> criteo_dense_names();
/// Criteo's categorical field names, C1..C26.
std::vector<std::string> criteo_categorical_names();

/// The columns of a click log. The default is Criteo's.
struct dataset_schema {
  std::size_t label_column = 0;  ///< 0-based column of the label (0 or 1); default 0
  /// Names of the dense (integer) fields in column order; default I1..I13.
  std::vector<std::string> dense = criteo_dense_names();
  /// Names of the categorical fields in column order; default C1..C26.
  std::vector<std::string> categorical = criteo_categorical_names();

  /// Dense fields per row.
  std::size_t num_dense() const noexcept { return dense.size(); }
  /// Categorical fields (slots) per row.
  std::size_t num_categorical() const noexcept { return categorical.size(); }
  /// Columns of a TSV row: the label, the dense and the categorical fields.
  std::size_t num_columns() const noexcept { return 1 + dense.size() + categorical.size(); }
  /// Whether this is Criteo's schema (label first, I1..I13, C1..C26).
  bool is_criteo() const;
  /// The column of dense field `j`.
  std::size_t dense_column(std::size_t j) const noexcept {
    return j + 1 > label_column ? j + 1 : j;
  }
  /// The column of categorical field `j`.
  std::size_t categorical_column(std::size_t j) const noexcept {
    return dense_column(dense.size() + j);
  }
  /// The name of column `c` ("label" for the label column).
  const std::string& column_name(std::size_t c) const;

  /// Same label column and the same names in the same order.
  bool operator==(const dataset_schema& o) const {
    return label_column == o.label_column && dense == o.dense && categorical == o.categorical;
  }
  /// Not operator==.
  bool operator!=(const dataset_schema& o) const { return !(*this == o); }
};

/// Checks a schema; the error (invalid_argument) names `where` and the field: categorical fields
/// in [1, 63], dense fields in [0, 1024], label_column below the column count, names of 1 to 64
/// bytes of letters, digits, '_', '-' and '.', no name twice (nor "label").
[[nodiscard]] status validate(const dataset_schema& schema, const std::string& where = "schema");

/// The schema as a JSON object: {"label_column": 0, "dense": [...], "categorical": [...]}.
std::string dataset_schema_to_json(const dataset_schema& schema);

/// Parses a schema from JSON text (the object above; a missing "label_column" is 0, keys given
/// twice or unknown are refused) and validates it. Errors are invalid_argument naming `origin`
/// and the field, e.g. "'s.json': schema.categorical: expected 1 to 63 names, got 0".
result<dataset_schema> parse_dataset_schema(std::string_view json, const std::string& origin);

}  // namespace embcache
