// The sparse ops and optimizers in the cuda space, checked against the host space on the same
// inputs (skips without a device).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../sparse/test_util.hpp"
#include "common/cuda_device.hpp"
#include "embcache/buffer.hpp"
#include "embcache/optimizers.hpp"
#include "embcache/sparse_ops.hpp"

namespace embcache {
namespace {

template <class T>
buffer<T, cuda_space> to_device(const std::vector<T>& v) {
  buffer<T, cuda_space> b(v.size());
  b.copy_from_host(v.data(), v.size());
  return b;
}

template <class T>
std::vector<T> to_host(const buffer<T, cuda_space>& b, std::size_t n) {
  std::vector<T> v(n);
  b.copy_to_host(v.data(), n);
  return v;
}

struct device_batch {
  buffer<std::int64_t, cuda_space> offsets, indices;
  slot_batch view;
};

device_batch upload(const test::owned_batch& b) {
  device_batch d{to_device(b.offsets), to_device(b.indices), {}};
  d.view = {b.batch_size, b.num_slots, d.offsets.data(), d.indices.data(), b.indices.size()};
  return d;
}

// Both spaces sum in the same order with the same float operations (no multiply, so nothing to
// contract into an FMA): lookups and gradients are bit-identical.
TEST(sparse_cuda, lookup_and_gradients_are_bit_identical_to_the_host_space) {
  EMBCACHE_NEED_CUDA_DEVICE();
  std::mt19937_64 rng(17);
  const std::size_t dim = 16, width = 48, num_rows = 5000, B = 4096, S = 26;
  const auto rows = test::random_floats(rng, num_rows * width, -1, 1);
  const auto b = test::random_batch(rng, B, S, num_rows, 0, 4);
  const auto d_out = test::random_floats(rng, B * S * dim, -1, 1);
  auto d_rows = to_device(rows);
  auto d_b = upload(b);
  auto d_dout = to_device(d_out);
  buffer<float, cuda_space> d_o(B * S * dim);
  sparse_gradients<cuda_space> dg;
  sparse_gradients<host_space> hg;
  for (combiner comb : {combiner::sum, combiner::mean}) {
    std::vector<float> h_o(B * S * dim);
    lookup_combine(host_space{}, rows.data(), width, dim, b.view(), comb, h_o.data());
    lookup_combine(cuda_space{}, d_rows.data(), width, dim, d_b.view, comb, d_o.data());
    const auto o = to_host(d_o, h_o.size());
    ASSERT_EQ(0, std::memcmp(o.data(), h_o.data(), o.size() * sizeof(float)));

    aggregate_gradients(host_space{}, b.view(), comb, d_out.data(), dim, hg);
    aggregate_gradients(cuda_space{}, d_b.view, comb, d_dout.data(), dim, dg);
    ASSERT_EQ(dg.size, hg.size);
    ASSERT_EQ(dg.dim, dim);
    const auto r = to_host(dg.rows, dg.size);
    const auto g = to_host(dg.values, dg.size * dim);
    ASSERT_EQ(0, std::memcmp(r.data(), hg.rows.data(), r.size() * sizeof(std::int64_t)));
    ASSERT_EQ(0, std::memcmp(g.data(), hg.values.data(), g.size() * sizeof(float)));
  }
}

// Rows -1 read their slot's default row (admission's refused_row::slot) as on the host, bit for
// bit, in both combiners.
TEST(sparse_cuda, default_rows_of_rows_minus_one_match_the_host_space) {
  EMBCACHE_NEED_CUDA_DEVICE();
  std::mt19937_64 rng(29);
  const std::size_t dim = 8, width = 8, num_rows = 300, B = 256, S = 5;
  const auto rows = test::random_floats(rng, num_rows * width, -1, 1);
  const auto defaults = test::random_floats(rng, S * dim, -1, 1);
  auto b = test::random_batch(rng, B, S, num_rows, 0, 3);
  for (std::size_t i = 0; i < b.indices.size(); i += 3) b.indices[i] = -1;
  auto d_rows = to_device(rows);
  auto d_defaults = to_device(defaults);
  auto d_b = upload(b);
  buffer<float, cuda_space> d_o(B * S * dim);
  for (combiner comb : {combiner::sum, combiner::mean}) {
    std::vector<float> h_o(B * S * dim);
    lookup_combine(host_space{}, rows.data(), width, dim, b.view(), comb, h_o.data(),
                   defaults.data());
    lookup_combine(cuda_space{}, d_rows.data(), width, dim, d_b.view, comb, d_o.data(),
                   d_defaults.data());
    const auto o = to_host(d_o, h_o.size());
    ASSERT_EQ(0, std::memcmp(o.data(), h_o.data(), o.size() * sizeof(float)));
  }
}

// Updates are computed in double and stored as float; nvcc may contract double multiply-adds into
// FMAs, which can move a result by one double ulp and, rarely, the stored float by one ulp.
TEST(sparse_cuda, optimizers_match_the_host_space) {
  EMBCACHE_NEED_CUDA_DEVICE();
  std::mt19937_64 rng(23);
  const std::size_t dim = 16, num_rows = 20000;
  for (optimizer_kind kind :
       {optimizer_kind::sgd, optimizer_kind::adagrad, optimizer_kind::adam, optimizer_kind::ftrl}) {
    for (float lr_power : {-0.5f, -0.3f}) {
      if (kind != optimizer_kind::ftrl && lr_power != -0.5f) continue;
      optimizer_options o;
      o.kind = kind;
      o.learning_rate = 0.01f;
      o.ftrl_alpha = 0.05f;
      o.ftrl_l1 = 0.001f;
      o.ftrl_l2 = 0.01f;
      o.ftrl_lr_power = lr_power;
      const std::size_t width = dim + state_width(kind, dim);
      auto rows = test::random_floats(rng, num_rows * width, 0.0f, 0.5f);
      auto d_rows = to_device(rows);
      sparse_gradients<host_space> hg;
      sparse_gradients<cuda_space> dg;
      for (std::uint64_t step = 1; step <= 10; ++step) {
        const auto b = test::random_batch(rng, 512, 8, num_rows, 1, 3);
        const auto d_out = test::random_floats(rng, 512 * 8 * dim, -1, 1);
        auto d_b = upload(b);
        auto d_dout = to_device(d_out);
        aggregate_gradients(host_space{}, b.view(), combiner::sum, d_out.data(), dim, hg);
        aggregate_gradients(cuda_space{}, d_b.view, combiner::sum, d_dout.data(), dim, dg);
        apply_optimizer(host_space{}, o, rows.data(), width, hg, step);
        apply_optimizer(cuda_space{}, o, d_rows.data(), width, dg, step);
      }
      const auto got = to_host(d_rows, rows.size());
      std::size_t differing = 0;
      for (std::size_t i = 0; i < rows.size(); ++i) {
        if (got[i] == rows[i]) continue;
        ++differing;
        ASSERT_LE(std::fabs(double(got[i]) - double(rows[i])),
                  1e-6 * std::max(std::fabs(double(rows[i])), 1e-3))
            << to_string(kind) << " float " << i;
      }
      // Almost every float is bit-identical; a handful may differ by an ulp.
      EXPECT_LE(differing, rows.size() / 1000) << to_string(kind);
    }
  }
}

// apply_optimizer's non-finite flags: the cuda space's own pass flags the rows the host space's
// fused check does.
TEST(sparse_cuda, non_finite_flags_match_the_host_space) {
  EMBCACHE_NEED_CUDA_DEVICE();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (optimizer_kind kind :
       {optimizer_kind::sgd, optimizer_kind::adagrad, optimizer_kind::adam, optimizer_kind::ftrl}) {
    optimizer_options o;
    o.kind = kind;
    const std::size_t dim = 2, width = dim + state_width(kind, dim) + 1;  // one float past
    std::vector<float> rows(4 * width, 1.0f);
    rows[3 * width + width - 1] = inf;  // row 3's float past the state
    const std::vector<float> g = {0.5f, 0.5f, nan, 0, 0.25f, 0.25f, 0, 0};
    const std::vector<std::int64_t> r = {0, 1, 2, 3};
    std::vector<std::int8_t> host_flags(4, 7);
    auto d_rows = to_device(rows);
    auto d_g = to_device(g);
    auto d_r = to_device(r);
    buffer<std::int8_t, cuda_space> d_flags(4, cuda_space{});
    apply_optimizer(host_space{}, o, rows.data(), width, dim, r.data(), g.data(), 4, 1,
                    host_flags.data());
    apply_optimizer(cuda_space{}, o, d_rows.data(), width, dim, d_r.data(), d_g.data(), 4, 1,
                    d_flags.data());
    EXPECT_EQ(to_host(d_flags, 4), host_flags) << to_string(kind);
    EXPECT_EQ(host_flags, (std::vector<std::int8_t>{0, 1, 0, 1})) << to_string(kind);
  }
}

TEST(sparse_cuda, empty_batch_gives_zeros_and_no_gradients) {
  EMBCACHE_NEED_CUDA_DEVICE();
  test::owned_batch b;
  b.batch_size = 2;
  b.num_slots = 2;
  b.offsets = {0, 0, 0, 0, 0};
  auto d_b = upload(b);
  auto d_rows = to_device(std::vector<float>(8, 1.0f));
  buffer<float, cuda_space> out(4 * 4);
  out.fill_bytes(0x7f);
  lookup_combine(cuda_space{}, d_rows.data(), 4, 4, d_b.view, combiner::mean, out.data());
  EXPECT_EQ(to_host(out, 16), std::vector<float>(16, 0.0f));
  sparse_gradients<cuda_space> g;
  auto d_dout = to_device(std::vector<float>(16, 1.0f));
  aggregate_gradients(cuda_space{}, d_b.view, combiner::sum, d_dout.data(), 4, g);
  EXPECT_EQ(g.size, 0u);
}

}  // namespace
}  // namespace embcache
