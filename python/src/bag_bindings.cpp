// EmbeddingBag: pooling of one table's rows of a TrainingCache (lookup_combine, sparse_ops.hpp)
// and its backward, the table's sparse optimizer applied in the cache's rows (aggregate_gradients,
// apply_optimizer, mark_updated), as the C++ trainer's cache path does. The torch module
// (embcache/torch.py) drives it from an autograd function. EmbeddingBagU32: the same over a
// TrainingCacheU32 (uint32 keys). A key that the table's admission refused (slot -1) reads zeros
// or its feature slot's default row and gets no gradient, as in the trainer's cache path.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "embcache/admission.hpp"
#include "embcache/optimizers.hpp"
#include "embcache/slot_rows.hpp"
#include "embcache/sparse_ops.hpp"
#include "errors.hpp"
#include "names.hpp"
#include "training_ref.hpp"

namespace embcache::python {

namespace {

template <class Key>
class embedding_bag {
 public:
  embedding_bag(py::object cache, py::handle table, const std::string& mode)
      : owner_(std::move(cache)), comb_(combiner_of(mode)) {
    if (!py::isinstance<training_ref_of<Key>>(owner_))
      throw py::type_error(std::string("cache: expected a TrainingCache") + key_suffix<Key>() +
                           " (" + to_string(key_dtype<Key>()) + " keys), got " +
                           std::string(Py_TYPE(owner_.ptr())->tp_name));
    auto& r = owner_.cast<training_ref_of<Key>&>();
    ref_ = &r;
    table_ = r.index_of(table);
    dim_ = r.cache->table(table_).dim;
    optimizer_ = r.cache->table(table_).optimizer;
  }

  // Pools the bags of `keys` (offsets: num_bags + 1 int64, CSR; None: one key per bag) into
  // `out` (num_bags, dim) and keeps the batch for backward(). The bags are sample-major over
  // `num_slots` feature slots: bag b is slot b % num_slots, whose default row its refused keys
  // read.
  py::object forward(py::handle keys, py::handle offsets, py::handle out, std::int64_t num_slots) {
    array_arg k = array_arg::borrow(keys, "keys", key_dtype<Key>(), 1, false);
    const std::size_t n = k.size();
    if (offsets.is_none()) {
      offsets_.resize(n + 1);
      for (std::size_t i = 0; i <= n; ++i) offsets_[i] = std::int64_t(i);
    } else {
      auto o = array_arg::borrow(offsets, "offsets", dtype::int64, 1, false);
      if (o.size() == 0) throw py::value_error("offsets: expected num_bags + 1 entries, got 0");
      offsets_.assign(o.as<std::int64_t>(), o.as<std::int64_t>() + o.size());
    }
    const std::size_t bags = offsets_.size() - 1;
    if (num_slots < 1)
      throw py::value_error("num_slots: expected >= 1, got " + std::to_string(num_slots));
    if (bags % std::uint64_t(num_slots) != 0)
      throw py::value_error("num_slots: " + std::to_string(num_slots) + " does not divide the " +
                            std::to_string(bags) + " bags (num_bags must be batch * num_slots)");
    const std::size_t slots = std::size_t(num_slots);
    auto pooled =
        output::make(out, "out", dtype::float32, {std::int64_t(bags), std::int64_t(dim_)});
    slots_.resize(n);
    status s;
    {
      training_call call(*ref_);
      s = find_slots(k.as<Key>(), n);
      if (s.ok()) {
        auto& c = ref_->cache->cache(table_);
        batch_ = {bags / slots, slots, offsets_.data(), slots_.data(), n};
        s = check_batch(batch_, c.slots());
        if (s.ok())
          lookup_combine(host_space{}, c.row_pool(), c.row_width(), dim_, over_rows(c, batch_),
                         comb_, pooled.as<float>(), default_rows(bags == 0 ? 0 : slots));
      }
    }
    if (!s.ok()) {
      batch_ = {};
      check(s.with_context("EmbeddingBag(" + ref_->cache->table(table_).name + ").forward"));
    }
    return pooled.object;
  }

  // The optimizer step with `grad` (num_bags, dim), the gradient of the loss with respect to the
  // last forward's output; returns the number of rows updated.
  std::size_t backward(py::handle grad) {
    if (batch_.offsets == nullptr)
      throw py::value_error("EmbeddingBag.backward: no forward since the last backward");
    auto g = array_arg::borrow(grad, "grad", dtype::float32, -1, false);
    g.require_rows(batch_.num_bags(), dim_);
    const float* d = g.as<float>();
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (!std::isfinite(d[i]))
        throw py::value_error("grad: non-finite value " + std::to_string(d[i]) + " at bag " +
                              std::to_string(i / dim_) + ", column " + std::to_string(i % dim_) +
                              " (table " + ref_->cache->table(table_).name + ")");
    }
    std::size_t rows = 0;
    {
      training_call call(*ref_);
      auto& c = ref_->cache->cache(table_);
      aggregate_gradients(host_space{}, batch_, comb_, d, dim_, grads_);
      ++step_;
      update_rows(c, step_);
      rows = grads_.size;
    }
    batch_ = {};
    return rows;
  }

  // The slots of the last forward's keys.
  py::array_t<std::int64_t> last_slots() const {
    py::array_t<std::int64_t> a(py::ssize_t(slots_.size()));
    std::copy(slots_.begin(), slots_.end(), a.mutable_data());
    return a;
  }

  // The baseline of benchmarks/python/bench_overhead.py: the fastest of `repeats` rounds of
  // forward and backward (gradient `grad_value` everywhere) of one-key bags of `keys`, in seconds,
  // all in C++.
  double time_cpp(py::handle keys, float grad_value, int repeats) {
    array_arg k = array_arg::borrow(keys, "keys", key_dtype<Key>(), 1, false);
    const std::size_t n = k.size();
    std::vector<float> pooled(n * dim_), grad(n * dim_, grad_value);
    offsets_.resize(n + 1);
    for (std::size_t i = 0; i <= n; ++i) offsets_[i] = std::int64_t(i);
    slots_.resize(n);
    training_call call(*ref_);
    auto& c = ref_->cache->cache(table_);
    double best = 0;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      check(find_slots(k.as<Key>(), n));
      batch_ = {n, 1, offsets_.data(), slots_.data(), n};
      lookup_combine(host_space{}, c.row_pool(), c.row_width(), dim_, over_rows(c, batch_), comb_,
                     pooled.data(), default_rows(1));
      aggregate_gradients(host_space{}, batch_, comb_, grad.data(), dim_, grads_);
      update_rows(c, ++step_);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r == 0 || s < best) best = s;
    }
    batch_ = {};
    return best;
  }

  std::uint64_t step() const noexcept { return step_; }
  void set_step(std::uint64_t s) noexcept { step_ = s; }
  std::size_t dim() const noexcept { return dim_; }
  std::size_t table() const noexcept { return table_; }

 private:
  using cache_type = embedding_cache<Key, host_space>;

  // The batch over the rows its slots hold (the slots themselves unless the cache moves rows by
  // index: TrainingCache(move_staged_rows=True)).
  slot_batch over_rows(const cache_type& c, const slot_batch& b) {
    slot_batch r = b;
    r.row_indices = batch_rows_.of(c, b.row_indices, b.num_indices, host_space{});
    return r;
  }

  // The optimizer in the rows of grads_'s unique slots, which are then marked updated.
  void update_rows(cache_type& c, std::uint64_t step) {
    apply_optimizer(host_space{}, optimizer_, c.row_pool(), c.row_width(), grads_.dim,
                    updated_rows_.of(c, grads_.rows.data(), grads_.size, host_space{}),
                    grads_.values.data(), grads_.size, step);
    c.mark_updated(grads_.rows.data(), grads_.size);
  }

  // Keyset mode: the pass's keyset must hold every key, except that with the table's admission on
  // a key without a row is one the pass refused (slot -1), as the trainer's keyset path takes it;
  // on-demand: misses are fetched, refused keys get slot -1.
  status find_slots(const Key* keys, std::size_t n) {
    auto& tc = *ref_->cache;
    if (tc.options().mode == cache_mode::on_demand)
      return tc.lookup(table_, keys, n, slots_.data());
    EMBCACHE_RETURN_IF_ERROR(tc.cache(table_).lookup_slots(keys, n, slots_.data()));
    if (tc.table(table_).admission.enabled()) return {};
    for (std::size_t i = 0; i < n; ++i) {
      if (slots_[i] < 0)
        return status::not_found("key " + std::to_string(keys[i]) +
                                 " of the batch is not in the pass's keyset");
    }
    return {};
  }

  // What a refused key (slot -1) of slot s < num_slots reads, as the trainer's cache path hands
  // lookup_combine: nullptr (zeros) unless the table's admission is on with default_row 'slot',
  // else slot s's row (training_cache::default_row) at s * dim. A slot's row does not depend on
  // the slot count, so rows drawn once are kept and only new slots are drawn.
  const float* default_rows(std::size_t num_slots) {
    const admission_options& a = ref_->cache->table(table_).admission;
    if (!a.enabled() || a.default_row != refused_row::slot) return nullptr;
    const std::size_t drawn = default_rows_.size() / dim_;
    if (drawn < num_slots) {
      default_rows_.resize(num_slots * dim_);
      for (std::size_t s = drawn; s < num_slots; ++s)
        ref_->cache->default_row(table_, s, default_rows_.data() + s * dim_);
    }
    return default_rows_.data();
  }

  py::object owner_;  // keeps the TrainingCache alive
  training_ref_of<Key>* ref_ = nullptr;
  std::size_t table_ = 0;
  std::size_t dim_ = 0;
  combiner comb_;
  optimizer_options optimizer_;
  std::vector<std::int64_t> offsets_, slots_;
  slot_rows<Key> batch_rows_, updated_rows_;  // the rows of slots_, of grads_.rows
  std::vector<float> default_rows_;  // slot s's default row at s * dim (default_rows())
  slot_batch batch_;
  sparse_gradients<host_space> grads_;
  std::uint64_t step_ = 0;
};

template <class Key>
void bind_bag_class(py::module_& m) {
  using embedding_bag = python::embedding_bag<Key>;
  const std::string sfx = key_suffix<Key>();
  const std::string doc =
      "\nPooling of one table of a TrainingCache" + sfx +
      " and its in-row optimizer step (C++ lookup_combine,\naggregate_gradients, apply_optimizer "
      "on the cache's rows). forward() pools the bags of a batch;\nbackward() applies the table's "
      "sparse optimizer to the rows of the last forward's batch and marks\nthem updated. "
      "embcache.torch.EmbeddingBagCollection wraps EmbeddingBag as a torch module.\n";
  py::class_<embedding_bag>(m, ("EmbeddingBag" + sfx).c_str(), doc.c_str())
      .def(py::init<py::object, py::handle, const std::string&>(), py::arg("cache"),
           py::arg("table"), py::arg("mode") = "sum",
           "Pools table `table` (index or name) of `cache`; `mode` 'sum' | 'mean'.")
      .def("forward", &embedding_bag::forward, py::arg("keys"), py::arg("offsets") = py::none(),
           py::arg("out") = py::none(), py::arg("num_slots") = 1,
           R"doc(Pools the rows of `keys` (the cache's key type) per bag into a (num_bags, dim)
float32 array. `offsets` (int64, num_bags + 1, CSR: bag b holds keys[offsets[b]:offsets[b+1]]) or
None (one key per bag). Keyset mode: a key outside the pass's keyset is NotFoundError naming it
(with the table's admission on, it is a key the pass refused); on-demand mode: misses are fetched.
A key the table's admission refused has no row: it reads zeros, or with admission's
default_row 'slot' its feature slot's default row (TrainingCache.default_row), and gets no
gradient. The bags are sample-major over `num_slots` slots (num_bags = batch * num_slots): bag b
is slot b % num_slots, as in the C++ trainer's batches.)doc")
      .def("backward", &embedding_bag::backward, py::arg("grad"),
           R"doc(Applies the table's sparse optimizer with `grad` (num_bags, dim), the gradient of
the loss with respect to the last forward's output; returns the number of rows updated. A
non-finite gradient is ValueError (nothing changes).)doc")
      .def("_time_cpp", &embedding_bag::time_cpp, py::arg("keys"), py::arg("grad_value") = 0.0f,
           py::arg("repeats") = 10,
           "Benchmark baseline: the fastest of `repeats` C++ forward+backward rounds, in seconds.")
      .def_property_readonly("last_slots", &embedding_bag::last_slots,
                             "The cache slots of the last forward's keys.")
      .def_property("step", &embedding_bag::step, &embedding_bag::set_step,
                    "Optimizer steps applied (Adam's bias correction uses it).")
      .def_property_readonly("dim", &embedding_bag::dim)
      .def_property_readonly("table", &embedding_bag::table);
}

}  // namespace

void bind_bags(py::module_& m) {
  bind_bag_class<std::int64_t>(m);
  bind_bag_class<std::uint32_t>(m);
}

}  // namespace embcache::python
