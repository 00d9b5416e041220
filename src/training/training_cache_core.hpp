// The state behind a training_cache<Key, Space> and the operations its public calls are made of.
// Each group of operations is defined in its own file of src/training (see
// training_cache_definitions.hpp); this header is the map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "format/model_folder.hpp"
#include "training/background.hpp"
#include "training/table_state.hpp"

namespace embcache::detail {

/// Where an export stands in one table's logs: the export point it reached and how many
/// written-back and erased keys it consumed. Applied only once the export is delivered, so a
/// failed delta write loses nothing: the next export covers the same rows again.
struct export_mark {
  std::uint64_t until_version = 0;
  std::size_t written = 0;
  std::size_t erased = 0;
};

template <class Key, class Space>
struct training_cache_core {
  using table_type = table_state<Key, Space>;
  using cache_type = embedding_cache<Key, Space>;

  training_cache_options options;
  int device = 0;  // cuda space: the device the caches live on
  std::vector<table_type> tables;
  cache_counters counters;
  // The identity of the run (model_folder.hpp): new with the cache, adopted from a save it loads,
  // recorded in every save and delta so that readers can refuse a mix of runs.
  std::string run_id = new_run_id();

  // The threads are declared last, the worker after what it uses (the flusher, worker_calls):
  // members go in reverse order, so the worker is joined first, then the flusher, and both
  // before the tables.
  //
  // The flusher (write_behind.inl) pushes every table's write-behind rows. An exception that
  // escaped its push (its rows stay pending) is reported by the next finish_write_behind(), never
  // std::terminate; the call after that pushes the rows again.
  write_behind_flusher flusher;
  // The prefetch worker (prefetch.inl): stages the next pass's rows and installs what it can.
  // Its failure is reported by the next begin_pass.
  worker_space<Space> worker_calls;  // where the worker's cache calls run
  bool staged_valid = false;         // the staging of the last prefetch() is the plan
  prefetch_worker worker;

  // --- store access and write-behind (write_behind.inl) ---
  status push(table_type& tb, const Key* keys, std::size_t n, const float* rows,
              const std::uint64_t* versions);
  status pull(table_type& tb, const Key* keys, std::size_t n, float* rows, bool* found,
              std::uint64_t* versions);
  bool write_behind_pending() const;
  void start_flusher();
  // Waits for the write-behind and retires its rows (pushing what the flusher did not).
  status finish_write_behind();
  void discard_write_behind();
  // move_staged_rows: the leavers moved out by index (wb.detached) copied into wb.rows, before a
  // push of them (the flusher's or finish_write_behind's); nothing when none are.
  status copy_out_detached(table_type& tb);
  void initialize_row(const table_type& tb, Key k, float* dst) const;
  std::uint64_t fresh_version(table_type& tb);
  status residents(table_type& tb, std::vector<Key>* keys, std::vector<std::uint64_t>* vers);
  status write_back(table_type& tb, const std::vector<Key>& keys, bool evict, table_counters& c);
  // One chunk of a write-back (write_back_bytes of rows at most) and its reused buffers.
  struct write_back_buffers {
    std::vector<std::int64_t> slots, dirty_slots;
    std::vector<Key> keys;
    std::vector<std::uint64_t> versions;
    std::vector<float> rows;
  };
  std::size_t write_back_chunk_rows(const table_type& tb) const;
  status write_back_chunk(table_type& tb, const Key* keys, std::size_t m, write_back_buffers& buf,
                          table_counters& c);

  // --- prefetch worker and staging (prefetch.inl) ---
  status prefetch(const std::vector<std::vector<Key>>& keysets);
  status stage(table_type& tb, std::vector<Key> keys, std::size_t max_rows,
               std::size_t spare_floats);
  // Whether the residency is still the one the staging was planned on.
  bool staging_matches_residency(const table_type& tb) const;
  // The worker changed the residency itself: count it and keep the staging's plan current.
  void note_worker_residency_change(table_type& tb);
  status early_evict(table_type& tb, bool* go_on);
  // `rows`: the staged rows [b, b + m), row_width floats each.
  status early_insert(table_type& tb, std::size_t b, std::size_t m, const float* rows,
                      std::vector<std::uint8_t>& taken, bool* go_on);
  void wait_worker();
  void drop_staging();

  // --- the pass boundary (boundary.inl) ---
  status begin_pass(const std::vector<std::vector<Key>>& keysets);
  // training_cache::begin_pass_in_stores: admission and expiry of a boundary, no swap.
  status begin_pass_in_stores(const std::vector<std::vector<Key>>& keysets,
                              std::vector<std::vector<Key>>* refused_out);
  // One table's boundary: from the resident rows to exactly those the keyset needs resident.
  status move_table_to_keyset(table_type& tb, const std::vector<Key>& keys, bool use_staging,
                              table_counters& c);
  status swap_in(table_type& tb, const std::vector<Key>& missing, bool use_staging,
                 table_counters& c);
  status swap_in_staged(table_type& tb, const std::vector<Key>& missing, table_counters& c);
  status evict(table_type& tb, std::size_t need, std::uint32_t keep_mark, table_counters& c,
               victim_slots<Space>* chosen = nullptr);
  status choose_victims_early(table_type& tb);
  result<std::uint32_t> next_mark(table_type& tb);

  // --- on-demand mode (on_demand.inl) ---
  status lookup(table_type& tb, const Key* keys, std::size_t n, std::int64_t* slots_out);

  // --- incremental export (export.inl) ---
  result<std::vector<table_delta<Key>>> collect_deltas(bool with_state,
                                                       std::vector<export_mark>* marks);
  void commit_deltas(const std::vector<export_mark>& marks);
  result<std::string> export_to_folder(const std::string& dir, bool with_state,
                                       std::uint64_t number);

  // --- feature admission (admission.inl) ---
  // How admit() reads the sketch: sight = count this sighting of every key, then decide (c gets
  // the refused keys; the caller sets keys_admitted to the rows it initializes, which are the
  // admitted keys without a row); next_sighting = count nothing and keep the keys that the next
  // sighting admits for certain (prefetch stages their rows).
  enum class admit_mode { sight, next_sighting };
  // Keeps of `keys` (sorted, unique) those admitted by the table's sketch or with a row (resident,
  // or in the store); only the keys the sketch refuses are looked up.
  status admit(table_type& tb, std::vector<Key>* keys, admit_mode mode, table_counters* c);
  // Counts a sighting of each distinct key, deciding nothing (training_cache::count_sightings).
  status count_sightings(table_type& tb, const Key* keys, std::size_t n);
  // --- expiry at a pass boundary (expiry.inl) ---
  // Records the boundary in the table's expiry clock and removes its expired rows, sparing the
  // keys of `keep` (sorted; may be null). A no-op when the table's expiry is off.
  status expire_table(table_type& tb, const std::vector<Key>* keep, table_counters& c);
  // training_cache::expire(): a boundary of every table.
  status expire_all();

  // --- save and load (persistence.inl) ---
  status save(const std::string& dir, const save_progress& on_progress);
  status load(const std::string& dir, const load_options& options);
  status adopt_stores();
  status adopt_store_writes();
};

}  // namespace embcache::detail
