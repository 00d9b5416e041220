// HostStore, RocksDBStore and LogStore: param_store<int64> (param_store.hpp, host_store.hpp,
// rocksdb_store.hpp, log_store.hpp), and the same classes over uint32 keys (HostStoreU32, ...).
// Calls release the GIL and are serialized per store.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>

#include "arrays.hpp"
#include "bindings.hpp"
#include "embcache/host_store.hpp"
#include "embcache/log_store.hpp"
#include "errors.hpp"
#include "names.hpp"
#include "store_ref.hpp"
#ifdef EMBCACHE_PYTHON_ROCKSDB
#include "embcache/rocksdb_store.hpp"
#endif

namespace embcache::python {

namespace {

template <class Key>
py::tuple pull(store_ref_of<Key>& s, py::handle keys, py::handle out) {
  array_arg k = array_arg::borrow(keys, "keys", key_dtype<Key>(), 1, false);
  const std::size_t n = k.size();
  const auto w = std::int64_t(s.store->row_width());
  auto rows = output::make(out, "out", dtype::float32, {std::int64_t(n), w});
  auto found = output::make(py::none(), "found", dtype::boolean, {std::int64_t(n)});
  auto versions = output::make(py::none(), "versions", dtype::uint64, {std::int64_t(n)});
  status st;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(*s.calls);
    st = s.store->pull(k.as<Key>(), n, rows.as<float>(), found.as<bool>(),
                       versions.as<std::uint64_t>());
  }
  check(st);
  return py::make_tuple(rows.object, found.object, versions.object);
}

template <class Key>
void push(store_ref_of<Key>& s, py::handle keys, py::handle rows, py::handle versions) {
  array_arg k = array_arg::borrow(keys, "keys", key_dtype<Key>(), 1, false);
  const std::size_t n = k.size();
  auto r = array_arg::borrow(rows, "rows", dtype::float32, -1, false);
  r.require_rows(n, s.store->row_width());
  auto v = borrow_optional(versions, "versions", dtype::uint64, 1, false);
  if (v) v->require_size(n, "one version per key");
  status st;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(*s.calls);
    st = s.store->push(k.as<Key>(), n, r.as<float>(), v ? v->as<std::uint64_t>() : nullptr);
  }
  check(st);
}

template <class Key>
std::size_t erase(store_ref_of<Key>& s, py::handle keys) {
  array_arg k = array_arg::borrow(keys, "keys", key_dtype<Key>(), 1, false);
  std::size_t erased = 0;
  status st;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(*s.calls);
    st = s.store->erase(k.as<Key>(), k.size(), &erased);
  }
  check(st);
  return erased;
}

template <class Key>
py::object contains(store_ref_of<Key>& s, py::handle keys) {
  array_arg k = array_arg::borrow(keys, "keys", key_dtype<Key>(), 1, false);
  auto found = output::make(py::none(), "found", dtype::boolean, {std::int64_t(k.size())});
  status st;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(*s.calls);
    st = s.store->contains(k.as<Key>(), k.size(), found.as<bool>());
  }
  check(st);
  return found.object;
}

// Calls `fn(keys, rows, versions)` per batch with copies of the batch (the store's pointers live
// only during its callback). An exception raised by `fn` stops the scan and is raised again.
template <class Key>
void for_each(store_ref_of<Key>& s, const py::function& fn, std::size_t batch_size,
              py::object changed_since) {
  std::unique_ptr<py::error_already_set> raised;
  const std::size_t w = s.store->row_width();
  store_batch_fn<Key> batch = [&](const Key* keys, const float* rows, const std::uint64_t* versions,
                                  std::size_t n) -> status {
    py::gil_scoped_acquire gil;
    try {
      py::array_t<Key> k(static_cast<py::ssize_t>(n));
      py::array_t<float> r({py::ssize_t(n), py::ssize_t(w)});
      py::array_t<std::uint64_t> v(static_cast<py::ssize_t>(n));
      std::memcpy(k.mutable_data(), keys, n * sizeof(Key));
      std::memcpy(r.mutable_data(), rows, n * w * sizeof(float));
      std::memcpy(v.mutable_data(), versions, n * sizeof(std::uint64_t));
      fn(k, r, v);
    } catch (py::error_already_set& e) {
      raised = std::make_unique<py::error_already_set>(std::move(e));
      return status::internal("stopped by the callback");
    }
    return {};
  };
  status st;
  const bool changed = !changed_since.is_none();
  const std::uint64_t since = changed ? changed_since.cast<std::uint64_t>() : 0;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(*s.calls);
    st = changed ? s.store->for_each_changed_since(since, batch_size, batch)
                 : s.store->for_each(batch_size, batch);
  }
  if (raised) throw std::move(*raised);
  check(st);
}

template <class Key>
void flush(store_ref_of<Key>& s) {
  status st;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(*s.calls);
    st = s.store->flush();
  }
  check(st);
}

template <class Key>
void checkpoint(store_ref_of<Key>& s, const std::string& dir) {
  status st;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(*s.calls);
    st = s.store->checkpoint(dir);
  }
  check(st);
}

host_store_options host_options(const std::string& table_name, std::size_t row_width,
                                std::size_t num_shards, std::size_t expected_rows,
                                int max_threads) {
  host_store_options o;
  o.table_name = table_name;
  o.row_width = row_width;
  o.num_shards = num_shards;
  o.expected_rows = expected_rows;
  o.space.max_threads = max_threads;
  return o;
}

template <class Key>
host_store<Key>& as_host(store_ref_of<Key>& s) {
  return static_cast<host_store<Key>&>(*s.store);
}

#ifdef EMBCACHE_PYTHON_ROCKSDB
template <class Key>
rocksdb_store_ref_of<Key> open_rocksdb(const std::string& path, const std::string& table_name,
                                       std::size_t row_width, std::size_t dim,
                                       const std::string& optimizer,
                                       const std::string& existing_rows, bool create_if_missing,
                                       std::size_t block_cache_bytes, int max_threads,
                                       const std::string& read_path, std::size_t block_bytes) {
  rocksdb_store_options o;
  o.path = path;
  o.table_name = table_name;
  o.row_width = row_width;
  o.dim = dim;
  o.optimizer = optimizer;
  o.existing_rows = existing_rows_policy_of(existing_rows);
  o.read_path = rocksdb_read_path_of(read_path);
  o.create_if_missing = create_if_missing;
  o.block_cache_bytes = block_cache_bytes;
  o.block_bytes = block_bytes;
  o.space.max_threads = max_threads;
  result<std::unique_ptr<rocksdb_store<Key>>> r = [&] {
    py::gil_scoped_release nogil;
    return rocksdb_store<Key>::open(o);
  }();
  rocksdb_store_ref_of<Key> ref;
  ref.store = take(std::move(r));
  return ref;
}
#endif

template <class Key>
log_store_ref_of<Key> open_log(const std::string& path, const std::string& table_name,
                               std::size_t row_width, std::size_t dim, const std::string& optimizer,
                               bool create_if_missing, bool reuse_rows, std::uint64_t segment_bytes,
                               double max_space_amplification, std::size_t read_threads,
                               bool direct_io, std::size_t expected_rows) {
  log_store_options o;
  o.path = path;
  o.table_name = table_name;
  o.row_width = row_width;
  o.dim = dim;
  o.optimizer = optimizer;
  o.create_if_missing = create_if_missing;
  o.reuse_rows = reuse_rows;
  o.segment_bytes = segment_bytes;
  o.max_space_amplification = max_space_amplification;
  o.read_threads = read_threads;
  o.direct_io = direct_io;
  o.expected_rows = expected_rows;
  result<std::unique_ptr<log_store<Key>>> r = [&] {
    py::gil_scoped_release nogil;
    return log_store<Key>::open(o);
  }();
  log_store_ref_of<Key> ref;
  ref.store = take(std::move(r));
  return ref;
}

// fn(store) on the log store behind `s`, under the store's lock (a push from another thread
// changes what the accessors read).
template <class Key, class Fn>
auto with_log_store(store_ref_of<Key>& s, Fn fn) {
  py::gil_scoped_release nogil;  // before the lock: its holder may need the GIL back
  std::lock_guard<std::mutex> lock(*s.calls);
  return fn(static_cast<const log_store<Key>&>(*s.store));
}

// The classes of one key type: ParamStore, HostStore, RocksDBStore, LogStore, with
// key_suffix<Key>().
template <class Key>
void bind_store_classes(py::module_& m) {
  using store_ref = store_ref_of<Key>;
  using host_store_ref = host_store_ref_of<Key>;
  const std::string sfx = key_suffix<Key>();
  const std::string k = to_string(key_dtype<Key>());
  const std::string param_doc =
      "\nA parameter store of one table (C++ param_store<" + k +
      "_t>): every row outside the device cache,\n`row_width` floats plus a version; keys are " +
      k +
      " arrays. Calls from several Python threads are\nserialized. Once the store is given to a "
      "TrainingCache, reach its rows through the cache (a\ndirect write while the cache holds rows "
      "of the table would be overwritten or lost).\n";
  py::class_<store_ref>(m, ("ParamStore" + sfx).c_str(), param_doc.c_str())
      .def("pull", &pull<Key>, py::arg("keys"), py::arg("out") = py::none(),
           R"doc(Rows of `keys` -> (rows (n, row_width), found (n,) bool, versions (n,) uint64); the
row of a missing key is left untouched.)doc")
      .def("push", &push<Key>, py::arg("keys"), py::arg("rows"), py::arg("versions") = py::none(),
           R"doc(Inserts or overwrites rows. `versions` None stamps every row with
max_version + 1. The last occurrence of a repeated key wins.)doc")
      .def("erase", &erase<Key>, py::arg("keys"),
           "Removes keys (absent ones ignored); returns how many.")
      .def("contains", &contains<Key>, py::arg("keys"), "Whether each key exists (bool array).")
      .def("for_each", &for_each<Key>, py::arg("fn"), py::arg("batch_size") = 65536,
           py::arg("changed_since") = py::none(),
           R"doc(Calls fn(keys, rows, versions) on batches of at most `batch_size` rows until every
row (or, with `changed_since`, every row whose version is greater) was visited.)doc")
      .def("flush", &flush<Key>, "Makes every completed push durable.")
      .def("checkpoint", &checkpoint<Key>, py::arg("dir"),
           "Writes a consistent, self-describing copy of the store into the new folder `dir`.")
      .def_property_readonly(
          "row_width", [](const store_ref& s) { return s.store->row_width(); },
          "Floats per row (embedding + optimizer state).")
      .def_property_readonly(
          "table_name", [](const store_ref& s) { return s.store->table_name(); },
          "Name of the table the store holds.")
      .def_property_readonly(
          "max_version", [](const store_ref& s) { return s.store->max_version(); },
          "Highest version of any row pushed so far (0 when empty).")
      .def_property_readonly_static(
          "key_dtype", [](py::object) { return to_string(key_dtype<Key>()); },
          "NumPy name of the key type ('int64' or 'uint32').")
      .def("__len__", [](store_ref& s) {
        py::gil_scoped_release nogil;  // before the lock: its holder may need the GIL back
        std::lock_guard<std::mutex> lock(*s.calls);
        return s.store->size();
      });

  const std::string host_doc =
      "\nParameter store in host memory (C++ host_store<" + k +
      "_t>): a sharded flat index over a slab of\nrows that never moves.\n";
  py::class_<host_store_ref, store_ref>(m, ("HostStore" + sfx).c_str(), host_doc.c_str())
      .def(py::init([](const std::string& table_name, std::size_t row_width, std::size_t num_shards,
                       std::size_t expected_rows, int max_threads) {
             host_store_ref r;
             r.store = std::make_shared<host_store<Key>>(
                 host_options(table_name, row_width, num_shards, expected_rows, max_threads));
             return r;
           }),
           py::arg("table_name") = "", py::arg("row_width"), py::arg("num_shards") = 64,
           py::arg("expected_rows") = 0, py::arg("max_threads") = 0,
           R"doc(An empty store of rows of `row_width` floats (host_store_options: `num_shards`
default 64, `expected_rows` presizes the index, `max_threads` 0 = all cores). InvalidArgumentError
when row_width is 0.)doc")
      .def_static(
          "open",
          [](const std::string& dir, const std::string& table_name, std::size_t row_width,
             std::size_t num_shards, int max_threads) {
            auto o = host_options(table_name, row_width, num_shards, 0, max_threads);
            result<std::unique_ptr<host_store<Key>>> r = [&] {
              py::gil_scoped_release nogil;
              return host_store<Key>::open(dir, o);
            }();
            host_store_ref ref;
            ref.store = take(std::move(r));
            return ref;
          },
          py::arg("dir"), py::arg("table_name"), py::arg("row_width"), py::arg("num_shards") = 64,
          py::arg("max_threads") = 0,
          R"doc(Loads a folder written by checkpoint(). Another table (NotFoundError), row width
(InvalidArgumentError), a missing file or a checksum mismatch (CorruptionError) is refused.)doc")
      .def_property_readonly(
          "memory_bytes", [](store_ref& s) { return as_host(s).memory_bytes(); },
          "Bytes of host memory the store holds (rows, versions, indexes, free lists).");

#ifdef EMBCACHE_PYTHON_ROCKSDB
  const std::string rocksdb_doc =
      "\nParameter store of one table on SSD through RocksDB (C++ rocksdb_store<" + k +
      "_t>): one column\nfamily per table, big-endian keys, rows with their version.\n";
  py::class_<rocksdb_store_ref_of<Key>, store_ref>(m, ("RocksDBStore" + sfx).c_str(),
                                                   rocksdb_doc.c_str())
      .def(py::init(&open_rocksdb<Key>), py::arg("path"), py::arg("table_name"),
           py::arg("row_width"), py::arg("dim") = 0, py::arg("optimizer") = "",
           py::arg("existing_rows") = "refuse", py::arg("create_if_missing") = true,
           py::arg("block_cache_bytes") = std::size_t{1} << 30, py::arg("max_threads") = 0,
           py::arg("read_path") = "automatic", py::arg("block_bytes") = 0,
           R"doc(Opens (or creates) the table `table_name` in the database at `path`
(rocksdb_store_options). `dim` and `optimizer` are part of the table's schema (a table recorded with
another schema is InvalidArgumentError naming both); `existing_rows` 'refuse' (default: a table
that already holds rows is InvalidArgumentError) or 'reuse' (resume). `read_path` is how pull and
contains read: 'automatic' (default: scans where the keys are dense in the table, point lookups
elsewhere), 'multi_get' or 'scan'. `block_bytes` is the size of the table's SST data blocks: 0
(default) derives it from the row (a 4 KiB page for rows under about 4 KiB), else 1024 to 2**28;
larger blocks suit a table read mostly by dense passes (docs/stores.md, "Block size"). The size is
the table's from its creation: 0 keeps a reopened table's, another size is an error.)doc")
      .def_property_readonly(
          "read_counts",
          [](const rocksdb_store_ref_of<Key>& s) {
            const rocksdb_read_counts c =
                static_cast<const rocksdb_store<Key>&>(*s.store).read_counts();
            py::dict d;
            d["keys_looked_up"] = c.keys_looked_up;
            d["keys_scanned"] = c.keys_scanned;
            d["scan_steps"] = c.scan_steps;
            d["scan_seeks"] = c.scan_seeks;
            return d;
          },
          "What pull and contains have read: {'keys_looked_up', 'keys_scanned', 'scan_steps', "
          "'scan_seeks'}.");
#endif

  using log_store_ref = log_store_ref_of<Key>;
  const log_store_options log_defaults;
  const std::string log_doc =
      "\nParameter store of one table on disk (C++ log_store<" + k +
      "_t>): rows appended to segment files in\na folder, found through an index of key to "
      "location in memory; the oldest segment is cleaned\nwhen the segments outgrow the live "
      "rows.\n";
  py::class_<log_store_ref, store_ref>(m, ("LogStore" + sfx).c_str(), log_doc.c_str())
      .def(py::init(&open_log<Key>), py::arg("path"), py::arg("table_name"), py::arg("row_width"),
           py::arg("dim") = log_defaults.dim, py::arg("optimizer") = log_defaults.optimizer,
           py::arg("create_if_missing") = log_defaults.create_if_missing,
           py::arg("reuse_rows") = log_defaults.reuse_rows,
           py::arg("segment_bytes") = log_defaults.segment_bytes,
           py::arg("max_space_amplification") = log_defaults.max_space_amplification,
           py::arg("read_threads") = log_defaults.read_threads,
           py::arg("direct_io") = log_defaults.direct_io,
           py::arg("expected_rows") = log_defaults.expected_rows,
           R"doc(Opens (or creates) the table `table_name` in the folder `path` (log_store_options;
a checkpoint() folder opens the same way). `dim` and `optimizer` are recorded when the folder is
created and checked on open when set (another row width, dim or optimizer is InvalidArgumentError
naming both; a folder of another table NotFoundError). `create_if_missing` False makes a folder
without a table NotFoundError. `reuse_rows` False refuses a folder that already holds rows
(InvalidArgumentError: a fresh run does not train from old rows). `segment_bytes` starts a new
segment file at this size (256 MiB, 1 MiB to 1 TiB); `max_space_amplification` is how many times
the live rows' bytes the segments may hold before the oldest is cleaned (2.0, 1.25 to 16);
`read_threads` the threads of one pull (8, 1 to 256); `direct_io` reads and writes with O_DIRECT,
bypassing the page cache (the folder's file system must accept it: direct_io_supported(path));
`expected_rows` presizes the index (0: it grows on demand). A bad option is InvalidArgumentError
naming the field. The folder is locked while the store is open: a second LogStore on it (in this
process or another) is InvalidArgumentError.)doc")
      .def_property_readonly(
          "counters",
          [](log_store_ref& s) {
            const log_store_counters c =
                with_log_store(s, [](const log_store<Key>& l) { return l.counters(); });
            py::dict d;
            d["rows_pulled"] = c.rows_pulled;
            d["reads"] = c.reads;
            d["bytes_read"] = c.bytes_read;
            d["bytes_appended"] = c.bytes_appended;
            d["bytes_cleaned"] = c.bytes_cleaned;
            d["segments_cleaned"] = c.segments_cleaned;
            return d;
          },
          "Counts since the store was opened: {'rows_pulled', 'reads', 'bytes_read', "
          "'bytes_appended', 'bytes_cleaned', 'segments_cleaned'}.")
      .def_property_readonly(
          "disk_bytes",
          [](log_store_ref& s) {
            return with_log_store(s, [](const log_store<Key>& l) { return l.disk_bytes(); });
          },
          "Bytes of the segment files on disk.")
      .def_property_readonly(
          "live_bytes",
          [](log_store_ref& s) {
            return with_log_store(s, [](const log_store<Key>& l) { return l.live_bytes(); });
          },
          "Bytes of the live rows' records among the segments.")
      .def_property_readonly(
          "memory_bytes",
          [](log_store_ref& s) {
            return with_log_store(s, [](const log_store<Key>& l) { return l.memory_bytes(); });
          },
          "Bytes of host memory the store holds (index, buffers).");
}

}  // namespace

void bind_stores(py::module_& m) {
  bind_store_classes<std::int64_t>(m);
  bind_store_classes<std::uint32_t>(m);
#ifdef EMBCACHE_PYTHON_ROCKSDB
  m.attr("HAVE_ROCKSDB") = true;
#else
  m.attr("HAVE_ROCKSDB") = false;
#endif
  m.def(
      "direct_io_supported",
      [](const std::string& path) {
        return without_gil([&] { return direct_io_supported(path); });
      },
      py::arg("path"),
      R"doc(Whether the file system holding `path` (or its nearest existing parent folder) accepts
O_DIRECT files, as LogStore(direct_io=True) needs. Creates and removes a probe file there.)doc");
}

}  // namespace embcache::python
