// CudaEmbeddingCache: embedding_cache<int64, cuda_space> (embedding_cache.hpp), built when the
// project is built with CUDA (library embcache::cuda). Arrays are CUDA tensors through DLPack on
// the cache's device; the calls are ordered on the legacy default stream (the cache's), which is
// also torch's default stream. Results go into the caller's `out` tensors: the module allocates no
// device memory of its own.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>

#include "arrays.hpp"
#include "bindings.hpp"
#include "embcache/embedding_cache.hpp"
#include "errors.hpp"
#include "names.hpp"

namespace embcache::python {

namespace {

using key = std::int64_t;
using cuda_cache = embedding_cache<key, cuda_space>;

std::unique_ptr<cuda_cache> make_cache(std::size_t slots, std::size_t dim, std::size_t state_width,
                                       const std::string& init, float init_scale,
                                       std::uint64_t seed, float state_value,
                                       const std::string& scores) {
  if (!cuda_device_available()) throw error(status_code::unsupported, cuda_device_problem());
  const cache_options o =
      cache_options_of(slots, dim, state_width, init, init_scale, seed, state_value, scores);
  py::gil_scoped_release nogil;
  return std::make_unique<cuda_cache>(o);
}

// A CUDA array of the cache's device.
array_arg on_device(const cuda_cache& c, py::handle obj, const char* name, dtype type, int ndim) {
  auto a = array_arg::borrow(obj, name, type, ndim, false, memory::cuda);
  if (a.device() != c.device())
    throw py::value_error(std::string(name) + ": expected an array on CUDA device " +
                          std::to_string(c.device()) + " (the cache's), got device " +
                          std::to_string(a.device()));
  return a;
}

// `out` (required): a CUDA float32 array of n rows of the cache's width.
array_arg rows_out(const cuda_cache& c, py::handle out, std::size_t n) {
  if (out.is_none())
    throw py::value_error(
        "out: the cuda space writes into a CUDA tensor the caller gives "
        "(torch.empty((n, row_width), device='cuda'))");
  auto a = on_device(c, out, "out", dtype::float32, -1);
  a.require_rows(n, c.row_width());
  return a;
}

bool* optional_flags(const cuda_cache& c, py::handle obj, const char* name, std::size_t n,
                     std::optional<array_arg>& keep) {
  if (obj.is_none()) return nullptr;
  keep = on_device(c, obj, name, dtype::boolean, 1);
  keep->require_size(n, "one flag per key");
  return keep->as<bool>();
}

void find(cuda_cache& c, py::handle keys, py::handle out, py::handle found) {
  auto k = on_device(c, keys, "keys", dtype::int64, 1);
  auto rows = rows_out(c, out, k.size());
  std::optional<array_arg> f;
  bool* fp = optional_flags(c, found, "found", k.size(), f);
  py::gil_scoped_release nogil;
  c.find(k.as<key>(), k.size(), rows.as<float>(), fp);
}

void find_or_insert(cuda_cache& c, py::handle keys, py::handle out, py::handle inserted) {
  auto k = on_device(c, keys, "keys", dtype::int64, 1);
  auto rows = rows_out(c, out, k.size());
  std::optional<array_arg> f;
  bool* fp = optional_flags(c, inserted, "inserted", k.size(), f);
  status s;
  {
    py::gil_scoped_release nogil;
    s = c.find_or_insert(k.as<key>(), k.size(), rows.as<float>(), fp);
  }
  check(s);
}

void lookup_slots(cuda_cache& c, py::handle keys, py::handle out, bool insert_missing) {
  auto k = on_device(c, keys, "keys", dtype::int64, 1);
  auto slots = on_device(c, out, "out", dtype::int64, 1);
  slots.require_size(k.size(), "one slot per key");
  status s;
  {
    py::gil_scoped_release nogil;
    s = c.lookup_slots(k.as<key>(), k.size(), slots.as<std::int64_t>(), insert_missing);
  }
  check(s);
}

void insert_or_assign(cuda_cache& c, py::handle keys, py::handle rows) {
  auto k = on_device(c, keys, "keys", dtype::int64, 1);
  auto r = on_device(c, rows, "rows", dtype::float32, -1);
  r.require_rows(k.size(), c.row_width());
  status s;
  {
    py::gil_scoped_release nogil;
    s = c.insert_or_assign(k.as<key>(), k.size(), r.as<float>());
  }
  check(s);
}

std::size_t erase(cuda_cache& c, py::handle keys) {
  auto k = on_device(c, keys, "keys", dtype::int64, 1);
  std::size_t erased = 0;
  py::gil_scoped_release nogil;
  c.erase(k.as<key>(), k.size(), &erased);
  return erased;
}

// export_to_host: the rows come to host memory as NumPy arrays.
py::tuple export_rows(const cuda_cache& c, py::object changed_since) {
  const export_filter f = changed_since.is_none()
                              ? export_filter::all()
                              : export_filter::changed_since(changed_since.cast<std::uint64_t>());
  result<exported_rows<key>> r = [&] {
    py::gil_scoped_release nogil;
    return c.export_to_host(f);
  }();
  auto e = take(std::move(r));
  const auto n = py::ssize_t(e.keys.size());
  return py::make_tuple(to_numpy(std::move(e.keys), {n}),
                        to_numpy(std::move(e.rows), {n, py::ssize_t(c.row_width())}),
                        to_numpy(std::move(e.versions), {n}));
}

}  // namespace

void bind_cuda_cache(py::module_& m) {
  py::class_<cuda_cache>(m, "CudaEmbeddingCache", R"doc(
The device embedding cache in the cuda space (C++ embedding_cache<int64_t, cuda_space>), on the
CUDA device current at construction. Arrays are CUDA tensors (DLPack) on that device; results are
written into the caller's `out` tensors. Calls are ordered on the legacy default stream.
)doc")
      .def(py::init(&make_cache), py::arg("slots"), py::arg("dim"), py::arg("state_width") = 0,
           py::arg("init") = "uniform", py::arg("init_scale") = 0.05f, py::arg("seed") = 0,
           py::arg("state_value") = 0.0f, py::arg("scores") = "lru",
           "As EmbeddingCache; UnsupportedError when no CUDA device can be used.")
      .def("find", &find, py::arg("keys"), py::arg("out"), py::arg("found") = py::none(),
           "Rows of `keys` into `out` (n, row_width); `found` (bool, n) when given.")
      .def("find_or_insert", &find_or_insert, py::arg("keys"), py::arg("out"),
           py::arg("inserted") = py::none(),
           "Finds each key, inserting the missing ones; rows into `out`. CapacityExceededError.")
      .def("lookup_slots", &lookup_slots, py::arg("keys"), py::arg("out"),
           py::arg("insert_missing") = false, "Slot of each key into `out` (int64), -1 absent.")
      .def("insert_or_assign", &insert_or_assign, py::arg("keys"), py::arg("rows"),
           "Inserts or overwrites rows; the last occurrence of a repeated key wins.")
      .def("erase", &erase, py::arg("keys"), "Removes keys; returns how many.")
      .def("export", &export_rows, py::arg("changed_since") = py::none(),
           "Resident rows sorted by key, in host memory -> (keys, rows, versions).")
      .def_property_readonly("size", &cuda_cache::size)
      .def_property_readonly("slots", &cuda_cache::slots)
      .def_property_readonly("dim", &cuda_cache::dim)
      .def_property_readonly("row_width", &cuda_cache::row_width)
      .def_property_readonly("version", &cuda_cache::version)
      .def_property_readonly("device", &cuda_cache::device, "The CUDA device of the cache.")
      .def("__len__", &cuda_cache::size);
}

}  // namespace embcache::python
