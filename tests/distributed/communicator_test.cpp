// The MPI communicator's collectives, run by every rank of the job (1, 2 or 4 ranks), and the
// block-ordered dense all-reduce.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "common/status_assertions.hpp"
#include "embcache/detail/hash.hpp"
#include "embcache/distributed/dense_all_reduce.hpp"
#include "mpi_env.hpp"

namespace embcache::test {
namespace {

TEST(mpi_communicator_test, rank_and_size_match_mpi) {
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(world().rank(), rank);
  EXPECT_EQ(world().size(), size);
  EMBCACHE_EXPECT_OK(world().barrier());
}

// Rank r sends r + p + 1 int32 values (r * 1000 + p * 10 + i) to rank p, none to itself when
// r is odd: counts differ per pair and some are zero.
TEST(mpi_communicator_test, all_to_all_v_delivers_every_pair) {
  const int r = world().rank(), n = world().size();
  auto count = [](int from, int to) -> std::size_t {
    return from % 2 == 1 && from == to ? 0 : static_cast<std::size_t>(from + to + 1);
  };
  std::vector<std::int32_t> send;
  std::vector<std::size_t> sc(n);
  for (int p = 0; p < n; ++p) {
    sc[p] = count(r, p);
    for (std::size_t i = 0; i < sc[p]; ++i) send.push_back(r * 1000 + p * 10 + int(i));
  }
  std::vector<std::int32_t> recv;
  std::vector<std::size_t> rc;
  EMBCACHE_ASSERT_OK(exchange(world(), send, sc, recv, rc));
  std::vector<std::int32_t> expect;
  for (int p = 0; p < n; ++p) {
    EXPECT_EQ(rc[p], count(p, r));
    for (std::size_t i = 0; i < count(p, r); ++i) expect.push_back(p * 1000 + r * 10 + int(i));
  }
  EXPECT_EQ(recv, expect);
}

TEST(mpi_communicator_test, all_to_all_gather_broadcast_and_sums) {
  const int r = world().rank(), n = world().size();
  std::vector<std::uint64_t> out(n), in(n);
  for (int p = 0; p < n; ++p) out[p] = std::uint64_t(r) * 100 + p;
  EMBCACHE_ASSERT_OK(world().all_to_all(out.data(), sizeof(std::uint64_t), in.data()));
  for (int p = 0; p < n; ++p) EXPECT_EQ(in[p], std::uint64_t(p) * 100 + r);

  const std::uint64_t mine = 7 + r;
  std::vector<std::uint64_t> all(n);
  EMBCACHE_ASSERT_OK(world().all_gather(&mine, sizeof(mine), all.data()));
  for (int p = 0; p < n; ++p) EXPECT_EQ(all[p], 7u + p);

  char text[16] = {};
  if (r == n - 1) std::strcpy(text, "from the last");
  EMBCACHE_ASSERT_OK(world().broadcast(text, sizeof(text), n - 1));
  EXPECT_STREQ(text, "from the last");

  // Sums of values every order adds exactly, and the maximum.
  std::uint64_t u[2] = {std::uint64_t(r) + 1, (std::uint64_t{1} << 40) + r};
  EMBCACHE_ASSERT_OK(world().all_reduce_sum(u, 2));
  EXPECT_EQ(u[0], std::uint64_t(n) * (n + 1) / 2);
  EXPECT_EQ(u[1], (std::uint64_t(n) << 40) + std::uint64_t(n) * (n - 1) / 2);
  float f[3] = {1.0f, float(r), 0.5f};
  EMBCACHE_ASSERT_OK(world().all_reduce_sum(f, 3));
  EXPECT_EQ(f[0], float(n));
  EXPECT_EQ(f[1], float(n * (n - 1) / 2));
  EXPECT_EQ(f[2], 0.5f * n);
  double d = 0.25 * r;
  EMBCACHE_ASSERT_OK(world().all_reduce_sum(&d, 1));
  EXPECT_EQ(d, 0.25 * n * (n - 1) / 2);
  std::uint64_t mx = 3 + std::uint64_t(r) * 5;
  EMBCACHE_ASSERT_OK(world().all_reduce_max(&mx, 1));
  EXPECT_EQ(mx, 3 + std::uint64_t(n - 1) * 5);
}

TEST(mpi_communicator_test, errors_name_the_call_and_the_rank) {
  const int r = world().rank(), n = world().size();
  // Refused before any message moves, identically on every rank (so no rank waits alone).
  const status bad_root = world().broadcast(nullptr, 0, n);
  EXPECT_EQ(bad_root.code(), status_code::invalid_argument);
  EXPECT_NE(bad_root.message().find("MPI_Bcast on rank " + std::to_string(r)), std::string::npos)
      << bad_root.to_string();
  std::vector<std::size_t> counts(n, 0), displs(n, 0);
  counts[0] = std::size_t{INT_MAX} + 1;
  const status big = world().all_to_all_v(nullptr, counts.data(), displs.data(), nullptr,
                                          counts.data(), displs.data());
  EXPECT_EQ(big.code(), status_code::invalid_argument);
  EXPECT_NE(big.message().find("MPI_Alltoallv on rank " + std::to_string(r)), std::string::npos)
      << big.to_string();
  const std::string m = mpi_error_message(MPI_ERR_COUNT, "Allreduce", 3, 8);
  EXPECT_EQ(m.rfind("MPI_Allreduce failed on rank 3 of 8: ", 0), 0u) << m;
  EXPECT_GT(m.size(), std::string("MPI_Allreduce failed on rank 3 of 8: ").size());
}

TEST(mpi_communicator_test, agree_names_the_failing_rank) {
  const int r = world().rank(), n = world().size();
  EMBCACHE_EXPECT_OK(agree(world(), status{}, "nothing"));
  const int failing = n - 1;
  const status local = r == failing ? status::io_error("disk gone") : status{};
  const status s = agree(world(), local, "the op");
  ASSERT_FALSE(s.ok());
  if (r == failing) {
    EXPECT_EQ(s.code(), status_code::io_error);
  } else {
    EXPECT_NE(s.message().find("the op: rank " + std::to_string(failing) + " of " +
                               std::to_string(n) + " failed"),
              std::string::npos)
        << s.to_string();
  }
}

// Partials with magnitudes 1e8 apart, so that the order of the sum shows in the bits.
float partial(std::size_t block, std::size_t e) {
  const std::uint64_t h = detail::hash_words(block, e, 99);
  const float unit = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
  return (h & 1) ? unit * 1e8f : unit - 0.5f;
}

TEST(dense_all_reduce_test, block_order_sum_is_the_same_bits_on_every_world_size) {
  const std::size_t blocks = 8, n = 37;  // n not a multiple of the world size
  const int r = world().rank(), world_size = world().size();
  const std::size_t per = blocks / static_cast<std::size_t>(world_size);
  std::vector<float> mine(per * n);
  for (std::size_t j = 0; j < per; ++j)
    for (std::size_t e = 0; e < n; ++e) mine[j * n + e] = partial(r * per + j, e);
  std::vector<float> out(n, -1.0f);
  EMBCACHE_ASSERT_OK(all_reduce_blocks(world(), mine.data(), per, n, out.data()));

  // The serial sum in block order is what any world size must give.
  std::vector<float> expect(n, 0.0f), pairs(n, 0.0f);
  for (std::size_t g = 0; g < blocks; ++g)
    for (std::size_t e = 0; e < n; ++e) expect[e] += partial(g, e);
  EXPECT_EQ(std::memcmp(out.data(), expect.data(), n * sizeof(float)), 0);
  // The data can tell orders apart: summing pairs of blocks first differs somewhere, so a test
  // of a reduction in another order would fail.
  for (std::size_t g = 0; g < blocks; g += 2)
    for (std::size_t e = 0; e < n; ++e) pairs[e] += partial(g, e) + partial(g + 1, e);
  EXPECT_NE(std::memcmp(pairs.data(), expect.data(), n * sizeof(float)), 0);

  // Empty gradients and a zero block count.
  EMBCACHE_EXPECT_OK(all_reduce_blocks(world(), mine.data(), per, 0, out.data()));
  EXPECT_EQ(all_reduce_blocks(world(), mine.data(), 0, n, out.data()).code(),
            status_code::invalid_argument);
}

}  // namespace
}  // namespace embcache::test
