/// @file synth.hpp
/// @brief Synthetic Criteo-like data: the project's built-in default data set.
///
/// Rows have 13 integer features and 26 categorical slots whose cardinalities follow the
/// Criteo Kaggle set's (times `cardinality_scale`), Zipf-distributed values and per-slot missing
/// rates like Criteo's. The label is drawn from a hidden logistic model: a weight per
/// (slot, value) and per dense feature, each derived from a hash of the seed, so a model that
/// learns per-value weights reaches an AUC well above 0.5. Row i is a pure function of
/// (options, i): output is deterministic, can be produced in any chunking, and streaming
/// generation needs constant memory.
///
/// **Days that drift.** `day` and `drift` make a series of daily files from one seed: day D has
/// its own rows, and each value rank of a slot stands for a key *identity* that is replaced now
/// and then by a new one (new category string, new hidden weight; see generation()), so that each
/// day about a `drift` share of every slot's ranks retires its key and a new key takes its place
/// (popular ranks included), some ranks keeping theirs for many days. A key keeps its weight for
/// its whole life, so a model trained on day D still scores day D + 1. Day D is a pure function of
/// (options, D): the same bytes whatever other days were generated. Day 0 is the plain data
/// (byte-identical to `day` 0, `drift` 0), and `drift` 0 gives days with new rows over the same
/// keys.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "embcache/criteo.hpp"
#include "embcache/shard.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// Distinct values per slot in the Criteo Kaggle (DAC) training set, C1..C26.
inline constexpr std::array<std::uint64_t, criteo_slot_count> criteo_kaggle_cardinalities = {
    1460, 583,   10131227, 2202608, 305,  24,   12517, 633,     3,  93145, 5683,   8351593, 3194,
    27,   14992, 5461306,  10,      5652, 2173, 4,     7046547, 18, 15,    286181, 105,     142572};

/// The largest cardinality_scale (the largest slot then has about 10^13 values).
inline constexpr double synth_max_cardinality_scale = 1e6;

/// The largest `synth_options::day` (2^32 - 1: day × drift stays exact in a double).
inline constexpr std::uint64_t synth_max_day = 4294967295u;

/// Options of the synthetic generator.
struct synth_options {
  std::uint64_t seed = 1;          ///< everything derives from it; default 1
  std::uint64_t rows = 100000;     ///< rows to generate; default 100,000
  double cardinality_scale = 1.0;  ///< multiplies the cardinalities (0, 1e6]; default 1
  double zipf_exponent = 1.05;     ///< Zipf exponent of the values (> 0, finite); default 1.05
  double signal = 1.0;             ///< scales the hidden weights (finite; 0: labels are noise)
  double bias = -1.9;              ///< hidden model's bias (finite); default -1.9
  std::function<void(std::uint64_t rows_done)> on_progress;  ///< about once a second; default none
  std::uint64_t day = 0;  ///< day of a drifting series, [0, synth_max_day]; default 0
  double drift = 0;       ///< share of key identities replaced per day, [0, 1]; default 0
};

/// One synthetic row before preprocessing, as its TSV line holds it.
struct synth_row {
  int label = 0;                                         ///< 0 or 1
  std::array<std::int64_t, criteo_dense_count> dense{};  ///< integer features
  std::array<bool, criteo_dense_count> dense_present{};  ///< false: the field is empty
  std::array<std::int64_t, criteo_slot_count> values{};  ///< value index per slot; -1 missing
  double logit = 0;  ///< the hidden model's logit; the label was drawn from sigmoid(logit)
};

/// Generates rows; cheap to copy, thread-safe (const).
class synth_generator {
 public:
  /// Throws embcache::error (invalid_argument, naming the field and its range) for a scale
  /// outside (0, synth_max_cardinality_scale], an exponent that is not positive, a drift outside
  /// [0, 1], a day above synth_max_day, or a non-finite value of any of them, signal or bias.
  explicit synth_generator(const synth_options& opts);

  /// Row `index` (any order, any thread).
  void row(std::uint64_t index, synth_row& out) const;
  /// The categorical string of `value` in `slot` on the generator's day (8 lowercase hex digits,
  /// as in Criteo); empty for a missing value (-1).
  std::string category(std::size_t slot, std::int64_t value) const;
  /// Which identity the rank `value` of `slot` stands for on the generator's day:
  /// floor(day × r + u), where the rank's rate r is uniform in [drift - w, drift + w]
  /// (w = min(drift, 1 - drift)) and its phase u uniform in [0, 1), both drawn from (seed, slot,
  /// value). So 0 on day 0 and without drift; between two days a rank changes with probability r
  /// (a drift share of the ranks on average) and lives about 1 / r days. The key (category and
  /// hidden weight) changes exactly when this number does. 0 for a missing value.
  std::uint64_t generation(std::size_t slot, std::int64_t value) const;
  /// Appends the row's TSV line (with its newline) to `out`.
  void append_tsv(const synth_row& r, std::string& out) const;
  /// The sample that parse_criteo_line gives for the row's TSV line under `parse`.
  void to_sample(const synth_row& r, const criteo_parse_options& parse, criteo_sample& out) const;
  /// Cardinality of each slot after scaling.
  const std::array<std::uint64_t, criteo_slot_count>& cardinalities() const noexcept {
    return cardinality_;
  }
  const synth_options& options() const noexcept { return opts_; }

 private:
  synth_options opts_;
  std::uint64_t row_seed_ = 0;  // seed of the day's row stream (opts_.seed on day 0)
  std::array<std::uint64_t, criteo_slot_count> cardinality_{};
  std::array<double, criteo_slot_count> slot_scale_{};
  std::array<double, criteo_dense_count> dense_weight_{};
};

/// Writes `opts.rows` TSV lines to `path`, gzip-compressed (level 1) when it ends in ".gz".
/// Atomic (temporary file renamed when complete).
status write_synth_tsv(const std::string& path, const synth_options& opts);

/// Writes `opts.rows` rows as a dataset folder (shards, keysets, manifest.json), exactly what
/// prepare_criteo makes of the TSV (with the same parse options, crossing and no rare filter);
/// `out.num_crossed` is set from `cross`.
result<dataset_summary> write_synth_dataset(const synth_options& opts, dataset_writer_options out,
                                            bool cross = false,
                                            const criteo_parse_options& parse = {});

}  // namespace embcache
