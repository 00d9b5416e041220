#include "embcache/rocksdb_store.hpp"

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>
#include <vector>

#include "embcache/detail/host_algorithms.hpp"
#include "store_io.hpp"

namespace embcache {

namespace {

constexpr const char* meta_prefix = "embcache.table.";
constexpr const char* meta_format = "embcache.rocksdb_store";
// 2: the metadata entry records the table's schema (dim, optimizer, state width) besides the
// key type and row width of version 1.
constexpr int meta_format_version = 2;

status from_rocksdb(const rocksdb::Status& s, const std::string& context) {
  if (s.ok()) return {};
  std::string m = context + ": " + s.ToString();
  if (s.IsNoSpace() || s.ToString().find("No space left") != std::string::npos)
    return status::out_of_space(m);
  if (s.IsCorruption()) return status::corruption(m);
  if (s.IsNotFound() || s.IsPathNotFound()) return status::not_found(m);
  if (s.IsInvalidArgument()) return status::invalid_argument(m);
  if (s.IsNotSupported()) return status::unsupported(m);
  return status::io_error(m);
}

template <class Key>
const char* key_type_name() {
  return std::is_same_v<Key, std::int64_t> ? "int64" : "uint32";
}

// A key as an unsigned integer whose numeric order is the key's order.
template <class Key>
std::uint64_t sortable(Key k) {
  if constexpr (std::is_signed_v<Key>)
    return static_cast<std::uint64_t>(k) ^ (std::uint64_t{1} << 63);
  else
    return static_cast<std::uint64_t>(k);
}

template <class Key>
Key from_sortable(std::uint64_t u) {
  if constexpr (std::is_signed_v<Key>)
    return static_cast<Key>(u ^ (std::uint64_t{1} << 63));
  else
    return static_cast<Key>(u);
}

// Big-endian, so that RocksDB's bytewise order is the numeric order.
template <class Key>
void encode_key(std::uint64_t u, char* out) {
  for (std::size_t b = 0; b < sizeof(Key); ++b)
    out[b] = static_cast<char>(u >> (8 * (sizeof(Key) - 1 - b)));
}

template <class Key>
std::uint64_t decode_key(const char* in) {
  std::uint64_t u = 0;
  for (std::size_t b = 0; b < sizeof(Key); ++b) u = (u << 8) | static_cast<unsigned char>(in[b]);
  return u;
}

template <class Key>
std::string key_text(Key k) {
  return std::to_string(k);
}

// What a table's rows mean, as recorded in its metadata entry and as a caller expects it.
struct table_schema {
  std::string key_type;
  std::size_t dim = 0, state_width = 0, row_width = 0;
  std::string optimizer;
  std::uint64_t format_version = 0;

  bool same_layout(const table_schema& o) const {
    return key_type == o.key_type && dim == o.dim && state_width == o.state_width &&
           row_width == o.row_width && optimizer == o.optimizer;
  }
  std::string text() const {
    return "{" + key_type + " keys, dim " + std::to_string(dim) + ", optimizer " + optimizer +
           " (state width " + std::to_string(state_width) + "), rows of " +
           std::to_string(row_width) + " floats, format version " + std::to_string(format_version) +
           "}";
  }
};

// Sends RocksDB's warnings and errors to stderr instead of a LOG file beside the data: a LOG on
// a full disk fails, and this RocksDB build asserts on the next log line after such a failure.
class stderr_logger final : public rocksdb::Logger {
 public:
  stderr_logger() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    std::fputs("rocksdb: ", stderr);
    std::vfprintf(stderr, format, ap);
    std::fputc('\n', stderr);
  }
};

// Collects the first failure of a parallel loop.
struct first_error {
  std::mutex mutex;
  status st;
  std::atomic<bool> failed{false};
  void set(status s) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failed) {
      st = std::move(s);
      failed = true;
    }
  }
};

}  // namespace

// --- database -------------------------------------------------------------------------------

struct rocksdb_database::impl {
  std::string path;
  rocksdb::Options options;
  std::shared_ptr<rocksdb::Cache> cache;
  rocksdb::DB* db = nullptr;
  mutable std::mutex mutex;
  std::map<std::string, rocksdb::ColumnFamilyHandle*> cfs;
  std::set<std::string> open_tables;

  ~impl() {
    if (!db) return;
    for (auto& [name, h] : cfs) db->DestroyColumnFamilyHandle(h);
    cfs.clear();
    db->Close().PermitUncheckedError();
    delete db;
  }

  rocksdb::ColumnFamilyHandle* default_cf() const { return db->DefaultColumnFamily(); }
};

rocksdb_database::rocksdb_database(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
rocksdb_database::~rocksdb_database() = default;

const std::string& rocksdb_database::path() const noexcept { return impl_->path; }

std::vector<std::string> rocksdb_database::tables() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<std::string> out;
  for (auto& [name, h] : impl_->cfs)
    if (name != rocksdb::kDefaultColumnFamilyName) out.push_back(name);
  return out;
}

result<std::shared_ptr<rocksdb_database>> rocksdb_database::open(const rocksdb_store_options& o) {
  namespace fs = std::filesystem;
  const std::string who = "rocksdb_database::open of '" + o.path + "'";
  if (o.path.empty()) return status::invalid_argument(who + ": empty path");
  auto p = std::make_unique<impl>();
  p->path = o.path;
  rocksdb::Options& opt = p->options;
  opt.create_if_missing = o.create_if_missing;
  opt.create_missing_column_families = false;
  opt.max_background_jobs = std::max(2, o.background_jobs);
  // With the WAL off, an atomic flush keeps the metadata entry and the rows of every column
  // family on disk as one prefix of the writes, which is what a crash recovers to.
  opt.atomic_flush = true;
  opt.write_buffer_size = o.write_buffer_bytes;
  opt.max_write_buffer_number = std::max(2, o.max_write_buffers);
  opt.min_write_buffer_number_to_merge = 1;
  // Rows are dense floats: compression costs CPU and saves almost nothing.
  opt.compression = rocksdb::kNoCompression;
  opt.bottommost_compression = rocksdb::kNoCompression;
  opt.target_file_size_base = std::max<std::uint64_t>(64u << 20, o.write_buffer_bytes);
  opt.max_bytes_for_level_base = 4 * opt.target_file_size_base;
  opt.bytes_per_sync = 1 << 20;
  if (!o.log_file) opt.info_log = std::make_shared<stderr_logger>();
  rocksdb::BlockBasedTableOptions table;
  p->cache = rocksdb::NewLRUCache(o.block_cache_bytes);
  table.block_cache = p->cache;
  table.block_size = o.block_bytes;
  if (o.bloom_bits_per_key > 0)
    table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(o.bloom_bits_per_key, false));
  table.whole_key_filtering = true;
  opt.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));

  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::exists(o.path + "/CURRENT", ec)) {
    if (!o.create_if_missing)
      return status::not_found(who + ": no RocksDB database there (no CURRENT file)");
    names.push_back(rocksdb::kDefaultColumnFamilyName);
    fs::create_directories(o.path, ec);  // RocksDB logs an error when it has to do it
  } else {
    EMBCACHE_RETURN_IF_ERROR(
        from_rocksdb(rocksdb::DB::ListColumnFamilies(opt, o.path, &names), who));
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descs;
  for (auto& n : names) descs.emplace_back(n, rocksdb::ColumnFamilyOptions(opt));
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  EMBCACHE_RETURN_IF_ERROR(
      from_rocksdb(rocksdb::DB::Open(opt, o.path, descs, &handles, &p->db), who));
  for (std::size_t i = 0; i < handles.size(); ++i) {
    if (names[i] == rocksdb::kDefaultColumnFamilyName) {
      p->db->DestroyColumnFamilyHandle(handles[i]).PermitUncheckedError();
      continue;
    }
    p->cfs.emplace(names[i], handles[i]);
  }
  return std::shared_ptr<rocksdb_database>(new rocksdb_database(std::move(p)));
}

status rocksdb_database::flush() {
  std::vector<rocksdb::ColumnFamilyHandle*> all{impl_->default_cf()};
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    for (auto& [n, h] : impl_->cfs) all.push_back(h);
  }
  rocksdb::FlushOptions fo;
  fo.wait = true;
  return from_rocksdb(impl_->db->Flush(fo, all), "flush of the database at '" + impl_->path + "'");
}

status rocksdb_database::checkpoint(const std::string& dir_in) {
  namespace fs = std::filesystem;
  const std::string dir = detail::strip_slashes(dir_in);
  const std::string who = "checkpoint of the database at '" + impl_->path + "' into '" + dir + "'";
  EMBCACHE_RETURN_IF_ERROR(detail::check_checkpoint_target(dir, who.c_str()));
  std::error_code ec;
  fs::remove(dir, ec);  // an empty folder: RocksDB wants to create it itself
  EMBCACHE_RETURN_IF_ERROR(flush());
  rocksdb::Checkpoint* raw = nullptr;
  EMBCACHE_RETURN_IF_ERROR(from_rocksdb(rocksdb::Checkpoint::Create(impl_->db, &raw), who));
  std::unique_ptr<rocksdb::Checkpoint> cp(raw);
  // log_size_for_flush = 0: flush every memtable first, so rows pushed without WAL are in it.
  status st = from_rocksdb(cp->CreateCheckpoint(dir, 0), who);
  if (!st.ok()) {
    fs::remove_all(dir + ".tmp", ec);
    fs::remove_all(dir, ec);
    return st;
  }
  return detail::sync_dir(detail::parent_dir(dir));
}

// --- store ------------------------------------------------------------------------------------

template <class Key>
struct rocksdb_store<Key>::state {
  rocksdb_store_options options;
  rocksdb_database::impl* db = nullptr;
  rocksdb::ColumnFamilyHandle* cf = nullptr;
  std::size_t count = 0;
  // Whether pushes since the last exact point may have added keys that `count` misses.
  std::atomic<bool> count_stale{false};
  std::mutex count_mutex;
  std::uint64_t max_version = 0;
  // Whether the metadata entry says "dirty": rows were pushed after it was last written.
  bool meta_dirty = false;
  std::string who;
  table_schema schema;  // the caller's, recorded in the metadata entry

  std::string meta_key() const { return meta_prefix + options.table_name; }
  std::size_t value_bytes() const { return options.row_width * sizeof(float) + 8; }
  rocksdb::WriteOptions write_options() const {
    rocksdb::WriteOptions wo;
    wo.disableWAL = options.disable_wal;
    return wo;
  }

  status write_meta(bool dirty) {
    nlohmann::json m{{"format", meta_format},
                     {"format_version", meta_format_version},
                     {"table_name", options.table_name},
                     {"key_type", key_type_name<Key>()},
                     {"dim", schema.dim},
                     {"optimizer", schema.optimizer},
                     {"state_width", schema.state_width},
                     {"row_width", options.row_width},
                     {"count", count},
                     {"count_exact", !count_stale.load()},
                     {"max_version", max_version},
                     {"dirty", dirty}};
    EMBCACHE_RETURN_IF_ERROR(
        from_rocksdb(db->db->Put(write_options(), db->default_cf(), meta_key(), m.dump()),
                     who + ": writing the metadata entry"));
    meta_dirty = dirty;
    return {};
  }

  // Marks the metadata dirty before the first write after a clean point. Recovery after a
  // crash sees it whenever any later row reached the disk, and then recounts.
  status before_write() { return meta_dirty ? status{} : write_meta(true); }

  status recount() {
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;
    std::unique_ptr<rocksdb::Iterator> it(db->db->NewIterator(ro, cf));
    std::size_t n = 0;
    std::uint64_t vmax = 0;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      auto v = it->value();
      if (v.size() != value_bytes())
        return status::corruption(who + ": a value of " + std::to_string(v.size()) +
                                  " bytes, expected " + std::to_string(value_bytes()));
      std::uint64_t ver;
      std::memcpy(&ver, v.data() + v.size() - 8, 8);
      vmax = std::max(vmax, ver);
      ++n;
    }
    EMBCACHE_RETURN_IF_ERROR(from_rocksdb(it->status(), who + ": recount"));
    count = n;
    max_version = std::max(max_version, vmax);
    return {};
  }

  // Sorted (stable) sortable keys and their batch positions.
  void sort_keys(const Key* keys, std::size_t n, std::vector<std::uint64_t>& su,
                 std::vector<std::uint32_t>& pos) const {
    su.resize(n);
    pos.resize(n);
    detail::for_each_index(options.space, n, [&](std::size_t i) {
      su[i] = sortable(keys[i]);
      pos[i] = static_cast<std::uint32_t>(i);
    });
    detail::stable_sort_by_key(options.space, su.data(), pos.data(), n);
  }

  // Keeps the last occurrence of each key (stable sort: the later position comes later).
  static std::size_t dedupe_keep_last(std::vector<std::uint64_t>& su,
                                      std::vector<std::uint32_t>& pos) {
    const std::size_t n = su.size();
    std::size_t m = 0;
    for (std::size_t j = 0; j < n; ++j) {
      if (j + 1 < n && su[j + 1] == su[j]) continue;
      su[m] = su[j];
      pos[m] = pos[j];
      ++m;
    }
    su.resize(m);
    pos.resize(m);
    return m;
  }

  // Runs f(begin, end) over batches of batch_keys sorted keys in parallel.
  template <class F>
  void for_batches(std::size_t n, const F& f) const {
    for_batches(n, options.batch_keys, f);
  }

  template <class F>
  void for_batches(std::size_t n, std::size_t batch_keys, const F& f) const {
    const std::size_t b = std::max<std::size_t>(1, batch_keys);
    const std::size_t batches = (n + b - 1) / b;
    if (batches <= 1) {
      if (n) f(0, n);
      return;
    }
    detail::run_in_space(options.space, [&] {
      tbb::parallel_for(std::size_t{0}, batches,
                        [&](std::size_t i) { f(i * b, std::min(n, (i + 1) * b)); });
    });
  }

  // MultiGet of sorted keys su[begin, end); g(j, status, value) for each.
  template <class G>
  void multi_get(const std::uint64_t* su, std::size_t begin, std::size_t end, const G& g) const {
    const std::size_t k = end - begin;
    std::vector<char> kb(k * sizeof(Key));
    std::vector<rocksdb::Slice> slices(k);
    std::vector<rocksdb::PinnableSlice> values(k);
    std::vector<rocksdb::Status> sts(k);
    for (std::size_t j = 0; j < k; ++j) {
      encode_key<Key>(su[begin + j], kb.data() + j * sizeof(Key));
      slices[j] = rocksdb::Slice(kb.data() + j * sizeof(Key), sizeof(Key));
    }
    rocksdb::ReadOptions ro;
    db->db->MultiGet(ro, cf, k, slices.data(), values.data(), sts.data(), true);
    for (std::size_t j = 0; j < k; ++j) g(begin + j, sts[j], values[j]);
  }
};

template <class Key>
rocksdb_store<Key>::rocksdb_store(std::shared_ptr<rocksdb_database> db, std::unique_ptr<state> st)
    : db_(std::move(db)), state_(std::move(st)) {}

template <class Key>
rocksdb_store<Key>::~rocksdb_store() {
  if (!state_) return;
  (void)flush();  // errors surface through an explicit flush() before destruction
  std::lock_guard<std::mutex> lock(state_->db->mutex);
  state_->db->open_tables.erase(state_->options.table_name);
}

template <class Key>
result<std::unique_ptr<rocksdb_store<Key>>> rocksdb_store<Key>::open(
    const rocksdb_store_options& options) {
  auto db = rocksdb_database::open(options);
  if (!db.ok()) return db.get_status();
  return open(std::move(db).value(), options);
}

template <class Key>
result<std::unique_ptr<rocksdb_store<Key>>> rocksdb_store<Key>::open(
    std::shared_ptr<rocksdb_database> db, const rocksdb_store_options& options) {
  if (!db) throw error(status_code::invalid_argument, "rocksdb_store::open: null database");
  auto& d = db->get_impl();
  const std::string who =
      "rocksdb_store::open of table '" + options.table_name + "' in '" + d.path + "'";
  if (options.table_name.empty() || options.table_name == rocksdb::kDefaultColumnFamilyName)
    return status::invalid_argument(who + ": the table name must be set and not be 'default'");
  if (options.row_width == 0) return status::invalid_argument(who + ": row_width must be > 0");
  if (options.dim > options.row_width)
    return status::invalid_argument(who + ": dim " + std::to_string(options.dim) +
                                    " exceeds row_width " + std::to_string(options.row_width));
  auto st = std::make_unique<state>();
  st->options = options;
  st->db = &d;
  st->who = "rocksdb_store of table '" + options.table_name + "' in '" + d.path + "'";
  st->schema.key_type = key_type_name<Key>();
  st->schema.dim = options.dim ? options.dim : options.row_width;
  st->schema.state_width = options.row_width - st->schema.dim;
  st->schema.row_width = options.row_width;
  st->schema.optimizer = options.optimizer.empty() ? "none" : options.optimizer;
  st->schema.format_version = meta_format_version;
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.open_tables.count(options.table_name))
    return status::invalid_argument(who + ": the table is already open in this process");
  auto it = d.cfs.find(options.table_name);
  if (it == d.cfs.end()) {
    if (!options.create_if_missing) {
      std::string have;
      for (auto& [n, h] : d.cfs) have += (have.empty() ? "" : ", ") + n;
      return status::not_found(who + ": no such table (the database holds: " +
                               (have.empty() ? std::string("none") : have) + ")");
    }
    rocksdb::ColumnFamilyHandle* h = nullptr;
    EMBCACHE_RETURN_IF_ERROR(from_rocksdb(
        d.db->CreateColumnFamily(rocksdb::ColumnFamilyOptions(d.options), options.table_name, &h),
        who + ": creating the column family"));
    d.cfs.emplace(options.table_name, h);
    st->cf = h;
    EMBCACHE_RETURN_IF_ERROR(st->write_meta(false));
  } else {
    st->cf = it->second;
    std::string text;
    rocksdb::Status s = d.db->Get(rocksdb::ReadOptions(), d.default_cf(), st->meta_key(), &text);
    if (s.IsNotFound())
      return status::corruption(who + ": the column family has no metadata entry '" +
                                st->meta_key() + "'");
    EMBCACHE_RETURN_IF_ERROR(from_rocksdb(s, who + ": reading the metadata entry"));
    auto m = nlohmann::json::parse(text, nullptr, false);
    auto bad = [&](const char* what) {
      return status::corruption(who + ": metadata entry '" + st->meta_key() + "' " + what);
    };
    if (m.is_discarded() || !m.is_object()) return bad("is not valid JSON");
    for (const char* f : {"key_type", "format"})
      if (!m.contains(f) || !m[f].is_string()) return bad((std::string("lacks ") + f).c_str());
    for (const char* f : {"format_version", "row_width", "count", "max_version"})
      if (!m.contains(f) || !m[f].is_number_unsigned())
        return bad((std::string("lacks ") + f).c_str());
    if (m["format"] != meta_format) return bad("has an unknown format");
    table_schema have;
    have.key_type = m["key_type"].get<std::string>();
    have.row_width = m["row_width"].get<std::size_t>();
    have.format_version = m["format_version"].get<std::uint64_t>();
    if (have.format_version > std::uint64_t{meta_format_version})
      return status::unsupported(who + ": metadata entry '" + st->meta_key() +
                                 "' has format_version " + std::to_string(have.format_version) +
                                 ", this build reads up to " + std::to_string(meta_format_version));
    const bool has_schema = have.format_version >= 2;
    if (has_schema) {
      for (const char* f : {"dim", "state_width"})
        if (!m.contains(f) || !m[f].is_number_unsigned())
          return bad((std::string("lacks ") + f).c_str());
      if (!m.contains("optimizer") || !m["optimizer"].is_string()) return bad("lacks optimizer");
      have.dim = m["dim"].get<std::size_t>();
      have.state_width = m["state_width"].get<std::size_t>();
      have.optimizer = m["optimizer"].get<std::string>();
      if (!have.same_layout(st->schema)) {
        const table_schema& want = st->schema;
        std::string diff = "same row width, another layout";
        if (have.key_type != want.key_type)
          diff = "it holds " + have.key_type + " keys, expected " + want.key_type;
        else if (have.row_width != want.row_width)
          diff = "it holds rows of " + std::to_string(have.row_width) + " floats, expected " +
                 std::to_string(want.row_width);
        return status::invalid_argument(who + ": " + diff + "; the table was created with schema " +
                                        have.text() + ", the caller expects " + want.text());
      }
    } else if (have.key_type != st->schema.key_type || have.row_width != options.row_width) {
      return status::invalid_argument(who + ": the table holds " + have.key_type +
                                      " keys and rows of " + std::to_string(have.row_width) +
                                      " floats, the caller expects " + st->schema.text());
    }
    rocksdb::ReadOptions probe;
    probe.fill_cache = false;
    std::unique_ptr<rocksdb::Iterator> first(d.db->NewIterator(probe, st->cf));
    first->SeekToFirst();
    EMBCACHE_RETURN_IF_ERROR(from_rocksdb(first->status(), who + ": reading the first row"));
    const bool empty = !first->Valid();
    std::string first_key;
    if (!empty && first->key().size() == sizeof(Key))
      first_key = key_text(from_sortable<Key>(decode_key<Key>(first->key().data())));
    first.reset();
    if (!empty && !has_schema)
      return status::unsupported(
          who +
          ": the table holds rows written by a build that recorded no schema (metadata "
          "format_version 1: " +
          have.key_type + " keys, rows of " + std::to_string(have.row_width) +
          " floats); they cannot be checked against the caller's schema " + st->schema.text() +
          "; copy them into a new table");
    if (!empty && options.existing_rows == existing_rows_policy::refuse)
      return status::invalid_argument(
          who + ": the table already holds rows (the first is key " + first_key +
          "), from an earlier run; set existing_rows = reuse to use them (the trainer: "
          "resume_from, or tables[i].reuse_store), or open another path");
    st->count = m["count"].get<std::size_t>();
    st->max_version = m["max_version"].get<std::uint64_t>();
    st->count_stale = !m.value("count_exact", true);
    if (m.value("dirty", false)) {
      // The last session ended without a flush: what reached the disk is a prefix of its
      // writes, so the stored count may be stale.
      EMBCACHE_RETURN_IF_ERROR(st->recount());
      st->count_stale = false;
      EMBCACHE_RETURN_IF_ERROR(st->write_meta(false));
    } else if (!has_schema) {
      EMBCACHE_RETURN_IF_ERROR(st->write_meta(false));  // an empty table takes the caller's schema
    }
  }
  d.open_tables.insert(options.table_name);
  return std::unique_ptr<rocksdb_store<Key>>(new rocksdb_store<Key>(std::move(db), std::move(st)));
}

template <class Key>
std::size_t rocksdb_store<Key>::row_width() const noexcept {
  return state_->options.row_width;
}

template <class Key>
const std::string& rocksdb_store<Key>::table_name() const noexcept {
  return state_->options.table_name;
}

template <class Key>
std::size_t rocksdb_store<Key>::size() const noexcept {
  auto& s = *state_;
  if (!s.count_stale.load(std::memory_order_acquire)) return s.count;
  std::lock_guard<std::mutex> lock(s.count_mutex);
  if (s.count_stale.load() && s.recount().ok()) s.count_stale = false;
  return s.count;
}

template <class Key>
std::uint64_t rocksdb_store<Key>::max_version() const noexcept {
  return state_->max_version;
}

template <class Key>
status rocksdb_store<Key>::pull(const Key* keys, std::size_t n, float* rows_out, bool* found_out,
                                std::uint64_t* versions_out) {
  auto& s = *state_;
  if (n == 0) return {};
  if (!keys || !found_out || (!rows_out && s.options.row_width))
    return status::invalid_argument(s.who + ": pull needs keys, rows_out and found_out");
  if (n >= 0xFFFFFFFFu) return status::invalid_argument(s.who + ": batch too large");
  std::vector<std::uint64_t> su;
  std::vector<std::uint32_t> pos;
  s.sort_keys(keys, n, su, pos);
  const std::size_t row_bytes = s.options.row_width * sizeof(float);
  const std::size_t vbytes = s.value_bytes();
  first_error err;
  s.for_batches(n, [&](std::size_t b, std::size_t e) {
    s.multi_get(su.data(), b, e,
                [&](std::size_t j, const rocksdb::Status& st, const rocksdb::PinnableSlice& v) {
                  const std::size_t i = pos[j];
                  if (st.ok()) {
                    if (v.size() != vbytes) {
                      found_out[i] = false;
                      err.set(status::corruption(s.who + ": the value of key " + key_text(keys[i]) +
                                                 " has " + std::to_string(v.size()) +
                                                 " bytes, expected " + std::to_string(vbytes)));
                      return;
                    }
                    found_out[i] = true;
                    if (rows_out)
                      std::memcpy(rows_out + i * s.options.row_width, v.data(), row_bytes);
                    if (versions_out) std::memcpy(&versions_out[i], v.data() + row_bytes, 8);
                  } else {
                    found_out[i] = false;
                    if (!st.IsNotFound())
                      err.set(from_rocksdb(st, s.who + ": reading key " + key_text(keys[i])));
                  }
                });
  });
  return err.st;
}

template <class Key>
status rocksdb_store<Key>::contains(const Key* keys, std::size_t n, bool* found_out) {
  auto& s = *state_;
  if (n == 0) return {};
  if (!keys || !found_out)
    return status::invalid_argument(s.who + ": contains needs keys and found_out");
  // A pull that copies nothing.
  std::vector<std::uint64_t> su;
  std::vector<std::uint32_t> pos;
  s.sort_keys(keys, n, su, pos);
  first_error err;
  s.for_batches(n, [&](std::size_t b, std::size_t e) {
    s.multi_get(su.data(), b, e,
                [&](std::size_t j, const rocksdb::Status& st, const rocksdb::PinnableSlice&) {
                  found_out[pos[j]] = st.ok();
                  if (!st.ok() && !st.IsNotFound())
                    err.set(from_rocksdb(st, s.who + ": reading key " + key_text(keys[pos[j]])));
                });
  });
  return err.st;
}

template <class Key>
status rocksdb_store<Key>::push(const Key* keys, std::size_t n, const float* rows,
                                const std::uint64_t* versions) {
  auto& s = *state_;
  if (n == 0) return {};
  if (!keys || !rows) return status::invalid_argument(s.who + ": push needs keys and rows");
  if (n >= 0xFFFFFFFFu) return status::invalid_argument(s.who + ": batch too large");
  EMBCACHE_RETURN_IF_ERROR(s.before_write());
  std::vector<std::uint64_t> su;
  std::vector<std::uint32_t> pos;
  s.sort_keys(keys, n, su, pos);
  const std::size_t m = s.dedupe_keep_last(su, pos);
  const std::uint64_t stamp = s.max_version + 1;
  const std::size_t width = s.options.row_width;
  std::atomic<std::size_t> added{0};
  std::atomic<std::uint64_t> vmax{0};
  first_error err;
  const auto wo = s.write_options();
  const bool count = s.options.count_on_push && !s.count_stale;
  const std::size_t batch = std::max<std::size_t>(1, s.options.push_batch_keys);
  const std::size_t value_bytes = s.value_bytes();
  s.for_batches(m, batch, [&](std::size_t b, std::size_t e) {
    if (err.failed) return;
    std::size_t fresh = 0;
    if (count) {
      s.multi_get(su.data(), b, e,
                  [&](std::size_t, const rocksdb::Status& st, const rocksdb::PinnableSlice&) {
                    if (st.IsNotFound())
                      ++fresh;
                    else if (!st.ok())
                      err.set(from_rocksdb(st, s.who + ": push lookup"));
                  });
      if (err.failed) return;
    }
    // Reserved up front: a batch that grows by doubling copies its rows several times.
    rocksdb::WriteBatch wb((e - b) * (value_bytes + sizeof(Key) + 16) + 64);
    std::uint64_t local_max = 0;
    char kb[sizeof(Key)];
    for (std::size_t j = b; j < e; ++j) {
      const std::size_t i = pos[j];
      const std::uint64_t v = versions ? versions[i] : stamp;
      local_max = std::max(local_max, v);
      encode_key<Key>(su[j], kb);
      rocksdb::Slice key(kb, sizeof(Key));
      rocksdb::Slice parts[2] = {
          rocksdb::Slice(reinterpret_cast<const char*>(rows + i * width), width * sizeof(float)),
          rocksdb::Slice(reinterpret_cast<const char*>(&v), 8)};
      rocksdb::Status ps =
          wb.Put(s.cf, rocksdb::SliceParts(&key, 1), rocksdb::SliceParts(parts, 2));
      if (!ps.ok()) {
        err.set(from_rocksdb(ps, s.who + ": building a write batch"));
        return;
      }
    }
    rocksdb::Status ws = s.db->db->Write(wo, &wb);
    if (!ws.ok()) {
      err.set(from_rocksdb(ws, s.who + ": writing " + std::to_string(e - b) + " rows"));
      return;
    }
    added += fresh;
    std::uint64_t cur = vmax.load();
    while (cur < local_max && !vmax.compare_exchange_weak(cur, local_max)) {
    }
  });
  // A blind push may have added keys: size() counts them when asked. A failed push may have
  // written some batches, so the count is stale either way.
  if (!count || err.failed) s.count_stale = true;
  s.count += added.load();
  s.max_version = std::max(s.max_version, vmax.load());
  return err.st;
}

template <class Key>
status rocksdb_store<Key>::erase(const Key* keys, std::size_t n, std::size_t* erased_out) {
  auto& s = *state_;
  if (erased_out) *erased_out = 0;
  if (n == 0) return {};
  if (!keys) return status::invalid_argument(s.who + ": erase needs keys");
  if (n >= 0xFFFFFFFFu) return status::invalid_argument(s.who + ": batch too large");
  EMBCACHE_RETURN_IF_ERROR(s.before_write());
  std::vector<std::uint64_t> su;
  std::vector<std::uint32_t> pos;
  s.sort_keys(keys, n, su, pos);
  const std::size_t m = s.dedupe_keep_last(su, pos);
  std::atomic<std::size_t> removed{0};
  first_error err;
  const auto wo = s.write_options();
  s.for_batches(m, [&](std::size_t b, std::size_t e) {
    if (err.failed) return;
    rocksdb::WriteBatch batch;
    std::size_t c = 0;
    s.multi_get(su.data(), b, e,
                [&](std::size_t j, const rocksdb::Status& st, const rocksdb::PinnableSlice&) {
                  if (st.ok()) {
                    char kb[sizeof(Key)];
                    encode_key<Key>(su[j], kb);
                    rocksdb::Status ds = batch.Delete(s.cf, rocksdb::Slice(kb, sizeof(Key)));
                    if (!ds.ok()) err.set(from_rocksdb(ds, s.who + ": building a delete batch"));
                    ++c;
                  } else if (!st.IsNotFound()) {
                    err.set(from_rocksdb(st, s.who + ": erase lookup"));
                  }
                });
    if (c == 0 || err.failed) return;
    rocksdb::Status ws = s.db->db->Write(wo, &batch);
    if (!ws.ok()) {
      err.set(from_rocksdb(ws, s.who + ": deleting rows"));
      return;
    }
    removed += c;
  });
  s.count -= std::min(s.count, removed.load());
  if (erased_out) *erased_out = removed.load();
  return err.st;
}

template <class Key>
status rocksdb_store<Key>::for_each_impl(bool changed_only, std::uint64_t version,
                                         std::size_t batch_size, const store_batch_fn<Key>& fn) {
  auto& s = *state_;
  if (batch_size == 0) return status::invalid_argument(s.who + ": for_each with batch_size 0");
  if (!fn) return status::invalid_argument(s.who + ": for_each with an empty callback");
  const std::size_t width = s.options.row_width;
  const std::size_t row_bytes = width * sizeof(float);
  // The count may be stale after blind pushes: the buffers grow up to batch_size as needed.
  const std::size_t cap = std::min(batch_size, std::max<std::size_t>(s.count, 1));
  std::vector<Key> k;
  std::vector<float> r;
  std::vector<std::uint64_t> v;
  k.reserve(cap);
  r.reserve(cap * width);
  v.reserve(cap);
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;  // a full scan would evict the rows that pulls need
  ro.readahead_size = 2 << 20;
  std::unique_ptr<rocksdb::Iterator> it(s.db->db->NewIterator(ro, s.cf));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto key = it->key();
    auto val = it->value();
    if (key.size() != sizeof(Key) || val.size() != s.value_bytes())
      return status::corruption(s.who + ": an entry with a " + std::to_string(key.size()) +
                                "-byte key and a " + std::to_string(val.size()) +
                                "-byte value, expected " + std::to_string(sizeof(Key)) + " and " +
                                std::to_string(s.value_bytes()));
    std::uint64_t ver;
    std::memcpy(&ver, val.data() + row_bytes, 8);
    if (changed_only && ver <= version) continue;
    k.push_back(from_sortable<Key>(decode_key<Key>(key.data())));
    v.push_back(ver);
    r.resize(r.size() + width);
    std::memcpy(r.data() + r.size() - width, val.data(), row_bytes);
    if (k.size() == batch_size) {
      EMBCACHE_RETURN_IF_ERROR(fn(k.data(), r.data(), v.data(), k.size()));
      k.clear();
      r.clear();
      v.clear();
    }
  }
  EMBCACHE_RETURN_IF_ERROR(from_rocksdb(it->status(), s.who + ": iteration"));
  if (!k.empty()) EMBCACHE_RETURN_IF_ERROR(fn(k.data(), r.data(), v.data(), k.size()));
  return {};
}

template <class Key>
status rocksdb_store<Key>::for_each(std::size_t batch_size, const store_batch_fn<Key>& fn) {
  return for_each_impl(false, 0, batch_size, fn);
}

template <class Key>
status rocksdb_store<Key>::for_each_changed_since(std::uint64_t version, std::size_t batch_size,
                                                  const store_batch_fn<Key>& fn) {
  return for_each_impl(true, version, batch_size, fn);
}

template <class Key>
status rocksdb_store<Key>::flush() {
  auto& s = *state_;
  EMBCACHE_RETURN_IF_ERROR(s.write_meta(false));
  rocksdb::FlushOptions fo;
  fo.wait = true;
  std::vector<rocksdb::ColumnFamilyHandle*> cfs{s.cf, s.db->default_cf()};
  return from_rocksdb(s.db->db->Flush(fo, cfs), s.who + ": flush");
}

template <class Key>
status rocksdb_store<Key>::checkpoint(const std::string& dir) {
  EMBCACHE_RETURN_IF_ERROR(flush());
  return db_->checkpoint(dir).with_context(state_->who);
}

template class rocksdb_store<std::int64_t>;
template class rocksdb_store<std::uint32_t>;

}  // namespace embcache
