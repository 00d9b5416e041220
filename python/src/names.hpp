// The Python spellings of the library's enumerations: the C++ enumerator names as strings.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "embcache/cache_options.hpp"
#include "embcache/keyset.hpp"
#include "embcache/optimizers.hpp"
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

const char* to_string(init_kind k) noexcept;
const char* to_string(score_policy p) noexcept;
const char* to_string(cache_mode m) noexcept;

/// optimizer_options from a dict of its fields ({"kind": "adam", "learning_rate": 0.01, ...});
/// a key that is not a field is ValueError naming it.
optimizer_options optimizer_options_of(const py::dict& d);
/// The fields of `o` as a dict.
py::dict to_dict(const optimizer_options& o);

/// cache_options from the keyword arguments shared by EmbeddingCache and CudaEmbeddingCache;
/// an unknown `init` or `scores` name is ValueError naming the argument.
cache_options cache_options_of(std::size_t capacity, std::size_t dim, std::size_t state_width,
                               const std::string& init, float init_scale, std::uint64_t seed,
                               float state_value, const std::string& scores);

}  // namespace embcache::python
