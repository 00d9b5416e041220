// The extension module embcache._embcache; the package embcache (python/embcache) re-exports it.
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "embcache/version.hpp"
#include "errors.hpp"

PYBIND11_MODULE(_embcache, m) {
  namespace ep = embcache::python;
  m.doc() =
      "embcache from Python: the embedding cache, parameter stores, the training cache, "
      "the data readers and apply_deltas (bindings of the C++ library).";
  m.attr("__version__") = EMBCACHE_VERSION_STRING;
  m.attr("BUILT_WITH_CUDA") = bool(EMBCACHE_BUILT_WITH_CUDA);
  ep::bind_errors(m);
  ep::bind_cache(m);
#ifdef EMBCACHE_PYTHON_CUDA
  ep::bind_cuda_cache(m);
#endif
  ep::bind_stores(m);
  ep::bind_training(m);
  ep::bind_bags(m);
  ep::bind_data(m);
  ep::bind_serving(m);
  ep::bind_scoring(m);
}
