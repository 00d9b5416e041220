// Host-space instantiations of the embedding cache.
#include "embcache/detail/embedding_cache.inl"

namespace embcache {
template class embedding_cache<std::int64_t, host_space>;
template class embedding_cache<std::uint32_t, host_space>;
}  // namespace embcache
