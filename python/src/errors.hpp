// Statuses as Python exceptions: one class per status code under embcache.Error, each message the
// C++ message (which names the field, the file or the key).
#pragma once

#include <pybind11/pybind11.h>

#include "embcache/status.hpp"

namespace embcache::python {

namespace py = pybind11;

/// A failed status on its way to Python (translated by the handler that bind_errors registers).
class status_error : public std::exception {
 public:
  explicit status_error(status s) : status_(std::move(s)) {}
  const char* what() const noexcept override { return status_.message().c_str(); }
  const status& get() const noexcept { return status_; }

 private:
  status status_;
};

/// Throws status_error when `s` is not ok.
inline void check(const status& s) {
  if (!s.ok()) throw status_error(s);
}

/// The value of `r`, or status_error.
template <class T>
T take(result<T>&& r) {
  if (!r.ok()) throw status_error(r.get_status());
  return std::move(r).value();
}

/// Creates embcache.Error and its subclasses in `m` and registers the translation of status_error
/// and embcache::error.
void bind_errors(py::module_& m);

}  // namespace embcache::python
