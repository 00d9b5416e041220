// The log store: rows appended to segment files, an index of key to location in memory, the
// oldest segment cleaned when the log outgrows its live rows (include/embcache/log_store.hpp).
#include "embcache/log_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/durable_file.hpp"
#include "format/checked_io.hpp"

namespace embcache {

namespace {

namespace fs = std::filesystem;

constexpr const char* state_format = "embcache.log_store";
constexpr int state_format_version = 1;
constexpr std::uint32_t record_magic = 0x524c4345u;  // "ECLR"
constexpr std::uint32_t kind_row = 1, kind_tombstone = 2, kind_pad = 3;
constexpr std::size_t direct_align = 4096;  // O_DIRECT: offsets, lengths and buffers
constexpr unsigned offset_bits = 40;  // a location: segment id << 40 | offset
constexpr std::uint64_t max_segment_id = (std::uint64_t{1} << 24) - 1;
constexpr std::size_t scan_chunk_bytes = std::size_t{4} << 20;

struct record_header {
  std::uint32_t magic;
  std::uint32_t kind;
  std::uint64_t key;
  std::uint64_t seq;
  std::uint64_t version;
  std::uint64_t checksum;  // XXH3 of the 32 bytes above, then of the row (seeded by the first)
};
static_assert(sizeof(record_header) == 40, "the record header is 40 bytes on disk");

std::uint64_t record_checksum(const record_header& h, const void* row, std::size_t row_bytes) {
  const std::uint64_t head = XXH3_64bits(&h, offsetof(record_header, checksum));
  return row_bytes ? XXH3_64bits_withSeed(row, row_bytes, head) : head;
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
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
  // Keeps the first min(n, size()) bytes; the rest are unspecified. Throws std::bad_alloc.
  void resize(std::size_t n) {
    if (n > cap_) {
      std::size_t cap = std::max<std::size_t>(cap_ * 2, direct_align);
      while (cap < n) cap *= 2;
      void* q = std::aligned_alloc(direct_align, cap);
      if (!q) throw std::bad_alloc();
      if (n_) std::memcpy(q, p_, n_);
      std::free(p_);
      p_ = static_cast<char*>(q);
      cap_ = cap;
    }
    n_ = n;
  }

 private:
  char* p_ = nullptr;
  std::size_t n_ = 0, cap_ = 0;
};

// key -> location, open addressing with linear probing; location 0 marks an empty slot (a
// location's segment id is at least 1). Load at most 3/4; erase shifts back (no tombstones).
class flat_index {
 public:
  explicit flat_index(std::size_t rows = 0) { reset(capacity_for(rows)); }
  void presize(std::size_t rows) {
    if (capacity_for(rows) > capacity() && size_ == 0) reset(capacity_for(rows));
  }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return keys_.size(); }
  static std::size_t capacity_for(std::size_t rows) {
    std::size_t cap = 1024;
    while (rows > cap / 4 * 3 && cap < (std::size_t{1} << 60)) cap *= 2;
    return cap;
  }
  std::uint64_t find(std::uint64_t key) const {
    for (std::size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      if (locs_[i] == 0) return 0;
      if (keys_[i] == key) return locs_[i];
    }
  }
  // Sets key's location; returns the previous one (0 when new).
  std::uint64_t put(std::uint64_t key, std::uint64_t loc) {
    if (size_ + 1 > capacity() / 4 * 3) grow();
    for (std::size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      if (locs_[i] == 0) {
        keys_[i] = key;
        locs_[i] = loc;
        ++size_;
        return 0;
      }
      if (keys_[i] == key) return std::exchange(locs_[i], loc);
    }
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
  void grow() {
    std::vector<std::uint64_t> k, l;
    k.swap(keys_);
    l.swap(locs_);
    reset(k.size() * 2);
    for (std::size_t i = 0; i < k.size(); ++i)
      if (l[i] != 0) put(k[i], l[i]);
  }
  std::vector<std::uint64_t> keys_, locs_;
  std::size_t mask_ = 0, size_ = 0;
};

std::string segment_name(std::uint64_t id) {
  char b[32];
  std::snprintf(b, sizeof b, "seg-%08" PRIu64 ".log", id);
  return b;
}

// Reads up to `n` bytes at `off`, fewer only at the end of the file (*got says how many).
status pread_upto(int fd, char* p, std::size_t n, std::uint64_t off, const std::string& path,
                  std::size_t* got) {
  *got = 0;
  while (*got < n) {
    const ssize_t r = ::pread(fd, p + *got, n - *got, static_cast<off_t>(off + *got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return detail::errno_status("log_store: cannot read", path, errno);
    if (r == 0) break;
    *got += static_cast<std::size_t>(r);
  }
  return {};
}

status pwrite_all(int fd, const void* buf, std::size_t n, std::uint64_t off,
                  const std::string& path) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return detail::errno_status("log_store: cannot write", path, errno);
    p += r;
    n -= static_cast<std::size_t>(r);
    off += static_cast<std::uint64_t>(r);
  }
  return {};
}

template <class Key>
std::uint64_t key_bits(Key k) {
  return static_cast<std::uint64_t>(k);
}

}  // namespace

template <class Key>
struct log_store<Key>::impl {
  struct segment {
    std::uint64_t id = 0;
    int fd = -1;
    std::uint64_t bytes = 0;  // what the log holds (the file may be longer after a failed write)
    bool dirty = false;       // written since the last flush
  };
  // An index change that takes effect once its record is written.
  struct pending {
    std::uint64_t key, loc;
    std::uint32_t kind;
    std::uint64_t version;
  };

  log_store_options o;
  std::size_t row_bytes = 0, record_bytes = 0;
  detail::file_lock lock;
  flat_index index;
  std::deque<segment> segs;  // ascending ids; the last is appended to
  std::uint64_t live = 0, disk = 0, next_seq = 1, max_version = 0;
  bool folder_dirty = false;
  aligned_bytes wbuf;
  std::vector<pending> wpending;
  log_store_counters count;

  ~impl() {
    for (auto& s : segs)
      if (s.fd >= 0) ::close(s.fd);
  }

  int direct_flag() const { return o.direct_io ? O_DIRECT : 0; }
  std::string path_of(std::uint64_t id) const { return o.path + "/" + segment_name(id); }
  std::string who() const { return "log_store of table '" + o.table_name + "'"; }
  segment& seg_of(std::uint64_t loc) { return segs[(loc >> offset_bits) - segs.front().id]; }
  bool holds_segment(std::uint64_t loc) const {
    const std::uint64_t id = loc >> offset_bits;
    return id >= segs.front().id && id <= segs.back().id;
  }

  status corrupt(const std::string& path, std::uint64_t off, const std::string& why) const {
    return status::corruption(who() + ": segment '" + path + "' at byte " + std::to_string(off) +
                              ": " + why);
  }

  // The size of the record whose header starts at `p` (`avail` >= 40 bytes), or 0 when no
  // sound header starts there.
  std::size_t record_size(const char* p) const {
    record_header h;
    std::memcpy(&h, p, sizeof h);
    if (h.magic != record_magic) return 0;
    if (h.kind == kind_row) return record_bytes;
    if (h.kind == kind_tombstone) return sizeof(record_header);
    // A pad fills a direct write up to 4 KiB: 40 bytes to one block and 39 more.
    const bool pad = h.kind == kind_pad && h.key >= sizeof(record_header) &&
                     h.key < direct_align + sizeof(record_header) && h.key % 8 == 0;
    return pad ? static_cast<std::size_t>(h.key) : 0;
  }

  // Checks the record at `p` (at most `avail` bytes); sets its size. An empty string when it is
  // whole and sound, else why not.
  std::string check_record(const char* p, std::size_t avail, std::size_t* size) const {
    if (avail < sizeof(record_header)) return "a record cut short";
    *size = record_size(p);
    if (*size == 0) return "no record starts here (bad magic or kind)";
    if (avail < *size) return "a record cut short";
    record_header h;
    std::memcpy(&h, p, sizeof h);
    const std::size_t payload = h.kind == kind_row ? row_bytes : 0;
    if (record_checksum(h, p + sizeof h, payload) != h.checksum) return "checksum mismatch";
    if (sizeof(Key) == 4 && (h.key >> 32) != 0) return "a key wider than the table's keys";
    return {};
  }

  // Reads [off, off + len) of segment `s` into `buf` and points *out at byte `off`: in direct
  // mode the read is widened to 4 KiB boundaries. Counts the bytes read in *read_bytes.
  status read_span(const segment& s, std::uint64_t off, std::size_t len, aligned_bytes& buf,
                   const char** out, std::uint64_t* read_bytes = nullptr) const {
    const std::uint64_t a = o.direct_io ? off / direct_align * direct_align : off;
    const std::uint64_t e =
        o.direct_io ? (off + len + direct_align - 1) / direct_align * direct_align : off + len;
    buf.resize(static_cast<std::size_t>(e - a));
    std::size_t got = 0;
    const std::string path = path_of(s.id);
    EMBCACHE_RETURN_IF_ERROR(
        pread_upto(s.fd, buf.data(), static_cast<std::size_t>(e - a), a, path, &got));
    if (read_bytes) *read_bytes += got;
    if (got < off + len - a)
      return corrupt(path, a + got, "the segment ends before a record it should hold");
    *out = buf.data() + (off - a);
    return {};
  }

  // Reads the records of segment `s` in [from, to) in order: fn(loc, header, row) for each.
  // With `tolerant`, the first damaged or cut record ends the walk (*end = its offset);
  // otherwise it is corruption naming the file and offset.
  template <class F>
  status walk(const segment& s, std::uint64_t from, std::uint64_t to, bool tolerant,
              std::uint64_t* end, const F& fn) const {
    const std::string path = path_of(s.id);
    const std::size_t chunk = std::max(scan_chunk_bytes, 2 * record_bytes + direct_align);
    aligned_bytes buf;
    std::uint64_t off = from;
    while (off < to) {
      const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, to - off));
      const bool more = off + want < to;  // the chunk ends before `to`
      const char* p = nullptr;
      EMBCACHE_RETURN_IF_ERROR(read_span(s, off, want, buf, &p));
      std::size_t at = 0;
      while (at < want) {
        const std::size_t avail = want - at;
        // A record the chunk cuts is read whole with the next chunk.
        if (more && (avail < sizeof(record_header) || (record_size(p + at) > avail))) break;
        std::size_t size = 0;
        const std::string why = check_record(p + at, avail, &size);
        if (!why.empty()) {
          if (tolerant) {
            *end = off + at;
            return {};
          }
          return corrupt(path, off + at, why);
        }
        record_header h;
        std::memcpy(&h, p + at, sizeof h);
        if (h.kind != kind_pad)
          EMBCACHE_RETURN_IF_ERROR(fn((s.id << offset_bits) | (off + at), h, p + at + sizeof h));
        at += size;
      }
      off += at;
    }
    if (end) *end = off;
    return {};
  }

  status write_state() {
    nlohmann::json j;
    j["format"] = state_format;
    j["format_version"] = state_format_version;
    j["table"] = o.table_name;
    j["key_bytes"] = sizeof(Key);
    j["row_width"] = o.row_width;
    j["dim"] = o.dim;
    j["optimizer"] = o.optimizer;
    j["max_version"] = max_version;
    j["next_seq"] = next_seq;
    auto& list = j["segments"] = nlohmann::json::array();
    for (const auto& s : segs) list.push_back({{"id", s.id}, {"bytes", s.bytes}});
    return detail::write_text_durably(o.path + "/state.json", j.dump(1) + "\n").with_context(who());
  }

  status sync() {
    for (auto& s : segs) {
      if (!s.dirty) continue;
      if (::fdatasync(s.fd) != 0)
        return detail::errno_status(who() + ": cannot sync", path_of(s.id), errno);
      s.dirty = false;
    }
    if (folder_dirty) {
      EMBCACHE_RETURN_IF_ERROR(detail::sync_folder(o.path));
      folder_dirty = false;
    }
    return write_state();
  }

  status new_segment(std::uint64_t id) {
    if (id > max_segment_id) return status::capacity_exceeded(who() + ": segment ids run out");
    const std::string p = path_of(id);
    const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | direct_flag(), 0644);
    if (fd < 0) return detail::errno_status(who() + ": cannot create segment", p, errno);
    segs.push_back({id, fd, 0, true});
    folder_dirty = true;
    return {};
  }

  // Writes the buffered records at the end of the last segment and applies their index changes.
  status write_buffer() {
    if (wbuf.empty()) return {};
    if (o.direct_io && wbuf.size() % direct_align != 0) {
      // A pad record up to the next 4 KiB (a whole block more when that is under a header).
      std::size_t gap = direct_align - wbuf.size() % direct_align;
      if (gap < sizeof(record_header)) gap += direct_align;
      const std::size_t at = wbuf.size();
      wbuf.resize(at + gap);
      std::memset(wbuf.data() + at, 0, gap);
      record_header h{record_magic, kind_pad, gap, 0, 0, 0};
      h.checksum = record_checksum(h, nullptr, 0);
      std::memcpy(wbuf.data() + at, &h, sizeof h);
    }
    segment& s = segs.back();
    status st = pwrite_all(s.fd, wbuf.data(), wbuf.size(), s.bytes, path_of(s.id));
    if (!st.ok()) {
      wbuf.clear();
      wpending.clear();
      return st.with_context(who());
    }
    s.bytes += wbuf.size();
    s.dirty = true;
    disk += wbuf.size();
    count.bytes_appended += wbuf.size();
    for (const auto& p : wpending) {
      if (p.kind == kind_row) {
        if (index.put(p.key, p.loc) == 0) live += record_bytes;
        max_version = std::max(max_version, p.version);
      } else if (index.remove(p.key) != 0) {
        live -= record_bytes;
      }
    }
    wbuf.clear();
    wpending.clear();
    return {};
  }

  // Buffers one record at the end of the log (a new segment when the last is full).
  status append(std::uint32_t kind, std::uint64_t key, std::uint64_t version, const void* row) {
    const std::size_t size = kind == kind_row ? record_bytes : sizeof(record_header);
    if (wbuf.size() + size > o.write_buffer_bytes) EMBCACHE_RETURN_IF_ERROR(write_buffer());
    if (segs.back().bytes + wbuf.size() + size > o.segment_bytes &&
        segs.back().bytes + wbuf.size() > 0) {
      EMBCACHE_RETURN_IF_ERROR(write_buffer());
      segment& full = segs.back();
      // A failed write may have left bytes past the log's end: they go.
      if (::ftruncate(full.fd, static_cast<off_t>(full.bytes)) != 0)
        return detail::errno_status(who() + ": cannot truncate", path_of(full.id), errno);
      EMBCACHE_RETURN_IF_ERROR(new_segment(full.id + 1));
    }
    record_header h{record_magic, kind, key, next_seq++, version, 0};
    const std::size_t payload = kind == kind_row ? row_bytes : 0;
    h.checksum = record_checksum(h, row, payload);
    const std::size_t at = wbuf.size();
    wbuf.resize(at + size);
    std::memcpy(wbuf.data() + at, &h, sizeof h);
    if (payload) std::memcpy(wbuf.data() + at + sizeof h, row, payload);
    std::memset(wbuf.data() + at + sizeof h + payload, 0, size - sizeof h - payload);
    const segment& s = segs.back();
    wpending.push_back({key, (s.id << offset_bits) | (s.bytes + at), kind, version});
    return {};
  }

  // Cleans oldest segments while the log holds more than the space bound allows.
  status clean() {
    const double bound = o.max_space_amplification * static_cast<double>(live) +
                         2.0 * static_cast<double>(o.segment_bytes);
    while (segs.size() > 1 && static_cast<double>(disk) > bound) {
      segment old = segs.front();
      std::uint64_t copied = 0;
      EMBCACHE_RETURN_IF_ERROR(
          walk(old, 0, old.bytes, false, nullptr,
               [&](std::uint64_t loc, const record_header& h, const char* row) -> status {
                 if (h.kind != kind_row || index.find(h.key) != loc) return {};
                 copied += record_bytes;
                 return append(kind_row, h.key, h.version, row);
               }));
      EMBCACHE_RETURN_IF_ERROR(write_buffer());
      // The copies are durable before the state stops naming the segment; then it goes.
      segs.pop_front();
      status st = sync();
      if (!st.ok()) {
        segs.push_front(old);
        return st;
      }
      ::close(old.fd);
      std::error_code ec;
      fs::remove(path_of(old.id), ec);  // a leftover is removed by the next open
      disk -= old.bytes;
      count.bytes_cleaned += copied;
      ++count.segments_cleaned;
    }
    return {};
  }
};

namespace {

template <class Key>
using impl_of = typename log_store<Key>::impl;

status check_options(const log_store_options& o) {
  const std::string at = "log_store_options";
  if (o.path.empty()) return status::invalid_argument(at + ".path: required");
  if (o.table_name.empty()) return status::invalid_argument(at + ".table_name: required");
  if (o.row_width == 0 || o.row_width > (std::size_t{1} << 24))
    return status::invalid_argument(at + ".row_width: " + std::to_string(o.row_width) +
                                    " is not 1 to 2^24");
  if (o.dim > o.row_width)
    return status::invalid_argument(at + ".dim: " + std::to_string(o.dim) +
                                    " is larger than row_width " + std::to_string(o.row_width));
  const std::uint64_t record = sizeof(record_header) + ((o.row_width * 4 + 7) / 8) * 8;
  if (o.segment_bytes < (std::uint64_t{1} << 20) || o.segment_bytes > (std::uint64_t{1} << 40) ||
      o.segment_bytes < record)
    return status::invalid_argument(at + ".segment_bytes: " + std::to_string(o.segment_bytes) +
                                    " is not 1 MiB to 1 TiB (and at least one record)");
  if (!(o.max_space_amplification >= 1.25 && o.max_space_amplification <= 16))
    return status::invalid_argument(
        at + ".max_space_amplification: " + std::to_string(o.max_space_amplification) +
        " is not 1.25 to 16");
  if (o.read_threads < 1 || o.read_threads > 256)
    return status::invalid_argument(at + ".read_threads: " + std::to_string(o.read_threads) +
                                    " is not 1 to 256");
  if (o.max_read_bytes < record || o.max_read_bytes > (std::size_t{1} << 30))
    return status::invalid_argument(at + ".max_read_bytes: " + std::to_string(o.max_read_bytes) +
                                    " is not one record (" + std::to_string(record) +
                                    " bytes) to 1 GiB");
  if (o.read_gap_bytes > o.max_read_bytes)
    return status::invalid_argument(at + ".read_gap_bytes: " + std::to_string(o.read_gap_bytes) +
                                    " is more than max_read_bytes");
  if (o.expected_rows > (std::size_t{1} << 40))
    return status::invalid_argument(at + ".expected_rows: " + std::to_string(o.expected_rows) +
                                    " is more than 2^40");
  if (o.write_buffer_bytes < record || o.write_buffer_bytes > (std::size_t{1} << 30))
    return status::invalid_argument(at +
                                    ".write_buffer_bytes: " + std::to_string(o.write_buffer_bytes) +
                                    " is not one record to 1 GiB");
  return {};
}

// A field of state.json of the expected type, or corruption naming it.
template <class T>
status state_field(const nlohmann::json& j, const char* name, const std::string& file, T* out) {
  auto it = j.find(name);
  bool ok = it != j.end();
  if constexpr (std::is_same_v<T, std::string>) {
    ok = ok && it->is_string();
  } else {
    ok = ok && it->is_number_unsigned();
  }
  if (!ok)
    return status::corruption("log_store: '" + file + "': field '" + name +
                              "' is missing or of the wrong type");
  *out = it->template get<T>();
  return {};
}

}  // namespace

bool direct_io_supported(const std::string& path) {
  std::error_code ec;
  fs::path dir = fs::absolute(path, ec);
  while (!dir.empty() && !fs::is_directory(dir, ec) && dir != dir.parent_path())
    dir = dir.parent_path();
  const std::string probe = (dir / ".embcache_direct_io_probe").string();
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

template <class Key>
log_store<Key>::log_store(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

template <class Key>
log_store<Key>::~log_store() {
  if (impl_) (void)flush();  // errors surface through an explicit flush() before destruction
}

template <class Key>
result<std::unique_ptr<log_store<Key>>> log_store<Key>::open(const log_store_options& options) {
  EMBCACHE_RETURN_IF_ERROR(check_options(options));
  auto p = std::make_unique<impl>();
  impl& s = *p;
  s.o = options;
  s.o.path = detail::strip_slashes(options.path);
  try {
    s.index.presize(options.expected_rows);
  } catch (const std::bad_alloc&) {
    return status::out_of_host_memory(s.who() + ": an index for " +
                                      std::to_string(options.expected_rows) + " rows");
  }
  s.row_bytes = s.o.row_width * sizeof(float);
  s.record_bytes = sizeof(record_header) + (s.row_bytes + 7) / 8 * 8;
  const std::string state_path = s.o.path + "/state.json";
  std::error_code ec;
  if (!fs::exists(state_path, ec)) {
    if (!s.o.create_if_missing)
      return status::not_found(s.who() + ": no table at '" + s.o.path + "' (no state.json)");
    fs::create_directories(s.o.path, ec);
    if (ec) return detail::errno_status(s.who() + ": cannot create folder", s.o.path, ec.value());
    EMBCACHE_RETURN_IF_ERROR(s.lock.try_lock(s.o.path + "/LOCK", s.who()));
    EMBCACHE_RETURN_IF_ERROR(s.new_segment(1));
    EMBCACHE_RETURN_IF_ERROR(s.sync());
    return std::unique_ptr<log_store>(new log_store(std::move(p)));
  }
  EMBCACHE_RETURN_IF_ERROR(s.lock.try_lock(s.o.path + "/LOCK", s.who()));
  auto bytes = detail::read_file_bytes(state_path, 1 << 20);
  if (!bytes.ok()) return bytes.get_status().with_context(s.who());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes.value().begin(), bytes.value().end());
  } catch (const std::exception& e) {
    return status::corruption(s.who() + ": '" + state_path + "' is not JSON: " + e.what());
  }
  if (!j.is_object())
    return status::corruption(s.who() + ": '" + state_path + "' is not an object");
  std::string format, table, optimizer;
  std::uint64_t version = 0, key_bytes = 0, width = 0, dim = 0, next_seq = 0;
  EMBCACHE_RETURN_IF_ERROR(state_field(j, "format", state_path, &format));
  EMBCACHE_RETURN_IF_ERROR(state_field(j, "format_version", state_path, &version));
  if (format != state_format || version != state_format_version)
    return status::corruption(s.who() + ": '" + state_path + "' is not a log_store state (format " +
                              format + " version " + std::to_string(version) + ")");
  EMBCACHE_RETURN_IF_ERROR(state_field(j, "table", state_path, &table));
  EMBCACHE_RETURN_IF_ERROR(state_field(j, "key_bytes", state_path, &key_bytes));
  EMBCACHE_RETURN_IF_ERROR(state_field(j, "row_width", state_path, &width));
  EMBCACHE_RETURN_IF_ERROR(state_field(j, "dim", state_path, &dim));
  EMBCACHE_RETURN_IF_ERROR(state_field(j, "optimizer", state_path, &optimizer));
  EMBCACHE_RETURN_IF_ERROR(state_field(j, "max_version", state_path, &s.max_version));
  EMBCACHE_RETURN_IF_ERROR(state_field(j, "next_seq", state_path, &next_seq));
  if (table != s.o.table_name)
    return status::not_found(s.who() + ": the folder '" + s.o.path + "' holds table '" + table +
                             "', not '" + s.o.table_name + "'");
  if (key_bytes != sizeof(Key))
    return status::invalid_argument(s.who() + ": keys of " + std::to_string(key_bytes) +
                                    " bytes, expected " + std::to_string(sizeof(Key)));
  if (width != s.o.row_width)
    return status::invalid_argument(s.who() + ": row_width " + std::to_string(width) +
                                    " in the folder, expected " + std::to_string(s.o.row_width));
  if ((s.o.dim != 0 && dim != 0 && dim != s.o.dim) ||
      (!s.o.optimizer.empty() && !optimizer.empty() && optimizer != s.o.optimizer))
    return status::invalid_argument(s.who() + ": dim " + std::to_string(dim) + " optimizer '" +
                                    optimizer + "' in the folder, expected dim " +
                                    std::to_string(s.o.dim) + " optimizer '" + s.o.optimizer + "'");
  if (s.o.dim == 0) s.o.dim = dim;
  if (s.o.optimizer.empty()) s.o.optimizer = optimizer;
  // The segments the state names, with their durable sizes.
  auto list = j.find("segments");
  if (list == j.end() || !list->is_array() || list->empty())
    return status::corruption(s.who() + ": '" + state_path + "': no segments listed");
  std::vector<std::pair<std::uint64_t, std::uint64_t>> durable;
  for (const auto& e : *list) {
    std::uint64_t id = 0, b = 0;
    if (!e.is_object()) return status::corruption(s.who() + ": '" + state_path + "': bad segment");
    EMBCACHE_RETURN_IF_ERROR(state_field(e, "id", state_path, &id));
    EMBCACHE_RETURN_IF_ERROR(state_field(e, "bytes", state_path, &b));
    if (id == 0 || id > max_segment_id || b >= (std::uint64_t{1} << offset_bits) ||
        (!durable.empty() && id != durable.back().first + 1))
      return status::corruption(s.who() + ": '" + state_path + "': segment " + std::to_string(id) +
                                " out of order or out of range");
    durable.emplace_back(id, b);
  }
  // Later segments, created after the last flush, and leftovers of cleaning before the first.
  std::uint64_t last = durable.back().first;
  for (auto& e : fs::directory_iterator(s.o.path, ec)) {
    const std::string n = e.path().filename().string();
    std::uint64_t id = 0;
    if (n.size() != 16 || n.compare(0, 4, "seg-") != 0 || n.compare(12, 4, ".log") != 0) continue;
    if (std::sscanf(n.c_str() + 4, "%8" SCNu64, &id) != 1) continue;
    if (id < durable.front().first) {
      fs::remove(e.path(), ec);
    } else if (id > last) {
      last = std::max(last, id);
    }
  }
  if (last > max_segment_id) return status::corruption(s.who() + ": segment ids out of range");
  bool changed = false;
  std::uint64_t prev_seq = 0;  // records are in sequence across the segments
  for (std::uint64_t id = durable.front().first; id <= last; ++id) {
    const std::size_t k = static_cast<std::size_t>(id - durable.front().first);
    const std::uint64_t want = k < durable.size() ? durable[k].second : 0;
    const std::string path = s.path_of(id);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | s.direct_flag());
    if (fd < 0) {
      if (errno == ENOENT && k >= durable.size()) continue;  // a gap: refused below
      if (errno == ENOENT)
        return status::corruption(s.who() + ": segment '" + path + "' is missing");
      return detail::errno_status(s.who() + ": cannot open segment", path, errno);
    }
    s.segs.push_back({id, fd, 0, false});
    struct stat st {};
    if (::fstat(fd, &st) != 0) return detail::errno_status(s.who() + ": cannot stat", path, errno);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size < want)
      return status::corruption(s.who() + ": segment '" + path + "' is " + std::to_string(size) +
                                " bytes, state.json says " + std::to_string(want));
    auto& seg = s.segs.back();
    auto apply = [&](std::uint64_t loc, const record_header& h, const char*) -> status {
      if (h.seq <= prev_seq && prev_seq != 0)
        return s.corrupt(path, loc & ((std::uint64_t{1} << offset_bits) - 1),
                         "records out of sequence");
      prev_seq = h.seq;
      s.next_seq = std::max(s.next_seq, h.seq + 1);
      if (h.kind == kind_row) {
        if (s.index.put(h.key, loc) == 0) s.live += s.record_bytes;
        s.max_version = std::max(s.max_version, h.version);
      } else if (s.index.remove(h.key) != 0) {
        s.live -= s.record_bytes;
      }
      return {};
    };
    std::uint64_t end = 0;
    EMBCACHE_RETURN_IF_ERROR(s.walk(seg, 0, want, false, &end, apply));
    // What reached the disk after the last flush: kept up to its first damaged record.
    std::uint64_t tail_end = want;
    if (size > want) EMBCACHE_RETURN_IF_ERROR(s.walk(seg, want, size, true, &tail_end, apply));
    if (tail_end != size) {
      if (::ftruncate(fd, static_cast<off_t>(tail_end)) != 0)
        return detail::errno_status(s.who() + ": cannot truncate", path, errno);
    }
    seg.bytes = tail_end;
    seg.dirty = size != want;  // kept or cut after the last flush: the open makes it durable
    changed = changed || seg.dirty;
    s.disk += tail_end;
  }
  for (std::size_t k = 1; k < s.segs.size(); ++k) {
    if (s.segs[k].id != s.segs[k - 1].id + 1)
      return status::corruption(s.who() + ": segment '" + s.path_of(s.segs[k - 1].id + 1) +
                                "' is missing");
  }
  // Direct writes start on a 4 KiB boundary: a segment written otherwise is not appended to.
  if (s.o.direct_io && s.segs.back().bytes % direct_align != 0)
    EMBCACHE_RETURN_IF_ERROR(s.new_segment(s.segs.back().id + 1));
  s.next_seq = std::max(s.next_seq, next_seq);
  if (!s.o.reuse_rows && s.index.size() != 0)
    return status::invalid_argument(s.who() + ": the folder '" + s.o.path + "' already holds " +
                                    std::to_string(s.index.size()) +
                                    " rows (a fresh run does not train from old rows)");
  if (changed || s.folder_dirty) EMBCACHE_RETURN_IF_ERROR(s.sync());
  return std::unique_ptr<log_store>(new log_store(std::move(p)));
}

template <class Key>
std::size_t log_store<Key>::row_width() const noexcept {
  return impl_->o.row_width;
}
template <class Key>
const std::string& log_store<Key>::table_name() const noexcept {
  return impl_->o.table_name;
}
template <class Key>
std::size_t log_store<Key>::size() const noexcept {
  return impl_->index.size();
}
template <class Key>
std::uint64_t log_store<Key>::max_version() const noexcept {
  return impl_->max_version;
}
template <class Key>
std::uint64_t log_store<Key>::disk_bytes() const noexcept {
  return impl_->disk;
}
template <class Key>
std::uint64_t log_store<Key>::live_bytes() const noexcept {
  return impl_->live;
}
template <class Key>
log_store_counters log_store<Key>::counters() const noexcept {
  return impl_->count;
}
template <class Key>
std::size_t log_store<Key>::memory_bytes() const noexcept {
  return impl_->index.memory_bytes() + impl_->wbuf.capacity() +
         impl_->wpending.capacity() * sizeof(typename impl::pending);
}
template <class Key>
std::size_t log_store<Key>::memory_bound(std::size_t rows,
                                         const log_store_options& options) noexcept {
  const std::size_t record = sizeof(record_header) + (options.row_width * 4 + 7) / 8 * 8;
  const std::size_t buffered = options.write_buffer_bytes / record + 1;
  // The write buffer with a pad; each read thread's run and a walk's chunk, with 4 KiB blocks on
  // both sides.
  const std::size_t blocks = 2 * direct_align;
  return flat_index::capacity_for(std::max(rows, options.expected_rows)) * 16 +
         options.write_buffer_bytes + blocks + buffered * sizeof(typename impl::pending) +
         options.read_threads * (options.max_read_bytes + record + blocks) +
         std::max(scan_chunk_bytes, 2 * record + direct_align) + blocks;
}

template <class Key>
status log_store<Key>::pull(const Key* keys, std::size_t n, float* rows_out, bool* found_out,
                            std::uint64_t* versions_out) {
  if (n == 0) return {};
  impl& s = *impl_;
  if (!keys || !rows_out || !found_out)
    return status::invalid_argument(s.who() + ": pull of " + std::to_string(n) +
                                    " keys with a null pointer");
  std::vector<std::pair<std::uint64_t, std::size_t>> want;  // (location, position)
  want.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t loc = s.index.find(key_bits(keys[i]));
    found_out[i] = loc != 0;
    if (loc) want.emplace_back(loc, i);
  }
  std::sort(want.begin(), want.end());
  // Runs of records read by one pread each: [first, last) of `want`.
  std::vector<std::pair<std::size_t, std::size_t>> runs;
  for (std::size_t b = 0; b < want.size();) {
    std::size_t e = b + 1;
    const std::uint64_t start = want[b].first;
    std::uint64_t end = start + s.record_bytes;
    while (e < want.size() && (want[e].first >> offset_bits) == (start >> offset_bits) &&
           want[e].first <= end + s.o.read_gap_bytes &&
           want[e].first + s.record_bytes - start <= s.o.max_read_bytes) {
      end = std::max(end, want[e].first + s.record_bytes);
      ++e;
    }
    runs.emplace_back(b, e);
    b = e;
  }
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> reads{0}, bytes{0};
  std::mutex failed_mutex;
  status failed;
  std::atomic<bool> stop{false};
  auto work = [&] {
    aligned_bytes buf;
    for (std::size_t r; !stop && (r = next.fetch_add(1)) < runs.size();) {
      const auto [b, e] = runs[r];
      const std::uint64_t off0 = want[b].first & ((std::uint64_t{1} << offset_bits) - 1);
      const std::uint64_t last = want[e - 1].first & ((std::uint64_t{1} << offset_bits) - 1);
      const std::size_t len = static_cast<std::size_t>(last - off0) + s.record_bytes;
      const auto& seg = s.seg_of(want[b].first);
      const std::string path = s.path_of(seg.id);
      const char* base = nullptr;
      std::uint64_t got = 0;
      status st;
      try {
        st = s.read_span(seg, off0, len, buf, &base, &got);
      } catch (const std::bad_alloc&) {
        st = status::out_of_host_memory(s.who() + ": a read buffer of " + std::to_string(len) +
                                        " bytes");
      }
      ++reads;
      bytes += got;
      for (std::size_t k = b; st.ok() && k < e; ++k) {
        const std::uint64_t off = want[k].first & ((std::uint64_t{1} << offset_bits) - 1);
        const char* p = base + (off - off0);
        std::size_t size = 0;
        std::string why = s.check_record(p, s.record_bytes, &size);
        record_header h;
        std::memcpy(&h, p, sizeof h);
        const std::size_t i = want[k].second;
        if (why.empty() && (h.kind != kind_row || h.key != key_bits(keys[i])))
          why = "the index points at another record";
        if (!why.empty()) {
          st = s.corrupt(path, off, why);
          break;
        }
        std::memcpy(rows_out + i * s.o.row_width, p + sizeof h, s.row_bytes);
        if (versions_out) versions_out[i] = h.version;
      }
      if (!st.ok()) {
        std::lock_guard<std::mutex> g(failed_mutex);
        if (failed.ok()) failed = st;
        stop = true;
      }
    }
  };
  const std::size_t threads = std::min(s.o.read_threads, runs.size());
  try {
    std::vector<std::thread> pool;
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
  } catch (const std::system_error& e) {
    return status::internal(s.who() + ": cannot start a read thread: " + e.what());
  }
  s.count.reads += reads;
  s.count.bytes_read += bytes;
  if (!failed.ok()) return failed;
  s.count.rows_pulled += want.size();
  return {};
}

template <class Key>
status log_store<Key>::push(const Key* keys, std::size_t n, const float* rows,
                            const std::uint64_t* versions) {
  if (n == 0) return {};
  impl& s = *impl_;
  if (!keys || !rows)
    return status::invalid_argument(s.who() + ": push of " + std::to_string(n) +
                                    " keys with a null pointer");
  const std::uint64_t stamp = s.max_version + 1;
  for (std::size_t i = 0; i < n; ++i) {
    EMBCACHE_RETURN_IF_ERROR(s.append(kind_row, key_bits(keys[i]), versions ? versions[i] : stamp,
                                      rows + i * s.o.row_width));
  }
  EMBCACHE_RETURN_IF_ERROR(s.write_buffer());
  return s.clean();
}

template <class Key>
status log_store<Key>::erase(const Key* keys, std::size_t n, std::size_t* erased_out) {
  if (erased_out) *erased_out = 0;
  if (n == 0) return {};
  impl& s = *impl_;
  if (!keys)
    return status::invalid_argument(s.who() + ": erase of " + std::to_string(n) +
                                    " keys with a null pointer");
  std::vector<std::uint64_t> present;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t k = key_bits(keys[i]);
    if (s.index.find(k) != 0) present.push_back(k);
  }
  std::sort(present.begin(), present.end());
  present.erase(std::unique(present.begin(), present.end()), present.end());
  for (const std::uint64_t k : present)
    EMBCACHE_RETURN_IF_ERROR(s.append(kind_tombstone, k, 0, nullptr));
  EMBCACHE_RETURN_IF_ERROR(s.write_buffer());
  if (erased_out) *erased_out = present.size();
  return s.clean();
}

template <class Key>
status log_store<Key>::contains(const Key* keys, std::size_t n, bool* found_out) {
  if (n == 0) return {};
  if (!keys || !found_out)
    return status::invalid_argument(impl_->who() + ": contains of " + std::to_string(n) +
                                    " keys with a null pointer");
  for (std::size_t i = 0; i < n; ++i) found_out[i] = impl_->index.find(key_bits(keys[i])) != 0;
  return {};
}

template <class Key>
status log_store<Key>::flush() {
  return impl_->sync();
}

template <class Key>
status log_store<Key>::scan(bool changed_only, std::uint64_t version, std::size_t batch_size,
                            const store_batch_fn<Key>& fn) {
  impl& s = *impl_;
  const std::size_t w = s.o.row_width;
  const std::size_t cap = std::min<std::size_t>(batch_size, 65536);
  std::vector<Key> keys;
  std::vector<float> rows;
  std::vector<std::uint64_t> versions;
  keys.reserve(cap);
  versions.reserve(cap);
  auto emit = [&]() -> status {
    if (keys.empty()) return {};
    status st = fn(keys.data(), rows.data(), versions.data(), keys.size());
    keys.clear();
    rows.clear();
    versions.clear();
    return st;
  };
  for (std::size_t k = 0; k < s.segs.size(); ++k) {
    const auto seg = s.segs[k];
    EMBCACHE_RETURN_IF_ERROR(
        s.walk(seg, 0, seg.bytes, false, nullptr,
               [&](std::uint64_t loc, const record_header& h, const char* row) -> status {
                 if (h.kind != kind_row || s.index.find(h.key) != loc) return {};
                 if (changed_only && h.version <= version) return {};
                 keys.push_back(static_cast<Key>(h.key));
                 versions.push_back(h.version);
                 rows.resize(rows.size() + w);
                 std::memcpy(rows.data() + rows.size() - w, row, s.row_bytes);
                 return keys.size() == cap ? emit() : status{};
               }));
  }
  return emit();
}

template <class Key>
status log_store<Key>::checkpoint(const std::string& dir_in) {
  impl& s = *impl_;
  const std::string who = s.who() + ": checkpoint";
  const std::string dir = detail::strip_slashes(dir_in);
  EMBCACHE_RETURN_IF_ERROR(detail::check_checkpoint_target(dir, who.c_str()));
  detail::staging_folder staged;
  EMBCACHE_RETURN_IF_ERROR(staged.create(detail::staging_folder_of(dir)));
  detail::durable_file_writer seg;
  EMBCACHE_RETURN_IF_ERROR(
      seg.open(staged.path() + "/" + segment_name(1), detail::file_placement::in_staged_folder));
  std::uint64_t seq = 0;
  std::vector<char> rec(s.record_bytes, 0);
  EMBCACHE_RETURN_IF_ERROR(this->for_each(
      65536, [&](const Key* k, const float* r, const std::uint64_t* v, std::size_t n) -> status {
        for (std::size_t i = 0; i < n; ++i) {
          record_header h{record_magic, kind_row, key_bits(k[i]), ++seq, v[i], 0};
          h.checksum = record_checksum(h, r + i * s.o.row_width, s.row_bytes);
          std::memcpy(rec.data(), &h, sizeof h);
          std::memcpy(rec.data() + sizeof h, r + i * s.o.row_width, s.row_bytes);
          EMBCACHE_RETURN_IF_ERROR(seg.write(rec.data(), rec.size()));
        }
        return status{};
      }));
  const std::uint64_t seg_bytes = seg.bytes();
  EMBCACHE_RETURN_IF_ERROR(seg.commit());
  nlohmann::json j;
  j["format"] = state_format;
  j["format_version"] = state_format_version;
  j["table"] = s.o.table_name;
  j["key_bytes"] = sizeof(Key);
  j["row_width"] = s.o.row_width;
  j["dim"] = s.o.dim;
  j["optimizer"] = s.o.optimizer;
  j["max_version"] = s.max_version;
  j["next_seq"] = seq + 1;
  j["segments"] = nlohmann::json::array({{{"id", 1}, {"bytes", seg_bytes}}});
  detail::durable_file_writer state;
  const std::string text = j.dump(1) + "\n";
  EMBCACHE_RETURN_IF_ERROR(
      state.open(staged.path() + "/state.json", detail::file_placement::in_staged_folder));
  EMBCACHE_RETURN_IF_ERROR(state.write(text.data(), text.size()));
  EMBCACHE_RETURN_IF_ERROR(state.commit());
  return staged.publish(dir).with_context(who);
}

template class log_store<std::int64_t>;
template class log_store<std::uint32_t>;

}  // namespace embcache
