/// @file detail/cache_ref.hpp
/// @brief Deprecated: the view of the embedding cache is public now, embcache::embedding_cache_ref
/// (embcache/embedding_cache_ref.hpp). This header and its alias remain for code not yet moved.
#pragma once

#include "embcache/embedding_cache_ref.hpp"

namespace embcache::detail {

/// Deprecated name of embcache::embedding_cache_ref.
template <class Key>
using cache_ref
    [[deprecated("use embcache::embedding_cache_ref (embcache/embedding_cache_ref.hpp)")]] =
        embedding_cache_ref<Key>;

}  // namespace embcache::detail
