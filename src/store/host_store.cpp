// The host store's bulk operations over its shards (host_shard.hpp); its checkpoint folder is in
// host_store_folder.inl.
#include "embcache/host_store.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "host_shard.hpp"

namespace embcache {

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
  detail::lookup_rows(options_.space, shards_.get(), options_.num_shards, shard_bits_, keys, n,
                      rows_out, found_out, versions_out, options_.row_width);
  return {};
}

template <class Key>
status host_store<Key>::contains(const Key* keys, std::size_t n, bool* found_out) {
  if (n == 0) return {};
  if (!keys || !found_out)
    return status::invalid_argument("host_store::contains on table '" + options_.table_name +
                                    "': keys and found_out must not be null");
  detail::lookup_rows(options_.space, shards_.get(), options_.num_shards, shard_bits_, keys, n,
                      nullptr, found_out, nullptr, options_.row_width);
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
    detail::for_each_shard_group(
        options_.space, shards_.get(), options_.num_shards, g,
        [&](std::size_t s, detail::host_shard<Key>& sh, std::size_t begin, std::size_t end) {
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
  detail::for_each_shard_group(
      options_.space, shards_.get(), options_.num_shards, g,
      [&](std::size_t s, detail::host_shard<Key>& sh, std::size_t begin, std::size_t end) {
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
status host_store<Key>::scan(bool changed_only, std::uint64_t version, std::size_t batch_size,
                             const store_batch_fn<Key>& fn) {
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

}  // namespace embcache

// Checkpoint folders: checkpoint() and open().
#include "host_store_folder.inl"

namespace embcache {

template class host_store<std::int64_t>;
template class host_store<std::uint32_t>;

}  // namespace embcache
