// Conformance suite of embedding_cache, typed over spaces. Included by the host test (g++) and
// by the cuda test (nvcc); each instantiates it for the spaces it has.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/cuda_device.hpp"
#include "common/status_assertions.hpp"
#include "embcache/buffer.hpp"
#include "embcache/detail/embedding_cache_access.hpp"
#include "embcache/embedding_cache.hpp"
#include "embcache/embedding_cache_ref.hpp"

namespace embcache::testing {

template <class K, class S>
struct cache_case {
  using key_type = K;
  using space_type = S;
};

// Runs cache calls on host vectors, copying through the space's memory.
template <class Key, class Space>
class harness {
 public:
  explicit harness(cache_options o, Space space = {}) : cache(o, space) {}

  template <class T>
  buffer<T, Space> to_space(const std::vector<T>& v) {
    buffer<T, Space> b(v.size(), space_);
    if (!v.empty()) b.copy_from_host(v.data(), v.size());
    return b;
  }
  template <class T>
  std::vector<T> to_host(const buffer<T, Space>& b, std::size_t n) {
    std::vector<T> v(n);
    if (n) b.copy_to_host(v.data(), n);
    return v;
  }

  std::vector<bool> bools_to_host(const buffer<bool, Space>& b, std::size_t n) {
    std::unique_ptr<bool[]> tmp(new bool[n ? n : 1]);
    if (n) b.copy_to_host(tmp.get(), n);
    return std::vector<bool>(tmp.get(), tmp.get() + n);
  }

  struct find_result {
    std::vector<float> rows;
    std::vector<bool> found;
  };
  find_result find(const std::vector<Key>& keys) {
    auto k = to_space(keys);
    buffer<float, Space> rows(keys.size() * cache.row_width(), space_);
    buffer<bool, Space> found(keys.size(), space_);
    rows.fill_bytes(poison_byte);  // the rows of missing keys must stay as they were
    cache.find(k.data(), keys.size(), rows.data(), found.data());
    find_result r{to_host(rows, rows.size()), bools_to_host(found, keys.size())};
    for (std::size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(r.found[i], !is_poison(r.rows, i))
          << "find: the row of key " << keys[i]
          << (r.found[i] ? " was not written" : " (missing) was written");
    }
    return r;
  }
  // A byte pattern no row holds (every float NaN): outputs are filled with it before a call,
  // so a row the call did not write is seen, and device memory is never read uninitialized.
  static constexpr int poison_byte = 0xFF;
  bool is_poison(const std::vector<float>& rows, std::size_t i) const {
    const std::size_t w = cache.row_width();
    const auto* bytes = reinterpret_cast<const unsigned char*>(rows.data() + i * w);
    return std::all_of(bytes, bytes + w * sizeof(float),
                       [](unsigned char b) { return b == poison_byte; });
  }
  status find_or_insert(const std::vector<Key>& keys, std::vector<float>* rows_out = nullptr,
                        std::vector<bool>* inserted_out = nullptr) {
    auto k = to_space(keys);
    buffer<float, Space> rows(keys.size() * cache.row_width(), space_);
    buffer<bool, Space> ins(keys.size(), space_);
    rows.fill_bytes(poison_byte);
    ins.fill_bytes(0);
    status s = cache.find_or_insert(k.data(), keys.size(), rows.data(), ins.data());
    auto got = to_host(rows, rows.size());
    for (std::size_t i = 0; s.ok() && i < keys.size(); ++i) {
      EXPECT_FALSE(is_poison(got, i))
          << "find_or_insert: the row of key " << keys[i] << " was not written";
    }
    if (rows_out) *rows_out = std::move(got);
    if (inserted_out) *inserted_out = bools_to_host(ins, keys.size());
    return s;
  }
  status insert_or_assign(const std::vector<Key>& keys, const std::vector<float>& rows) {
    auto k = to_space(keys);
    auto r = to_space(rows);
    return cache.insert_or_assign(k.data(), keys.size(), r.data());
  }
  std::size_t erase(const std::vector<Key>& keys) {
    auto k = to_space(keys);
    std::size_t n = 0;
    cache.erase(k.data(), keys.size(), &n);
    return n;
  }
  std::vector<std::int64_t> slots(const std::vector<Key>& keys, bool insert = false) {
    auto k = to_space(keys);
    buffer<std::int64_t, Space> s(keys.size(), space_);
    EMBCACHE_EXPECT_OK(cache.lookup_slots(k.data(), keys.size(), s.data(), insert));
    return to_host(s, keys.size());
  }
  std::vector<float> read_slots(const std::vector<std::int64_t>& slots) {
    auto s = to_space(slots);
    buffer<float, Space> rows(slots.size() * cache.row_width(), space_);
    rows.fill_bytes(0);
    cache.read_slots(s.data(), slots.size(), rows.data());
    return to_host(rows, rows.size());
  }
  void assign_slots(const std::vector<std::int64_t>& slots, const std::vector<float>& rows) {
    auto s = to_space(slots);
    auto r = to_space(rows);
    cache.assign_slots(s.data(), slots.size(), r.data());
  }
  void mark_updated(const std::vector<std::int64_t>& slots) {
    auto s = to_space(slots);
    cache.mark_updated(s.data(), slots.size());
  }
  struct evict_result {
    status st;
    std::vector<Key> keys;
    std::vector<float> rows;
    std::vector<std::uint64_t> versions;
    std::vector<bool> found;
    std::vector<std::int64_t> slots;
  };
  evict_result insert_and_evict(const std::vector<Key>& keys,
                                const std::vector<float>* rows_in = nullptr) {
    const std::size_t n = keys.size();
    auto k = to_space(keys);
    buffer<float, Space> rin(rows_in ? rows_in->size() : 0, space_);
    if (rows_in && !rows_in->empty()) rin.copy_from_host(rows_in->data(), rows_in->size());
    buffer<Key, Space> ek(n, space_);
    buffer<float, Space> er(n * cache.row_width(), space_);
    buffer<std::uint64_t, Space> ev(n, space_);
    buffer<bool, Space> found(n, space_);
    buffer<std::int64_t, Space> slots(n, space_);
    buffer<bool, Space> dirty(n, space_);
    std::size_t count = 0;
    evict_result r{cache.insert_and_evict(k.data(), n, rows_in ? rin.data() : nullptr, nullptr,
                                          ek.data(), er.data(), ev.data(), &count, found.data(),
                                          slots.data(), dirty.data())};
    evicted_dirty = bools_to_host(dirty, count);
    r.keys = to_host(ek, count);
    r.rows = to_host(er, count * cache.row_width());
    r.versions = to_host(ev, count);
    r.found = bools_to_host(found, n);
    r.slots = to_host(slots, n);
    return r;
  }
  std::vector<std::int64_t> insert_or_assign_slots(const std::vector<Key>& keys,
                                                   const std::vector<float>& rows,
                                                   const std::vector<std::uint64_t>& versions) {
    auto k = to_space(keys);
    auto r = to_space(rows);
    auto v = to_space(versions);
    buffer<std::int64_t, Space> s(keys.size(), space_);
    EMBCACHE_EXPECT_OK(cache.insert_or_assign(k.data(), keys.size(), r.data(),
                                              versions.empty() ? nullptr : v.data(), s.data()));
    return to_host(s, keys.size());
  }
  std::vector<std::int64_t> find_or_insert_slots(const std::vector<Key>& keys) {
    auto k = to_space(keys);
    buffer<std::int64_t, Space> s(keys.size(), space_);
    EMBCACHE_EXPECT_OK(cache.find_or_insert(k.data(), keys.size(), nullptr, nullptr, s.data()));
    return to_host(s, keys.size());
  }
  void mark_synced(const std::vector<std::int64_t>& slots,
                   const std::vector<std::uint64_t>& versions = {}) {
    auto s = to_space(slots);
    auto v = to_space(versions);
    cache.mark_synced(s.data(), slots.size(), versions.empty() ? nullptr : v.data());
  }
  status install(const std::vector<Key>& keys, const std::vector<float>& rows,
                 const std::vector<std::uint64_t>& versions,
                 const std::vector<std::uint64_t>& synced, std::uint32_t mark) {
    auto k = to_space(keys);
    auto r = to_space(rows);
    auto v = to_space(versions);
    auto y = to_space(synced);
    return cache.install(k.data(), keys.size(), r.data(), versions.empty() ? nullptr : v.data(),
                         synced.empty() ? nullptr : y.data(), mark);
  }
  void set_marks(const std::vector<std::int64_t>& slots, std::uint32_t mark) {
    auto s = to_space(slots);
    cache.set_marks(s.data(), slots.size(), mark);
  }
  std::vector<std::int64_t> select_victims(std::uint32_t keep, std::size_t need,
                                           victim_order order) {
    buffer<std::int64_t, Space> v(need, space_);
    std::size_t count = need + 1;
    cache.select_victims(keep, need, order, v.data(), &count);
    return to_host(v, count);
  }
  struct dirty_rows {
    std::vector<Key> keys;
    std::vector<float> rows;
    std::vector<std::uint64_t> versions;
    std::vector<std::int64_t> slots;
  };
  dirty_rows gather_dirty(const std::vector<std::int64_t>& slots) {
    const std::size_t n = slots.size();
    auto s = to_space(slots);
    buffer<Key, Space> k(n, space_);
    buffer<float, Space> r(n * cache.row_width(), space_);
    buffer<std::uint64_t, Space> v(n, space_);
    buffer<std::int64_t, Space> o(n, space_);
    std::size_t count = n + 1;
    cache.gather_dirty(s.data(), n, k.data(), r.data(), v.data(), o.data(), &count);
    return {to_host(k, count), to_host(r, count * cache.row_width()), to_host(v, count),
            to_host(o, count)};
  }
  std::size_t erase_slots(const std::vector<std::int64_t>& slots) {
    auto s = to_space(slots);
    std::size_t n = 0;
    cache.erase_slots(s.data(), slots.size(), &n);
    return n;
  }
  std::vector<bool> evicted_dirty;  // of the last insert_and_evict
  exported_rows<Key> export_rows(export_filter f = export_filter::all()) {
    return cache.export_to_host(f).value();
  }

  embedding_cache<Key, Space> cache;

 private:
  // The harness's buffers live where this thread's calls on the cache run (order_calls_on).
  struct calls_space {
    const embedding_cache<Key, Space>* cache;
    operator Space() const { return cache->call_space(); }  // NOLINT
  };
  calls_space space_{&cache};
};

template <class Key>
std::vector<float> expected_initial_row(const cache_options& o, Key key) {
  std::vector<float> r(o.dim + o.state_width);
  const auto kb = static_cast<std::uint64_t>(static_cast<std::int64_t>(key));
  for (std::size_t j = 0; j < o.dim; ++j)
    r[j] = detail::initial_value(o.init, o.init.scale * 1.7320508075688772f, kb, j);
  for (std::size_t j = o.dim; j < r.size(); ++j) r[j] = o.init.state_value;
  return r;
}

inline cache_options small_options(std::size_t slots = 1024, std::size_t dim = 4,
                                   std::size_t state = 2) {
  cache_options o;
  o.slots = slots;
  o.dim = dim;
  o.state_width = state;
  o.init.seed = 42;
  o.init.state_value = 0.5f;
  return o;
}

// Further values of a space, for order_calls_on: `threads` workers on the host, a stream of its
// own on the device.
template <class Space>
struct another_space;
template <>
struct another_space<host_space> {
  explicit another_space(int threads) : threads_(threads) {}
  host_space space() const { return host_space{threads_}; }

 private:
  int threads_;
};
template <>
struct another_space<cuda_space> : cuda_stream {
  explicit another_space(int) {}
};
inline bool same_space(const host_space& a, const host_space& b) {
  return a.max_threads == b.max_threads;
}
inline bool same_space(const cuda_space& a, const cuda_space& b) { return a.stream == b.stream; }

template <class Case>
class cache_conformance : public ::testing::Test {
 protected:
  using Key = typename Case::key_type;
  using Space = typename Case::space_type;
  void SetUp() override {
    if constexpr (is_cuda_space_v<Space>) EMBCACHE_NEED_CUDA_DEVICE();
  }
  static std::vector<Key> range_keys(std::size_t n, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::unordered_set<Key> seen;
    std::vector<Key> v;
    while (v.size() < n) {
      Key k = static_cast<Key>(g());
      if (seen.insert(k).second) v.push_back(k);
    }
    return v;
  }
};

TYPED_TEST_SUITE_P(cache_conformance);

TYPED_TEST_P(cache_conformance, empty_finds_nothing) {
  using Key = typename TypeParam::key_type;
  harness<Key, typename TypeParam::space_type> h(small_options());
  auto r = h.find({1, 2, 3});
  EXPECT_EQ(r.found, std::vector<bool>({false, false, false}));
  EXPECT_EQ(h.cache.size(), 0u);
  EXPECT_EQ(h.cache.slots(), 1024u);
}

TYPED_TEST_P(cache_conformance, find_or_insert_initializes_deterministically) {
  using Key = typename TypeParam::key_type;
  auto o = small_options();
  harness<Key, typename TypeParam::space_type> h(o);
  auto keys = this->range_keys(500, 1);
  std::vector<float> rows;
  std::vector<bool> inserted;
  EMBCACHE_ASSERT_OK(h.find_or_insert(keys, &rows, &inserted));
  EXPECT_EQ(h.cache.size(), 500u);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(inserted[i]);
    auto e = expected_initial_row(o, keys[i]);
    ASSERT_TRUE(std::equal(e.begin(), e.end(), rows.begin() + i * 6)) << "key index " << i;
  }
  // Second time: found, same rows, nothing inserted.
  std::vector<float> rows2;
  EMBCACHE_ASSERT_OK(h.find_or_insert(keys, &rows2, &inserted));
  EXPECT_EQ(rows, rows2);
  EXPECT_EQ(std::count(inserted.begin(), inserted.end(), true), 0);
  auto f = h.find(keys);
  EXPECT_EQ(f.rows, rows);
  EXPECT_EQ(std::count(f.found.begin(), f.found.end(), true), 500);
}

TYPED_TEST_P(cache_conformance, initializer_kinds_have_their_shape) {
  using Key = typename TypeParam::key_type;
  for (init_kind kind : {init_kind::uniform, init_kind::normal, init_kind::constant}) {
    auto o = small_options(8192, 16, 0);
    o.init.kind = kind;
    o.init.scale = 0.1f;
    harness<Key, typename TypeParam::space_type> h(o);
    auto keys = this->range_keys(4000, 7);
    std::vector<float> rows;
    EMBCACHE_ASSERT_OK(h.find_or_insert(keys, &rows));
    double sum = 0, sq = 0;
    float lo = 1e9f, hi = -1e9f;
    for (float v : rows) {
      sum += v;
      sq += double(v) * v;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    const double mean = sum / rows.size(), sd = std::sqrt(sq / rows.size() - mean * mean);
    if (kind == init_kind::uniform) {
      EXPECT_GE(lo, -0.1f);
      EXPECT_LT(hi, 0.1f);
      EXPECT_NEAR(sd, 0.1 / std::sqrt(3.0), 0.003);
    } else if (kind == init_kind::normal) {
      EXPECT_NEAR(mean, 0.0, 0.003);
      EXPECT_NEAR(sd, 0.1, 0.003);
    } else {
      EXPECT_EQ(lo, 0.1f);
      EXPECT_EQ(hi, 0.1f);
    }
  }
}

TYPED_TEST_P(cache_conformance, insert_or_assign_overwrites_and_last_duplicate_wins) {
  using Key = typename TypeParam::key_type;
  harness<Key, typename TypeParam::space_type> h(small_options(1024, 2, 0));
  EMBCACHE_ASSERT_OK(h.insert_or_assign({10, 20, 10, 30, 10}, {1, 1, 2, 2, 3, 3, 4, 4, 5, 5}));
  EXPECT_EQ(h.cache.size(), 3u);
  auto f = h.find({10, 20, 30});
  EXPECT_EQ(f.rows, std::vector<float>({5, 5, 2, 2, 4, 4}));
  EMBCACHE_ASSERT_OK(h.insert_or_assign({20, 20}, {7, 7, 8, 8}));
  EXPECT_EQ(h.find({20}).rows, std::vector<float>({8, 8}));
  EXPECT_EQ(h.cache.size(), 3u);
}

TYPED_TEST_P(cache_conformance, duplicates_in_find_or_insert_insert_once) {
  using Key = typename TypeParam::key_type;
  auto o = small_options();
  harness<Key, typename TypeParam::space_type> h(o);
  std::vector<Key> keys;
  for (int rep = 0; rep < 50; ++rep)
    for (Key k = 1; k <= 40; ++k) keys.push_back(k * 7919);
  std::vector<float> rows;
  std::vector<bool> inserted;
  EMBCACHE_ASSERT_OK(h.find_or_insert(keys, &rows, &inserted));
  EXPECT_EQ(h.cache.size(), 40u);
  EXPECT_EQ(std::count(inserted.begin(), inserted.end(), true), 40);
  std::map<Key, int> per_key;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    per_key[keys[i]] += inserted[i];
    auto e = expected_initial_row(o, keys[i]);
    ASSERT_TRUE(std::equal(e.begin(), e.end(), rows.begin() + i * 6));
  }
  for (auto& [k, c] : per_key) EXPECT_EQ(c, 1) << "key " << k;
}

// Past the 4096 keys of the host's pipelined lookup too: every key of a batch with repeats is
// inserted once, and exactly one of its occurrences (any one) reports it; all see one row and
// one slot.
TYPED_TEST_P(cache_conformance, repeated_keys_report_one_insertion_each_in_a_long_batch) {
  using Key = typename TypeParam::key_type;
  auto o = small_options(16384, 2, 0);
  harness<Key, typename TypeParam::space_type> h(o);
  const auto distinct = this->range_keys(5000, 11);
  std::vector<Key> keys;
  for (int rep = 0; rep < 3; ++rep) keys.insert(keys.end(), distinct.begin(), distinct.end());
  std::shuffle(keys.begin(), keys.end(), std::mt19937_64(12));
  std::vector<float> rows;
  std::vector<bool> inserted;
  EMBCACHE_ASSERT_OK(h.find_or_insert(keys, &rows, &inserted));
  EXPECT_EQ(h.cache.size(), 5000u);
  std::map<Key, int> per_key;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    per_key[keys[i]] += inserted[i];
    auto e = expected_initial_row(o, keys[i]);
    ASSERT_TRUE(std::equal(e.begin(), e.end(), rows.begin() + i * 2)) << "batch index " << i;
  }
  ASSERT_EQ(per_key.size(), 5000u);
  for (auto& [k, c] : per_key) ASSERT_EQ(c, 1) << "key " << k;
  // lookup_slots with insert_missing keeps the same promise, and every occurrence gets one slot.
  const auto more = this->range_keys(9000, 13);
  std::vector<Key> fresh(more.begin() + 5000, more.end());
  std::vector<Key> batch;
  for (int rep = 0; rep < 2; ++rep) batch.insert(batch.end(), fresh.begin(), fresh.end());
  std::shuffle(batch.begin(), batch.end(), std::mt19937_64(14));
  auto k = h.to_space(batch);
  buffer<std::int64_t, typename TypeParam::space_type> slots(batch.size());
  buffer<bool, typename TypeParam::space_type> ins(batch.size());
  EMBCACHE_ASSERT_OK(h.cache.lookup_slots(k.data(), batch.size(), slots.data(), true, ins.data()));
  const auto s = h.to_host(slots, batch.size());
  const auto b = h.bools_to_host(ins, batch.size());
  std::map<Key, std::pair<int, std::int64_t>> seen;  // insertions, slot
  for (std::size_t i = 0; i < batch.size(); ++i) {
    auto [it, first] = seen.try_emplace(batch[i], 0, s[i]);
    it->second.first += b[i];
    ASSERT_EQ(it->second.second, s[i]) << "key " << batch[i];
  }
  for (auto& [key, v] : seen) ASSERT_EQ(v.first, 1) << "key " << key;
}

// The claim epochs of last-writer-wins (insert_or_assign, assign_slots) re-base before they
// reach 2^32: writes after that many calls are not skipped, and the last occurrence still wins.
TYPED_TEST_P(cache_conformance, writes_near_the_end_of_the_claim_epochs_are_not_skipped) {
  using Key = typename TypeParam::key_type;
  using access = detail::embedding_cache_access;
  harness<Key, typename TypeParam::space_type> h(small_options(1024, 2, 0));
  EMBCACHE_ASSERT_OK(h.insert_or_assign({1, 2, 1}, {1, 1, 2, 2, 3, 3}));
  const auto s = h.slots({1, 2});
  const std::uint64_t end = std::uint64_t{1} << 32;
  access::set_claim_epoch(h.cache, end - 3);
  for (int call = 0; call < 6; ++call) {
    const float v = float(10 + call);
    if (call % 2 == 0) {
      EMBCACHE_ASSERT_OK(h.insert_or_assign({1, 2, 1}, {0, 0, v, v, v + 100, v + 100}));
    } else {
      h.assign_slots({s[0], s[1], s[0]}, {0, 0, v, v, v + 100, v + 100});
    }
    EXPECT_EQ(h.find({1, 2}).rows, std::vector<float>({v + 100, v + 100, v, v}))
        << "call " << call << ", claim epoch " << access::claim_epoch(h.cache);
  }
  // Two calls took the last two epochs; the third re-based, and four calls took epochs 1 to 4.
  EXPECT_EQ(access::claim_epoch(h.cache), 4u);
  EXPECT_EQ(h.cache.size(), 2u);
}

// The table's arrays hold what bytes_per_slot and bytes_per_bucket say, with LRU and with LFU:
// the count memory budgets use (trainer_memory.cpp) cannot drift from the real arrays.
TYPED_TEST_P(cache_conformance, the_table_holds_what_bytes_per_slot_says) {
  using Key = typename TypeParam::key_type;
  using cache_type = embedding_cache<Key, typename TypeParam::space_type>;
  for (score_policy policy : {score_policy::lru, score_policy::lfu}) {
    auto o = small_options(1000, 4, 2);
    o.scores = policy;
    harness<Key, typename TypeParam::space_type> h(o);
    ASSERT_EQ(h.cache.slots(), 1024u);  // 8 buckets
    EXPECT_EQ(h.cache.allocated_bytes(),
              1024 * cache_type::bytes_per_slot(o) + 8 * cache_type::bytes_per_bucket);
    // 6 floats; state byte; key; version, score, claim and synced words; mark; LFU's touch op.
    EXPECT_EQ(cache_type::bytes_per_slot(o),
              24 + 1 + sizeof(Key) + 32 + 4 + (policy == score_policy::lfu ? 8 : 0));
  }
}

TYPED_TEST_P(cache_conformance, erase_removes_once_and_allows_reinsert) {
  using Key = typename TypeParam::key_type;
  harness<Key, typename TypeParam::space_type> h(small_options());
  auto keys = this->range_keys(300, 3);
  EMBCACHE_ASSERT_OK(h.find_or_insert(keys));
  std::vector<Key> gone(keys.begin(), keys.begin() + 100);
  auto dup = gone;
  dup.insert(dup.end(), gone.begin(), gone.end());
  dup.push_back(static_cast<Key>(123456789));  // absent: ignored
  EXPECT_EQ(h.erase(dup), 100u);
  EXPECT_EQ(h.cache.size(), 200u);
  auto f = h.find(keys);
  for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(f.found[i], i >= 100) << i;
  EMBCACHE_ASSERT_OK(h.find_or_insert(gone));
  EXPECT_EQ(h.cache.size(), 300u);
  EXPECT_EQ(h.erase({}), 0u);
}

TYPED_TEST_P(cache_conformance, every_key_value_is_a_key) {
  using Key = typename TypeParam::key_type;
  using L = std::numeric_limits<Key>;
  harness<Key, typename TypeParam::space_type> h(small_options(1024, 1, 0));
  std::vector<Key> keys = {0,
                           1,
                           std::is_signed_v<Key> ? static_cast<Key>(-1) : Key(2),
                           std::is_signed_v<Key> ? L::min() : Key(3),
                           L::max(),
                           static_cast<Key>(L::max() - 1)};
  std::vector<float> rows = {1, 2, 3, 4, 5, 6};
  EMBCACHE_ASSERT_OK(h.insert_or_assign(keys, rows));
  EXPECT_EQ(h.cache.size(), keys.size());
  auto f = h.find(keys);
  EXPECT_EQ(f.rows, rows);
  EXPECT_EQ(h.erase({0, L::max()}), 2u);
  auto g = h.find(keys);
  EXPECT_EQ(g.found, std::vector<bool>({false, true, true, true, false, true}));
}

TYPED_TEST_P(cache_conformance, full_table_is_a_clear_status) {
  using Key = typename TypeParam::key_type;
  harness<Key, typename TypeParam::space_type> h(small_options(256, 2, 0));
  ASSERT_EQ(h.cache.slots(), 256u);
  auto keys = this->range_keys(300, 5);
  status s = h.find_or_insert(keys);
  EXPECT_EQ(s.code(), status_code::capacity_exceeded);
  EXPECT_NE(s.message().find("no room for 44 of 300 keys"), std::string::npos) << s.message();
  EXPECT_EQ(h.cache.size(), 256u);
  auto f = h.find(keys);
  EXPECT_EQ(std::count(f.found.begin(), f.found.end(), true), 256);
  // A full table still answers and still takes assignments to resident keys.
  std::vector<Key> resident;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (f.found[i]) resident.push_back(keys[i]);
  EMBCACHE_EXPECT_OK(h.insert_or_assign({resident[0]}, {9, 9}));
  EXPECT_EQ(h.insert_or_assign({resident[1], static_cast<Key>(987654321)}, {1, 1, 2, 2}).code(),
            status_code::capacity_exceeded);
  EXPECT_EQ(h.find({resident[1]}).rows, std::vector<float>({1, 1}));
  // After erasing, the room is usable again, including by keys that probed past full buckets.
  EXPECT_EQ(h.erase(resident), 256u);
  EXPECT_EQ(h.cache.size(), 0u);
  EMBCACHE_EXPECT_OK(h.find_or_insert(std::vector<Key>(keys.begin(), keys.begin() + 256)));
  EXPECT_EQ(h.cache.size(), 256u);
}

TYPED_TEST_P(cache_conformance, slots_read_assign_and_versions) {
  using Key = typename TypeParam::key_type;
  harness<Key, typename TypeParam::space_type> h(small_options(1024, 2, 1));
  auto s = h.slots({5, 6}, false);
  EXPECT_EQ(s, std::vector<std::int64_t>({-1, -1}));
  s = h.slots({5, 6, 5}, true);
  EXPECT_EQ(h.cache.size(), 2u);
  EXPECT_EQ(s[0], s[2]);
  EXPECT_NE(s[0], s[1]);
  const std::uint64_t v0 = h.cache.version();
  h.assign_slots({s[0], s[1], s[0], -1}, {1, 1, 1, 2, 2, 2, 3, 3, 3, 9, 9, 9});
  EXPECT_EQ(h.read_slots({s[1], s[0], -1}), std::vector<float>({2, 2, 2, 3, 3, 3, 0, 0, 0}));
  EXPECT_EQ(h.find({5}).rows, std::vector<float>({3, 3, 3}));
  auto changed = h.export_rows(export_filter::changed_since(v0));
  EXPECT_EQ(changed.keys, std::vector<Key>({5, 6}));
  const std::uint64_t v1 = h.cache.version();
  EXPECT_TRUE(h.export_rows(export_filter::changed_since(v1)).keys.empty());
  h.mark_updated({s[1]});
  EXPECT_EQ(h.export_rows(export_filter::changed_since(v1)).keys, std::vector<Key>({6}));
  EXPECT_GT(h.cache.version(), v1);
}

TYPED_TEST_P(cache_conformance, export_all_is_sorted_with_rows_and_versions) {
  using Key = typename TypeParam::key_type;
  auto o = small_options(4096, 3, 0);
  harness<Key, typename TypeParam::space_type> h(o);
  auto keys = this->range_keys(2000, 11);
  EMBCACHE_ASSERT_OK(h.find_or_insert(keys));
  const std::uint64_t v = h.cache.version();
  std::vector<Key> some(keys.begin(), keys.begin() + 10);
  std::vector<float> rows(30, 1.5f);
  EMBCACHE_ASSERT_OK(h.insert_or_assign(some, rows));
  auto all = h.export_rows();
  auto sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(all.keys, sorted);
  for (std::size_t i = 0; i < all.keys.size(); ++i) {
    const bool touched = std::find(some.begin(), some.end(), all.keys[i]) != some.end();
    auto e = touched ? std::vector<float>(3, 1.5f) : expected_initial_row(o, all.keys[i]);
    ASSERT_TRUE(std::equal(e.begin(), e.end(), all.rows.begin() + i * 3));
    EXPECT_EQ(all.versions[i] > v, touched);
  }
  auto changed = h.export_rows(export_filter::changed_since(v));
  std::sort(some.begin(), some.end());
  EXPECT_EQ(changed.keys, some);
  // A too-small output is refused, not overrun.
  buffer<Key, typename TypeParam::space_type> k(5);
  std::size_t count = 0;
  EXPECT_EQ(h.cache.export_if(export_filter::all(), k.data(), nullptr, nullptr, 5, &count).code(),
            status_code::capacity_exceeded);
}

TYPED_TEST_P(cache_conformance, insert_and_evict_lru_order) {
  using Key = typename TypeParam::key_type;
  auto o = small_options(128, 2, 0);  // one bucket: every key competes
  harness<Key, typename TypeParam::space_type> h(o);
  for (Key k = 0; k < 128; ++k) {
    auto r = h.insert_and_evict({k});
    EMBCACHE_ASSERT_OK(r.st);
    ASSERT_TRUE(r.keys.empty());
  }
  EXPECT_EQ(h.cache.size(), 128u);
  h.find({0, 1});  // now the most recent
  auto r = h.insert_and_evict({1000, 1001, 1002});
  EMBCACHE_ASSERT_OK(r.st);
  EXPECT_EQ(r.keys, std::vector<Key>({2, 3, 4}));
  EXPECT_EQ(r.found, std::vector<bool>({false, false, false}));
  // The victims come back with their rows.
  for (std::size_t i = 0; i < r.keys.size(); ++i) {
    auto e = expected_initial_row(o, r.keys[i]);
    EXPECT_TRUE(std::equal(e.begin(), e.end(), r.rows.begin() + i * 2));
  }
  // Hits are not inserted and evict nothing; a key of this call is never evicted by it.
  r = h.insert_and_evict({1000, 5, 2000, 1000});
  EMBCACHE_ASSERT_OK(r.st);
  EXPECT_EQ(r.found, std::vector<bool>({true, true, false, true}));
  EXPECT_EQ(r.keys, std::vector<Key>({6}));
  EXPECT_EQ(h.cache.size(), 128u);
  auto f = h.find({0, 1, 2, 3, 4, 5, 6, 1000, 1001, 1002, 2000});
  EXPECT_EQ(f.found, std::vector<bool>(
                         {true, true, false, false, false, true, false, true, true, true, true}));
}

TYPED_TEST_P(cache_conformance, insert_and_evict_lfu_order_and_overflowing_batch) {
  using Key = typename TypeParam::key_type;
  auto o = small_options(128, 1, 0);
  o.scores = score_policy::lfu;
  harness<Key, typename TypeParam::space_type> h(o);
  std::vector<Key> keys(128);
  std::iota(keys.begin(), keys.end(), Key{0});
  EMBCACHE_ASSERT_OK(h.insert_and_evict(keys).st);
  for (Key k = 0; k < 128; ++k)
    if (k != 50) h.find({k});  // every key is used twice but 50
  h.find({7});                 // 7 three times
  auto r = h.insert_and_evict({500});
  EXPECT_EQ(r.keys, std::vector<Key>({50}));
  // 129 distinct keys of one bucket in one call: one of them cannot be placed.
  std::vector<Key> many(129);
  std::iota(many.begin(), many.end(), Key{1000});
  r = h.insert_and_evict(many);
  EXPECT_EQ(r.st.code(), status_code::capacity_exceeded);
  EXPECT_EQ(std::count(r.slots.begin(), r.slots.end(), std::int64_t{-1}), 1);
  EXPECT_EQ(r.keys.size(), 128u);
  EXPECT_EQ(h.cache.size(), 128u);
}

TYPED_TEST_P(cache_conformance, insert_and_evict_uses_given_rows) {
  using Key = typename TypeParam::key_type;
  harness<Key, typename TypeParam::space_type> h(small_options(1024, 2, 0));
  std::vector<float> rows = {1, 2, 3, 4};
  auto r = h.insert_and_evict({77, 78}, &rows);
  EMBCACHE_ASSERT_OK(r.st);
  EXPECT_EQ(h.find({78, 77}).rows, std::vector<float>({3, 4, 1, 2}));
}

TYPED_TEST_P(cache_conformance, clear_empties_and_keeps_the_version_clock) {
  using Key = typename TypeParam::key_type;
  harness<Key, typename TypeParam::space_type> h(small_options());
  EMBCACHE_ASSERT_OK(h.find_or_insert(this->range_keys(100, 9)));
  const auto v = h.cache.version();
  h.cache.clear();
  EXPECT_EQ(h.cache.size(), 0u);
  EXPECT_EQ(h.cache.version(), v);
  EXPECT_TRUE(h.export_rows().keys.empty());
  EMBCACHE_ASSERT_OK(h.find_or_insert(this->range_keys(100, 9)));
  EXPECT_EQ(h.cache.size(), 100u);
}

TYPED_TEST_P(cache_conformance, randomized_differential_against_unordered_map) {
  using Key = typename TypeParam::key_type;
  auto o = small_options(16384, 2, 0);
  harness<Key, typename TypeParam::space_type> h(o);
  std::unordered_map<Key, std::pair<float, float>> ref;
  std::mt19937_64 g(2024);
  const std::size_t batches = 1000, batch = 1000;  // 1e6 operations
  std::size_t total_ops = 0;
  for (std::size_t b = 0; b < batches; ++b) {
    const int kind = static_cast<int>(g() % 4);
    // Key space of 15000 in 16384 slots: loads up to ~0.9, bucket overflow happens.
    std::vector<Key> keys(batch);
    for (auto& k : keys) k = static_cast<Key>(g() % 15000) * 2654435761u;
    total_ops += batch;
    if (kind == 0) {  // find
      auto f = h.find(keys);
      for (std::size_t i = 0; i < batch; ++i) {
        auto it = ref.find(keys[i]);
        ASSERT_EQ(f.found[i], it != ref.end()) << "batch " << b << " index " << i;
        if (it != ref.end()) {
          ASSERT_EQ(f.rows[2 * i], it->second.first);
          ASSERT_EQ(f.rows[2 * i + 1], it->second.second);
        }
      }
    } else if (kind == 1) {  // insert_or_assign, last duplicate wins
      std::vector<float> rows(2 * batch);
      for (std::size_t i = 0; i < batch; ++i) {
        rows[2 * i] = float(b);
        rows[2 * i + 1] = float(i);
        ref[keys[i]] = {float(b), float(i)};
      }
      EMBCACHE_ASSERT_OK(h.insert_or_assign(keys, rows));
    } else if (kind == 2) {  // find_or_insert
      std::vector<float> rows;
      EMBCACHE_ASSERT_OK(h.find_or_insert(keys, &rows));
      for (std::size_t i = 0; i < batch; ++i) {
        auto it = ref.find(keys[i]);
        if (it == ref.end()) {
          auto e = expected_initial_row(o, keys[i]);
          it = ref.emplace(keys[i], std::make_pair(e[0], e[1])).first;
        }
        ASSERT_EQ(rows[2 * i], it->second.first);
        ASSERT_EQ(rows[2 * i + 1], it->second.second);
      }
    } else {  // erase
      std::size_t expect = 0;
      for (auto k : keys) expect += ref.erase(k);
      ASSERT_EQ(h.erase(keys), expect);
    }
    ASSERT_EQ(h.cache.size(), ref.size()) << "batch " << b;
  }
  EXPECT_GE(total_ops, 1000000u);
  auto all = h.export_rows();
  ASSERT_EQ(all.keys.size(), ref.size());
  for (std::size_t i = 0; i < all.keys.size(); ++i) {
    auto it = ref.find(all.keys[i]);
    ASSERT_NE(it, ref.end());
    EXPECT_EQ(all.rows[2 * i], it->second.first);
  }
}

TYPED_TEST_P(cache_conformance, inserts_hand_back_their_slots) {
  using Key = typename TypeParam::key_type;
  harness<Key, typename TypeParam::space_type> h(small_options(1024, 2, 0));
  const std::vector<Key> keys = {7, 3, 7, 11};
  auto s = h.insert_or_assign_slots(keys, {1, 1, 2, 2, 3, 3, 4, 4}, {});
  EXPECT_EQ(s, h.slots(keys));
  EXPECT_EQ(s[0], s[2]);
  auto f = h.find_or_insert_slots({3, 5, 5});
  EXPECT_EQ(f, h.slots({3, 5, 5}));
  EXPECT_EQ(f[0], s[1]);
  EXPECT_GE(f[1], 0);
  EXPECT_EQ(h.cache.size(), 4u);
}

// Dirty = written since the store last held the row; every new row starts dirty.
TYPED_TEST_P(cache_conformance, dirty_rows_follow_syncs_and_writes) {
  using Key = typename TypeParam::key_type;
  harness<Key, typename TypeParam::space_type> h(small_options(1024, 2, 1));
  const std::vector<Key> keys = {10, 20, 30, 40};
  auto s = h.insert_or_assign_slots(keys, std::vector<float>(12, 1.0f), {5, 6, 7, 8});
  auto all = h.gather_dirty(s);
  EXPECT_EQ(all.keys, keys);
  EXPECT_EQ(all.versions, std::vector<std::uint64_t>({5, 6, 7, 8}));
  EXPECT_EQ(all.slots, s);
  EXPECT_EQ(all.rows, std::vector<float>(12, 1.0f));
  h.mark_synced({s[0], s[1], -1, s[2]}, {5, 6, 0, 0});  // version 0: still dirty
  EXPECT_EQ(h.gather_dirty(s).keys, std::vector<Key>({30, 40}));
  h.mark_synced({s[3]});  // at its current version
  EXPECT_EQ(h.gather_dirty(s).keys, std::vector<Key>({30}));
  h.cache.advance_version(8);  // the clock runs past the caller's versions
  h.mark_updated({s[1]});
  h.assign_slots({s[3]}, {9, 9, 9});
  auto d = h.gather_dirty({s[3], -1, s[1], s[2], s[0]});
  EXPECT_EQ(d.keys, std::vector<Key>({40, 20, 30}));
  EXPECT_EQ(d.rows, std::vector<float>({9, 9, 9, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(d.slots, std::vector<std::int64_t>({s[3], s[1], s[2]}));
  // A row inserted into a slot that held a synced row starts dirty.
  h.mark_synced(s);
  EXPECT_TRUE(h.gather_dirty(s).keys.empty());
  EXPECT_EQ(h.erase({10}), 1u);
  EXPECT_TRUE(h.gather_dirty({s[0]}).keys.empty());  // empty slot: skipped
  auto again = h.insert_or_assign_slots({10}, {2, 2, 2}, {1});
  EXPECT_EQ(h.gather_dirty(again).keys, std::vector<Key>({10}));
}

TYPED_TEST_P(cache_conformance, victims_are_unmarked_oldest_then_smallest_key) {
  using Key = typename TypeParam::key_type;
  harness<Key, typename TypeParam::space_type> h(small_options(4096, 1, 0));
  auto keys = this->range_keys(600, 5);
  // Three generations of versions; within one, the key breaks ties.
  std::vector<std::int64_t> slots;
  for (std::size_t g = 0; g < 3; ++g) {
    std::vector<Key> part(keys.begin() + g * 200, keys.begin() + (g + 1) * 200);
    auto s = h.insert_or_assign_slots(part, std::vector<float>(200, 0.f), {});
    slots.insert(slots.end(), s.begin(), s.end());
  }
  // Keep marks: 100 keys at 7 (kept), 100 at 3 (below 5: candidates), 100 at 5 (kept).
  h.set_marks(std::vector<std::int64_t>(slots.begin(), slots.begin() + 100), 7);
  h.set_marks(std::vector<std::int64_t>(slots.begin() + 100, slots.begin() + 200), 3);
  h.set_marks(std::vector<std::int64_t>(slots.begin() + 300, slots.begin() + 400), 5);
  std::vector<std::int64_t> expected;
  for (std::size_t i = 100; i < 600; ++i)
    if (i < 300 || i >= 400) expected.push_back(slots[i]);
  // Candidates in order: generation 0's marked-3 keys by key, then generation 1's unmarked,
  // then generation 2's unmarked past index 400.
  auto ordered = [&](std::size_t a, std::size_t b) {
    std::vector<std::pair<Key, std::int64_t>> v;
    for (std::size_t i = a; i < b; ++i) v.push_back({keys[i], slots[i]});
    std::sort(v.begin(), v.end());
    std::vector<std::int64_t> out;
    for (auto& p : v) out.push_back(p.second);
    return out;
  };
  std::vector<std::int64_t> order = ordered(100, 200);
  for (auto s : ordered(200, 300)) order.push_back(s);
  for (auto s : ordered(400, 600)) order.push_back(s);
  for (std::size_t need : {0u, 1u, 150u, 399u, 400u, 1000u}) {
    std::vector<std::int64_t> want(order.begin(), order.begin() + std::min(need, order.size()));
    std::sort(want.begin(), want.end());
    EXPECT_EQ(h.select_victims(5, need, victim_order::oldest_version), want) << need;
  }
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(h.select_victims(5, 1000, victim_order::oldest_version), expected);
  EXPECT_TRUE(h.select_victims(0, 10, victim_order::oldest_version).empty());
  // A new row carries no mark: after erase and reinsert a kept key is a candidate again.
  EXPECT_EQ(h.erase({keys[0]}), 1u);
  auto re = h.insert_or_assign_slots({keys[0]}, {0.f}, {});
  auto v = h.select_victims(5, 1000, victim_order::oldest_version);
  EXPECT_NE(std::find(v.begin(), v.end(), re[0]), v.end());
  // By score (LRU: the op of the last touch): the keys looked up last go last.
  h.slots(std::vector<Key>(keys.begin() + 100, keys.begin() + 200));
  auto by_score = h.select_victims(5, 300, victim_order::lowest_score);
  EXPECT_EQ(by_score.size(), 300u);
  for (std::size_t i = 100; i < 200; ++i)
    EXPECT_EQ(std::find(by_score.begin(), by_score.end(), slots[i]), by_score.end());
}

// Many candidates, most sharing a version (as the rows of a trained pass do): the choice is still
// oldest version first, then smallest key, whatever the thread count.
TYPED_TEST_P(cache_conformance, victims_among_many_are_oldest_then_smallest_key) {
  using Key = typename TypeParam::key_type;
  harness<Key, typename TypeParam::space_type> h(small_options(65536, 1, 0));
  auto keys = this->range_keys(30000, 9);
  std::vector<Key> old_keys(keys.begin(), keys.begin() + 20000);
  std::vector<Key> new_keys(keys.begin() + 20000, keys.end());
  auto s_old = h.insert_or_assign_slots(old_keys, std::vector<float>(old_keys.size(), 0.f), {});
  auto s_new = h.insert_or_assign_slots(new_keys, std::vector<float>(new_keys.size(), 0.f), {});
  std::vector<std::pair<Key, std::int64_t>> by_key;
  for (std::size_t i = 0; i < old_keys.size(); ++i) by_key.push_back({old_keys[i], s_old[i]});
  std::sort(by_key.begin(), by_key.end());
  for (std::size_t need : {1u, 12345u, 19999u}) {
    std::vector<std::int64_t> want;
    for (std::size_t i = 0; i < need; ++i) want.push_back(by_key[i].second);
    std::sort(want.begin(), want.end());
    EXPECT_EQ(h.select_victims(1, need, victim_order::oldest_version), want) << need;
  }
  // Past the old generation: every old row, then the smallest new keys.
  std::vector<std::pair<Key, std::int64_t>> new_by_key;
  for (std::size_t i = 0; i < new_keys.size(); ++i) new_by_key.push_back({new_keys[i], s_new[i]});
  std::sort(new_by_key.begin(), new_by_key.end());
  std::vector<std::int64_t> want(s_old.begin(), s_old.end());
  for (std::size_t i = 0; i < 777; ++i) want.push_back(new_by_key[i].second);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(h.select_victims(1, 20777, victim_order::oldest_version), want);
}

TYPED_TEST_P(cache_conformance, erase_slots_removes_each_once) {
  using Key = typename TypeParam::key_type;
  harness<Key, typename TypeParam::space_type> h(small_options(1024, 1, 0));
  auto s = h.insert_or_assign_slots({1, 2, 3}, {1, 2, 3}, {});
  EXPECT_EQ(h.erase_slots({s[0], -1, s[2], s[0]}), 2u);
  EXPECT_EQ(h.cache.size(), 1u);
  EXPECT_EQ(h.slots({1, 2, 3}), std::vector<std::int64_t>({-1, s[1], -1}));
  EXPECT_EQ(h.erase_slots({s[0]}), 0u);
  auto again = h.find_or_insert_slots({1, 3});
  EXPECT_GE(again[0], 0);
  EXPECT_GE(again[1], 0);
  EXPECT_EQ(h.cache.size(), 3u);
}

TYPED_TEST_P(cache_conformance, insert_and_evict_says_which_victims_were_dirty) {
  using Key = typename TypeParam::key_type;
  auto o = small_options(128, 1, 0);  // one bucket
  harness<Key, typename TypeParam::space_type> h(o);
  std::vector<Key> first, second;
  for (Key k = 0; k < 128; ++k) first.push_back(k);
  for (Key k = 1000; k < 1128; ++k) second.push_back(k);
  auto r0 = h.insert_and_evict(first);
  ASSERT_TRUE(r0.st.ok());
  std::vector<std::int64_t> even;
  for (std::size_t i = 0; i < 128; i += 2) even.push_back(r0.slots[i]);
  h.mark_synced(even);
  auto r1 = h.insert_and_evict(second);
  ASSERT_TRUE(r1.st.ok());
  ASSERT_EQ(r1.keys.size(), 128u);
  ASSERT_EQ(h.evicted_dirty.size(), 128u);
  for (std::size_t j = 0; j < r1.keys.size(); ++j)
    EXPECT_EQ(h.evicted_dirty[j], r1.keys[j] % 2 == 1) << r1.keys[j];
}

TYPED_TEST_P(cache_conformance, calls_run_where_the_threads_guard_says) {
  using Key = typename TypeParam::key_type;
  using Space = typename TypeParam::space_type;
  harness<Key, Space> h(small_options(4096, 4, 2)), plain(small_options(4096, 4, 2));
  const another_space<Space> one(1), two(2);
  const auto keys = this->range_keys(2000, 7);
  const std::vector<Key> more(keys.begin(), keys.begin() + 300);
  EXPECT_TRUE(same_space(h.cache.call_space(), h.cache.space()));
  EMBCACHE_EXPECT_OK(plain.find_or_insert(keys));
  plain.insert_and_evict(more);
  {
    const auto outer = h.cache.order_calls_on(one.space());
    EXPECT_TRUE(same_space(h.cache.call_space(), one.space()));
    // Per cache and per thread.
    EXPECT_TRUE(same_space(plain.cache.call_space(), plain.cache.space()));
    bool elsewhere = false;
    std::thread([&] { elsewhere = same_space(h.cache.call_space(), h.cache.space()); }).join();
    EXPECT_TRUE(elsewhere);
    EMBCACHE_EXPECT_OK(h.find_or_insert(keys));
    {
      const auto inner = h.cache.order_calls_on(two.space());
      EXPECT_TRUE(same_space(h.cache.call_space(), two.space()));
      h.insert_and_evict(more);
    }
    EXPECT_TRUE(same_space(h.cache.call_space(), one.space()));
    // The same table whatever runs the calls.
    EXPECT_EQ(h.find(keys).rows, plain.find(keys).rows);
    EXPECT_EQ(h.export_rows().keys, plain.export_rows().keys);
  }
  EXPECT_TRUE(same_space(h.cache.call_space(), h.cache.space()));
  EXPECT_EQ(h.export_rows().rows, plain.export_rows().rows);
}

// install is insert_or_assign, mark_synced and set_marks in one call: same rows, versions, dirty
// rows, marks and clocks, for new keys, resident ones and a repeated one, in a batch long enough to
// run in parallel.
TYPED_TEST_P(cache_conformance, install_equals_insert_or_assign_then_sync_and_mark) {
  using Key = typename TypeParam::key_type;
  using Space = typename TypeParam::space_type;
  harness<Key, Space> a(small_options(32768, 2, 1)), b(small_options(32768, 2, 1));
  auto keys = this->range_keys(20000, 11);
  // 3000 residents first (clean at their versions, marked 1), then a batch of 17000 new keys, 1000
  // of the residents and one new key twice.
  std::vector<Key> first(keys.begin(), keys.begin() + 3000);
  std::vector<float> first_rows(first.size() * 3, 0.25f);
  std::vector<std::uint64_t> first_vers(first.size(), 3);
  for (auto* h : {&a, &b}) {
    auto s = h->insert_or_assign_slots(first, first_rows, first_vers);
    h->mark_synced(s);
    h->set_marks(s, 1);
  }
  std::vector<Key> batch(keys.begin() + 2000, keys.end());
  batch.push_back(keys[5000]);
  std::vector<float> rows(batch.size() * 3);
  std::vector<std::uint64_t> vers(batch.size()), synced(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    for (std::size_t j = 0; j < 3; ++j) rows[i * 3 + j] = float(i) + 0.5f * float(j);
    vers[i] = 5 + i % 7;
    synced[i] = i % 3 == 0 ? 0 : vers[i];  // a third stay dirty
  }
  synced.back() = synced[3000];  // the repeated key: one synced version for both occurrences
  EMBCACHE_ASSERT_OK(a.install(batch, rows, vers, synced, 4));
  auto s = b.insert_or_assign_slots(batch, rows, vers);
  b.mark_synced(s, synced);
  b.set_marks(s, 4);
  EXPECT_EQ(a.cache.size(), b.cache.size());
  EXPECT_EQ(a.cache.size(), keys.size());
  EXPECT_EQ(a.cache.version(), b.cache.version());
  const auto ea = a.export_rows(), eb = b.export_rows();
  EXPECT_EQ(ea.keys, eb.keys);
  EXPECT_EQ(ea.rows, eb.rows);
  EXPECT_EQ(ea.versions, eb.versions);
  EXPECT_EQ(a.find({keys[5000]}).rows, std::vector<float>({18000.f, 18000.5f, 18001.f}));
  // Dirty rows and marks, as keys (the slots differ between the caches).
  auto keys_of = [](harness<Key, Space>& h, const std::vector<std::int64_t>& slots) {
    std::vector<Key> out;
    const auto e = h.export_rows();
    std::unordered_map<std::int64_t, Key> at;
    const auto all = h.slots(e.keys);
    for (std::size_t i = 0; i < all.size(); ++i) at[all[i]] = e.keys[i];
    for (auto sl : slots) out.push_back(at.at(sl));
    std::sort(out.begin(), out.end());
    return out;
  };
  const auto all_a = a.slots(ea.keys), all_b = b.slots(eb.keys);
  EXPECT_EQ(keys_of(a, a.gather_dirty(all_a).slots), keys_of(b, b.gather_dirty(all_b).slots));
  const auto unmarked_a = a.select_victims(4, keys.size(), victim_order::oldest_version);
  const auto unmarked_b = b.select_victims(4, keys.size(), victim_order::oldest_version);
  EXPECT_EQ(unmarked_a.size(), 2000u);  // the residents outside the batch
  EXPECT_EQ(keys_of(a, unmarked_a), keys_of(b, unmarked_b));
  // No room: the keys that fit are in, and the status says how many did not.
  harness<Key, Space> full(small_options(256, 2, 1));
  auto more = this->range_keys(300, 5);
  const status st = full.install(more, std::vector<float>(more.size() * 3, 1.f), {}, {}, 1);
  EXPECT_EQ(st.code(), status_code::capacity_exceeded);
  EXPECT_NE(st.message().find("install: no room for 44 of 300 keys"), std::string::npos)
      << st.message();
  EXPECT_EQ(full.cache.size(), 256u);
}

// The row pool is row_pool(), indexed by row: a rows() accessor, which code wrote `rows() + slot *
// row_width` against before rows moved between slots by default, must not come back, so that such
// code fails to compile rather than read the wrong rows (slot_rows.hpp translates).
template <class T, class = void>
struct has_rows_accessor : std::false_type {};
template <class T>
struct has_rows_accessor<T, std::void_t<decltype(std::declval<T&>().rows())>> : std::true_type {};
static_assert(!has_rows_accessor<embedding_cache<std::int64_t, host_space>>::value);
static_assert(!has_rows_accessor<embedding_cache<std::uint32_t, host_space>>::value);

// With spare rows, install_rows moves rows written into rows no slot holds into the table without
// a copy, giving back the rows the new keys' slots held, with what install() of the same rows
// gives (keys, rows, versions, dirtiness, marks); detach_rows moves slots' rows out the same way.
TYPED_TEST_P(cache_conformance, spare_rows_move_in_and_out_without_a_copy) {
  using Key = typename TypeParam::key_type;
  using Space = typename TypeParam::space_type;
  using cache_type = embedding_cache<Key, Space>;
  auto o = small_options(1024, 2, 1);
  o.spare_rows = 600;
  harness<Key, Space> a(o), b(small_options(1024, 2, 1));
  const std::size_t slots = a.cache.slots(), w = 3;
  ASSERT_EQ(a.cache.row_count(), slots + 600);
  EXPECT_EQ(a.cache.allocated_bytes(),
            slots * cache_type::bytes_per_slot(o) +
                slots / cache_type::bucket_size * cache_type::bytes_per_bucket +
                cache_type::spare_row_bytes(o));
  auto keys = this->range_keys(1000, 3);
  std::vector<Key> first(keys.begin(), keys.begin() + 500);
  for (auto* h : {&a, &b}) {
    auto sl = h->insert_or_assign_slots(first, std::vector<float>(first.size() * w, 0.25f),
                                        std::vector<std::uint64_t>(first.size(), 3));
    h->mark_synced(sl);
    h->set_marks(sl, 1);
  }
  // 20 residents, 500 new keys and one new key twice.
  std::vector<Key> batch(keys.begin() + 480, keys.end());
  batch.push_back(keys[700]);
  const std::size_t n = batch.size();
  std::vector<float> rows(n * w);
  std::vector<std::uint64_t> vers(n), synced(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < w; ++j) rows[i * w + j] = float(i) + 0.5f * float(j);
    vers[i] = 5 + i % 7;
    synced[i] = i % 3 == 0 ? 0 : vers[i];
  }
  synced.back() = synced[700 - 480];
  // a: the rows written into the spare rows [slots, slots + n); b: install() of the same rows.
  std::vector<std::int64_t> given(n);
  std::iota(given.begin(), given.end(), static_cast<std::int64_t>(slots));
  auto k = a.to_space(batch);
  auto g = a.to_space(given);
  auto r = a.to_space(rows);
  EMBCACHE_ASSERT_OK(a.cache.write_rows(g.data(), n, r.data()));
  auto v = a.to_space(vers);
  auto y = a.to_space(synced);
  EMBCACHE_ASSERT_OK(a.cache.install_rows(k.data(), n, g.data(), v.data(), y.data(), 4));
  EMBCACHE_ASSERT_OK(b.install(batch, rows, vers, synced, 4));
  const auto back = a.to_host(g, n);
  const auto ea = a.export_rows(), eb = b.export_rows();
  EXPECT_EQ(ea.keys, eb.keys);
  EXPECT_EQ(ea.rows, eb.rows);
  EXPECT_EQ(ea.versions, eb.versions);
  EXPECT_EQ(a.cache.version(), b.cache.version());
  EXPECT_EQ(a.find({keys[700]}).rows, std::vector<float>({520.f, 520.5f, 521.f}));
  auto sorted = [](std::vector<Key> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(a.gather_dirty(a.slots(ea.keys)).keys),
            sorted(b.gather_dirty(b.slots(eb.keys)).keys));
  const auto unmarked_a = a.select_victims(4, keys.size(), victim_order::oldest_version);
  EXPECT_EQ(unmarked_a.size(), 480u);
  EXPECT_EQ(
      sorted(a.gather_dirty(unmarked_a).keys),
      sorted(b.gather_dirty(b.select_victims(4, keys.size(), victim_order::oldest_version)).keys));
  // Given back: a resident key its own row, a new key the row its slot held; of the repeated
  // key's two occurrences one inserts (on the device any of them may) and the other gives back
  // its own row. No slot holds a row given back: every row is held once.
  auto rows_of = [&](const std::vector<std::int64_t>& sl) {
    auto s = a.to_space(sl);
    buffer<std::int64_t, Space> r(sl.size(), a.cache.space());
    a.cache.row_indices(s.data(), sl.size(), r.data());
    return a.to_host(r, sl.size());
  };
  std::vector<std::int64_t> every_slot(slots);
  std::iota(every_slot.begin(), every_slot.end(), 0);
  const std::size_t repeated = 700 - 480;
  for (std::size_t i = 0; i < n; ++i) {
    if (i < 20) {
      EXPECT_EQ(back[i], given[i]) << i;
    } else if (i != repeated && i != n - 1) {
      EXPECT_LT(back[i], static_cast<std::int64_t>(slots)) << i;
    }
  }
  EXPECT_NE(back[repeated] == given[repeated], back[n - 1] == given[n - 1]);
  // Every row once: held by a slot (empty slots hold rows too), given back, or never given.
  std::vector<std::int64_t> all = rows_of(every_slot);
  all.insert(all.end(), back.begin(), back.end());
  for (std::size_t r = slots + n; r < a.cache.row_count(); ++r)
    all.push_back(static_cast<std::int64_t>(r));
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), a.cache.row_count());
  for (std::size_t r = 0; r < all.size(); ++r) ASSERT_EQ(all[r], static_cast<std::int64_t>(r));
  // detach_rows: 100 residents' rows out, their floats at the indices given back; the slots keep
  // their keys and now hold the rows they were given.
  std::vector<Key> out_keys(keys.begin(), keys.begin() + 100);
  const auto victims = a.slots(out_keys);
  const auto before = a.read_slots(victims);
  const std::vector<std::int64_t> free_rows(back.begin() + 20, back.begin() + 120);  // no repeat
  auto vs = a.to_space(victims);
  auto fr = a.to_space(free_rows);
  EMBCACHE_ASSERT_OK(a.cache.detach_rows(vs.data(), victims.size(), fr.data()));
  const auto detached = a.to_host(fr, victims.size());
  std::vector<float> moved(victims.size() * w);
  for (std::size_t i = 0; i < victims.size(); ++i) {
    detail::copy(a.cache.space(), moved.data() + i * w,
                 a.cache.row_pool() + static_cast<std::size_t>(detached[i]) * w, w * 4);
  }
  detail::synchronize(a.cache.space());
  EXPECT_EQ(moved, before);
  EXPECT_EQ(rows_of(victims), free_rows);
  EXPECT_EQ(a.slots(out_keys), victims);
  // Bad input changes nothing: an index past the rows, a cache without spare rows.
  std::vector<std::int64_t> past{static_cast<std::int64_t>(a.cache.row_count())};
  auto p = a.to_space(past);
  auto one = a.to_space(std::vector<Key>{keys[0] + 1000000});
  const status st = a.cache.install_rows(one.data(), 1, p.data(), nullptr, nullptr, 4);
  EXPECT_EQ(st.code(), status_code::invalid_argument);
  EXPECT_NE(st.message().find("install_rows: 1 row indices outside [0, " +
                              std::to_string(a.cache.row_count()) + ")"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(a.cache.size(), 1000u);
  auto bs = b.to_space(b.slots(out_keys));
  auto bf = b.to_space(free_rows);
  const status none = b.cache.detach_rows(bs.data(), out_keys.size(), bf.data());
  EXPECT_EQ(none.code(), status_code::invalid_argument);
  EXPECT_NE(none.message().find("no spare rows"), std::string::npos) << none.message();
}

REGISTER_TYPED_TEST_SUITE_P(
    cache_conformance, empty_finds_nothing, find_or_insert_initializes_deterministically,
    initializer_kinds_have_their_shape, insert_or_assign_overwrites_and_last_duplicate_wins,
    duplicates_in_find_or_insert_insert_once, erase_removes_once_and_allows_reinsert,
    every_key_value_is_a_key, full_table_is_a_clear_status, slots_read_assign_and_versions,
    export_all_is_sorted_with_rows_and_versions, insert_and_evict_lru_order,
    insert_and_evict_lfu_order_and_overflowing_batch, insert_and_evict_uses_given_rows,
    clear_empties_and_keeps_the_version_clock, randomized_differential_against_unordered_map,
    inserts_hand_back_their_slots, dirty_rows_follow_syncs_and_writes,
    victims_are_unmarked_oldest_then_smallest_key, victims_among_many_are_oldest_then_smallest_key,
    erase_slots_removes_each_once, insert_and_evict_says_which_victims_were_dirty,
    calls_run_where_the_threads_guard_says, repeated_keys_report_one_insertion_each_in_a_long_batch,
    writes_near_the_end_of_the_claim_epochs_are_not_skipped,
    the_table_holds_what_bytes_per_slot_says, install_equals_insert_or_assign_then_sync_and_mark,
    spare_rows_move_in_and_out_without_a_copy);

}  // namespace embcache::testing
