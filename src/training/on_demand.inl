// On-demand mode: a lookup batch makes its keys resident, pulling or initializing the misses and
// inserting them with eviction by score; the dirty victims are written back at once, also when
// some key of the batch found no room (its home bucket full of the batch's own keys): the keys
// that fit are resident, the victims are in the store, and then capacity_exceeded is returned.
#pragma once

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>

#include "training/training_cache_core.hpp"

namespace embcache::detail {

template <class Key, class Space>
status training_cache_core<Key, Space>::lookup(table_type& tb, const Key* keys, std::size_t n,
                                               std::int64_t* slots_out) {
  table_counters c;
  std::vector<Key> u(keys, keys + n);
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  std::size_t m = u.size();
  const std::size_t w = tb.row_width;
  if (m > tb.opt.capacity) {
    return status::capacity_exceeded("lookup batch of table '" + tb.opt.name + "' has " +
                                     std::to_string(m) + " distinct keys, more than the capacity " +
                                     std::to_string(tb.opt.capacity));
  }
  // Feature admission: the keys refused at this sighting get no row and slot -1.
  EMBCACHE_RETURN_IF_ERROR(admit(tb, &u, admit_mode::sight, &c));
  m = u.size();
  std::vector<std::int64_t> slots(m);
  EMBCACHE_RETURN_IF_ERROR(tb.bridge.lookup_slots(u.data(), m, slots.data()));
  std::vector<Key> miss;
  std::vector<std::size_t> miss_at;
  for (std::size_t i = 0; i < m; ++i) {
    if (slots[i] < 0) {
      miss.push_back(u[i]);
      miss_at.push_back(i);
    }
  }
  c.misses = miss.size();
  c.hits = m - miss.size();
  const auto t0 = clock_type::now();
  std::vector<float> rows(m * w, 0.0f);
  std::vector<std::uint64_t> vers(m, 0);
  std::vector<std::uint8_t> fresh(m, 0);
  if (!miss.empty()) {
    std::vector<float> r(miss.size() * w);
    std::vector<std::uint64_t> v(miss.size());
    std::unique_ptr<bool[]> f(new bool[miss.size()]);
    EMBCACHE_RETURN_IF_ERROR(pull(tb, miss.data(), miss.size(), r.data(), f.get(), v.data()));
    c.rows_pulled += miss.size();
    std::uint64_t init_version = 0;
    for (std::size_t i = 0; i < miss.size(); ++i) {
      const std::size_t d = miss_at[i];
      if (f[i]) {
        std::memcpy(rows.data() + d * w, r.data() + i * w, w * sizeof(float));
        vers[d] = v[i];
        c.bytes_store_to_cache += w * sizeof(float);
      } else {
        if (!init_version) init_version = fresh_version(tb);
        initialize_row(tb, miss[i], rows.data() + d * w);
        vers[d] = init_version;
        fresh[d] = 1;
        ++c.rows_initialized;
      }
    }
  }
  // The admitted keys without a row are the rows made for this batch.
  if (tb.admission.enabled()) c.keys_admitted = c.rows_initialized;
  c.seconds_swap_in += seconds_since(t0);
  // Every distinct key goes in, hits included, so that no key of this batch is a victim.
  std::vector<Key> ev_keys(m);
  std::vector<float> ev_rows(m * w);
  std::vector<std::uint64_t> ev_vers(m);
  std::size_t ev_count = 0;
  std::unique_ptr<bool[]> found(new bool[std::max<std::size_t>(m, 1)]);
  std::unique_ptr<bool[]> dirty(new bool[std::max<std::size_t>(m, 1)]);
  std::vector<std::int64_t> placed(m);
  // capacity_exceeded: some keys found no room, but the others are in and the victims are out (the
  // outputs are complete), so the victims must still reach the store before it is reported.
  const status inserted = tb.bridge.insert_and_evict(
      u.data(), m, rows.data(), vers.data(), ev_keys.data(), ev_rows.data(), ev_vers.data(),
      &ev_count, found.get(), placed.data(), dirty.get());
  if (!inserted.ok() && inserted.code() != status_code::capacity_exceeded) return inserted;
  if (slots_out) {
    for (std::size_t i = 0; i < n; ++i) {
      const auto d = std::lower_bound(u.begin(), u.end(), keys[i]) - u.begin();
      slots_out[i] = d < static_cast<std::ptrdiff_t>(m) && u[d] == keys[i] ? placed[d] : -1;
    }
  }
  const auto t1 = clock_type::now();
  std::vector<Key> pk;
  std::vector<float> pr;
  std::vector<std::uint64_t> pv;
  for (std::size_t j = 0; j < ev_count; ++j) {
    if (!dirty[j]) continue;
    pk.push_back(ev_keys[j]);
    pr.insert(pr.end(), ev_rows.begin() + j * w, ev_rows.begin() + (j + 1) * w);
    pv.push_back(ev_vers[j]);
  }
  tb.exports.note_written(pk.begin(), pk.end());
  tb.exports.compact_if_grown();
  c.rows_evicted += ev_count;
  status pushed;
  try {
    pushed = push(tb, pk.data(), pk.size(), pr.data(), pv.data());
  } catch (const std::exception& e) {
    pushed = status_of(e);  // a store that throws: the victims must not be lost either
  }
  if (!pushed.ok()) {
    // The victims have left the cache: they wait as write-behind rows, which the next call that
    // needs the store pushes first (finish_write_behind), so that none is lost.
    tb.wb.keys = std::move(pk);
    tb.wb.versions = std::move(pv);
    tb.wb.rows.assign(pr.begin(), pr.end());
    tb.wb.pushed = false;
    counters.last[tb.index] = c;
    counters.total[tb.index] += c;
    return pushed.with_context("write-back of the rows evicted by lookup in table '" +
                               tb.opt.name + "'");
  }
  c.rows_pushed += pk.size();
  c.bytes_cache_to_store += pk.size() * w * sizeof(float);
  c.seconds_write_back += seconds_since(t1);
  // Rows pulled from the store are in sync with it; initialized ones stay dirty (new rows start
  // so), and hits keep what they were.
  {
    std::vector<std::int64_t> pulled;
    std::vector<std::uint64_t> pulled_vers;
    for (std::size_t i = 0; i < m; ++i) {
      if (found[i] || placed[i] < 0 || fresh[i]) continue;
      pulled.push_back(placed[i]);
      pulled_vers.push_back(vers[i]);
    }
    EMBCACHE_RETURN_IF_ERROR(tb.bridge.mark_synced(pulled.data(), pulled.size(), pulled_vers.data()));
  }
  counters.last[tb.index] = c;
  counters.total[tb.index] += c;
  std::size_t no_room = 0, first = m;
  for (std::size_t i = 0; i < m; ++i) {
    if (placed[i] >= 0) continue;
    if (first == m) first = i;
    ++no_room;
  }
  if (no_room == 0) return {};
  return status::capacity_exceeded(
      "lookup: no room for " + std::to_string(no_room) + " of " + std::to_string(m) +
      " distinct keys in table '" + tb.opt.name + "' (first: key " + std::to_string(u[first]) +
      "; its home bucket is full of this batch's keys); the other keys are resident (slot -1 for "
      "these) and every row evicted was written back");
}

}  // namespace embcache::detail
