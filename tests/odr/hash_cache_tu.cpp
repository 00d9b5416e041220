// Translation unit 1 of the link-order test: the cache's initial rows and bucket hash.
#include <cstring>

#include "embcache/embedding_cache_ref.hpp"
#include "hash_odr.hpp"

namespace embcache::odr_test {

void cache_values(std::uint64_t seed, std::uint64_t out[cache_value_count]) {
  initializer_options init;
  init.kind = init_kind::uniform;
  init.scale = 0.5f;
  init.seed = seed;
  for (int i = 0; i < 3; ++i) {
    const float v = detail::initial_value(init, 0.0f, seed + 7 * i, std::size_t(i));
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    out[i] = bits;
  }
  embedding_cache_ref<std::int64_t> ref{};
  ref.num_buckets = 1000003;
  const auto h = ref.hash(std::int64_t(seed));
  out[3] = h.home;
  out[4] = h.digest;
  out[5] = detail::murmur3_fmix64(seed);
}

}  // namespace embcache::odr_test
