// TrainingCache: training_cache<int64, host_space> (training_cache.hpp) and TableOptions
// (table_options<int64>), and their uint32 twins TrainingCacheU32 and TableOptionsU32. Calls
// release the GIL and are serialized per cache.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "embcache/json.hpp"
#include "errors.hpp"
#include "names.hpp"
#include "store_ref.hpp"
#include "training_ref.hpp"

namespace embcache::python {

namespace {

// The keys of each array of `keysets` (Key, 1-d): the C++ call takes vectors, so they are copied.
template <class Key>
std::vector<std::vector<Key>> keysets_of(const py::sequence& keysets) {
  std::vector<std::vector<Key>> out;
  out.reserve(keysets.size());
  for (std::size_t i = 0; i < keysets.size(); ++i) {
    const std::string name = "keysets[" + std::to_string(i) + "]";
    array_arg a = array_arg::borrow(keysets[i], name.c_str(), key_dtype<Key>(), 1, false);
    out.emplace_back(a.as<Key>(), a.as<Key>() + a.size());
  }
  return out;
}

py::dict to_dict(const table_counters& c) {
  // The counters' JSON (embcache/json.hpp) is the one list of their names, and of when the
  // policies' counters appear (admission's, expiry's: only when on).
  const nlohmann::json j = c;
  py::dict d;
  for (const auto& [name, v] : j.items()) {
    if (v.is_number_unsigned())
      d[name.c_str()] = v.get<std::uint64_t>();
    else if (v.is_number_integer())
      d[name.c_str()] = v.get<std::int64_t>();
    else if (v.is_number_float())
      d[name.c_str()] = v.get<double>();
    else
      d[name.c_str()] = py::none();
  }
  return d;
}

template <class Key>
py::dict counters_dict(training_ref_of<Key>& r) {
  cache_counters c;
  {
    training_call call(r);
    c = r.cache->counters();
  }
  py::dict last, total;
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    last[py::str(c.tables[t])] = to_dict(c.last[t]);
    total[py::str(c.tables[t])] = to_dict(c.total[t]);
  }
  py::dict d;
  d["passes"] = c.passes;
  d["tables"] = c.tables;
  d["last"] = last;
  d["total"] = total;
  return d;
}

template <class Key>
std::unique_ptr<training_ref_of<Key>> make_training(std::vector<table_options<Key>> tables,
                                                    const std::string& mode,
                                                    const std::string& keyset_fmt,
                                                    std::size_t prefetch_batch, bool write_behind,
                                                    std::optional<bool> move_staged_rows) {
  training_cache_options o;
  o.mode = cache_mode_of(mode);
  o.keyset_fmt = keyset_format_of(keyset_fmt);
  o.prefetch_batch = prefetch_batch;
  o.write_behind = write_behind;
  o.move_staged_rows = move_staged_rows;
  auto r = std::make_unique<training_ref_of<Key>>();
  py::gil_scoped_release nogil;
  r->cache = std::make_unique<typename training_ref_of<Key>::cache_type>(o, std::move(tables));
  return r;
}

template <class Key, class Fn>
void with_status(training_ref_of<Key>& r, Fn fn) {
  status s;
  {
    training_call call(r);
    s = fn(*r.cache);
  }
  check(s);
}

template <class Key>
py::object lookup(training_ref_of<Key>& r, py::handle t, py::handle keys, py::handle out) {
  const std::size_t ti = r.index_of(t);
  array_arg k = array_arg::borrow(keys, "keys", key_dtype<Key>(), 1, false);
  auto slots = output::make(out, "out", dtype::int64, {std::int64_t(k.size())});
  with_status(
      r, [&](auto& c) { return c.lookup(ti, k.as<Key>(), k.size(), slots.as<std::int64_t>()); });
  return slots.object;
}

template <class Key>
py::object lookup_slots(training_ref_of<Key>& r, py::handle t, py::handle keys, py::handle out) {
  const std::size_t ti = r.index_of(t);
  array_arg k = array_arg::borrow(keys, "keys", key_dtype<Key>(), 1, false);
  auto slots = output::make(out, "out", dtype::int64, {std::int64_t(k.size())});
  with_status(r, [&](auto& c) {
    return c.cache(ti).lookup_slots(k.as<Key>(), k.size(), slots.as<std::int64_t>());
  });
  return slots.object;
}

// `slots` as an int64 array of slots of table ti (or -1); ValueError naming the first that is not.
template <class Key>
array_arg borrow_slots(training_ref_of<Key>& r, std::size_t ti, py::handle slots) {
  auto s = array_arg::borrow(slots, "slots", dtype::int64, 1, false);
  const std::int64_t cap = std::int64_t(r.cache->cache(ti).slots());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto v = s.as<std::int64_t>()[i];
    if (v < -1 || v >= cap)
      throw py::value_error("slots[" + std::to_string(i) + "]: " + std::to_string(v) +
                            " is not a slot of table " + std::to_string(ti));
  }
  return s;
}

template <class Key>
void mark_updated(training_ref_of<Key>& r, py::handle t, py::handle slots) {
  const std::size_t ti = r.index_of(t);
  array_arg s = borrow_slots(r, ti, slots);
  training_call call(r);
  r.cache->cache(ti).mark_updated(s.as<std::int64_t>(), s.size());
}

template <class Key>
py::array_t<std::int64_t> row_indices(training_ref_of<Key>& r, py::handle t, py::handle slots) {
  const std::size_t ti = r.index_of(t);
  array_arg s = borrow_slots(r, ti, slots);
  py::array_t<std::int64_t> out(py::ssize_t(s.size()));
  training_call call(r);
  r.cache->cache(ti).row_indices(s.as<std::int64_t>(), s.size(), out.mutable_data());
  return out;
}

template <class Key>
void assign(training_ref_of<Key>& r, py::handle t, py::handle keys, py::handle rows) {
  const std::size_t ti = r.index_of(t);
  array_arg k = array_arg::borrow(keys, "keys", key_dtype<Key>(), 1, false);
  auto w = array_arg::borrow(rows, "rows", dtype::float32, -1, false);
  w.require_rows(k.size(), r.cache->row_width(ti));
  with_status(r, [&](auto& c) { return c.assign(ti, k.as<Key>(), k.size(), w.as<float>()); });
}

template <class Key>
py::tuple read(training_ref_of<Key>& r, py::handle t, py::handle keys, py::handle out) {
  const std::size_t ti = r.index_of(t);
  array_arg k = array_arg::borrow(keys, "keys", key_dtype<Key>(), 1, false);
  const auto n = std::int64_t(k.size());
  auto rows = output::make(out, "out", dtype::float32, {n, std::int64_t(r.cache->row_width(ti))});
  auto found = output::make(py::none(), "found", dtype::boolean, {n});
  with_status(r, [&](auto& c) {
    return c.read(ti, k.as<Key>(), k.size(), rows.as<float>(), found.as<bool>());
  });
  return py::make_tuple(rows.object, found.object);
}

template <class Key>
void erase(training_ref_of<Key>& r, py::handle t, py::handle keys) {
  const std::size_t ti = r.index_of(t);
  array_arg k = array_arg::borrow(keys, "keys", key_dtype<Key>(), 1, false);
  with_status(r, [&](auto& c) { return c.erase(ti, k.as<Key>(), k.size()); });
}

template <class Key>
py::list export_incremental(training_ref_of<Key>& r, bool with_state) {
  result<std::vector<table_delta<Key>>> res = [&] {
    training_call call(r);
    return r.cache->export_incremental(with_state);
  }();
  auto deltas = take(std::move(res));
  py::list out;
  for (auto& d : deltas) {
    const auto n = py::ssize_t(d.keys.size());
    py::dict t;
    t["table"] = d.table;
    t["dim"] = d.dim;
    t["state_width"] = d.state_width;
    t["since_version"] = d.since_version;
    t["until_version"] = d.until_version;
    t["keys"] = to_numpy(std::move(d.keys), {n});
    t["vectors"] = to_numpy(std::move(d.vectors), {n, py::ssize_t(d.dim)});
    t["states"] = to_numpy(std::move(d.states), {with_state ? n : 0, py::ssize_t(d.state_width)});
    t["versions"] = to_numpy(std::move(d.versions), {n});
    const auto e = py::ssize_t(d.erased.size());
    t["erased"] = to_numpy(std::move(d.erased), {e});
    out.append(t);
  }
  return out;
}

template <class Key>
void save(training_ref_of<Key>& r, const std::string& dir, py::object on_progress) {
  std::unique_ptr<py::error_already_set> raised;
  save_progress progress;
  if (!on_progress.is_none()) {
    progress = [&](std::uint64_t done, std::uint64_t total) {
      py::gil_scoped_acquire gil;
      if (raised) return;
      try {
        on_progress(done, total);
      } catch (py::error_already_set& e) {
        raised = std::make_unique<py::error_already_set>(std::move(e));
      }
    };
  }
  status s;
  {
    training_call call(r);
    s = r.cache->save(dir, progress);
  }
  check(s);
  if (raised) throw std::move(*raised);
}

template <class Key>
table_options<Key> make_table(const std::string& name, std::size_t dim, std::size_t capacity,
                              const py::dict& optimizer, std::size_t slots,
                              std::size_t max_resident, const std::string& init, float init_scale,
                              std::uint64_t seed, const std::string& scores, py::object store,
                              py::object admission, py::object expiry) {
  table_options<Key> o;
  o.name = name;
  o.dim = dim;
  o.capacity = capacity;
  o.optimizer = optimizer_options_of(optimizer);
  o.slots = slots;
  o.max_resident = max_resident;
  o.init.kind = init_kind_of(init);
  o.init.scale = init_scale;
  o.init.seed = seed;
  o.scores = score_policy_of(scores);
  if (!store.is_none()) {
    // A store of the other key type would be a cast error: say which class is expected.
    if (!py::isinstance<store_ref_of<Key>>(store))
      throw py::type_error(std::string("store: expected a ParamStore") + key_suffix<Key>() + " (" +
                           to_string(key_dtype<Key>()) + " keys), got " +
                           std::string(Py_TYPE(store.ptr())->tp_name));
    o.store = store.cast<store_ref_of<Key>&>().store;
  }
  o.admission = admission_options_of(admission);
  o.expiry = expiry_options_of(expiry);
  return o;
}

template <class Key>
void bind_training_classes(py::module_& m) {
  using tables_options = table_options<Key>;
  using training_ref = training_ref_of<Key>;
  const std::string sfx = key_suffix<Key>();
  const std::string k = to_string(key_dtype<Key>());
  const std::string options_doc =
      "\nOptions of one table of a TrainingCache" + sfx + " (C++ table_options<" + k + "_t>).\n";
  py::class_<tables_options>(m, ("TableOptions" + sfx).c_str(), options_doc.c_str())
      .def(py::init(&make_table<Key>), py::arg("name"), py::arg("dim"), py::arg("capacity"),
           py::arg("optimizer") = py::dict(), py::arg("slots") = 0, py::arg("max_resident") = 0,
           py::arg("init") = "uniform", py::arg("init_scale") = 0.05f, py::arg("seed") = 0,
           py::arg("scores") = "lru", py::arg("store") = py::none(),
           py::arg("admission") = py::none(), py::arg("expiry") = py::none(),
           R"doc(`name` (required, unique, usable as a folder name); `dim` embedding floats per
row (>= 1); `capacity` most distinct keys of a keyset or lookup batch (>= 1); `optimizer` a dict of
optimizer_options fields ({'kind': 'adam', 'learning_rate': 0.01, ...}; default sgd, lr 0.001);
`slots` device-table slots (0: capacity * 5/4); `max_resident` rows kept between passes (0:
capacity * 9/8); `init`/`init_scale`/`seed` the initializer (uniform(-0.05, 0.05), seed 0; the
table index is folded into the seed); `scores` 'lru' | 'lfu' (on-demand eviction); `store` a
ParamStore of row width dim + state width (None: a new HostStore); `admission` a dict of
admission_options fields ({'min_count': 2} or {'probability': 0.1}, with sketch_width,
sketch_depth, seed; None: off): a key gets a row only once admitted, and until then lookups give
slot -1; `expiry` a dict of expiry_options fields ({'ttl_passes': 7, 'min_l2_norm': 0.0}; None:
off): rows untouched for ttl_passes pass boundaries leave at a boundary, as tombstones of the next
export.)doc")
      .def_readonly("name", &tables_options::name)
      .def_readonly("dim", &tables_options::dim)
      .def_readonly("capacity", &tables_options::capacity)
      .def_readonly("slots", &tables_options::slots)
      .def_readonly("max_resident", &tables_options::max_resident)
      .def_property_readonly("optimizer",
                             [](const tables_options& o) { return python::to_dict(o.optimizer); })
      .def_property_readonly(
          "state_width",
          [](const tables_options& o) { return state_width(o.optimizer.kind, o.dim); })
      .def_property_readonly("admission",
                             [](const tables_options& o) { return python::to_dict(o.admission); })
      .def_property_readonly("expiry",
                             [](const tables_options& o) { return python::to_dict(o.expiry); });

  const std::string cache_doc =
      "\nThe training cache of several tables (C++ training_cache<" + k +
      "_t, host_space>): per table a\ndevice cache in front of a parameter store, swapped per pass "
      "from keysets (with background\nprefetch) or filled on demand, with incremental export, save "
      "and load. Keys are " +
      k +
      " arrays\n(another key type is TypeError). Rows are dim + state width floats (the embedding, "
      "then the\nsparse optimizer's state). Tables are named by index or by name. Calls release "
      "the GIL; calls\nfrom several Python threads are serialized (one caller drives the cache).\n";
  py::class_<training_ref>(m, ("TrainingCache" + sfx).c_str(), cache_doc.c_str())
      .def(py::init(&make_training<Key>), py::arg("tables"), py::arg("mode") = "keyset",
           py::arg("keyset_format") = "embcache", py::arg("prefetch_batch") = 65536,
           py::arg("write_behind") = true, py::arg("move_staged_rows") = py::none(),
           R"doc(Builds the caches and, where none is given, the host stores
(training_cache_options: `mode` 'keyset' | 'on_demand'; `keyset_format` 'embcache' |
'hugectr_raw' for the *_files calls; `prefetch_batch` keys per store pull while staging (65536);
`write_behind` pushes the rows leaving at a boundary in the background (True);
`move_staged_rows` moves staged rows in and leaving rows out at a keyset boundary by index
instead of copying them (None: the library's default, True for these host caches): the row of
slot s is row_pool(t)[row_indices(t, s)]; EmbeddingBag translates by itself).
InvalidArgumentError for an empty or repeated name, a zero dim or capacity, bad optimizer options
or a store of another row width.)doc")
      .def_property_readonly("num_tables",
                             [](const training_ref& r) { return r.cache->num_tables(); })
      .def_property_readonly("table_names",
                             [](const training_ref& r) {
                               std::vector<std::string> names;
                               for (std::size_t t = 0; t < r.cache->num_tables(); ++t)
                                 names.push_back(r.cache->table(t).name);
                               return names;
                             })
      .def_property_readonly(
          "mode", [](const training_ref& r) { return to_string(r.cache->options().mode); })
      .def(
          "table_index",
          [](const training_ref& r, const std::string& name) {
            return take(r.cache->table_index(name));
          },
          py::arg("name"), "Index of the table called `name`; NotFoundError otherwise.")
      .def(
          "table",
          [](const training_ref& r, py::handle t) { return r.cache->table(r.index_of(t)); },
          py::arg("t"), "Options of table `t` (init seed as given).")
      .def(
          "row_width",
          [](const training_ref& r, py::handle t) { return r.cache->row_width(r.index_of(t)); },
          py::arg("t"), "Floats per row of table `t`.")
      .def(
          "begin_pass",
          [](training_ref& r, const py::sequence& keysets) {
            auto k = keysets_of<Key>(keysets);
            with_status(r, [&](auto& c) { return c.begin_pass(k); });
          },
          py::arg("keysets"),
          R"doc(Keyset mode: makes every key of keysets[t] (key_dtype arrays, one per table, any
order, repeats allowed) resident in table t. CapacityExceededError for a keyset larger than its
table's capacity, InvalidArgumentError for a count other than num_tables, before anything
changes.)doc")
      .def(
          "begin_pass_files",
          [](training_ref& r, const std::vector<std::string>& paths) {
            with_status(r, [&](auto& c) { return c.begin_pass_files(paths); });
          },
          py::arg("paths"), "begin_pass with keysets read from files (one per table).")
      .def(
          "prefetch",
          [](training_ref& r, const py::sequence& keysets) {
            auto k = keysets_of<Key>(keysets);
            with_status(r, [&](auto& c) { return c.prefetch(k); });
          },
          py::arg("keysets"),
          R"doc(Starts staging, in a background thread, the rows of the next pass's keysets that
are not resident, so that the next begin_pass moves only the difference. Until then update in
place only rows of the current pass's keyset.)doc")
      .def(
          "prefetch_files",
          [](training_ref& r, const std::vector<std::string>& paths) {
            with_status(r, [&](auto& c) { return c.prefetch_files(paths); });
          },
          py::arg("paths"), "prefetch with keysets read from files.")
      .def_property_readonly(
          "prefetch_pending", [](const training_ref& r) { return r.cache->prefetch_pending(); },
          "Whether a prefetch is staged or running.")
      .def("lookup", &lookup<Key>, py::arg("t"), py::arg("keys"), py::arg("out") = py::none(),
           R"doc(On-demand mode: makes the keys resident and returns each key's slot (int64; its
row is row_pool(t)[slot]: on-demand caches move no rows). Misses are pulled or initialized, victims written back.
CapacityExceededError for more distinct keys than the capacity.)doc")
      .def("lookup_slots", &lookup_slots<Key>, py::arg("t"), py::arg("keys"),
           py::arg("out") = py::none(),
           R"doc(Slot of each key in table t's device cache, -1 for a key not resident (keyset
mode: a key outside the pass's keyset). Nothing is fetched.)doc")
      .def(
          "row_pool",
          [](py::object self, py::handle t) {
            auto& r = self.cast<training_ref&>();
            auto& c = r.cache->cache(r.index_of(t));
            return rows_view(c.row_pool(), c.row_count(), c.row_width(), self);
          },
          py::arg("t"),
          R"doc(Table t's row pool as a (rows, row_width) float32 array without a copy, indexed by
row, not by slot: the row of slot s is row_pool(t)[row_indices(t, s)] (rows move between slots
at keyset boundaries, move_staged_rows). After an in-place update call mark_updated(t, slots).)doc")
      .def("row_indices", &row_indices<Key>, py::arg("t"), py::arg("slots"),
           R"doc(The index in row_pool(t) of the row each slot holds (int64; -1 stays -1): the
slot itself when the cache moves no rows (move_staged_rows=False, on-demand mode). Valid until the
next begin_pass.)doc")
      .def("mark_updated", &mark_updated<Key>, py::arg("t"), py::arg("slots"),
           "Marks rows updated in place through row_pool(t) (they become dirty, exported, written "
           "back).")
      .def("assign", &assign<Key>, py::arg("t"), py::arg("keys"), py::arg("rows"),
           R"doc(Overwrites the rows of resident keys and marks them updated; NotFoundError for a
key that is not resident (nothing written).)doc")
      .def("read", &read<Key>, py::arg("t"), py::arg("keys"), py::arg("out") = py::none(),
           R"doc(Current row of each key -> (rows, found): from the device when resident, else from
the store.)doc")
      .def("erase", &erase<Key>, py::arg("t"), py::arg("keys"),
           "Removes keys from the cache and the store; the next export reports them erased.")
      .def(
          "expire", [](training_ref& r) { with_status(r, [](auto& c) { return c.expire(); }); },
          R"doc(A pass boundary of expiry for every table with expiry on (on-demand mode's
boundaries; in keyset mode every begin_pass is one): the expired rows leave the cache and the
store and are tombstones (`erased`) of the next export.)doc")
      .def(
          "begin_step",
          [](training_ref& r) {
            training_call call(r);
            r.cache->begin_step();
          },
          R"doc(Marks the start of a training step, the clock of expiry's `ttl_steps` (C++
begin_step). Call it once before each step's lookups when a table has ttl_steps on; for tables
with ttl_steps 0 it does nothing.)doc")
      .def(
          "default_row",
          [](training_ref& r, py::handle t, std::uint64_t slot) {
            const std::size_t i = r.index_of(t);
            py::array_t<float> out(py::ssize_t(r.cache->table(i).dim));
            r.cache->default_row(i, slot, out.mutable_data());
            return out;
          },
          py::arg("t"), py::arg("slot"),
          R"doc(The row a refused key of feature slot `slot` reads in table t (float32, dim):
zeros unless the table's admission has default_row 'slot', then the slot's fixed row drawn from
the table's initializer (C++ default_row).)doc")
      .def(
          "end_training",
          [](training_ref& r) { with_status(r, [](auto& c) { return c.end_training(); }); },
          "Writes every dirty resident row back and flushes the stores; rows stay resident.")
      .def("export_incremental", &export_incremental<Key>, py::arg("with_state") = false,
           R"doc(Rows changed since the previous export, per table: a list of dicts (table, dim,
state_width, since_version, until_version, keys, vectors (n, dim), states, versions, erased).)doc")
      .def(
          "export_incremental_to",
          [](training_ref& r, const std::string& dir, bool with_state, std::uint64_t number) {
            result<std::string> res = [&] {
              training_call call(r);
              return r.cache->export_incremental_to(dir, with_state, number);
            }();
            return take(std::move(res));
          },
          py::arg("dir"), py::arg("with_state") = false, py::arg("number") = 0,
          R"doc(export_incremental written as the folder dir/delta-NNNNNN (NNNNNN = `number`, or
one past the highest there); returns its path.)doc")
      .def("save", &save<Key>, py::arg("dir"), py::arg("on_progress") = py::none(),
           R"doc(end_training, then writes `dir`: per table a HugeCTR sparse model folder (key,
emb_vector, the optimizer's state files, version, slot_id when known) and manifest.json with
checksums, built beside `dir` and renamed into place. on_progress(rows_done, rows_total).)doc")
      .def(
          "load",
          [](training_ref& r, const std::string& dir, bool allow_hugectr_folder,
             bool allow_duplicate_keys, bool allow_non_finite) {
            load_options o;
            o.allow_hugectr_folder = allow_hugectr_folder;
            o.allow_duplicate_keys = allow_duplicate_keys;
            o.allow_non_finite = allow_non_finite;
            with_status(r, [&](auto& c) { return c.load(dir, o); });
          },
          py::arg("dir"), py::arg("allow_hugectr_folder") = false,
          py::arg("allow_duplicate_keys") = false, py::arg("allow_non_finite") = false,
          R"doc(Replaces every table's rows with those of a folder written by save(); its manifest
is checked (NotFoundError when missing, CorruptionError for a bad size or checksum). Everything is
validated before anything changes.)doc")
      .def(
          "set_slot_ids",
          [](training_ref& r, py::handle t, py::handle keys, py::handle slot_ids) {
            const std::size_t ti = r.index_of(t);
            array_arg ks = array_arg::borrow(keys, "keys", key_dtype<Key>(), 1, false);
            auto s = array_arg::borrow(slot_ids, "slot_ids", dtype::uint64, 1, false);
            s.require_size(ks.size(), "one slot id per key");
            with_status(r, [&](auto& c) {
              return c.set_slot_ids(ti, ks.as<Key>(), s.as<std::uint64_t>(), ks.size());
            });
          },
          py::arg("t"), py::arg("keys"), py::arg("slot_ids"),
          "Records the slot id of each key of table t, for the slot_id file of save().")
      .def(
          "slot_id",
          [](training_ref& r, py::handle t, Key key) {
            return take(r.cache->slot_id(r.index_of(t), key));
          },
          py::arg("t"), py::arg("key"),
          "The slot id save() writes for `key`; NotFoundError if none.")
      .def_property_readonly("counters", &counters_dict<Key>,
                             R"doc(Counters as a dict: passes, tables, and per table name the last
pass's ('last') and the totals ('total'): hits, misses, rows_pulled, rows_staged, rows_pushed,
rows_evicted, bytes and seconds per tier.)doc")
      .def_property_readonly(
          "run_id", [](const training_ref& r) { return r.cache->run_id(); },
          "The identity of the run recorded in every save and delta.")
      .def(
          "set_run_id",
          [](training_ref& r, const std::string& id) {
            with_status(r, [&](auto& c) { return c.set_run_id(id); });
          },
          py::arg("id"), "Makes `id` (32 lowercase hex digits) the run identity.")
      .def_property_readonly_static(
          "key_dtype", [](py::object) { return to_string(key_dtype<Key>()); },
          "NumPy name of the key type ('int64' or 'uint32').");
}

}  // namespace

void bind_training(py::module_& m) {
  bind_training_classes<std::int64_t>(m);
  bind_training_classes<std::uint32_t>(m);
}

}  // namespace embcache::python
