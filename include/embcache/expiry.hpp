/// @file expiry.hpp
/// @brief Expiry of a training-cache table: rows not touched for some passes, or whose embedding
/// has shrunk below a norm, leave the cache and the store at a pass boundary and become
/// tombstones of the next incremental export, so that serving drops them too.
///
/// **Touched.** Every row carries the version of its last write (the table's version clock, see
/// training_cache.hpp; param_store rows keep it). A row is touched in a pass when its version
/// changes during that pass: it is created (initializer), pulled into a new keyset at the pass's
/// boundary with a new version (a row initialized there), updated in place and stamped
/// (embedding_cache::mark_updated, as every optimizer step does), or overwritten (assign). Reads,
/// lookups that find the row, write-back and eviction do not touch it: they keep its version.
///
/// **Pass boundaries.** In keyset mode every successful begin_pass is a boundary; in on-demand
/// mode the caller marks each boundary with training_cache::expire() (the trainer calls it
/// before each shard, as keyset mode begins one pass per shard). Boundary number P (1, 2, ...)
/// records the table's version clock V_P before any row of pass P is written, so pass k's rows
/// are those with V_k < version <= V_(k+1); the table keeps the last ttl_passes of these
/// values (a few bytes), nothing per row.
///
/// **Rule.** At boundary P, with ttl_passes = T > 0 and P > T, a row whose version is at most
/// V_(P-T) (last touched in pass P-T-1 or before, or never since the clock was recorded: loaded
/// rows count from the first recorded boundary) has not been touched in the T passes P-T .. P-1
/// and expires; a row touched in pass P-T survives that boundary and expires at the next one
/// unless touched again. With min_l2_norm = m > 0, a row whose embedding (its first `dim`
/// floats, not the optimizer state) has an L2 norm below m expires too. In keyset mode a key of
/// the keyset being begun never expires at that boundary (it is about to be trained). Before
/// the first T boundaries nothing expires by age.
///
/// **Effect.** An expired key is erased from the device cache and from the store, counted in
/// table_counters::rows_expired of that boundary, and reported in table_delta::erased by the
/// next export (a tombstone: embcache-apply deletes it from a serving folder or Redis). A key
/// seen again later starts from the initializer, as a new key.
///
/// **Cost.** Off (every field 0), nothing runs and nothing is stored. On, each boundary reads
/// the versions of the resident rows and scans the whole store in batches of
/// training_cache_options::prefetch_batch rows (param_store::for_each): O(store rows), with the
/// store's rows read (a full iteration of a RocksDB store), but only a version compare per row
/// (and the norm with min_l2_norm); the rows the rule takes are then sorted and merged with the
/// sorted resident keys, without touching the cache. With min_l2_norm the resident rows are read
/// too. The boundary's write-behind is kept; a pending one is finished first.
///
/// **Persistence.** save() records the table's boundary count and its kept clock values in
/// manifest.json (an `expiry` object of the table) only when expiry is on, with the step count
/// and step values only once a step was begun with ttl_steps on; load() restores them,
/// so a resumed run expires exactly the rows the uninterrupted run would. Saves without it (or a
/// cache with expiry off) start counting at the next boundary. A sharded save records each rank's
/// clock in its part (distributed/sharded_save.hpp says how a load on another number of ranks
/// keeps the rows' ages).
///
/// **Steps.** With ttl_steps = T > 0 the caller marks the start of every training step with
/// training_cache::begin_step() (the trainer does, before each batch's forward). Step number S
/// (1, 2, ...) records the table's version clock W_S before any row of step S is written, so a
/// row touched in step S has W_S < version. At a pass boundary after S steps, with S >= T, a row
/// whose version is at most W_(S-T+1) has not been touched in the T steps S-T+1 .. S and expires
/// (the same exceptions as above: a key of the keyset being begun stays). Before T steps nothing
/// expires by steps. The table keeps the last T values of W (8 bytes a step of ttl_steps) and a
/// save records them; begin_step() costs nothing for a table with ttl_steps 0. ttl_steps and
/// ttl_passes may be combined: a row expires when either rule (or min_l2_norm) takes it. Rows
/// still leave only at pass boundaries: T is an age in steps checked once per pass.
#pragma once

#include <cstdint>
#include <vector>

namespace embcache {

/// Most ttl_steps: the table keeps (and a save's manifest.json records, about 20 bytes each) one
/// version per step of it; ages beyond are for ttl_passes.
inline constexpr std::uint64_t max_ttl_steps = std::uint64_t{1} << 18;

/// Expiry policy of one table (table_options::expiry). Every field 0 = off (the default).
struct expiry_options {
  /// Passes a row may stay untouched before it expires; default 0 = never by age.
  std::uint32_t ttl_passes = 0;
  /// A row whose embedding's L2 norm is below this expires at a boundary; default 0 = never.
  float min_l2_norm = 0;
  /// Steps (training_cache::begin_step) a row may stay untouched before it expires at the next
  /// boundary, at most max_ttl_steps; default 0 = never by steps.
  std::uint64_t ttl_steps = 0;

  /// Whether any rule is on.
  constexpr bool enabled() const noexcept {
    return ttl_passes != 0 || min_l2_norm > 0 || ttl_steps != 0;
  }
};

/// A table's expiry clock: the pass boundaries counted and the version clock recorded at the
/// last ones, oldest first (at most the table's ttl_passes values; V_P of the rule above). Saves
/// record it (training_cache::save as the table's `expiry` object, sharded saves per part) only
/// when the table's expiry is on; default: no boundary yet.
struct expiry_clock {
  std::uint64_t boundaries = 0;         ///< boundaries counted; default 0
  std::vector<std::uint64_t> versions;  ///< V_(P-k+1) .. V_P, oldest first; default empty
  std::uint64_t steps = 0;              ///< steps begun (ttl_steps on); default 0
  /// W_(S-k+1) .. W_S of the steps rule, oldest first (at most ttl_steps values); default empty
  std::vector<std::uint64_t> step_versions;
};

}  // namespace embcache
