// Checks the two translation units of the link-order test against the mixers spelled out here,
// independently of the project's headers (none of which this file includes).
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "hash_odr.hpp"

namespace {

using u64 = std::uint64_t;

// murmur3's fmix64 and Stafford's Mix13 (SplitMix64's output mix), written here as two rounds
// of x = (x ^ (x >> shift)) * multiplier and a last xor-shift.
struct round_spec {
  int shift;
  u64 multiplier;
};
u64 xorshift_multiply(u64 x, const round_spec (&rounds)[2], int last_shift) {
  for (const round_spec& r : rounds) x = (x ^ (x >> r.shift)) * r.multiplier;
  return x ^ (x >> last_shift);
}
u64 ref_fmix64(u64 x) {
  return xorshift_multiply(x, {{33, 0xff51afd7ed558ccdULL}, {33, 0xc4ceb9fe1a85ec53ULL}}, 33);
}
u64 ref_mix13(u64 x) {
  return xorshift_multiply(x, {{30, 0xbf58476d1ce4e5b9ULL}, {27, 0x94d049bb133111ebULL}}, 31);
}
// A SplitMix64 stream's first output from state x.
u64 ref_splitmix64(u64 x) { return ref_mix13(x + 0x9e3779b97f4a7c15ULL); }

u64 ref_words(u64 a, u64 b) {
  return ref_splitmix64(ref_splitmix64(a) ^ (b * 0xd6e8feb86659fd93ULL));
}

// The cache's uniform initial value of (key, column), as float bits.
u64 ref_initial_bits(u64 seed, float scale, u64 key, u64 column) {
  const u64 base = ref_fmix64(seed ^ ref_fmix64(key + 0x632be59bd9b4e019ULL));
  const u64 r = ref_fmix64(base + (column + 1) * 0x9e3779b97f4a7c15ULL);
  const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
  const float v = (2.0f * u - 1.0f) * scale;
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

int check(const char* what, int i, u64 got, u64 want) {
  if (got == want) return 0;
  std::printf("%s[%d]: got %016llx, expected %016llx\n", what, i,
              static_cast<unsigned long long>(got), static_cast<unsigned long long>(want));
  return 1;
}

}  // namespace

int main(int argc, char**) {
  namespace t = embcache::odr_test;
  int failures = 0;
  // The seed depends on argc so that nothing below can be folded at compile time.
  const u64 seeds[] = {u64(argc) * 0x1234567ULL, u64(argc) + 0xfeedfacecafebeefULL};
  for (u64 seed : seeds) {
    u64 cache[t::cache_value_count];
    t::cache_values(seed, cache);
    for (int i = 0; i < 3; ++i)
      failures += check("cache initial value", i, cache[i],
                        ref_initial_bits(seed, 0.5f, seed + 7 * u64(i), u64(i)));
    const u64 h = ref_fmix64(seed ^ 0x9e3779b97f4a7c15ULL);
    u64 digest = h & 0xff;
    if (digest < 2) digest += 2;
    failures += check("cache bucket", 3, cache[3],
                      static_cast<u64>((static_cast<unsigned __int128>(h) * 1000003) >> 64));
    failures += check("cache digest", 4, cache[4], digest);
    failures += check("murmur3_fmix64", 5, cache[5], ref_fmix64(seed));

    u64 dense[t::dense_value_count];
    t::dense_values(seed, dense);
    failures +=
        check("dropout_base", 0, dense[0],
              ref_splitmix64(ref_splitmix64(ref_splitmix64(seed ^ 0x64726f706f7574ULL) ^ 3) ^ 1));
    failures += check("splitmix64_finalize", 1, dense[1], ref_splitmix64(seed));
    failures += check("hash_words(a, b)", 2, dense[2], ref_words(seed, 11));
    failures += check("hash_words(a, b, c)", 3, dense[3], ref_words(ref_words(seed, 11), 13));
    failures +=
        check("splitmix64 stream", 4, dense[4], ref_mix13(seed + 2 * 0x9e3779b97f4a7c15ULL));
    failures += check("stafford_mix13", 5, dense[5], ref_mix13(seed));
  }
  std::printf("%s\n", failures == 0 ? "all values agree" : "values differ: a mixer name is shared");
  return failures == 0 ? 0 : 1;
}
