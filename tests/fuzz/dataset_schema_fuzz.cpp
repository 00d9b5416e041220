// parse_dataset_schema on the bytes (embcache-prep --schema): a schema is either refused with
// invalid_argument naming the origin, or valid, within the limits, and reads back unchanged.
#include <set>
#include <string>
#include <string_view>

#include "embcache/dataset_schema.hpp"
#include "fuzz_target.hpp"

EMBCACHE_FUZZ_TARGET(dataset_schema) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = embcache::parse_dataset_schema(text, "'s.json'");
  if (!r.ok()) {
    EMBCACHE_FUZZ_CHECK(r.get_status().code() == embcache::status_code::invalid_argument);
    EMBCACHE_FUZZ_CHECK(r.get_status().message().rfind("'s.json': ", 0) == 0);
    return;
  }
  const embcache::dataset_schema& s = r.value();
  EMBCACHE_FUZZ_CHECK(embcache::validate(s).ok());
  EMBCACHE_FUZZ_CHECK(s.num_categorical() >= 1 &&
                      s.num_categorical() <= embcache::schema_max_categorical);
  EMBCACHE_FUZZ_CHECK(s.num_dense() <= embcache::schema_max_dense);
  EMBCACHE_FUZZ_CHECK(s.label_column < s.num_columns());
  // Every column has one name, and the label's column is the label.
  std::set<std::string> names;
  for (std::size_t c = 0; c < s.num_columns(); ++c) names.insert(s.column_name(c));
  EMBCACHE_FUZZ_CHECK(names.size() == s.num_columns());
  EMBCACHE_FUZZ_CHECK(s.column_name(s.label_column) == "label");
  auto back = embcache::parse_dataset_schema(embcache::dataset_schema_to_json(s), "again");
  EMBCACHE_FUZZ_CHECK(back.ok() && back.value() == s);
}
