#include "embcache/host_store.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <shared_mutex>
#include <sstream>
#include <type_traits>
#include <vector>

#include "embcache/buffer.hpp"
#include "embcache/detail/hash.hpp"
#include "embcache/detail/host_algorithms.hpp"
#include "store_io.hpp"

namespace embcache {
namespace detail {

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

template <class Key>
const char* key_type_name() {
  return std::is_same_v<Key, std::int64_t> ? "int64" : "uint32";
}

}  // namespace detail

namespace {

std::size_t round_up_pow2(std::size_t v) {
  std::size_t p = 1;
  while (p < v) p *= 2;
  return p;
}

std::size_t row_bytes_with_version(std::size_t width) {
  return width * sizeof(float) + sizeof(std::uint64_t);
}

std::size_t min_chunk_rows(const host_store_options& o) {
  return std::max<std::size_t>(1, o.min_chunk_bytes / row_bytes_with_version(o.row_width));
}

constexpr const char* manifest_format = "embcache.host_store";
constexpr int manifest_format_version = 1;

}  // namespace

template <class Key>
host_store<Key>::host_store(host_store_options options) : options_(std::move(options)) {
  if (options_.row_width == 0)
    throw error(status_code::invalid_argument,
                "host_store of table '" + options_.table_name + "': row_width must be > 0");
  options_.num_shards = round_up_pow2(std::clamp<std::size_t>(options_.num_shards, 1, 1 << 16));
  while ((std::size_t{1} << shard_bits_) < options_.num_shards) ++shard_bits_;
  shards_ = std::make_unique<detail::host_shard<Key>[]>(options_.num_shards);
  const std::size_t per_shard =
      (options_.expected_rows + options_.num_shards - 1) / options_.num_shards;
  const std::size_t cap = detail::host_shard<Key>::capacity_for(per_shard);
  for (std::size_t s = 0; s < options_.num_shards; ++s) shards_[s].allocate_index(cap);
}

template <class Key>
host_store<Key>::~host_store() = default;

template <class Key>
std::size_t host_store<Key>::size() const noexcept {
  std::size_t n = 0;
  for (std::size_t s = 0; s < options_.num_shards; ++s) n += shards_[s].size;
  return n;
}

template <class Key>
std::uint64_t host_store<Key>::max_version() const noexcept {
  return max_version_;
}

template <class Key>
std::size_t host_store<Key>::memory_bytes() const noexcept {
  std::size_t b = sizeof(*this);
  for (std::size_t s = 0; s < options_.num_shards; ++s)
    b += shards_[s].memory_bytes(options_.row_width);
  return b;
}

template <class Key>
std::size_t host_store<Key>::memory_bound(std::size_t rows,
                                          const host_store_options& options) noexcept {
  const std::size_t shards = round_up_pow2(std::clamp<std::size_t>(options.num_shards, 1, 1 << 16));
  const std::size_t rb = row_bytes_with_version(options.row_width);
  const std::size_t slot = sizeof(detail::host_slot<Key>);
  const std::size_t index_rows = std::max(rows, options.expected_rows);
  std::size_t b = sizeof(host_store<Key>);
  b += (rows * rb * 33 + 31) / 32;
  b += (index_rows * slot * 16 + 4) / 5;
  b += shards * (options.min_chunk_bytes + rb + detail::min_index_slots * slot + 4096 +
                 sizeof(detail::host_shard<Key>));
  return b;
}

template <class Key>
status host_store<Key>::pull(const Key* keys, std::size_t n, float* rows_out, bool* found_out,
                             std::uint64_t* versions_out) {
  if (n == 0) return {};
  if (!keys || !rows_out || !found_out)
    return status::invalid_argument(
        "host_store::pull on table '" + options_.table_name +
        "': keys, rows_out and found_out must not be null (n = " + std::to_string(n) + ")");
  std::vector<std::shared_lock<std::shared_mutex>> locks;
  locks.reserve(options_.num_shards);
  for (std::size_t s = 0; s < options_.num_shards; ++s) locks.emplace_back(shards_[s].mutex);
  detail::pull_functor<Key> f{shards_.get(), shard_bits_,       keys, rows_out, found_out,
                              versions_out,  options_.row_width};
  detail::for_each_index(options_.space, n, f);
  return {};
}

template <class Key>
status host_store<Key>::contains(const Key* keys, std::size_t n, bool* found_out) {
  if (n == 0) return {};
  if (!keys || !found_out)
    return status::invalid_argument("host_store::contains on table '" + options_.table_name +
                                    "': keys and found_out must not be null");
  std::vector<std::shared_lock<std::shared_mutex>> locks;
  locks.reserve(options_.num_shards);
  for (std::size_t s = 0; s < options_.num_shards; ++s) locks.emplace_back(shards_[s].mutex);
  detail::pull_functor<Key> f{shards_.get(), shard_bits_,       keys, nullptr, found_out,
                              nullptr,       options_.row_width};
  detail::for_each_index(options_.space, n, f);
  return {};
}

template <class Key>
status host_store<Key>::push(const Key* keys, std::size_t n, const float* rows,
                             const std::uint64_t* versions) {
  if (n == 0) return {};
  if (!keys || !rows)
    return status::invalid_argument("host_store::push on table '" + options_.table_name +
                                    "': keys and rows must not be null (n = " + std::to_string(n) +
                                    ")");
  if (n >= std::numeric_limits<std::uint32_t>::max())
    return status::invalid_argument("host_store::push on table '" + options_.table_name +
                                    "': batch of " + std::to_string(n) +
                                    " keys, at most 4294967294 per call");
  const std::uint64_t stamp = max_version_ + 1;
  const std::size_t width = options_.row_width;
  const std::size_t chunk_rows = min_chunk_rows(options_);
  std::atomic<bool> out_of_memory{false};
  std::vector<std::uint64_t> shard_max(options_.num_shards, 0);
  try {
    detail::shard_groups g;
    detail::group_by_shard(options_.space, keys, n, shard_bits_, g);
    detail::for_each_shard(options_.space, options_.num_shards, [&](std::size_t s) {
      const std::size_t begin = g.offsets[s], end = g.offsets[s + 1];
      if (begin == end) return;
      auto& sh = shards_[s];
      std::unique_lock<std::shared_mutex> lock(sh.mutex);
      std::uint64_t vmax = 0;
      try {
        constexpr std::size_t ahead = 4;
        for (std::size_t j = begin; j < end; ++j) {
          if (j + ahead < end) sh.prefetch(detail::hash_key(keys[g.order[j + ahead]]));
          const std::size_t i = g.order[j];
          const std::uint64_t v = versions ? versions[i] : stamp;
          vmax = std::max(vmax, v);
          sh.upsert(keys[i], detail::hash_key(keys[i]), rows + i * width, v, width, chunk_rows);
        }
      } catch (const std::bad_alloc&) {
        out_of_memory = true;
      }
      shard_max[s] = vmax;
    });
  } catch (const std::bad_alloc&) {
    out_of_memory = true;
  }
  for (auto v : shard_max) max_version_ = std::max(max_version_, v);
  if (out_of_memory)
    return status::capacity_exceeded("host_store::push on table '" + options_.table_name +
                                     "': out of host memory after " + std::to_string(size()) +
                                     " rows; part of the batch may have been stored");
  return {};
}

template <class Key>
status host_store<Key>::erase(const Key* keys, std::size_t n, std::size_t* erased_out) {
  if (erased_out) *erased_out = 0;
  if (n == 0) return {};
  if (!keys)
    return status::invalid_argument("host_store::erase on table '" + options_.table_name +
                                    "': keys must not be null");
  if (n >= std::numeric_limits<std::uint32_t>::max())
    return status::invalid_argument("host_store::erase on table '" + options_.table_name +
                                    "': batch of " + std::to_string(n) + " keys is too large");
  detail::shard_groups g;
  detail::group_by_shard(options_.space, keys, n, shard_bits_, g);
  std::vector<std::size_t> counts(options_.num_shards, 0);
  detail::for_each_shard(options_.space, options_.num_shards, [&](std::size_t s) {
    const std::size_t begin = g.offsets[s], end = g.offsets[s + 1];
    if (begin == end) return;
    auto& sh = shards_[s];
    std::unique_lock<std::shared_mutex> lock(sh.mutex);
    std::size_t c = 0;
    for (std::size_t j = begin; j < end; ++j) {
      const Key k = keys[g.order[j]];
      c += sh.erase(k, detail::hash_key(k)) ? 1 : 0;
    }
    counts[s] = c;
  });
  if (erased_out)
    for (auto c : counts) *erased_out += c;
  return {};
}

template <class Key>
status host_store<Key>::for_each_impl(bool changed_only, std::uint64_t version,
                                      std::size_t batch_size, const store_batch_fn<Key>& fn) {
  if (batch_size == 0)
    return status::invalid_argument("host_store::for_each on table '" + options_.table_name +
                                    "': batch_size must be > 0");
  if (!fn)
    return status::invalid_argument("host_store::for_each on table '" + options_.table_name +
                                    "': empty callback");
  const std::size_t width = options_.row_width;
  std::vector<std::shared_lock<std::shared_mutex>> locks;
  locks.reserve(options_.num_shards);
  for (std::size_t s = 0; s < options_.num_shards; ++s) locks.emplace_back(shards_[s].mutex);
  const std::size_t cap = std::min(batch_size, std::max<std::size_t>(size(), 1));
  std::vector<Key> k(cap);
  std::vector<float> r(cap * width);
  std::vector<std::uint64_t> v(cap);
  std::size_t fill = 0;
  for (std::size_t s = 0; s < options_.num_shards; ++s) {
    const auto& sh = shards_[s];
    for (std::size_t p = 0; p < sh.capacity; ++p) {
      const auto& slot = sh.slots[p];
      if (slot.chunk >= detail::slot_erased) continue;
      const std::uint64_t ver = sh.version_of(slot);
      if (changed_only && ver <= version) continue;
      k[fill] = slot.key;
      v[fill] = ver;
      std::memcpy(r.data() + fill * width, sh.row_of(slot, width), width * sizeof(float));
      if (++fill == cap) {
        EMBCACHE_RETURN_IF_ERROR(fn(k.data(), r.data(), v.data(), fill));
        fill = 0;
      }
    }
  }
  if (fill) EMBCACHE_RETURN_IF_ERROR(fn(k.data(), r.data(), v.data(), fill));
  return {};
}

template <class Key>
status host_store<Key>::for_each(std::size_t batch_size, const store_batch_fn<Key>& fn) {
  return for_each_impl(false, 0, batch_size, fn);
}

template <class Key>
status host_store<Key>::for_each_changed_since(std::uint64_t version, std::size_t batch_size,
                                               const store_batch_fn<Key>& fn) {
  return for_each_impl(true, version, batch_size, fn);
}

template <class Key>
status host_store<Key>::checkpoint(const std::string& dir_in) {
  namespace fs = std::filesystem;
  const std::string who = "host_store::checkpoint of table '" + options_.table_name + "'";
  const std::string dir = detail::strip_slashes(dir_in);
  EMBCACHE_RETURN_IF_ERROR(detail::check_checkpoint_target(dir, who.c_str()));
  const std::string tmp = dir + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) {
    int err = ec.value();
    return detail::errno_status(err, who + ": creating folder", tmp);
  }
  auto body = [&]() -> status {
    detail::checked_file_writer keys_w, versions_w, rows_w;
    EMBCACHE_RETURN_IF_ERROR(keys_w.open(tmp + "/keys.bin"));
    EMBCACHE_RETURN_IF_ERROR(versions_w.open(tmp + "/versions.bin"));
    EMBCACHE_RETURN_IF_ERROR(rows_w.open(tmp + "/rows.bin"));
    std::size_t count = 0;
    EMBCACHE_RETURN_IF_ERROR(for_each(
        std::size_t{1} << 16,
        [&](const Key* k, const float* r, const std::uint64_t* v, std::size_t n) -> status {
          EMBCACHE_RETURN_IF_ERROR(keys_w.append(k, n * sizeof(Key)));
          EMBCACHE_RETURN_IF_ERROR(versions_w.append(v, n * sizeof(std::uint64_t)));
          EMBCACHE_RETURN_IF_ERROR(rows_w.append(r, n * options_.row_width * sizeof(float)));
          count += n;
          return {};
        }));
    EMBCACHE_RETURN_IF_ERROR(keys_w.finish());
    EMBCACHE_RETURN_IF_ERROR(versions_w.finish());
    EMBCACHE_RETURN_IF_ERROR(rows_w.finish());
    nlohmann::json m;
    m["format"] = manifest_format;
    m["format_version"] = manifest_format_version;
    m["table_name"] = options_.table_name;
    m["key_type"] = detail::key_type_name<Key>();
    m["row_width"] = options_.row_width;
    m["count"] = count;
    m["max_version"] = max_version_;
    auto file_entry = [](const detail::checked_file_writer& w) {
      return nlohmann::json{{"bytes", w.bytes()}, {"xxh64", detail::hex64(w.digest())}};
    };
    m["files"] = {{"keys.bin", file_entry(keys_w)},
                  {"versions.bin", file_entry(versions_w)},
                  {"rows.bin", file_entry(rows_w)}};
    const std::string text = m.dump(2) + "\n";
    detail::checked_file_writer mw;
    EMBCACHE_RETURN_IF_ERROR(mw.open(tmp + "/manifest.json"));
    EMBCACHE_RETURN_IF_ERROR(mw.append(text.data(), text.size()));
    EMBCACHE_RETURN_IF_ERROR(mw.finish());
    EMBCACHE_RETURN_IF_ERROR(detail::sync_dir(tmp));
    // rename(2) replaces an empty folder atomically, so `dir` is either complete or absent.
    if (::rename(tmp.c_str(), dir.c_str()) != 0)
      return detail::errno_status(errno, "renaming '" + tmp + "' to", dir);
    return detail::sync_dir(detail::parent_dir(dir));
  };
  status st = body();
  if (!st.ok()) {
    fs::remove_all(tmp, ec);
    return st.with_context(who);
  }
  return st;
}

template <class Key>
result<std::unique_ptr<host_store<Key>>> host_store<Key>::open(const std::string& dir_in,
                                                               host_store_options options) {
  namespace fs = std::filesystem;
  const std::string dir = detail::strip_slashes(dir_in);
  const std::string who =
      "host_store::open of '" + dir + "' for table '" + options.table_name + "'";
  if (options.row_width == 0) return status::invalid_argument(who + ": row_width must be > 0");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return status::not_found(who + ": no such folder");
  const std::string manifest_path = dir + "/manifest.json";
  std::ifstream in(manifest_path);
  if (!in) {
    if (!fs::exists(manifest_path, ec))
      return status::not_found(who + ": '" + manifest_path +
                               "' is missing (not a host_store checkpoint, or an incomplete one)");
    return status::io_error(who + ": cannot read '" + manifest_path + "'");
  }
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json m = nlohmann::json::parse(text.str(), nullptr, false);
  if (m.is_discarded() || !m.is_object())
    return status::corruption(who + ": '" + manifest_path + "' is not valid JSON");
  auto field = [&](const char* name, nlohmann::json::value_t type, bool is_number) -> status {
    auto it = m.find(name);
    if (it == m.end() || (is_number ? !it->is_number_unsigned() : it->type() != type))
      return status::corruption(who + ": '" + manifest_path + "' lacks a valid '" + name + "'");
    return {};
  };
  using vt = nlohmann::json::value_t;
  for (const char* f : {"format", "table_name", "key_type"})
    EMBCACHE_RETURN_IF_ERROR(field(f, vt::string, false));
  for (const char* f : {"format_version", "row_width", "count", "max_version"})
    EMBCACHE_RETURN_IF_ERROR(field(f, vt::number_unsigned, true));
  EMBCACHE_RETURN_IF_ERROR(field("files", vt::object, false));
  if (m["format"] != manifest_format)
    return status::invalid_argument(who + ": '" + manifest_path + "' has format '" +
                                    m["format"].get<std::string>() + "', expected '" +
                                    manifest_format + "'");
  if (m["format_version"].get<std::uint64_t>() != std::uint64_t{manifest_format_version})
    return status::unsupported(who + ": format_version " + m["format_version"].dump() +
                               ", this build reads " + std::to_string(manifest_format_version));
  const std::string table = m["table_name"].get<std::string>();
  if (table != options.table_name)
    return status::not_found(who + ": the folder holds table '" + table + "', not '" +
                             options.table_name + "'");
  const std::string key_type = m["key_type"].get<std::string>();
  if (key_type != detail::key_type_name<Key>())
    return status::invalid_argument(who + ": the folder holds " + key_type + " keys, expected " +
                                    detail::key_type_name<Key>());
  const std::size_t width = m["row_width"].get<std::size_t>();
  if (width != options.row_width)
    return status::invalid_argument(who + ": the folder holds rows of " + std::to_string(width) +
                                    " floats, expected " + std::to_string(options.row_width));
  const std::uint64_t count = m["count"].get<std::uint64_t>();
  const std::uint64_t max_version = m["max_version"].get<std::uint64_t>();

  struct input {
    const char* name;
    std::size_t elem_bytes;
    detail::checked_file_reader reader;
    std::uint64_t expected_digest = 0;
  };
  input inputs[3] = {{"keys.bin", sizeof(Key), {}, 0},
                     {"versions.bin", sizeof(std::uint64_t), {}, 0},
                     {"rows.bin", width * sizeof(float), {}, 0}};
  for (auto& f : inputs) {
    const std::string path = dir + "/" + f.name;
    nlohmann::json::iterator entry = m["files"].find(std::string(f.name));
    if (entry == m["files"].end() || !entry->is_object() ||
        !(*entry)["bytes"].is_number_unsigned() || !(*entry)["xxh64"].is_string())
      return status::corruption(who + ": '" + manifest_path + "' lacks a valid entry for '" +
                                f.name + "'");
    std::uint64_t expect = 0;
    if (!detail::checked_mul(count, f.elem_bytes, &expect))
      return status::corruption(who + ": '" + manifest_path + "' gives count " +
                                std::to_string(count) + ": " + f.name + " would hold " +
                                std::to_string(count) + " * " + std::to_string(f.elem_bytes) +
                                " bytes, which overflows 64 bits");
    if ((*entry)["bytes"].get<std::uint64_t>() != expect)
      return status::corruption(who + ": '" + manifest_path + "' gives files." + f.name +
                                ".bytes " + (*entry)["bytes"].dump() + ", expected " +
                                std::to_string(expect) + " for count " + std::to_string(count));
    const std::string hex = (*entry)["xxh64"].get<std::string>();
    if (!detail::parse_hex64(hex, &f.expected_digest))
      return status::corruption(who + ": '" + manifest_path + "' has a malformed files." + f.name +
                                ".xxh64 \"" + hex + "\", expected 16 hex digits");
    std::uint64_t size = 0;
    EMBCACHE_RETURN_IF_ERROR(f.reader.open(path, &size).with_context(who));
    if (size != expect)
      return status::corruption(who + ": '" + path + "' is " + std::to_string(size) +
                                " bytes, expected " + std::to_string(expect) +
                                (size < expect ? " (truncated)" : ""));
  }

  options.expected_rows = std::max<std::size_t>(options.expected_rows, count);
  auto store = std::make_unique<host_store<Key>>(options);
  constexpr std::size_t batch = std::size_t{1} << 16;
  std::vector<Key> k(std::min<std::uint64_t>(batch, count));
  std::vector<std::uint64_t> v(k.size());
  std::vector<float> r(k.size() * width);
  for (std::uint64_t done = 0; done < count;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(batch, count - done));
    EMBCACHE_RETURN_IF_ERROR(inputs[0].reader.read(k.data(), n * sizeof(Key)).with_context(who));
    EMBCACHE_RETURN_IF_ERROR(
        inputs[1].reader.read(v.data(), n * sizeof(std::uint64_t)).with_context(who));
    EMBCACHE_RETURN_IF_ERROR(
        inputs[2].reader.read(r.data(), n * width * sizeof(float)).with_context(who));
    EMBCACHE_RETURN_IF_ERROR(store->push(k.data(), n, r.data(), v.data()).with_context(who));
    done += n;
  }
  for (auto& f : inputs) {
    const std::uint64_t got = f.reader.digest();
    if (got != f.expected_digest)
      return status::corruption(who + ": checksum mismatch in '" + dir + "/" + f.name +
                                "': manifest says " + detail::hex64(f.expected_digest) +
                                ", the file hashes to " + detail::hex64(got));
  }
  if (store->size() != count)
    return status::corruption(who + ": '" + dir +
                              "/keys.bin' repeats keys: " + std::to_string(count) + " rows hold " +
                              std::to_string(store->size()) + " distinct keys");
  store->max_version_ = std::max(store->max_version_, max_version);
  return store;
}

template class host_store<std::int64_t>;
template class host_store<std::uint32_t>;

}  // namespace embcache
