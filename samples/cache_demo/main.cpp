// A tour of the embedding cache in the host space: fill it, look rows up, update some, export
// what changed, and evict on demand when it is full.
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "embcache/embcache.hpp"

int main() {
  using embcache::host_space;
  embcache::cache_options options;
  options.slots = 100000;  // rounded up to whole buckets
  options.dim = 16;
  options.state_width = 32;  // Adam: two moments per element
  options.init.seed = 2026;
  embcache::embedding_cache<std::int64_t, host_space> cache(options);
  std::printf("cache: %zu slots of %zu floats (dim %zu + optimizer state %zu)\n", cache.slots(),
              cache.row_width(), cache.dim(), options.state_width);

  // 1. Fill: find_or_insert initializes missing rows from (seed, key) only.
  std::vector<std::int64_t> keys(80000);
  std::iota(keys.begin(), keys.end(), std::int64_t{1'000'000});
  std::vector<float> rows(keys.size() * cache.row_width());
  cache.find_or_insert(keys.data(), keys.size(), rows.data(), nullptr).throw_if_error();
  std::printf("filled: %zu rows resident, load factor %.2f\n", cache.size(), cache.load_factor());

  // 2. Look up a few keys, one of them absent.
  std::vector<std::int64_t> probe = {1'000'000, 1'000'001, 42};
  std::vector<float> out(probe.size() * cache.row_width());
  std::unique_ptr<bool[]> found(new bool[probe.size()]);
  cache.find(probe.data(), probe.size(), out.data(), found.get());
  for (std::size_t i = 0; i < probe.size(); ++i)
    std::printf("find %lld: %s%s\n", static_cast<long long>(probe[i]),
                found[i] ? "found, first element " : "absent",
                found[i] ? std::to_string(out[i * cache.row_width()]).c_str() : "");

  // 3. Train: update 1000 rows in place through their slots, then mark them changed.
  const std::uint64_t exported_at = cache.version();
  std::vector<std::int64_t> slots(1000);
  cache.lookup_slots(keys.data(), slots.size(), slots.data()).throw_if_error();
  std::vector<float> updated(slots.size() * cache.row_width(), 0.25f);
  cache.assign_slots(slots.data(), slots.size(), updated.data());

  // 4. Export only what changed since the last export.
  auto delta = cache.export_to_host(embcache::export_filter::changed_since(exported_at)).value();
  std::printf("incremental export: %zu rows changed since version %llu (of %zu resident)\n",
              delta.keys.size(), static_cast<unsigned long long>(exported_at), cache.size());

  // 5. On demand: insert 40000 new keys into the full-ish cache; the least recently used rows
  //    are evicted and handed back, to be written to a parameter store.
  std::vector<std::int64_t> fresh(40000);
  std::iota(fresh.begin(), fresh.end(), std::int64_t{5'000'000});
  std::vector<std::int64_t> victims(fresh.size());
  std::vector<float> victim_rows(fresh.size() * cache.row_width());
  std::vector<std::uint64_t> victim_versions(fresh.size());
  std::size_t evicted = 0;
  auto st = cache.insert_and_evict(fresh.data(), fresh.size(), nullptr, nullptr, victims.data(),
                                   victim_rows.data(), victim_versions.data(), &evicted);
  std::printf("insert_and_evict: %zu new keys, %zu rows evicted, %zu resident (%s)\n", fresh.size(),
              evicted, cache.size(), st.to_string().c_str());
  std::size_t dirty = 0;
  for (std::size_t i = 0; i < evicted; ++i) dirty += victim_versions[i] > exported_at;
  std::printf("of the evicted rows, %zu had changed since the export and need a write-back\n",
              dirty);
  return 0;
}
