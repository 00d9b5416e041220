/// @file embedding_cache.hpp
/// @brief The device embedding cache: a fixed-capacity hash table from keys to rows.
///
/// Layout. Slots are grouped in buckets of `bucket_size`; each slot has a one-byte state (empty,
/// busy, or a 7-bit-ish digest of its key), a key, a version and a score; rows live in a separate
/// pool indexed by slot, so a slot index is also a row index. A key is stored in its home bucket,
/// or, when that bucket was full at insertion, in one of the following buckets (linear probing
/// by bucket); a per-bucket counter of keys that probed past it keeps lookups short and lets
/// erase leave plain empty slots (no tombstones). Every key value is a valid key: occupancy lives
/// in the state byte, never in a reserved key.
///
/// Concurrency. Within one bulk call, keys are processed in parallel. Between host threads,
/// find / find_or_insert / insert_or_assign / lookup_slots / read_slots / assign_slots /
/// mark_updated / mark_synced / set_marks / select_victims / gather_dirty may run at the same
/// time; erase, erase_slots, insert_and_evict, install, export, clear take the table exclusively.
/// In the cuda space, calls are ordered by the space's stream (or the calling thread's, see
/// order_calls_on) and return once done.
///
/// The contract behind "at the same time": lookups are lock-free readers beside inserters (they
/// share the table's lock, held for reading). A slot's state byte is only ever written atomically
/// (compare-and-swap to busy, release store of the digest) and only ever read atomically, the
/// host's SSE2 probes of 16 state bytes included (two relaxed or acquire 64-bit loads, each a
/// plain `mov` on x86); a slot's key, row and metadata are read only after an acquire load of that
/// slot's own state byte saw its digest, which pairs with the release store that published them.
/// So a lookup beside an insert finds a key either not yet or completely, and a key being
/// inserted is absent until published. Rows are plain memory: calls running at the same time
/// must not write a row that another reads or writes (the training cache's prefetch worker
/// installs only keys outside the caller's keyset). The threaded tests run under
/// ThreadSanitizer (preset `tsan`).
///
/// Duplicate keys within one batch:
///  - find, lookup_slots, read_slots: every occurrence gets the same answer;
///  - find_or_insert (and lookup_slots with insert_missing): the key is inserted once; every
///    occurrence sees the same row and slot, and exactly one occurrence reports `inserted` --
///    which one is unspecified (the parallel loop decides, in either space);
///  - insert_or_assign, assign_slots: the last occurrence in batch order wins;
///  - erase: the key is erased once and counted once;
///  - insert_and_evict: occurrences are handled in batch order; the later ones are hits.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <vector>

#include "embcache/buffer.hpp"
#include "embcache/cache_options.hpp"
#include "embcache/detail/config.hpp"
#include "embcache/embedding_cache_ref.hpp"
#include "embcache/space.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// Which rows an export takes: every resident row, or the rows changed since a version. Built
/// only through its named constructors, so a filter always says which of the two it is.
class export_filter {
 public:
  /// Every resident row, whatever its version.
  static constexpr export_filter all() noexcept { return export_filter(false, 0); }
  /// The resident rows whose version is greater than `version` (0: every row written with a
  /// version, i.e. not 0).
  static constexpr export_filter changed_since(std::uint64_t version) noexcept {
    return export_filter(true, version);
  }

  /// True for changed_since(), false for all().
  constexpr bool changed_only() const noexcept { return changed_only_; }
  /// The version of changed_since(); 0 for all().
  constexpr std::uint64_t since() const noexcept { return since_; }
  /// Whether a resident row of this version passes.
  EMBCACHE_HD constexpr bool passes(std::uint64_t version) const noexcept {
    return !changed_only_ || version > since_;
  }

 private:
  constexpr export_filter(bool changed_only, std::uint64_t since) noexcept
      : changed_only_(changed_only), since_(since) {}
  bool changed_only_;
  std::uint64_t since_;
};

/// The order in which embedding_cache::select_victims takes its candidates.
enum class victim_order : std::uint8_t {
  oldest_version,  ///< the least recently written row first (smallest version)
  lowest_score,    ///< the lowest eviction score first (the cache's score_policy)
};

/// Rows copied to host memory by export_to_host, sorted by key.
template <class Key>
struct exported_rows {
  std::vector<Key> keys;
  std::vector<float> rows;  ///< keys.size() * row_width floats
  std::vector<std::uint64_t> versions;
};

namespace detail {

// What embedding_cache::on_own_device returns in the host space.
struct no_device_guard {
  // User-provided, like a real guard's: a held guard is not an unused variable.
  no_device_guard() noexcept {}
  ~no_device_guard() {}
};

// One embedding_cache::call_space_guard in its thread's list of guards, innermost first.
template <class Space>
struct call_space_entry {
  const void* cache;
  Space space;
  call_space_entry* outer;
};

// The calling thread's innermost call_space_guard of a space type (nullptr: none).
template <class Space>
call_space_entry<Space>*& innermost_call_space() noexcept {
  static thread_local call_space_entry<Space>* innermost = nullptr;
  return innermost;
}

// Test access to an embedding_cache's internals (detail/embedding_cache_access.hpp).
struct embedding_cache_access;

}  // namespace detail

/// Fixed-capacity hash table of embedding rows in the memory of `Space`.
///
/// Every pointer argument points into the memory of `Space` (host memory for host_space, device
/// memory for cuda_space). Rows are `row_width() = dim + state_width` floats.
///
/// Versions: each mutating bulk call takes the next value of a version clock that only grows;
/// every row it writes is stamped with it (or with the caller's versions where a call takes
/// them), which is how export finds the rows changed since an earlier version.
///
/// Failures: a status for what can fail at run time (no room: capacity_exceeded); calls that
/// cannot fail return void. Misuse and CUDA failures throw embcache::error; in the cuda space an
/// exhausted device memory throws it with status_code::out_of_device_memory.
template <class Key, class Space>
class embedding_cache {
 public:
  /// Slots per bucket.
  static constexpr std::size_t bucket_size = 128;

  /// While it lives, the bulk calls that the thread which made it makes on one cache run on
  /// another value of the space: in the cuda space, on another stream. See order_calls_on().
  class call_space_guard {
   public:
    ~call_space_guard() { detail::innermost_call_space<Space>() = entry_.outer; }
    call_space_guard(const call_space_guard&) = delete;
    call_space_guard& operator=(const call_space_guard&) = delete;

   private:
    friend class embedding_cache;
    call_space_guard(const embedding_cache* cache, const Space& space)
        : entry_{cache, space, detail::innermost_call_space<Space>()} {
      detail::innermost_call_space<Space>() = &entry_;
    }
    detail::call_space_entry<Space> entry_;
  };

  /// Allocates the table. Throws embcache::error (invalid_argument) for zero slots or a zero dim.
  explicit embedding_cache(const cache_options& options, Space space = {});
  ~embedding_cache();
  embedding_cache(const embedding_cache&) = delete;
  embedding_cache& operator=(const embedding_cache&) = delete;

  /// Copies the row of each found key into `rows_out` (n * row_width; may be nullptr) and sets
  /// `found_out[i]` (may be nullptr). Rows of missing keys are left untouched. Updates scores.
  /// Cannot fail (CUDA failures throw embcache::error).
  void find(const Key* keys, std::size_t n, float* rows_out, bool* found_out);

  /// Finds each key, inserting the missing ones with the initializer. `rows_out` (may be nullptr)
  /// receives every row; `inserted_out` (may be nullptr) says which occurrence inserted (exactly
  /// one of a repeated key's, not necessarily the first). When the
  /// table has no room for some keys it returns capacity_exceeded naming how many and one of
  /// them; the keys that fit are inserted, the others are absent.
  /// `slots_out` (may be nullptr) receives each key's slot (-1 for a key that found no room).
  status find_or_insert(const Key* keys, std::size_t n, float* rows_out, bool* inserted_out,
                        std::int64_t* slots_out = nullptr);

  /// Inserts or overwrites rows. `versions` (may be nullptr) gives each row's version; nullptr
  /// stamps the call's version. Last occurrence of a repeated key wins. `slots_out` (may be
  /// nullptr) receives each key's slot (-1 for a key that found no room).
  status insert_or_assign(const Key* keys, std::size_t n, const float* rows,
                          const std::uint64_t* versions = nullptr,
                          std::int64_t* slots_out = nullptr);

  /// insert_or_assign, then mark_synced(slots, n, synced) and set_marks(slots, n, mark), as one
  /// call that takes the table exclusively (the pass boundary's install of the rows a training
  /// cache brings in): every key is placed first, in one parallel pass over the table, then every
  /// new row is copied into its slot with its metadata, in one parallel pass over the rows, with
  /// no concurrent reader to publish for. `synced` (may be nullptr) leaves the new rows dirty and
  /// the resident ones as they were. Same results as the three calls, the same versions included;
  /// capacity_exceeded as insert_or_assign gives it.
  status install(const Key* keys, std::size_t n, const float* rows, const std::uint64_t* versions,
                 const std::uint64_t* synced, std::uint32_t mark,
                 std::int64_t* slots_out = nullptr);

  /// install() of rows already in the table's memory, moved in without a copy (a cache with
  /// spare rows, cache_options::spare_rows). `rows` (n, the space's memory): on entry the index
  /// of the row that holds each key's row_width floats, a row no slot holds (initially
  /// [slots(), row_count()), afterwards what install_rows and detach_rows give back), all
  /// distinct; on return the index of a row no slot holds any more: a new key's slot takes the
  /// given row and gives back the one it held, a key already resident (or repeated) has the row
  /// copied into its slot as install() does and gives back the row it was given, a key that found
  /// no room gives back its own. Same keys, versions, marks and synced versions as install();
  /// invalid_argument (nothing changed) without spare rows or for an index past row_count().
  status install_rows(const Key* keys, std::size_t n, std::int64_t* rows,
                      const std::uint64_t* versions, const std::uint64_t* synced,
                      std::uint32_t mark, std::int64_t* slots_out = nullptr);

  /// Moves the rows of `slots` (n, the space's memory; distinct, -1 skipped) out of the table
  /// without a copy: each slot takes the row rows[i] (on entry a row no slot holds) and rows[i]
  /// receives the index of the row it held, whose floats stay as they were until the caller
  /// reuses it (for instance to write them back after erase_slots). Keys, versions and the other
  /// metadata stay. invalid_argument (nothing changed) without spare rows or for an index past
  /// row_count().
  status detach_rows(const std::int64_t* slots, std::size_t n, std::int64_t* rows);

  /// Copies n rows of `src` (n * row_width floats, the space's memory) into the table's rows
  /// `rows` (n, the space's memory): rows no slot holds (spare or given back), which install_rows
  /// then moves in; a row a slot holds would change under it with no new version. invalid_argument
  /// (nothing written) without spare rows or for an index past row_count().
  status write_rows(const std::int64_t* rows, std::size_t n, const float* src);

  /// Copies the table's rows `rows` (n, the space's memory; any index below row_count()) into
  /// `dst` (n * row_width floats, the space's memory): rows detach_rows moved out, say.
  /// invalid_argument (nothing copied) without spare rows or for an index past row_count().
  status read_rows(const std::int64_t* rows, std::size_t n, float* dst) const;

  /// Index of the row each of `slots` holds (n, the space's memory; -1 gives -1) into `rows_out`:
  /// its floats are at row_pool() + index * row_width. The slot itself without spare rows. Cannot
  /// fail.
  void row_indices(const std::int64_t* slots, std::size_t n, std::int64_t* rows_out) const;

  /// Removes keys; absent keys are ignored. `erased_out` (may be nullptr, host memory) receives
  /// how many were removed. Cannot fail.
  void erase(const Key* keys, std::size_t n, std::size_t* erased_out = nullptr);

  /// Slot of each key, or -1 when absent (its row: row_indices(); the slot itself without spare
  /// rows). With `insert_missing`, missing keys are
  /// inserted with the initializer (`inserted_out` as in find_or_insert; may be nullptr).
  status lookup_slots(const Key* keys, std::size_t n, std::int64_t* slots_out,
                      bool insert_missing = false, bool* inserted_out = nullptr);

  /// Copies the rows of `slots` into `rows_out`. A slot of -1 leaves its row untouched. Cannot
  /// fail.
  void read_slots(const std::int64_t* slots, std::size_t n, float* rows_out) const;

  /// Overwrites the rows of `slots` (each must hold a key) and stamps versions (`versions` may be
  /// nullptr: the call's version). Last occurrence of a repeated slot wins; -1 is skipped. Cannot
  /// fail.
  void assign_slots(const std::int64_t* slots, std::size_t n, const float* rows,
                    const std::uint64_t* versions = nullptr);

  /// Stamps the call's version on `slots` (after an in-place update of their rows). -1 skipped.
  /// Cannot fail.
  void mark_updated(const std::int64_t* slots, std::size_t n);

  /// The on-demand insert. Missing keys are inserted into their home bucket, with `rows_in[i]`
  /// (may be nullptr: the initializer) and `versions_in[i]` (may be nullptr: the call's
  /// version). When the home bucket is full, its lowest-score row that this call did not touch is
  /// evicted and handed back: `evicted_keys`, `evicted_rows` (n * row_width), `evicted_versions`
  /// receive up to n victims in the order of the keys that displaced them, `*evicted_count`
  /// (host memory) how many. `found_out` (may be nullptr) says which keys were resident and
  /// `slots_out` (may be nullptr) where each key is now (-1 if it could not be placed: then the
  /// call returns capacity_exceeded). `evicted_dirty` (may be nullptr) says of each victim
  /// whether it was dirty (see mark_synced). Deterministic: the result does not depend on
  /// thread count.
  status insert_and_evict(const Key* keys, std::size_t n, const float* rows_in,
                          const std::uint64_t* versions_in, Key* evicted_keys, float* evicted_rows,
                          std::uint64_t* evicted_versions, std::size_t* evicted_count,
                          bool* found_out = nullptr, std::int64_t* slots_out = nullptr,
                          bool* evicted_dirty = nullptr);

  // Bookkeeping for a caller that keeps the rows in sync with a backing store (the training
  // cache does), so that it needs no copy of the slots' metadata: which rows are dirty, which
  // belong to the current keyset, which go when room is needed. Every new row (any insert)
  // starts dirty and unmarked.

  /// Records that the backing store now holds the rows of `slots` at `versions` (may be
  /// nullptr: at their current versions); a row stays clean until its version grows past that
  /// (any write or mark_updated). A version of 0 makes the row dirty. -1 is skipped. Cannot
  /// fail.
  void mark_synced(const std::int64_t* slots, std::size_t n,
                   const std::uint64_t* versions = nullptr);

  /// Sets the keyset mark of `slots` to `mark` (a caller's counter: select_victims keeps the rows
  /// marked at or above a value). -1 is skipped. Cannot fail.
  void set_marks(const std::int64_t* slots, std::size_t n, std::uint32_t mark);

  /// Chooses up to `need` resident rows marked below `keep_mark`, first by `order` (ties by
  /// smallest key, so the choice is deterministic), and writes their slots in ascending slot
  /// order to `victims_out` (room for `need`); `*count_out` (host memory) receives how many:
  /// min(need, candidates). Changes nothing. Cannot fail.
  void select_victims(std::uint32_t keep_mark, std::size_t need, victim_order order,
                      std::int64_t* victims_out, std::size_t* count_out) const;

  /// Of the rows at `slots` (-1 and empty slots skipped), the dirty ones, in input order: their
  /// keys, rows (n * row_width room), versions and slots (each output may be nullptr);
  /// `*count_out` (host memory) receives how many. Changes nothing. Cannot fail.
  void gather_dirty(const std::int64_t* slots, std::size_t n, Key* keys_out, float* rows_out,
                    std::uint64_t* versions_out, std::int64_t* slots_out,
                    std::size_t* count_out) const;

  /// Removes the rows at `slots` (-1 and empty slots skipped; a repeated slot counts once);
  /// `erased_out` (may be nullptr, host memory) receives how many. Cannot fail.
  void erase_slots(const std::int64_t* slots, std::size_t n, std::size_t* erased_out = nullptr);

  /// Number of resident rows that pass `filter`.
  std::size_t count_if(const export_filter& filter) const;

  /// Copies the rows that pass `filter`, sorted by key, into `keys_out`, `rows_out` (may be
  /// nullptr) and `versions_out` (may be nullptr), which hold `max_out` rows; `*count_out` (host
  /// memory) receives how many were written. capacity_exceeded when more than max_out match.
  status export_if(const export_filter& filter, Key* keys_out, float* rows_out,
                   std::uint64_t* versions_out, std::size_t max_out, std::size_t* count_out) const;

  /// export_if into host vectors, in any space. Host memory that cannot be allocated gives
  /// capacity_exceeded naming the bytes.
  result<exported_rows<Key>> export_to_host(const export_filter& filter) const;

  /// Removes every row. The version clock keeps its value.
  void clear();

  /// Resident rows.
  std::size_t size() const noexcept { return size_; }
  /// Slots (the options' slots rounded up to a multiple of bucket_size).
  std::size_t slots() const noexcept { return slots_; }
  /// Rows allocated: slots() plus the spare rows (cache_options::spare_rows).
  std::size_t row_count() const noexcept { return slots_ + options_.spare_rows; }
  /// size() / slots().
  double load_factor() const noexcept {
    return slots_ ? double(size_.load()) / double(slots_) : 0.0;
  }
  std::size_t dim() const noexcept { return options_.dim; }
  std::size_t row_width() const noexcept { return row_width_; }

  /// Bytes of the space's memory one slot of a table with `options` takes: its row
  /// (dim + state_width floats), its state, key, version, score, claim, synced version and mark,
  /// with score_policy::lfu its last-touch op, and with spare rows its row index. Each bucket
  /// (bucket_size slots) adds bytes_per_bucket, its probe counter, and the spare rows
  /// spare_row_bytes. For memory budgets; allocated_bytes() pins it.
  static constexpr std::size_t bytes_per_slot(const cache_options& options) noexcept {
    return (options.dim + options.state_width) * sizeof(float) + sizeof(std::uint8_t) +
           sizeof(Key) + 4 * sizeof(std::uint64_t) + sizeof(std::uint32_t) +
           (options.scores == score_policy::lfu ? sizeof(std::uint64_t) : 0) +
           (options.spare_rows > 0 ? sizeof(std::uint32_t) : 0);
  }
  /// Bytes of the space's memory the spare rows of a table with `options` take.
  static constexpr std::size_t spare_row_bytes(const cache_options& options) noexcept {
    return options.spare_rows * (options.dim + options.state_width) * sizeof(float);
  }
  /// Bytes of the space's memory each bucket adds to its slots (bytes_per_slot).
  static constexpr std::size_t bytes_per_bucket = sizeof(std::uint32_t);
  /// Bytes of scratch per slot of the table that a call over the whole table takes at its peak,
  /// on top of the table: select_victims holds a flag, a position, a candidate and its sort key
  /// per slot, and the sort its second buffers; export_if takes less. For memory budgets (the
  /// sort's own small scratch is not counted).
  static constexpr std::size_t scratch_bytes_per_slot =
      sizeof(std::uint32_t) + sizeof(std::uint64_t) + 2 * sizeof(std::int64_t) +
      2 * (sizeof(Key) > sizeof(std::uint64_t) ? sizeof(Key) : sizeof(std::uint64_t));
  /// Bytes the table's arrays hold in the space's memory.
  std::size_t allocated_bytes() const noexcept;
  const cache_options& options() const noexcept { return options_; }
  /// The space the cache was built with: its memory, and where its bulk calls run by default.
  const Space& space() const noexcept { return space_; }
  /// cuda space: the device the cache was built on (current at construction), which each bulk
  /// call and the destructor make current while they run; host space: 0.
  int device() const noexcept { return device_; }

  /// Until the returned guard is destroyed, the bulk calls the calling thread makes on this cache
  /// run on `space` instead of space(), their scratch memory included: in the cuda space, a
  /// background thread gives its calls a stream of its own, so that they overlap the kernels of
  /// the cache's stream instead of queueing behind them (a current-stream guard, per thread and
  /// per cache). `space` must reach the same memory (the same device), and its stream must
  /// outlive the guard.
  /// The rules of concurrency are unchanged: each call still returns once done, and the table
  /// memory is the same. Guards nest; destroy them in reverse order, on the thread that made them
  /// (a scoped variable does both).
  [[nodiscard]] call_space_guard order_calls_on(const Space& space) const {
    return call_space_guard(this, space);
  }
  /// Where the calling thread's bulk calls on this cache run: its innermost guard's space for
  /// this cache (order_calls_on), else space().
  Space call_space() const noexcept {
    for (auto* e = detail::innermost_call_space<Space>(); e; e = e->outer) {
      if (e->cache == this) return e->space;
    }
    return space_;
  }

  /// Current value of the version clock (the version of the last mutating call).
  std::uint64_t version() const noexcept { return version_clock_; }
  /// Moves the version clock forward to at least `v` (for callers that keep their own counter).
  void advance_version(std::uint64_t v) noexcept {
    std::uint64_t cur = version_clock_.load();
    while (v > cur && !version_clock_.compare_exchange_weak(cur, v)) {
    }
  }

  /// The row pool: row_count() * row_width floats in the space's memory, row r at
  /// row_pool() + r * row_width. Indexed by row, not by slot: the row a slot holds is the one
  /// row_indices() names (slot_rows.hpp translates a batch of slots). Without spare rows
  /// (cache_options::spare_rows) slot s holds row s; with them (a training cache moving its
  /// staged rows by index, training_cache_options::move_staged_rows) rows move between slots at
  /// every install_rows / detach_rows, and a slot's row is anywhere in the pool.
  float* row_pool() noexcept { return rows_.data(); }
  const float* row_pool() const noexcept { return rows_.data(); }

  /// A non-owning read-write view carrying the single-key operations, for the caller's loops
  /// and kernels (embedding_cache_ref.hpp). Valid while the cache lives; clear() keeps it valid.
  embedding_cache_ref<Key> ref() noexcept;
  /// A non-owning read-only view: lookups, rows and the initializer.
  const_embedding_cache_ref<Key> ref() const noexcept;

 private:
  std::uint64_t next_op() noexcept { return ++op_clock_; }
  std::uint64_t next_version() noexcept { return ++version_clock_; }
  status insert_pass(const Key* keys, std::size_t n, std::int64_t* slots, float* rows_out,
                     bool* inserted_out, bool initialize, std::uint64_t op, const char* what);
  status check_no_failures(const std::int64_t* slots, const Key* keys, std::size_t n,
                           const char* what) const;
  // The first of `count` consecutive claim epochs for one call, taken under `lock` (held
  // shared). When they would reach 2^32 the claims are re-based first: zeroed and the epochs
  // restarted at 1, under the exclusive lock (`lock` is released meanwhile and taken again), so a
  // later call's tags are never smaller than an earlier call's (which would skip its writes).
  std::uint64_t take_claim_epochs(std::shared_lock<std::shared_mutex>& lock, std::uint64_t count);
  // Last-writer-wins writes of `rows` to `slots` (insert_or_assign, assign_slots), with the
  // epochs from take_claim_epochs(claim_chunks(n)).
  void claim_and_assign(const Space& sp, const std::int64_t* slots, std::size_t n,
                        const std::uint8_t* outcome, const float* rows,
                        const std::uint64_t* versions, std::uint64_t version,
                        std::uint64_t first_epoch, const std::int64_t* rows_of = nullptr);
  status install_impl(const Key* keys, std::size_t n, const float* rows, std::int64_t* rows_io,
                      const std::uint64_t* versions, const std::uint64_t* synced,
                      std::uint32_t mark, std::int64_t* slots_out, const char* call);
  // invalid_argument unless the cache has spare rows and every index of `rows` (n; those beside
  // a slot of -1 in `slots`, when given, are not used) lies in [0, row_count()).
  status check_row_indices(const Space& sp, const std::int64_t* rows, const std::int64_t* slots,
                           std::size_t n, const char* call) const;
  static std::uint64_t claim_chunks(std::size_t n) noexcept {
    return (std::uint64_t(n) + claim_chunk - 1) / claim_chunk;
  }
  static constexpr std::uint64_t claim_chunk = std::uint64_t{1} << 32;  // batch indices per epoch
  static constexpr std::uint64_t claim_epoch_end = std::uint64_t{1} << 32;  // epochs stay below
  friend struct detail::embedding_cache_access;

  // cuda space: makes the cache's device current for a bulk call and the caller's device again
  // after it, so that a cache works on its own device whatever thread calls it; host: nothing.
  auto on_own_device() const {
    if constexpr (is_cuda_space_v<Space>) {
      return cuda_device_guard(device_);
    } else {
      return detail::no_device_guard{};
    }
  }

  cache_options options_;
  Space space_;
  int device_ = 0;  // cuda space: the device current at construction, where the arrays live
  std::size_t slots_ = 0;
  std::size_t num_buckets_ = 0;
  std::size_t row_width_ = 0;
  std::atomic<std::size_t> size_{0};
  std::atomic<std::uint64_t> version_clock_{0};
  std::atomic<std::uint64_t> op_clock_{0};
  // The last claim epoch handed out. Claim tags are (epoch << 32 | batch index): an epoch stays
  // in [1, 2^32) and a batch index below 2^32 (longer calls take one epoch per 2^32 keys).
  std::atomic<std::uint64_t> claim_epoch_{0};

  buffer<std::uint8_t, Space> states_;
  buffer<Key, Space> keys_;
  buffer<std::uint32_t, Space> overflow_;
  buffer<std::uint64_t, Space> versions_;
  buffer<std::uint64_t, Space> scores_;
  buffer<std::uint64_t, Space> touched_;  // LFU only: op of the last touch
  buffer<std::uint64_t, Space> claims_;   // last-writer-wins tags of insert_or_assign/assign_slots
  buffer<std::uint64_t, Space> synced_;   // version of each row the store last held
  buffer<std::uint32_t, Space> marks_;    // keyset marks
  buffer<std::uint32_t, Space> row_map_;  // per slot, with spare rows only
  buffer<float, Space> rows_;
  // Rows a table may have: indices of rows are 32 bits in the slot-to-row map.
  static constexpr std::size_t max_rows = std::size_t{1} << 32;
  std::unique_ptr<std::shared_mutex> mutex_;
};

extern template class embedding_cache<std::int64_t, host_space>;
extern template class embedding_cache<std::uint32_t, host_space>;
extern template class embedding_cache<std::int64_t, cuda_space>;
extern template class embedding_cache<std::uint32_t, cuda_space>;

}  // namespace embcache
