// The Python spellings of the library's enumerations: the C++ enumerator names as strings.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "embcache/admission.hpp"
#include "embcache/cache_options.hpp"
#include "embcache/expiry.hpp"
#include "embcache/keyset.hpp"
#include "embcache/optimizers.hpp"
#include "embcache/rocksdb_store.hpp"
#include "embcache/sparse_ops.hpp"
#include "embcache/training_cache.hpp"

namespace embcache::python {

namespace py = pybind11;

/// ValueError "`what`: expected one of `choices`, got '`got`'".
[[noreturn]] void bad_choice(const char* what, const char* choices, const std::string& got);

init_kind init_kind_of(const std::string& s);
score_policy score_policy_of(const std::string& s);
combiner combiner_of(const std::string& s);
cache_mode cache_mode_of(const std::string& s);
keyset_format keyset_format_of(const std::string& s);
optimizer_kind optimizer_kind_of(const std::string& s);
existing_rows_policy existing_rows_policy_of(const std::string& s);
rocksdb_read_path rocksdb_read_path_of(const std::string& s);

const char* to_string(init_kind k) noexcept;
const char* to_string(score_policy p) noexcept;
const char* to_string(cache_mode m) noexcept;

/// optimizer_options from a dict of its fields ({"kind": "adam", "learning_rate": 0.01, ...});
/// a key that is not a field is ValueError naming it.
optimizer_options optimizer_options_of(const py::dict& d);
/// The fields of `o` as a dict.
py::dict to_dict(const optimizer_options& o);

/// admission_options from a dict of its fields ({"min_count": 2, "probability": 0.1,
/// "sketch_width": ..., "sketch_depth": ..., "seed": ...}); None or {} is off. An unknown key is
/// ValueError naming it, a value of the wrong type TypeError; the ranges are checked by the
/// training cache (InvalidArgumentError naming the field).
admission_options admission_options_of(const py::object& d);
/// expiry_options from a dict of its fields ({"ttl_passes": 7, "min_l2_norm": 0.0}); None or {}
/// is off. Unknown keys and wrong types as for admission_options_of.
expiry_options expiry_options_of(const py::object& d);
/// The fields of `o` as a dict.
py::dict to_dict(const admission_options& o);
/// The fields of `o` as a dict.
py::dict to_dict(const expiry_options& o);

/// cache_options from the keyword arguments shared by EmbeddingCache and CudaEmbeddingCache;
/// an unknown `init` or `scores` name is ValueError naming the argument.
cache_options cache_options_of(std::size_t slots, std::size_t dim, std::size_t state_width,
                               const std::string& init, float init_scale, std::uint64_t seed,
                               float state_value, const std::string& scores);

}  // namespace embcache::python
