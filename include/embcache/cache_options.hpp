/// @file cache_options.hpp
/// @brief Construction options of the embedding cache: slots, row layout, initializer and
/// eviction score.
#pragma once

#include <cstddef>
#include <cstdint>

namespace embcache {

/// How new rows are filled. The embedding part is a function of (seed, key, column) only, so it
/// is identical in every space, batch order and thread count.
enum class init_kind : std::uint8_t {
  uniform,   ///< uniform in [-scale, scale)
  normal,    ///< approximately normal (sum of 4 uniforms), mean 0, standard deviation `scale`
  constant,  ///< every element = scale
};

/// Initializer of new rows.
struct initializer_options {
  init_kind kind = init_kind::uniform;  ///< default: uniform
  float scale = 0.05f;                  ///< default 0.05: range, standard deviation or value
  std::uint64_t seed = 0;               ///< default 0; fold the table id in to vary per table
  float state_value = 0.0f;             ///< default 0: value of every optimizer-state element
};

/// How eviction ranks rows (lowest score goes first).
enum class score_policy : std::uint8_t {
  lru,  ///< score = number of the last bulk call that touched the row (default)
  lfu,  ///< score = number of bulk calls that touched the row
};

/// Construction options of an embedding cache.
struct cache_options {
  std::size_t slots = 0;  ///< slots of the table; required; rounded up to a multiple of bucket_size
  std::size_t dim = 0;          ///< embedding floats per row; required (>= 1)
  std::size_t state_width = 0;  ///< optimizer-state floats per row; default 0 (SGD)
  initializer_options init{};   ///< default: uniform(-0.05, 0.05), seed 0, state 0
  score_policy scores = score_policy::lru;  ///< default: LRU
  /// Rows allocated beyond the slots' own, which no slot holds: install_rows() moves rows a caller
  /// wrote there into the table without copying them, and detach_rows() moves rows out the same
  /// way. Default 0: slot s always holds row s (no slot-to-row map is kept). With spare rows the
  /// slots + spare_rows must stay below 2^32.
  std::size_t spare_rows = 0;
};

}  // namespace embcache
