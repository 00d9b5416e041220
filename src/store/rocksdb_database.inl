// rocksdb_database: opening a database with all its column families (tuned options,
// RocksDB's log on stderr), flush and checkpoint of every table. Part of rocksdb_store.cpp, which
// includes it.
#pragma once

#include "format/checked_io.hpp"
#include "rocksdb_direct_reads.inl"
#include "rocksdb_encoding.inl"

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

// Where a push that bypasses the memtables writes its SST files before they are ingested (moved
// into the database). Whatever is left there belongs to no database: a process killed between
// writing and ingesting. Opening the database removes it.
std::string ingest_folder(const std::string& db_path) { return db_path + "/embcache-ingest"; }

// The data block size of a table of `row_width` floats: the smallest multiple of 4 KiB that holds
// one entry (8-byte key, the row, its version, and a block entry's own bytes), unless set.
std::size_t derived_block_bytes(const rocksdb_store_options& o, std::size_t row_width) {
  if (o.block_bytes) return o.block_bytes;
  const std::size_t entry = 8 + row_width * sizeof(float) + 8 + 32;
  return (entry + 4095) / 4096 * 4096;
}

// The tuning fields' ranges; a bad value is invalid_argument naming the field.
status check_tuning(const rocksdb_store_options& o, const std::string& who) {
  auto bad = [&](const char* field, const std::string& value, const char* range) {
    return status::invalid_argument(who + ": rocksdb_store_options::" + field + " is " + value +
                                    ", expected " + range);
  };
  if (o.block_bytes &&
      (o.block_bytes < rocksdb_min_block_bytes || o.block_bytes > rocksdb_max_block_bytes))
    return bad("block_bytes", std::to_string(o.block_bytes), "0 (derived) or 1 KiB to 256 MiB");
  if (o.read_threads < 0 || o.read_threads > 256)
    return bad("read_threads", std::to_string(o.read_threads), "0 (the space's threads) to 256");
  if (o.max_subcompactions < 1 || o.max_subcompactions > 64)
    return bad("max_subcompactions", std::to_string(o.max_subcompactions), "1 to 64");
  if (o.compaction != rocksdb_compaction::level && o.compaction != rocksdb_compaction::universal)
    return bad("compaction", std::to_string(static_cast<int>(o.compaction)), "level or universal");
  if (o.read_path != rocksdb_read_path::automatic && o.read_path != rocksdb_read_path::multi_get &&
      o.read_path != rocksdb_read_path::scan)
    return bad("read_path", std::to_string(static_cast<int>(o.read_path)),
               "automatic, multi_get or scan");
  if (o.scan_batch_keys < 1 || o.scan_batch_keys > (std::size_t{1} << 24))
    return bad("scan_batch_keys", std::to_string(o.scan_batch_keys), "1 to 2^24");
  if (o.scan_readahead_bytes > (std::size_t{64} << 20))
    return bad("scan_readahead_bytes", std::to_string(o.scan_readahead_bytes),
               "0 (RocksDB's own) to 64 MiB");
  if (o.bloom_bits_per_key < 0 || o.bloom_bits_per_key > 100)
    return bad("bloom_bits_per_key", std::to_string(o.bloom_bits_per_key), "0 (none) to 100");
  return {};
}

}  // namespace

struct rocksdb_database::impl {
  std::string path;
  rocksdb::Options options;
  std::shared_ptr<rocksdb::Cache> cache;
  // The block-based table options every column family shares but its block size.
  rocksdb::BlockBasedTableOptions table;
  rocksdb::DB* db = nullptr;
  mutable std::mutex mutex;
  std::map<std::string, rocksdb::ColumnFamilyHandle*> cfs;
  // Each column family's SST data block size: set when its table is created, kept by the
  // database's OPTIONS file across reopens (open()).
  std::map<std::string, std::size_t> block_bytes;
  std::set<std::string> open_tables;

  ~impl() {
    if (!db) return;
    for (auto& [name, h] : cfs) db->DestroyColumnFamilyHandle(h);
    cfs.clear();
    db->Close().PermitUncheckedError();
    delete db;
  }

  rocksdb::ColumnFamilyHandle* default_cf() const { return db->DefaultColumnFamily(); }

  // The options of a column family whose SST data blocks are `block_bytes` long.
  rocksdb::ColumnFamilyOptions cf_options(std::size_t block_bytes) const {
    rocksdb::ColumnFamilyOptions cf(options);
    rocksdb::BlockBasedTableOptions t = table;
    t.block_size = block_bytes;
    cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
    return cf;
  }
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
  EMBCACHE_RETURN_IF_ERROR(check_tuning(o, who));
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
  opt.use_direct_reads = o.use_direct_reads;
  opt.use_direct_io_for_flush_and_compaction = o.use_direct_io_for_flush_and_compaction;
  // Direct I/O reads only what is asked for: compaction's sequential reads need readahead.
  if (o.use_direct_io_for_flush_and_compaction) opt.compaction_readahead_size = 2 << 20;
  // The blocks of a MultiGet batch in one submission (rocksdb_direct_reads.inl).
  if (o.use_direct_reads && o.batched_direct_reads && io_uring_usable())
    opt.env = batched_reads_env();
  if (o.row_cache_bytes) opt.row_cache = rocksdb::NewLRUCache(o.row_cache_bytes);
  opt.max_subcompactions = static_cast<std::uint32_t>(o.max_subcompactions);
  if (o.compaction == rocksdb_compaction::universal) {
    opt.compaction_style = rocksdb::kCompactionStyleUniversal;
  } else {
    opt.compaction_style = rocksdb::kCompactionStyleLevel;
    opt.level_compaction_dynamic_level_bytes = o.dynamic_level_bytes;
  }
  rocksdb::BlockBasedTableOptions& table = p->table;
  p->cache = rocksdb::NewLRUCache(o.block_cache_bytes);
  table.block_cache = p->cache;
  if (o.bloom_bits_per_key > 0)
    table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(o.bloom_bits_per_key, false));
  table.whole_key_filtering = true;
  table.cache_index_and_filter_blocks = o.cache_index_and_filter_blocks;
  // Kept in the cache as long as their table is open: evicting them costs an extra read on
  // the next lookup.
  table.pin_l0_filter_and_index_blocks_in_cache = o.cache_index_and_filter_blocks;
  if (o.partition_index_and_filters) {
    table.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
    table.partition_filters = o.bloom_bits_per_key > 0;
    table.pin_top_level_index_and_filter = true;
  }
  // With direct reads, a block that starts on a page boundary is read in the fewest pages
  // (rows are stored uncompressed, which block alignment requires).
  table.block_align = o.use_direct_reads;
  table.block_size = derived_block_bytes(o, o.row_width);
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
  // Each existing column family opens with the blocks it was created with (the latest OPTIONS
  // file records them), not those of the table that opens the database.
  std::map<std::string, std::size_t> recorded;
  if (names.size() > 1) {
    rocksdb::ConfigOptions co;
    co.ignore_unknown_options = true;
    co.env = opt.env;
    rocksdb::DBOptions loaded_db;
    std::vector<rocksdb::ColumnFamilyDescriptor> loaded;
    if (rocksdb::LoadLatestOptions(co, o.path, &loaded_db, &loaded, &p->cache).ok()) {
      for (const auto& c : loaded) {
        const auto* t = c.options.table_factory
                            ? c.options.table_factory->GetOptions<rocksdb::BlockBasedTableOptions>()
                            : nullptr;
        if (t) recorded[c.name] = t->block_size;
      }
    }
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descs;
  for (auto& n : names) {
    const auto r = recorded.find(n);
    const std::size_t block = r != recorded.end() ? r->second : table.block_size;
    descs.emplace_back(n, p->cf_options(block));
    p->block_bytes[n] = block;
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  if (o.low_priority_compaction) {
    // Each compaction thread lowers its own priority when it next takes a job. An Env without
    // the call (not this build's) leaves the priority as it is.
    opt.env->LowerThreadPoolCPUPriority(rocksdb::Env::Priority::LOW, rocksdb::CpuPriority::kLow)
        .PermitUncheckedError();
  }
  EMBCACHE_RETURN_IF_ERROR(
      from_rocksdb(rocksdb::DB::Open(opt, o.path, descs, &handles, &p->db), who));
  fs::remove_all(ingest_folder(o.path), ec);  // the database's lock is held: no writer uses it
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
