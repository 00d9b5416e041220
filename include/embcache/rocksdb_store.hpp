/// @file rocksdb_store.hpp
/// @brief Parameter store on SSD through RocksDB (library embcache::rocksdb).
///
/// One column family per table, named after the table; several tables can share one database
/// (rocksdb_database). Keys are stored big-endian (int64 keys with the sign bit flipped) so that
/// iteration runs in numeric key order; a value is the row's floats followed by its 8-byte
/// version, both in the host's byte order. Each table also keeps a metadata entry in the default
/// column family: its schema (key type, dim, optimizer and state width, row width, format
/// version), written when the table is created, and its row count and highest version. A store
/// refuses a table whose schema differs from the caller's, and a table that already holds rows
/// unless `existing_rows` is reuse. docs/stores.md explains every tuning choice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "embcache/param_store.hpp"
#include "embcache/space.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// What opening a table that already holds rows does (rocksdb_store_options::existing_rows).
enum class existing_rows_policy : std::uint8_t {
  refuse,  ///< invalid_argument naming the table: a fresh run must not train from old rows
  reuse,   ///< the rows are used (reopening a checkpoint or the live database, resuming)
};

/// How the database compacts its SST files (rocksdb_store_options::compaction).
enum class rocksdb_compaction : std::uint8_t {
  level,      ///< leveled: one sorted run per level, the fewest reads per lookup and the least
              ///< space, more rewriting per pass
  universal,  ///< tiered: a pass's write-back is rewritten fewer times, at the cost of up to
              ///< twice the space and more runs for a lookup to probe (bloom filters help)
};

/// How pull() and contains() read a table (rocksdb_store_options::read_path).
enum class rocksdb_read_path : std::uint8_t {
  /// Each call chooses: a scan where the table holds few rows between the keys asked for, point
  /// lookups elsewhere, from what its scans have cost so far (rocksdb_store::read_counts). The
  /// first call, and while point lookups win one call in rocksdb_scan_probe_interval, scans its
  /// first rocksdb_scan_probe_keys keys alone to find out.
  automatic,
  /// Point lookups: sorted MultiGet batches, each key through every sorted run's bloom filter
  /// and index, one block read per row found. Best where the keys are sparse in the table.
  multi_get,
  /// Scans: the sorted keys are merged with an iterator over their range, which reads the
  /// range's blocks in large sequential reads (scan_readahead_bytes) and skips to a key
  /// with a seek only after rocksdb_scan_steps_per_lookup rows. Best where the keys are a
  /// large part of the rows in their range, as a keyset pass's are in a table it mostly covers.
  scan,
};

/// A point lookup costs about as much CPU as this many steps of a scan's iterator
/// (docs/stores.md, "Scans"): a scan moves on by a seek after this many rows without the key it
/// wants, and read_path automatic scans while its steps and seeks (each counted as this many
/// steps) come to fewer per key.
inline constexpr std::uint32_t rocksdb_scan_steps_per_lookup = 16;
/// With read_path automatic, while point lookups win, one call in this many tries a scan of
/// its first rocksdb_scan_probe_keys keys.
inline constexpr std::uint32_t rocksdb_scan_probe_keys = 256;
inline constexpr std::uint32_t rocksdb_scan_probe_interval = 16;

/// The SST data block sizes rocksdb_store_options::block_bytes may set (0 derives it).
inline constexpr std::size_t rocksdb_min_block_bytes = 1024;
inline constexpr std::size_t rocksdb_max_block_bytes = std::size_t{256} << 20;

/// Options of a RocksDB store and of the database behind it. Fields marked database-wide are
/// taken from the options the database is opened with (the first store, or
/// rocksdb_database::open); docs/stores.md ("Tuning for a table larger than memory") gives the
/// settings for a table that does not fit in memory.
struct rocksdb_store_options {
  /// Folder of the database; default "" (must be set).
  std::string path;
  /// Table name, also the column family's name; default "" (must be set, not "default").
  std::string table_name;
  /// Floats per row; default 0 (must be set).
  std::size_t row_width = 0;
  /// Embedding floats at the start of each row, part of the table's schema; default 0 = the
  /// whole row (no optimizer state). The rest of the row (row_width - dim) is optimizer state.
  std::size_t dim = 0;
  /// Name of the optimizer whose state fills the rest of the row (e.g. "adam"), part of the
  /// table's schema; default "" = none.
  std::string optimizer;
  /// Opening a table that already holds rows; default refuse (invalid_argument naming the
  /// table), so that a new run on an old store_path does not silently train from its rows.
  existing_rows_policy existing_rows = existing_rows_policy::refuse;
  /// Creates the database and the table's column family when absent; default true.
  bool create_if_missing = true;
  /// Block cache shared by every table of the database; default 1 GiB.
  std::size_t block_cache_bytes = std::size_t{1} << 30;
  /// Size of one memtable; default 256 MiB (a pass write-back fits in few flushes).
  std::size_t write_buffer_bytes = std::size_t{256} << 20;
  /// Memtables per column family before writes stall; default 4.
  int max_write_buffers = 4;
  /// Bits per key of the bloom filter; default 10 (about 1% false positives); 0 = no filter.
  int bloom_bits_per_key = 10;
  /// Size of the table's SST data blocks (its column family's); default 0 = derived from the
  /// row width: the smallest multiple of 4 KiB that holds one row's entry (key, value,
  /// per-entry overhead), so that a point read of a row costs one aligned read of the disk.
  /// Set: 1 KiB to 256 MiB. Fixed when the table is created: a reopened table keeps its size
  /// whatever table opens the database (0), and another nonzero size is invalid_argument.
  std::size_t block_bytes = 0;
  /// Reads SST files with direct I/O (O_DIRECT), database-wide: the page cache neither serves
  /// nor holds the rows, only the block and row caches do, so the process's memory stays
  /// bounded by them; default false (the page cache helps a table that fits in memory). The
  /// file system must support O_DIRECT (tmpfs does not: reads then fail with io_error).
  bool use_direct_reads = false;
  /// Writes flushes and compactions with direct I/O, database-wide (compaction reads ahead
  /// 2 MiB then); default false.
  bool use_direct_io_for_flush_and_compaction = false;
  /// Submits the blocks a MultiGet reads from one SST file together (io_uring: one system call
  /// and one wake-up for up to 32 blocks) instead of one pread each, database-wide; used with
  /// use_direct_reads where rocksdb_batched_reads_available() (else RocksDB reads them one by
  /// one, as with false). Default true.
  bool batched_direct_reads = true;
  /// Partitioned (two-level) index and partitioned bloom filters, database-wide: only the top
  /// level stays in memory, the partitions go through the block cache, so the index of a table
  /// far larger than memory does not have to fit in it; default false.
  bool partition_index_and_filters = false;
  /// Charges index and filter blocks to the block cache (bounded by block_cache_bytes) instead
  /// of holding them beside it, database-wide; default false.
  bool cache_index_and_filter_blocks = false;
  /// Row cache: whole rows by key, in front of the block cache, database-wide; default 0 = none.
  std::size_t row_cache_bytes = 0;
  /// Concurrent MultiGet batches of one pull, contains or erase: each batch blocks on its
  /// reads, so more batches in flight than cores keep the SSD's queue full when reads miss
  /// the caches; default 0 = the space's threads. Set: 0 to 256. (Debian's RocksDB has no
  /// io_uring and no coroutines, so its own async MultiGet is not available;
  /// batched_direct_reads gives each batch's reads of one file a queue of their own.)
  int read_threads = 0;
  /// How pull() and contains() read: point lookups, scans, or each call's choice; default
  /// automatic.
  rocksdb_read_path read_path = rocksdb_read_path::automatic;
  /// Keys per batch of a scan (each batch one iterator over its keys' range, batches in parallel
  /// as read_threads allows); default 8192. Set: 1 to 2^24.
  std::size_t scan_batch_keys = 8192;
  /// Bytes a scan reads ahead in each sorted run it passes through (one buffer per run and
  /// batch in flight; a probe reads at most 32 KiB ahead); default 256 KiB. Set: 0 (RocksDB's
  /// own, growing from 8 KiB: far slower with direct reads, docs/stores.md) to 64 MiB.
  std::size_t scan_readahead_bytes = std::size_t{256} << 10;
  /// Compaction style, database-wide; default level.
  rocksdb_compaction compaction = rocksdb_compaction::level;
  /// Level sizes derived from the last level's (leveled compaction only), database-wide: keeps
  /// the space amplification of a table rewritten pass after pass near 1.1; default false.
  bool dynamic_level_bytes = false;
  /// Threads one compaction is split into, database-wide; default 1. Set: 1 to 64.
  int max_subcompactions = 1;
  /// Background flush and compaction threads; default 4.
  int background_jobs = 4;
  /// Runs compactions at the lowest CPU priority (nice 19 on Linux) so that, where training
  /// needs every core, they take what it leaves: a compaction can wait, the training thread
  /// cannot. Flushes keep their priority. Process-wide once any database opens with it:
  /// RocksDB's compaction threads are shared by every database of the process. Default false.
  bool low_priority_compaction = false;
  /// Skips the write-ahead log for pushes; default true: flush() and checkpoint() make pushed
  /// rows durable, and a crash loses only what was pushed since the last of them.
  bool disable_wal = true;
  /// Writes RocksDB's LOG file in the database folder; default false: warnings and errors go
  /// to stderr (a LOG file on a full disk makes this RocksDB release abort on the next line).
  bool log_file = false;
  /// Keys per MultiGet / WriteBatch; default 2048.
  std::size_t batch_keys = 2048;
  /// Keys per WriteBatch of a push; default 16384 (fewer, larger writes into the memtable).
  std::size_t push_batch_keys = 16384;
  /// A push of at least this many bytes of values (rows and their versions) bypasses the
  /// memtables: its rows are written as sorted SST files (in parts of about 64 MiB, in parallel)
  /// and ingested in one step. Small memtables then neither stall the push nor leave many small
  /// level-0 files for compaction to merge. Earlier pushes still in the memtables are flushed
  /// first, so a crash finds a prefix of the writes. Default 0 = write_buffer_bytes (a push
  /// that would fill a memtable); SIZE_MAX = never.
  std::size_t ingest_bytes = 0;
  /// Looks every pushed key up first, so that size() stays exact without a scan; default false:
  /// a push writes blindly and the first size() after it counts the table with one scan.
  bool count_on_push = false;
  /// Threads used by bulk calls; default: oneTBB's default (all cores).
  host_space space{};
};

/// Whether batched_direct_reads can take effect in this process: the library was built with
/// liburing and the kernel lets the process set up an io_uring (a seccomp filter, e.g. a
/// container's, or the kernel.io_uring_disabled sysctl may forbid it). Asked once.
bool rocksdb_batched_reads_available() noexcept;

/// What batched_direct_reads has read in this process (since it started, or in a forked child
/// since the parent started): the MultiReads of more than one block that went through a ring,
/// and their blocks (after RocksDB merged neighbouring blocks into one read). blocks /
/// multi_reads is how many reads each submission put in flight.
struct rocksdb_batched_read_counts {
  std::uint64_t multi_reads = 0;
  std::uint64_t blocks = 0;
};
rocksdb_batched_read_counts rocksdb_batched_reads_done() noexcept;

/// What a store's pull() and contains() have read since it opened (rocksdb_store::read_counts).
struct rocksdb_read_counts {
  std::uint64_t keys_looked_up = 0;  ///< keys read by point lookups (MultiGet)
  std::uint64_t keys_scanned = 0;    ///< keys read by scans
  std::uint64_t scan_steps = 0;      ///< iterator steps of those scans (rows passed over)
  std::uint64_t scan_seeks = 0;      ///< seeks of those scans past the first of each batch
};

/// An open RocksDB database that may hold several tables. Shared by the stores opened on it
/// (std::shared_ptr); the database closes when the last of them goes.
class rocksdb_database {
 public:
  /// Opens (or, with `options.create_if_missing`, creates) the database at `options.path`,
  /// with every column family it holds. Only the database-wide fields of `options` are used.
  static result<std::shared_ptr<rocksdb_database>> open(const rocksdb_store_options& options);
  ~rocksdb_database();
  rocksdb_database(const rocksdb_database&) = delete;
  rocksdb_database& operator=(const rocksdb_database&) = delete;

  /// Folder of the database.
  const std::string& path() const noexcept;
  /// Names of the tables the database holds, sorted.
  std::vector<std::string> tables() const;
  /// Flushes the memtables of every table (atomically, with the metadata).
  status flush();
  /// Writes a consistent copy of the whole database (every table) into `dir` with RocksDB's
  /// checkpoint facility (hard links where possible). `dir` must not exist or be empty.
  status checkpoint(const std::string& dir);

  struct impl;
  /// Internal.
  impl& get_impl() noexcept { return *impl_; }

 private:
  explicit rocksdb_database(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// Parameter store of one table in a RocksDB database.
template <class Key>
class rocksdb_store final : public scanning_param_store<Key> {
 public:
  /// Opens the table in its own database at `options.path`. A database or table that is absent
  /// when `create_if_missing` is false gives not_found; a table whose recorded schema (key type,
  /// dim, optimizer, state width, row width) differs from the caller's gives invalid_argument
  /// naming the table and both schemas; so does a table that already holds rows when
  /// `existing_rows` is refuse; a table written by a build that recorded no schema gives
  /// unsupported unless it is empty (then the caller's schema is recorded); a damaged database
  /// gives corruption. A dim larger than row_width is invalid_argument.
  static result<std::unique_ptr<rocksdb_store>> open(const rocksdb_store_options& options);
  /// Opens the table `options.table_name` in a database that is already open (shared).
  static result<std::unique_ptr<rocksdb_store>> open(std::shared_ptr<rocksdb_database> db,
                                                     const rocksdb_store_options& options);
  /// Flushes (see flush()); errors are dropped, call flush() first to see them.
  ~rocksdb_store() override;
  rocksdb_store(const rocksdb_store&) = delete;
  rocksdb_store& operator=(const rocksdb_store&) = delete;

  std::size_t row_width() const noexcept override;
  const std::string& table_name() const noexcept override;
  /// Sorts the keys, then reads them as `read_path` says: sorted MultiGet batches of
  /// `batch_keys`, or scans of `scan_batch_keys`; batches in parallel (`read_threads` at once).
  status pull(const Key* keys, std::size_t n, float* rows_out, bool* found_out,
              std::uint64_t* versions_out = nullptr) override;
  /// Sorted, deduplicated WriteBatches of `push_batch_keys` rows written in parallel, or SST
  /// files ingested at once from `ingest_bytes` on, without reading anything first (unless
  /// `count_on_push`): RocksDB cannot tell an insert from an overwrite, so the row count is
  /// left to size().
  status push(const Key* keys, std::size_t n, const float* rows,
              const std::uint64_t* versions = nullptr) override;
  status erase(const Key* keys, std::size_t n, std::size_t* erased_out = nullptr) override;
  status contains(const Key* keys, std::size_t n, bool* found_out) override;
  /// Exact. After a push without `count_on_push`, the first call scans the table once (an I/O
  /// error during that scan leaves the count of the last exact point).
  std::size_t size() const noexcept override;
  std::uint64_t max_version() const noexcept override;
  /// Writes the metadata and flushes the table's memtables to SST files.
  status flush() override;
  /// flush(), then a RocksDB checkpoint of the whole database into `dir` (every table of a
  /// shared database is in it); open it with open() and `path = dir`.
  status checkpoint(const std::string& dir) override;

  /// What pull() and contains() have read, by which path.
  rocksdb_read_counts read_counts() const noexcept;

  /// The database the table lives in.
  const std::shared_ptr<rocksdb_database>& database() const noexcept { return db_; }

  struct state;

 private:
  rocksdb_store(std::shared_ptr<rocksdb_database> db, std::unique_ptr<state> st);
  /// Iterates in numeric key order over a snapshot; for_each_changed_since scans every row
  /// (versions are not indexed) and keeps those newer than `version`.
  status scan(bool changed_only, std::uint64_t version, std::size_t batch_size,
              const store_batch_fn<Key>& fn) override;

  std::shared_ptr<rocksdb_database> db_;
  std::unique_ptr<state> state_;
};

extern template class rocksdb_store<std::int64_t>;
extern template class rocksdb_store<std::uint32_t>;

}  // namespace embcache
