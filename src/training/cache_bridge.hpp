// The device cache seen from the host: the training cache's orchestration keeps keys, slots and
// rows in host memory and reaches a table's embedding_cache through a device_cache_bridge, which
// in the cuda space moves each call's arguments through device buffers; plus the host memory the
// rows on their way to or from the cache live in. Private to src/training (included by the
// instantiating translation units through training_cache_definitions.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "embcache/buffer.hpp"
#include "embcache/embedding_cache.hpp"
#include "embcache/embedding_cache_ref.hpp"
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

// The status of a host allocation of `bytes` for `what` that failed: capacity_exceeded, as the
// trainer and the host store report one (status_code::out_of_host_memory is kept for pinned
// memory that a device call could not get).
inline status host_allocation_failed(const std::string& what, std::size_t bytes) {
  return status::capacity_exceeded(what + ": out of host memory (std::bad_alloc) allocating " +
                                   std::to_string(bytes) + " bytes");
}

// The status of an exception thrown by a CUDA call, an allocation or Thrust (a failed allocation
// whose size is not known here: the callers that know it use host_allocation_failed).
inline status status_of(const std::exception& e) {
  if (const auto* x = dynamic_cast<const error*>(&e)) return status(x->code(), x->what());
  if (dynamic_cast<const std::bad_alloc*>(&e)) {
    return status::capacity_exceeded(std::string("out of host memory (") + e.what() + ")");
  }
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

// Rows on their way to or from the cache (staging, write-behind), in staging_allocator memory.
template <class Space>
using staging_rows = std::vector<float, staging_allocator<float, Space>>;

// Slots chosen by device_cache_bridge::select_victims, kept in the space's memory.
template <class Space>
struct victim_slots {
  buffer<std::int64_t, Space> slots;
  std::size_t count = 0;
};

// The space the prefetch worker's cache calls run on (embedding_cache::order_calls_on). In the
// cuda space a stream of its own, made by the worker on its first run, on the caches' device: it
// is non-blocking, so that the worker's copies and kernels overlap the training kernels on the
// caches' stream instead of queueing behind them. In the host space the cache's own space (the
// worker is a thread of its own already).
template <class Space>
class worker_space;

template <>
class worker_space<host_space> {
 public:
  template <class Cache>
  host_space of(const Cache& cache) {
    return cache.space();
  }
};

template <>
class worker_space<cuda_space> {
 public:
  template <class Cache>
  cuda_space of(const Cache&) {
    if (!stream_) stream_ = std::make_unique<cuda_stream>();
    return stream_->space();
  }

 private:
  std::unique_ptr<cuda_stream> stream_;
};

// The cache's bulk calls with every argument in host memory. The host space passes them through;
// the cuda space copies inputs into device buffers, runs the call on the calling thread's stream for
// the cache (embedding_cache::call_space) and copies outputs back (each call returns once its results are on the host); a CUDA failure there becomes
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
                          bool* found_out, std::int64_t* slots_out, bool* evicted_dirty) {
    if constexpr (is_host_space_v<Space>) {
      return cache_->insert_and_evict(keys, n, rows_in, versions_in, evicted_keys, evicted_rows,
                                      evicted_versions, evicted_count, found_out, slots_out,
                                      evicted_dirty);
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
        buffer<bool, Space> d(n, space());
        const status st = cache_->insert_and_evict(
            k.data(), n, rows_in ? r.data() : nullptr, versions_in ? v.data() : nullptr, ek.data(),
            er.data(), ev.data(), evicted_count, f.data(), s.data(), d.data());
        // The outputs are complete even when some key found no room.
        const std::size_t e = *evicted_count;
        ek.copy_to_host(evicted_keys, e);
        er.copy_to_host(evicted_rows, e * w);
        ev.copy_to_host(evicted_versions, e);
        if (found_out) f.copy_to_host(found_out, n);
        if (slots_out) s.copy_to_host(slots_out, n);
        if (evicted_dirty) d.copy_to_host(evicted_dirty, e);
        return st;
      });
    }
  }
  // Inserts or overwrites rows with their versions, then records for each the version the store
  // holds (`synced`, may be nullptr: none, the rows are dirty) and sets its keyset mark.
  status install(const Key* keys, std::size_t n, const float* rows, const std::uint64_t* versions,
                 const std::uint64_t* synced, std::uint32_t mark) {
    return guarded([&]() -> status {
      if (n == 0) return {};
      const install_inputs a(*this, keys, n, rows, versions, synced);
      buffer<std::int64_t, Space> s(n, space());
      EMBCACHE_RETURN_IF_ERROR(cache_->insert_or_assign(a.keys, n, a.rows, a.versions, s.data()));
      if (synced) cache_->mark_synced(s.data(), n, a.synced);
      cache_->set_marks(s.data(), n, mark);
      return {};
    });
  }
  // install as one call that holds the cache exclusively (embedding_cache::install): keys placed
  // in one pass, rows copied in another (the boundary's, where nothing else runs on the cache).
  status install_alone(const Key* keys, std::size_t n, const float* rows,
                       const std::uint64_t* versions, const std::uint64_t* synced,
                       std::uint32_t mark) {
    return guarded([&]() -> status {
      if (n == 0) return {};
      const install_inputs a(*this, keys, n, rows, versions, synced);
      return cache_->install(a.keys, n, a.rows, a.versions, a.synced, mark);
    });
  }
  // install_alone with rows already in the cache's free rows `rows` (n, the space's memory),
  // moved in by index (embedding_cache::install_rows), which leaves the rows it freed in `rows`.
  status install_moved(const Key* keys, std::size_t n, std::int64_t* rows,
                       const std::uint64_t* versions, const std::uint64_t* synced,
                       std::uint32_t mark) {
    return guarded([&]() -> status {
      if (n == 0) return {};
      const install_inputs a(*this, keys, n, nullptr, versions, synced);
      return cache_->install_rows(a.keys, n, rows, a.versions, a.synced, mark);
    });
  }
  // Host rows `src` (n rows) into the cache's rows `rows` (n, the space's memory; rows no slot
  // holds), in chunks of at most `chunk` rows through the space's memory.
  status write_rows(const std::int64_t* rows, std::size_t n, const float* src, std::size_t chunk) {
    return guarded([&]() -> status {
      const std::size_t w = cache_->row_width();
      chunk = std::max<std::size_t>(1, chunk);
      for (std::size_t b = 0; b < n; b += chunk) {
        const std::size_t m = std::min(chunk, n - b);
        const auto r = in(src + b * w, m * w);
        EMBCACHE_RETURN_IF_ERROR(cache_->write_rows(rows + b, m, arg(src + b * w, r)));
      }
      return {};
    });
  }
  // lookup_slots, then the found keys marked with `mark`.
  status lookup_and_mark(const Key* keys, std::size_t n, std::uint32_t mark,
                         std::int64_t* slots) {
    return guarded([&]() -> status {
      auto k = in(keys, n);
      buffer<std::int64_t, Space> s(is_host_space_v<Space> ? 0 : n, space());
      std::int64_t* out = is_host_space_v<Space> ? slots : s.data();
      EMBCACHE_RETURN_IF_ERROR(cache_->lookup_slots(arg(keys, k), n, out));
      cache_->set_marks(out, n, mark);
      if constexpr (!is_host_space_v<Space>) s.copy_to_host(slots, n);
      return {};
    });
  }
  // Every slot's keyset mark set to 0 (when the caller's mark counter starts over).
  status clear_marks() {
    return guarded([&]() -> status {
      std::vector<std::int64_t> all(cache_->slots());
      for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i);
      auto s = in(all.data(), all.size());
      cache_->set_marks(arg(all.data(), s), all.size(), 0);
      return {};
    });
  }
  // The store holds the rows of `slots` at `versions`.
  status mark_synced(const std::int64_t* slots, std::size_t n, const std::uint64_t* versions) {
    return guarded([&]() -> status {
      if (n == 0) return {};
      auto s = in(slots, n);
      auto v = in(versions, n);
      cache_->mark_synced(arg(slots, s), n, arg(versions, v));
      return {};
    });
  }
  // Up to `need` resident rows marked below `keep_mark`, oldest version first; they stay in the
  // space's memory for gather_dirty and erase_slots.
  status select_victims(std::uint32_t keep_mark, std::size_t need, victim_slots<Space>* out) {
    return guarded([&]() -> status {
      out->slots = buffer<std::int64_t, Space>(need, space());
      cache_->select_victims(keep_mark, need, victim_order::oldest_version, out->slots.data(),
                             &out->count);
      return {};
    });
  }
  // The dirty rows among victims [begin, begin + n): keys, rows and versions into host memory
  // (room for n each); `*count` how many.
  status gather_dirty(const victim_slots<Space>& v, std::size_t begin, std::size_t n, Key* keys,
                      float* rows, std::uint64_t* versions, std::size_t* count) {
    return guarded([&]() -> status {
      gather_dirty_of(v.slots.data() + begin, n, nullptr, keys, rows, versions, count);
      return {};
    });
  }
  // The dirty rows among victims [begin, begin + n) without their floats: keys, versions and
  // slots into host memory (room for n each); `*count` how many.
  status gather_dirty_slots(const victim_slots<Space>& v, std::size_t begin, std::size_t n,
                            Key* keys, std::uint64_t* versions, std::int64_t* slots_out,
                            std::size_t* count) {
    return guarded([&]() -> status {
      gather_dirty_of(v.slots.data() + begin, n, slots_out, keys, nullptr, versions, count);
      return {};
    });
  }
  // The rows of host `slots` (n) moved out into the cache's free rows `rows` (n, the space's
  // memory), which receive the indices of the rows the slots held (embedding_cache::detach_rows);
  // `held` (host memory, n) a copy of those.
  status detach(const std::int64_t* slots, std::size_t n, std::int64_t* rows, std::int64_t* held) {
    return guarded([&]() -> status {
      if (n == 0) return {};
      auto s = in(slots, n);
      EMBCACHE_RETURN_IF_ERROR(cache_->detach_rows(arg(slots, s), n, rows));
      detail::copy(space(), held, rows, n * sizeof(std::int64_t));
      detail::synchronize(space());
      return {};
    });
  }
  // The cache's rows `rows` (host memory, n) into host `dst`, in chunks of at most `chunk` rows.
  status read_rows(const std::int64_t* rows, std::size_t n, float* dst, std::size_t chunk) {
    return guarded([&]() -> status {
      const std::size_t w = cache_->row_width();
      chunk = std::max<std::size_t>(1, std::min(chunk, n));
      // The cuda space's rows come back through one chunk of device memory.
      buffer<float, Space> out(is_host_space_v<Space> ? 0 : chunk * w, space());
      for (std::size_t b = 0; b < n; b += chunk) {
        const std::size_t m = std::min(chunk, n - b);
        auto r = in(rows + b, m);
        float* to = is_host_space_v<Space> ? dst + b * w : out.data();
        EMBCACHE_RETURN_IF_ERROR(cache_->read_rows(arg(rows + b, r), m, to));
        if constexpr (!is_host_space_v<Space>) out.copy_to_host(dst + b * w, m * w);
      }
      return {};
    });
  }
  // The dirty rows among host `slots`: their slots, keys, rows and versions (room for n each).
  status gather_dirty(const std::int64_t* slots, std::size_t n, std::int64_t* slots_out,
                      Key* keys, float* rows, std::uint64_t* versions, std::size_t* count) {
    return guarded([&]() -> status {
      auto s = in(slots, n);
      gather_dirty_of(arg(slots, s), n, slots_out, keys, rows, versions, count);
      return {};
    });
  }
  // Removes the victims' rows.
  status erase_slots(const victim_slots<Space>& v) {
    return guarded([&]() -> status {
      cache_->erase_slots(v.slots.data(), v.count);
      return {};
    });
  }

 private:
  // Where this thread's calls on the cache run (the worker's stream in the worker).
  Space space() const { return cache_->call_space(); }
  // gather_dirty of `slots` (n, in the space's memory) with host outputs (slots_out may be
  // nullptr): in the cuda space through device buffers, of which only the dirty rows come back.
  void gather_dirty_of(const std::int64_t* slots, std::size_t n, std::int64_t* slots_out,
                       Key* keys, float* rows, std::uint64_t* versions, std::size_t* count) {
    *count = 0;
    if (n == 0) return;
    if constexpr (is_host_space_v<Space>) {
      cache_->gather_dirty(slots, n, keys, rows, versions, slots_out, count);
    } else {
      const std::size_t w = cache_->row_width();
      buffer<std::int64_t, Space> so(slots_out ? n : 0, space());
      buffer<Key, Space> k(n, space());
      buffer<float, Space> r(rows ? n * w : 0, space());
      buffer<std::uint64_t, Space> ver(n, space());
      cache_->gather_dirty(slots, n, k.data(), rows ? r.data() : nullptr, ver.data(),
                           slots_out ? so.data() : nullptr, count);
      if (slots_out) so.copy_to_host(slots_out, *count);
      k.copy_to_host(keys, *count);
      if (rows) r.copy_to_host(rows, *count * w);
      ver.copy_to_host(versions, *count);
    }
  }
  // A copy of host memory in the space's memory; none in the host space (see arg).
  template <class T>
  buffer<T, Space> in(const T* host, std::size_t n) const {
    if (is_host_space_v<Space> || !host || n == 0) return {};
    buffer<T, Space> b(n, space());
    b.copy_from_host(host, n);
    return b;
  }
  // The argument to hand the cache: the host pointer itself in the host space, else its copy.
  template <class T>
  static const T* arg(const T* host, const buffer<T, Space>& copy) {
    if constexpr (is_host_space_v<Space>) {
      return host;
    } else {
      return copy.data();
    }
  }
  // An install's keys, rows, versions and synced versions as the cache takes them (arg): the
  // host pointers themselves in the host space, else copies in the cache's space. A null
  // pointer (no versions, no synced versions) stays null.
  struct install_inputs {
    install_inputs(const device_cache_bridge& b, const Key* k, std::size_t n, const float* r,
                   const std::uint64_t* v, const std::uint64_t* y)
        : k_(b.in(k, n)),
          r_(b.in(r, n * b.cache_->row_width())),
          v_(b.in(v, n)),
          y_(b.in(y, n)),
          keys(arg(k, k_)),
          rows(arg(r, r_)),
          versions(v ? arg(v, v_) : nullptr),
          synced(y ? arg(y, y_) : nullptr) {}
    buffer<Key, Space> k_;
    buffer<float, Space> r_;
    buffer<std::uint64_t, Space> v_, y_;
    const Key* const keys;
    const float* const rows;
    const std::uint64_t* const versions;
    const std::uint64_t* const synced;
  };

  cache_type* cache_;
};

}  // namespace embcache::detail
