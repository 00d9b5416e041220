// Expiry at a pass boundary (embcache/expiry.hpp): the table's expiry clock, the expired rows
// found among the residents and in the store, and their removal with tombstones for the next
// export.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "training/training_cache_core.hpp"

namespace embcache::detail {

namespace {
// Whether the embedding (`dim` floats of `row`) has an L2 norm below `limit`; summed in double,
// in index order, so that every space and every run decides alike.
inline bool norm_below(const float* row, std::size_t dim, float limit) {
  double sum = 0;
  for (std::size_t j = 0; j < dim; ++j) sum += double(row[j]) * double(row[j]);
  return std::sqrt(sum) < double(limit);
}
}  // namespace

template <class Key, class Space>
status training_cache_core<Key, Space>::expire_table(table_type& tb, const std::vector<Key>* keep,
                                                     table_counters& c) {
  const expiry_options& e = tb.opt.expiry;
  if (!e.enabled()) return {};
  // The clock of this boundary: V_P before any row of pass P is written; the rule compares with
  // V_(P - ttl), the oldest value kept once ttl values are there.
  auto& clock = tb.expiry;
  const std::size_t ttl = e.ttl_passes;
  bool by_age = ttl != 0 && clock.versions.size() >= ttl;
  std::uint64_t limit = by_age ? clock.versions[clock.versions.size() - ttl] : 0;
  ++clock.boundaries;
  clock.versions.push_back(tb.cache->version());
  if (clock.versions.size() > ttl) {
    clock.versions.erase(clock.versions.begin(),
                         clock.versions.end() - static_cast<std::ptrdiff_t>(ttl));
  }
  // The steps rule (expiry.hpp, "Steps"): W_(S - ttl_steps + 1), the oldest step value the rule
  // keeps once ttl_steps values are there; a row expires by age when either rule takes it.
  const std::uint64_t ttl_steps = e.ttl_steps;
  const bool by_steps = ttl_steps != 0 && clock.step_versions.size() >= ttl_steps;
  const std::uint64_t step_limit =
      by_steps ? clock.step_versions[clock.step_versions.size() - ttl_steps] : 0;
  const bool by_norm = e.min_l2_norm > 0;
  if (by_steps && (!by_age || step_limit > limit)) limit = step_limit;
  by_age = by_age || by_steps;
  if (!by_age && !by_norm) return {};
  const std::size_t dim = tb.opt.dim, w = tb.row_width;
  const auto kept = [&](Key k) {
    return keep && std::binary_search(keep->begin(), keep->end(), k);
  };
  const auto expired = [&](Key k, std::uint64_t v, const float* row) {
    if (kept(k)) return false;
    return (by_age && v <= limit) || (by_norm && norm_below(row, dim, e.min_l2_norm));
  };

  // Residents: their version is the row's (a store copy may be older). Read in batches.
  std::vector<Key> res_keys, gone_res;
  std::vector<std::uint64_t> res_vers;
  EMBCACHE_RETURN_IF_ERROR(residents(tb, &res_keys, &res_vers));
  const std::size_t batch = std::max<std::size_t>(options.prefetch_batch, 1);
  std::vector<std::int64_t> slots;
  std::vector<float> rows;
  for (std::size_t b = 0; b < res_keys.size(); b += batch) {
    const std::size_t m = std::min(batch, res_keys.size() - b);
    if (by_norm) {
      slots.resize(m);
      rows.resize(m * w);
      EMBCACHE_RETURN_IF_ERROR(tb.bridge.lookup_slots(res_keys.data() + b, m, slots.data()));
      EMBCACHE_RETURN_IF_ERROR(tb.bridge.read_slots(slots.data(), m, rows.data()));
    }
    for (std::size_t i = 0; i < m; ++i) {
      const float* row = by_norm ? rows.data() + i * w : nullptr;
      if (expired(res_keys[b + i], res_vers[b + i], row)) gone_res.push_back(res_keys[b + i]);
    }
  }

  // The store, in batches: rows not resident. The scan keeps the rows the rule takes by their
  // stored version and norm (a few, usually); only those are then checked against the residents
  // (whose stored copy may be older than the cache's) and the kept keys.
  std::vector<Key> gone = gone_res;
  {
    std::vector<Key> stale;
    {
      std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
      EMBCACHE_RETURN_IF_ERROR(tb.sync.store->for_each(
          batch, [&](const Key* k, const float* r, const std::uint64_t* v, std::size_t n) {
            for (std::size_t i = 0; i < n; ++i) {
              if ((by_age && v[i] <= limit) ||
                  (by_norm && norm_below(r + i * w, dim, e.min_l2_norm)))
                stale.push_back(k[i]);
            }
            return status{};
          }));
    }
    // Resident candidates are judged by their cache row above: one merge of two sorted lists
    // (no lookup in the cache, which would touch the rows' eviction scores).
    std::sort(stale.begin(), stale.end());
    std::sort(res_keys.begin(), res_keys.end());
    std::vector<Key> outside;
    std::set_difference(stale.begin(), stale.end(), res_keys.begin(), res_keys.end(),
                        std::back_inserter(outside));
    for (const Key k : outside)
      if (!kept(k)) gone.push_back(k);
  }
  if (gone.empty()) return {};
  std::sort(gone.begin(), gone.end());
  if (!gone_res.empty()) {
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.erase(gone_res.data(), gone_res.size()));
    // The prefetch's plan stays valid when it was: no expired key is in the next keyset (kept),
    // so its hits and misses are unchanged; only the resident count moved.
    if (staged_valid && staging_matches_residency(tb) && keep) {
      note_worker_residency_change(tb);
    } else {
      ++tb.book.residency;
    }
  }
  {
    // At a begin_pass no staged key that the boundary uses expires (it uses the kept keyset's),
    // so the writes log that guards staged rows needs them only without a keyset.
    std::lock_guard<std::mutex> lock(*tb.sync.store_mutex);
    if (tb.sync.log_writes && !keep) {
      tb.sync.writes_log.insert(tb.sync.writes_log.end(), gone.begin(), gone.end());
    }
    EMBCACHE_RETURN_IF_ERROR(tb.sync.store->erase(gone.data(), gone.size()));
  }
  tb.exports.erased.insert(tb.exports.erased.end(), gone.begin(), gone.end());
  c.rows_expired += gone.size();
  return {};
}

template <class Key, class Space>
status training_cache_core<Key, Space>::expire_all() {
  // Tables with expiry off: nothing runs, not even the wait for the write-behind.
  if (std::none_of(tables.begin(), tables.end(),
                   [](const table_type& tb) { return tb.opt.expiry.enabled(); })) {
    return {};
  }
  EMBCACHE_RETURN_IF_ERROR(finish_write_behind());
  for (auto& tb : tables) {
    if (!tb.opt.expiry.enabled()) continue;
    table_counters c;
    {
      std::lock_guard<std::mutex> lock(*tb.sync.install_mutex);
      EMBCACHE_RETURN_IF_ERROR(expire_table(tb, nullptr, c));
    }
    counters.last[tb.index] = c;
    counters.total[tb.index] += c;
  }
  return {};
}

}  // namespace embcache::detail
