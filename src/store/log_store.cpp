// The log store: rows appended to segment files, an index of key to location in memory, the
// oldest segment cleaned when the log outgrows its live rows (include/embcache/log_store.hpp).
// Its calls; the bytes on disk are log_format.hpp's, the state and its moves
// log_store_impl.inl's, opening and recovery log_store_open.inl's.
#include "embcache/log_store.hpp"

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "log_store_open.inl"

namespace embcache {

using namespace detail::logfmt;

namespace {

template <class Key>
std::uint64_t key_bits(Key k) {
  return static_cast<std::uint64_t>(k);
}

}  // namespace

bool direct_io_supported(const std::string& path) {
  namespace fs = std::filesystem;
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
  const std::size_t record = row_record_bytes(options.row_width);
  // The index; the write buffer with a pad and its pending changes (tombstones are the smallest
  // records); each read thread's run and a walk's chunk, with 4 KiB blocks on both sides.
  const std::size_t blocks = 2 * direct_align;
  return flat_index::capacity_for(std::max(rows, options.expected_rows)) * 16 +
         options.write_buffer_bytes + blocks +
         (options.write_buffer_bytes / sizeof(record_header) + 1) * sizeof(typename impl::pending) +
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
  std::vector<std::pair<std::size_t, std::size_t>> runs;    // [first, last) of `want`
  try {
    want.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t loc = s.index.find(key_bits(keys[i]));
      found_out[i] = loc != 0;
      if (loc) want.emplace_back(loc, i);
    }
    std::sort(want.begin(), want.end());
    // Runs of records read by one pread each.
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
  } catch (const std::bad_alloc&) {
    return status::out_of_host_memory(s.who() + ": the locations of a pull of " +
                                      std::to_string(n) + " keys");
  }
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> reads{0}, bytes{0};
  std::mutex failed_mutex;
  status failed;
  std::atomic<bool> stop{false};
  const auto fail = [&](status st) {
    std::lock_guard<std::mutex> g(failed_mutex);
    if (failed.ok()) failed = std::move(st);
    stop = true;
  };
  const auto run = [&](aligned_bytes& buf, std::size_t r) -> status {
    const auto [b, e] = runs[r];
    const std::uint64_t off0 = want[b].first & offset_mask;
    const std::uint64_t last = want[e - 1].first & offset_mask;
    const std::size_t len = static_cast<std::size_t>(last - off0) + s.record_bytes;
    const auto& seg = s.seg_of(want[b].first);
    const char* base = nullptr;
    std::uint64_t got = 0;
    status st = s.read_span(seg, off0, len, buf, &base, &got);
    ++reads;
    bytes += got;
    EMBCACHE_RETURN_IF_ERROR(st);
    for (std::size_t k = b; k < e; ++k) {
      const std::uint64_t off = want[k].first & offset_mask;
      const char* p = base + (off - off0);
      std::size_t size = 0;
      std::string why = s.check_record(p, s.record_bytes, &size);
      record_header h;
      std::memcpy(&h, p, sizeof h);
      const std::size_t i = want[k].second;
      if (why.empty() && (h.kind != kind_row || h.key != key_bits(keys[i])))
        why = "the index points at another record";
      if (!why.empty()) return s.corrupt(s.path_of(seg.id), off, why);
      std::memcpy(rows_out + i * s.o.row_width, p + sizeof h, s.row_bytes);
      if (versions_out) versions_out[i] = h.version;
    }
    return {};
  };
  const auto work = [&] {
    try {
      aligned_bytes buf;
      for (std::size_t r; !stop && (r = next.fetch_add(1)) < runs.size();) {
        status st = run(buf, r);
        if (!st.ok()) fail(std::move(st));
      }
    } catch (const std::bad_alloc&) {
      fail(status::out_of_host_memory(s.who() + ": a read buffer of a pull"));
    }
  };
  std::vector<std::thread> pool;
  try {
    for (std::size_t t = 1; t < std::min(s.o.read_threads, runs.size()); ++t)
      pool.emplace_back(work);
  } catch (const std::system_error& e) {
    // Fewer threads: the ones started and this one read every run.
    (void)e;
  }
  work();
  for (auto& t : pool) t.join();
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
  if (!s.broken.ok()) return s.broken;
  if (!versions && s.max_version == std::numeric_limits<std::uint64_t>::max())
    return status::capacity_exceeded(s.who() + ": versions run out (max_version is 2^64 - 1)");
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
  if (!s.broken.ok()) return s.broken;
  std::vector<std::uint64_t> present;
  try {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t k = key_bits(keys[i]);
      if (s.index.find(k) != 0) present.push_back(k);
    }
  } catch (const std::bad_alloc&) {
    return status::out_of_host_memory(s.who() + ": the keys of an erase of " + std::to_string(n));
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
  // The live rows, in segments of at most segment_bytes each.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> written;  // (id, bytes)
  detail::durable_file_writer seg;
  const auto next_segment = [&]() -> status {
    if (!written.empty()) {
      written.back().second = seg.bytes();
      EMBCACHE_RETURN_IF_ERROR(seg.commit());
    }
    written.emplace_back(written.size() + 1, 0);
    return seg.open(staged.path() + "/" + segment_name(written.back().first),
                    detail::file_placement::in_staged_folder);
  };
  EMBCACHE_RETURN_IF_ERROR(next_segment());
  std::uint64_t seq = 0;
  std::vector<char> rec(s.record_bytes, 0);
  EMBCACHE_RETURN_IF_ERROR(this->for_each(
      65536, [&](const Key* k, const float* r, const std::uint64_t* v, std::size_t n) -> status {
        for (std::size_t i = 0; i < n; ++i) {
          if (seg.bytes() + rec.size() > s.o.segment_bytes)
            EMBCACHE_RETURN_IF_ERROR(next_segment());
          s.encode_record(rec.data(), rec.size(), kind_row, key_bits(k[i]), ++seq, v[i],
                          r + i * s.o.row_width);
          EMBCACHE_RETURN_IF_ERROR(seg.write(rec.data(), rec.size()));
        }
        return status{};
      }));
  written.back().second = seg.bytes();
  EMBCACHE_RETURN_IF_ERROR(seg.commit());
  detail::durable_file_writer state;
  const std::string text = s.state_text(seq + 1, written);
  EMBCACHE_RETURN_IF_ERROR(
      state.open(staged.path() + "/state.json", detail::file_placement::in_staged_folder));
  EMBCACHE_RETURN_IF_ERROR(state.write(text.data(), text.size()));
  EMBCACHE_RETURN_IF_ERROR(state.commit());
  return staged.publish(dir).with_context(who);
}

template class log_store<std::int64_t>;
template class log_store<std::uint32_t>;

}  // namespace embcache
