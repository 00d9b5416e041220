// The log store's bytes on disk and its in-memory pieces: the record header and its checksum,
// segment names, the index of key to location, buffers aligned for O_DIRECT, and the checked
// pread/pwrite loops. Part of log_store.cpp (include/embcache/log_store.hpp for the layout).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "common/durable_file.hpp"
#include "embcache/status.hpp"

namespace embcache::detail::logfmt {

inline constexpr const char* state_format = "embcache.log_store";
inline constexpr int state_format_version = 1;
inline constexpr std::uint32_t record_magic = 0x524c4345u;  // "ECLR"
inline constexpr std::uint32_t kind_row = 1, kind_tombstone = 2, kind_pad = 3;
inline constexpr std::size_t direct_align = 4096;  // O_DIRECT: offsets, lengths and buffers
inline constexpr unsigned offset_bits = 40;        // a location: segment id << 40 | offset
inline constexpr std::uint64_t offset_mask = (std::uint64_t{1} << offset_bits) - 1;
inline constexpr std::uint64_t max_segment_id = (std::uint64_t{1} << 24) - 1;
inline constexpr std::uint64_t max_segment_bytes = std::uint64_t{1} << 39;
inline constexpr std::size_t scan_chunk_bytes = std::size_t{4} << 20;
// Sequence numbers past this are damage: a store appends far fewer records in its life.
inline constexpr std::uint64_t max_seq = std::uint64_t{1} << 62;

struct record_header {
  std::uint32_t magic;
  std::uint32_t kind;
  std::uint64_t key;  // a pad's: its size in bytes
  std::uint64_t seq;
  std::uint64_t version;
  std::uint64_t checksum;  // XXH3 of the 32 bytes above, then of the row (seeded by the first)
};
static_assert(sizeof(record_header) == 40, "the record header is 40 bytes on disk");

inline std::uint64_t record_checksum(const record_header& h, const void* row,
                                     std::size_t row_bytes) {
  const std::uint64_t head = XXH3_64bits(&h, offsetof(record_header, checksum));
  return row_bytes ? XXH3_64bits_withSeed(row, row_bytes, head) : head;
}

// Bytes of a row record: the header and the floats, rounded up to 8.
inline std::size_t row_record_bytes(std::size_t row_width) {
  return sizeof(record_header) + (row_width * sizeof(float) + 7) / 8 * 8;
}

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Bytes in memory aligned for O_DIRECT; the few calls of std::vector<char> the store uses.
class aligned_bytes {
 public:
  aligned_bytes() = default;
  aligned_bytes(const aligned_bytes&) = delete;
  aligned_bytes& operator=(const aligned_bytes&) = delete;
  ~aligned_bytes() { std::free(p_); }
  char* data() { return p_; }
  const char* data() const { return p_; }
  std::size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  std::size_t capacity() const { return cap_; }
  void clear() { n_ = 0; }
  // Room for `n` bytes exactly (rounded up to 4 KiB), keeping the content. Throws bad_alloc.
  void reserve(std::size_t n) {
    if (n <= cap_) return;
    const std::size_t cap = (n + direct_align - 1) / direct_align * direct_align;
    void* q = std::aligned_alloc(direct_align, cap);
    if (!q) throw std::bad_alloc();
    if (n_) std::memcpy(q, p_, n_);
    std::free(p_);
    p_ = static_cast<char*>(q);
    cap_ = cap;
  }
  // Keeps the first min(n, size()) bytes; the rest are unspecified. Grows by doubling.
  void resize(std::size_t n) {
    if (n > cap_) reserve(std::max(n, cap_ * 2));
    n_ = n;
  }

 private:
  char* p_ = nullptr;
  std::size_t n_ = 0, cap_ = 0;
};

// key -> location, open addressing with linear probing; location 0 marks an empty slot (a
// location's segment id is at least 1). At most 3/4 full; erase shifts back (no tombstones);
// it never shrinks.
class flat_index {
 public:
  flat_index() { reset(capacity_for(0)); }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return keys_.size(); }
  static std::size_t capacity_for(std::size_t rows) {
    std::size_t cap = 1024;
    while (rows > cap / 4 * 3 && cap < (std::size_t{1} << 60)) cap *= 2;
    return cap;
  }
  // Room for `rows` keys without growing. Throws bad_alloc.
  void reserve(std::size_t rows) {
    if (capacity_for(rows) > capacity()) rehash(capacity_for(rows));
  }
  std::uint64_t find(std::uint64_t key) const {
    for (std::size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      if (locs_[i] == 0) return 0;
      if (keys_[i] == key) return locs_[i];
    }
  }
  // Sets key's location; returns the previous one (0 when new). Grows only for a new key.
  std::uint64_t put(std::uint64_t key, std::uint64_t loc) {
    std::size_t i = mix(key) & mask_;
    for (; locs_[i] != 0; i = (i + 1) & mask_)
      if (keys_[i] == key) return std::exchange(locs_[i], loc);
    if (size_ + 1 > capacity() / 4 * 3) {
      rehash(capacity() * 2);
      return put(key, loc);
    }
    keys_[i] = key;
    locs_[i] = loc;
    ++size_;
    return 0;
  }
  // Removes key; returns its location (0 when absent).
  std::uint64_t remove(std::uint64_t key) {
    std::size_t i = mix(key) & mask_;
    for (;; i = (i + 1) & mask_) {
      if (locs_[i] == 0) return 0;
      if (keys_[i] == key) break;
    }
    const std::uint64_t old = locs_[i];
    for (std::size_t j = (i + 1) & mask_; locs_[j] != 0; j = (j + 1) & mask_) {
      const std::size_t home = mix(keys_[j]) & mask_;
      // keys_[j] may move to the hole at i when its home is not within (i, j].
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        keys_[i] = keys_[j];
        locs_[i] = locs_[j];
        i = j;
      }
    }
    locs_[i] = 0;
    --size_;
    return old;
  }
  std::size_t memory_bytes() const { return capacity() * 16; }

 private:
  void reset(std::size_t cap) {
    keys_.assign(cap, 0);
    locs_.assign(cap, 0);
    mask_ = cap - 1;
    size_ = 0;
  }
  void rehash(std::size_t cap) {
    std::vector<std::uint64_t> k(cap, 0), l(cap, 0);  // allocated first: a failure changes nothing
    k.swap(keys_);
    l.swap(locs_);
    mask_ = cap - 1;
    size_ = 0;
    for (std::size_t i = 0; i < k.size(); ++i)
      if (l[i] != 0) put(k[i], l[i]);
  }
  std::vector<std::uint64_t> keys_, locs_;
  std::size_t mask_ = 0, size_ = 0;
};

inline std::string segment_name(std::uint64_t id) {
  char b[32];
  std::snprintf(b, sizeof b, "seg-%08llu.log", static_cast<unsigned long long>(id));
  return b;
}

// The id of a segment file name "seg-" + 8 digits + ".log", or 0 for any other name.
inline std::uint64_t segment_id_of(const std::string& name) {
  if (name.size() != 16 || name.compare(0, 4, "seg-") != 0 || name.compare(12, 4, ".log") != 0)
    return 0;
  std::uint64_t id = 0;
  for (std::size_t i = 4; i < 12; ++i) {
    if (name[i] < '0' || name[i] > '9') return 0;
    id = id * 10 + static_cast<std::uint64_t>(name[i] - '0');
  }
  return id <= max_segment_id ? id : 0;
}

// Reads up to `n` bytes at `off`; fewer only at the end of the file (*got says how many). With
// `direct`, a short read is the end: the next offset would not be aligned.
inline status pread_upto(int fd, char* p, std::size_t n, std::uint64_t off, const std::string& path,
                         bool direct, std::size_t* got) {
  *got = 0;
  while (*got < n) {
    const ssize_t r = ::pread(fd, p + *got, n - *got, static_cast<off_t>(off + *got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno_status("log_store: cannot read", path, errno);
    if (r == 0) break;
    *got += static_cast<std::size_t>(r);
    if (direct && *got < n) break;
  }
  return {};
}

inline status pwrite_all(int fd, const void* buf, std::size_t n, std::uint64_t off,
                         const std::string& path) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return errno_status("log_store: cannot write", path, r < 0 ? errno : EIO);
    p += r;
    n -= static_cast<std::size_t>(r);
    off += static_cast<std::uint64_t>(r);
  }
  return {};
}

}  // namespace embcache::detail::logfmt
