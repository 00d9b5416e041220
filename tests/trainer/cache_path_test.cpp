// The training-cache path's calls that leave the pooled embeddings and their gradients in the
// space (forward_in_space, non_finite_gradients_in_space, backward_in_space), which the loop uses
// when the tables and the dense network are both on the device: in the host space they must give
// the same pooled values and the same rows, bit for bit, as forward and backward on host arrays,
// which is what the cuda instantiation runs too, minus the copies.
#include <cmath>
#include <cstring>
#include <limits>

#include "embedding_path.hpp"  // src/trainer
#include "trainer_test_support.hpp"

namespace embcache::test {
namespace {

constexpr std::size_t batch = 8, wide_slots = 4, deep_slots = 3;

trainer_config path_config() {
  trainer_config c;
  c.mode = trainer_mode::on_demand;  // no keyset files: each batch fetches its misses
  c.seed = 3;
  c.tables[0].capacity = 256;
  c.tables[1].capacity = 256;
  return c;
}

std::unique_ptr<detail::embedding_path> make_path(const trainer_config& c) {
  auto tables = detail::build_embedding_tables(c, host_space{}, false);
  EXPECT_TRUE(tables.ok()) << tables.get_status().to_string();
  return detail::make_cache_path(c, host_space{}, std::move(tables).value());
}

// Step `step`'s keys: repeats within and across samples, so that rows gather several gradients.
struct step_keys {
  std::vector<detail::trainer_key> wide, deep;
  std::vector<std::int64_t> offsets;
  detail::batch_keys keys() const {
    return {batch, wide.data(), wide_slots, deep.data(), deep_slots, offsets.data()};
  }
};
step_keys keys_of(std::uint64_t step) {
  step_keys k;
  for (std::size_t i = 0; i < batch * wide_slots; ++i)
    k.wide.push_back(detail::trainer_key((i * 7 + step * 3) % 19 + 1));
  for (std::size_t i = 0; i < batch * deep_slots; ++i)
    k.deep.push_back(detail::trainer_key((i * 5 + step) % 23 + 100));
  for (std::size_t i = 0; i <= batch * wide_slots; ++i) k.offsets.push_back(std::int64_t(i));
  return k;
}

// Gradients a function of (step, index), for both ways of handing them over.
void fill_gradients(std::uint64_t step, float* g, std::size_t n, float scale) {
  for (std::size_t i = 0; i < n; ++i) g[i] = scale * float(std::sin(double(i) + double(step)));
}

bool same_bits(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

TEST(trainer_cache_path, in_space_calls_give_the_bits_of_host_arrays) {
  const trainer_config c = path_config();
  const std::size_t dim = c.tables[1].dim;
  auto host = make_path(c);
  auto in_space = make_path(c);
  ASSERT_TRUE(host && in_space);
  // The loop takes this way only for tables in the cuda space.
  EXPECT_FALSE(in_space->pools_on_device());
  std::vector<float> wide(batch * wide_slots), deep(batch * deep_slots * dim);
  std::vector<float> d_wide(wide.size()), d_deep(deep.size());
  for (std::uint64_t step = 1; step <= 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const step_keys k = keys_of(step);
    EMBCACHE_ASSERT_OK(host->forward(k.keys(), wide.data(), deep.data()));
    auto p = in_space->forward_in_space(k.keys());
    EMBCACHE_ASSERT_OK(p);
    EXPECT_TRUE(same_bits(p.value().wide, wide.data(), wide.size()));
    EXPECT_TRUE(same_bits(p.value().deep, deep.data(), deep.size()));
    fill_gradients(step, d_wide.data(), d_wide.size(), 0.5f);
    fill_gradients(step, d_deep.data(), d_deep.size(), 0.05f);
    fill_gradients(step, p.value().d_wide, d_wide.size(), 0.5f);
    fill_gradients(step, p.value().d_deep, d_deep.size(), 0.05f);
    auto bad_gradients = in_space->non_finite_gradients_in_space();
    EMBCACHE_ASSERT_OK(bad_gradients);
    EXPECT_EQ(bad_gradients.value(), 0u);
    detail::non_finite_rows bad_host, bad_space;
    EMBCACHE_ASSERT_OK(host->backward(d_wide.data(), d_deep.data(), step, &bad_host));
    EMBCACHE_ASSERT_OK(in_space->backward_in_space(step, &bad_space));
    EXPECT_EQ(bad_space.rows, 0u);
  }
  // Every row the steps touched, embedding and optimizer state.
  for (std::size_t t : {std::size_t{0}, std::size_t{1}}) {
    std::vector<detail::trainer_key> keys;
    for (std::uint64_t step = 1; step <= 4; ++step) {
      const step_keys k = keys_of(step);
      const auto& ks = t == 0 ? k.wide : k.deep;
      keys.insert(keys.end(), ks.begin(), ks.end());
    }
    const std::size_t width = host->row_width(t);
    std::vector<float> a(keys.size() * width), b(a.size());
    std::unique_ptr<bool[]> fa(new bool[keys.size()]), fb(new bool[keys.size()]);
    EMBCACHE_ASSERT_OK(host->read(t, keys.data(), keys.size(), a.data(), fa.get()));
    EMBCACHE_ASSERT_OK(in_space->read(t, keys.data(), keys.size(), b.data(), fb.get()));
    for (std::size_t i = 0; i < keys.size(); ++i) ASSERT_TRUE(fa[i] && fb[i]) << keys[i];
    EXPECT_TRUE(same_bits(a.data(), b.data(), a.size())) << "table " << t;
  }
}

TEST(trainer_cache_path, in_space_gradients_are_counted_and_need_a_forward_in_space) {
  const trainer_config c = path_config();
  auto path = make_path(c);
  ASSERT_TRUE(path);
  detail::non_finite_rows bad;
  const status none = path->backward_in_space(1, &bad);
  EXPECT_EQ(none.code(), status_code::invalid_argument);
  EXPECT_EQ(none.message(),
            "embedding path: the gradients in the space are asked for without a forward_in_space "
            "since the last forward");
  EXPECT_EQ(path->non_finite_gradients_in_space().get_status().message(), none.message());

  const step_keys k = keys_of(1);
  auto p = path->forward_in_space(k.keys());
  EMBCACHE_ASSERT_OK(p);
  const std::size_t n_deep = batch * deep_slots * c.tables[1].dim;
  fill_gradients(1, p.value().d_wide, batch * wide_slots, 0.5f);
  fill_gradients(1, p.value().d_deep, n_deep, 0.05f);
  p.value().d_wide[batch * wide_slots - 1] = std::numeric_limits<float>::infinity();
  p.value().d_deep[0] = std::numeric_limits<float>::quiet_NaN();
  p.value().d_deep[n_deep - 1] = -std::numeric_limits<float>::infinity();
  auto count = path->non_finite_gradients_in_space();
  EMBCACHE_ASSERT_OK(count);
  EXPECT_EQ(count.value(), 3u);

  // A forward on host arrays ends what forward_in_space handed out.
  std::vector<float> wide(batch * wide_slots), deep(n_deep);
  EMBCACHE_ASSERT_OK(path->forward(k.keys(), wide.data(), deep.data()));
  EXPECT_EQ(path->backward_in_space(1, &bad).message(), none.message());
}

// Admission's default_row "slot": a refused key (slot -1) of slot s reads slot s's default row
// (training_cache::default_row, drawn from the table's initializer) and gets no gradient nor row;
// "zeros" reads zeros. min_count 2 refuses every key of the first batch (its first sighting).
TEST(trainer_cache_path, refused_keys_read_their_slots_default_row_or_zeros) {
  for (const refused_row mode : {refused_row::zeros, refused_row::slot}) {
    SCOPED_TRACE(mode == refused_row::slot ? "slot" : "zeros");
    trainer_config c = path_config();
    for (auto& t : c.tables) {
      t.admission.min_count = 2;
      t.admission.sketch_width = 1024;
      t.admission.default_row = mode;
    }
    auto path = make_path(c);
    ASSERT_TRUE(path);
    const std::size_t dim = c.tables[1].dim;
    std::vector<float> wide(batch * wide_slots), deep(batch * deep_slots * dim);
    const step_keys k = keys_of(1);
    EMBCACHE_ASSERT_OK(path->forward(k.keys(), wide.data(), deep.data()));
    training_cache<detail::trainer_key>& cache = *path->host_cache();
    std::vector<float> row(dim);
    for (std::size_t b = 0; b < batch; ++b) {
      for (std::size_t s = 0; s < wide_slots; ++s) {
        cache.default_row(0, s, row.data());
        EXPECT_EQ(wide[b * wide_slots + s], mode == refused_row::slot ? row[0] : 0.0f) << b;
      }
      for (std::size_t s = 0; s < deep_slots; ++s) {
        cache.default_row(1, s, row.data());
        if (mode == refused_row::zeros) EXPECT_EQ(row, std::vector<float>(dim, 0.0f));
        EXPECT_TRUE(same_bits(deep.data() + (b * deep_slots + s) * dim, row.data(), dim)) << b;
      }
    }
    if (mode == refused_row::slot) {  // drawn per slot: no two slots alike, nor zeros
      std::vector<float> other(dim);
      cache.default_row(1, 1, other.data());
      EXPECT_NE(row, other);
      EXPECT_NE(other, std::vector<float>(dim, 0.0f));
    }
    std::vector<float> d_wide(wide.size(), 0.5f), d_deep(deep.size(), 0.25f);
    detail::non_finite_rows bad;
    EMBCACHE_ASSERT_OK(path->backward(d_wide.data(), d_deep.data(), 1, &bad));
    EMBCACHE_ASSERT_OK(cache.end_training());
    for (std::size_t t : {std::size_t{0}, std::size_t{1}}) {  // no row made, stored or trained
      const auto& keys = t == 0 ? k.wide : k.deep;
      std::vector<float> rows(keys.size() * path->row_width(t));
      std::unique_ptr<bool[]> found(new bool[keys.size()]);
      EMBCACHE_ASSERT_OK(path->read(t, keys.data(), keys.size(), rows.data(), found.get()));
      for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_FALSE(found[i]) << keys[i];
      EXPECT_EQ(cache.store(t).size(), 0u);
    }
  }
}

}  // namespace
}  // namespace embcache::test
