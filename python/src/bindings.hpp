// The parts of the extension module `embcache._embcache`, one function per concern.
#pragma once

#include <pybind11/pybind11.h>

namespace embcache::python {

namespace py = pybind11;

void bind_cache(py::module_& m);       // EmbeddingCache (cache_bindings.cpp)
void bind_cuda_cache(py::module_& m);  // CudaEmbeddingCache (cuda_cache_bindings.cpp; CUDA builds)
void bind_stores(py::module_& m);      // HostStore, RocksDBStore, LogStore (store_bindings.cpp)
void bind_training(py::module_& m);    // TrainingCache, TableOptions (training_bindings.cpp)
void bind_bags(py::module_& m);  // EmbeddingBag: pooling and the in-row update (bag_bindings.cpp)
void bind_data(py::module_& m);  // keysets, shards, dataset manifests (data_bindings.cpp)
void bind_serving(py::module_& m);  // apply_deltas (data_bindings.cpp)
// ModelRows, RedisRows, redis_push, score_shard (serving_bindings.cpp)
void bind_scoring(py::module_& m);

/// fn() with the GIL released (for calls that do not touch Python objects).
template <class Fn>
auto without_gil(Fn fn) {
  py::gil_scoped_release nogil;
  return fn();
}

}  // namespace embcache::python
