// cuda-space instantiations of the training cache. The orchestration is host code; it reaches the
// device caches through their bulk calls, so this file needs no CUDA compiler.
#include "training/training_cache_definitions.hpp"

namespace embcache {
template class training_cache<std::int64_t, cuda_space>;
template class training_cache<std::uint32_t, cuda_space>;
}  // namespace embcache
