/// @file host_hybrid.hpp
/// @brief The host-hybrid path: sparse ops and optimizers applied directly to a parameter store,
/// with no device cache (MindSpore's host+device hybrid mode: embeddings and sparse optimizers on
/// the host, the dense network wherever it runs).
///
/// One training step is forward() then backward(). forward() pulls the rows of the batch's unique
/// keys from the store into a scratch row array (initializing keys the store lacks), and pools
/// them; backward() aggregates the gradients per unique key, applies the optimizer to the scratch
/// rows and pushes every row of the batch back. The ops are those of sparse_ops.hpp and
/// optimizers.hpp in the host space, so the rows left in the store are bit-identical to those the
/// device cache path leaves for the same inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "embcache/buffer.hpp"
#include "embcache/detail/config.hpp"
#include "embcache/optimizers.hpp"
#include "embcache/param_store.hpp"
#include "embcache/sparse_ops.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// A batch of keys in the CSR layout of slot_batch (sample-major bags, int64 offsets), with keys
/// in place of row indices. All pointers are host memory.
template <class Key>
struct key_batch {
  std::size_t batch_size = 0;             ///< samples B (default 0)
  std::size_t num_slots = 0;              ///< slots per sample S (default 0)
  const std::int64_t* offsets = nullptr;  ///< B*S+1 non-decreasing entries, offsets[0] == 0
  const Key* keys = nullptr;              ///< offsets[B*S] keys (default nullptr)
  std::size_t num_keys = 0;               ///< offsets[B*S], the number of occurrences

  /// Number of bags, B*S.
  std::size_t num_bags() const noexcept { return batch_size * num_slots; }
};

/// Fills the `dim` embedding floats of a key the store lacks. Called concurrently from several
/// threads for different keys; must be deterministic for the results to be.
template <class Key>
using embedding_initializer = std::function<void(Key key, float* embedding, std::size_t dim)>;

/// The default initial embedding value of element `d` of `key`: uniform in [-scale, scale),
/// a function of (seed, key, d) only (splitmix64 of the three, top 24 bits as the fraction).
EMBCACHE_HD inline float default_embedding_value(std::uint64_t seed, std::uint64_t key,
                                                 std::size_t d, float scale) {
  std::uint64_t x = seed ^ (key * 0x9E3779B97F4A7C15ull) ^ (static_cast<std::uint64_t>(d) << 32);
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  const float unit = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);  // [0, 1), exact
  return (2.0f * unit - 1.0f) * scale;
}

/// Options of a host_hybrid_table.
struct host_hybrid_options {
  std::size_t dim = 16;           ///< embedding floats per row (default 16)
  combiner comb = combiner::sum;  ///< pooling of each bag (default sum)
  optimizer_options optimizer{};  ///< sparse optimizer (default: sgd, lr 0.001)
  std::uint64_t init_seed = 0;    ///< seed of the default initializer (default 0)
  float init_scale = 0.05f;       ///< default initializer draws from [-scale, scale) (default 0.05)
  int max_threads = 0;            ///< host_space::max_threads of the ops (default 0: all)
};

/// One embedding table trained directly on a parameter store. Not thread-safe; the store must not
/// be written by anyone else between forward() and backward().
template <class Key>
class host_hybrid_table {
 public:
  /// @param store  rows of `options.dim + state_width(options.optimizer.kind, dim)` floats
  /// @param init   initializer of missing keys' embeddings; empty = default_embedding_value with
  ///               options.init_seed and options.init_scale. Their state starts at
  ///               initialize_state(options.optimizer).
  /// @throws embcache::error (invalid_argument) when the store's row width does not match, or
  ///         the optimizer options are invalid.
  host_hybrid_table(param_store<Key>& store, const host_hybrid_options& options,
                    embedding_initializer<Key> init = {});

  /// Pulls the rows of the batch's unique keys and writes the pooled embeddings into `out`
  /// (B*S*dim host floats). Fails on a malformed batch or a failing store.
  ///
  /// `refused` (`num_refused` keys, ascending; may be null when 0) are keys without a row, those
  /// feature admission refused at the pass's boundary (admission.hpp,
  /// training_cache::begin_pass_in_stores): they are neither pulled nor initialized, read a zero
  /// row, or with `default_rows` (S*dim host floats) slot s's row at `default_rows + s * dim`
  /// (row index -1 of sparse_ops.hpp, as in the training cache; admission.hpp's
  /// refused_row::slot), get no gradient and are not pushed by backward(), so the store never
  /// gets a row for them.
  [[nodiscard]] status forward(const key_batch<Key>& batch, float* out,
                               const Key* refused = nullptr, std::size_t num_refused = 0,
                               const float* default_rows = nullptr);

  /// Applies the optimizer to the rows of the last forward() with `d_out` (B*S*dim floats, the
  /// gradient with respect to its `out`), advances the step counter and pushes the rows back.
  /// @throws embcache::error (invalid_argument) when no forward() precedes it.
  [[nodiscard]] status backward(const float* d_out);

  /// Steps applied so far (Adam's bias correction uses step() + 1 for the next one).
  std::uint64_t step() const noexcept { return step_; }
  /// Sets the step counter, e.g. when resuming from a checkpoint.
  void set_step(std::uint64_t step) noexcept { step_ = step; }
  /// Stamps the rows backward() pushes from now on above `version` too (by default a push is
  /// stamped max_version() + 1 of the store): a resume whose table clock (the saved one, which an
  /// expiry clock's values may reach, expiry.hpp) is ahead of the rows it loaded keeps every row
  /// it writes newer than that clock, as the uninterrupted run's are.
  void advance_version(std::uint64_t version) noexcept {
    if (version > version_floor_) version_floor_ = version;
  }
  /// Unique keys of the last forward(), its refused keys left out.
  std::size_t num_unique_keys() const noexcept { return unique_keys_.size(); }
  /// Floats per row.
  std::size_t row_width() const noexcept { return row_width_; }
  /// The options this table was built with.
  const host_hybrid_options& options() const noexcept { return options_; }

 private:
  param_store<Key>& store_;
  host_hybrid_options options_;
  embedding_initializer<Key> init_;
  std::size_t row_width_;
  std::uint64_t step_ = 0;
  std::uint64_t version_floor_ = 0;  // advance_version()
  bool pending_ = false;             // a forward() awaits its backward()

  // The batch of the last forward(), re-expressed over scratch row indices.
  std::vector<std::int64_t> offsets_;
  std::vector<std::int64_t> occurrence_rows_;
  std::size_t batch_size_ = 0;
  std::size_t num_slots_ = 0;
  std::vector<Key> unique_keys_;
  std::vector<std::int64_t> kept_rows_;  // with refused keys: each unique key's row, or -1
  std::vector<std::uint64_t> versions_;  // the stamps of a push above version_floor_
  std::vector<float> rows_;
  buffer<bool, host_space> found_;
  sparse_gradients<host_space> grads_;

  // Grouping scratch.
  detail::host_key_grouping<Key> grouping_;
};

extern template class host_hybrid_table<std::int64_t>;
extern template class host_hybrid_table<std::uint64_t>;
extern template class host_hybrid_table<std::uint32_t>;

}  // namespace embcache
