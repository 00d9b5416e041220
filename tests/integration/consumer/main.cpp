// A trainer outside the embcache tree: links the installed library through find_package.
#include <cstdio>
#include <embcache/embcache.hpp>
#include <vector>

int main() {
  embcache::cache_options o;
  o.slots = 1000;
  o.dim = 8;
  embcache::embedding_cache<std::int64_t, embcache::host_space> cache(o);
  std::vector<std::int64_t> keys = {1, 2, 3, 2};
  std::vector<float> rows(keys.size() * cache.row_width());
  if (auto s = cache.find_or_insert(keys.data(), keys.size(), rows.data(), nullptr); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  std::printf("consumer ok: %zu rows\n", cache.size());
  return cache.size() == 3 ? 0 : 1;
}
