#include "embcache/criteo.hpp"

#include <sys/stat.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "common/durable_file.hpp"
#include "flat_set.hpp"
#include "line_reader.hpp"

namespace embcache {

namespace {

constexpr std::uint64_t hash_mask = (std::uint64_t{1} << 56) - 1;
constexpr std::uint64_t golden = 0x9e3779b97f4a7c15ULL;

std::int64_t make_key(std::uint64_t tag, std::uint64_t h) noexcept {
  h &= hash_mask;
  if (h == 0) h = 1;  // 0 is the out-of-vocabulary key's
  return static_cast<std::int64_t>((tag << 56) | h);
}

std::string quoted(std::string_view v) {
  std::string s = "'";
  for (char c : v.substr(0, 24)) s += (c >= 32 && c < 127) ? c : '?';
  if (v.size() > 24) s += "...";
  return s + "'";
}

// Names the field by the schema and its 1-based column.
status field_error(const dataset_schema& schema, std::size_t column, const std::string& what) {
  return status::corruption("field " + schema.column_name(column) + " (column " +
                            std::to_string(column + 1) + ") " + what);
}

const dataset_schema& criteo_schema() {
  static const dataset_schema s;
  return s;
}

// Splits `line` at tabs into `f` (room for the schema's columns; more are only counted) and
// parses the fields into label, dense and keys.
status parse_fields(std::string_view line, const dataset_schema& schema,
                    const criteo_parse_options& opts, std::string_view* f, float& label,
                    float* dense, std::int64_t* keys) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const std::size_t columns = schema.num_columns();
  std::size_t n = 0;
  const char* p = line.data();
  const char* end = p + line.size();
  while (true) {
    // (An empty view may have no data at all: memchr must not see a null pointer.)
    const char* tab = p < end ? static_cast<const char*>(std::memchr(p, '\t', end - p)) : nullptr;
    const char* stop = tab ? tab : end;
    if (n < columns) f[n] = std::string_view(p, stop - p);
    ++n;
    if (!tab) break;
    p = tab + 1;
  }
  if (n != columns) {
    return status::corruption("has " + std::to_string(n) + " fields, expected " +
                              std::to_string(columns));
  }
  for (std::size_t i = 0; i < columns; ++i) {
    if (f[i].size() > opts.max_field_bytes) {
      return field_error(schema, i,
                         "is " + std::to_string(f[i].size()) + " bytes long, the limit is " +
                             std::to_string(opts.max_field_bytes));
    }
  }
  const std::string_view l = f[schema.label_column];
  if (l == "0") {
    label = 0.0f;
  } else if (l == "1") {
    label = 1.0f;
  } else {
    return field_error(
        schema, schema.label_column,
        l.empty() ? "is empty, expected 0 or 1" : "is " + quoted(l) + ", expected 0 or 1");
  }
  for (std::size_t j = 0; j < schema.num_dense(); ++j) {
    const std::size_t c = schema.dense_column(j);
    const std::string_view v = f[c];
    if (v.empty()) {
      dense[j] = 0.0f;
      continue;
    }
    std::int64_t x = 0;
    const char* b = v.data();
    if (*b == '+') ++b;  // from_chars refuses a leading '+'
    auto [ptr, ec] = std::from_chars(b, v.data() + v.size(), x);
    if (ec == std::errc::result_out_of_range) {
      return field_error(schema, c, quoted(v) + " is out of the int64 range");
    }
    if (ec != std::errc() || ptr != v.data() + v.size() || b == v.data() + v.size()) {
      return field_error(schema, c, quoted(v) + " is not an integer");
    }
    dense[j] = criteo_dense(x, opts.transform);
  }
  for (std::size_t j = 0; j < schema.num_categorical(); ++j) {
    keys[j] = criteo_key(j, f[schema.categorical_column(j)], opts.hash_seed);
  }
  return {};
}

}  // namespace

std::int64_t criteo_key(std::size_t slot, std::string_view value, std::uint64_t hash_seed) {
  const std::uint64_t tag = slot + 1;
  return make_key(tag, XXH64(value.data(), value.size(), hash_seed + tag * golden));
}

std::int64_t criteo_oov_key(std::size_t slot) noexcept {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(slot + 1) << 56);
}

std::int64_t criteo_cross_key(std::size_t pair, std::int64_t a, std::int64_t b,
                              std::uint64_t hash_seed) {
  const std::uint64_t tag = criteo_slot_count + 1 + pair;
  const std::int64_t both[2] = {a, b};
  return make_key(tag, XXH64(both, sizeof(both), hash_seed + tag * golden));
}

void criteo_cross_keys(const std::int64_t* keys, std::int64_t* out, std::uint64_t hash_seed) {
  for (std::size_t p = 0; p < criteo_cross_count; ++p) {
    out[p] = criteo_cross_key(p, keys[criteo_cross_pairs[p].first],
                              keys[criteo_cross_pairs[p].second], hash_seed);
  }
}

std::size_t criteo_key_tag(std::int64_t key) noexcept {
  return static_cast<std::size_t>(static_cast<std::uint64_t>(key) >> 56) - 1;
}

float criteo_dense(std::int64_t x, dense_transform t) noexcept {
  if (t == dense_transform::identity) return static_cast<float>(x);
  return static_cast<float>(std::log1p(static_cast<double>(x > 0 ? x : 0)));
}

status parse_criteo_line(std::string_view line, const criteo_parse_options& opts,
                         criteo_sample& out) {
  std::string_view fields[criteo_field_count];
  return parse_fields(line, criteo_schema(), opts, fields, out.label, out.dense.data(),
                      out.keys.data());
}

status parse_tsv_line(std::string_view line, const dataset_schema& schema,
                      const criteo_parse_options& opts, tsv_row& out) {
  thread_local std::vector<std::string_view> fields;
  fields.resize(schema.num_columns());
  out.dense.resize(schema.num_dense());
  out.keys.resize(schema.num_categorical());
  return parse_fields(line, schema, opts, fields.data(), out.label, out.dense.data(),
                      out.keys.data());
}

// ---- prepare_criteo -------------------------------------------------------------------------

namespace {

using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Sizes of the input files together; 0 (unknown) when one is not a regular file.
std::uint64_t input_sizes(const std::vector<std::string>& inputs) {
  std::uint64_t total = 0;
  for (const auto& path : inputs) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    total += static_cast<std::uint64_t>(st.st_size);
  }
  return total;
}

/// One pass over every input; `on_row` gets each parsed sample. Malformed lines are handed to
/// `on_malformed` (which returns non-ok to stop).
template <class OnRow, class OnMalformed>
status for_each_row(const prep_options& opts, int pass, int passes, std::uint64_t& lines,
                    std::uint64_t& bytes, OnRow&& on_row, OnMalformed&& on_malformed) {
  detail::line_reader reader(opts.max_line_bytes);
  tsv_row sample;
  const auto t0 = clock_type::now();
  auto last_report = t0;
  std::uint64_t bytes_done = 0, consumed_done = 0;
  const std::uint64_t input_total = input_sizes(opts.inputs);
  for (std::size_t fi = 0; fi < opts.inputs.size(); ++fi) {
    const std::string& path = opts.inputs[fi];
    EMBCACHE_RETURN_IF_ERROR(reader.open(path).with_context("prep"));
    while (true) {
      const auto ev = reader.next();
      if (ev == detail::line_reader::event::end) break;
      ++lines;
      if (ev == detail::line_reader::event::broken) {
        EMBCACHE_RETURN_IF_ERROR(on_malformed(path, reader.line_number(), reader.message()));
        break;
      }
      if (ev == detail::line_reader::event::too_long) {
        EMBCACHE_RETURN_IF_ERROR(
            on_malformed(path, reader.line_number(),
                         "line longer than " + std::to_string(opts.max_line_bytes) + " bytes"));
      } else {
        status s = parse_tsv_line(reader.line(), opts.schema, opts.parse, sample);
        if (s.ok()) {
          EMBCACHE_RETURN_IF_ERROR(on_row(sample));
        } else {
          EMBCACHE_RETURN_IF_ERROR(on_malformed(path, reader.line_number(), s.message()));
        }
      }
      if (opts.on_progress && (lines & 0x3fff) == 0) {
        const auto now = clock_type::now();
        if (now - last_report >= std::chrono::seconds(1)) {
          last_report = now;
          opts.on_progress(prep_progress{pass, passes, lines, bytes_done + reader.bytes(), fi,
                                         since(t0), consumed_done + reader.consumed(),
                                         input_total});
        }
      }
    }
    bytes_done += reader.bytes();
    consumed_done += reader.consumed();
  }
  bytes = bytes_done;
  if (opts.on_progress) {
    opts.on_progress(prep_progress{pass, passes, lines, bytes_done, opts.inputs.size() - 1,
                                   since(t0), consumed_done, input_total});
  }
  return {};
}

const char* transform_name(dense_transform t) {
  return t == dense_transform::identity ? "identity" : "log1p";
}

}  // namespace

result<prep_summary> prepare_criteo(const prep_options& opts) {
  const auto t0 = clock_type::now();
  if (opts.inputs.empty()) return status::invalid_argument("prep: no input files");
  if (opts.output_dir.empty()) return status::invalid_argument("prep: no output folder");
  EMBCACHE_RETURN_IF_ERROR(validate(opts.schema, "prep: schema"));
  if (opts.cross && opts.schema.num_categorical() != criteo_slot_count) {
    return status::invalid_argument(
        "prep: crossing pairs Criteo's 26 categorical fields (criteo_cross_pairs), the schema "
        "has " +
        std::to_string(opts.schema.num_categorical()));
  }
  // Every input must be a readable file before anything is written.
  const int stdin_inputs = int(std::count(opts.inputs.begin(), opts.inputs.end(), "-"));
  if (stdin_inputs > 1) {
    return status::invalid_argument("prep: input '-' (standard input) is named " +
                                    std::to_string(stdin_inputs) + " times; it can be read once");
  }
  if (stdin_inputs == 1 && opts.rare_threshold > 1) {
    return status::invalid_argument(
        "prep: input '-' (standard input) can be read only once, but rare_threshold " +
        std::to_string(opts.rare_threshold) + " reads the inputs twice (give a file)");
  }
  for (const std::string& path : opts.inputs) {
    if (path == "-") continue;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      return detail::errno_status("prep: cannot open input", path, errno);
    }
    if (S_ISDIR(st.st_mode)) {
      return status::invalid_argument("prep: input '" + path +
                                      "' is a folder, expected a TSV file (plain or gzip)");
    }
  }
  prep_summary summary;
  const int passes = opts.rare_threshold > 1 ? 2 : 1;

  // The writer takes the output folder's lock for the whole run and stages the new dataset
  // beside the folder, so a failure anywhere below leaves an existing dataset untouched.
  dataset_writer_options wopts;
  wopts.output_dir = opts.output_dir;
  wopts.rows_per_shard = opts.rows_per_shard;
  wopts.num_crossed = opts.cross ? criteo_cross_count : 0;
  wopts.keyset = opts.keyset;
  wopts.overwrite = opts.overwrite;
  wopts.unique_stats = opts.unique_stats;
  wopts.schema = opts.schema;
  auto writer_or = dataset_writer::create(wopts);
  if (!writer_or.ok()) return writer_or.get_status().with_context("prep");
  auto writer = std::move(writer_or).value();

  // Counting pass of the rare-value filter: malformed lines are skipped silently here and
  // reported by the writing pass, which sees the same lines.
  std::unique_ptr<detail::flat_key_set> frequent;
  if (passes == 2) {
    detail::flat_key_counter counts(1 << 16);
    std::uint64_t lines = 0, bytes = 0;
    auto count_row = [&](const tsv_row& s) {
      for (std::int64_t k : s.keys) counts.add(k);
      return status{};
    };
    auto skip = [&](const std::string& file, std::uint64_t line, const std::string& why) {
      if (opts.strict) {
        return status::corruption(file + ":" + std::to_string(line) + ": " + why);
      }
      return status{};
    };
    EMBCACHE_RETURN_IF_ERROR(for_each_row(opts, 1, passes, lines, bytes, count_row, skip));
    frequent = std::make_unique<detail::flat_key_set>(counts.size() / 4 + 16);
    counts.for_each([&](std::int64_t k, std::uint32_t c) {
      if (c >= opts.rare_threshold) frequent->add(k);
    });
  }

  std::int64_t crossed[criteo_cross_count];
  tsv_row filtered;
  auto write_row = [&](const tsv_row& s) {
    const tsv_row* row = &s;
    if (frequent) {
      filtered = s;
      for (std::size_t j = 0; j < s.keys.size(); ++j) {
        if (!frequent->contains(s.keys[j])) {
          filtered.keys[j] = criteo_oov_key(j);
          ++summary.rare_replaced;
        }
      }
      row = &filtered;
    }
    if (opts.cross) criteo_cross_keys(row->keys.data(), crossed, opts.parse.hash_seed);
    return writer->append_row(row->label, row->dense.data(), row->keys.data(),
                              opts.cross ? crossed : nullptr);
  };
  std::string first_malformed;
  auto report = [&](const std::string& file, std::uint64_t line, const std::string& why) {
    std::string where = file + ":" + std::to_string(line) + ": " + why;
    if (opts.strict) return status::corruption(std::move(where));
    ++summary.malformed;
    if (first_malformed.empty()) first_malformed = where;
    if (summary.reports.size() < opts.max_reported) summary.reports.push_back(std::move(where));
    return status{};
  };
  EMBCACHE_RETURN_IF_ERROR(
      for_each_row(opts, passes, passes, summary.lines, summary.bytes, write_row, report));
  if (writer->summary().rows == 0) {
    if (summary.malformed > 0) {
      return status::corruption("prep: no valid rows: all " + std::to_string(summary.malformed) +
                                " lines are malformed (the first: " + first_malformed + ")");
    }
    return status::invalid_argument("prep: no valid rows: the inputs hold no lines");
  }

  std::string pairs;
  for (const auto& [a, b] : criteo_cross_pairs) {
    if (!pairs.empty()) pairs += ",";
    pairs += "C" + std::to_string(a + 1) + "xC" + std::to_string(b + 1);
  }
  EMBCACHE_RETURN_IF_ERROR(writer->finish({
      {"tool", "embcache-prep"},
      {"inputs", std::to_string(opts.inputs.size())},
      {"hash_seed", std::to_string(opts.parse.hash_seed)},
      {"dense_transform", transform_name(opts.parse.transform)},
      {"rare_threshold", std::to_string(opts.rare_threshold)},
      {"crossed_pairs", opts.cross ? pairs : ""},
      {"malformed_lines", std::to_string(summary.malformed)},
  }));
  summary.dataset = writer->summary();
  summary.seconds = since(t0);
  return summary;
}

}  // namespace embcache
