// Translation unit 2 of the link-order test: the dense kernels' dropout hash, the data part's
// word hashes and stream, and the host store's key mix.
#include "data/random.hpp"
#include "embcache/trainer/detail/dense_kernels.hpp"
#include "hash_odr.hpp"

namespace embcache::odr_test {

void dense_values(std::uint64_t seed, std::uint64_t out[dense_value_count]) {
  out[0] = detail::dropout_base(seed, 3, 1);
  out[1] = detail::splitmix64_finalize(seed);
  out[2] = detail::hash_words(seed, 11);
  out[3] = detail::hash_words(seed, 11, 13);
  detail::splitmix64 rng(seed);
  rng.next();
  out[4] = rng.next();
  out[5] = detail::stafford_mix13(seed);
}

}  // namespace embcache::odr_test
