/// @file criteo.hpp
/// @brief Criteo TSV rows: parsing, preprocessing into keys, and the `embcache-prep` pipeline.
///
/// A row is 40 tab-separated fields: the label (0 or 1), 13 integer features I1..I13 and 26
/// categorical values C1..C26; an empty field is a missing value. Preprocessing follows what
/// HugeCTR's Criteo samples do: a missing integer becomes 0, the others become
/// log(1 + max(x, 0)); each categorical value is hashed with its slot into an int64 key.
///
/// Key layout: bits 56..61 hold a tag (1 + slot for C1..C26, 27 + pair for crossed features),
/// bits 0..55 hold xxHash64 of the value with the slot folded into the seed. The same string in
/// two slots therefore gives two keys, keys of different slots never collide, every key is
/// positive, and the hash part 0 is reserved for the out-of-vocabulary key of the slot.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "embcache/dataset_schema.hpp"
#include "embcache/keyset.hpp"
#include "embcache/shard.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// Fields of a Criteo TSV row (label, 13 integers, 26 categorical values).
inline constexpr std::size_t criteo_field_count = 1 + criteo_dense_count + criteo_slot_count;
/// Crossed features per row when crossing is on: one per pair in criteo_cross_pairs.
inline constexpr std::size_t criteo_cross_count = 13;
/// The slot pairs that are crossed (0-based slots): C1xC2, C3xC4, ..., C25xC26.
inline constexpr std::array<std::pair<std::uint8_t, std::uint8_t>, criteo_cross_count>
    criteo_cross_pairs = {{{0, 1},
                           {2, 3},
                           {4, 5},
                           {6, 7},
                           {8, 9},
                           {10, 11},
                           {12, 13},
                           {14, 15},
                           {16, 17},
                           {18, 19},
                           {20, 21},
                           {22, 23},
                           {24, 25}}};

/// How an integer feature becomes a dense float (a missing value is 0 in both).
enum class dense_transform : std::uint8_t {
  log1p = 1,     ///< log(1 + max(x, 0)), as HugeCTR's Criteo samples do
  identity = 2,  ///< x as a float
};

/// How rows are parsed and hashed.
struct criteo_parse_options {
  std::uint64_t hash_seed = 0;                         ///< seed of the categorical hash; default 0
  dense_transform transform = dense_transform::log1p;  ///< default log1p
  std::size_t max_field_bytes = 64;  ///< longer fields make the line malformed; default 64
};

/// The key of categorical value `value` in slot `slot` (0..25). An empty value (missing) has a
/// key of its own per slot.
std::int64_t criteo_key(std::size_t slot, std::string_view value, std::uint64_t hash_seed = 0);
/// The out-of-vocabulary key of `slot`: every rare value of the slot maps to it.
std::int64_t criteo_oov_key(std::size_t slot) noexcept;
/// The crossed key of pair `pair` (index into criteo_cross_pairs) from the two slot keys.
std::int64_t criteo_cross_key(std::size_t pair, std::int64_t a, std::int64_t b,
                              std::uint64_t hash_seed = 0);
/// Fills `out[criteo_cross_count]` with the crossed keys of `keys[criteo_slot_count]`.
void criteo_cross_keys(const std::int64_t* keys, std::int64_t* out, std::uint64_t hash_seed = 0);
/// The tag of a key: 0..25 for slot keys, 26..38 for crossed keys (26 + pair).
std::size_t criteo_key_tag(std::int64_t key) noexcept;
/// The dense value of integer `x` under `t`.
float criteo_dense(std::int64_t x, dense_transform t) noexcept;

/// Parses one line (no trailing newline; a trailing '\r' is ignored) into `out`. A malformed
/// line gives a corruption status whose message is the reason only (wrong field count,
/// non-numeric integer, bad label, over-long field), naming the field and its 1-based column
/// ("field I3 (column 4) 'x' is not an integer"); the caller adds file:line.
status parse_criteo_line(std::string_view line, const criteo_parse_options& opts,
                         criteo_sample& out);

/// One parsed row of a dataset_schema.
struct tsv_row {
  float label = 0;                 ///< 0 or 1
  std::vector<float> dense;        ///< [schema.num_dense()] transformed dense features
  std::vector<std::int64_t> keys;  ///< [schema.num_categorical()] keys (criteo_key of each field)
};

/// parse_criteo_line for the columns of `schema` (a valid one, see validate): the same checks and
/// messages, the field named by the schema. Categorical field j is hashed as slot j.
status parse_tsv_line(std::string_view line, const dataset_schema& schema,
                      const criteo_parse_options& opts, tsv_row& out);

/// Progress of a prep run, handed to prep_options::on_progress.
struct prep_progress {
  int pass = 1;                ///< 1 = counting pass of the rare filter, 2 = writing pass
  int passes = 1;              ///< 1, or 2 with the rare filter
  std::uint64_t lines = 0;     ///< lines read in this pass, malformed included
  std::uint64_t bytes = 0;     ///< uncompressed bytes read in this pass
  std::size_t file_index = 0;  ///< input file being read
  double seconds = 0;          ///< since the pass began
  /// Bytes of the input files consumed in this pass: for gzip the compressed bytes, so that
  /// input_bytes / input_total is the pass's fraction done.
  std::uint64_t input_bytes = 0;
  /// Sizes of all input files together; 0 when one is not a regular file (a pipe: unknown).
  std::uint64_t input_total = 0;
};

/// Options of prepare_criteo (and of the `embcache-prep` command).
struct prep_options {
  /// TSV files, plain or gzip (detected by its magic bytes); "-" is standard input (once, and
  /// not with rare_threshold > 1, which reads the inputs twice); no default.
  std::vector<std::string> inputs;
  std::string output_dir;                                 ///< created when missing; no default
  std::uint64_t rows_per_shard = std::uint64_t{1} << 20;  ///< default 1,048,576
  keyset_format keyset = keyset_format::embcache;         ///< default our format
  std::uint32_t rare_threshold = 0;    ///< values seen fewer times map to the OOV key; 0 = off
  bool cross = false;                  ///< write criteo_cross_pairs crossed keys; default off
  bool strict = false;                 ///< stop at the first malformed line; default off
  bool overwrite = false;              ///< replace an existing dataset in output_dir; default off
  bool unique_stats = true;            ///< count unique keys per slot (memory ~ unique keys)
  std::size_t max_reported = 10;       ///< malformed lines reported by file:line; default 10
  std::size_t max_line_bytes = 65536;  ///< longer lines are malformed; default 64 KiB
  criteo_parse_options parse;          ///< hashing and dense transform
  /// The columns of the input rows (validated; written to the manifest); default Criteo's. With
  /// `cross` it must have 26 categorical fields.
  dataset_schema schema;
  std::function<void(const prep_progress&)> on_progress;  ///< about once a second; default none
};

/// What a prep run did.
struct prep_summary {
  dataset_summary dataset;           ///< rows, label mean, unique keys, shard files
  std::uint64_t lines = 0;           ///< lines read (the writing pass), malformed included
  std::uint64_t malformed = 0;       ///< lines skipped as malformed
  std::vector<std::string> reports;  ///< the first max_reported as "file:line: reason"
  std::uint64_t rare_replaced = 0;   ///< slot values replaced by their OOV key
  std::uint64_t bytes = 0;           ///< uncompressed input bytes (writing pass)
  double seconds = 0;                ///< wall time of the whole run
};

/// Reads the inputs (rows of opts.schema) and writes shards, keysets and manifest.json into
/// output_dir (see docs/data.md). Malformed lines are skipped and counted; with `strict` the first
/// one stops the run with a corruption status "file:line: reason". A missing input gives not_found;
/// a broken gzip stream counts as a malformed line at the line where it broke and ends that file.
result<prep_summary> prepare_criteo(const prep_options& opts);

}  // namespace embcache
