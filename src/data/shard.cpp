// The shard file: its format, whole-shard reads, shard_writer and the streaming shard_reader.
#include "embcache/shard.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>

#include "common/durable_file.hpp"
#include "random.hpp"

namespace embcache {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t label_offset = 0;
constexpr std::size_t dense_offset = 4;
// Where the keys and the crossed keys of a record of `dense` dense features and `slots` slots
// begin.
constexpr std::size_t keys_offset(std::size_t dense) noexcept { return 4 * (1 + dense); }
constexpr std::size_t crossed_offset(std::size_t dense, std::size_t slots) noexcept {
  return keys_offset(dense) + 8 * slots;
}

bool criteo_shape(const shard_header& h) noexcept {
  return h.num_dense == criteo_dense_count && h.num_slots == criteo_slot_count;
}

void encode_header(const shard_header& h, unsigned char* out) {
  std::memset(out, 0, shard_header_size);
  std::memcpy(out, shard_magic, 8);
  const std::uint16_t version = shard_format_version;
  const std::uint16_t header_size = shard_header_size;
  const auto record_size = static_cast<std::uint32_t>(h.record_size);
  const auto dense = static_cast<std::uint16_t>(h.num_dense);
  const auto slots = static_cast<std::uint16_t>(h.num_slots);
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
  if (header_size != shard_header_size || dense > schema_max_dense || slots == 0 ||
      slots > schema_max_categorical || record_size != shard_record_size(dense, slots, crossed)) {
    return status::unsupported(
        where + ": layout " + std::to_string(dense) + " dense, " + std::to_string(slots) +
        " slots, " + std::to_string(crossed) + " crossed, record size " +
        std::to_string(record_size) + "; expected at most " + std::to_string(schema_max_dense) +
        " dense, 1 to " + std::to_string(schema_max_categorical) + " slots and a record size of " +
        std::to_string(shard_record_size(dense, slots, crossed)));
  }
  h.num_dense = dense;
  h.num_slots = slots;
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

void encode_record(const shard_header& h, float label, const float* dense, const std::int64_t* keys,
                   const std::int64_t* crossed, char* out) {
  std::memcpy(out + label_offset, &label, 4);
  if (h.num_dense) std::memcpy(out + dense_offset, dense, 4 * h.num_dense);
  std::memcpy(out + keys_offset(h.num_dense), keys, 8 * h.num_slots);
  if (h.num_crossed) {
    std::memcpy(out + crossed_offset(h.num_dense, h.num_slots), crossed, 8 * h.num_crossed);
  }
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

void shard_data::get(std::uint64_t i, criteo_sample& out, std::int64_t* crossed) const {
  if (!criteo_shape(header)) {
    throw error(status_code::invalid_argument,
                "shard_data::get: the shard has " + std::to_string(header.num_dense) +
                    " dense features and " + std::to_string(header.num_slots) +
                    " slots, a criteo_sample 13 and 26");
  }
  const char* r = records.data() + i * header.record_size;
  std::memcpy(&out.label, r + label_offset, 4);
  std::memcpy(out.dense.data(), r + dense_offset, 4 * criteo_dense_count);
  std::memcpy(out.keys.data(), r + keys_offset(criteo_dense_count), 8 * criteo_slot_count);
  if (crossed && header.num_crossed) {
    std::memcpy(crossed, r + crossed_offset(criteo_dense_count, criteo_slot_count),
                8 * header.num_crossed);
  }
}

// ---- shard_writer ---------------------------------------------------------------------------

struct shard_writer::impl {
  detail::durable_file_writer file;
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
  return create(path, num_crossed, criteo_dense_count, criteo_slot_count);
}

result<std::unique_ptr<shard_writer>> shard_writer::create(const std::string& path,
                                                           std::size_t num_crossed,
                                                           std::size_t num_dense,
                                                           std::size_t num_slots) {
  if (num_crossed > 0xffff) {
    return status::invalid_argument("shard '" + path + "': " + std::to_string(num_crossed) +
                                    " crossed keys per row, at most 65535");
  }
  if (num_dense > schema_max_dense || num_slots == 0 || num_slots > schema_max_categorical) {
    return status::invalid_argument(
        "shard '" + path + "': " + std::to_string(num_dense) + " dense features and " +
        std::to_string(num_slots) + " slots per row, expected at most " +
        std::to_string(schema_max_dense) + " and 1 to " + std::to_string(schema_max_categorical));
  }
  std::unique_ptr<shard_writer> w(new shard_writer());
  impl& m = *w->impl_;
  m.header.num_dense = num_dense;
  m.header.num_slots = num_slots;
  m.header.num_crossed = num_crossed;
  m.header.record_size = shard_record_size(num_dense, num_slots, num_crossed);
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
  if (!criteo_shape(impl_->header)) {
    throw error(status_code::invalid_argument,
                "shard_writer: append of a criteo_sample to a shard of another shape");
  }
  return append_row(s.label, s.dense.data(), s.keys.data(), crossed);
}

status shard_writer::append_row(float label, const float* dense, const std::int64_t* keys,
                                const std::int64_t* crossed) {
  impl& m = *impl_;
  if (m.finished) throw error(status_code::invalid_argument, "shard_writer: append after finish");
  if (m.header.num_crossed && !crossed) {
    throw error(status_code::invalid_argument, "shard_writer: crossed keys missing");
  }
  encode_record(m.header, label, dense, keys, crossed, m.record.data());
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
    if (data.header.rows != headers[index].rows || data.header.num_crossed != num_crossed ||
        data.header.num_dense != opts.num_dense || data.header.num_slots != opts.num_slots) {
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
    if (h.value().num_dense != opts.num_dense || h.value().num_slots != opts.num_slots) {
      return status::invalid_argument(
          "shard '" + paths[i] + "' has " + std::to_string(h.value().num_dense) +
          " dense features and " + std::to_string(h.value().num_slots) +
          " categorical slots per row, but the dataset schema has " +
          std::to_string(opts.num_dense) + " and " + std::to_string(opts.num_slots));
    }
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
  out.num_dense = m.opts.num_dense;
  out.num_slots = m.opts.num_slots;
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
  const std::size_t c = m.num_crossed, nd = m.opts.num_dense, ns = m.opts.num_slots;
  out.size = n;
  out.num_dense = nd;
  out.num_slots = ns;
  out.shard_index = m.current;
  out.labels.resize(n);
  out.dense.resize(n * nd);
  out.keys.resize(n * ns);
  out.crossed.resize(n * c);
  out.rows.resize(n);
  const std::size_t rs = m.data.header.record_size;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t row = m.order.empty() ? m.position + i : m.order[m.position + i];
    const char* r = m.data.records.data() + row * rs;
    out.rows[i] = row;
    std::memcpy(&out.labels[i], r + label_offset, 4);
    if (nd) std::memcpy(&out.dense[i * nd], r + dense_offset, 4 * nd);
    std::memcpy(&out.keys[i * ns], r + keys_offset(nd), 8 * ns);
    if (c) std::memcpy(&out.crossed[i * c], r + crossed_offset(nd, ns), 8 * c);
  }
  m.position += n;
  return {};
}

std::uint64_t shard_reader::total_rows() const noexcept { return impl_->total_rows; }
std::size_t shard_reader::num_shards() const noexcept { return impl_->paths.size(); }
std::size_t shard_reader::num_crossed() const noexcept { return impl_->num_crossed; }

}  // namespace embcache
