/// @file admission.hpp
/// @brief Feature admission: a key earns a trained row only after enough sightings (counted in
/// bounded memory by a count-min sketch) or by a seeded draw with probability p per sighting.
///
/// **Sighting.** One sighting is one call that asks for the key: in keyset mode a begin_pass()
/// whose keyset holds it, in on-demand mode a lookup() whose batch holds it; repeats inside one
/// keyset or batch count once. Every sighting is counted, whether the key has a row or not, and
/// a call counts all its keys before it decides for any: so the counts are a function of the
/// sequence of keysets (or batches) alone, and a keyset pass and an on-demand batch weigh the
/// same (one sighting per call). The sharded trainer keeps that exact: each owner counts the
/// whole keyset of a shard (training_cache::count_sightings for the keys other ranks own) and
/// decides for its own keys, so every rank's sketch is the single rank's, bit for bit.
///
/// **Admission.** A key that has a row (resident, or in the table's store) is admitted. A key
/// without one is admitted when its count has reached its threshold: `min_count` when that is
/// set; with `probability` p set, the sighting at which the key is admitted is drawn once per key
/// from a hash of (key, seed) as a geometric variable of parameter p, which is the law of a coin
/// of probability p tossed at every sighting, with no per-key memory and the same draw in every
/// run and on every rank; with both set, the smaller threshold (whichever admits first). Then the
/// training cache makes the key's row as it makes any new row (the initializer). A refused key
/// gets no row: in keyset mode it is left out of the pass's resident keys, in on-demand mode its
/// slot is -1, and the sparse ops apply no gradient to slot -1 (sparse_ops.hpp). It never reaches
/// the store, a save or an export.
///
/// **What a refused key reads.** `default_row` says: a zero row (refused_row::zeros, the
/// default), or the fixed row of the key's feature slot (refused_row::slot): slot_default_row(),
/// drawn once from the table's initializer with a seed of its own, the same in every run, space
/// and rank, never trained and never stored (a function of the options, so saves carry nothing
/// for it). The sparse ops take these rows per slot of a batch (lookup_combine's
/// `default_rows`); training_cache::default_row() gives a table's.
///
/// **Error bound.** The sketch keeps `sketch_depth` rows of `sketch_width` 32-bit counters; a
/// sighting adds one to one counter per row, chosen by that row's hash of the key, and a key's
/// count is the smallest of its counters. It never undercounts, and with width w = e / eps and
/// depth d = ln(1 / delta) it overcounts by at most eps * N with probability at least 1 - delta,
/// N being the sightings counted so far (all keys). For the defaults (w = 2^20, d = 4): eps =
/// e / 2^20 = 2.6e-6 and delta = e^-4 = 1.8%, so after N = 10^7 sightings a key's count is at
/// most 26 too high with probability 98.2%. An overcount only admits a key earlier, never later.
/// Counters saturate at 2^32 - 1. Memory: 4 * width * depth bytes per table (16 MiB for the
/// defaults), allocated only when admission is on.
///
/// **Persistence.** The counters, the total N and the seed travel with a save as the table's
/// `admission` file (training_cache.md, "Admission"), only when admission is on, so that a resume
/// counts on bit for bit; a save without it (admission off when it was written) starts the counts
/// at zero, its rows admitted as rows. A sharded save holds the same file once, written by rank 0
/// (distributed/sharded_save.hpp), and a sharded resume restores it on every rank. A key that loses
/// its row (erase) keeps its count, so it is admitted again at its next sighting once its count is
/// past its threshold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "embcache/cache_options.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// What a key without a row (refused by admission) reads in the forward pass.
enum class refused_row : std::uint8_t {
  zeros,  ///< a row of zeros (the default)
  slot,   ///< the fixed default row of the key's feature slot (slot_default_row)
};

/// Admission of one table (table_options::admission); off by default (both criteria 0), and then
/// it costs nothing: no sketch, no counting, no file in a save.
struct admission_options {
  std::uint32_t min_count = 0;  ///< admitted at the min_count-th sighting; default 0 = off
  double probability = 0;       ///< admitted with this probability per sighting; default 0 = off
  std::uint64_t sketch_width = std::uint64_t{1} << 20;  ///< counters per row; default 2^20
  std::uint32_t sketch_depth = 4;  ///< rows of counters (hash functions); default 4
  std::uint64_t seed = 0;          ///< seeds the sketch's hashes and the draws; default 0
  refused_row default_row = refused_row::zeros;  ///< what a refused key reads; default zeros

  /// Whether admission is on (min_count or probability set).
  bool enabled() const noexcept { return min_count > 0 || probability > 0; }
};

/// Checks `o`: probability in [0, 1] (NaN refused), sketch_width in [1, 2^32], sketch_depth in
/// [1, 16] (so the counters' bytes, 4 * width * depth, stay below 2^38 and cannot overflow).
/// invalid_argument naming the field (prefixed by `at`).
[[nodiscard]] status check_admission_options(const admission_options& o,
                                             const std::string& at = "admission");

/// Salt of slot_default_row(): XOR-ed into the initializer's seed, so that slot s's row is not
/// the initial row of a key s.
inline constexpr std::uint64_t refused_row_salt = 0x5a17d3fa0c4e9b21ULL;

/// Fills `out` (`dim` floats) with the default row of feature slot `slot`: element d is the value
/// an embedding cache with initializer `init`, its seed XOR-ed with refused_row_salt, gives
/// column d of the key whose 64 bits are `slot` (cache_options.hpp: a function of seed, key and
/// column only). Pass the table's initializer with its seed as the table uses it (the training
/// cache folds the table index in: training_cache::default_row()).
void slot_default_row(const initializer_options& init, std::uint64_t slot, std::size_t dim,
                      float* out) noexcept;

/// The count-min sketch and the admission rule of one table (the training cache keeps one per
/// table with admission on). Keys are taken as 64-bit values (a uint32 key widened).
class admission_sketch {
 public:
  /// An empty sketch; off when `o` is (no memory then). Throws embcache::error
  /// (invalid_argument) when check_admission_options(o) fails, std::bad_alloc when the counters
  /// cannot be allocated.
  explicit admission_sketch(const admission_options& o = {});

  /// Whether admission is on.
  bool enabled() const noexcept { return opt_.enabled(); }
  /// The options it was built with.
  const admission_options& options() const noexcept { return opt_; }

  /// Counts one sighting of `key`: each of its counters grows by one (saturating).
  void count_sighting(std::uint64_t key) noexcept;
  /// Counts one sighting of each of the `n` keys (a key given twice counts twice): the same
  /// counters as count_sighting() of each, in fewer memory accesses (the counters are
  /// prefetched). Nothing when admission is off.
  void count_all(const std::uint64_t* keys, std::size_t n);
  /// count_sighting(key), then whether the key is admitted (its count has reached its
  /// threshold). Always true when admission is off.
  bool sight(std::uint64_t key) noexcept;
  /// Whether `key`'s count has reached its threshold, without counting.
  bool admitted(std::uint64_t key) const noexcept;
  /// Counts one sighting of each of the `n` keys (distinct: a key given twice counts twice), then
  /// sets `admitted_out[i]` to admitted(keys[i]) as it stands once all of them are counted, so the
  /// result does not depend on their order. The same as count_sighting() of every key followed by
  /// admitted() of every key, in fewer memory accesses: the counters are prefetched, and a key's
  /// are read again only when its own increments left one below its threshold (counts only grow).
  /// Every output true when admission is off.
  void sight_all(const std::uint64_t* keys, std::size_t n, bool* admitted_out);
  /// Sets `admitted_out[i]` to whether keys[i] is admitted once `added` more sightings of it are
  /// counted, without counting anything: with `added` 0 that is admitted(keys[i]); with 1 it
  /// says that the key's next sighting admits it for certain (a sighting adds one to each of the
  /// key's counters, and other keys' sightings only add more), which is how prefetch stages the
  /// rows of the keys the next pass will admit. Counters prefetched as in sight_all(). Every
  /// output true when admission is off.
  void admitted_all(const std::uint64_t* keys, std::size_t n, std::uint32_t added,
                    bool* admitted_out) const;
  /// The key's count: the smallest of its counters (0 when off).
  std::uint32_t count(std::uint64_t key) const noexcept;
  /// The sighting at which `key` is admitted: min_count, the key's geometric draw, or the smaller
  /// of both (at least 1; UINT32_MAX when off).
  std::uint32_t threshold(std::uint64_t key) const noexcept;
  /// Sightings counted so far (N of the error bound).
  std::uint64_t total() const noexcept { return total_; }
  /// Bytes of counters held: 4 * width * depth when on, else 0.
  std::size_t bytes() const noexcept { return cells_.size() * sizeof(std::uint32_t); }

  /// The state as 32-bit words, as the `admission` file of a save holds them (little-endian):
  /// a header of 10 words (magic "ECADMIT1", format 1, depth, width as two words low first,
  /// seed as two words, total as two words; see training_cache.md) then the counters, row by row.
  std::vector<std::uint32_t> to_words() const;
  /// Replaces the state with `words` (n words), as to_words() wrote them. corruption, naming
  /// `origin`, for a wrong magic or format, a width, depth or seed other than this sketch's, or
  /// a count of words other than 10 + width * depth; nothing changes then.
  [[nodiscard]] status from_words(const std::uint32_t* words, std::size_t n,
                                  const std::string& origin);
  /// The checks of from_words() alone (nothing changes).
  [[nodiscard]] status check_words(const std::uint32_t* words, std::size_t n,
                                   const std::string& origin) const;
  /// Words of to_words(): 10 + width * depth (0 when off).
  std::size_t word_count() const noexcept {
    return cells_.empty() ? 0 : header_words + cells_.size();
  }
  /// Sets every counter and the total to zero.
  void clear() noexcept;

  /// Header words of to_words().
  static constexpr std::size_t header_words = 10;

 private:
  std::size_t cell(std::uint32_t row, std::uint64_t key) const noexcept;
  // The depth counter indices of each key, key by key (what walk_cells takes).
  std::vector<std::size_t> cells_of(const std::uint64_t* keys, std::size_t n) const;

  admission_options opt_;
  std::vector<std::uint32_t> cells_;  // depth rows of width counters
  std::uint64_t total_ = 0;
};

}  // namespace embcache
