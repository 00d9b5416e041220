// Feature admission (embcache/admission.hpp): which keys of a keyset or a lookup batch may have
// a row. Every key is counted as a sighting by the table's sketch; a key with a row (resident, or
// in the store) is admitted, the others once their count reaches their threshold. Runs on
// the host in both spaces, before any row is pulled or made, so that a refused key never gets one.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>

#include "training/training_cache_core.hpp"

namespace embcache::detail {

template <class Key, class Space>
status training_cache_core<Key, Space>::admit(table_type& tb, std::vector<Key>* keys, bool count,
                                              table_counters* c) {
  std::vector<Key>& k = *keys;
  const std::size_t n = k.size();
  if (!tb.admission.enabled() || n == 0) return {};
  // Every key is counted before any is decided: the counts depend on the keys, not their order.
  std::vector<std::uint64_t> k64(k.begin(), k.end());
  std::unique_ptr<bool[]> by_count(new bool[n]);
  if (count) {
    tb.admission.sight_all(k64.data(), n, by_count.get());
  } else {
    for (std::size_t i = 0; i < n; ++i) by_count[i] = tb.admission.admitted(k64[i]);
  }
  std::vector<std::int64_t> slots(n);
  EMBCACHE_RETURN_IF_ERROR(tb.bridge.lookup_slots(k.data(), n, slots.data()));
  std::vector<Key> absent;
  for (std::size_t i = 0; i < n; ++i)
    if (slots[i] < 0) absent.push_back(k[i]);
  if (absent.empty()) return {};
  std::unique_ptr<bool[]> stored(new bool[absent.size()]);
  {
    std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
    EMBCACHE_RETURN_IF_ERROR(tb.sync.store->contains(absent.data(), absent.size(), stored.get()));
  }
  std::size_t out = 0, a = 0;
  for (std::size_t i = 0; i < n; ++i) {
    bool keep = true;
    if (slots[i] < 0 && !stored[a++]) {
      keep = by_count[i];
      if (count) ++(keep ? c->keys_admitted : c->keys_refused);
    }
    if (keep) k[out++] = k[i];
  }
  k.resize(out);
  return {};
}

template <class Key, class Space>
status training_cache_core<Key, Space>::count_sightings(table_type& tb, const Key* keys,
                                                        std::size_t n) {
  if (!tb.admission.enabled()) return {};
  std::vector<Key> u(keys, keys + n);
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  for (const Key key : u) tb.admission.count_sighting(static_cast<std::uint64_t>(key));
  return {};
}

}  // namespace embcache::detail
