// The data tools' readers (keysets, shards, dataset manifests; keyset.hpp, shard.hpp) and
// embcache-apply's apply_deltas (serving.hpp).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "arrays.hpp"
#include "bindings.hpp"
#include "embcache/distributed/ownership.hpp"
#include "embcache/keyset.hpp"
#include "embcache/serving.hpp"
#include "embcache/shard.hpp"
#include "errors.hpp"
#include "names.hpp"

namespace embcache::python {

namespace {

using key = std::int64_t;

py::dict header_dict(const shard_header& h) {
  py::dict d;
  d["rows"] = h.rows;
  d["num_crossed"] = h.num_crossed;
  d["record_size"] = h.record_size;
  d["checksum"] = h.checksum;
  return d;
}

py::dict manifest_dict(const dataset_summary& s) {
  py::dict d;
  d["rows"] = s.rows;
  d["label_mean"] = s.label_mean;
  d["num_crossed"] = s.num_crossed;
  d["num_dense"] = s.schema.num_dense();
  d["num_slots"] = s.schema.num_categorical();
  d["dense_names"] = s.schema.dense;
  d["categorical_names"] = s.schema.categorical;
  d["label_column"] = s.schema.label_column;
  d["keyset_format"] = to_string(s.keyset);
  if (s.has_unique_stats) {
    d["unique_keys"] = std::vector<std::uint64_t>(s.unique_keys.begin(), s.unique_keys.end());
    d["unique_crossed_keys"] = s.unique_crossed_keys;
  } else {
    d["unique_keys"] = py::none();
    d["unique_crossed_keys"] = py::none();
  }
  py::list shards;
  for (const auto& f : s.shards) {
    py::dict sd;
    sd["shard"] = f.shard;
    sd["keyset"] = f.keyset;
    sd["crossed_keyset"] =
        f.crossed_keyset.empty() ? py::object(py::none()) : py::str(f.crossed_keyset);
    sd["rows"] = f.rows;
    sd["keys"] = f.has_key_counts ? py::object(py::int_(f.keys)) : py::object(py::none());
    sd["crossed_keys"] =
        f.has_key_counts ? py::object(py::int_(f.crossed_keys)) : py::object(py::none());
    shards.append(sd);
  }
  d["shards"] = shards;
  py::dict producer;
  for (const auto& [k, v] : s.producer) producer[py::str(k)] = v;
  d["producer"] = producer;
  return d;
}

py::dict batch_dict(shard_batch&& b) {
  const auto n = py::ssize_t(b.size);
  py::dict d;
  d["size"] = b.size;
  d["shard_index"] = b.shard_index;
  d["labels"] = to_numpy(std::move(b.labels), {n});
  d["dense"] = to_numpy(std::move(b.dense), {n, py::ssize_t(b.num_dense)});
  d["keys"] = to_numpy(std::move(b.keys), {n, py::ssize_t(b.num_slots)});
  d["crossed"] = to_numpy(std::move(b.crossed), {n, py::ssize_t(b.num_crossed)});
  d["rows"] = to_numpy(std::move(b.rows), {n});
  return d;
}

// A shard_reader as a Python iterator of batch dicts.
class reader {
 public:
  explicit reader(std::unique_ptr<shard_reader> r) : r_(std::move(r)) {}

  py::dict next() {
    shard_batch b;
    status s;
    {
      // The GIL first, then the lock: a thread waiting for the lock must not hold the GIL.
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(calls_);
      s = r_->next(b);
    }
    check(s);
    if (b.size == 0) throw py::stop_iteration();
    return batch_dict(std::move(b));
  }

  const shard_reader& get() const { return *r_; }

 private:
  std::unique_ptr<shard_reader> r_;
  std::mutex calls_;
};

py::dict report_dict(const apply_report& r) {
  py::dict d;
  d["model_dir"] = r.model_dir;
  d["from_delta"] = r.from_delta;
  d["applied_delta"] = r.applied_delta;
  d["deltas"] = r.deltas;
  d["rows_written"] = r.rows_written;
  d["rows_erased"] = r.rows_erased;
  d["state_dropped"] = r.state_dropped;
  d["changed"] = r.changed;
  d["run_unchecked"] = r.run_unchecked;
  return d;
}

// Whether `name` (a key_dtype argument) is "uint32"; ValueError unless "int64" or "uint32".
bool is_uint32_keys(const std::string& name) {
  if (name == "int64") return false;
  if (name == "uint32") return true;
  bad_choice("key_dtype", "'int64', 'uint32'", name);
}

}  // namespace

void bind_data(py::module_& m) {
  m.def(
      "write_keyset",
      [](const std::string& path, py::handle keys, const std::string& format,
         const std::string& key_dtype) {
        const keyset_format f = keyset_format_of(format);
        if (is_uint32_keys(key_dtype)) {
          auto k = array_arg::borrow(keys, "keys", dtype::uint32, 1, false);
          check(without_gil([&] {
            return write_keyset<std::uint32_t>(path, k.as<std::uint32_t>(), k.size(), f);
          }));
        } else {
          auto k = array_arg::borrow(keys, "keys", dtype::int64, 1, false);
          check(without_gil([&] { return write_keyset<key>(path, k.as<key>(), k.size(), f); }));
        }
      },
      py::arg("path"), py::arg("keys"), py::arg("format") = "embcache",
      py::arg("key_dtype") = "int64",
      R"doc(Writes the unique keys of `keys` (of `key_dtype`: 'int64' or 'uint32', another
element type is TypeError), sorted, to the keyset file `path`, atomically. `format` 'embcache'
(header with checksum and key type) or 'hugectr_raw' (bare keys).)doc");
  m.def(
      "read_keyset",
      [](const std::string& path, const std::string& format,
         const std::string& key_dtype) -> py::object {
        const keyset_format f = keyset_format_of(format);
        if (is_uint32_keys(key_dtype)) {
          auto keys = take(without_gil([&] { return read_keyset<std::uint32_t>(path, f); }));
          const auto n = py::ssize_t(keys.size());
          return to_numpy(std::move(keys), {n});
        }
        auto keys = take(without_gil([&] { return read_keyset<key>(path, f); }));
        const auto n = py::ssize_t(keys.size());
        return to_numpy(std::move(keys), {n});
      },
      py::arg("path"), py::arg("format") = "embcache", py::arg("key_dtype") = "int64",
      R"doc(Reads a keyset file -> sorted unique keys of `key_dtype` ('int64' or 'uint32'). Magic,
version, key type (an 'embcache' file of the other key type is InvalidArgumentError), count,
checksum and order are checked (CorruptionError, InvalidArgumentError naming the file); a missing
file is NotFoundError.)doc");
  m.def(
      "owner_of",
      [](py::handle keys, int world, const std::string& key_dtype) {
        if (world < 1)
          throw py::value_error("world: expected >= 1 ranks, got " + std::to_string(world));
        const bool u32 = is_uint32_keys(key_dtype);
        array_arg k = array_arg::borrow(keys, "keys", u32 ? dtype::uint32 : dtype::int64, 1, false);
        py::array_t<std::int32_t> owners(py::ssize_t(k.size()));
        std::int32_t* o = owners.mutable_data();
        py::gil_scoped_release nogil;
        for (std::size_t i = 0; i < k.size(); ++i)
          o[i] = u32 ? owner_of(k.as<std::uint32_t>()[i], world) : owner_of(k.as<key>()[i], world);
        return owners;
      },
      py::arg("keys"), py::arg("world"), py::arg("key_dtype") = "int64",
      R"doc(The rank that owns each key among `world` ranks (C++ owner_of, distributed/ownership.hpp:
murmur3_fmix64(key ^ 0x6f776e6572) % world) -> int32 array: the key partition of a sharded run
(mpirun -n world embcache-train), whose rank r holds, stores, saves and exports the keys it
owns.)doc");
  m.def(
      "xxh64",
      [](py::buffer data, std::uint64_t seed) {
        const py::buffer_info b = data.request();
        if (!py::detail::compare_buffer_info<std::uint8_t>::compare(b) &&
            b.format != py::format_descriptor<char>::format())
          throw py::type_error("data: expected bytes or a uint8 buffer, got format '" + b.format +
                               "'");
        if (b.ndim != 1 || (b.ndim == 1 && b.strides[0] != 1))
          throw py::value_error("data: expected a contiguous 1-d byte buffer");
        const auto* p = static_cast<const std::uint8_t*>(b.ptr);
        const auto n = static_cast<std::size_t>(b.size);
        return without_gil([&] { return static_cast<std::uint64_t>(XXH64(p, n, seed)); });
      },
      py::arg("data"), py::arg("seed") = 0,
      R"doc(xxHash64 of the bytes of `data` (bytes, bytearray or a 1-d uint8 array) with `seed`: the
checksum of the trainer's dense.bin blobs (docs/model.md), so that Python writes and checks them.)doc");
  m.def(
      "read_shard_header",
      [](const std::string& path) {
        return header_dict(take(without_gil([&] { return read_shard_header(path); })));
      },
      py::arg("path"),
      "Reads and checks a shard's header -> dict(rows, num_crossed, record_size, checksum).");
  m.def(
      "read_dataset_manifest",
      [](const std::string& dir) {
        return manifest_dict(take(without_gil([&] { return read_dataset_manifest(dir); })));
      },
      py::arg("dir"),
      R"doc(Reads dir/manifest.json of a dataset folder -> dict(rows, label_mean, num_crossed,
keyset_format, unique_keys, unique_crossed_keys, shards=[dict(shard, keyset, crossed_keyset, rows,
keys, crossed_keys)], producer), full paths. Every field is checked (CorruptionError naming the
file and the field).)doc");

  py::class_<reader>(m, "ShardReader", R"doc(
Reads shards in order and yields batches (C++ shard_reader): dicts of arrays labels (n,), dense
(n, num_dense), keys (n, num_slots), crossed (n, num_crossed), rows (n,) and shard_index. The
shards must have num_dense dense features and num_slots slots (Criteo's 13 and 26 by default; a
dataset's are its manifest's num_dense and num_slots). A batch never spans two
shards; a shard is checked against its checksums before any of its samples is handed out.
)doc")
      .def(py::init([](std::vector<std::string> paths, std::size_t batch_size, bool shuffle,
                       std::uint64_t seed, bool drop_last, bool read_ahead, std::size_t num_dense,
                       std::size_t num_slots) {
             if (batch_size == 0) throw py::value_error("batch_size: expected >= 1, got 0");
             shard_reader_options o;
             o.batch_size = batch_size;
             o.shuffle = shuffle;
             o.seed = seed;
             o.drop_last = drop_last;
             o.read_ahead = read_ahead;
             o.num_dense = num_dense;
             o.num_slots = num_slots;
             return std::make_unique<reader>(
                 take(without_gil([&] { return shard_reader::open(std::move(paths), o); })));
           }),
           py::arg("paths"), py::arg("batch_size") = 1024, py::arg("shuffle") = false,
           py::arg("seed") = 0, py::arg("drop_last") = false, py::arg("read_ahead") = true,
           py::arg("num_dense") = criteo_dense_count, py::arg("num_slots") = criteo_slot_count,
           R"doc(Opens `paths` and checks every header (missing: NotFoundError; truncated:
CorruptionError; a different number of crossed keys, or another shape than num_dense and
num_slots: InvalidArgumentError naming the shard).)doc")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &reader::next)
      .def_property_readonly("total_rows", [](const reader& r) { return r.get().total_rows(); })
      .def_property_readonly("num_shards", [](const reader& r) { return r.get().num_shards(); })
      .def_property_readonly("num_crossed", [](const reader& r) { return r.get().num_crossed(); });
  m.attr("CRITEO_DENSE_COUNT") = criteo_dense_count;
  m.attr("CRITEO_SLOT_COUNT") = criteo_slot_count;
}

void bind_serving(py::module_& m) {
  m.def(
      "apply_deltas",
      [](const std::string& base_dir, const std::string& deltas_dir, py::object until,
         const std::string& output) {
        apply_options o;
        if (!until.is_none()) o.until = until.cast<std::uint64_t>();
        o.output = output;
        return report_dict(
            take(without_gil([&] { return apply_deltas(base_dir, deltas_dir, o); })));
      },
      py::arg("base_dir"), py::arg("deltas_dir"), py::arg("until") = py::none(),
      py::arg("output") = "",
      R"doc(embcache-apply: applies the delta-NNNNNN folders of `deltas_dir` that follow the model
`base_dir` (a save or its sparse/ folder) in order, atomically -> dict(model_dir, from_delta,
applied_delta, deltas, rows_written, rows_erased, state_dropped, changed, run_unchecked). `until`:
apply deltas numbered at most this. A gap or another run's delta is InvalidArgumentError.
`output`: write the result to this model folder instead of `base_dir` (required for a sharded save,
with `deltas_dir` a sharded run's export folder or "" for none; docs/serving.md).)doc");
}

}  // namespace embcache::python
