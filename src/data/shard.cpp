#include "embcache/shard.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <regex>

#include "file_io.hpp"
#include "flat_set.hpp"
#include "random.hpp"

namespace embcache {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t label_offset = 0;
constexpr std::size_t dense_offset = 4;
constexpr std::size_t keys_offset = 4 * (1 + criteo_dense_count);
constexpr std::size_t crossed_offset = keys_offset + 8 * criteo_slot_count;

void encode_header(const shard_header& h, unsigned char* out) {
  std::memset(out, 0, shard_header_size);
  std::memcpy(out, shard_magic, 8);
  const std::uint16_t version = shard_format_version;
  const std::uint16_t header_size = shard_header_size;
  const auto record_size = static_cast<std::uint32_t>(h.record_size);
  const auto dense = static_cast<std::uint16_t>(criteo_dense_count);
  const auto slots = static_cast<std::uint16_t>(criteo_slot_count);
  const auto crossed = static_cast<std::uint16_t>(h.num_crossed);
  std::memcpy(out + 8, &version, 2);
  std::memcpy(out + 10, &header_size, 2);
  std::memcpy(out + 12, &record_size, 4);
  std::memcpy(out + 16, &h.rows, 8);
  std::memcpy(out + 24, &dense, 2);
  std::memcpy(out + 26, &slots, 2);
  std::memcpy(out + 28, &crossed, 2);
  std::memcpy(out + 32, &h.checksum, 8);
  const std::uint64_t header_checksum = XXH64(out, 56, 0);
  std::memcpy(out + 56, &header_checksum, 8);
}

status decode_header(const unsigned char* in, const std::string& path, shard_header& h) {
  const std::string where = "shard '" + path + "'";
  if (std::memcmp(in, shard_magic, 8) != 0) {
    return status::corruption(where + ": bad magic (expected 'EMBSHRD1')");
  }
  std::uint16_t version = 0, header_size = 0, dense = 0, slots = 0, crossed = 0;
  std::uint32_t record_size = 0;
  std::uint64_t header_checksum = 0;
  std::memcpy(&version, in + 8, 2);
  if (version != shard_format_version) {
    return status::unsupported(where + ": format version " + std::to_string(version) +
                               ", this build reads version " +
                               std::to_string(shard_format_version));
  }
  std::memcpy(&header_checksum, in + 56, 8);
  if (XXH64(in, 56, 0) != header_checksum) {
    return status::corruption(where + ": header checksum mismatch (the header is damaged)");
  }
  std::memcpy(&header_size, in + 10, 2);
  std::memcpy(&record_size, in + 12, 4);
  std::memcpy(&h.rows, in + 16, 8);
  std::memcpy(&dense, in + 24, 2);
  std::memcpy(&slots, in + 26, 2);
  std::memcpy(&crossed, in + 28, 2);
  std::memcpy(&h.checksum, in + 32, 8);
  if (header_size != shard_header_size || dense != criteo_dense_count ||
      slots != criteo_slot_count || record_size != shard_record_size(crossed)) {
    return status::unsupported(where + ": layout " + std::to_string(dense) + " dense, " +
                               std::to_string(slots) + " slots, record size " +
                               std::to_string(record_size) + "; expected 13 dense, 26 slots");
  }
  h.num_crossed = crossed;
  h.record_size = record_size;
  return {};
}

// 64 + rows * record_size, or false when that does not fit in 64 bits.
bool shard_file_size(const shard_header& h, std::uint64_t& out) noexcept {
  std::uint64_t payload = 0;
  return !__builtin_mul_overflow(h.rows, static_cast<std::uint64_t>(h.record_size), &payload) &&
         !__builtin_add_overflow(payload, std::uint64_t{shard_header_size}, &out);
}

status check_size(const shard_header& h, std::uint64_t file_size, const std::string& path) {
  std::uint64_t expected = 0;
  if (!shard_file_size(h, expected)) {
    return status::corruption(
        "shard '" + path + "': header field rows = " + std::to_string(h.rows) + " records of " +
        std::to_string(h.record_size) + " bytes overflows 64 bits, but the file has " +
        std::to_string(file_size) + " bytes");
  }
  if (file_size != expected) {
    return status::corruption("shard '" + path + "': header says " + std::to_string(h.rows) +
                              " records (" + std::to_string(expected) +
                              " bytes) but the file has " + std::to_string(file_size) + " bytes" +
                              (file_size < expected ? " (truncated)" : ""));
  }
  return {};
}

void encode_record(const criteo_sample& s, const std::int64_t* crossed, std::size_t num_crossed,
                   char* out) {
  std::memcpy(out + label_offset, &s.label, 4);
  std::memcpy(out + dense_offset, s.dense.data(), 4 * criteo_dense_count);
  std::memcpy(out + keys_offset, s.keys.data(), 8 * criteo_slot_count);
  if (num_crossed) std::memcpy(out + crossed_offset, crossed, 8 * num_crossed);
}

}  // namespace

// ---- reading whole shards -------------------------------------------------------------------

result<shard_header> read_shard_header(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return detail::errno_status("cannot open shard", path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    status s = detail::errno_status("cannot stat shard", path, errno);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return status::invalid_argument("shard '" + path + "' is not a regular file");
  }
  unsigned char buf[shard_header_size];
  std::size_t got = 0;
  while (got < sizeof(buf)) {
    const ssize_t r = ::pread(fd, buf + got, sizeof(buf) - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      status s = detail::errno_status("cannot read shard", path, errno);
      ::close(fd);
      return s;
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  ::close(fd);
  if (got != sizeof(buf)) {
    return status::corruption("shard '" + path + "': " + std::to_string(got) +
                              " bytes, shorter than the 64-byte header (truncated)");
  }
  shard_header h;
  EMBCACHE_RETURN_IF_ERROR(decode_header(buf, path, h));
  EMBCACHE_RETURN_IF_ERROR(check_size(h, static_cast<std::uint64_t>(st.st_size), path));
  return h;
}

result<shard_data> read_shard(const std::string& path) {
  auto bytes_or = detail::read_file_bytes(path);
  if (!bytes_or.ok()) return bytes_or.get_status().with_context("read_shard");
  std::vector<char>& bytes = bytes_or.value();
  if (bytes.size() < shard_header_size) {
    return status::corruption("shard '" + path + "': " + std::to_string(bytes.size()) +
                              " bytes, shorter than the 64-byte header (truncated)");
  }
  shard_data d;
  EMBCACHE_RETURN_IF_ERROR(
      decode_header(reinterpret_cast<const unsigned char*>(bytes.data()), path, d.header));
  EMBCACHE_RETURN_IF_ERROR(check_size(d.header, bytes.size(), path));
  if (XXH64(bytes.data() + shard_header_size, bytes.size() - shard_header_size, 0) !=
      d.header.checksum) {
    return status::corruption("shard '" + path + "': record checksum mismatch (data damaged)");
  }
  // Drop the header in place rather than copying hundreds of megabytes.
  bytes.erase(bytes.begin(), bytes.begin() + shard_header_size);
  d.records = std::move(bytes);
  return d;
}

float shard_data::label(std::uint64_t i) const noexcept {
  float v;
  std::memcpy(&v, records.data() + i * header.record_size + label_offset, 4);
  return v;
}

void shard_data::get(std::uint64_t i, criteo_sample& out, std::int64_t* crossed) const noexcept {
  const char* r = records.data() + i * header.record_size;
  std::memcpy(&out.label, r + label_offset, 4);
  std::memcpy(out.dense.data(), r + dense_offset, 4 * criteo_dense_count);
  std::memcpy(out.keys.data(), r + keys_offset, 8 * criteo_slot_count);
  if (crossed && header.num_crossed) {
    std::memcpy(crossed, r + crossed_offset, 8 * header.num_crossed);
  }
}

// ---- shard_writer ---------------------------------------------------------------------------

struct shard_writer::impl {
  detail::atomic_file_writer file;
  shard_header header;
  XXH64_state_t* hash = nullptr;
  std::vector<char> record;
  bool finished = false;
  ~impl() {
    if (hash) XXH64_freeState(hash);
  }
};

shard_writer::shard_writer() : impl_(std::make_unique<impl>()) {}
shard_writer::~shard_writer() = default;

result<std::unique_ptr<shard_writer>> shard_writer::create(const std::string& path,
                                                           std::size_t num_crossed) {
  if (num_crossed > 0xffff) {
    return status::invalid_argument("shard '" + path + "': " + std::to_string(num_crossed) +
                                    " crossed keys per row, at most 65535");
  }
  std::unique_ptr<shard_writer> w(new shard_writer());
  impl& m = *w->impl_;
  m.header.num_crossed = num_crossed;
  m.header.record_size = shard_record_size(num_crossed);
  m.record.resize(m.header.record_size);
  m.hash = XXH64_createState();
  if (!m.hash) throw std::bad_alloc();
  XXH64_reset(m.hash, 0);
  EMBCACHE_RETURN_IF_ERROR(m.file.open(path));
  // Placeholder header; the real one (row count, checksum) is written by finish().
  unsigned char zeros[shard_header_size] = {};
  EMBCACHE_RETURN_IF_ERROR(m.file.write(zeros, sizeof(zeros)));
  return w;
}

status shard_writer::append(const criteo_sample& s, const std::int64_t* crossed) {
  impl& m = *impl_;
  if (m.finished) throw error(status_code::invalid_argument, "shard_writer: append after finish");
  if (m.header.num_crossed && !crossed) {
    throw error(status_code::invalid_argument, "shard_writer: crossed keys missing");
  }
  encode_record(s, crossed, m.header.num_crossed, m.record.data());
  XXH64_update(m.hash, m.record.data(), m.record.size());
  ++m.header.rows;
  return m.file.write(m.record.data(), m.record.size());
}

status shard_writer::finish() {
  impl& m = *impl_;
  if (m.finished) throw error(status_code::invalid_argument, "shard_writer: finish twice");
  m.finished = true;
  m.header.checksum = XXH64_digest(m.hash);
  unsigned char header[shard_header_size];
  encode_header(m.header, header);
  EMBCACHE_RETURN_IF_ERROR(m.file.write_at(0, header, sizeof(header)));
  return m.file.commit();
}

std::uint64_t shard_writer::rows() const noexcept { return impl_->header.rows; }

// ---- dataset folders ------------------------------------------------------------------------

namespace {
std::string numbered(std::size_t index, const char* suffix) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "shard-%05zu%s", index, suffix);
  return buf;
}
constexpr const char* manifest_name = "manifest.json";
}  // namespace

std::string shard_file_name(std::size_t index) { return numbered(index, ".bin"); }
std::string keyset_file_name(std::size_t index) { return numbered(index, ".keys"); }
std::string crossed_keyset_file_name(std::size_t index) { return numbered(index, ".cross.keys"); }

namespace {

// Temporaries of atomic_file_writer for our files: "<name>.tmp.<pid>.<counter>".
bool is_our_temp_name(const std::string& name) {
  static const std::regex tmp(
      R"((shard-\d{5,}\.(bin|keys|cross\.keys)|manifest\.json)\.tmp\.\d+\.\d+)");
  return std::regex_match(name, tmp);
}

bool is_our_name(const std::string& name) {
  static const std::regex ours(R"(shard-\d{5,}\.(bin|keys|cross\.keys)|manifest\.json)");
  return std::regex_match(name, ours);
}

bool all_digits(const std::string& s, std::size_t from, std::size_t to) {
  if (from >= to) return false;
  for (std::size_t i = from; i < to; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return true;
}

// Staging folders of a dataset named `name`: ".<name>.new.<pid>.<n>" (and ".<name>.old.<pid>.<n>"
// where the folder swap falls back to two renames).
bool is_staging_name(const std::string& entry, const std::string& name) {
  for (const char* kind : {".new.", ".old."}) {
    const std::string prefix = "." + name + kind;
    if (entry.size() <= prefix.size() || entry.compare(0, prefix.size(), prefix) != 0) continue;
    const std::size_t dot = entry.find('.', prefix.size());
    if (dot != std::string::npos && all_digits(entry, prefix.size(), dot) &&
        all_digits(entry, dot + 1, entry.size())) {
      return true;
    }
  }
  return false;
}

// Removes the files named like ours (and their temporaries) from `dir`; the folder itself goes
// only when nothing else is left in it, so nothing but our own files is ever deleted.
void remove_our_files(const fs::path& dir, bool remove_dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string n = entry.path().filename().string();
    if (is_our_name(n) || is_our_temp_name(n)) fs::remove(entry.path(), ec);
  }
  if (remove_dir) fs::remove(dir, ec);  // fails, harmlessly, when something else is left
}

struct dataset_paths {
  fs::path dir;     // the final folder, absolute
  fs::path parent;  // its parent
  std::string name;
};

result<dataset_paths> resolve_output(const std::string& output_dir) {
  std::error_code ec;
  fs::path abs = fs::absolute(fs::path(output_dir), ec).lexically_normal();
  if (ec) return status::io_error("output folder '" + output_dir + "': " + ec.message());
  if (!abs.has_filename()) abs = abs.parent_path();
  if (!abs.has_filename() || abs.filename() == "..") {
    return status::invalid_argument("output folder '" + output_dir +
                                    "': expected a folder with a name inside a parent folder");
  }
  return dataset_paths{abs, abs.parent_path(), abs.filename().string()};
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

std::string dataset_lock_path(const std::string& output_dir) {
  auto p = resolve_output(output_dir);
  if (!p.ok()) return output_dir + ".lock";
  return (p.value().parent / ("." + p.value().name + ".lock")).string();
}

struct dataset_writer::impl {
  dataset_writer_options opts;
  dataset_paths paths;
  fs::path stage;  // where the files are written until finish() moves them into place
  detail::file_lock lock;
  bool published = false;
  dataset_summary summary;
  std::unique_ptr<shard_writer> shard;
  detail::flat_key_set shard_keys{1 << 16};
  detail::flat_key_set shard_crossed{1 << 12};
  std::vector<detail::flat_key_set> slot_keys;
  detail::flat_key_set all_crossed{1 << 12};
  double label_sum = 0;
  bool finished = false;

  ~impl() {
    shard.reset();  // removes its temporary
    if (!published && !stage.empty()) {
      std::error_code ec;
      fs::remove_all(stage, ec);  // only our files are ever in it before publishing
    }
  }

  std::string in_stage(const std::string& name) const { return (stage / name).string(); }
  std::string in_dir(const std::string& name) const { return (paths.dir / name).string(); }

  status close_shard() {
    if (!shard) return {};
    const std::size_t index = summary.shards.size();
    shard_files files;
    files.rows = shard->rows();
    files.shard = in_dir(shard_file_name(index));
    EMBCACHE_RETURN_IF_ERROR(shard->finish());
    shard.reset();
    std::vector<std::int64_t> keys;
    keys.reserve(shard_keys.size());
    shard_keys.for_each([&](std::int64_t k, std::uint32_t) { keys.push_back(k); });
    files.keyset = in_dir(keyset_file_name(index));
    files.has_key_counts = true;
    files.keys = keys.size();
    EMBCACHE_RETURN_IF_ERROR(
        write_keyset(in_stage(keyset_file_name(index)), keys.data(), keys.size(), opts.keyset));
    shard_keys.clear();
    if (opts.num_crossed) {
      keys.clear();
      shard_crossed.for_each([&](std::int64_t k, std::uint32_t) { keys.push_back(k); });
      files.crossed_keyset = in_dir(crossed_keyset_file_name(index));
      files.crossed_keys = keys.size();
      EMBCACHE_RETURN_IF_ERROR(write_keyset(in_stage(crossed_keyset_file_name(index)), keys.data(),
                                            keys.size(), opts.keyset));
      shard_crossed.clear();
    }
    summary.shards.push_back(std::move(files));
    return {};
  }

  // Moves the complete staged dataset into place. An existing folder is swapped with the
  // staged one in one step (renameat2 RENAME_EXCHANGE); what it held besides a dataset is
  // carried over (hard links, or a move for sub-folders) and the old dataset is removed last.
  status publish() {
    const fs::path& dir = paths.dir;
    std::error_code ec;
    fsync_dir(stage);
    if (!fs::exists(dir, ec)) {
      if (std::rename(stage.c_str(), dir.c_str()) != 0) {
        return detail::errno_status("cannot rename the finished dataset to", dir.string(), errno);
      }
      published = true;
      fsync_dir(paths.parent);
      return {};
    }
    std::vector<fs::path> folders;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string n = entry.path().filename().string();
      if (is_our_name(n) || is_our_temp_name(n)) continue;
      std::error_code e;
      if (entry.is_directory(e) && !entry.is_symlink(e)) {
        folders.push_back(entry.path());
        continue;
      }
      fs::create_hard_link(entry.path(), stage / n, e);
      if (e && entry.is_symlink(e)) {
        e.clear();
        fs::copy_symlink(entry.path(), stage / n, e);
      } else if (e) {
        e.clear();
        fs::copy_file(entry.path(), stage / n, e);
      }
      if (e) {
        return status::io_error("cannot carry '" + entry.path().string() +
                                "' over into the new dataset: " + e.message());
      }
    }
    if (ec) {
      return status::io_error("cannot list output folder '" + dir.string() + "': " + ec.message());
    }
    fs::path old = stage;  // after the exchange the staging name holds the old folder
    if (::renameat2(AT_FDCWD, stage.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
      if (errno != EINVAL && errno != ENOSYS) {
        return detail::errno_status("cannot swap the finished dataset into", dir.string(), errno);
      }
      // No atomic exchange on this file system: two renames, the old folder kept until the
      // new one is in place.
      std::string tail = stage.filename().string();
      tail.replace(tail.rfind(".new."), 5, ".old.");
      old = paths.parent / tail;
      if (std::rename(dir.c_str(), old.c_str()) != 0) {
        return detail::errno_status("cannot move the old dataset aside from", dir.string(), errno);
      }
      if (std::rename(stage.c_str(), dir.c_str()) != 0) {
        status s =
            detail::errno_status("cannot rename the finished dataset to", dir.string(), errno);
        (void)std::rename(old.c_str(), dir.c_str());
        return s;
      }
    }
    published = true;
    fsync_dir(paths.parent);
    bool moved_all = true;
    for (const fs::path& f : folders) {
      const fs::path from = old / f.filename();
      if (std::rename(from.c_str(), (dir / f.filename()).c_str()) != 0) moved_all = false;
    }
    if (!moved_all) {
      return status::io_error("dataset written to '" + dir.string() +
                              "', but some folders of the old one stay in '" + old.string() + "'");
    }
    // Only our files and duplicates (links or copies) of the carried-over files are left.
    fs::remove_all(old, ec);
    return {};
  }
};

dataset_writer::dataset_writer() : impl_(std::make_unique<impl>()) {}
dataset_writer::~dataset_writer() = default;

result<std::unique_ptr<dataset_writer>> dataset_writer::create(const dataset_writer_options& opts) {
  if (opts.output_dir.empty()) return status::invalid_argument("dataset_writer: no output folder");
  if (opts.rows_per_shard == 0) {
    return status::invalid_argument("dataset_writer: rows_per_shard must be at least 1");
  }
  auto paths_or = resolve_output(opts.output_dir);
  if (!paths_or.ok()) return paths_or.get_status();
  const dataset_paths& paths = paths_or.value();
  std::error_code ec;
  fs::create_directories(paths.parent, ec);
  if (ec) {
    return status::io_error("cannot create the parent of output folder '" + opts.output_dir +
                            "': " + ec.message());
  }
  if (fs::exists(paths.dir, ec) && !fs::is_directory(paths.dir, ec)) {
    return status::invalid_argument("output folder '" + opts.output_dir +
                                    "' exists and is not a folder");
  }
  std::unique_ptr<dataset_writer> w(new dataset_writer());
  impl& m = *w->impl_;
  m.opts = opts;
  m.paths = paths;
  EMBCACHE_RETURN_IF_ERROR(m.lock.try_lock((paths.parent / ("." + paths.name + ".lock")).string(),
                                           "output folder '" + opts.output_dir + "'"));
  if (!opts.overwrite && fs::exists(paths.dir / manifest_name, ec)) {
    return status::invalid_argument("output folder '" + opts.output_dir +
                                    "' already holds a dataset (manifest.json); choose another "
                                    "folder or allow overwriting");
  }
  // Holding the lock, nothing else writes here: temporaries and staging folders are leftovers
  // of a run that crashed.
  if (fs::is_directory(paths.dir, ec)) {
    for (const auto& entry : fs::directory_iterator(paths.dir, ec)) {
      if (is_our_temp_name(entry.path().filename().string())) {
        std::error_code e;
        fs::remove(entry.path(), e);
      }
    }
  }
  for (const auto& entry : fs::directory_iterator(paths.parent, ec)) {
    std::error_code e;
    if (is_staging_name(entry.path().filename().string(), paths.name) && entry.is_directory(e) &&
        !entry.is_symlink(e)) {
      remove_our_files(entry.path(), true);
    }
  }
  // A fresh name: a leftover that could not be cleaned (it holds something not ours) stays.
  static std::atomic<std::uint64_t> counter{0};
  for (int attempt = 0;; ++attempt) {
    m.stage = paths.parent / ("." + paths.name + ".new." + std::to_string(::getpid()) + "." +
                              std::to_string(counter++));
    if (fs::create_directory(m.stage, ec)) break;
    if (ec || attempt == 100) {
      m.stage.clear();
      return status::io_error("cannot create a staging folder beside output folder '" +
                              opts.output_dir + "': " + (ec ? ec.message() : "names taken"));
    }
  }
  m.summary.num_crossed = opts.num_crossed;
  m.summary.keyset = opts.keyset;
  m.summary.has_unique_stats = opts.unique_stats;
  if (opts.unique_stats) m.slot_keys.assign(criteo_slot_count, detail::flat_key_set(1 << 10));
  return w;
}

status dataset_writer::append(const criteo_sample& s, const std::int64_t* crossed) {
  impl& m = *impl_;
  if (m.finished) throw error(status_code::invalid_argument, "dataset_writer: append after finish");
  if (!m.shard) {
    auto w = shard_writer::create(m.in_stage(shard_file_name(m.summary.shards.size())),
                                  m.opts.num_crossed);
    if (!w.ok()) return w.get_status();
    m.shard = std::move(w).value();
  }
  EMBCACHE_RETURN_IF_ERROR(m.shard->append(s, crossed));
  for (std::size_t j = 0; j < criteo_slot_count; ++j) m.shard_keys.add(s.keys[j]);
  for (std::size_t j = 0; j < m.opts.num_crossed; ++j) m.shard_crossed.add(crossed[j]);
  if (m.opts.unique_stats) {
    for (std::size_t j = 0; j < criteo_slot_count; ++j) m.slot_keys[j].add(s.keys[j]);
    for (std::size_t j = 0; j < m.opts.num_crossed; ++j) m.all_crossed.add(crossed[j]);
  }
  m.label_sum += s.label;
  ++m.summary.rows;
  if (m.shard->rows() == m.opts.rows_per_shard) return m.close_shard();
  return {};
}

status dataset_writer::finish(std::vector<std::pair<std::string, std::string>> producer) {
  impl& m = *impl_;
  if (m.finished) throw error(status_code::invalid_argument, "dataset_writer: finish twice");
  m.finished = true;
  EMBCACHE_RETURN_IF_ERROR(m.close_shard());
  dataset_summary& s = m.summary;
  s.label_mean = s.rows ? m.label_sum / static_cast<double>(s.rows) : 0.0;
  if (m.opts.unique_stats) {
    for (std::size_t j = 0; j < criteo_slot_count; ++j) s.unique_keys[j] = m.slot_keys[j].size();
    s.unique_crossed_keys = m.all_crossed.size();
    m.slot_keys.clear();
  }
  s.producer = std::move(producer);

  nlohmann::ordered_json j;
  j["format"] = "embcache-dataset";
  j["version"] = 1;
  j["rows"] = s.rows;
  j["label_mean"] = s.label_mean;
  j["dense_count"] = criteo_dense_count;
  j["slot_count"] = criteo_slot_count;
  j["crossed_per_row"] = s.num_crossed;
  j["keyset_format"] = to_string(s.keyset);
  j["key_type"] = "int64";
  if (s.has_unique_stats) {
    j["unique_keys_per_slot"] = s.unique_keys;
    j["unique_crossed_keys"] = s.unique_crossed_keys;
  }
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  for (const auto& f : s.shards) {
    nlohmann::ordered_json e;
    e["file"] = fs::path(f.shard).filename().string();
    e["rows"] = f.rows;
    e["keyset"] = fs::path(f.keyset).filename().string();
    if (!f.crossed_keyset.empty()) {
      e["crossed_keyset"] = fs::path(f.crossed_keyset).filename().string();
    }
    e["keys"] = f.keys;
    if (!f.crossed_keyset.empty()) e["crossed_keys"] = f.crossed_keys;
    shards.push_back(std::move(e));
  }
  j["shards"] = std::move(shards);
  nlohmann::ordered_json prod = nlohmann::ordered_json::object();
  for (const auto& [k, v] : s.producer) prod[k] = v;
  j["producer"] = std::move(prod);
  const std::string text = j.dump(2) + "\n";
  detail::atomic_file_writer out;
  EMBCACHE_RETURN_IF_ERROR(out.open(m.in_stage(manifest_name)));
  EMBCACHE_RETURN_IF_ERROR(out.write(text.data(), text.size()));
  EMBCACHE_RETURN_IF_ERROR(out.commit());
  status published = m.publish();
  m.lock.unlock();
  return published;
}

const dataset_summary& dataset_writer::summary() const noexcept { return impl_->summary; }

namespace {

// Typed access to manifest fields: each error names the file, the field and what was expected.
class manifest_fields {
 public:
  explicit manifest_fields(std::string path) : path_(std::move(path)) {}

  status fail(const std::string& field, const std::string& what) const {
    return status::corruption("'" + path_ + "': field " + field + " " + what);
  }
  static std::string shown(const nlohmann::json& v) {
    std::string t = v.dump();
    if (t.size() > 40) t = t.substr(0, 40) + "...";
    return t;
  }
  status member(const nlohmann::json& obj, const std::string& key, const std::string& field,
                const nlohmann::json*& out) const {
    auto it = obj.find(key);
    if (it == obj.end()) return fail(field, "is missing");
    out = &*it;
    return {};
  }
  status count(const nlohmann::json& obj, const std::string& key, const std::string& field,
               std::uint64_t& out) const {
    const nlohmann::json* v = nullptr;
    EMBCACHE_RETURN_IF_ERROR(member(obj, key, field, v));
    return count_value(*v, field, out);
  }
  status count_value(const nlohmann::json& v, const std::string& field, std::uint64_t& out) const {
    // Negative integers parse as number_integer and fractions as number_float: both refused.
    if (!v.is_number_unsigned()) {
      return fail(field, "is " + shown(v) + ", expected a non-negative integer");
    }
    out = v.get<std::uint64_t>();
    return {};
  }
  status text(const nlohmann::json& obj, const std::string& key, const std::string& field,
              std::string& out) const {
    const nlohmann::json* v = nullptr;
    EMBCACHE_RETURN_IF_ERROR(member(obj, key, field, v));
    if (!v->is_string()) return fail(field, "is " + shown(*v) + ", expected a string");
    out = v->get<std::string>();
    return {};
  }
  // A file of the dataset: a plain name inside the folder, never a path out of it.
  status file_name(const nlohmann::json& obj, const std::string& key, const std::string& field,
                   const std::string& dir, std::string& out) const {
    std::string name;
    EMBCACHE_RETURN_IF_ERROR(text(obj, key, field, name));
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos) {
      return fail(field, "is " + shown(obj.at(key)) + ", expected a file name in the folder");
    }
    out = (fs::path(dir) / name).string();
    return {};
  }

 private:
  std::string path_;
};

// A shard's keyset sizes, when recorded: "keys" (at most rows * 26 distinct keys) and, with
// crossing, "crossed_keys" (at most rows * crossed_per_row).
status key_counts(const manifest_fields& f, const nlohmann::json& e, const std::string& at,
                  std::size_t num_crossed, shard_files& sf) {
  if (!e.contains("keys")) {
    if (e.contains("crossed_keys"))
      return f.fail(at + ".keys", "is missing, but crossed_keys is not");
    return {};
  }
  if (num_crossed == 0 && e.contains("crossed_keys")) {
    return f.fail(at + ".crossed_keys", "is present, but crossed_per_row is 0");
  }
  EMBCACHE_RETURN_IF_ERROR(f.count(e, "keys", at + ".keys", sf.keys));
  if (num_crossed > 0) {
    EMBCACHE_RETURN_IF_ERROR(f.count(e, "crossed_keys", at + ".crossed_keys", sf.crossed_keys));
  }
  const struct {
    const char* name;
    std::uint64_t value, per_row;
  } counts[] = {{"keys", sf.keys, criteo_slot_count},
                {"crossed_keys", sf.crossed_keys, num_crossed}};
  for (const auto& c : counts) {
    std::uint64_t most = 0;
    if (!__builtin_mul_overflow(sf.rows, c.per_row, &most) && c.value > most) {
      return f.fail(at + "." + c.name, "is " + std::to_string(c.value) + ", more than the " +
                                           std::to_string(most) + " keys its " +
                                           std::to_string(sf.rows) + " rows hold");
    }
  }
  sf.has_key_counts = true;
  return {};
}

status parse_manifest(const nlohmann::json& j, const std::string& dir, const std::string& path,
                      dataset_summary& s) {
  const manifest_fields f(path);
  if (!j.is_object()) return status::corruption("'" + path + "': not a JSON object");
  std::string format;
  EMBCACHE_RETURN_IF_ERROR(f.text(j, "format", "format", format));
  std::uint64_t version = 0;
  EMBCACHE_RETURN_IF_ERROR(f.count(j, "version", "version", version));
  if (format != "embcache-dataset" || version != 1) {
    return status::unsupported("'" + path + "': format '" + format + "' version " +
                               std::to_string(version) +
                               ", expected an embcache-dataset manifest of version 1");
  }
  EMBCACHE_RETURN_IF_ERROR(f.count(j, "rows", "rows", s.rows));
  const nlohmann::json* mean = nullptr;
  EMBCACHE_RETURN_IF_ERROR(f.member(j, "label_mean", "label_mean", mean));
  if (!mean->is_number() || !(mean->get<double>() >= 0.0 && mean->get<double>() <= 1.0)) {
    return f.fail("label_mean", "is " + f.shown(*mean) + ", expected a number in [0, 1]");
  }
  s.label_mean = mean->get<double>();
  std::uint64_t dense = 0, slots = 0, crossed = 0;
  EMBCACHE_RETURN_IF_ERROR(f.count(j, "dense_count", "dense_count", dense));
  EMBCACHE_RETURN_IF_ERROR(f.count(j, "slot_count", "slot_count", slots));
  if (dense != criteo_dense_count || slots != criteo_slot_count) {
    return status::unsupported("'" + path + "': fields dense_count = " + std::to_string(dense) +
                               ", slot_count = " + std::to_string(slots) + ", expected " +
                               std::to_string(criteo_dense_count) + " and " +
                               std::to_string(criteo_slot_count));
  }
  EMBCACHE_RETURN_IF_ERROR(f.count(j, "crossed_per_row", "crossed_per_row", crossed));
  if (crossed > 0xffff) {
    return f.fail("crossed_per_row", "is " + std::to_string(crossed) + ", at most 65535");
  }
  s.num_crossed = static_cast<std::size_t>(crossed);
  std::string text;
  EMBCACHE_RETURN_IF_ERROR(f.text(j, "keyset_format", "keyset_format", text));
  if (text == "embcache") {
    s.keyset = keyset_format::embcache;
  } else if (text == "hugectr_raw") {
    s.keyset = keyset_format::hugectr_raw;
  } else {
    return f.fail("keyset_format", "is '" + text + "', expected 'embcache' or 'hugectr_raw'");
  }
  EMBCACHE_RETURN_IF_ERROR(f.text(j, "key_type", "key_type", text));
  if (text != "int64") return f.fail("key_type", "is '" + text + "', expected 'int64'");
  if (j.contains("unique_keys_per_slot")) {
    const nlohmann::json& u = j.at("unique_keys_per_slot");
    if (!u.is_array() || u.size() != criteo_slot_count) {
      return f.fail("unique_keys_per_slot", "is " + f.shown(u) + ", expected an array of " +
                                                std::to_string(criteo_slot_count) + " counts");
    }
    for (std::size_t i = 0; i < criteo_slot_count; ++i) {
      EMBCACHE_RETURN_IF_ERROR(
          f.count_value(u[i], "unique_keys_per_slot[" + std::to_string(i) + "]", s.unique_keys[i]));
    }
    EMBCACHE_RETURN_IF_ERROR(
        f.count(j, "unique_crossed_keys", "unique_crossed_keys", s.unique_crossed_keys));
    s.has_unique_stats = true;
  }
  const nlohmann::json* shards = nullptr;
  EMBCACHE_RETURN_IF_ERROR(f.member(j, "shards", "shards", shards));
  if (!shards->is_array()) {
    return f.fail("shards", "is " + f.shown(*shards) + ", expected an array");
  }
  std::uint64_t total = 0;
  const std::uint64_t record_size = shard_record_size(s.num_crossed);
  for (std::size_t i = 0; i < shards->size(); ++i) {
    const nlohmann::json& e = (*shards)[i];
    const std::string at = "shards[" + std::to_string(i) + "]";
    if (!e.is_object()) return f.fail(at, "is " + f.shown(e) + ", expected an object");
    shard_files sf;
    EMBCACHE_RETURN_IF_ERROR(f.file_name(e, "file", at + ".file", dir, sf.shard));
    EMBCACHE_RETURN_IF_ERROR(f.file_name(e, "keyset", at + ".keyset", dir, sf.keyset));
    if (s.num_crossed > 0) {
      EMBCACHE_RETURN_IF_ERROR(
          f.file_name(e, "crossed_keyset", at + ".crossed_keyset", dir, sf.crossed_keyset));
    } else if (e.contains("crossed_keyset")) {
      return f.fail(at + ".crossed_keyset", "is present, but crossed_per_row is 0");
    }
    EMBCACHE_RETURN_IF_ERROR(f.count(e, "rows", at + ".rows", sf.rows));
    // The rows must fit the shard file when it is there (a missing one is the reader's error).
    std::error_code ec;
    const std::uint64_t size = fs::file_size(sf.shard, ec);
    std::uint64_t payload = 0, expected = 0;
    if (__builtin_mul_overflow(sf.rows, record_size, &payload) ||
        __builtin_add_overflow(payload, std::uint64_t{shard_header_size}, &expected) ||
        (!ec && size != expected)) {
      return f.fail(at + ".rows",
                    "is " + std::to_string(sf.rows) + ", but shard '" + sf.shard + "' has " +
                        (ec ? "no size" : std::to_string(size)) + " bytes" +
                        (ec ? "" : " (" + std::to_string(record_size) + "-byte records)"));
    }
    EMBCACHE_RETURN_IF_ERROR(key_counts(f, e, at, s.num_crossed, sf));
    if (__builtin_add_overflow(total, sf.rows, &total)) {
      return f.fail("shards", "rows add up to more than 2^64");
    }
    s.shards.push_back(std::move(sf));
  }
  if (total != s.rows) {
    return f.fail("rows", "is " + std::to_string(s.rows) + ", but the shards hold " +
                              std::to_string(total) + " rows");
  }
  if (j.contains("producer")) {
    const nlohmann::json& p = j.at("producer");
    if (!p.is_object()) return f.fail("producer", "is " + f.shown(p) + ", expected an object");
    for (const auto& [k, v] : p.items()) {
      if (!v.is_string()) {
        return f.fail("producer." + k, "is " + f.shown(v) + ", expected a string");
      }
      s.producer.emplace_back(k, v.get<std::string>());
    }
  }
  return {};
}

}  // namespace

result<dataset_summary> read_dataset_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / manifest_name).string();
  auto bytes = detail::read_file_bytes(path);
  if (!bytes.ok()) return bytes.get_status();
  const std::vector<char>& b = bytes.value();
  dataset_summary s;
  try {
    const auto j = nlohmann::json::parse(b.begin(), b.end());
    EMBCACHE_RETURN_IF_ERROR(parse_manifest(j, dir, path, s));
  } catch (const nlohmann::json::exception& e) {
    return status::corruption("'" + path + "': " + e.what());
  }
  return s;
}

// ---- shard_reader ---------------------------------------------------------------------------

struct shard_reader::impl {
  std::vector<std::string> paths;
  std::vector<shard_header> headers;
  shard_reader_options opts;
  std::uint64_t total_rows = 0;
  std::size_t num_crossed = 0;

  std::size_t current = 0;  // index of the loaded shard; == paths.size() before the first
  bool started = false;
  shard_data data;
  std::vector<std::uint64_t> order;  // empty when not shuffling
  std::uint64_t position = 0;
  std::future<result<shard_data>> ahead;
  std::size_t ahead_index = 0;
  status failed;

  static result<shard_data> load(const std::string& path) { return read_shard(path); }

  void start_read_ahead(std::size_t index) {
    if (!opts.read_ahead || index >= paths.size()) return;
    ahead_index = index;
    ahead = std::async(std::launch::async, &impl::load, paths[index]);
  }

  status load_shard(std::size_t index) {
    result<shard_data> r =
        (ahead.valid() && ahead_index == index) ? ahead.get() : load(paths[index]);
    if (!r.ok()) return r.get_status();
    data = std::move(r).value();
    if (data.header.rows != headers[index].rows || data.header.num_crossed != num_crossed) {
      return status::corruption("shard '" + paths[index] + "' changed while being read");
    }
    start_read_ahead(index + 1);
    position = 0;
    order.clear();
    if (opts.shuffle) {
      order.resize(data.header.rows);
      for (std::uint64_t i = 0; i < order.size(); ++i) order[i] = i;
      // Own Fisher-Yates so the order is the same with every standard library.
      detail::splitmix64 rng(detail::hash_words(opts.seed, index));
      for (std::uint64_t i = order.size(); i > 1; --i) {
        std::swap(order[i - 1], order[rng.below(i)]);
      }
    }
    return {};
  }
};

shard_reader::shard_reader() : impl_(std::make_unique<impl>()) {}
shard_reader::~shard_reader() {
  if (impl_ && impl_->ahead.valid()) impl_->ahead.wait();
}

result<std::unique_ptr<shard_reader>> shard_reader::open(std::vector<std::string> paths,
                                                         const shard_reader_options& opts) {
  if (opts.batch_size == 0) {
    throw error(status_code::invalid_argument, "shard_reader: batch_size must be at least 1");
  }
  std::unique_ptr<shard_reader> r(new shard_reader());
  impl& m = *r->impl_;
  m.opts = opts;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    auto h = read_shard_header(paths[i]);
    if (!h.ok()) return h.get_status();
    if (i > 0 && h.value().num_crossed != m.num_crossed) {
      return status::invalid_argument(
          "shard '" + paths[i] + "' has " + std::to_string(h.value().num_crossed) +
          " crossed keys per row, '" + paths[0] + "' has " + std::to_string(m.num_crossed));
    }
    m.num_crossed = h.value().num_crossed;
    if (__builtin_add_overflow(m.total_rows, h.value().rows, &m.total_rows)) {
      return status::corruption("shard '" + paths[i] + "': rows " + std::to_string(h.value().rows) +
                                " bring the total of the shards past 2^64");
    }
    m.headers.push_back(h.value());
  }
  m.paths = std::move(paths);
  m.start_read_ahead(0);
  return r;
}

status shard_reader::next(shard_batch& out) {
  impl& m = *impl_;
  out.size = 0;
  out.num_crossed = m.num_crossed;
  if (!m.failed.ok()) return m.failed;
  const std::size_t b = m.opts.batch_size;
  while (true) {
    if (m.current >= m.paths.size()) return {};
    if (m.started) {
      const std::uint64_t left = m.data.header.rows - m.position;
      if (left > 0 && (left >= b || !m.opts.drop_last)) break;
      ++m.current;
    }
    if (m.current >= m.paths.size()) {
      m.data = shard_data{};  // frees the last shard early
      return {};
    }
    m.started = true;
    status s = m.load_shard(m.current);
    if (!s.ok()) {
      m.failed = s;
      m.current = m.paths.size();
      return s;
    }
  }
  const std::uint64_t n = std::min<std::uint64_t>(b, m.data.header.rows - m.position);
  const std::size_t c = m.num_crossed;
  out.size = n;
  out.shard_index = m.current;
  out.labels.resize(n);
  out.dense.resize(n * criteo_dense_count);
  out.keys.resize(n * criteo_slot_count);
  out.crossed.resize(n * c);
  out.rows.resize(n);
  const std::size_t rs = m.data.header.record_size;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t row = m.order.empty() ? m.position + i : m.order[m.position + i];
    const char* r = m.data.records.data() + row * rs;
    out.rows[i] = row;
    std::memcpy(&out.labels[i], r + label_offset, 4);
    std::memcpy(&out.dense[i * criteo_dense_count], r + dense_offset, 4 * criteo_dense_count);
    std::memcpy(&out.keys[i * criteo_slot_count], r + keys_offset, 8 * criteo_slot_count);
    if (c) std::memcpy(&out.crossed[i * c], r + crossed_offset, 8 * c);
  }
  m.position += n;
  return {};
}

std::uint64_t shard_reader::total_rows() const noexcept { return impl_->total_rows; }
std::size_t shard_reader::num_shards() const noexcept { return impl_->paths.size(); }
std::size_t shard_reader::num_crossed() const noexcept { return impl_->num_crossed; }

}  // namespace embcache
