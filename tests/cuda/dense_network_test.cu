// The dense network and the Wide&Deep glue in the cuda space (cuBLAS) against the host space
// (OpenBLAS) on the same inputs and weights, and the cuda dense_backend's two ways in: host arrays
// and pooled embeddings already on the device (skips without a device).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_device.hpp"
#include "common/status_assertions.hpp"
#include "embcache/buffer.hpp"
#include "embcache/trainer/dense_backend.hpp"
#include "embcache/trainer/dense_network.hpp"
#include "embcache/trainer/wide_deep.hpp"

namespace embcache {
namespace {

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

buffer<float, cuda_space> upload(const std::vector<float>& v) {
  buffer<float, cuda_space> b(v.size());
  b.copy_from_host(v.data(), v.size());
  return b;
}

std::vector<float> download(const buffer<float, cuda_space>& b) {
  std::vector<float> v(b.size());
  b.copy_to_host(v.data(), v.size());
  detail::synchronize(b.space());
  return v;
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rel,
                  const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 0;
  for (float x : b) scale = std::max(scale, double(std::fabs(x)));
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], rel * (scale + 1e-6)) << what << " at " << i;
}

TEST(dense_network_cuda, forward_backward_adam_match_host) {
  EMBCACHE_NEED_CUDA_DEVICE();
  dense_network_options o;
  o.input_dim = 40;
  o.hidden = {64, 32};
  o.dropout = 0.3f;
  o.seed = 4;
  dense_network<host_space> host(o);
  dense_network<cuda_space> dev(o);
  ASSERT_EQ(dev.parameters(), host.parameters());  // same initialization
  const std::size_t batch = 37;
  const auto x1 = random_floats(batch * 30, 1), x2 = random_floats(batch * 10, 2);
  const auto d = random_floats(batch, 3);
  auto dx1 = upload(x1), dx2 = upload(x2), dd = upload(d);
  buffer<float, cuda_space> dlogits(batch), dg1(batch * 30);
  std::vector<float> logits(batch), g1(batch * 30);
  for (std::uint64_t step = 0; step < 3; ++step) {
    const input_block hb[2] = {{x1.data(), 30}, {x2.data(), 10}};
    const input_block db[2] = {{dx1.data(), 30}, {dx2.data(), 10}};
    host.forward(hb, 2, batch, true, step, logits.data());
    dev.forward(db, 2, batch, true, step, dlogits.data());
    expect_close(download(dlogits), logits, 1e-4, "logits");
    float* hd[2] = {g1.data(), nullptr};
    float* ddv[2] = {dg1.data(), nullptr};
    host.backward(d.data(), hd);
    dev.backward(dd.data(), ddv);
    expect_close(download(dg1), g1, 1e-4, "input gradient");
    expect_close(dev.gradients(), host.gradients(), 1e-4, "parameter gradients");
    host.apply_adam();
    dev.apply_adam();
    expect_close(dev.parameters(), host.parameters(), 1e-4, "parameters after Adam");
  }
  // The blob is portable between the spaces.
  const auto blob = dev.save();
  dense_network<host_space> restored(o);
  EMBCACHE_ASSERT_OK(restored.load(blob.data(), blob.size()));
  EXPECT_EQ(restored.parameters(), dev.parameters());
}

TEST(dense_network_cuda, wide_deep_matches_host) {
  EMBCACHE_NEED_CUDA_DEVICE();
  wide_deep_options o;
  o.hidden = {32, 16};
  o.dropout = 0.2f;
  const std::size_t n = 50;
  const auto wide = random_floats(n * 26, 1), deep = random_floats(n * 26 * 16, 2),
             dense = random_floats(n * 13, 3);
  std::vector<float> labels(n);
  for (std::size_t i = 0; i < n; ++i) labels[i] = float(i % 3 == 0);
  wide_deep_model<host_space> host(o);
  wide_deep_model<cuda_space> dev(o);
  auto dw = upload(wide), ddp = upload(deep), dds = upload(dense);
  buffer<float, cuda_space> d_wide(n * 26), d_deep(n * 26 * 16);
  std::vector<float> h_wide(n * 26), h_deep(n * 26 * 16), hl, dl;
  const double lh =
      host.forward_backward({n, wide.data(), deep.data(), dense.data(), labels.data()}, 1,
                            h_wide.data(), h_deep.data(), &hl);
  const double ld = dev.forward_backward({n, dw.data(), ddp.data(), dds.data(), labels.data()}, 1,
                                         d_wide.data(), d_deep.data(), &dl);
  EXPECT_NEAR(ld, lh, 1e-5);
  expect_close(dl, hl, 1e-4, "logits");
  expect_close(download(d_wide), h_wide, 1e-4, "wide gradient");
  expect_close(download(d_deep), h_deep, 1e-4, "deep gradient");
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// forward_backward_on_device runs the same kernels on the same device values as forward_backward
// (which copies the pooled embeddings there first): the same losses, logits, gradients and dense
// state, bit for bit, step after step.
TEST(dense_backend_cuda, device_inputs_give_the_bits_of_host_arrays) {
  EMBCACHE_NEED_CUDA_DEVICE();
  wide_deep_options o;
  o.num_wide_slots = 39;
  o.hidden = {32, 16};
  o.dropout = 0.2f;
  o.seed = 7;
  auto by_host = make_cuda_dense_backend(o);
  auto on_device = make_cuda_dense_backend(o);
  ASSERT_TRUE(on_device->takes_device_inputs());
  const std::size_t n = 50, n_wide = n * 39, n_deep = n * 26 * 16;
  std::vector<float> labels(n);
  for (std::size_t i = 0; i < n; ++i) labels[i] = float(i % 3 == 0);
  buffer<float, cuda_space> d_wide(n_wide), d_deep(n_deep);
  std::vector<float> h_wide(n_wide), h_deep(n_deep), lh, ld;
  for (std::uint64_t step = 1; step <= 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::uint32_t seed = std::uint32_t(10 * step);
    const auto wide = random_floats(n_wide, seed), deep = random_floats(n_deep, seed + 1),
               dense = random_floats(n * 13, seed + 2);
    auto dw = upload(wide), dd = upload(deep);
    const double a =
        by_host->forward_backward({n, wide.data(), deep.data(), dense.data(), labels.data()}, step,
                                  h_wide.data(), h_deep.data(), &lh);
    const double b = on_device->forward_backward_on_device(
        {n, dw.data(), dd.data(), dense.data(), labels.data()}, step, d_wide.data(), d_deep.data(),
        &ld);
    EXPECT_EQ(a, b);
    EXPECT_TRUE(same_bits(lh, ld)) << "logits";
    EXPECT_TRUE(same_bits(download(d_wide), h_wide)) << "wide gradient";
    EXPECT_TRUE(same_bits(download(d_deep), h_deep)) << "deep gradient";
    by_host->apply_dense_update();
    on_device->apply_dense_update();
  }
  EXPECT_TRUE(by_host->save() == on_device->save());
}

// A block of a larger batch (wide_deep_batch::mean_over, the sharded trainer's blocks) keeps its
// share of the batch's mean through the cuda backend, both ways in: twice the samples, half the
// gradient (exactly: a power of two).
TEST(dense_backend_cuda, keeps_the_mean_over_of_a_block) {
  EMBCACHE_NEED_CUDA_DEVICE();
  wide_deep_options o;
  o.hidden = {16};
  const std::size_t n = 20, n_wide = n * 26, n_deep = n * 26 * 16;
  const auto wide = random_floats(n_wide, 1), deep = random_floats(n_deep, 2),
             dense = random_floats(n * 13, 3);
  std::vector<float> labels(n, 1.0f);
  auto dw = upload(wide), dd = upload(deep);
  std::vector<float> whole(n_wide), half(n_wide), deep_grad(n_deep);
  buffer<float, cuda_space> on_wide(n_wide), on_deep(n_deep);
  wide_deep_batch b{n, wide.data(), deep.data(), dense.data(), labels.data()};
  make_cuda_dense_backend(o)->forward_backward(b, 1, whole.data(), deep_grad.data());
  b.mean_over = 2 * n;
  make_cuda_dense_backend(o)->forward_backward(b, 1, half.data(), deep_grad.data());
  b.wide = dw.data();
  b.deep = dd.data();
  make_cuda_dense_backend(o)->forward_backward_on_device(b, 1, on_wide.data(), on_deep.data());
  for (std::size_t i = 0; i < n_wide; ++i) ASSERT_EQ(half[i], whole[i] / 2) << i;
  EXPECT_TRUE(same_bits(download(on_wide), half));
}

}  // namespace
}  // namespace embcache
