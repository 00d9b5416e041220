// The device cache seen from the host: the training cache's orchestration keeps keys, slots and
// rows in host memory and reaches a table's embedding_cache through a device_cache_bridge, which
// in the cuda space moves each call's arguments through device buffers; plus the host memory the
// rows on their way to or from the cache live in. Private to src/training (included by the
// instantiating translation units through training_cache_definitions.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <new>
#include <vector>

#include "embcache/buffer.hpp"
#include "embcache/embedding_cache_ref.hpp"
#include "embcache/embedding_cache.hpp"
#include "embcache/space.hpp"
#include "embcache/status.hpp"

namespace embcache::detail {

// Host memory for rows on their way to or from the cache: pageable in the host space, pinned in
// the cuda space (so that copies to and from the device run at full speed and need no bounce).
template <class T, class Space>
struct staging_allocator {
  using value_type = T;
  staging_allocator() = default;
  template <class U>
  staging_allocator(const staging_allocator<U, Space>&) noexcept {}  // NOLINT
  T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_alloc();
    const std::size_t bytes = n * sizeof(T);
    if constexpr (is_cuda_space_v<Space>) {
      return static_cast<T*>(detail::cuda_allocate_pinned(bytes));
    } else {
      return static_cast<T*>(detail::host_allocate(bytes));
    }
  }
  void deallocate(T* p, std::size_t) noexcept {
    if constexpr (is_cuda_space_v<Space>) {
      detail::cuda_deallocate_pinned(p);
    } else {
      detail::host_deallocate(p);
    }
  }
  template <class U>
  bool operator==(const staging_allocator<U, Space>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const staging_allocator<U, Space>&) const noexcept {
    return false;
  }
};

// The status of an exception thrown by a CUDA call, an allocation or Thrust.
inline status status_of(const std::exception& e) {
  if (const auto* x = dynamic_cast<const error*>(&e)) return status(x->code(), x->what());
  if (dynamic_cast<const std::bad_alloc*>(&e)) return status::out_of_space(e.what());
  return status::internal(e.what());
}

// Runs `f` (returning a status), turning an exception into the status it stands for.
template <class F>
status guarded(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return status_of(e);
  }
}

// Slot metadata read on the host: states, keys and versions of every slot. In the host space it

// Rows on their way to or from the cache (staging, write-behind), in staging_allocator memory.
template <class Space>
using staging_rows = std::vector<float, staging_allocator<float, Space>>;

template <class Key>
struct slot_meta {
  slot_meta() = default;
  slot_meta(const slot_meta&) = delete;  // the pointers may aim at this object's vectors
  slot_meta& operator=(const slot_meta&) = delete;
  slot_meta(slot_meta&&) noexcept = default;  // a vector's move keeps its data where it is
  slot_meta& operator=(slot_meta&&) noexcept = default;
  const std::uint8_t* states = nullptr;
  const Key* keys = nullptr;
  const std::uint64_t* versions = nullptr;
  std::vector<std::uint8_t> states_copy;
  std::vector<Key> keys_copy;
  std::vector<std::uint64_t> versions_copy;
};

// The cache's bulk calls with every argument in host memory. The host space passes them through;
// the cuda space copies inputs into device buffers, runs the call on the cache's stream and copies
// outputs back (each call returns once its results are on the host); a CUDA failure there becomes
// the returned status instead of an exception.
template <class Key, class Space>
class device_cache_bridge {
 public:
  using cache_type = embedding_cache<Key, Space>;
  explicit device_cache_bridge(cache_type* cache = nullptr) : cache_(cache) {}

  status lookup_slots(const Key* keys, std::size_t n, std::int64_t* slots) {
    if constexpr (is_host_space_v<Space>) {
      return cache_->lookup_slots(keys, n, slots);
    } else {
      return guarded([&]() -> status {
        // Called even for n == 0: like the host space's, it takes an op (LRU scores stay equal).
        auto k = in(keys, n);
        buffer<std::int64_t, Space> s(n, space());
        EMBCACHE_RETURN_IF_ERROR(cache_->lookup_slots(k.data(), n, s.data()));
        s.copy_to_host(slots, n);
        return {};
      });
    }
  }
  status read_slots(const std::int64_t* slots, std::size_t n, float* rows) {
    if constexpr (is_host_space_v<Space>) {
      cache_->read_slots(slots, n, rows);
      return {};
    } else {
      return guarded([&]() -> status {
        if (n == 0) return {};
        const std::size_t w = cache_->row_width();
        auto s = in(slots, n);
        buffer<float, Space> r(n * w, space());
        // Slots of -1 leave their rows untouched: start from the caller's rows.
        bool all = true;
        for (std::size_t i = 0; i < n && all; ++i) all = slots[i] >= 0;
        if (!all) r.copy_from_host(rows, n * w);
        cache_->read_slots(s.data(), n, r.data());
        r.copy_to_host(rows, n * w);
        return {};
      });
    }
  }
  status insert_or_assign(const Key* keys, std::size_t n, const float* rows,
                          const std::uint64_t* versions) {
    if constexpr (is_host_space_v<Space>) {
      return cache_->insert_or_assign(keys, n, rows, versions);
    } else {
      return guarded([&]() -> status {
        if (n == 0) return {};
        auto k = in(keys, n);
        auto r = in(rows, n * cache_->row_width());
        auto v = in(versions, n);
        return cache_->insert_or_assign(k.data(), n, r.data(), versions ? v.data() : nullptr);
      });
    }
  }
  status assign_slots(const std::int64_t* slots, std::size_t n, const float* rows) {
    if constexpr (is_host_space_v<Space>) {
      cache_->assign_slots(slots, n, rows);
      return {};
    } else {
      return guarded([&]() -> status {
        if (n == 0) return {};
        auto s = in(slots, n);
        auto r = in(rows, n * cache_->row_width());
        cache_->assign_slots(s.data(), n, r.data());
        return {};
      });
    }
  }
  status erase(const Key* keys, std::size_t n) {
    if constexpr (is_host_space_v<Space>) {
      cache_->erase(keys, n);
      return {};
    } else {
      return guarded([&]() -> status {
        if (n == 0) return {};
        auto k = in(keys, n);
        cache_->erase(k.data(), n);
        return {};
      });
    }
  }
  // Keys and versions of the rows that pass `filter` (rows are not needed by the orchestration).
  status export_if(const export_filter& filter, Key* keys, float* rows, std::uint64_t* versions,
                   std::size_t max_out, std::size_t* count) {
    if constexpr (is_host_space_v<Space>) {
      return cache_->export_if(filter, keys, rows, versions, max_out, count);
    } else {
      return guarded([&]() -> status {
        if (rows) return status::internal("device_cache_bridge::export_if copies no rows");
        buffer<Key, Space> k(max_out, space());
        buffer<std::uint64_t, Space> v(max_out, space());
        EMBCACHE_RETURN_IF_ERROR(
            cache_->export_if(filter, k.data(), nullptr, v.data(), max_out, count));
        k.copy_to_host(keys, *count);
        if (versions) v.copy_to_host(versions, *count);
        return {};
      });
    }
  }
  status insert_and_evict(const Key* keys, std::size_t n, const float* rows_in,
                          const std::uint64_t* versions_in, Key* evicted_keys, float* evicted_rows,
                          std::uint64_t* evicted_versions, std::size_t* evicted_count,
                          bool* found_out, std::int64_t* slots_out) {
    if constexpr (is_host_space_v<Space>) {
      return cache_->insert_and_evict(keys, n, rows_in, versions_in, evicted_keys, evicted_rows,
                                      evicted_versions, evicted_count, found_out, slots_out);
    } else {
      return guarded([&]() -> status {
        *evicted_count = 0;
        if (n == 0) return {};
        const std::size_t w = cache_->row_width();
        auto k = in(keys, n);
        auto r = in(rows_in, n * w);
        auto v = in(versions_in, n);
        buffer<Key, Space> ek(n, space());
        buffer<float, Space> er(n * w, space());
        buffer<std::uint64_t, Space> ev(n, space());
        buffer<bool, Space> f(n, space());
        buffer<std::int64_t, Space> s(n, space());
        const status st = cache_->insert_and_evict(
            k.data(), n, rows_in ? r.data() : nullptr, versions_in ? v.data() : nullptr, ek.data(),
            er.data(), ev.data(), evicted_count, f.data(), s.data());
        // The outputs are complete even when some key found no room.
        const std::size_t e = *evicted_count;
        ek.copy_to_host(evicted_keys, e);
        er.copy_to_host(evicted_rows, e * w);
        ev.copy_to_host(evicted_versions, e);
        if (found_out) f.copy_to_host(found_out, n);
        if (slots_out) s.copy_to_host(slots_out, n);
        return st;
      });
    }
  }
  // States, keys and versions of every slot, readable on the host.
  slot_meta<Key> meta() const {
    slot_meta<Key> m;
    const auto ref = cache_->ref();
    if constexpr (is_host_space_v<Space>) {
      m.states = ref.states;
      m.keys = ref.keys;
      m.versions = ref.versions;
    } else {
      const std::size_t n = cache_->capacity();
      m.states_copy.resize(n);
      m.keys_copy.resize(n);
      m.versions_copy.resize(n);
      detail::copy(space(), m.states_copy.data(), ref.states, n);
      detail::copy(space(), m.keys_copy.data(), ref.keys, n * sizeof(Key));
      detail::copy(space(), m.versions_copy.data(), ref.versions, n * sizeof(std::uint64_t));
      m.states = m.states_copy.data();
      m.keys = m.keys_copy.data();
      m.versions = m.versions_copy.data();
    }
    return m;
  }

 private:
  const Space& space() const { return cache_->space(); }
  template <class T>
  buffer<T, Space> in(const T* host, std::size_t n) const {
    if (!host || n == 0) return {};
    buffer<T, Space> b(n, space());
    b.copy_from_host(host, n);
    return b;
  }

  cache_type* cache_;
};

}  // namespace embcache::detail
