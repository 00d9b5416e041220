// A keyset file in both formats (ours and HugeCTR's raw keys) and both key types. Each input is
// also parsed with the key checksum recomputed, so mutated counts reach the size checks.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "embcache/keyset.hpp"
#include "fuzz_target.hpp"

namespace {

template <class Key>
void check_keyset(const std::string& path, std::size_t size) {
  auto ours = embcache::read_keyset<Key>(path, embcache::keyset_format::embcache);
  if (ours.ok()) {
    const std::vector<Key>& k = ours.value();
    EMBCACHE_FUZZ_CHECK(size == embcache::keyset_header_size + k.size() * sizeof(Key));
    EMBCACHE_FUZZ_CHECK(
        std::adjacent_find(k.begin(), k.end(), [](Key a, Key b) { return !(a < b); }) == k.end());
  } else {
    EMBCACHE_FUZZ_CHECK(ours.get_status().message().find(path) != std::string::npos);
  }
  auto raw = embcache::read_keyset<Key>(path, embcache::keyset_format::hugectr_raw);
  EMBCACHE_FUZZ_CHECK(raw.ok() == (size % sizeof(Key) == 0));
  if (raw.ok()) {
    const std::vector<Key>& k = raw.value();
    EMBCACHE_FUZZ_CHECK(k.size() <= size / sizeof(Key));
    EMBCACHE_FUZZ_CHECK(
        std::adjacent_find(k.begin(), k.end(), [](Key a, Key b) { return !(a < b); }) == k.end());
  }
}

void check_all(const std::string& path, std::size_t size) {
  check_keyset<std::int64_t>(path, size);
  check_keyset<std::uint32_t>(path, size);
}

}  // namespace

EMBCACHE_FUZZ_TARGET(keyset_reader) {
  check_all(embcache::fuzz::scratch_file(data, size), size);
  if (size < embcache::keyset_header_size) return;
  std::vector<std::uint8_t> fixed(data, data + size);
  const std::uint64_t sum =
      XXH64(fixed.data() + embcache::keyset_header_size, size - embcache::keyset_header_size, 0);
  std::memcpy(fixed.data() + 24, &sum, 8);
  check_all(embcache::fuzz::scratch_file(fixed.data(), size, "fixed"), size);
}
