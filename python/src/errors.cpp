#include "errors.hpp"

#include <array>
#include <cstring>
#include <string>

namespace embcache::python {

namespace {

constexpr std::size_t num_codes = std::size_t(status_code::out_of_host_memory) + 1;

// The Python class of each status code (index: the code); [0] is embcache.Error itself.
std::array<PyObject*, num_codes> error_classes{};

struct class_spec {
  status_code code;
  const char* name;
  PyObject* builtin;  // the built-in exception it also derives from (nullptr: none)
  const char* doc;
};

void raise(status_code code, const std::string& message) {
  PyObject* cls = error_classes[std::size_t(code) < num_codes ? std::size_t(code) : 0];
  if (cls == nullptr) cls = error_classes[0];
  PyErr_SetString(cls, message.c_str());
}

}  // namespace

void bind_errors(py::module_& m) {
  PyObject* base = PyErr_NewExceptionWithDoc(
      "embcache.Error",
      "Base of every failure the library reports. `code` names the C++ status code; the message "
      "is the C++ message.",
      PyExc_Exception, nullptr);
  PyObject_SetAttrString(base, "code", py::str("unknown").ptr());
  m.add_object("Error", py::reinterpret_steal<py::object>(base));
  error_classes[0] = base;
  const class_spec specs[] = {
      {status_code::invalid_argument, "InvalidArgumentError", PyExc_ValueError,
       "A caller passed a value outside what the operation accepts (invalid_argument)."},
      {status_code::not_found, "NotFoundError", PyExc_LookupError,
       "A file, table or key that should exist does not (not_found)."},
      {status_code::capacity_exceeded, "CapacityExceededError", nullptr,
       "A table, cache or buffer has no room left for what was asked (capacity_exceeded)."},
      {status_code::io_error, "IoError", PyExc_OSError,
       "The operating system refused a read, write, sync or rename (io_error)."},
      {status_code::corruption, "CorruptionError", nullptr,
       "A file is truncated, has a bad checksum or does not parse (corruption)."},
      {status_code::out_of_space, "OutOfSpaceError", PyExc_OSError,
       "A disk (or a quota) is full (out_of_space)."},
      {status_code::unsupported, "UnsupportedError", PyExc_NotImplementedError,
       "The build or the data asks for something this build lacks (unsupported)."},
      {status_code::internal, "InternalError", PyExc_RuntimeError,
       "An invariant broke; please report it (internal)."},
      {status_code::out_of_device_memory, "OutOfDeviceMemoryError", PyExc_MemoryError,
       "A device (GPU) allocation failed (out_of_device_memory)."},
      {status_code::out_of_host_memory, "OutOfHostMemoryError", PyExc_MemoryError,
       "A host allocation the device needs (pinned memory) failed (out_of_host_memory)."},
  };
  for (const auto& s : specs) {
    py::object bases = s.builtin
                           ? py::object(py::make_tuple(py::handle(base), py::handle(s.builtin)))
                           : py::object(py::make_tuple(py::handle(base)));
    const std::string qualified = std::string("embcache.") + s.name;
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), s.doc, bases.ptr(), nullptr);
    if (cls == nullptr) throw py::error_already_set();
    PyObject_SetAttrString(cls, "code", py::str(to_string(s.code)).ptr());
    m.add_object(s.name, py::reinterpret_steal<py::object>(cls));
    error_classes[std::size_t(s.code)] = cls;
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const status_error& e) {
      raise(e.get().code(), e.get().message());
    } catch (const error& e) {
      // status::throw_if_error() writes "<code>: <message>"; the Python class carries the code.
      std::string message = e.what();
      const std::string prefix = std::string(to_string(e.code())) + ": ";
      if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
      raise(e.code(), message);
    }
  });
}

}  // namespace embcache::python
