// The host store's shards: an open-addressing index over a slab of rows that never move, and
// the parallel loops that group a batch by shard and look keys up (src/store/host_store.cpp).
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <type_traits>
#include <vector>

#include "embcache/buffer.hpp"
#include "embcache/detail/hash.hpp"
#include "embcache/detail/host_algorithms.hpp"
#include "embcache/space.hpp"
#include "embcache/keyset.hpp"

namespace embcache::detail {

// Occupancy lives in the chunk field of a slot, so no key value is reserved.
constexpr std::uint32_t slot_empty = 0xFFFFFFFFu;
constexpr std::uint32_t slot_erased = 0xFFFFFFFEu;
constexpr std::size_t min_index_slots = 16;

template <class Key>
struct host_slot {
  Key key;
  std::uint32_t chunk;  // slot_empty, slot_erased, or the chunk that holds the row
  std::uint32_t offset;
};

struct row_ref {
  std::uint32_t chunk;
  std::uint32_t offset;
};

struct row_chunk {
  float* rows;
  std::uint64_t* versions;
  std::uint32_t capacity;
  std::uint32_t used;
};

template <class Key>
inline std::uint64_t hash_key(Key k) noexcept {
  return stafford_mix13(static_cast<std::uint64_t>(k));
}

template <class Key>
struct host_shard {
  mutable std::shared_mutex mutex;
  host_slot<Key>* slots = nullptr;
  std::size_t capacity = 0;  // power of two
  std::size_t size = 0;
  std::size_t erased = 0;
  std::vector<row_chunk> chunks;
  std::size_t slab_rows = 0;
  std::vector<row_ref> free_rows;

  ~host_shard() {
    host_deallocate(slots);
    for (auto& c : chunks) {
      host_deallocate(c.rows);
      host_deallocate(c.versions);
    }
  }

  static void clear_slots(host_slot<Key>* s, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) s[i].chunk = slot_empty;
  }

  void allocate_index(std::size_t cap) {
    auto* fresh = static_cast<host_slot<Key>*>(host_allocate(cap * sizeof(host_slot<Key>)));
    clear_slots(fresh, cap);
    const std::size_t mask = cap - 1;
    for (std::size_t i = 0; i < capacity; ++i) {
      const auto& s = slots[i];
      if (s.chunk >= slot_erased) continue;
      std::size_t p = hash_key(s.key) & mask;
      while (fresh[p].chunk != slot_empty) p = (p + 1) & mask;
      fresh[p] = s;
    }
    host_deallocate(slots);
    slots = fresh;
    capacity = cap;
    erased = 0;
  }

  // Smallest power of two that keeps `rows` at most 3/4 full.
  static std::size_t capacity_for(std::size_t rows) {
    std::size_t cap = min_index_slots;
    while (rows * 4 > cap * 3) cap *= 2;
    return cap;
  }

  // Called before an insert that could take a new slot. Doubling only when live rows fill more
  // than 5/8 keeps the index at least 31% full after a rehash; otherwise tombstones are dropped.
  void make_room() {
    if ((size + erased + 1) * 4 <= capacity * 3) return;
    std::size_t cap = capacity;
    if ((size + 1) * 8 > capacity * 5) cap = capacity * 2;
    allocate_index(cap);
  }

  const host_slot<Key>* find(Key key, std::uint64_t h) const noexcept {
    const std::size_t mask = capacity - 1;
    std::size_t p = h & mask;
    for (;;) {
      const auto& s = slots[p];
      if (s.chunk == slot_empty) return nullptr;
      if (s.chunk != slot_erased && s.key == key) return &s;
      p = (p + 1) & mask;
    }
  }

  void prefetch(std::uint64_t h) const noexcept { __builtin_prefetch(&slots[h & (capacity - 1)]); }

  const float* row_of(const host_slot<Key>& s, std::size_t width) const noexcept {
    return chunks[s.chunk].rows + static_cast<std::size_t>(s.offset) * width;
  }
  std::uint64_t version_of(const host_slot<Key>& s) const noexcept {
    return chunks[s.chunk].versions[s.offset];
  }

  row_ref new_row(std::size_t width, std::size_t min_chunk_rows) {
    if (!free_rows.empty()) {
      row_ref r = free_rows.back();
      free_rows.pop_back();
      return r;
    }
    if (chunks.empty() || chunks.back().used == chunks.back().capacity) {
      // Growing by 1/32 of the slab bounds the unused tail to ~3% of the rows held.
      std::size_t rows = std::max(min_chunk_rows, slab_rows / 32);
      rows = std::min<std::size_t>(rows, slot_erased - 1);
      if (chunks.size() >= slot_erased - 1) throw std::bad_alloc();
      row_chunk c{};
      c.rows = static_cast<float*>(host_allocate(rows * width * sizeof(float)));
      try {
        c.versions = static_cast<std::uint64_t*>(host_allocate(rows * sizeof(std::uint64_t)));
      } catch (...) {
        host_deallocate(c.rows);
        throw;
      }
      c.capacity = static_cast<std::uint32_t>(rows);
      c.used = 0;
      chunks.push_back(c);
      slab_rows += rows;
    }
    auto& c = chunks.back();
    return row_ref{static_cast<std::uint32_t>(chunks.size() - 1), c.used++};
  }

  void upsert(Key key, std::uint64_t h, const float* row, std::uint64_t version, std::size_t width,
              std::size_t min_chunk_rows) {
    make_room();
    const std::size_t mask = capacity - 1;
    std::size_t p = h & mask;
    std::size_t tomb = capacity;
    for (;;) {
      auto& s = slots[p];
      if (s.chunk == slot_empty) break;
      if (s.chunk == slot_erased) {
        if (tomb == capacity) tomb = p;
      } else if (s.key == key) {
        auto& c = chunks[s.chunk];
        std::memcpy(c.rows + static_cast<std::size_t>(s.offset) * width, row,
                    width * sizeof(float));
        c.versions[s.offset] = version;
        return;
      }
      p = (p + 1) & mask;
    }
    row_ref r = new_row(width, min_chunk_rows);
    auto& c = chunks[r.chunk];
    std::memcpy(c.rows + static_cast<std::size_t>(r.offset) * width, row, width * sizeof(float));
    c.versions[r.offset] = version;
    if (tomb != capacity) {
      p = tomb;
      --erased;
    }
    slots[p] = host_slot<Key>{key, r.chunk, r.offset};
    ++size;
  }

  bool erase(Key key, std::uint64_t h) {
    auto* s = const_cast<host_slot<Key>*>(find(key, h));
    if (!s) return false;
    free_rows.push_back(row_ref{s->chunk, s->offset});
    s->chunk = slot_erased;
    --size;
    ++erased;
    return true;
  }

  std::size_t memory_bytes(std::size_t width) const noexcept {
    std::size_t b = sizeof(*this) + capacity * sizeof(host_slot<Key>);
    b += chunks.capacity() * sizeof(row_chunk) + free_rows.capacity() * sizeof(row_ref);
    b += slab_rows * (width * sizeof(float) + sizeof(std::uint64_t));
    return b;
  }
};

// Positions of a batch grouped by shard, batch order kept inside each shard (a stable counting
// sort), so that the last occurrence of a repeated key is applied last.
struct shard_groups {
  std::vector<std::uint32_t> order;
  std::vector<std::size_t> offsets;  // num_shards + 1
};

template <class Key>
void group_by_shard(const host_space& space, const Key* keys, std::size_t n, unsigned shard_bits,
                    shard_groups& g) {
  const std::size_t shards = std::size_t{1} << shard_bits;
  constexpr std::size_t block = 1 << 16;
  const std::size_t blocks = (n + block - 1) / block;
  std::vector<std::uint16_t> shard_of(n);
  std::vector<std::size_t> counts(blocks * shards, 0);
  auto shard_index = [shard_bits](Key k) -> std::uint16_t {
    return shard_bits == 0 ? 0 : static_cast<std::uint16_t>(hash_key(k) >> (64 - shard_bits));
  };
  run_in_space(space, [&] {
    tbb::parallel_for(std::size_t{0}, blocks, [&](std::size_t b) {
      std::size_t* c = &counts[b * shards];
      const std::size_t end = std::min(n, (b + 1) * block);
      for (std::size_t i = b * block; i < end; ++i) {
        auto s = shard_index(keys[i]);
        shard_of[i] = s;
        ++c[s];
      }
    });
  });
  g.offsets.assign(shards + 1, 0);
  std::size_t run = 0;
  for (std::size_t s = 0; s < shards; ++s) {
    g.offsets[s] = run;
    for (std::size_t b = 0; b < blocks; ++b) {
      std::size_t c = counts[b * shards + s];
      counts[b * shards + s] = run;
      run += c;
    }
  }
  g.offsets[shards] = run;
  g.order.resize(n);
  run_in_space(space, [&] {
    tbb::parallel_for(std::size_t{0}, blocks, [&](std::size_t b) {
      std::size_t* c = &counts[b * shards];
      const std::size_t end = std::min(n, (b + 1) * block);
      for (std::size_t i = b * block; i < end; ++i)
        g.order[c[shard_of[i]]++] = static_cast<std::uint32_t>(i);
    });
  });
}

// Runs f(shard) for every shard in parallel.
template <class F>
void for_each_shard(const host_space& space, std::size_t shards, const F& f) {
  run_in_space(space, [&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, shards, 1),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t s = r.begin(); s < r.end(); ++s) f(s);
                      });
  });
}

// Runs f(s, shard, begin, end) in parallel for every shard `s` that a batch grouped by
// group_by_shard touches, holding that shard's lock exclusively; [begin, end) are the positions
// of g.order that belong to it.
template <class Key, class F>
void for_each_shard_group(const host_space& space, host_shard<Key>* shards, std::size_t num_shards,
                          const shard_groups& g, const F& f) {
  for_each_shard(space, num_shards, [&](std::size_t s) {
    const std::size_t begin = g.offsets[s], end = g.offsets[s + 1];
    if (begin == end) return;
    std::unique_lock<std::shared_mutex> lock(shards[s].mutex);
    f(s, shards[s], begin, end);
  });
}

template <class Key>
struct pull_functor {
  const host_shard<Key>* shards;
  unsigned shard_bits;
  const Key* keys;
  float* rows_out;
  bool* found_out;
  std::uint64_t* versions_out;
  std::size_t width;

  const host_shard<Key>& shard_of(std::uint64_t h) const noexcept {
    return shards[shard_bits == 0 ? 0 : h >> (64 - shard_bits)];
  }
  void prefetch(std::size_t i) const noexcept {
    const std::uint64_t h = hash_key(keys[i]);
    shard_of(h).prefetch(h);
  }
  void operator()(std::size_t i) const noexcept {
    const std::uint64_t h = hash_key(keys[i]);
    const auto& sh = shard_of(h);
    const auto* s = sh.find(keys[i], h);
    found_out[i] = s != nullptr;
    if (!s) return;
    if (rows_out) std::memcpy(rows_out + i * width, sh.row_of(*s, width), width * sizeof(float));
    if (versions_out) versions_out[i] = sh.version_of(*s);
  }
};

// Looks up a batch under every shard's lock taken shared: found_out, and (each may be nullptr)
// rows_out and versions_out, for every key.
template <class Key>
void lookup_rows(const host_space& space, const host_shard<Key>* shards, std::size_t num_shards,
                 unsigned shard_bits, const Key* keys, std::size_t n, float* rows_out,
                 bool* found_out, std::uint64_t* versions_out, std::size_t width) {
  std::vector<std::shared_lock<std::shared_mutex>> locks;
  locks.reserve(num_shards);
  for (std::size_t s = 0; s < num_shards; ++s) locks.emplace_back(shards[s].mutex);
  for_each_index(
      space, n,
      pull_functor<Key>{shards, shard_bits, keys, rows_out, found_out, versions_out, width});
}

}  // namespace embcache::detail
