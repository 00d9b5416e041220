// cuda-space instantiations of the embedding cache.
// The definitions bring the cuda primitives and the warp-per-key overloads of find and
// lookup_slots themselves (detail/space_algorithms.hpp).
#include "embcache/detail/embedding_cache.inl"

namespace embcache {
template class embedding_cache<std::int64_t, cuda_space>;
template class embedding_cache<std::uint32_t, cuda_space>;
}  // namespace embcache
