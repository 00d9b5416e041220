// A training cache as Python holds it: the cache and a lock that keeps calls from several Python
// threads from overlapping (training_cache.hpp: one caller thread drives the cache).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <mutex>

#include "embcache/training_cache.hpp"

namespace embcache::python {

namespace py = pybind11;

struct training_ref {
  using cache_type = training_cache<std::int64_t>;
  std::unique_ptr<cache_type> cache;
  std::unique_ptr<std::mutex> calls = std::make_unique<std::mutex>();

  /// The index of table `t`: an int in [0, num_tables) or a table name (IndexError / KeyError).
  std::size_t index_of(py::handle t) const;
};

/// Releases the GIL, then holds the cache's lock, for one call.
class training_call {
 public:
  explicit training_call(const training_ref& r) : lock_(*r.calls) {}

 private:
  py::gil_scoped_release nogil_;
  std::lock_guard<std::mutex> lock_;
};

}  // namespace embcache::python
