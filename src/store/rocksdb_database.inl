// rocksdb_database: opening a database with all its column families (tuned options,
// RocksDB's log on stderr), flush and checkpoint of every table. Part of rocksdb_store.cpp, which
// includes it.
#pragma once

#include "rocksdb_encoding.inl"
#include "format/checked_io.hpp"

namespace embcache {
namespace {

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

}  // namespace

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
  return detail::sync_folder(detail::parent_dir(dir));
}

}  // namespace embcache
