// The dense network: gradients against finite differences, dropout masks, Adam, serialization.
#include "embcache/trainer/dense_network.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "common/random_vector.hpp"
#include "common/status_assertions.hpp"

namespace embcache {
namespace {

using test::random_vector;

TEST(dense_network, shape_and_offsets) {
  dense_network_options o;
  o.input_dim = 5;
  o.hidden = {4, 3};
  dense_network<host_space> net(o);
  EXPECT_EQ(net.num_layers(), 3u);
  EXPECT_EQ(net.num_parameters(), 5u * 4 + 4 + 4 * 3 + 3 + 3 + 1);
  EXPECT_EQ(net.weight_offset(0), 0u);
  EXPECT_EQ(net.weight_offset(1), 24u);
  EXPECT_EQ(net.weight_offset(2), 39u);
  EXPECT_EQ(net.fan_out(2), 1u);
  // Xavier bound per layer, zero biases.
  const auto p = net.parameters();
  for (std::size_t l = 0; l < 3; ++l) {
    const double a = std::sqrt(6.0 / double(net.fan_in(l) + net.fan_out(l)));
    const std::size_t nw = net.fan_in(l) * net.fan_out(l);
    for (std::size_t i = 0; i < nw; ++i) EXPECT_LE(std::fabs(p[net.weight_offset(l) + i]), a);
    for (std::size_t i = 0; i < net.fan_out(l); ++i)
      EXPECT_EQ(p[net.weight_offset(l) + nw + i], 0.0f);
  }
  // Same seed, same weights; another seed, other weights.
  EXPECT_EQ(dense_network<host_space>(o).parameters(), p);
  o.seed = 1;
  EXPECT_NE(dense_network<host_space>(o).parameters(), p);
}

TEST(dense_network, bad_options_name_the_field) {
  dense_network_options o;
  EXPECT_EQ(check_options(o).code(), status_code::invalid_argument);
  EXPECT_NE(check_options(o).message().find("input_dim"), std::string::npos);
  o.input_dim = 3;
  o.dropout = 1.0f;
  EXPECT_NE(check_options(o).message().find("dropout"), std::string::npos);
  o.dropout = 0;
  o.hidden = {4, 0};
  EXPECT_NE(check_options(o).message().find("hidden[1]"), std::string::npos);
  EXPECT_THROW(dense_network<host_space>{o}, error);
}

// Forward in double on the host copy of the parameters, the reference for the BLAS path.
std::vector<double> reference_logits(const dense_network<host_space>& net,
                                     const std::vector<float>& p, const std::vector<float>& x,
                                     std::size_t batch) {
  std::vector<double> out(batch);
  for (std::size_t b = 0; b < batch; ++b) {
    std::vector<double> h(x.begin() + b * net.fan_in(0), x.begin() + (b + 1) * net.fan_in(0));
    for (std::size_t l = 0; l < net.num_layers(); ++l) {
      const std::size_t in = net.fan_in(l), o = net.fan_out(l), off = net.weight_offset(l);
      std::vector<double> z(o);
      for (std::size_t j = 0; j < o; ++j) {
        double s = p[off + in * o + j];
        for (std::size_t i = 0; i < in; ++i) s += h[i] * p[off + i * o + j];
        z[j] = (l + 1 < net.num_layers()) ? std::max(s, 0.0) : s;
      }
      h = z;
    }
    out[b] = h[0];
  }
  return out;
}

TEST(dense_network, forward_matches_double_reference) {
  dense_network_options o;
  o.input_dim = 7;
  o.hidden = {6, 5};
  o.dropout = 0.3f;
  dense_network<host_space> net(o);
  const std::size_t batch = 9;
  const auto x = random_vector(batch * 7, 3);
  std::vector<float> logits(batch);
  net.forward(x.data(), batch, false, 0, logits.data());
  const auto ref = reference_logits(net, net.parameters(), x, batch);
  for (std::size_t b = 0; b < batch; ++b) EXPECT_NEAR(logits[b], ref[b], 1e-5) << b;
}

// Loss = sum_b c_b * logit_b, so d(loss)/d(logit_b) = c_b; every gradient is checked against a
// central difference in double, computed through the float forward. Dropout on: the masks are
// fixed by (seed, step), so the function is the same one at every perturbation.
TEST(dense_network, gradients_match_finite_differences) {
  dense_network_options o;
  o.input_dim = 6;
  o.hidden = {5, 4};
  o.dropout = 0.25f;
  o.seed = 11;
  dense_network<host_space> net(o);
  const std::size_t batch = 4;
  const auto x1 = random_vector(batch * 4, 5);
  const auto x2 = random_vector(batch * 2, 6);
  const auto c = random_vector(batch, 7);
  const input_block blocks[2] = {{x1.data(), 4}, {x2.data(), 2}};
  std::vector<float> logits(batch), dx1(batch * 4), dx2(batch * 2);
  net.forward(blocks, 2, batch, true, 3, logits.data());
  float* d_blocks[2] = {dx1.data(), dx2.data()};
  net.backward(c.data(), d_blocks);
  const auto grads = net.gradients();
  const auto p0 = net.parameters();

  auto loss_at = [&](const std::vector<float>& p, const std::vector<float>& a,
                     const std::vector<float>& b) {
    EMBCACHE_EXPECT_OK(net.set_parameters(p));
    const input_block blk[2] = {{a.data(), 4}, {b.data(), 2}};
    std::vector<float> z(batch);
    net.forward(blk, 2, batch, true, 3, z.data());
    double s = 0;
    for (std::size_t i = 0; i < batch; ++i) s += double(c[i]) * z[i];
    return s;
  };
  // The float forward with a step of 1e-2 keeps rounding noise (~1e-6 / 1e-2) far under the
  // bound; the net is piecewise linear, so the difference is exact unless a ReLU changes side
  // within the step. Such a kink shows as one-sided differences that disagree: those few
  // parameters are skipped, every other one must match.
  const double h = 1e-2, tol = 1e-3;
  const double l0 = loss_at(p0, x1, x2);
  std::size_t checked = 0, kinks = 0;
  for (std::size_t i = 0; i < p0.size(); ++i) {
    auto pp = p0, pm = p0;
    pp[i] += float(h);
    pm[i] -= float(h);
    const double up = (loss_at(pp, x1, x2) - l0) / h, down = (l0 - loss_at(pm, x1, x2)) / h;
    if (std::fabs(up - down) > tol) {
      ++kinks;
      continue;
    }
    EXPECT_NEAR(grads[i], 0.5 * (up + down), tol * (1 + std::fabs(up))) << "parameter " << i;
    ++checked;
  }
  EXPECT_LE(kinks, p0.size() / 10);
  EXPECT_EQ(checked + kinks, p0.size());
  for (std::size_t i = 0; i < x1.size(); ++i) {
    auto ap = x1, am = x1;
    ap[i] += float(h);
    am[i] -= float(h);
    const double fd = (loss_at(p0, ap, x2) - loss_at(p0, am, x2)) / (2 * h);
    EXPECT_NEAR(dx1[i], fd, 1e-3 * (1 + std::fabs(fd))) << i;
  }
  for (std::size_t i = 0; i < x2.size(); ++i) {
    auto bp = x2, bm = x2;
    bp[i] += float(h);
    bm[i] -= float(h);
    const double fd = (loss_at(p0, x1, bp) - loss_at(p0, x1, bm)) / (2 * h);
    EXPECT_NEAR(dx2[i], fd, 1e-3 * (1 + std::fabs(fd))) << i;
  }
  // A gradient that is wrong by a factor would fail: the checked gradients are not all zero.
  double norm = 0;
  for (float g : grads) norm += std::fabs(g);
  EXPECT_GT(norm, 0.1);
}

TEST(dense_network, dropout_mask_is_a_pure_function_of_seed_step_layer_element) {
  const float rate = 0.5f;
  std::size_t kept = 0;
  for (std::uint64_t i = 0; i < 100000; ++i) kept += dropout_keep(7, 3, 1, i, rate);
  EXPECT_NEAR(double(kept) / 100000, 0.5, 0.01);
  EXPECT_EQ(dropout_keep(7, 3, 1, 12345, rate), dropout_keep(7, 3, 1, 12345, rate));
  std::size_t same_step = 0, same_layer = 0, same_seed = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    const bool k = dropout_keep(7, 3, 1, i, rate);
    same_step += k == dropout_keep(7, 4, 1, i, rate);
    same_layer += k == dropout_keep(7, 3, 2, i, rate);
    same_seed += k == dropout_keep(8, 3, 1, i, rate);
  }
  // Independent masks agree on about half the elements.
  EXPECT_LT(same_step, 600u);
  EXPECT_LT(same_layer, 600u);
  EXPECT_LT(same_seed, 600u);
  for (std::uint64_t i = 0; i < 1000; ++i) EXPECT_TRUE(dropout_keep(7, 3, 1, i, 0.0f));
}

TEST(dense_network, dropout_is_reproducible_and_matches_the_mask) {
  dense_network_options o;
  o.input_dim = 3;
  o.hidden = {64};
  o.dropout = 0.5f;
  o.seed = 5;
  // One hidden layer whose output weights are all 1 and bias 0: the logit is the sum of the
  // kept activations times 2, so it can be computed from dropout_keep directly.
  dense_network<host_space> net(o);
  auto p = net.parameters();
  for (std::size_t j = 0; j < 64; ++j) p[net.weight_offset(1) + j] = 1.0f;
  EMBCACHE_ASSERT_OK(net.set_parameters(p));
  const std::size_t batch = 5;
  const auto x = random_vector(batch * 3, 9);
  std::vector<float> a(batch), b(batch), eval(batch);
  net.forward(x.data(), batch, true, 17, a.data());
  net.forward(x.data(), batch, true, 17, b.data());
  EXPECT_EQ(a, b);
  net.forward(x.data(), batch, true, 18, b.data());
  EXPECT_NE(a, b);
  net.forward(x.data(), batch, false, 17, eval.data());
  for (std::size_t r = 0; r < batch; ++r) {
    double expect = 0, full = 0;
    for (std::size_t j = 0; j < 64; ++j) {
      double z = 0;
      for (std::size_t i = 0; i < 3; ++i) z += double(x[r * 3 + i]) * p[i * 64 + j];
      z = std::max(z, 0.0);
      full += z;
      if (dropout_keep(5, 17, 0, r * 64 + j, 0.5f)) expect += 2 * z;
    }
    EXPECT_NEAR(a[r], expect, 1e-4) << r;
    EXPECT_NEAR(eval[r], full, 1e-4) << r;
  }
}

TEST(dense_network, adam_step_matches_the_formula) {
  dense_network_options o;
  o.input_dim = 2;
  o.hidden = {3};
  o.dropout = 0;
  o.adam.learning_rate = 0.01f;
  dense_network<host_space> net(o);
  const auto x = random_vector(4 * 2, 1);
  const std::vector<float> d(4, 0.25f);
  std::vector<float> z(4);
  auto w = net.parameters();
  std::vector<double> m(w.size(), 0), v(w.size(), 0);
  for (int t = 1; t <= 3; ++t) {
    net.forward(x.data(), 4, true, t, z.data());
    net.backward(d.data(), nullptr);
    const auto g = net.gradients();
    net.apply_adam();
    for (std::size_t i = 0; i < w.size(); ++i) {
      // Computed in double from the stored floats, stored as float (the documented rounding).
      const double mi = double(0.9f) * m[i] + (1 - double(0.9f)) * g[i];
      const double vi = double(0.999f) * v[i] + (1 - double(0.999f)) * double(g[i]) * g[i];
      m[i] = float(mi);
      v[i] = float(vi);
      const double mh = mi / (1 - std::pow(double(0.9f), t));
      const double vh = vi / (1 - std::pow(double(0.999f), t));
      w[i] = float(double(w[i]) - double(0.01f) * mh / (std::sqrt(vh) + double(1e-8f)));
    }
    EXPECT_EQ(net.parameters(), w) << "step " << t;
  }
  EXPECT_EQ(net.adam_step(), 3u);
}

TEST(dense_network, save_load_round_trip_and_corruption) {
  dense_network_options o;
  o.input_dim = 4;
  o.hidden = {8, 4};
  o.dropout = 0.1f;
  dense_network<host_space> a(o);
  const auto x = random_vector(6 * 4, 2);
  const std::vector<float> d(6, 0.1f);
  std::vector<float> z(6);
  for (int t = 0; t < 2; ++t) {
    a.forward(x.data(), 6, true, t, z.data());
    a.backward(d.data(), nullptr);
    a.apply_adam();
  }
  const auto blob = a.save();
  dense_network<host_space> b(o);  // untrained: everything must come from the blob
  ASSERT_NE(b.parameters(), a.parameters());
  EMBCACHE_ASSERT_OK(b.load(blob.data(), blob.size()));
  EXPECT_EQ(b.parameters(), a.parameters());
  EXPECT_EQ(b.adam_step(), 2u);
  EXPECT_EQ(b.save(), blob);  // Adam moments included
  // One more identical step on both keeps them identical.
  for (auto* n : {&a, &b}) {
    n->forward(x.data(), 6, true, 5, z.data());
    n->backward(d.data(), nullptr);
    n->apply_adam();
  }
  EXPECT_EQ(b.parameters(), a.parameters());

  // A flipped bit anywhere, or a truncated blob, is refused and changes nothing.
  const auto before = b.parameters();
  auto bad = blob;
  bad[bad.size() / 2] ^= 0x10;
  status s = b.load(bad.data(), bad.size());
  EXPECT_EQ(s.code(), status_code::corruption);
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.message();
  s = b.load(blob.data(), blob.size() - 5);
  EXPECT_EQ(s.code(), status_code::corruption);
  s = b.load(blob.data(), 3);
  EXPECT_EQ(s.code(), status_code::corruption);
  EXPECT_EQ(b.parameters(), before);
  // Another shape: invalid_argument naming both shapes.
  o.hidden = {8, 5};
  dense_network<host_space> c(o);
  s = c.load(blob.data(), blob.size());
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_NE(s.message().find("4-8-4-1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("4-8-5-1"), std::string::npos) << s.message();

  // Files: round trip, missing file, corrupted file.
  const std::string path = ::testing::TempDir() + "dense_network_test.bin";
  EMBCACHE_ASSERT_OK(a.save_file(path));
  o.hidden = {8, 4};
  dense_network<host_space> d2(o);
  EMBCACHE_ASSERT_OK(d2.load_file(path));
  EXPECT_EQ(d2.save(), a.save());
  EXPECT_EQ(d2.load_file(path + ".missing").code(), status_code::not_found);
  {
    std::FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 40, SEEK_SET);
    std::fputc(0x5a, f);
    std::fclose(f);
  }
  s = d2.load_file(path);
  EXPECT_EQ(s.code(), status_code::corruption);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace embcache
