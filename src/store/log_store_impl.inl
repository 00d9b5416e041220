// The log store's state and its moves on disk: reading records and walking segments, appending
// through the write buffer, flushing, and cleaning the oldest segment. Part of log_store.cpp.
#pragma once

#include <sys/stat.h>

#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "embcache/log_store.hpp"
#include "log_format.hpp"

namespace embcache {

template <class Key>
struct log_store<Key>::impl {
  struct segment {
    std::uint64_t id = 0;
    int fd = -1;
    std::uint64_t bytes = 0;  // what the log holds (a failed write's bytes past it are cut)
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
  detail::logfmt::flat_index index;
  std::deque<segment> segs;  // ascending ids; the last is appended to
  std::uint64_t live = 0, disk = 0, next_seq = 1, max_version = 0;
  bool folder_dirty = false;
  // Writes and syncs that failed in a way the store cannot vouch for afterwards (a sync error is
  // reported once by the kernel; a failed write that could not be cut off): every later change
  // and flush returns it.
  status broken;
  detail::logfmt::aligned_bytes wbuf;  // sized once: write_buffer_bytes and a pad
  std::vector<pending> wpending;
  log_store_counters count;

  ~impl() {
    for (auto& s : segs)
      if (s.fd >= 0) ::close(s.fd);
  }

  int direct_flag() const { return o.direct_io ? O_DIRECT : 0; }
  std::string path_of(std::uint64_t id) const {
    return o.path + "/" + detail::logfmt::segment_name(id);
  }
  std::string who() const { return "log_store of table '" + o.table_name + "'"; }
  segment& seg_of(std::uint64_t loc) {
    return segs[(loc >> detail::logfmt::offset_bits) - segs.front().id];
  }

  status corrupt(const std::string& path, std::uint64_t off, const std::string& why) const {
    return status::corruption(who() + ": segment '" + path + "' at byte " + std::to_string(off) +
                              ": " + why);
  }

  // The buffers whose size the options fix, allocated once (memory_bound counts them).
  void allocate_buffers() {
    using namespace detail::logfmt;
    wbuf.reserve(o.write_buffer_bytes + 2 * direct_align);
    wpending.reserve(o.write_buffer_bytes / sizeof(record_header) + 1);
  }

  // The size of the record whose header starts at `p` (>= 40 bytes there), or 0 when no sound
  // header starts there.
  std::size_t record_size(const char* p) const {
    using namespace detail::logfmt;
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
    using namespace detail::logfmt;
    if (avail < sizeof(record_header)) return "a record cut short";
    *size = record_size(p);
    if (*size == 0) return "no record starts here (bad magic or kind)";
    if (avail < *size) return "a record cut short";
    record_header h;
    std::memcpy(&h, p, sizeof h);
    const std::size_t payload = h.kind == kind_row ? row_bytes : 0;
    if (record_checksum(h, p + sizeof h, payload) != h.checksum) return "checksum mismatch";
    if (sizeof(Key) == 4 && h.kind != kind_pad && (h.key >> 32) != 0)
      return "a key wider than the table's keys";
    return {};
  }

  // Reads [off, off + len) of segment `s` into `buf` and points *out at byte `off`: in direct
  // mode the read is widened to 4 KiB boundaries. Adds the bytes read to *read_bytes.
  status read_span(const segment& s, std::uint64_t off, std::size_t len,
                   detail::logfmt::aligned_bytes& buf, const char** out,
                   std::uint64_t* read_bytes = nullptr) const {
    using detail::logfmt::direct_align;
    const std::uint64_t a = o.direct_io ? off / direct_align * direct_align : off;
    const std::uint64_t e =
        o.direct_io ? (off + len + direct_align - 1) / direct_align * direct_align : off + len;
    buf.resize(static_cast<std::size_t>(e - a));
    std::size_t got = 0;
    const std::string path = path_of(s.id);
    EMBCACHE_RETURN_IF_ERROR(detail::logfmt::pread_upto(
        s.fd, buf.data(), static_cast<std::size_t>(e - a), a, path, o.direct_io, &got));
    if (read_bytes) *read_bytes += got;
    if (got < off + len - a)
      return corrupt(path, a + got, "the segment ends before a record it should hold");
    *out = buf.data() + (off - a);
    return {};
  }

  // Reads the records of segment `s` in [from, to) in order: fn(loc, header, row) for each (pads
  // skipped). With `tolerant`, the first damaged or cut record ends the walk (*end = its offset);
  // otherwise it is corruption naming the file and offset. fn's error ends the walk too.
  template <class F>
  status walk(const segment& s, std::uint64_t from, std::uint64_t to, bool tolerant,
              std::uint64_t* end, const F& fn) const {
    using namespace detail::logfmt;
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

  // state.json's text: the table and its schema, the clocks, and each segment (id, bytes).
  std::string state_text(std::uint64_t seq,
                         const std::vector<std::pair<std::uint64_t, std::uint64_t>>& list) const {
    nlohmann::json j;
    j["format"] = detail::logfmt::state_format;
    j["format_version"] = detail::logfmt::state_format_version;
    j["table"] = o.table_name;
    j["key_bytes"] = sizeof(Key);
    j["row_width"] = o.row_width;
    j["dim"] = o.dim;
    j["optimizer"] = o.optimizer;
    j["max_version"] = max_version;
    j["next_seq"] = seq;
    auto& segments = j["segments"] = nlohmann::json::array();
    for (const auto& [id, bytes] : list) segments.push_back({{"id", id}, {"bytes", bytes}});
    return j.dump(1) + "\n";
  }

  status write_state() {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> list;
    for (const auto& s : segs) list.emplace_back(s.id, s.bytes);
    return detail::write_text_durably(o.path + "/state.json", state_text(next_seq, list))
        .with_context(who());
  }

  // Writes one record of `size` bytes at `dst`: its header with the checksum, the row (a row
  // record's), zeros after.
  void encode_record(char* dst, std::size_t size, std::uint32_t kind, std::uint64_t key,
                     std::uint64_t seq, std::uint64_t version, const void* row) const {
    using namespace detail::logfmt;
    record_header h{record_magic, kind, key, seq, version, 0};
    const std::size_t payload = kind == kind_row ? row_bytes : 0;
    h.checksum = record_checksum(h, row, payload);
    std::memcpy(dst, &h, sizeof h);
    if (payload) std::memcpy(dst + sizeof h, row, payload);
    std::memset(dst + sizeof h + payload, 0, size - sizeof h - payload);
  }

  // Makes every segment's bytes durable, then records them in state.json. A failed fdatasync
  // breaks the store: the kernel reports a lost write once, and a retry would pass.
  status sync() {
    if (!broken.ok()) return broken;
    for (auto& s : segs) {
      if (!s.dirty) continue;
      if (::fdatasync(s.fd) != 0) {
        broken = detail::errno_status(who() + ": cannot sync", path_of(s.id), errno);
        return broken;
      }
      s.dirty = false;
    }
    if (folder_dirty) {
      EMBCACHE_RETURN_IF_ERROR(detail::sync_folder(o.path));
      folder_dirty = false;
    }
    return write_state();
  }

  status new_segment(std::uint64_t id) {
    if (id > detail::logfmt::max_segment_id)
      return status::capacity_exceeded(who() + ": segment ids run out (" +
                                       std::to_string(detail::logfmt::max_segment_id) +
                                       " over the store's life)");
    const std::string p = path_of(id);
    const int fd = ::open(
        p.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | direct_flag(), 0644);
    if (fd < 0) return detail::errno_status(who() + ": cannot create segment", p, errno);
    segs.push_back({id, fd, 0, true});
    folder_dirty = true;
    return {};
  }

  // Writes the buffered records at the end of the last segment and applies their index changes.
  // A failed write is cut off the file, so that what follows lands where the log ends.
  status write_buffer() {
    using namespace detail::logfmt;
    if (wbuf.empty()) return {};
    if (!broken.ok()) return broken;
    if (o.direct_io && wbuf.size() % direct_align != 0) {
      // A pad record up to the next 4 KiB (a whole block more when that is under a header).
      std::size_t gap = direct_align - wbuf.size() % direct_align;
      if (gap < sizeof(record_header)) gap += direct_align;
      const std::size_t at = wbuf.size();
      wbuf.resize(at + gap);
      encode_record(wbuf.data() + at, gap, kind_pad, gap, 0, 0, nullptr);
    }
    segment& s = segs.back();
    status st;
    try {
      index.reserve(index.size() + wpending.size());  // the changes below cannot fail then
    } catch (const std::bad_alloc&) {
      st = status::out_of_host_memory(who() + ": its index, growing past " +
                                      std::to_string(index.size()) + " rows");
    }
    if (st.ok()) st = pwrite_all(s.fd, wbuf.data(), wbuf.size(), s.bytes, path_of(s.id));
    if (!st.ok()) {
      wbuf.clear();
      wpending.clear();
      s.dirty = true;
      if (::ftruncate(s.fd, static_cast<off_t>(s.bytes)) != 0)
        broken =
            detail::errno_status(who() + ": cannot cut a failed write off", path_of(s.id), errno);
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
    using namespace detail::logfmt;
    const std::size_t size = kind == kind_row ? record_bytes : sizeof(record_header);
    if (wbuf.size() + size > o.write_buffer_bytes) EMBCACHE_RETURN_IF_ERROR(write_buffer());
    if (segs.back().bytes + wbuf.size() + size > o.segment_bytes &&
        segs.back().bytes + wbuf.size() > 0) {
      EMBCACHE_RETURN_IF_ERROR(write_buffer());
      EMBCACHE_RETURN_IF_ERROR(new_segment(segs.back().id + 1));
    }
    const std::size_t at = wbuf.size();
    wbuf.resize(at + size);  // within the capacity allocate_buffers() gave it
    encode_record(wbuf.data() + at, size, kind, key, next_seq++, version, row);
    const segment& s = segs.back();
    wpending.push_back({key, (s.id << offset_bits) | (s.bytes + at), kind, version});
    return {};
  }

  // Cleans oldest segments while the log holds more than the space bound allows: the live rows
  // are appended again, made durable, the state stops naming the segment, then it is deleted.
  status clean() {
    using namespace detail::logfmt;
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
      segs.pop_front();
      status st = sync();
      if (!st.ok()) {
        segs.push_front(old);
        return st;
      }
      ::close(old.fd);
      std::error_code ec;
      std::filesystem::remove(path_of(old.id), ec);  // a leftover is removed by the next open
      disk -= old.bytes;
      count.bytes_cleaned += copied;
      ++count.segments_cleaned;
    }
    return {};
  }
};

}  // namespace embcache
