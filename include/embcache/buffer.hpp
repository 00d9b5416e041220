/// @file buffer.hpp
/// @brief RAII arrays in a space's memory, and copies between the host and a space.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>

#include "embcache/space.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace embcache {
namespace detail {

// Host allocations are 64-byte aligned so rows and bucket groups start on cache lines. Large ones
// are offered to transparent huge pages: tables are probed at random, and with 4 KiB pages nearly
// every probe would also miss the TLB. (Any 2 MiB-aligned stretch of the range gets huge pages,
// so the allocation itself needs no 2 MiB alignment.)
inline void* host_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = ::operator new(bytes, std::align_val_t(64));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::size_t huge = std::size_t{2} << 20;
  if (bytes >= 2 * huge) {
    constexpr std::uintptr_t page = 4096;
    const std::uintptr_t begin = (reinterpret_cast<std::uintptr_t>(p) + page - 1) & ~(page - 1);
    const std::uintptr_t end = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(page - 1);
    if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
#endif
  return p;
}
inline void host_deallocate(void* p) noexcept {
  if (p) ::operator delete(p, std::align_val_t(64));
}

// Implemented by the embcache::cuda library; they throw embcache::error on CUDA failures.
void* cuda_allocate(std::size_t bytes, CUstream_st* stream);
void cuda_deallocate(void* p, CUstream_st* stream) noexcept;
void cuda_copy(void* dst, const void* src, std::size_t bytes,
               CUstream_st* stream);  // any direction
void cuda_memset(void* dst, int value, std::size_t bytes, CUstream_st* stream);
void cuda_synchronize(CUstream_st* stream);
void* cuda_allocate_pinned(std::size_t bytes);
void cuda_deallocate_pinned(void* p) noexcept;
int cuda_current_device();  // the calling thread's current device
void cuda_set_device(int device);

inline void* allocate(const host_space&, std::size_t bytes) { return host_allocate(bytes); }
inline void deallocate(const host_space&, void* p) noexcept { host_deallocate(p); }
inline void copy(const host_space&, void* dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
inline void fill_bytes(const host_space&, void* dst, int value, std::size_t bytes) {
  if (bytes) std::memset(dst, value, bytes);
}
inline void synchronize(const host_space&) {}

inline void* allocate(const cuda_space& s, std::size_t bytes) {
  return bytes ? cuda_allocate(bytes, s.stream) : nullptr;
}
inline void deallocate(const cuda_space& s, void* p) noexcept {
  if (p) cuda_deallocate(p, s.stream);
}
inline void copy(const cuda_space& s, void* dst, const void* src, std::size_t bytes) {
  if (bytes) cuda_copy(dst, src, bytes, s.stream);
}
inline void fill_bytes(const cuda_space& s, void* dst, int value, std::size_t bytes) {
  if (bytes) cuda_memset(dst, value, bytes, s.stream);
}
inline void synchronize(const cuda_space& s) { cuda_synchronize(s.stream); }

}  // namespace detail

/// Copies `n` elements from host memory `src` to `dst` in the memory of `space` (any memory of
/// the space, e.g. a cache's rows()); returns once done. Nothing happens for n == 0.
template <class T, class Space>
void copy_to_space(const Space& space, T* dst, const T* src, std::size_t n) {
  detail::copy(space, dst, src, n * sizeof(T));
}

/// Copies `n` elements from `src` in the memory of `space` to host memory `dst`; returns once
/// done. Nothing happens for n == 0.
template <class T, class Space>
void copy_to_host(const Space& space, T* dst, const T* src, std::size_t n) {
  detail::copy(space, dst, src, n * sizeof(T));
}

/// An owning array of `T` in the memory of `Space` (trivially copyable T only; not initialized).
template <class T, class Space>
class buffer {
 public:
  buffer() = default;
  /// Allocates `size` elements in `space`'s memory.
  explicit buffer(std::size_t size, Space space = {})
      : space_(space),
        data_(static_cast<T*>(detail::allocate(space_, size * sizeof(T)))),
        size_(size) {}
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  buffer(buffer&& o) noexcept : space_(o.space_), data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  buffer& operator=(buffer&& o) noexcept {
    if (this != &o) {
      reset();
      space_ = o.space_;
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~buffer() { reset(); }

  /// Frees the memory.
  void reset() noexcept {
    detail::deallocate(space_, data_);
    data_ = nullptr;
    size_ = 0;
  }
  /// Sets every byte to `value`.
  void fill_bytes(int value) { detail::fill_bytes(space_, data_, value, size_ * sizeof(T)); }
  /// Copies `n` elements from host memory into this buffer, starting at element `offset`.
  void copy_from_host(const T* src, std::size_t n, std::size_t offset = 0) {
    detail::copy(space_, data_ + offset, src, n * sizeof(T));
  }
  /// Copies `n` elements starting at `offset` into host memory.
  void copy_to_host(T* dst, std::size_t n, std::size_t offset = 0) const {
    detail::copy(space_, dst, data_ + offset, n * sizeof(T));
  }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  const Space& space() const noexcept { return space_; }

 private:
  Space space_{};
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace embcache
