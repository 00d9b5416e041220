// Lookup-only serving from Python: the rows of a served model (ModelRows over a model folder or
// trainer save, RedisRows over a Redis serving store; serving.hpp's row_lookup), the push of a
// model and its deltas into Redis (redis.hpp: embcache-apply --redis) and score_shard
// (trainer/score.hpp: embcache-serve's scoring). Calls release the GIL and are serialized per
// object.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "embcache/serving.hpp"
#include "errors.hpp"
#ifdef EMBCACHE_PYTHON_REDIS
#include "embcache/redis.hpp"
#endif
#ifdef EMBCACHE_PYTHON_TRAINER
#include "embcache/trainer/score.hpp"
#endif

namespace embcache::python {

namespace {

// A row_lookup as Python holds it, with the lock that serializes the calls of Python threads
// (score_shard holds it for the whole scoring).
struct rows_ref {
  virtual ~rows_ref() = default;
  /// dim of `table`; KeyError naming the table and the tables there are otherwise.
  virtual std::size_t dim_of(const std::string& table) const = 0;
  row_lookup& rows() { return *rows_; }
  std::unique_ptr<row_lookup> rows_;
  std::mutex calls;
};

[[noreturn]] void no_table(const std::string& table,
                           const std::vector<std::pair<std::string, std::size_t>>& dims) {
  std::string names;
  for (const auto& [name, dim] : dims) names += (names.empty() ? "'" : ", '") + name + "'";
  throw py::key_error("table '" + table + "' is not in the model (tables: " + names + ")");
}

// The rows of a model read whole into memory (read_base: a model folder, a trainer save, a sharded
// save): per table its keys sorted with their row index, found by binary search.
class folder_rows : public row_lookup {
 public:
  explicit folder_rows(model_folder m) : model_(std::move(m)) {
    for (std::size_t t = 0; t < model_.tables.size(); ++t) {
      const auto& ft = model_.tables[t];
      dims_.emplace_back(ft.name, ft.dim);
      auto& order = order_[ft.name];
      order.resize(ft.keys.size());
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::sort(order.begin(), order.end(),
                [&](std::size_t a, std::size_t b) { return ft.keys[a] < ft.keys[b]; });
      table_of_[ft.name] = t;
    }
  }

  status lookup(const std::string& table, std::size_t dim, const std::int64_t* keys, std::size_t n,
                float* rows, std::uint8_t* found) override {
    const auto it = table_of_.find(table);
    if (it == table_of_.end())
      return status::not_found("model " + model_.path + ": no table '" + table + "'");
    const folder_table& ft = model_.tables[it->second];
    if (ft.dim != dim)
      return status::invalid_argument("model " + model_.path + ": table '" + table + "' has dim " +
                                      std::to_string(ft.dim) + ", the lookup asks for " +
                                      std::to_string(dim));
    const auto& order = order_.at(table);
    for (std::size_t i = 0; i < n; ++i) {
      const auto pos =
          std::lower_bound(order.begin(), order.end(), keys[i],
                           [&](std::size_t r, std::int64_t k) { return ft.keys[r] < k; });
      found[i] = pos != order.end() && ft.keys[*pos] == keys[i];
      if (found[i]) std::copy_n(ft.vectors.data() + *pos * dim, dim, rows + i * dim);
    }
    return {};
  }

  const model_folder& model() const noexcept { return model_; }
  const std::vector<std::pair<std::string, std::size_t>>& dims() const noexcept { return dims_; }

 private:
  model_folder model_;
  std::vector<std::pair<std::string, std::size_t>> dims_;
  std::unordered_map<std::string, std::vector<std::size_t>> order_;
  std::unordered_map<std::string, std::size_t> table_of_;
};

struct model_rows_ref : rows_ref {
  folder_rows& get() const { return static_cast<folder_rows&>(*rows_); }
  std::size_t dim_of(const std::string& table) const override {
    for (const auto& [name, dim] : get().dims())
      if (name == table) return dim;
    no_table(table, get().dims());
  }
};

py::dict position_dict(const model_position& p) {
  py::dict versions;
  for (const auto& [table, version] : p.versions) versions[py::str(table)] = version;
  py::dict d;
  d["applied_delta"] = p.applied_delta;
  d["versions"] = versions;
  return d;
}

// rows.lookup(table, keys, out=None) -> (rows (n, dim), found (n,) bool).
py::tuple lookup(rows_ref& r, const std::string& table, py::handle keys, py::handle out) {
  const std::size_t dim = r.dim_of(table);
  auto k = array_arg::borrow(keys, "keys", dtype::int64, 1, false);
  const auto n = std::int64_t(k.size());
  auto rows = output::make(out, "out", dtype::float32, {n, std::int64_t(dim)});
  auto found = output::make(py::none(), "found", dtype::boolean, {n});
  status s;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(r.calls);
    static_assert(sizeof(bool) == sizeof(std::uint8_t), "found flags are bytes");
    s = r.rows().lookup(table, dim, k.as<std::int64_t>(), k.size(), rows.as<float>(),
                        reinterpret_cast<std::uint8_t*>(found.as<bool>()));
  }
  check(s);
  return py::make_tuple(rows.object, found.object);
}

#ifdef EMBCACHE_PYTHON_REDIS
struct redis_rows_ref : rows_ref {
  redis_options options;
  redis_rows& get() const { return static_cast<redis_rows&>(*rows_); }
  std::size_t dim_of(const std::string& table) const override {
    for (const auto& [name, dim] : get().model().dims)
      if (name == table) return dim;
    no_table(table, get().model().dims);
  }
};

redis_options redis_options_of(const std::string& address, const std::string& prefix,
                               const std::string& password, double timeout_seconds,
                               std::size_t batch_rows) {
  redis_options base;
  base.prefix = prefix;
  base.password = password;
  base.timeout_seconds = timeout_seconds;
  base.batch_rows = batch_rows;
  return take(parse_redis_address(address, base));
}

py::dict model_dict(const redis_model& m) {
  py::dict dims, rows;
  for (const auto& [table, dim] : m.dims) dims[py::str(table)] = dim;
  for (std::size_t t = 0; t < m.dims.size() && t < m.rows.size(); ++t)
    rows[py::str(m.dims[t].first)] = py::make_tuple(m.rows[t].first, m.rows[t].second);
  py::dict d = position_dict(m.position);
  d["key_type"] = to_string(m.key_type);
  d["dims"] = dims;
  d["run_id"] = m.run_id;
  d["rows"] = rows;
  return d;
}

py::dict push_dict(const redis_push_report& r) {
  py::dict d;
  d["base_pushed"] = r.base_pushed;
  d["from_delta"] = r.from_delta;
  d["applied_delta"] = r.applied_delta;
  d["deltas"] = r.deltas;
  d["rows_written"] = r.rows_written;
  d["keys_deleted"] = r.keys_deleted;
  d["run_unchecked"] = r.run_unchecked;
  return d;
}
#endif

#ifdef EMBCACHE_PYTHON_TRAINER
py::dict score(const std::string& save_dir, const std::string& shard, rows_ref& rows,
               std::size_t batch_size, std::size_t max_samples, int blas_threads) {
  score_options o;
  o.batch_size = batch_size;
  o.max_samples = max_samples;
  o.blas_threads = blas_threads;
  result<score_metrics> m = [&] {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(rows.calls);
    return score_shard(save_dir, shard, rows.rows(), o);
  }();
  const score_metrics s = take(std::move(m));
  py::dict d;
  d["samples"] = s.samples;
  d["auc"] = s.auc;  // NaN for a single class
  d["logloss"] = s.logloss;
  return d;
}
#endif

}  // namespace

void bind_scoring(py::module_& m) {
  py::class_<rows_ref>(m, "RowLookup", R"doc(
The rows of a served model for lookup-only scoring (C++ row_lookup, serving.hpp): ModelRows (a
model folder in memory) or RedisRows (a Redis serving store). Keys are int64.
)doc")
      .def("lookup", &lookup, py::arg("table"), py::arg("keys"), py::arg("out") = py::none(),
           R"doc(Embeddings of `keys` in `table` -> (rows (n, dim) float32, found (n,) bool); a key
the store does not hold leaves its row untouched (uninitialized in a new array) and found False.
KeyError for a table the model does not have.)doc")
      .def("dim", &rows_ref::dim_of, py::arg("table"), "Embedding floats per row of `table`.");

  py::class_<model_rows_ref, rows_ref>(m, "ModelRows", R"doc(
The embeddings of a model folder read into memory (C++ read_base and a row_lookup over it): a
save's sparse folder, a trainer save, an apply_deltas result or a sharded save, read with every
check load() makes. What score_shard scores without a Redis server.
)doc")
      .def(py::init([](const std::string& dir) {
             auto r = std::make_unique<model_rows_ref>();
             r->rows_ =
                 std::make_unique<folder_rows>(take(without_gil([&] { return read_base(dir); })));
             return r;
           }),
           py::arg("dir"),
           R"doc(Reads the model in `dir` (read_base: a sharded save, else model_folder_of(dir)).
NotFoundError, CorruptionError or InvalidArgumentError naming the file, as load() reports them.)doc")
      .def_property_readonly(
          "dims",
          [](const model_rows_ref& r) {
            py::dict d;
            for (const auto& [name, dim] : r.get().dims()) d[py::str(name)] = dim;
            return d;
          },
          "Table name -> dim, in the manifest's order.")
      .def_property_readonly(
          "position",
          [](const model_rows_ref& r) { return position_dict(position_of(r.get().model())); },
          "{'applied_delta': N, 'versions': {table: version}}: where the model stands in the run.")
      .def_property_readonly(
          "run_id", [](const model_rows_ref& r) { return r.get().model().run_id; },
          "The run identity the model records ('' when none).");

#ifdef EMBCACHE_PYTHON_REDIS
  py::class_<redis_rows_ref, rows_ref>(m, "RedisRows", R"doc(
The embeddings of a Redis serving store (C++ redis_rows, redis.hpp): HMGET per table and batch of
keys, each seeing one pushed delta wholly.
)doc")
      .def(
          py::init([](const std::string& address, const std::string& prefix,
                      const std::string& password, double timeout_seconds, std::size_t batch_rows) {
            auto r = std::make_unique<redis_rows_ref>();
            r->options = redis_options_of(address, prefix, password, timeout_seconds, batch_rows);
            r->rows_ = take(without_gil([&] { return redis_rows::connect(r->options); }));
            return r;
          }),
          py::arg("address"), py::arg("prefix") = "embcache", py::arg("password") = "",
          py::arg("timeout_seconds") = 10.0, py::arg("batch_rows") = 1000,
          R"doc(Connects to "HOST:PORT" (redis_options; InvalidArgumentError for a bad address),
reads the model's schema (NotFoundError when the store holds none under `prefix`) and checks that
every table holds the rows the last push recorded (CorruptionError). IoError naming the server
when it cannot be reached.)doc")
      .def_property_readonly(
          "model", [](const redis_rows_ref& r) { return model_dict(r.get().model()); },
          R"doc(The model as read at connect: dict(key_type, dims {table: dim}, applied_delta,
versions {table: version}, run_id, rows {table: (rows recorded at the last push, rows now)}).)doc")
      .def(
          "check_model",
          [](redis_rows_ref& r, const std::string& save_dir, bool allow_other_point) {
            check(without_gil([&] {
              return redis_check_model(r.get().model(), r.options, save_dir, allow_other_point);
            }));
          },
          py::arg("save_dir"), py::arg("allow_other_point") = false,
          R"doc(redis_check_model: the store's model must fit the trainer save `save_dir` (key
type, run identity, every table with its dim and rows, and, unless `allow_other_point`, each
table's version equal to the save's) before scoring with it; InvalidArgumentError naming what
differs.)doc");

  m.def(
      "redis_push",
      [](const std::string& address, const std::string& base_dir, const std::string& deltas_dir,
         const std::string& prefix, const std::string& password, py::object until,
         bool replace_base, double timeout_seconds, std::size_t batch_rows,
         double lock_lease_seconds) {
        redis_options o = redis_options_of(address, prefix, password, timeout_seconds, batch_rows);
        o.lock_lease_seconds = lock_lease_seconds;
        apply_options a;
        if (!until.is_none()) a.until = until.cast<std::uint64_t>();
        return push_dict(take(
            without_gil([&] { return redis_push(o, base_dir, deltas_dir, a, replace_base); })));
      },
      py::arg("address"), py::arg("base_dir"), py::arg("deltas_dir") = "",
      py::arg("prefix") = "embcache", py::arg("password") = "", py::arg("until") = py::none(),
      py::arg("replace_base") = false, py::arg("timeout_seconds") = 10.0,
      py::arg("batch_rows") = 1000, py::arg("lock_lease_seconds") = 60.0,
      R"doc(embcache-apply BASE DELTAS --redis HOST:PORT: pushes the model `base_dir` into the
store at `address` when it holds none under `prefix` (or with `replace_base`), then every delta of
`deltas_dir` ("" for none) that follows the store's position, each in one transaction, with
apply_deltas' rules (`until`: deltas numbered at most this) -> dict(base_pushed, from_delta,
applied_delta, deltas, rows_written, keys_deleted, run_unchecked). A refused delta stops the push
there (InvalidArgumentError); a second writer is refused as in use; IoError names the server and
the command.)doc");
  m.def(
      "redis_read_model",
      [](const std::string& address, const std::string& prefix, const std::string& password,
         double timeout_seconds) {
        const redis_options o = redis_options_of(address, prefix, password, timeout_seconds, 1000);
        return model_dict(take(without_gil([&] { return redis_read_model(o); })));
      },
      py::arg("address"), py::arg("prefix") = "embcache", py::arg("password") = "",
      py::arg("timeout_seconds") = 10.0,
      R"doc(The model the store holds, as RedisRows.model; NotFoundError when it holds none.)doc");
  m.attr("HAVE_REDIS") = true;
#else
  m.attr("HAVE_REDIS") = false;
#endif

#ifdef EMBCACHE_PYTHON_TRAINER
  m.def("score_shard", &score, py::arg("save_dir"), py::arg("shard"), py::arg("rows"),
        py::arg("batch_size") = 0, py::arg("max_samples") = 0, py::arg("blas_threads") = -1,
        R"doc(embcache-serve's scoring: AUC and log loss of `shard` with the dense network of the
trainer save `save_dir` (trainer.json, dense.bin) and the embeddings `rows` (ModelRows or
RedisRows) holds, lookup only -> dict(samples, auc, logloss). A key `rows` lacks pools as a zero
row, as the trainer's evaluation treats a key never trained, so the rows of the save's own model
give its evaluation to the bit. `batch_size`, `max_samples` 0: the save's; `blas_threads` -1: the
save's, 0: leave the process's (score_options; the setting is OpenBLAS's, for the whole process,
torch's CPU GEMMs included where torch uses the same OpenBLAS).)doc");
#endif
}

}  // namespace embcache::python
