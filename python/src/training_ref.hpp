// A training cache as Python holds it: the cache and a lock that keeps calls from several Python
// threads from overlapping (training_cache.hpp: one caller thread drives the cache).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "embcache/training_cache.hpp"

namespace embcache::python {

namespace py = pybind11;

/// TrainingCache (int64 keys) and TrainingCacheU32 (uint32 keys).
template <class Key>
struct training_ref_of {
  using cache_type = training_cache<Key>;
  std::unique_ptr<cache_type> cache;
  std::unique_ptr<std::mutex> calls = std::make_unique<std::mutex>();

  /// The index of table `t`: an int in [0, num_tables) or a table name (IndexError / KeyError).
  std::size_t index_of(py::handle t) const {
    if (py::isinstance<py::str>(t)) {
      auto r = cache->table_index(t.cast<std::string>());
      if (!r.ok()) throw py::key_error(r.get_status().message());
      return r.value();
    }
    if (!py::isinstance<py::int_>(t))
      throw py::type_error("t: expected a table index (int) or name (str), got " +
                           std::string(Py_TYPE(t.ptr())->tp_name));
    const auto i = t.cast<std::int64_t>();
    if (i < 0 || std::size_t(i) >= cache->num_tables())
      throw py::index_error("table index " + std::to_string(i) + " out of range (" +
                            std::to_string(cache->num_tables()) + " tables)");
    return std::size_t(i);
  }
};
using training_ref = training_ref_of<std::int64_t>;

/// Releases the GIL, then holds the cache's lock, for one call.
class training_call {
 public:
  template <class Key>
  explicit training_call(const training_ref_of<Key>& r) : lock_(*r.calls) {}

 private:
  py::gil_scoped_release nogil_;
  std::lock_guard<std::mutex> lock_;
};

}  // namespace embcache::python
