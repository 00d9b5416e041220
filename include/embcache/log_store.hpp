/// @file log_store.hpp
/// @brief Parameter store on disk for tables larger than memory: rows appended to segment files,
/// found through an index of key to location held in memory.
///
/// Layout (docs/stores.md, "The log store"): one folder per table. `state.json` names the table,
/// its row width and key size, the live segments and how far they are durable. Segments
/// `seg-NNNNNNNN.log` hold records one after the other: a 40-byte header (magic, kind, key,
/// sequence number, version, XXH3 checksum of the header and the row) and, for a row, its
/// `row_width` floats. A push appends; nothing is ever overwritten in place, so a crash can only
/// cut off or garble what was written after the last flush. An erase appends a tombstone.
///
/// Space is reclaimed oldest segment first: while the segments hold more than
/// `max_space_amplification` times the live rows' bytes, the oldest segment's live rows are
/// appended again, the log is made durable, and the segment is deleted. Tombstones in the oldest
/// segment are dropped then (every older record is gone already).
///
/// Reads: a pull sorts its keys' locations and reads runs of nearby records with one pread each
/// (gaps up to `read_gap_bytes`), on `read_threads` threads; every record read is checked (magic,
/// key, checksum) and a damaged one is corruption naming the file and offset. for_each reads the
/// segments in order, sequentially.
///
/// Memory: `memory_bytes() <= memory_bound(rows)`, `rows` the most rows held at once (the index
/// does not shrink): 16 bytes of index a slot, at most 3/4 full (at most 43 bytes a row; while
/// it doubles, the old and the new index are held together), the write buffer and its pending
/// changes, each read thread's buffer and one walk's chunk. A call also holds its own temporaries
/// for the time it runs: a pull 16 bytes a key, an erase 8, an iteration its batch.
///
/// Durability: flush() fdatasyncs the segments written since the last flush and then records
/// them in state.json (written atomically). Opening after a crash keeps every row a flush made
/// durable and replays what reached the disk after it, up to its first damaged record: that
/// record and everything after it are cut off, so the store holds the flushed state plus a
/// prefix of what followed. Damage inside the durable part is corruption. A failed fdatasync, or
/// a failed write that cannot be cut off the file, breaks the store: every later change and
/// flush returns that error (reopen it to go on from what is durable). One process at a time:
/// the folder is locked (`LOCK`). The store holds one file descriptor per segment.
///
/// Concurrency: calls on one store must not overlap (param_store's rule); pull reads in
/// parallel inside. Records are little-endian: a folder moves between little-endian machines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "embcache/param_store.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// Options of a log_store.
struct log_store_options {
  /// Folder of the table (created with its parents when `create_if_missing`); required.
  std::string path;
  /// Name of the table, recorded in state.json and checked on open; required.
  std::string table_name;
  /// Floats per row (embedding + optimizer state); default 0, must be set (> 0).
  std::size_t row_width = 0;
  /// The embedding's width and the optimizer's name, recorded when the folder is created and
  /// checked on open when both are set (0 and "" check nothing).
  std::size_t dim = 0;
  std::string optimizer;
  /// Creates the folder when it holds no table; default true. Otherwise a missing table is
  /// not_found.
  bool create_if_missing = true;
  /// Opens a table that already holds rows; default true. false refuses one with
  /// invalid_argument naming the table (a fresh run must not train from old rows).
  bool reuse_rows = true;
  /// A new segment starts when the current one reaches this size; default 256 MiB (1 MiB to
  /// 512 GiB). Segment ids are not reused: 2^24 - 1 segments can be written over the store's
  /// life (4 PiB at the default).
  std::uint64_t segment_bytes = std::uint64_t{256} << 20;
  /// The segments may hold at most this many times the live rows' bytes (plus two segments)
  /// before the oldest is cleaned; default 2.0 (1.25..16). Lower: less disk, more rewriting.
  double max_space_amplification = 2.0;
  /// Threads of one pull; default 8 (1..256). Each reads its runs with pread.
  std::size_t read_threads = 8;
  /// Records closer than this are read with the bytes between them in one pread; default 32 KiB.
  std::size_t read_gap_bytes = std::size_t{32} << 10;
  /// The most bytes one pread of a pull reads; default 1 MiB (>= one record).
  std::size_t max_read_bytes = std::size_t{1} << 20;
  /// Rows the index is sized for when the store opens; default 0 (it grows on demand, doubling).
  std::size_t expected_rows = 0;
  /// Bytes a push gathers before each write; default 8 MiB (>= one record).
  std::size_t write_buffer_bytes = std::size_t{8} << 20;
  /// Reads and writes the segments with O_DIRECT; default false. The page cache then holds none
  /// of the table (a memory cgroup charges the process only for what it holds itself) and
  /// writes cost no copy; each write is padded to 4 KiB with a pad record, and a pull reads
  /// whole 4 KiB blocks. The folder's file system must accept O_DIRECT (direct_io_supported):
  /// opening a segment fails otherwise, with the system's reason.
  bool direct_io = false;
};

/// Whether the file system holding `path` (or its nearest existing parent folder) accepts
/// O_DIRECT files (tmpfs before Linux 6.6 does not). Creates and removes a probe file there.
bool direct_io_supported(const std::string& path);

/// Counters of a log_store since it was opened.
struct log_store_counters {
  std::uint64_t rows_pulled = 0;       ///< rows found by pull
  std::uint64_t reads = 0;             ///< preads of pulls
  std::uint64_t bytes_read = 0;        ///< bytes those preads read
  std::uint64_t bytes_appended = 0;    ///< record bytes written (pushes, erases and cleaning)
  std::uint64_t bytes_cleaned = 0;     ///< of those, live rows rewritten by cleaning
  std::uint64_t segments_cleaned = 0;  ///< segments deleted by cleaning
};

/// Parameter store of one table in a folder of append-only segment files.
template <class Key>
class log_store final : public scanning_param_store<Key> {
 public:
  /// Opens (or creates) the table at `options.path`. Bad options are invalid_argument naming
  /// the field; a folder without a table when `create_if_missing` is false is not_found; a folder
  /// of another table is not_found naming both; another row width, key size, dim or optimizer
  /// is invalid_argument naming both ("row_width 7 ..., expected 6"); rows present with
  /// `reuse_rows` false are invalid_argument; a damaged durable part, a missing segment, a
  /// segment that is not a regular file or segments without state.json are corruption naming
  /// the file (and offset); a folder locked by another process is invalid_argument. The folder
  /// is changed (a torn tail cut, leftover segments removed) only once the open is accepted.
  static result<std::unique_ptr<log_store>> open(const log_store_options& options);
  ~log_store() override;
  log_store(const log_store&) = delete;
  log_store& operator=(const log_store&) = delete;

  std::size_t row_width() const noexcept override;
  const std::string& table_name() const noexcept override;
  status pull(const Key* keys, std::size_t n, float* rows_out, bool* found_out,
              std::uint64_t* versions_out = nullptr) override;
  /// Appends the rows, then cleans the oldest segments while the space bound is exceeded. A
  /// failed write (a full disk: out_of_space) leaves the store as it was before the batch's
  /// first unwritten record; the rows written before it are in. A failure of the cleaning is
  /// returned though every row of the batch is in (pushing them again is harmless). Without
  /// `versions`, a store whose max_version is 2^64 - 1 refuses with capacity_exceeded.
  status push(const Key* keys, std::size_t n, const float* rows,
              const std::uint64_t* versions = nullptr) override;
  status erase(const Key* keys, std::size_t n, std::size_t* erased_out = nullptr) override;
  status contains(const Key* keys, std::size_t n, bool* found_out) override;
  std::size_t size() const noexcept override;
  std::uint64_t max_version() const noexcept override;
  status flush() override;
  /// Writes `dir` as a log_store folder of this table holding the live rows in segments of at
  /// most segment_bytes (fsynced, then renamed into place): open it with `path` = `dir`. A full
  /// disk gives out_of_space and leaves no folder; the store is not changed.
  status checkpoint(const std::string& dir) override;

  /// Bytes of the segments on disk, and of the live rows' records among them.
  std::uint64_t disk_bytes() const noexcept;
  std::uint64_t live_bytes() const noexcept;
  log_store_counters counters() const noexcept;
  /// Bytes of host memory the store holds (index, buffers).
  std::size_t memory_bytes() const noexcept;
  /// The documented upper bound of memory_bytes() for `rows` rows with these options (an index
  /// presized with `expected_rows` counts as that many rows).
  static std::size_t memory_bound(std::size_t rows, const log_store_options& options) noexcept;

  struct impl;

 private:
  explicit log_store(std::unique_ptr<impl> p);
  status scan(bool changed_only, std::uint64_t version, std::size_t batch_size,
              const store_batch_fn<Key>& fn) override;
  std::unique_ptr<impl> impl_;
};

extern template class log_store<std::int64_t>;
extern template class log_store<std::uint32_t>;

}  // namespace embcache
