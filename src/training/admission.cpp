// The count-min sketch and admission rule of embcache/admission.hpp (host code: the training
// cache runs admission on the host in both spaces, before rows are made).
#include "embcache/admission.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "embcache/detail/cache_primitives.hpp"

namespace embcache {

namespace {

constexpr std::uint32_t magic0 = 0x44414345;  // "ECAD" little-endian
constexpr std::uint32_t magic1 = 0x3154494d;  // "MIT1"
constexpr std::uint32_t format_version = 1;
constexpr std::uint32_t max_depth = 16;
constexpr std::uint64_t max_width = std::uint64_t{1} << 32;

constexpr std::uint32_t saturated = std::numeric_limits<std::uint32_t>::max();

// Hands fn(i, cells) the `depth` counters of each of the n keys in turn (copied in and, when
// `write`, back out), `at` holding their indices key by key. The counters of the key a few places
// ahead are prefetched: the sketch is too large for the caches, and one key's counters do not
// depend on another's, so their misses overlap.
template <bool write, class Fn>
void walk_cells(std::conditional_t<write, std::uint32_t*, const std::uint32_t*> cells,
                const std::size_t* at, std::size_t n, std::uint32_t depth, Fn fn) {
  constexpr std::size_t ahead = 8;
  std::uint32_t c[max_depth];
  for (std::size_t i = 0; i < n; ++i) {
    if (i + ahead < n)
      for (std::uint32_t r = 0; r < depth; ++r)
        __builtin_prefetch(&cells[at[(i + ahead) * depth + r]], write ? 1 : 0);
    const std::size_t* ai = at + i * depth;
    for (std::uint32_t r = 0; r < depth; ++r) c[r] = cells[ai[r]];
    fn(i, c);
    if constexpr (write)
      for (std::uint32_t r = 0; r < depth; ++r) cells[ai[r]] = c[r];
  }
}

// splitmix64's finalizer: every input bit reaches every output bit.
std::uint64_t mix(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint32_t low(std::uint64_t v) { return static_cast<std::uint32_t>(v); }
std::uint32_t high(std::uint64_t v) { return static_cast<std::uint32_t>(v >> 32); }
std::uint64_t join(std::uint32_t lo, std::uint32_t hi) {
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

}  // namespace

status check_admission_options(const admission_options& o, const std::string& at) {
  if (!(o.probability >= 0 && o.probability <= 1))
    return status::invalid_argument(at + ".probability: " + std::to_string(o.probability) +
                                    " is outside [0, 1]");
  if (o.sketch_width < 1 || o.sketch_width > max_width)
    return status::invalid_argument(at + ".sketch_width: " + std::to_string(o.sketch_width) +
                                    " is outside [1, 2^32]");
  if (o.sketch_depth < 1 || o.sketch_depth > max_depth)
    return status::invalid_argument(at + ".sketch_depth: " + std::to_string(o.sketch_depth) +
                                    " is outside [1, 16]");
  return {};
}

admission_sketch::admission_sketch(const admission_options& o) : opt_(o) {
  check_admission_options(o).throw_if_error();
  if (o.enabled()) cells_.assign(static_cast<std::size_t>(o.sketch_width * o.sketch_depth), 0);
}

std::size_t admission_sketch::cell(std::uint32_t row, std::uint64_t key) const noexcept {
  const std::uint64_t h = mix(key ^ mix(opt_.seed + 0x9e3779b97f4a7c15ULL * (row + 1)));
  // Multiply-shift maps the hash onto [0, width) without the bias of a modulo.
  const auto slot =
      static_cast<std::uint64_t>((static_cast<unsigned __int128>(h) * opt_.sketch_width) >> 64);
  return static_cast<std::size_t>(row * opt_.sketch_width + slot);
}

std::uint32_t admission_sketch::count(std::uint64_t key) const noexcept {
  if (cells_.empty()) return 0;
  std::uint32_t c = std::numeric_limits<std::uint32_t>::max();
  for (std::uint32_t r = 0; r < opt_.sketch_depth; ++r) c = std::min(c, cells_[cell(r, key)]);
  return c;
}

std::uint32_t admission_sketch::threshold(std::uint64_t key) const noexcept {
  constexpr std::uint32_t never = std::numeric_limits<std::uint32_t>::max();
  std::uint32_t t = opt_.min_count > 0 ? opt_.min_count : never;
  const double p = opt_.probability;
  if (p >= 1) return 1;
  if (p > 0) {
    // u uniform in (0, 1]; 1 + floor(ln u / ln(1 - p)) is geometric: P(draw = 1) = P(u > 1 - p).
    const double u =
        static_cast<double>((mix(key ^ mix(opt_.seed ^ 0x5851f42d4c957f2dULL)) >> 11) + 1) *
        0x1.0p-53;
    const double draw = 1 + std::floor(std::log(u) / std::log1p(-p));
    const std::uint32_t d =
        draw >= static_cast<double>(never) ? never : static_cast<std::uint32_t>(draw);
    t = std::min(t, d);
  }
  return t;
}

void admission_sketch::count_sighting(std::uint64_t key) noexcept {
  if (cells_.empty()) return;
  // Every counter of the key grows: the counters are sums of sightings, the same whatever the
  // order of the keys counted.
  for (std::uint32_t r = 0; r < opt_.sketch_depth; ++r) {
    std::uint32_t& c = cells_[cell(r, key)];
    if (c < std::numeric_limits<std::uint32_t>::max()) ++c;
  }
  ++total_;
}

std::vector<std::size_t> admission_sketch::cells_of(const std::uint64_t* keys,
                                                    std::size_t n) const {
  const std::uint32_t depth = opt_.sketch_depth;
  std::vector<std::size_t> at(n * depth);
  for (std::size_t i = 0; i < n; ++i)
    for (std::uint32_t r = 0; r < depth; ++r) at[i * depth + r] = cell(r, keys[i]);
  return at;
}

void admission_sketch::count_all(const std::uint64_t* keys, std::size_t n) {
  if (cells_.empty()) return;
  const std::uint32_t depth = opt_.sketch_depth;
  const std::vector<std::size_t> at = cells_of(keys, n);
  walk_cells<true>(cells_.data(), at.data(), n, depth, [&](std::size_t, std::uint32_t* c) {
    for (std::uint32_t r = 0; r < depth; ++r)
      if (c[r] < saturated) ++c[r];
  });
  total_ += n;
}

void admission_sketch::sight_all(const std::uint64_t* keys, std::size_t n, bool* admitted_out) {
  if (cells_.empty()) {
    std::fill(admitted_out, admitted_out + n, true);
    return;
  }
  const std::uint32_t depth = opt_.sketch_depth;
  const std::vector<std::size_t> at = cells_of(keys, n);
  walk_cells<true>(cells_.data(), at.data(), n, depth, [&](std::size_t i, std::uint32_t* c) {
    std::uint32_t lowest = saturated;
    for (std::uint32_t r = 0; r < depth; ++r) {
      if (c[r] < saturated) ++c[r];
      lowest = std::min(lowest, c[r]);
    }
    // The final count is at least `lowest`: at or past the threshold, the key is admitted.
    admitted_out[i] = lowest >= threshold(keys[i]);
  });
  total_ += n;
  // The others are read again once every key is counted (counts only grow).
  for (std::size_t i = 0; i < n; ++i) {
    if (admitted_out[i]) continue;
    std::uint32_t c = saturated;
    for (std::uint32_t r = 0; r < depth; ++r) c = std::min(c, cells_[at[i * depth + r]]);
    admitted_out[i] = c >= threshold(keys[i]);
  }
}

void admission_sketch::admitted_all(const std::uint64_t* keys, std::size_t n, std::uint32_t added,
                                    bool* admitted_out) const {
  if (cells_.empty()) {
    std::fill(admitted_out, admitted_out + n, true);
    return;
  }
  const std::uint32_t depth = opt_.sketch_depth;
  const std::vector<std::size_t> at = cells_of(keys, n);
  walk_cells<false>(cells_.data(), at.data(), n, depth,
                    [&](std::size_t i, const std::uint32_t* c) {
                      std::uint32_t lowest = saturated;
                      for (std::uint32_t r = 0; r < depth; ++r) lowest = std::min(lowest, c[r]);
                      const std::uint32_t grown =
                          lowest > saturated - added ? saturated : lowest + added;
                      admitted_out[i] = grown >= threshold(keys[i]);
                    });
}

bool admission_sketch::sight(std::uint64_t key) noexcept {
  count_sighting(key);
  return admitted(key);
}

bool admission_sketch::admitted(std::uint64_t key) const noexcept {
  if (cells_.empty()) return true;
  return count(key) >= threshold(key);
}

std::vector<std::uint32_t> admission_sketch::to_words() const {
  if (cells_.empty()) return {};
  std::vector<std::uint32_t> w;
  w.reserve(word_count());
  w = {magic0,
       magic1,
       format_version,
       opt_.sketch_depth,
       low(opt_.sketch_width),
       high(opt_.sketch_width),
       low(opt_.seed),
       high(opt_.seed),
       low(total_),
       high(total_)};
  w.insert(w.end(), cells_.begin(), cells_.end());
  return w;
}

status admission_sketch::from_words(const std::uint32_t* words, std::size_t n,
                                    const std::string& origin) {
  EMBCACHE_RETURN_IF_ERROR(check_words(words, n, origin));
  std::copy(words + header_words, words + n, cells_.begin());
  total_ = join(words[8], words[9]);
  return {};
}

status admission_sketch::check_words(const std::uint32_t* words, std::size_t n,
                                     const std::string& origin) const {
  const std::string who = "'" + origin + "': ";
  if (cells_.empty())
    return status::invalid_argument(who + "admission state given to a table without admission");
  if (n < header_words)
    return status::corruption(who + "admission state of " + std::to_string(n) +
                              " words is shorter than its header (10 words)");
  if (words[0] != magic0 || words[1] != magic1)
    return status::corruption(who + "not an admission state (wrong magic)");
  if (words[2] != format_version)
    return status::corruption(who + "admission state format " + std::to_string(words[2]) +
                              ", expected " + std::to_string(format_version));
  const std::uint64_t width = join(words[4], words[5]), seed = join(words[6], words[7]);
  if (words[3] != opt_.sketch_depth || width != opt_.sketch_width)
    return status::corruption(who + "admission sketch of depth " + std::to_string(words[3]) +
                              " and width " + std::to_string(width) +
                              ", but the table's admission has sketch_depth " +
                              std::to_string(opt_.sketch_depth) + " and sketch_width " +
                              std::to_string(opt_.sketch_width));
  if (seed != opt_.seed)
    return status::corruption(who + "admission sketch of seed " + std::to_string(seed) +
                              ", but the table's admission has seed " + std::to_string(opt_.seed));
  // depth and width equal this sketch's, whose size is known: no overflow.
  if (n - header_words != cells_.size())
    return status::corruption(who + "admission state holds " + std::to_string(n - header_words) +
                              " counters, expected " + std::to_string(cells_.size()) +
                              (n - header_words < cells_.size() ? " (truncated)" : ""));
  return {};
}

void admission_sketch::clear() noexcept {
  std::fill(cells_.begin(), cells_.end(), 0u);
  total_ = 0;
}

void slot_default_row(const initializer_options& init, std::uint64_t slot, std::size_t dim,
                      float* out) noexcept {
  initializer_options salted = init;
  salted.seed ^= refused_row_salt;
  const float normal_factor = init.scale * 1.7320508075688772f;  // as embedding_cache's
  for (std::size_t d = 0; d < dim; ++d)
    out[d] = detail::initial_value(salted, normal_factor, slot, d);
}

}  // namespace embcache
