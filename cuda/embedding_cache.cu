// cuda-space instantiations of the embedding cache.
#include "embcache/cuda/algorithms.cuh"
// The algorithms header must come first: the definitions below call its for_each_index.
#include "embcache/detail/embedding_cache.inl"

namespace embcache {
template class embedding_cache<std::int64_t, cuda_space>;
template class embedding_cache<std::uint32_t, cuda_space>;
}  // namespace embcache
