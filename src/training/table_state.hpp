// What the training cache keeps per table, in named parts: the device cache and its bridge, the
// per-slot residency bookkeeping, the store and the locks around it, the prefetch staging, the
// write-behind rows, the export logs and the boundary's scratch arrays. Plus the small helpers
// every part of the orchestration shares. Private to src/training.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "embcache/training_cache.hpp"
#include "format/model_folder.hpp"
#include "training/cache_bridge.hpp"

namespace embcache::detail {

using clock_type = std::chrono::steady_clock;
inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// The initializer seed of table `table`: equal options give every table its own rows.
inline std::uint64_t fold_seed(std::uint64_t seed, std::size_t table) {
  std::uint64_t x = seed ^ (0x9e3779b97f4a7c15ULL * (table + 1));
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ULL;
  return x ^ (x >> 29);
}

// Keeps the last `ttl` step versions of `c` (all when fewer; none when ttl is 0): what expiry's
// steps rule reads, and what saves record.
inline void trim_step_versions(expiry_clock& c, std::uint64_t ttl) {
  if (c.step_versions.size() > ttl) {
    c.step_versions.erase(c.step_versions.begin(),
                          c.step_versions.end() - static_cast<std::ptrdiff_t>(ttl));
  }
}

// Sorted unique copy, or the input itself when it already is (keyset files are).
template <class Key>
const std::vector<Key>& sorted_unique(const std::vector<Key>& in, std::vector<Key>& scratch) {
  bool ok = true;
  for (std::size_t i = 1; i < in.size() && ok; ++i) ok = in[i - 1] < in[i];
  if (ok) return in;
  scratch = in;
  std::sort(scratch.begin(), scratch.end());
  scratch.erase(std::unique(scratch.begin(), scratch.end()), scratch.end());
  return scratch;
}

// What the training cache tracks of a table's residency. The per-slot bookkeeping (which rows
// are dirty, which belong to a keyset) lives in the cache itself (embedding_cache::mark_synced,
// set_marks, select_victims, gather_dirty): nothing here grows with the table.
struct residency_book {
  // The keyset mark of the current pass's keys (set by its begin_pass; 0 before the first). The
  // prefetch marks the next keyset's resident keys with a later mark, so the rows marked below
  // the current one are outside both keysets.
  std::uint32_t mark_epoch = 0;
  // The last mark handed out (marks only grow; see next_mark).
  std::uint32_t mark_clock = 0;
  // Counts the calls that change which keys are resident (begin_pass, lookup, erase, load).
  std::uint64_t residency = 0;
};

// The table's store and the locks that order the caller, the prefetch worker and the flusher.
template <class Key>
struct store_sync {
  std::shared_ptr<param_store<Key>> store;
  std::unique_ptr<std::mutex> store_mutex = std::make_unique<std::mutex>();
  // Held by the prefetch worker while it changes the table's residency during a pass
  // (early_evict, early_insert), and by the caller's calls that read or change residency or the
  // slot bookkeeping while a worker may run. Taken before store_mutex, never after it.
  std::unique_ptr<std::mutex> install_mutex = std::make_unique<std::mutex>();
  // Keys pushed to or erased from the store while a staging exists (prefetch hazard).
  std::vector<Key> writes_log;
  bool log_writes = false;
};

// The rows the prefetch worker staged for the next pass, and what it planned for its boundary.
template <class Key, class Space>
struct staged_pass {
  std::vector<Key> keys;     // sorted
  staging_rows<Space> rows;  // reserved by prefetch() within staging_bytes, never grown past it
  std::vector<std::uint64_t> versions;
  std::vector<std::uint8_t> found;  // 0 = initialized by staging
  // Gather buffer for the rows the next begin_pass writes behind, sized (and its pages touched)
  // by the worker so that the boundary does not pay for page faults.
  staging_rows<Space> gather;
  // The prefetched keyset (sorted, unique), how many of its keys were resident at prefetch time
  // (and since inserted early), and the mark they carry: begin_pass of the same keyset with the
  // residency unchanged needs no lookup.
  std::vector<Key> keyset;
  std::size_t hits = 0;
  std::uint32_t mark = 0;
  std::uint64_t residency = 0;
  std::size_t resident_rows = 0;
  // How many of the keyset's missing rows the worker inserted early.
  std::size_t early_inserted = 0;
  // Missing keys past the staging bound (sorted): begin_pass pulls them. With the bound short of
  // the missing keys, the keys the store did not hold (sorted) are in `fresh`, not staged:
  // begin_pass initializes them (unless the store got them since). When either list has keys,
  // `missing` holds every key still missing after the worker (staged or not, sorted).
  std::vector<Key> unstaged;
  std::vector<Key> fresh;
  std::vector<Key> missing;
  // move_staged_rows: the staged rows are in the cache's free rows free_rows[0, keys.size())
  // (table_state), for begin_pass to move in: in the host space instead of in `rows` (which then
  // holds one batch, stage()), in the cuda space as well.
  bool moved = false;
  // Host space: the residents the boundary evicts, chosen by the worker once it is done, when
  // every eviction candidate (a resident outside the keyset) leaves, so that the choice depends
  // on no version the pass changes: valid while the cache holds `victims_resident` rows and the
  // boundary needs `victims_need` of them (choose_victims_early).
  victim_slots<Space> victims;
  bool victims_ready = false;
  std::size_t victims_resident = 0, victims_need = 0;
  double seconds = 0;
};

// Write-behind: dirty rows that left the device at the last boundary, pushed by the flusher
// thread. Owned by the caller's thread; the flusher only reads them until it is joined.
template <class Key, class Space>
struct write_behind_rows {
  std::vector<Key> keys;
  staging_rows<Space> rows;  // at least keys.size() rows
  std::vector<std::uint64_t> versions;
  bool pushed = false;             // set by the flusher once they are in the store
  double seconds = 0;              // the flusher's push time (set by the flusher)
  double seconds_done = 0;         // pushes over, not yet in a pass's counters
  staging_rows<Space> spare_rows;  // recycled gather buffer (its pages already touched)
  // move_staged_rows: the cache's rows (indices) the leavers were moved out to instead of being
  // gathered; whoever pushes copies them into `rows` first (then clears this).
  std::vector<std::int64_t> detached;
};

// What the next incremental export must cover besides the resident rows changed since.
template <class Key>
struct export_log {
  std::uint64_t last_version = 0;  // versions above this are not exported yet
  std::vector<Key> written;        // keys written back to the store since the last export
  std::vector<Key> erased;         // keys erased since the last export
  std::uint64_t logged_version = 0;  // store rows up to this version are in `written`
  // Entries of `written` that an export collected and has not committed (commit_deltas drops
  // that prefix), and the log's size after its last compaction.
  std::size_t pending = 0, compacted = 0;

  // Slack of `written` past twice its size after the last compaction.
  static constexpr std::size_t compact_slack = std::size_t{1} << 16;

  // Logs keys written back.
  template <class It>
  void note_written(It first, It last) {
    written.insert(written.end(), first, last);
  }
  // An export reads the log as a set, so once it has grown past twice its last compacted size
  // (and the slack), its entries past `pending` are sorted and made unique: a run that never
  // exports keeps at most about two entries per key it wrote, not one per write-back. Called
  // where the sort blocks nothing that waits: by the prefetch worker after its staging, and by
  // the calls that write back synchronously (a boundary without staging, write-backs, on-demand
  // evictions).
  void compact_if_grown() {
    if (written.size() < 2 * compacted + compact_slack) return;
    const auto from = written.begin() + static_cast<std::ptrdiff_t>(pending);
    std::sort(from, written.end());
    written.erase(std::unique(from, written.end()), written.end());
    compacted = written.size();
  }
  // An export collected the first `n` entries (collect_deltas).
  void collected(std::size_t n) { pending = n; }
  // ... and delivered the first `n`: they leave the log (commit_deltas).
  void committed(std::size_t n) {
    n = std::min(n, written.size());
    written.erase(written.begin(), written.begin() + static_cast<std::ptrdiff_t>(n));
    pending = pending > n ? pending - n : 0;
    compacted = std::min(compacted, written.size());
  }
  void clear_written() {
    written.clear();
    pending = compacted = 0;
  }
};

// begin_pass scratch, kept to avoid allocating per pass.
template <class Key>
struct boundary_scratch {
  std::vector<std::int64_t> slots;
  std::vector<std::uint64_t> synced;
};

// One table of the training cache.
template <class Key, class Space>
struct table_state {
  table_options<Key> opt;
  std::size_t index = 0;
  std::size_t state_width = 0;
  std::size_t row_width = 0;
  std::size_t max_resident = 0;  // table_options::max_resident, resolved
  std::unique_ptr<embedding_cache<Key, Space>> cache;
  device_cache_bridge<Key, Space> bridge;  // the cache's calls with host-memory arguments
  residency_book book;
  store_sync<Key> sync;
  staged_pass<Key, Space> staged;
  // move_staged_rows: indices of the cache's rows no slot holds (its spare rows at first), in the
  // space's memory; embedding_cache::install_rows replaces the ones it moves in by the ones it
  // frees, so this stays the list of free rows. Empty while the option is off.
  buffer<std::int64_t, Space> free_rows;
  write_behind_rows<Key, Space> wb;
  export_log<Key> exports;
  boundary_scratch<Key> scratch;
  // Work of the prefetch worker's early install not yet in a pass's counters.
  table_counters worker_counters;
  // Slot ids loaded from a folder's `slot_id` file or given to set_slot_ids(), for save().
  std::unordered_map<Key, std::uint64_t> slot_ids;
  // Feature admission's counts (empty when off).
  admission_sketch admission;
  // Expiry's pass boundaries and recorded version clocks (expiry.inl); empty while it is off.
  expiry_clock expiry;
};

}  // namespace embcache::detail
