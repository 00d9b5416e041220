// Feature admission (embcache/admission.hpp): which keys of a keyset or a lookup batch may have
// a row. Every key is counted as a sighting by the table's sketch; a key whose count has reached
// its threshold is admitted, and so is a key with a row (resident, or in the store), which only
// the keys below their threshold are looked up for. Runs on the host in both spaces, before any
// row is pulled or made, so that a refused key never gets one.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>

#include "training/training_cache_core.hpp"

namespace embcache::detail {

template <class Key, class Space>
status training_cache_core<Key, Space>::admit(table_type& tb, std::vector<Key>* keys,
                                              admit_mode mode, table_counters* c) {
  std::vector<Key>& k = *keys;
  const std::size_t n = k.size();
  if (!tb.admission.enabled() || n == 0) return {};
  // Every key is counted before any is decided: the counts depend on the keys, not their order.
  std::vector<std::uint64_t> k64(k.begin(), k.end());
  std::unique_ptr<bool[]> by_count(new bool[n]);
  if (mode == admit_mode::sight) {
    tb.admission.sight_all(k64.data(), n, by_count.get());
  } else {
    tb.admission.admitted_all(k64.data(), n, mode == admit_mode::next_sighting ? 1 : 0,
                              by_count.get());
  }
  // The keys the sketch refuses are kept when they have a row: resident, or in the store.
  std::vector<Key> low;
  for (std::size_t i = 0; i < n; ++i)
    if (!by_count[i]) low.push_back(k[i]);
  if (low.empty()) return {};
  std::vector<std::int64_t> slots(low.size());
  EMBCACHE_RETURN_IF_ERROR(tb.bridge.lookup_slots(low.data(), low.size(), slots.data()));
  std::vector<Key> absent;
  for (std::size_t i = 0; i < low.size(); ++i)
    if (slots[i] < 0) absent.push_back(low[i]);
  std::unique_ptr<bool[]> stored(new bool[std::max<std::size_t>(absent.size(), 1)]);
  if (!absent.empty()) {
    std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
    EMBCACHE_RETURN_IF_ERROR(tb.sync.store->contains(absent.data(), absent.size(), stored.get()));
  }
  // k, low and absent are sorted: one merge decides.
  std::size_t out = 0, l = 0, a = 0;
  for (std::size_t i = 0; i < n; ++i) {
    bool keep = true;
    if (!by_count[i]) {
      const bool resident = slots[l++] >= 0;
      keep = resident || stored[a++];
      if (!keep && mode == admit_mode::sight) ++c->keys_refused;
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
  std::vector<std::uint64_t> u(keys, keys + n);
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  tb.admission.count_all(u.data(), u.size());
  return {};
}

}  // namespace embcache::detail
