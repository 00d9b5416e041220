// The NCCL communicator on GPUs, one rank per device (ctest runs it on 1 and 2 ranks). Skips
// itself when the machine has fewer CUDA devices than the job has ranks.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status_assertions.hpp"
#include "embcache/distributed/nccl_communicator.hpp"
#include "mpi_env.hpp"

namespace embcache::test {
namespace {

template <class T>
struct device_array {
  explicit device_array(std::size_t n) : n(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T) + 1) != cudaSuccess) p = nullptr;
  }
  ~device_array() { cudaFree(p); }
  void put(const std::vector<T>& v) {
    cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> get() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  T* p = nullptr;
  std::size_t n;
};

TEST(nccl_communicator_test, collectives_on_device_buffers) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  // Every rank sees the same devices on one machine, so every rank skips or none does.
  if (devices < world().size())
    GTEST_SKIP() << devices << " CUDA devices for " << world().size() << " ranks";
  auto local = world().local_rank();
  EMBCACHE_ASSERT_OK(local);
  ASSERT_EQ(cudaSetDevice(local.value() % devices), cudaSuccess);
  auto made = nccl_communicator::create(world());
  EMBCACHE_ASSERT_OK(made);
  nccl_communicator& nccl = *made.value();
  const int r = nccl.rank(), n = nccl.size();
  EXPECT_EQ(r, world().rank());
  EXPECT_EQ(n, world().size());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);

  device_array<float> f(3);
  f.put({1.0f, float(r), 0.5f});
  EMBCACHE_ASSERT_OK(nccl.all_reduce_sum_async(f.p, 3, stream));
  device_array<std::uint64_t> u(1);
  u.put({std::uint64_t{1} << 40 | std::uint64_t(r)});
  EMBCACHE_ASSERT_OK(nccl.all_reduce_sum_async(u.p, 1, stream));
  // all_to_all_v: r + p + 1 bytes from r to p, valued r * 16 + p.
  std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
  std::vector<unsigned char> send;
  std::size_t rtotal = 0;
  for (int p = 0; p < n; ++p) {
    sd[p] = send.size();
    sc[p] = static_cast<std::size_t>(r + p + 1);
    send.insert(send.end(), sc[p], static_cast<unsigned char>(r * 16 + p));
    rd[p] = rtotal;
    rc[p] = static_cast<std::size_t>(p + r + 1);
    rtotal += rc[p];
  }
  device_array<unsigned char> s(send.size()), v(rtotal);
  s.put(send);
  EMBCACHE_ASSERT_OK(
      nccl.all_to_all_v_async(s.p, sc.data(), sd.data(), v.p, rc.data(), rd.data(), stream));
  device_array<std::uint64_t> g(n), one(1);
  one.put({std::uint64_t(100 + r)});
  EMBCACHE_ASSERT_OK(nccl.all_gather_async(one.p, sizeof(std::uint64_t), g.p, stream));
  device_array<std::uint64_t> b(1);
  b.put({std::uint64_t(r == n - 1 ? 77 : 0)});
  EMBCACHE_ASSERT_OK(nccl.broadcast_async(b.p, sizeof(std::uint64_t), n - 1, stream));
  EXPECT_EQ(nccl.broadcast_async(b.p, 8, n, stream).code(), status_code::invalid_argument);
  EMBCACHE_ASSERT_OK(nccl.synchronize(stream));

  const auto fs = f.get();
  EXPECT_EQ(fs[0], float(n));
  EXPECT_EQ(fs[1], float(n * (n - 1) / 2));
  EXPECT_EQ(fs[2], 0.5f * n);
  EXPECT_EQ(u.get()[0], (std::uint64_t(n) << 40) + std::uint64_t(n) * (n - 1) / 2);
  const auto got = v.get();
  std::vector<unsigned char> expect;
  for (int p = 0; p < n; ++p)
    expect.insert(expect.end(), rc[p], static_cast<unsigned char>(p * 16 + r));
  EXPECT_EQ(got, expect);
  const auto all = g.get();
  for (int p = 0; p < n; ++p) EXPECT_EQ(all[p], std::uint64_t(100 + p));
  EXPECT_EQ(b.get()[0], 77u);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace embcache::test
