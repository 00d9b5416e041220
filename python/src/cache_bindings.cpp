// EmbeddingCache and EmbeddingCacheU32: embedding_cache<int64 | uint32, host_space>
// (embedding_cache.hpp), the same code bound once per key type. Every bulk call
// releases the GIL; the cache's own locking makes concurrent calls from several Python threads
// safe, as in C++.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "embcache/embedding_cache.hpp"
#include "errors.hpp"
#include "names.hpp"

namespace embcache::python {

namespace {

template <class Key>
using host_cache = embedding_cache<Key, host_space>;

template <class Key>
std::unique_ptr<host_cache<Key>> make_cache(std::size_t slots, std::size_t dim,
                                            std::size_t state_width, const std::string& init,
                                            float init_scale, std::uint64_t seed, float state_value,
                                            const std::string& scores, int max_threads) {
  const cache_options o =
      cache_options_of(slots, dim, state_width, init, init_scale, seed, state_value, scores);
  host_space space;
  space.max_threads = max_threads;
  return std::make_unique<host_cache<Key>>(o, space);
}

template <class Key>
array_arg keys_arg(py::handle keys) {
  return array_arg::borrow(keys, "keys", key_dtype<Key>(), 1, false);
}

template <class Key>
py::tuple find(host_cache<Key>& c, py::handle keys, py::handle out) {
  array_arg k = keys_arg<Key>(keys);
  const std::size_t n = k.size();
  auto rows =
      output::make(out, "out", dtype::float32, {std::int64_t(n), std::int64_t(c.row_width())});
  auto found = output::make(py::none(), "found", dtype::boolean, {std::int64_t(n)});
  {
    py::gil_scoped_release nogil;
    c.find(k.as<Key>(), n, rows.as<float>(), found.as<bool>());
  }
  return py::make_tuple(rows.object, found.object);
}

template <class Key>
py::tuple find_or_insert(host_cache<Key>& c, py::handle keys, py::handle out) {
  array_arg k = keys_arg<Key>(keys);
  const std::size_t n = k.size();
  auto rows =
      output::make(out, "out", dtype::float32, {std::int64_t(n), std::int64_t(c.row_width())});
  auto inserted = output::make(py::none(), "inserted", dtype::boolean, {std::int64_t(n)});
  status s;
  {
    py::gil_scoped_release nogil;
    s = c.find_or_insert(k.as<Key>(), n, rows.as<float>(), inserted.as<bool>());
  }
  check(s);
  return py::make_tuple(rows.object, inserted.object);
}

template <class Key>
void insert_or_assign(host_cache<Key>& c, py::handle keys, py::handle rows, py::handle versions) {
  array_arg k = keys_arg<Key>(keys);
  const std::size_t n = k.size();
  auto r = array_arg::borrow(rows, "rows", dtype::float32, -1, false);
  r.require_rows(n, c.row_width());
  auto v = borrow_optional(versions, "versions", dtype::uint64, 1, false);
  if (v) v->require_size(n, "one version per key");
  status s;
  {
    py::gil_scoped_release nogil;
    s = c.insert_or_assign(k.as<Key>(), n, r.as<float>(), v ? v->as<std::uint64_t>() : nullptr);
  }
  check(s);
}

template <class Key>
std::size_t erase(host_cache<Key>& c, py::handle keys) {
  array_arg k = keys_arg<Key>(keys);
  std::size_t erased = 0;
  py::gil_scoped_release nogil;
  c.erase(k.as<Key>(), k.size(), &erased);
  return erased;
}

template <class Key>
py::object lookup_slots(host_cache<Key>& c, py::handle keys, bool insert_missing, py::handle out) {
  array_arg k = keys_arg<Key>(keys);
  const std::size_t n = k.size();
  auto slots = output::make(out, "out", dtype::int64, {std::int64_t(n)});
  status s;
  {
    py::gil_scoped_release nogil;
    s = c.lookup_slots(k.as<Key>(), n, slots.as<std::int64_t>(), insert_missing);
  }
  check(s);
  return slots.object;
}

// Slots must be -1 or below the cache's slots: the C++ call trusts them.
template <class Key>
array_arg slots_arg(const host_cache<Key>& c, py::handle slots) {
  auto a = array_arg::borrow(slots, "slots", dtype::int64, 1, false);
  const auto* p = a.as<std::int64_t>();
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (p[i] < -1 || p[i] >= std::int64_t(c.slots()))
      throw py::value_error("slots[" + std::to_string(i) + "]: " + std::to_string(p[i]) +
                            " is not a slot of the cache (-1 or in [0, " +
                            std::to_string(c.slots()) + "))");
  }
  return a;
}

template <class Key>
py::object read_slots(const host_cache<Key>& c, py::handle slots, py::handle out) {
  array_arg s = slots_arg<Key>(c, slots);
  auto rows = output::make(out, "out", dtype::float32,
                           {std::int64_t(s.size()), std::int64_t(c.row_width())});
  {
    py::gil_scoped_release nogil;
    c.read_slots(s.as<std::int64_t>(), s.size(), rows.as<float>());
  }
  return rows.object;
}

template <class Key>
void assign_slots(host_cache<Key>& c, py::handle slots, py::handle rows) {
  array_arg s = slots_arg<Key>(c, slots);
  auto r = array_arg::borrow(rows, "rows", dtype::float32, -1, false);
  r.require_rows(s.size(), c.row_width());
  py::gil_scoped_release nogil;
  c.assign_slots(s.as<std::int64_t>(), s.size(), r.as<float>());
}

template <class Key>
void mark_updated(host_cache<Key>& c, py::handle slots) {
  array_arg s = slots_arg<Key>(c, slots);
  py::gil_scoped_release nogil;
  c.mark_updated(s.as<std::int64_t>(), s.size());
}

template <class Key>
py::tuple export_rows(const host_cache<Key>& c, py::object changed_since) {
  const export_filter f = changed_since.is_none()
                              ? export_filter::all()
                              : export_filter::changed_since(changed_since.cast<std::uint64_t>());
  // Rows inserted by another thread between the count and the copy: count again.
  for (;;) {
    const std::size_t n = c.count_if(f);
    output keys = output::make(py::none(), "keys", key_dtype<Key>(), {std::int64_t(n)});
    auto rows = output::make(py::none(), "rows", dtype::float32,
                             {std::int64_t(n), std::int64_t(c.row_width())});
    auto versions = output::make(py::none(), "versions", dtype::uint64, {std::int64_t(n)});
    std::size_t count = 0;
    status s;
    {
      py::gil_scoped_release nogil;
      s = c.export_if(f, keys.as<Key>(), rows.as<float>(), versions.as<std::uint64_t>(), n, &count);
    }
    if (s.code() == status_code::capacity_exceeded) continue;
    check(s);
    if (count == n) return py::make_tuple(keys.object, rows.object, versions.object);
    // Fewer (rows erased meanwhile): the first `count` are the export.
    py::slice first(0, py::ssize_t(count), 1);
    return py::make_tuple(keys.object[first], rows.object[first], versions.object[first]);
  }
}

// The baseline of benchmarks/python/bench_overhead.py: the fastest of `repeats` C++ calls of `op`
// ('find' or 'lookup_slots') on `keys`, in seconds, with no Python between them.
template <class Key>
double time_cpp(host_cache<Key>& c, const std::string& op, py::handle keys, int repeats) {
  array_arg k = keys_arg<Key>(keys);
  const std::size_t n = k.size();
  std::vector<float> rows(op == "find" ? n * c.row_width() : 0);
  std::vector<std::int64_t> slots(n);
  std::unique_ptr<bool[]> found(new bool[n]);
  if (op != "find" && op != "lookup_slots")
    throw py::value_error("op: expected 'find' or 'lookup_slots', got '" + op + "'");
  py::gil_scoped_release nogil;
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (op == "find") {
      c.find(k.as<Key>(), n, rows.data(), found.get());
    } else {
      check(c.lookup_slots(k.as<Key>(), n, slots.data()));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0 || s < best) best = s;
  }
  return best;
}

template <class Key>
void bind_cache_class(py::module_& m) {
  using cache = host_cache<Key>;
  const std::string name = std::string("EmbeddingCache") + key_suffix<Key>();
  const std::string k = to_string(key_dtype<Key>());
  const std::string doc =
      "\nThe device embedding cache in the host space (C++ embedding_cache<" + k +
      "_t, host_space>): a\nfixed-capacity hash table of rows, each `dim` embedding floats followed "
      "by `state_width` optimizer\nfloats. Keys are " +
      k +
      " arrays (another key type is TypeError); rows come back as float32\narrays of shape "
      "(n, row_width). Every call accepts NumPy arrays (buffer protocol) and tensors\n(DLPack) "
      "without copying, and releases the GIL while it runs; calls from several threads\nmay "
      "overlap, as in C++.\n";
  py::class_<cache>(m, name.c_str(), doc.c_str())
      .def(py::init(&make_cache<Key>), py::arg("slots"), py::arg("dim"), py::arg("state_width") = 0,
           py::arg("init") = "uniform", py::arg("init_scale") = 0.05f, py::arg("seed") = 0,
           py::arg("state_value") = 0.0f, py::arg("scores") = "lru", py::arg("max_threads") = 0,
           R"doc(Allocates the table (cache_options). `slots` rows (rounded up to a multiple of
128) of `dim` + `state_width` floats; `init` 'uniform' | 'normal' | 'constant' with `init_scale`
and `seed` (a new row is a function of (seed, key) only); `state_value` fills the state;
`scores` 'lru' | 'lfu' ranks rows for eviction; `max_threads` caps the worker threads (0: all).
InvalidArgumentError for zero slots or a zero dim.)doc")
      .def("find", &find<Key>, py::arg("keys"), py::arg("out") = py::none(),
           R"doc(Rows of `keys` -> (rows (n, row_width) float32, found (n,) bool). Rows of missing
keys are left untouched (uninitialized in a new array). Updates scores. `out`: an array to write
the rows into.)doc")
      .def("find_or_insert", &find_or_insert<Key>, py::arg("keys"), py::arg("out") = py::none(),
           R"doc(Finds each key, inserting the missing ones with the initializer -> (rows,
inserted). CapacityExceededError (naming how many keys and one of them) when the table has no
room for some keys; those that fit are inserted.)doc")
      .def("insert_or_assign", &insert_or_assign<Key>, py::arg("keys"), py::arg("rows"),
           py::arg("versions") = py::none(),
           R"doc(Inserts or overwrites rows ((n, row_width) or flat). `versions` (uint64, n)
gives each row's version; None stamps the call's version. The last occurrence of a repeated key
wins.)doc")
      .def("erase", &erase<Key>, py::arg("keys"),
           "Removes keys (absent ones ignored); returns how many.")
      .def("lookup_slots", &lookup_slots<Key>, py::arg("keys"), py::arg("insert_missing") = false,
           py::arg("out") = py::none(),
           R"doc(Slot (row index into `rows`) of each key, -1 when absent; with
`insert_missing`, missing keys are inserted with the initializer.)doc")
      .def("read_slots", &read_slots<Key>, py::arg("slots"), py::arg("out") = py::none(),
           "Copies the rows of `slots` (-1 leaves its row untouched).")
      .def("assign_slots", &assign_slots<Key>, py::arg("slots"), py::arg("rows"),
           "Overwrites the rows of `slots` (each must hold a key) and stamps the call's version.")
      .def("mark_updated", &mark_updated<Key>, py::arg("slots"),
           "Stamps the call's version on `slots` after an in-place update of their rows.")
      .def("export", &export_rows<Key>, py::arg("changed_since") = py::none(),
           R"doc(Resident rows sorted by key -> (keys, rows, versions); with `changed_since`, only
the rows whose version is greater (export_filter::changed_since).)doc")
      .def("clear", &cache::clear, py::call_guard<py::gil_scoped_release>(),
           "Removes every row; the version clock keeps its value.")
      .def_property_readonly(
          "rows",
          [](py::object self) {
            auto& c = self.cast<cache&>();
            return rows_view(c.row_pool(), c.slots(), c.row_width(), self);
          },
          R"doc(The row pool as a (slots, row_width) float32 array without a copy; row i
belongs to slot i. Write through it, then call mark_updated(slots).)doc")
      .def_property_readonly("size", &cache::size, "Resident rows.")
      .def_property_readonly("slots", &cache::slots,
                             "Slots (the slots asked for, rounded up to a multiple of 128).")
      .def_property_readonly("dim", &cache::dim, "Embedding floats per row.")
      .def_property_readonly("row_width", &cache::row_width, "Floats per row (dim + state).")
      .def_property_readonly("load_factor", &cache::load_factor, "size / slots.")
      .def_property_readonly("version", &cache::version,
                             "The version clock (the version of the last mutating call).")
      .def_property_readonly_static(
          "key_dtype", [](py::object) { return to_string(key_dtype<Key>()); },
          "NumPy name of the key type ('int64' or 'uint32').")
      .def("__len__", &cache::size);
  m.def("_time_cpp", &time_cpp<Key>, py::arg("cache"), py::arg("op"), py::arg("keys"),
        py::arg("repeats") = 10,
        "Benchmark baseline: the fastest of `repeats` C++ calls of `op` on `keys`, in seconds.");
}

}  // namespace

void bind_cache(py::module_& m) {
  bind_cache_class<std::int64_t>(m);
  bind_cache_class<std::uint32_t>(m);
}

}  // namespace embcache::python
