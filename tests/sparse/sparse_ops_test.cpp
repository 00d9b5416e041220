// Slot lookup with combiners and gradient aggregation, in the host space.
#include "embcache/sparse_ops.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/status_assertions.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

using test::owned_batch;
using test::random_batch;
using test::random_floats;

// Rows of width 3 (dim 2 + one float that must never be read): row r = {r, 10r, -1}.
std::vector<float> small_rows(std::size_t n) {
  std::vector<float> rows;
  for (std::size_t r = 0; r < n; ++r) {
    rows.push_back(static_cast<float>(r));
    rows.push_back(10.0f * static_cast<float>(r));
    rows.push_back(-1.0f);
  }
  return rows;
}

// 2 samples x 2 slots: {1, 2}, {}, {3}, {3, 3, 4} (bag order: sample-major).
owned_batch small_batch() {
  owned_batch b;
  b.batch_size = 2;
  b.num_slots = 2;
  b.offsets = {0, 2, 2, 3, 6};
  b.indices = {1, 2, 3, 3, 3, 4};
  return b;
}

TEST(sparse_lookup, sum_pools_every_bag_and_empty_bags_give_zeros) {
  const auto rows = small_rows(5);
  const auto b = small_batch();
  std::vector<float> out(4 * 2, 123.0f);
  lookup_combine(host_space{}, rows.data(), 3, 2, b.view(), combiner::sum, out.data());
  EXPECT_EQ(out, (std::vector<float>{3, 30, 0, 0, 3, 30, 10, 100}));
}

TEST(sparse_lookup, mean_divides_by_the_bag_size) {
  const auto rows = small_rows(5);
  const auto b = small_batch();
  std::vector<float> out(4 * 2, 123.0f);
  lookup_combine(host_space{}, rows.data(), 3, 2, b.view(), combiner::mean, out.data());
  EXPECT_EQ(out, (std::vector<float>{1.5f, 15, 0, 0, 3, 30, 10.0f / 3.0f, 100.0f / 3.0f}));
}

TEST(sparse_lookup, one_hot_is_a_gather) {
  std::mt19937_64 rng(7);
  const std::size_t dim = 16, width = 48, num_rows = 100;
  const auto rows = random_floats(rng, num_rows * width, -1, 1);
  const auto b = random_batch(rng, 64, 26, num_rows, 1, 1);
  std::vector<float> out(64 * 26 * dim);
  for (combiner c : {combiner::sum, combiner::mean}) {
    lookup_combine(host_space{}, rows.data(), width, dim, b.view(), c, out.data());
    for (std::size_t bag = 0; bag < 64 * 26; ++bag)
      ASSERT_EQ(0, std::memcmp(&out[bag * dim], &rows[b.indices[bag] * width], dim * sizeof(float)))
          << "bag " << bag;
  }
}

TEST(sparse_lookup, rejects_dim_outside_the_row) {
  const auto rows = small_rows(5);
  const auto b = small_batch();
  std::vector<float> out(16);
  EXPECT_THROW(lookup_combine(host_space{}, rows.data(), 3, 4, b.view(), combiner::sum, out.data()),
               error);
  EXPECT_THROW(lookup_combine(host_space{}, rows.data(), 3, 0, b.view(), combiner::sum, out.data()),
               error);
}

TEST(sparse_backward, duplicate_rows_aggregate_into_one_gradient) {
  const auto b = small_batch();
  // d_out per bag (dim 2): powers of two, so every sum below is exact.
  const std::vector<float> d_out = {1, 2, 64, 128, 4, 8, 16, 32};
  sparse_gradients<host_space> g;
  aggregate_gradients(host_space{}, b.view(), combiner::sum, d_out.data(), 2, g);
  ASSERT_EQ(g.size, 4u);
  ASSERT_EQ(g.dim, 2u);
  EXPECT_EQ(std::vector<std::int64_t>(g.rows.data(), g.rows.data() + 4),
            (std::vector<std::int64_t>{1, 2, 3, 4}));
  // row 3: once in bag 2 (4, 8) and twice in bag 3 (16, 32).
  EXPECT_EQ(std::vector<float>(g.values.data(), g.values.data() + 8),
            (std::vector<float>{1, 2, 1, 2, 4 + 16 + 16, 8 + 32 + 32, 16, 32}));

  aggregate_gradients(host_space{}, b.view(), combiner::mean, d_out.data(), 2, g);
  ASSERT_EQ(g.size, 4u);
  EXPECT_EQ(std::vector<float>(g.values.data(), g.values.data() + 8),
            (std::vector<float>{0.5f, 1, 0.5f, 1, (4 + 16.0f / 3) + 16.0f / 3,
                                (8 + 32.0f / 3) + 32.0f / 3, 16.0f / 3, 32.0f / 3}));
}

TEST(sparse_backward, empty_batch_has_no_rows) {
  owned_batch b;
  b.batch_size = 3;
  b.num_slots = 2;
  b.offsets = {0, 0, 0, 0, 0, 0, 0};
  std::vector<float> out(6 * 4, 5.0f), d_out(6 * 4, 1.0f);
  std::vector<float> rows(4, 1.0f);
  lookup_combine(host_space{}, rows.data(), 4, 4, b.view(), combiner::mean, out.data());
  EXPECT_EQ(out, std::vector<float>(24, 0.0f));
  sparse_gradients<host_space> g;
  aggregate_gradients(host_space{}, b.view(), combiner::sum, d_out.data(), 4, g);
  EXPECT_EQ(g.size, 0u);
  EXPECT_EQ(g.dim, 4u);
}

// L = sum_i c_i * out_i; its gradient by row must match central differences of L.
void check_against_finite_differences(combiner comb) {
  std::mt19937_64 rng(comb == combiner::sum ? 11 : 12);
  const std::size_t dim = 5, width = 7, num_rows = 20;
  auto rows = random_floats(rng, num_rows * width, -0.5f, 0.5f);
  const auto b = random_batch(rng, 8, 3, num_rows, 0, 4);
  const std::size_t bags = 8 * 3;
  const auto c = random_floats(rng, bags * dim, -1, 1);
  std::vector<float> out(bags * dim);
  auto loss = [&] {
    lookup_combine(host_space{}, rows.data(), width, dim, b.view(), comb, out.data());
    double l = 0;
    for (std::size_t i = 0; i < out.size(); ++i) l += double(c[i]) * double(out[i]);
    return l;
  };
  sparse_gradients<host_space> g;
  aggregate_gradients(host_space{}, b.view(), comb, c.data(), dim, g);

  std::vector<bool> seen(num_rows, false);
  for (auto r : b.indices) seen[r] = true;
  std::size_t expected_unique = 0;
  for (bool s : seen) expected_unique += s;
  ASSERT_EQ(g.size, expected_unique);

  const float h = 1.0f / 64;
  for (std::size_t u = 0; u < g.size; ++u) {
    const std::int64_t r = g.rows.data()[u];
    ASSERT_TRUE(seen[r]);
    if (u > 0) {
      ASSERT_LT(g.rows.data()[u - 1], r);
    }
    for (std::size_t d = 0; d < dim; ++d) {
      float& x = rows[r * width + d];
      const float x0 = x;
      x = x0 + h;
      const double lp = loss();
      x = x0 - h;
      const double lm = loss();
      x = x0;
      const double fd = (lp - lm) / (double(x0 + h) - double(x0 - h));
      const double an = g.values.data()[u * dim + d];
      // Only bags holding row r change; float rounding of their outputs (~1e-7) over 2h bounds
      // the error well below 1e-4, while a wrong scale or a missed occurrence is off by >= 0.05.
      EXPECT_NEAR(an, fd, 1e-4 + 1e-4 * std::fabs(fd)) << "row " << r << " d " << d;
    }
  }
}

TEST(sparse_backward, sum_matches_finite_differences) {
  check_against_finite_differences(combiner::sum);
}

TEST(sparse_backward, mean_matches_finite_differences) {
  check_against_finite_differences(combiner::mean);
}

// The sum per row runs over occurrences in batch order: a sequential loop in that order gives the
// same floats bit for bit, whatever the thread count.
TEST(sparse_backward, sums_in_batch_order_whatever_the_thread_count) {
  std::mt19937_64 rng(3);
  const std::size_t dim = 8, width = 8, num_rows = 500, B = 2048, S = 4;
  const auto rows = random_floats(rng, num_rows * width, -1, 1);
  const auto b = random_batch(rng, B, S, num_rows, 0, 6);
  const auto d_out = random_floats(rng, B * S * dim, -1, 1);

  for (combiner comb : {combiner::sum, combiner::mean}) {
    std::vector<float> expected(num_rows * dim, 0.0f);
    std::vector<bool> seen(num_rows, false);
    for (std::size_t bag = 0; bag < B * S; ++bag) {
      const auto count = static_cast<float>(b.offsets[bag + 1] - b.offsets[bag]);
      for (auto k = b.offsets[bag]; k < b.offsets[bag + 1]; ++k) {
        seen[b.indices[k]] = true;
        for (std::size_t d = 0; d < dim; ++d) {
          const float x = d_out[bag * dim + d];
          expected[b.indices[k] * dim + d] += comb == combiner::mean ? x / count : x;
        }
      }
    }
    sparse_gradients<host_space> g1, g2;
    aggregate_gradients(host_space{1}, b.view(), comb, d_out.data(), dim, g1);
    aggregate_gradients(host_space{2}, b.view(), comb, d_out.data(), dim, g2);
    ASSERT_EQ(g1.size, g2.size);
    ASSERT_EQ(0, std::memcmp(g1.rows.data(), g2.rows.data(), g1.size * sizeof(std::int64_t)));
    ASSERT_EQ(0, std::memcmp(g1.values.data(), g2.values.data(), g1.size * dim * sizeof(float)));
    std::size_t u = 0;
    for (std::size_t r = 0; r < num_rows; ++r) {
      if (!seen[r]) continue;
      ASSERT_LT(u, g1.size);
      ASSERT_EQ(g1.rows.data()[u], static_cast<std::int64_t>(r));
      ASSERT_EQ(0, std::memcmp(&g1.values.data()[u * dim], &expected[r * dim], dim * sizeof(float)))
          << "row " << r;
      ++u;
    }
    EXPECT_EQ(u, g1.size);

    std::vector<float> o1(B * S * dim), o2(B * S * dim);
    lookup_combine(host_space{1}, rows.data(), width, dim, b.view(), comb, o1.data());
    lookup_combine(host_space{2}, rows.data(), width, dim, b.view(), comb, o2.data());
    ASSERT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)));
  }
}

// The per-row sums of a batch, occurrence by occurrence in batch order, into a dense array.
std::vector<float> batch_order_sums(const owned_batch& b, combiner comb, const float* d_out,
                                    std::size_t dim, std::size_t num_rows) {
  std::vector<float> sums(num_rows * dim, 0.0f);
  for (std::size_t bag = 0; bag + 1 < b.offsets.size(); ++bag) {
    const auto count = static_cast<float>(b.offsets[bag + 1] - b.offsets[bag]);
    for (auto k = b.offsets[bag]; k < b.offsets[bag + 1]; ++k) {
      for (std::size_t d = 0; d < dim; ++d) {
        const float x = d_out[bag * dim + d];
        sums[b.indices[k] * dim + d] += comb == combiner::mean ? x / count : x;
      }
    }
  }
  return sums;
}

// Every row width the host path unrolls (16, 32, 64, 128) and two it does not (5, 8), over a
// batch large enough to be split between threads: bit-identical to the batch-order sums.
TEST(sparse_backward, every_width_sums_in_batch_order) {
  std::mt19937_64 rng(21);
  const std::size_t num_rows = 3000, B = 1024, S = 8;
  const auto b = random_batch(rng, B, S, num_rows, 0, 5);
  ASSERT_GT(b.indices.size(), 16384u);  // above the serial cut-off
  std::vector<bool> seen(num_rows, false);
  for (auto r : b.indices) seen[r] = true;
  for (std::size_t dim : {5, 8, 16, 32, 64, 128}) {
    const auto d_out = random_floats(rng, B * S * dim, -1, 1);
    for (combiner comb : {combiner::sum, combiner::mean}) {
      const auto expected = batch_order_sums(b, comb, d_out.data(), dim, num_rows);
      for (int threads : {1, 2, 3}) {
        sparse_gradients<host_space> g;
        aggregate_gradients(host_space{threads}, b.view(), comb, d_out.data(), dim, g);
        std::size_t u = 0;
        for (std::size_t r = 0; r < num_rows; ++r) {
          if (!seen[r]) continue;
          ASSERT_LT(u, g.size);
          ASSERT_EQ(g.rows.data()[u], static_cast<std::int64_t>(r));
          ASSERT_EQ(0,
                    std::memcmp(&g.values.data()[u * dim], &expected[r * dim], dim * sizeof(float)))
              << "dim " << dim << " threads " << threads << " row " << r;
          ++u;
        }
        EXPECT_EQ(u, g.size) << "dim " << dim << " threads " << threads;
      }
    }
  }
}

// Row indices too far apart for a table by row go through the hash grouping: the same sums, bit
// for bit, and the same order of rows as the same batch with its rows close together.
TEST(sparse_backward, far_apart_rows_group_like_close_ones) {
  std::mt19937_64 rng(22);
  const std::size_t dim = 16, num_rows = 700;
  for (std::size_t B : {4, 2048}) {  // one batch on the calling thread, one split between threads
    const auto close = random_batch(rng, B, 4, num_rows, 0, 4);
    auto far = close;
    for (auto& r : far.indices) r = r * (std::int64_t{1} << 33) + 7;
    const auto d_out = random_floats(rng, B * 4 * dim, -1, 1);
    for (combiner comb : {combiner::sum, combiner::mean}) {
      for (int threads : {1, 3}) {
        sparse_gradients<host_space> gc, gf;
        aggregate_gradients(host_space{threads}, close.view(), comb, d_out.data(), dim, gc);
        aggregate_gradients(host_space{threads}, far.view(), comb, d_out.data(), dim, gf);
        ASSERT_EQ(gc.size, gf.size);
        for (std::size_t u = 0; u < gc.size; ++u)
          ASSERT_EQ(gf.rows.data()[u], gc.rows.data()[u] * (std::int64_t{1} << 33) + 7) << u;
        ASSERT_EQ(0, std::memcmp(gc.values.data(), gf.values.data(), gc.size * dim * sizeof(float)))
            << "B " << B << " threads " << threads;
      }
    }
  }
}

// Row index -1 (a key without a row) skips the tables by row and takes the sorted path: it reads
// zeros and gets no gradient; the other rows still get one sum each, ascending, in batch order.
TEST(sparse_backward, row_minus_one_reads_zeros_and_gets_no_gradient) {
  owned_batch b;
  b.batch_size = 3;
  b.num_slots = 1;
  b.offsets = {0, 2, 3, 4};
  b.indices = {-1, 3, -1, 3};
  EMBCACHE_EXPECT_OK(check_batch(b.view(), 4));
  const std::vector<float> d_out = {1, 2, 4, 8, 16, 32};
  sparse_gradients<host_space> g;
  aggregate_gradients(host_space{}, b.view(), combiner::sum, d_out.data(), 2, g);
  ASSERT_EQ(g.size, 1u);
  EXPECT_EQ(g.rows.data()[0], 3);
  EXPECT_EQ(std::vector<float>(g.values.data(), g.values.data() + 2),
            (std::vector<float>{1 + 16, 2 + 32}));
  // Wide rows (past 32 bits) take the 64-bit sort: the same.
  b.indices = {-1, std::int64_t{1} << 40, -1, std::int64_t{1} << 40};
  aggregate_gradients(host_space{}, b.view(), combiner::sum, d_out.data(), 2, g);
  ASSERT_EQ(g.size, 1u);
  EXPECT_EQ(g.rows.data()[0], std::int64_t{1} << 40);
  EXPECT_EQ(std::vector<float>(g.values.data(), g.values.data() + 2),
            (std::vector<float>{1 + 16, 2 + 32}));
  // Forward: -1 pools as a zero row.
  b.indices = {-1, 3, -1, 3};
  const std::vector<float> rows = {0, 0, 0, 0, 0, 0, 5, 7};  // row 3 = (5, 7)
  std::vector<float> out(6, 99.0f);
  lookup_combine(host_space{}, rows.data(), 2, 2, b.view(), combiner::sum, out.data());
  EXPECT_EQ(out, (std::vector<float>{5, 7, 0, 0, 5, 7}));
  b.indices = {-2, 3, -1, 3};
  EXPECT_EQ(check_batch(b.view(), 4).code(), status_code::invalid_argument);
}

// With default rows (admission's refused_row::slot) a -1 in a bag of slot s reads slot s's row,
// in the bag's sum and in its mean; rows >= 0 read as before, and the backward is unchanged.
TEST(sparse_lookup, row_minus_one_reads_its_slots_default_row_when_given) {
  owned_batch b;
  b.batch_size = 2;
  b.num_slots = 2;
  b.offsets = {0, 2, 3, 4, 6};
  b.indices = {-1, 3, -1, 3, -1, -1};
  const std::vector<float> rows = {0, 0, 0, 0, 0, 0, 5, 7};  // row 3 = (5, 7)
  const std::vector<float> defaults = {0.5f, 0.25f, -2, 4};  // slot 0, slot 1
  std::vector<float> out(8, 99.0f);
  lookup_combine(host_space{}, rows.data(), 2, 2, b.view(), combiner::sum, out.data(),
                 defaults.data());
  EXPECT_EQ(out, (std::vector<float>{5.5f, 7.25f, -2, 4, 5, 7, -4, 8}));
  lookup_combine(host_space{}, rows.data(), 2, 2, b.view(), combiner::mean, out.data(),
                 defaults.data());
  EXPECT_EQ(out, (std::vector<float>{2.75f, 3.625f, -2, 4, 5, 7, -2, 4}));
  // Without them: zeros, as before.
  lookup_combine(host_space{}, rows.data(), 2, 2, b.view(), combiner::sum, out.data());
  EXPECT_EQ(out, (std::vector<float>{5, 7, 0, 0, 5, 7, 0, 0}));
  const std::vector<float> d_out = {1, 2, 4, 8, 16, 32, 64, 128};
  sparse_gradients<host_space> g;
  aggregate_gradients(host_space{}, b.view(), combiner::sum, d_out.data(), 2, g);
  ASSERT_EQ(g.size, 1u);
  EXPECT_EQ(g.rows.data()[0], 3);
}

TEST(sparse_backward, buffers_are_reused_across_batches) {
  std::mt19937_64 rng(5);
  const auto big = random_batch(rng, 64, 4, 1000, 1, 3);
  const auto small = small_batch();
  const auto d_big = random_floats(rng, 64 * 4 * 2, -1, 1);
  const std::vector<float> d_small = {1, 2, 64, 128, 4, 8, 16, 32};
  sparse_gradients<host_space> g;
  aggregate_gradients(host_space{}, big.view(), combiner::sum, d_big.data(), 2, g);
  const float* values = g.values.data();
  aggregate_gradients(host_space{}, small.view(), combiner::sum, d_small.data(), 2, g);
  EXPECT_EQ(g.values.data(), values);
  ASSERT_EQ(g.size, 4u);
  EXPECT_EQ(std::vector<float>(g.values.data(), g.values.data() + 8),
            (std::vector<float>{1, 2, 1, 2, 36, 72, 16, 32}));
}

TEST(sparse_batch, check_batch_names_what_is_wrong) {
  auto b = small_batch();
  EMBCACHE_EXPECT_OK(check_batch(b.view(), 5));
  status s = check_batch(b.view(), 4);
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_NE(s.message().find("row index 4 at occurrence 5"), std::string::npos) << s.message();

  b.offsets = {0, 2, 1, 3, 6};
  s = check_batch(b.view(), 5);
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_NE(s.message().find("offsets decrease at bag 1 (sample 0, slot 1)"), std::string::npos)
      << s.message();

  b.offsets = {0, 2, 2, 3, 5};
  s = check_batch(b.view(), 5);
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_NE(s.message().find("offsets end at 5, expected num_indices 6"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace embcache
