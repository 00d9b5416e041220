#include "embcache/synth.hpp"

#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/durable_file.hpp"
#include "random.hpp"

namespace embcache {

namespace {

// Missing rates of Criteo's integer and categorical fields, rounded.
constexpr std::array<double, criteo_dense_count> dense_missing = {
    0.45, 0.0, 0.21, 0.22, 0.03, 0.23, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22};
constexpr std::array<double, criteo_slot_count> slot_missing = {
    0, 0, 0.03, 0.03, 0, 0.12, 0,    0,    0,    0, 0,    0.03, 0,
    0, 0, 0.03, 0,    0, 0.44, 0.44, 0.03, 0.76, 0, 0.03, 0.44, 0.44};
// Log-scale location and spread of the integer features (counts with heavy tails).
constexpr std::array<double, criteo_dense_count> dense_mu = {1.0, 3.0, 2.5, 1.8, 7.5, 4.5, 1.5,
                                                             2.3, 3.5, 0.4, 1.0, 0.5, 2.0};
constexpr double dense_sigma = 1.2;

// Salts keep the streams of different uses apart.
constexpr std::uint64_t salt_row = 0x726f77;
constexpr std::uint64_t salt_weight = 0x77656967;
constexpr std::uint64_t salt_category = 0x636174;
constexpr std::uint64_t salt_slot = 0x736c6f74;
constexpr std::uint64_t salt_day = 0x646179;
constexpr std::uint64_t salt_drift = 0x6472696674;

double uniform_of(std::uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

double normal(detail::splitmix64& rng) {
  // Box-Muller; 1 - u keeps the log finite.
  const double u = 1.0 - rng.uniform();
  const double v = rng.uniform();
  return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
}

double normal_of(std::uint64_t h) {
  detail::splitmix64 rng(h);
  return normal(rng);
}

}  // namespace

synth_generator::synth_generator(const synth_options& opts) : opts_(opts) {
  auto check = [](bool ok, const char* field, double v, const char* range) {
    if (!ok) {
      throw error(status_code::invalid_argument, std::string("synth_generator: ") + field + " is " +
                                                     std::to_string(v) + ", expected " + range);
    }
  };
  check(opts.cardinality_scale > 0 && opts.cardinality_scale <= synth_max_cardinality_scale,
        "cardinality_scale", opts.cardinality_scale, "a number in (0, 1e6]");
  check(opts.zipf_exponent > 0 && std::isfinite(opts.zipf_exponent), "zipf_exponent",
        opts.zipf_exponent, "a finite number above 0");
  check(std::isfinite(opts.signal), "signal", opts.signal, "a finite number");
  check(std::isfinite(opts.bias), "bias", opts.bias, "a finite number");
  check(opts.drift >= 0 && opts.drift <= 1, "drift", opts.drift, "a number in [0, 1]");
  if (opts.day > synth_max_day) {
    throw error(status_code::invalid_argument, "synth_generator: day is " +
                                                   std::to_string(opts.day) +
                                                   ", expected an integer in [0, 4294967295]");
  }
  // Day 0 keeps the stream of the plain data; every other day draws its own rows.
  row_seed_ = opts.day == 0 ? opts.seed : detail::hash_words(opts.seed, salt_day, opts.day);
  for (std::size_t j = 0; j < criteo_slot_count; ++j) {
    const double c =
        std::floor(static_cast<double>(criteo_kaggle_cardinalities[j]) * opts.cardinality_scale);
    cardinality_[j] = c < 1 ? 1 : static_cast<std::uint64_t>(c);
    // Slots differ in how much they tell about the label, as real ones do.
    slot_scale_[j] = opts.signal * 0.8 * uniform_of(detail::hash_words(opts.seed, salt_slot, j));
  }
  for (std::size_t j = 0; j < criteo_dense_count; ++j) {
    dense_weight_[j] =
        opts.signal * 0.3 * normal_of(detail::hash_words(opts.seed, salt_slot, 100 + j));
  }
}

void synth_generator::row(std::uint64_t index, synth_row& out) const {
  detail::splitmix64 rng(detail::hash_words(row_seed_, salt_row, index));
  double logit = opts_.bias;
  for (std::size_t j = 0; j < criteo_dense_count; ++j) {
    const bool present = rng.uniform() >= dense_missing[j];
    const double z = normal(rng);
    out.dense_present[j] = present;
    if (!present) {
      out.dense[j] = 0;
      continue;
    }
    std::int64_t x =
        static_cast<std::int64_t>(std::floor(std::exp(dense_mu[j] + dense_sigma * z))) - 1;
    if (j == 1) x -= 2;  // I2 goes down to -3 in Criteo
    out.dense[j] = x;
    logit += dense_weight_[j] * z;
  }
  const double s = opts_.zipf_exponent;
  for (std::size_t j = 0; j < criteo_slot_count; ++j) {
    const double u_missing = rng.uniform();
    const double u = rng.uniform();
    std::int64_t v = -1;
    if (u_missing >= slot_missing[j]) {
      // Inverse CDF of a power law bounded to [1, n + 1): value ranks follow Zipf(s).
      const double n1 = static_cast<double>(cardinality_[j]) + 1.0;
      const double x = std::abs(s - 1.0) < 1e-9
                           ? std::exp(u * std::log(n1))
                           : std::pow((std::pow(n1, 1.0 - s) - 1.0) * u + 1.0, 1.0 / (1.0 - s));
      v = static_cast<std::int64_t>(x) - 1;
      if (v < 0) v = 0;
      if (v >= static_cast<std::int64_t>(cardinality_[j])) {
        v = static_cast<std::int64_t>(cardinality_[j]) - 1;
      }
    }
    out.values[j] = v;
    if (slot_scale_[j] != 0) {
      // The weight belongs to the key: a new identity of the rank draws a new one.
      std::uint64_t h =
          detail::hash_words(opts_.seed ^ salt_weight, j, static_cast<std::uint64_t>(v + 1));
      const std::uint64_t g = generation(j, v);
      if (g != 0) h = detail::hash_words(h, g);
      logit += slot_scale_[j] * normal_of(h);
    }
  }
  out.logit = logit;
  out.label = rng.uniform() * (1.0 + std::exp(-logit)) < 1.0 ? 1 : 0;
}

std::uint64_t synth_generator::generation(std::size_t slot, std::int64_t value) const {
  if (value < 0 || opts_.drift == 0 || opts_.day == 0) return 0;
  // Each rank changes identity at its own rate r, uniform in [drift - w, drift + w] with
  // w = min(drift, 1 - drift) (mean: drift), with a phase u of its own: between two days a rank
  // changes with probability r, so a drift share of the ranks changes per day, and the ranks of
  // rate near 0 keep their key for a long time, as stable categories do.
  detail::splitmix64 rng(detail::hash_words(detail::hash_words(opts_.seed, salt_drift, slot),
                                            static_cast<std::uint64_t>(value)));
  const double f = opts_.drift;
  const double w = std::min(f, 1.0 - f);
  const double rate = f + w * (2.0 * rng.uniform() - 1.0);
  const double u = rng.uniform();
  return static_cast<std::uint64_t>(std::floor(static_cast<double>(opts_.day) * rate + u));
}

std::string synth_generator::category(std::size_t slot, std::int64_t value) const {
  if (value < 0) return {};
  std::uint64_t full =
      detail::hash_words(opts_.seed ^ salt_category, slot, static_cast<std::uint64_t>(value));
  const std::uint64_t g = generation(slot, value);
  if (g != 0) full = detail::hash_words(full, g);
  const auto h = static_cast<std::uint32_t>(full);
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", h);
  return std::string(buf, 8);
}

void synth_generator::append_tsv(const synth_row& r, std::string& out) const {
  out += r.label ? '1' : '0';
  char buf[32];
  for (std::size_t j = 0; j < criteo_dense_count; ++j) {
    out += '\t';
    if (r.dense_present[j]) {
      const int n = std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(r.dense[j]));
      out.append(buf, static_cast<std::size_t>(n));
    }
  }
  for (std::size_t j = 0; j < criteo_slot_count; ++j) {
    out += '\t';
    if (r.values[j] >= 0) out += category(j, r.values[j]);
  }
  out += '\n';
}

void synth_generator::to_sample(const synth_row& r, const criteo_parse_options& parse,
                                criteo_sample& out) const {
  out.label = static_cast<float>(r.label);
  for (std::size_t j = 0; j < criteo_dense_count; ++j) {
    out.dense[j] = r.dense_present[j] ? criteo_dense(r.dense[j], parse.transform) : 0.0f;
  }
  for (std::size_t j = 0; j < criteo_slot_count; ++j) {
    out.keys[j] = criteo_key(j, category(j, r.values[j]), parse.hash_seed);
  }
}

namespace {

class progress_ticker {
 public:
  explicit progress_ticker(const std::function<void(std::uint64_t)>& fn) : fn_(fn) {}
  void tick(std::uint64_t done) {
    if (!fn_ || (done & 0x3fff) != 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ >= std::chrono::seconds(1)) {
      last_ = now;
      fn_(done);
    }
  }
  void done(std::uint64_t n) {
    if (fn_) fn_(n);
  }

 private:
  const std::function<void(std::uint64_t)>& fn_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace

status write_synth_tsv(const std::string& path, const synth_options& opts) {
  const synth_generator gen(opts);
  const bool gz = path.size() >= 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  const std::string tmp = path + ".tmp";
  errno = 0;
  // "T" writes without compression through the same zlib calls.
  gzFile f = gzopen(tmp.c_str(), gz ? "wb1" : "wbT");
  if (!f) return detail::errno_status("cannot create", tmp, errno ? errno : EIO);
  gzbuffer(f, 1 << 18);
  std::string chunk;
  chunk.reserve(1 << 20);
  synth_row r;
  progress_ticker ticker(opts.on_progress);
  status s;
  for (std::uint64_t i = 0; i < opts.rows && s.ok(); ++i) {
    gen.row(i, r);
    gen.append_tsv(r, chunk);
    if (chunk.size() >= (1 << 20) - 1024 || i + 1 == opts.rows) {
      if (gzwrite(f, chunk.data(), static_cast<unsigned>(chunk.size())) !=
          static_cast<int>(chunk.size())) {
        s = detail::errno_status("cannot write", tmp, errno ? errno : EIO);
      }
      chunk.clear();
    }
    ticker.tick(i + 1);
  }
  if (gzclose(f) != Z_OK && s.ok())
    s = detail::errno_status("cannot close", tmp, errno ? errno : EIO);
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = detail::errno_status("cannot rename to", path, errno);
  }
  if (!s.ok()) std::remove(tmp.c_str());
  ticker.done(opts.rows);
  return s;
}

result<dataset_summary> write_synth_dataset(const synth_options& opts, dataset_writer_options out,
                                            bool cross, const criteo_parse_options& parse) {
  const synth_generator gen(opts);
  out.num_crossed = cross ? criteo_cross_count : 0;
  auto writer_or = dataset_writer::create(out);
  if (!writer_or.ok()) return writer_or.get_status();
  auto writer = std::move(writer_or).value();
  synth_row r;
  criteo_sample s;
  std::int64_t crossed[criteo_cross_count];
  progress_ticker ticker(opts.on_progress);
  for (std::uint64_t i = 0; i < opts.rows; ++i) {
    gen.row(i, r);
    gen.to_sample(r, parse, s);
    if (cross) criteo_cross_keys(s.keys.data(), crossed, parse.hash_seed);
    EMBCACHE_RETURN_IF_ERROR(writer->append(s, cross ? crossed : nullptr));
    ticker.tick(i + 1);
  }
  ticker.done(opts.rows);
  std::vector<std::pair<std::string, std::string>> producer = {
      {"tool", "embcache-synth"},
      {"seed", std::to_string(opts.seed)},
      {"cardinality_scale", std::to_string(opts.cardinality_scale)},
      {"zipf_exponent", std::to_string(opts.zipf_exponent)},
      {"hash_seed", std::to_string(parse.hash_seed)},
      {"dense_transform", parse.transform == dense_transform::identity ? "identity" : "log1p"},
  };
  // Only a drifting series says so: plain data keeps its manifest's bytes.
  if (opts.day != 0 || opts.drift != 0) {
    producer.emplace_back("day", std::to_string(opts.day));
    producer.emplace_back("drift", std::to_string(opts.drift));
  }
  EMBCACHE_RETURN_IF_ERROR(writer->finish(producer));
  return writer->summary();
}

}  // namespace embcache
