/// @file shard.hpp
/// @brief Binary shards of preprocessed samples (Criteo's shape or a dataset_schema's): format,
/// writers and reader.
///
/// A shard file is a 64-byte little-endian header followed by fixed-width records:
///
/// | offset | size | field                                                   |
/// |--------|------|---------------------------------------------------------|
/// | 0      | 8    | magic `EMBSHRD1`                                        |
/// | 8      | 2    | format version (1)                                      |
/// | 10     | 2    | header size (64)                                        |
/// | 12     | 4    | record size: 4 * (1 + dense) + 8 * (slots + crossed)    |
/// | 16     | 8    | row count                                               |
/// | 24     | 2    | dense features per row (13 for Criteo; 0..1024)         |
/// | 26     | 2    | categorical slots per row (26 for Criteo; 1..63)        |
/// | 28     | 2    | crossed keys per row (0 or more)                        |
/// | 30     | 2    | reserved, zero                                          |
/// | 32     | 8    | xxHash64 (seed 0) of all record bytes                   |
/// | 40     | 16   | reserved, zero                                          |
/// | 56     | 8    | xxHash64 (seed 0) of header bytes 0..55                 |
///
/// Record: float32 label, float32 dense[dense], int64 keys[slots], int64 crossed[crossed]. The
/// dense and slot counts are the dataset schema's (dataset_schema.hpp); a reader is told the shape
/// it expects and refuses a shard of another, naming the file.
///
/// A dataset folder holds `shard-NNNNN.bin`, one keyset per shard for the slot keys
/// (`shard-NNNNN.keys`), one for the crossed keys when crossing is on
/// (`shard-NNNNN.cross.keys`), and `manifest.json` listing them with the statistics.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "embcache/dataset_schema.hpp"
#include "embcache/keyset.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// Dense (integer) features of a Criteo row.
inline constexpr std::size_t criteo_dense_count = 13;
/// Categorical slots of a Criteo row.
inline constexpr std::size_t criteo_slot_count = 26;

/// One preprocessed sample: label, dense features and one key per slot.
struct criteo_sample {
  float label = 0;                                     ///< 0 or 1
  std::array<float, criteo_dense_count> dense{};       ///< transformed dense features
  std::array<std::int64_t, criteo_slot_count> keys{};  ///< slot keys (see criteo.hpp)
};

/// Magic bytes at the start of a shard file.
inline constexpr char shard_magic[8] = {'E', 'M', 'B', 'S', 'H', 'R', 'D', '1'};
/// Current shard format version.
inline constexpr std::uint16_t shard_format_version = 1;
/// Size in bytes of the shard header.
inline constexpr std::size_t shard_header_size = 64;
/// Bytes of one record with `num_crossed` crossed keys.
constexpr std::size_t shard_record_size(std::size_t num_crossed) noexcept {
  return 4 * (1 + criteo_dense_count) + 8 * (criteo_slot_count + num_crossed);
}
/// Bytes of one record of `num_dense` dense features, `num_slots` slot keys and `num_crossed`
/// crossed keys (the counts are at most 65535 each, so this cannot overflow).
constexpr std::size_t shard_record_size(std::size_t num_dense, std::size_t num_slots,
                                        std::size_t num_crossed) noexcept {
  return 4 * (1 + num_dense) + 8 * (num_slots + num_crossed);
}

/// The decoded header of a shard file.
struct shard_header {
  std::uint64_t rows = 0;                      ///< records in the shard
  std::size_t num_dense = criteo_dense_count;  ///< dense features per record; default 13
  std::size_t num_slots = criteo_slot_count;   ///< slot keys per record; default 26
  std::size_t num_crossed = 0;                 ///< crossed keys per record
  std::size_t record_size = 0;  ///< bytes per record
  std::uint64_t checksum = 0;   ///< xxHash64 of the record bytes
};

/// Reads and checks the header of `path`: magic, version, header checksum, layout (dense and slot
/// counts within a schema's limits, the record size theirs) and that the file holds exactly `rows`
/// records (truncated or overlong: corruption naming the path).
result<shard_header> read_shard_header(const std::string& path);

/// A whole shard in memory, as records.
struct shard_data {
  shard_header header;        ///< the decoded header
  std::vector<char> records;  ///< rows * record_size bytes

  /// Label of record `i`.
  float label(std::uint64_t i) const noexcept;
  /// Copies record `i` into `out` and its crossed keys into `crossed` (may be nullptr). Only for a
  /// shard of Criteo's shape (13 dense, 26 slots); another throws invalid_argument.
  void get(std::uint64_t i, criteo_sample& out, std::int64_t* crossed = nullptr) const;
};

/// Reads a whole shard and verifies header and record checksums (corruption on mismatch).
result<shard_data> read_shard(const std::string& path);

/// Writes one shard file, atomically (temporary file renamed on finish()).
class shard_writer {
 public:
  /// Starts `path` with `num_crossed` crossed keys per record.
  static result<std::unique_ptr<shard_writer>> create(const std::string& path,
                                                      std::size_t num_crossed);
  /// Starts `path` with records of `num_dense` dense features and `num_slots` slot keys (at most
  /// schema_max_dense and schema_max_categorical, at least 1 slot: else invalid_argument).
  static result<std::unique_ptr<shard_writer>> create(const std::string& path,
                                                      std::size_t num_crossed,
                                                      std::size_t num_dense, std::size_t num_slots);
  ~shard_writer();
  shard_writer(const shard_writer&) = delete;
  shard_writer& operator=(const shard_writer&) = delete;

  /// Appends a record; `crossed` holds num_crossed keys (nullptr only when num_crossed is 0).
  /// Only for Criteo's shape (a writer of another throws invalid_argument).
  [[nodiscard]] status append(const criteo_sample& s, const std::int64_t* crossed = nullptr);
  /// Appends a record of any shape: `dense` holds num_dense floats, `keys` num_slots keys,
  /// `crossed` num_crossed keys (nullptr only when num_crossed is 0).
  [[nodiscard]] status append_row(float label, const float* dense, const std::int64_t* keys,
                                  const std::int64_t* crossed = nullptr);
  /// Writes the header and makes the file durable under its name.
  [[nodiscard]] status finish();
  /// Records appended so far.
  std::uint64_t rows() const noexcept;

 private:
  shard_writer();
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// The files of one shard of a dataset folder (full paths).
struct shard_files {
  std::string shard;           ///< the shard file
  std::string keyset;          ///< keyset of its slot keys
  std::string crossed_keyset;  ///< keyset of its crossed keys; empty without crossing
  std::uint64_t rows = 0;      ///< records in the shard
  /// Whether the manifest records the keyset sizes below (datasets written before they were
  /// recorded have none).
  bool has_key_counts = false;
  std::uint64_t keys = 0;          ///< keys in the slot-key keyset (manifest field "keys")
  std::uint64_t crossed_keys = 0;  ///< keys in the crossed-key keyset ("crossed_keys")
};

/// What a dataset folder holds (written to and read from manifest.json).
struct dataset_summary {
  std::uint64_t rows = 0;                          ///< samples in all shards
  double label_mean = 0;                           ///< mean label over all samples
  std::size_t num_crossed = 0;                     ///< crossed keys per record
  keyset_format keyset = keyset_format::embcache;  ///< layout of the keyset files
  /// The columns the samples came from (manifest field "schema"; a manifest without one:
  /// Criteo's); its counts are the shards' dense and slot counts.
  dataset_schema schema;
  bool has_unique_stats = false;  ///< whether the unique counts below were taken
  std::vector<std::uint64_t>
      unique_keys;  ///< distinct keys per slot ([num_categorical] with stats)
  std::uint64_t unique_crossed_keys = 0;                       ///< distinct crossed keys
  std::vector<shard_files> shards;                             ///< in order
  std::vector<std::pair<std::string, std::string>> producer;   ///< how the data was made
};

/// File name of shard `index` ("shard-00007.bin").
std::string shard_file_name(std::size_t index);
/// File name of the slot-key keyset of shard `index` ("shard-00007.keys").
std::string keyset_file_name(std::size_t index);
/// File name of the crossed-key keyset of shard `index` ("shard-00007.cross.keys").
std::string crossed_keyset_file_name(std::size_t index);

/// Options of dataset_writer.
struct dataset_writer_options {
  std::string output_dir;                                 ///< created when missing; no default
  std::uint64_t rows_per_shard = std::uint64_t{1} << 20;  ///< default 1,048,576
  std::size_t num_crossed = 0;                            ///< crossed keys per row; default 0
  keyset_format keyset = keyset_format::embcache;         ///< default our format
  bool overwrite = false;    ///< replace an existing dataset (swapped at finish); default off
  bool unique_stats = true;  ///< count distinct keys per slot (memory ~16 B per key); default on
  dataset_schema schema;     ///< the samples' columns (written to the manifest); default Criteo's
};

/// Splits a stream of samples into shards of rows_per_shard rows, writes the keysets of each
/// shard as it completes and manifest.json at finish(). Memory: one shard's distinct keys, plus
/// the dataset's distinct keys with unique_stats.
///
/// The files are written into a staging folder beside output_dir (".<name>.new.<pid>.<n>" in
/// its parent); finish() moves the complete dataset into place in one step (an existing folder
/// is swapped with it, keeping the files it held besides a dataset). Until then output_dir is
/// untouched: a failed or abandoned writer leaves the previous dataset as it was. From create()
/// to the end of finish() (or destruction) the writer holds an exclusive lock on
/// dataset_lock_path(output_dir).
class dataset_writer {
 public:
  /// Takes the lock (a held one gives invalid_argument "output folder '...' is in use by
  /// another process"), removes leftovers of a crashed earlier run (our temporaries in the
  /// folder, our staging folders beside it) and creates the staging folder. Refuses
  /// (invalid_argument) a folder that already has a manifest.json unless `overwrite`.
  static result<std::unique_ptr<dataset_writer>> create(const dataset_writer_options& opts);
  ~dataset_writer();
  dataset_writer(const dataset_writer&) = delete;
  dataset_writer& operator=(const dataset_writer&) = delete;

  /// Appends a sample; `crossed` holds num_crossed keys. Only with Criteo's schema (another
  /// throws invalid_argument: use append_row).
  [[nodiscard]] status append(const criteo_sample& s, const std::int64_t* crossed = nullptr);
  /// Appends a sample of the schema's shape: `dense` holds its num_dense() floats, `keys` its
  /// num_categorical() keys, `crossed` num_crossed keys.
  [[nodiscard]] status append_row(float label, const float* dense, const std::int64_t* keys,
                                  const std::int64_t* crossed = nullptr);
  /// Completes the last shard and writes manifest.json with `producer` notes.
  [[nodiscard]] status finish(std::vector<std::pair<std::string, std::string>> producer = {});
  /// The summary (complete after finish()).
  const dataset_summary& summary() const noexcept;

 private:
  dataset_writer();
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// The lock file of a dataset folder: ".<name>.lock" in its parent (it outlives the writer;
/// holding an flock on it keeps writers out of the folder).
std::string dataset_lock_path(const std::string& output_dir);

/// Reads `dir`/manifest.json (paths in the result are full paths). Every field is checked for
/// its type and range (corruption naming the file and the field): the schema (absent: Criteo's)
/// is valid and agrees with dense_count and slot_count, counts are non-negative
/// integers, shard rows add up to `rows`, file names stay inside the folder, the rows of a
/// shard that exists must match its file size, and a shard's keyset sizes (optional: "keys",
/// with "crossed_keys" when crossing is on) are at most its rows times the keys per row.
result<dataset_summary> read_dataset_manifest(const std::string& dir);

/// A batch of samples as a struct of arrays.
struct shard_batch {
  std::size_t size = 0;               ///< samples in the batch; 0 once the reader is exhausted
  std::size_t num_crossed = 0;        ///< crossed keys per sample
  std::size_t num_dense = criteo_dense_count;  ///< dense features per sample
  std::size_t num_slots = criteo_slot_count;   ///< slot keys per sample
  std::size_t shard_index = 0;        ///< which of the reader's shards the batch comes from
  std::vector<float> labels;          ///< [size]
  std::vector<float> dense;           ///< [size * num_dense]
  std::vector<std::int64_t> keys;     ///< [size * num_slots]
  std::vector<std::int64_t> crossed;  ///< [size * num_crossed]
  std::vector<std::uint64_t> rows;    ///< [size] record index of each sample in its shard
};

/// Options of shard_reader.
struct shard_reader_options {
  std::size_t batch_size = 1024;  ///< samples per batch; default 1024
  bool shuffle = false;           ///< visit each shard's records in a seeded random order
  std::uint64_t seed = 0;         ///< shuffle seed (mixed with the shard's index); default 0
  bool drop_last = false;         ///< skip a shard's last partial batch; default off
  bool read_ahead = true;         ///< load the next shard on a background thread; default on
  std::size_t num_dense = criteo_dense_count;  ///< dense features a shard must have; default 13
  std::size_t num_slots = criteo_slot_count;   ///< slot keys a shard must have; default 26
};

/// Reads shards in order and hands out batches. Batches never span two shards (a pass over a
/// shard matches its keyset); the last batch of a shard may be smaller. A whole shard is held in
/// memory and checked against its checksums before any of its samples is handed out; with
/// read-ahead the next one is loaded meanwhile (so two shards at most are in memory).
class shard_reader {
 public:
  /// Opens `paths` and checks every header (missing: not_found; truncated: corruption; a
  /// different number of crossed keys between shards, or dense and slot counts other than the
  /// options' (the dataset schema's): invalid_argument naming the file). batch_size 0 throws.
  static result<std::unique_ptr<shard_reader>> open(std::vector<std::string> paths,
                                                    const shard_reader_options& opts = {});
  ~shard_reader();
  shard_reader(const shard_reader&) = delete;
  shard_reader& operator=(const shard_reader&) = delete;

  /// Fills `out` with the next batch; ok with out.size == 0 once every shard was read. A shard
  /// that fails its checks gives a corruption status naming it (and the reader stops).
  [[nodiscard]] status next(shard_batch& out);
  /// Samples in all shards.
  std::uint64_t total_rows() const noexcept;
  /// Number of shards.
  std::size_t num_shards() const noexcept;
  /// Crossed keys per sample.
  std::size_t num_crossed() const noexcept;

 private:
  shard_reader();
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace embcache
