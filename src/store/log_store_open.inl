// Opening a log store: the options' checks, state.json read and checked, the segments replayed
// into the index (the durable part must be sound; what follows it is kept up to its first damaged
// record), and only then, once everything is accepted, the folder brought in line. Part of
// log_store.cpp.
#pragma once

#include <map>
#include <type_traits>

#include "format/checked_io.hpp"
#include "log_store_impl.inl"

namespace embcache {

namespace detail::logfmt {

inline status check_options(const log_store_options& o) {
  const std::string at = "log_store_options";
  const auto bad = [&](const std::string& field, const std::string& v, const std::string& want) {
    return status::invalid_argument(at + "." + field + ": " + v + " is not " + want);
  };
  if (o.path.empty()) return status::invalid_argument(at + ".path: required");
  if (o.table_name.empty()) return status::invalid_argument(at + ".table_name: required");
  if (o.row_width == 0 || o.row_width > (std::size_t{1} << 24))
    return bad("row_width", std::to_string(o.row_width), "1 to 2^24");
  if (o.dim > o.row_width)
    return status::invalid_argument(at + ".dim: " + std::to_string(o.dim) +
                                    " is larger than row_width " + std::to_string(o.row_width));
  const std::uint64_t record = row_record_bytes(o.row_width);
  if (o.segment_bytes < (std::uint64_t{1} << 20) || o.segment_bytes > max_segment_bytes ||
      o.segment_bytes < record)
    return bad("segment_bytes", std::to_string(o.segment_bytes),
               "1 MiB to 512 GiB (and at least one record)");
  if (!(o.max_space_amplification >= 1.25 && o.max_space_amplification <= 16))
    return bad("max_space_amplification", std::to_string(o.max_space_amplification),
               "1.25 to 16");
  if (o.read_threads < 1 || o.read_threads > 256)
    return bad("read_threads", std::to_string(o.read_threads), "1 to 256");
  if (o.max_read_bytes < record || o.max_read_bytes > (std::size_t{1} << 30))
    return bad("max_read_bytes", std::to_string(o.max_read_bytes),
               "one record (" + std::to_string(record) + " bytes) to 1 GiB");
  if (o.read_gap_bytes > o.max_read_bytes)
    return status::invalid_argument(at + ".read_gap_bytes: " + std::to_string(o.read_gap_bytes) +
                                    " is more than max_read_bytes");
  if (o.expected_rows > (std::size_t{1} << 40))
    return bad("expected_rows", std::to_string(o.expected_rows), "at most 2^40");
  if (o.write_buffer_bytes < record || o.write_buffer_bytes > (std::size_t{1} << 30))
    return bad("write_buffer_bytes", std::to_string(o.write_buffer_bytes),
               "one record to 1 GiB");
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

}  // namespace detail::logfmt

template <class Key>
result<std::unique_ptr<log_store<Key>>> log_store<Key>::open(const log_store_options& options) {
  namespace fs = std::filesystem;
  using namespace detail::logfmt;
  EMBCACHE_RETURN_IF_ERROR(check_options(options));
  auto p = std::unique_ptr<impl>(new impl());
  impl& s = *p;
  s.o = options;
  s.o.path = detail::strip_slashes(options.path);
  s.row_bytes = s.o.row_width * sizeof(float);
  s.record_bytes = row_record_bytes(s.o.row_width);
  try {
    s.index.reserve(options.expected_rows);
    s.allocate_buffers();
  } catch (const std::bad_alloc&) {
    return status::out_of_host_memory(s.who() + ": its index for " +
                                      std::to_string(options.expected_rows) +
                                      " rows and its write buffer");
  }
  const std::string state_path = s.o.path + "/state.json";
  std::error_code ec;
  const auto state_status = fs::symlink_status(state_path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    return status::io_error(s.who() + ": cannot stat '" + state_path + "': " + ec.message());
  // The segments in the folder (names of 8 digits only; nothing else is touched).
  std::map<std::uint64_t, std::string> files;
  if (fs::is_directory(s.o.path, ec)) {
    for (auto& e : fs::directory_iterator(s.o.path, ec)) {
      const std::uint64_t id = segment_id_of(e.path().filename().string());
      if (id != 0) files.emplace(id, e.path().string());
    }
    if (ec) return status::io_error(s.who() + ": cannot list '" + s.o.path + "': " + ec.message());
  }
  if (!fs::exists(state_status)) {
    if (!files.empty())
      return status::corruption(s.who() + ": '" + s.o.path + "' holds segments but no state.json");
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
  if (!bytes.ok()) {
    const status& b = bytes.get_status();
    if (b.code() == status_code::invalid_argument)  // a file too large, or not a regular file
      return status::corruption(s.who() + ": " + b.message());
    return b.with_context(s.who());
  }
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
  if (next_seq > max_seq)
    return status::corruption(s.who() + ": '" + state_path + "': next_seq " +
                              std::to_string(next_seq) + " is out of range");
  if (table != s.o.table_name)
    return status::not_found(s.who() + ": the folder '" + s.o.path + "' holds table '" + table +
                             "', not '" + s.o.table_name + "'");
  if (key_bytes != sizeof(Key))
    return status::invalid_argument(s.who() + ": keys of " + std::to_string(key_bytes) +
                                    " bytes, expected " + std::to_string(sizeof(Key)));
  if (width != s.o.row_width)
    return status::invalid_argument(s.who() + ": row_width " + std::to_string(width) +
                                    " in the folder, expected " + std::to_string(s.o.row_width));
  if (dim > width)
    return status::corruption(s.who() + ": '" + state_path + "': dim " + std::to_string(dim) +
                              " is larger than row_width " + std::to_string(width));
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
    if (id == 0 || id > max_segment_id || b > (std::uint64_t{1} << offset_bits) - 1 ||
        (!durable.empty() && id != durable.back().first + 1))
      return status::corruption(s.who() + ": '" + state_path + "': segment " + std::to_string(id) +
                                " out of order or out of range");
    durable.emplace_back(id, b);
  }
  // The log: the listed segments, then those created after the last flush, up to the first gap
  // (a segment after a gap never became part of the log). Files before the first are leftovers
  // of cleaning, after a gap strays: both are removed once the open is accepted.
  const std::uint64_t first = durable.front().first;
  std::vector<std::uint64_t> ids;
  std::vector<std::string> remove;
  for (const auto& [id, path] : files) {
    if (id == first + ids.size()) {
      ids.push_back(id);
    } else {
      remove.push_back(path);  // before the first, or after a gap
    }
  }
  if (ids.size() < durable.size())
    return status::corruption(s.who() + ": segment '" + s.path_of(first + ids.size()) +
                              "' is missing");
  // Replay. Past the durable part, the first damaged or out-of-sequence record ends the log: it
  // and everything after it are cut off (applied below, once the open is accepted).
  std::vector<std::pair<std::size_t, std::uint64_t>> cuts;  // (segment, new size)
  std::uint64_t prev_seq = 0;
  bool ended = false;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const std::uint64_t id = ids[k];
    const std::uint64_t want = k < durable.size() ? durable[k].second : 0;
    const std::string path = s.path_of(id);
    if (ended) {
      remove.push_back(path);
      continue;
    }
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | s.direct_flag());
    if (fd < 0) return detail::errno_status(s.who() + ": cannot open segment", path, errno);
    s.segs.push_back({id, fd, 0, false});
    struct stat st {};
    if (::fstat(fd, &st) != 0) return detail::errno_status(s.who() + ": cannot stat", path, errno);
    if (!S_ISREG(st.st_mode))
      return status::corruption(s.who() + ": segment '" + path + "' is not a regular file");
    const auto size = static_cast<std::uint64_t>(st.st_size);
    // Only the last listed segment and the unlisted ones were written after the last flush.
    const bool sealed = k + 1 < durable.size();
    if (size < want || (sealed && size != want))
      return status::corruption(s.who() + ": segment '" + path + "' is " + std::to_string(size) +
                                " bytes, state.json says " + std::to_string(want));
    auto& seg = s.segs.back();
    bool tail = false;
    std::uint64_t out_of_sequence = 0;  // 1 + the offset of a tail record that goes back
    auto apply = [&](std::uint64_t loc, const record_header& h, const char*) -> status {
      if (h.seq <= prev_seq || h.seq > max_seq) {
        if (!tail) return s.corrupt(path, loc & offset_mask, "records out of sequence");
        out_of_sequence = 1 + (loc & offset_mask);
        return status::corruption("");  // ends the walk; the log ends here
      }
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
    std::uint64_t tail_end = want;
    try {
      EMBCACHE_RETURN_IF_ERROR(s.walk(seg, 0, want, false, nullptr, apply));
      // What reached the disk after the last flush: kept up to its first damaged record.
      tail = true;
      if (size > want) {
        status w = s.walk(seg, want, size, true, &tail_end, apply);
        if (out_of_sequence) {
          tail_end = out_of_sequence - 1;
        } else if (!w.ok()) {
          return w;
        }
      }
    } catch (const std::bad_alloc&) {
      return status::out_of_host_memory(s.who() + ": its index, growing past " +
                                        std::to_string(s.index.size()) + " rows");
    }
    if (tail_end != size) {
      cuts.emplace_back(s.segs.size() - 1, tail_end);
      ended = true;
    }
    seg.bytes = tail_end;
    seg.dirty = size != want;  // kept or cut after the last flush: the open makes it durable
    s.disk += tail_end;
  }
  s.next_seq = std::max(s.next_seq, next_seq);
  if (!s.o.reuse_rows && s.index.size() != 0)
    return status::invalid_argument(s.who() + ": the folder '" + s.o.path + "' already holds " +
                                    std::to_string(s.index.size()) +
                                    " rows (a fresh run does not train from old rows)");
  // Accepted: the folder is brought in line with the log.
  bool changed = !remove.empty();
  for (const auto& [k, size] : cuts) {
    if (::ftruncate(s.segs[k].fd, static_cast<off_t>(size)) != 0)
      return detail::errno_status(s.who() + ": cannot cut a torn tail off",
                                  s.path_of(s.segs[k].id), errno);
  }
  for (const auto& path : remove) fs::remove(path, ec);
  for (const auto& seg : s.segs) changed = changed || seg.dirty;
  // Direct writes start on a 4 KiB boundary: a segment written otherwise is not appended to.
  if (s.o.direct_io && s.segs.back().bytes % direct_align != 0)
    EMBCACHE_RETURN_IF_ERROR(s.new_segment(s.segs.back().id + 1));
  if (changed || s.folder_dirty) {
    s.folder_dirty = s.folder_dirty || !remove.empty();
    EMBCACHE_RETURN_IF_ERROR(s.sync());
  }
  return std::unique_ptr<log_store>(new log_store(std::move(p)));
}

}  // namespace embcache
