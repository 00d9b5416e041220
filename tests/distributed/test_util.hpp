// Helpers of the distributed tests: deterministic global batches cut into blocks, training loops,
// and whole models gathered from the ranks' stores.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "common/status_assertions.hpp"
#include "embcache/detail/hash.hpp"
#include "embcache/distributed/communicator.hpp"
#include "embcache/distributed/sharded_table.hpp"
#include "embcache/host_store.hpp"
#include "embcache/optimizers.hpp"

namespace embcache::test {

/// The global batches of a run: step s has num_blocks blocks of samples_per_block samples with
/// num_slots multi-hot slots (0 to 3 keys each, so some bags are empty), keys drawn so that hot
/// keys repeat across blocks and ranks and cold ones are spread over int64 (negatives too).
struct batch_spec {
  std::size_t num_blocks = 8;
  std::size_t samples_per_block = 8;
  std::size_t num_slots = 3;
  std::uint64_t seed = 7;
};

/// Some blocks of one step's global batch, as a key_batch.
template <class Key>
struct basic_block_batch {
  std::size_t batch_size = 0, num_slots = 0, first_sample = 0;
  std::vector<std::int64_t> offsets{0};
  std::vector<Key> keys;
  key_batch<Key> view() const {
    return {batch_size, num_slots, offsets.data(), keys.data(), keys.size()};
  }
};
using block_batch = basic_block_batch<std::int64_t>;

/// uint32 keys are the int64 ones cut to their low 32 bits.
template <class Key = std::int64_t>
basic_block_batch<Key> make_blocks(const batch_spec& spec, std::uint64_t step, std::size_t first,
                                   std::size_t count) {
  basic_block_batch<Key> b;
  b.num_slots = spec.num_slots;
  b.batch_size = count * spec.samples_per_block;
  b.first_sample = first * spec.samples_per_block;
  for (std::size_t s = 0; s < b.batch_size; ++s) {
    const std::uint64_t sample = b.first_sample + s;
    for (std::size_t j = 0; j < spec.num_slots; ++j) {
      const std::uint64_t h = detail::hash_words(spec.seed, step, sample * 131 + j);
      const std::size_t len = h % 4;
      for (std::size_t i = 0; i < len; ++i) {
        const std::uint64_t k = detail::hash_words(h, i);
        // Three in four occurrences hit 24 hot keys per slot (so most keys recur in several
        // blocks, where the order of a sum shows); the rest are cold, anywhere in int64.
        const std::int64_t key = (k & 3) != 0 ? static_cast<std::int64_t>(j * 1000 + (k >> 8) % 24)
                                              : static_cast<std::int64_t>(k);
        b.keys.push_back(static_cast<Key>(key));
      }
      b.offsets.push_back(static_cast<std::int64_t>(b.keys.size()));
    }
  }
  return b;
}

/// The gradient of a step with respect to the pooled output: depends on the output (so a wrong
/// lookup changes it) and on the global bag.
template <class Key>
std::vector<float> make_d_out(const basic_block_batch<Key>& b, const std::vector<float>& out,
                              std::size_t dim, std::uint64_t step) {
  std::vector<float> d(out.size());
  for (std::size_t bag = 0; bag < b.batch_size * b.num_slots; ++bag) {
    const std::uint64_t global_bag = b.first_sample * b.num_slots + bag;
    for (std::size_t e = 0; e < dim; ++e) {
      const std::uint64_t h = detail::hash_words(step, global_bag, e);
      const float noise = static_cast<float>(h >> 40) * (1.0f / 16777216.0f) - 0.5f;
      d[bag * dim + e] = 0.25f * out[bag * dim + e] + 0.1f * noise;
    }
  }
  return d;
}

/// Trains `steps` steps (numbered from `first_step`) of the spec's global batches, each rank on
/// its blocks.
template <class Key>
status train(sharded_table<Key>& t, const batch_spec& spec, std::uint64_t first_step,
             std::size_t steps) {
  const std::size_t dim = t.options().table.dim;
  for (std::uint64_t s = first_step; s < first_step + steps; ++s) {
    const auto b = make_blocks<Key>(spec, s, t.blocks().first, t.blocks().count);
    std::vector<float> out(b.batch_size * b.num_slots * dim);
    EMBCACHE_RETURN_IF_ERROR(t.forward(b.view(), out.data()));
    const std::vector<float> d_out = make_d_out(b, out, dim, s);
    EMBCACHE_RETURN_IF_ERROR(t.backward(d_out.data()));
  }
  return {};
}

/// Every row of a store (or of every rank's store), sorted by key.
template <class Key>
struct basic_model {
  std::size_t width = 0;
  std::vector<Key> keys;
  std::vector<float> rows;
  std::vector<std::uint64_t> versions;

  /// Same keys and the same bits in every float of every row (versions not compared).
  bool same_rows(const basic_model& o) const {
    return width == o.width && keys == o.keys && rows.size() == o.rows.size() &&
           std::memcmp(rows.data(), o.rows.data(), rows.size() * sizeof(float)) == 0;
  }
  bool same_rows_and_versions(const basic_model& o) const {
    return same_rows(o) && versions == o.versions;
  }
};
using model = basic_model<std::int64_t>;

template <class Key>
basic_model<Key> sorted(basic_model<Key> m) {
  std::vector<std::size_t> idx(m.keys.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(),
            [&](std::size_t a, std::size_t b) { return m.keys[a] < m.keys[b]; });
  basic_model<Key> s;
  s.width = m.width;
  for (std::size_t i : idx) {
    s.keys.push_back(m.keys[i]);
    s.rows.insert(s.rows.end(), m.rows.begin() + i * m.width, m.rows.begin() + (i + 1) * m.width);
    s.versions.push_back(m.versions[i]);
  }
  return s;
}

template <class Key>
basic_model<Key> read_store(param_store<Key>& store) {
  basic_model<Key> m;
  m.width = store.row_width();
  status st = store.for_each(
      1024, [&](const Key* k, const float* r, const std::uint64_t* v, std::size_t n) {
        m.keys.insert(m.keys.end(), k, k + n);
        m.rows.insert(m.rows.end(), r, r + n * m.width);
        m.versions.insert(m.versions.end(), v, v + n);
        return status{};
      });
  st.throw_if_error();
  return sorted(std::move(m));
}

/// The union of every rank's store, on rank 0 (empty elsewhere). Collective.
template <class Key>
basic_model<Key> gather_model(communicator& comm, param_store<Key>& store) {
  const basic_model<Key> mine = read_store(store);
  const auto world = static_cast<std::size_t>(comm.size());
  auto to_root = [&](std::size_t n) {
    std::vector<std::size_t> c(world, 0);
    c[0] = n;
    return c;
  };
  basic_model<Key> all;
  all.width = mine.width;
  std::vector<std::size_t> rc;
  exchange(comm, mine.keys, to_root(mine.keys.size()), all.keys, rc).throw_if_error();
  exchange(comm, mine.rows, to_root(mine.rows.size()), all.rows, rc).throw_if_error();
  exchange(comm, mine.versions, to_root(mine.versions.size()), all.versions, rc).throw_if_error();
  return sorted(std::move(all));
}

inline std::size_t row_width_of(const sharded_table_options& o) {
  return o.table.dim + state_width(o.table.optimizer.kind, o.table.dim);
}

inline host_store_options store_options(const sharded_table_options& o) {
  host_store_options s;
  s.table_name = "t";
  s.row_width = row_width_of(o);
  s.num_shards = 4;
  return s;
}

/// Table options of the tests: dim 4, the given optimizer with learning rates large enough that
/// every step moves the rows by many ulps.
inline sharded_table_options table_options(optimizer_kind kind, std::size_t num_blocks,
                                           combiner comb = combiner::sum) {
  sharded_table_options o;
  o.table.dim = 4;
  o.table.comb = comb;
  o.table.optimizer.kind = kind;
  o.table.optimizer.learning_rate = 0.05f;
  o.table.optimizer.ftrl_alpha = 0.05f;
  o.table.optimizer.ftrl_l1 = 0.001f;
  o.table.init_seed = 11;
  o.table.max_threads = 2;
  o.num_blocks = num_blocks;
  return o;
}

}  // namespace embcache::test
