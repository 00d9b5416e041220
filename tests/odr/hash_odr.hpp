// The two translation units of the link-order test, as seen by its main.
#pragma once

#include <cstdint>

namespace embcache::odr_test {

inline constexpr int cache_value_count = 6;
inline constexpr int dense_value_count = 6;

/// Values from the cache's initializer path (cache_ref.hpp), defined in hash_cache_tu.cpp.
void cache_values(std::uint64_t seed, std::uint64_t out[cache_value_count]);

/// Values from the dense kernels' and the data part's hashing, defined in hash_dense_tu.cpp.
void dense_values(std::uint64_t seed, std::uint64_t out[dense_value_count]);

}  // namespace embcache::odr_test
