// tiered_store: the DRAM tier's slots (rows in fixed chunks, CLOCK demotion) and the store's
// calls, each under one lock.
#include "embcache/tiered_store.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <unordered_map>
#include <vector>

namespace embcache {

template <class Key>
struct tiered_store<Key>::impl {
  // Whether the lower store holds a tier row's key: a row pulled from below or written down is
  // there; a row pushed as a new key may or may not be (asked of the lower store by size()).
  enum class below : std::uint8_t { no, yes, unknown };
  struct slot {
    Key key{};
    std::uint64_t version = 0;
    bool used = false;
    bool dirty = false;
    bool referenced = false;
    bool chosen = false;  // picked by the demotion under way
    below where = below::no;
  };

  tiered_store_options<Key> options;
  param_store<Key>* lower = nullptr;
  std::string who;
  std::size_t width = 0;
  std::size_t capacity = 0;    // rows
  std::size_t chunk_rows = 0;  // rows per allocation of the row arena
  std::vector<slot> slots;
  std::vector<std::unique_ptr<float[]>> chunks;
  std::vector<std::uint32_t> free_slots;
  std::unordered_map<Key, std::uint32_t> index;
  std::size_t hand = 0;
  std::uint64_t tier_max = 0;
  std::size_t not_below = 0, unknown = 0, dirty = 0;
  tiered_store_counters stats;
  mutable std::mutex mutex;

  float* row(std::uint32_t s) { return chunks[s / chunk_rows].get() + (s % chunk_rows) * width; }

  std::uint32_t allocate() {
    if (!free_slots.empty()) {
      const std::uint32_t s = free_slots.back();
      free_slots.pop_back();
      return s;
    }
    const auto s = static_cast<std::uint32_t>(slots.size());
    if (s % chunk_rows == 0) chunks.emplace_back(new float[chunk_rows * width]);
    slots.emplace_back();
    return s;
  }

  void set_where(slot& sl, below w) {
    if (sl.where == below::no) --not_below;
    if (sl.where == below::unknown) --unknown;
    sl.where = w;
    if (w == below::no) ++not_below;
    if (w == below::unknown) ++unknown;
  }

  void set_dirty(slot& sl, bool d) {
    if (sl.dirty != d) d ? ++dirty : --dirty;
    sl.dirty = d;
  }

  // Adds a row for a key the tier does not hold.
  void insert(Key key, const float* r, std::uint64_t version, bool is_dirty, below w) {
    const std::uint32_t s = allocate();
    slot& sl = slots[s];
    sl.key = key;
    sl.version = version;
    sl.used = true;
    sl.referenced = true;
    sl.dirty = false;
    sl.where = below::yes;
    set_dirty(sl, is_dirty);
    set_where(sl, w);
    if (width) std::memcpy(row(s), r, width * sizeof(float));
    index.emplace(key, s);
    tier_max = std::max(tier_max, version);
  }

  void remove(std::uint32_t s) {
    slot& sl = slots[s];
    set_dirty(sl, false);
    set_where(sl, below::yes);
    sl.used = false;
    index.erase(sl.key);
    free_slots.push_back(s);
  }

  std::size_t rows() const { return index.size(); }

  // Writes the rows of `which` (slots, any order) down in key order, in batches.
  status write_down(std::vector<std::uint32_t>& which) {
    std::sort(which.begin(), which.end(),
              [&](std::uint32_t a, std::uint32_t b) { return slots[a].key < slots[b].key; });
    const std::size_t step = options.write_down_rows;
    std::vector<Key> k;
    std::vector<float> r;
    std::vector<std::uint64_t> v;
    for (std::size_t b = 0; b < which.size(); b += step) {
      const std::size_t e = std::min(which.size(), b + step);
      k.resize(e - b);
      r.resize((e - b) * width);
      v.resize(e - b);
      for (std::size_t j = b; j < e; ++j) {
        k[j - b] = slots[which[j]].key;
        v[j - b] = slots[which[j]].version;
        if (width) std::memcpy(&r[(j - b) * width], row(which[j]), width * sizeof(float));
      }
      EMBCACHE_RETURN_IF_ERROR(lower->push(k.data(), k.size(), r.data(), v.data())
                                   .with_context(who + ": writing dirty rows down"));
      for (std::size_t j = b; j < e; ++j) {
        set_dirty(slots[which[j]], false);
        set_where(slots[which[j]], below::yes);
      }
      stats.rows_written_down += e - b;
      stats.bytes_written_down += (e - b) * (width * sizeof(float) + 8);
    }
    return {};
  }

  status write_down_all() {
    std::vector<std::uint32_t> which;
    which.reserve(dirty);
    for (std::uint32_t s = 0; s < slots.size(); ++s)
      if (slots[s].used && slots[s].dirty) which.push_back(s);
    return write_down(which);
  }

  // Demotes rows until `k` more fit: CLOCK picks the victims, the dirty ones are written down
  // (key order), then all leave memory. Nothing leaves when the write-down fails.
  status make_room(std::size_t k) {
    if (rows() + k <= capacity) return {};
    const std::size_t need = std::min(rows(), rows() + k - capacity);
    std::vector<std::uint32_t> victims, dirty_victims;
    victims.reserve(need);
    while (victims.size() < need) {
      slot& sl = slots[hand];
      const auto s = static_cast<std::uint32_t>(hand);
      hand = (hand + 1) % slots.size();
      if (!sl.used || sl.chosen) continue;
      if (sl.referenced) {
        sl.referenced = false;
        continue;
      }
      sl.chosen = true;  // a second lap must not take it twice
      victims.push_back(s);
      if (sl.dirty) dirty_victims.push_back(s);
    }
    status st = write_down(dirty_victims);
    for (auto s : victims) slots[s].chosen = false;
    if (!st.ok()) return st;
    for (auto s : victims) remove(s);
    stats.demotions += victims.size();
    stats.clean_drops += victims.size() - dirty_victims.size();
    return {};
  }

  std::uint64_t max_version() const { return std::max(lower->max_version(), tier_max); }

  // Asks the lower store whether it holds the tier rows pushed as new keys.
  void resolve_unknown() {
    if (!unknown) return;
    std::vector<std::uint32_t> which;
    std::vector<Key> k;
    for (std::uint32_t s = 0; s < slots.size(); ++s)
      if (slots[s].used && slots[s].where == below::unknown) {
        which.push_back(s);
        k.push_back(slots[s].key);
      }
    std::unique_ptr<bool[]> found(new bool[k.size()]);
    if (!lower->contains(k.data(), k.size(), found.get()).ok()) return;
    for (std::size_t i = 0; i < which.size(); ++i)
      set_where(slots[which[i]], found[i] ? below::yes : below::no);
  }
};

template <class Key>
tiered_store<Key>::tiered_store(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

template <class Key>
result<std::unique_ptr<tiered_store<Key>>> tiered_store<Key>::open(
    tiered_store_options<Key> options) {
  if (!options.lower)
    return status::invalid_argument(
        "tiered_store::open: tiered_store_options::lower is null (the store below the tier)");
  auto p = std::make_unique<impl>();
  p->width = options.lower->row_width();
  p->who = "tiered_store of table '" + options.lower->table_name() + "'";
  const std::size_t per_row = dram_row_bytes(p->width);
  if (options.dram_bytes < per_row)
    return status::invalid_argument(p->who + ": tiered_store_options::dram_bytes is " +
                                    std::to_string(options.dram_bytes) +
                                    ", less than one row needs (" + std::to_string(per_row) +
                                    " bytes for rows of " + std::to_string(p->width) + " floats)");
  if (options.write_down_rows == 0)
    return status::invalid_argument(p->who + ": tiered_store_options::write_down_rows must be > 0");
  p->capacity = options.dram_bytes / per_row;
  if (p->capacity >= 0xFFFFFFFFu) p->capacity = 0xFFFFFFFEu;  // slots are 32-bit
  p->chunk_rows = std::min<std::size_t>(p->capacity, 4096);
  p->lower = options.lower.get();
  p->options = std::move(options);
  p->stats.capacity_rows = p->capacity;
  return std::unique_ptr<tiered_store>(new tiered_store(std::move(p)));
}

template <class Key>
tiered_store<Key>::~tiered_store() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  (void)impl_->write_down_all();
}

template <class Key>
std::size_t tiered_store<Key>::row_width() const noexcept {
  return impl_->width;
}

template <class Key>
const std::string& tiered_store<Key>::table_name() const noexcept {
  return impl_->lower->table_name();
}

template <class Key>
const std::shared_ptr<param_store<Key>>& tiered_store<Key>::lower() const noexcept {
  return impl_->options.lower;
}

template <class Key>
status tiered_store<Key>::pull(const Key* keys, std::size_t n, float* rows_out, bool* found_out,
                               std::uint64_t* versions_out) {
  auto& t = *impl_;
  if (n == 0) return {};
  if (!keys || !found_out || (!rows_out && t.width))
    return status::invalid_argument(t.who + ": pull needs keys, rows_out and found_out");
  std::lock_guard<std::mutex> lock(t.mutex);
  const std::size_t w = t.width;
  std::vector<std::size_t> miss;  // batch positions
  for (std::size_t i = 0; i < n; ++i) {
    auto it = t.index.find(keys[i]);
    if (it == t.index.end()) {
      miss.push_back(i);
      continue;
    }
    auto& sl = t.slots[it->second];
    sl.referenced = true;
    found_out[i] = true;
    if (w) std::memcpy(rows_out + i * w, t.row(it->second), w * sizeof(float));
    if (versions_out) versions_out[i] = sl.version;
  }
  t.stats.hits += n - miss.size();
  t.stats.misses += miss.size();
  if (miss.empty()) return {};
  // Each distinct missing key once, in key order.
  std::sort(miss.begin(), miss.end(), [&](std::size_t a, std::size_t b) {
    return keys[a] < keys[b] || (keys[a] == keys[b] && a < b);
  });
  std::vector<Key> uk;
  std::vector<std::size_t> first_of(miss.size());  // index into uk of each miss
  for (std::size_t j = 0; j < miss.size(); ++j) {
    if (uk.empty() || uk.back() != keys[miss[j]]) uk.push_back(keys[miss[j]]);
    first_of[j] = uk.size() - 1;
  }
  const std::size_t m = uk.size();
  std::vector<float> rows(m * w);
  std::unique_ptr<bool[]> found(new bool[m]);
  std::vector<std::uint64_t> versions(m, 0);
  EMBCACHE_RETURN_IF_ERROR(t.lower->pull(uk.data(), m, rows.data(), found.get(), versions.data())
                               .with_context(t.who + ": reading the tier's misses"));
  std::size_t present = 0;
  for (std::size_t j = 0; j < miss.size(); ++j) {
    const std::size_t i = miss[j], u = first_of[j];
    found_out[i] = found[u];
    if (!found[u]) continue;
    if (w) std::memcpy(rows_out + i * w, &rows[u * w], w * sizeof(float));
    if (versions_out) versions_out[i] = versions[u];
  }
  for (std::size_t u = 0; u < m; ++u) present += found[u];
  // The rows found join the tier (the last `capacity` of them when there are more).
  const std::size_t admit = std::min(present, t.capacity);
  EMBCACHE_RETURN_IF_ERROR(t.make_room(admit));
  std::size_t skip = present - admit;
  for (std::size_t u = 0; u < m; ++u) {
    if (!found[u]) continue;
    if (skip) {
      --skip;
      continue;
    }
    t.insert(uk[u], &rows[u * w], versions[u], false, impl::below::yes);
  }
  return {};
}

template <class Key>
status tiered_store<Key>::push(const Key* keys, std::size_t n, const float* rows,
                               const std::uint64_t* versions) {
  auto& t = *impl_;
  if (n == 0) return {};
  if (!keys || !rows) return status::invalid_argument(t.who + ": push needs keys and rows");
  std::lock_guard<std::mutex> lock(t.mutex);
  const std::size_t w = t.width;
  const std::uint64_t stamp = t.max_version() + 1;
  // Batch positions in key order, each key at its last occurrence.
  std::vector<std::size_t> pos(n);
  std::iota(pos.begin(), pos.end(), std::size_t{0});
  std::stable_sort(pos.begin(), pos.end(),
                   [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
  std::size_t m = 0;
  for (std::size_t j = 0; j < n; ++j) {
    if (j + 1 < n && keys[pos[j + 1]] == keys[pos[j]]) continue;
    pos[m++] = pos[j];
  }
  pos.resize(m);
  auto version_of = [&](std::size_t i) { return versions ? versions[i] : stamp; };
  std::vector<std::size_t> fresh;
  for (std::size_t i : pos) {
    auto it = t.index.find(keys[i]);
    if (it == t.index.end()) {
      fresh.push_back(i);
      continue;
    }
    auto& sl = t.slots[it->second];
    if (w) std::memcpy(t.row(it->second), rows + i * w, w * sizeof(float));
    sl.version = version_of(i);
    sl.referenced = true;
    t.set_dirty(sl, true);
    t.tier_max = std::max(t.tier_max, sl.version);
  }
  // More new keys than the tier holds: the first ones (key order) go straight down.
  const std::size_t direct = fresh.size() > t.capacity ? fresh.size() - t.capacity : 0;
  if (direct) {
    std::vector<Key> k(direct);
    std::vector<float> r(direct * w);
    std::vector<std::uint64_t> v(direct);
    for (std::size_t j = 0; j < direct; ++j) {
      k[j] = keys[fresh[j]];
      v[j] = version_of(fresh[j]);
      if (w) std::memcpy(&r[j * w], rows + fresh[j] * w, w * sizeof(float));
    }
    EMBCACHE_RETURN_IF_ERROR(
        t.lower->push(k.data(), direct, r.data(), v.data()).with_context(t.who + ": writing down"));
    t.stats.rows_written_down += direct;
    t.stats.bytes_written_down += direct * (w * sizeof(float) + 8);
    for (auto x : v) t.tier_max = std::max(t.tier_max, x);
  }
  EMBCACHE_RETURN_IF_ERROR(t.make_room(fresh.size() - direct));
  for (std::size_t j = direct; j < fresh.size(); ++j)
    t.insert(keys[fresh[j]], rows + fresh[j] * w, version_of(fresh[j]), true, impl::below::unknown);
  return {};
}

template <class Key>
status tiered_store<Key>::erase(const Key* keys, std::size_t n, std::size_t* erased_out) {
  auto& t = *impl_;
  if (erased_out) *erased_out = 0;
  if (n == 0) return {};
  if (!keys) return status::invalid_argument(t.who + ": erase needs keys");
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<Key> in_tier, rest;
  for (std::size_t i = 0; i < n; ++i) {
    auto it = t.index.find(keys[i]);
    if (it == t.index.end()) {
      rest.push_back(keys[i]);
      continue;
    }
    if (t.slots[it->second].where != impl::below::no) in_tier.push_back(keys[i]);
    t.remove(it->second);  // a repeated key is found once
  }
  std::size_t count = n - rest.size();
  // The keys the tier held are erased below too (their count is already in); the others count
  // as the lower store says. A repeat of a tier key in `rest` is below only when in `in_tier`.
  std::sort(in_tier.begin(), in_tier.end());
  std::vector<Key> others;
  for (Key k : rest)
    if (!std::binary_search(in_tier.begin(), in_tier.end(), k)) others.push_back(k);
  EMBCACHE_RETURN_IF_ERROR(t.lower->erase(in_tier.data(), in_tier.size()));
  std::size_t below = 0;
  EMBCACHE_RETURN_IF_ERROR(t.lower->erase(others.data(), others.size(), &below));
  if (erased_out) *erased_out = count + below;
  return {};
}

template <class Key>
status tiered_store<Key>::contains(const Key* keys, std::size_t n, bool* found_out) {
  auto& t = *impl_;
  if (n == 0) return {};
  if (!keys || !found_out)
    return status::invalid_argument(t.who + ": contains needs keys and found_out");
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<std::size_t> miss;
  for (std::size_t i = 0; i < n; ++i) {
    found_out[i] = t.index.count(keys[i]) != 0;
    if (!found_out[i]) miss.push_back(i);
  }
  if (miss.empty()) return {};
  std::vector<Key> k(miss.size());
  for (std::size_t j = 0; j < miss.size(); ++j) k[j] = keys[miss[j]];
  std::unique_ptr<bool[]> found(new bool[k.size()]);
  EMBCACHE_RETURN_IF_ERROR(t.lower->contains(k.data(), k.size(), found.get()));
  for (std::size_t j = 0; j < miss.size(); ++j) found_out[miss[j]] = found[j];
  return {};
}

template <class Key>
std::size_t tiered_store<Key>::size() const noexcept {
  auto& t = *impl_;
  std::lock_guard<std::mutex> lock(t.mutex);
  t.resolve_unknown();
  return t.lower->size() + t.not_below + t.unknown;
}

template <class Key>
std::uint64_t tiered_store<Key>::max_version() const noexcept {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->max_version();
}

template <class Key>
status tiered_store<Key>::for_each(std::size_t batch_size, const store_batch_fn<Key>& fn) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    EMBCACHE_RETURN_IF_ERROR(impl_->write_down_all());
  }
  return impl_->lower->for_each(batch_size, fn);
}

template <class Key>
status tiered_store<Key>::for_each_changed_since(std::uint64_t version, std::size_t batch_size,
                                                 const store_batch_fn<Key>& fn) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    EMBCACHE_RETURN_IF_ERROR(impl_->write_down_all());
  }
  return impl_->lower->for_each_changed_since(version, batch_size, fn);
}

template <class Key>
status tiered_store<Key>::flush() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  EMBCACHE_RETURN_IF_ERROR(impl_->write_down_all());
  return impl_->lower->flush();
}

template <class Key>
status tiered_store<Key>::checkpoint(const std::string& dir) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  EMBCACHE_RETURN_IF_ERROR(impl_->write_down_all());
  EMBCACHE_RETURN_IF_ERROR(impl_->lower->flush());
  return impl_->lower->checkpoint(dir);
}

template <class Key>
tiered_store_counters tiered_store<Key>::counters() const {
  auto& t = *impl_;
  std::lock_guard<std::mutex> lock(t.mutex);
  tiered_store_counters c = t.stats;
  c.rows = t.rows();
  c.dirty_rows = t.dirty;
  c.bytes = c.rows * dram_row_bytes(t.width);
  return c;
}

template class tiered_store<std::int64_t>;
template class tiered_store<std::uint32_t>;

}  // namespace embcache
