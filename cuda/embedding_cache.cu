// cuda-space instantiations of the embedding cache.
#include "embcache/cuda/algorithms.cuh"
// The algorithms header and the warp-cooperative overloads must come first: the definitions below
// call for_each_index, and find and lookup_slots pick the warp-per-key overloads.
#include "embcache/cuda/embedding_cache_ref.cuh"
#include "embcache/detail/embedding_cache.inl"

namespace embcache {
template class embedding_cache<std::int64_t, cuda_space>;
template class embedding_cache<std::uint32_t, cuda_space>;
}  // namespace embcache
