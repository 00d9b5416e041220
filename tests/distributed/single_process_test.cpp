// The single-process communicator, and a sharded table on one rank: with one block it is the
// host-hybrid step itself (same bits), and it checks its input like the host-hybrid table.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/status_assertions.hpp"
#include "embcache/distributed/communicator.hpp"
#include "embcache/distributed/sharded_table.hpp"
#include "embcache/host_hybrid.hpp"
#include "test_util.hpp"

namespace embcache::test {
namespace {

TEST(single_process_communicator_test, collectives_are_local_copies) {
  single_process_communicator c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  EMBCACHE_EXPECT_OK(c.barrier());
  const std::vector<int> send = {1, 2, 3};
  std::vector<int> recv;
  std::vector<std::size_t> rc;
  EMBCACHE_ASSERT_OK(exchange(c, send, {3}, recv, rc));
  EXPECT_EQ(recv, send);
  EXPECT_EQ(rc, std::vector<std::size_t>{3});
  EXPECT_EQ(exchange(c, send, {2}, recv, rc).code(), status_code::invalid_argument);
  EXPECT_EQ(exchange(c, send, {1, 2}, recv, rc).code(), status_code::invalid_argument);
  int x = 5;
  EMBCACHE_EXPECT_OK(c.broadcast(&x, sizeof(x), 0));
  EXPECT_EQ(c.broadcast(&x, sizeof(x), 1).code(), status_code::invalid_argument);
  const std::size_t three = 3 * sizeof(int), two = 2 * sizeof(int), zero = 0;
  int out[3] = {};
  EXPECT_EQ(c.all_to_all_v(send.data(), &three, &zero, out, &two, &zero).code(),
            status_code::invalid_argument);
  float f = 1.5f;
  EMBCACHE_EXPECT_OK(c.all_reduce_sum(&f, 1));
  EXPECT_EQ(f, 1.5f);
  EMBCACHE_EXPECT_OK(agree(c, status{}, "op"));
  EXPECT_EQ(agree(c, status::io_error("x"), "op").code(), status_code::io_error);
}

class one_block_equals_host_hybrid : public ::testing::TestWithParam<optimizer_kind> {};

TEST_P(one_block_equals_host_hybrid, same_outputs_and_rows) {
  const sharded_table_options o = table_options(GetParam(), 1, combiner::mean);
  const batch_spec spec{1, 24, 3, 5};
  single_process_communicator alone;
  host_store<std::int64_t> sharded_store(store_options(o)), hybrid_store(store_options(o));
  sharded_table<std::int64_t> sharded(alone, sharded_store, o);
  host_hybrid_table<std::int64_t> hybrid(hybrid_store, o.table);
  const std::size_t dim = o.table.dim;
  for (std::uint64_t s = 0; s < 4; ++s) {
    const block_batch b = make_blocks(spec, s, 0, 1);
    std::vector<float> out_s(b.batch_size * b.num_slots * dim), out_h(out_s.size());
    EMBCACHE_ASSERT_OK(sharded.forward(b.view(), out_s.data()));
    EMBCACHE_ASSERT_OK(hybrid.forward(b.view(), out_h.data()));
    ASSERT_EQ(std::memcmp(out_s.data(), out_h.data(), out_s.size() * sizeof(float)), 0);
    const std::vector<float> d_out = make_d_out(b, out_s, dim, s);
    EMBCACHE_ASSERT_OK(sharded.backward(d_out.data()));
    EMBCACHE_ASSERT_OK(hybrid.backward(d_out.data()));
    // One rank: nothing crosses to another rank, and the minimum is counted.
    EXPECT_EQ(sharded.last_stats().bytes_sent, 0u);
    EXPECT_EQ(sharded.last_stats().min_bytes, sharded.last_stats().unique_keys * dim * 4);
  }
  EXPECT_EQ(sharded.step(), hybrid.step());
  EXPECT_TRUE(read_store(sharded_store).same_rows_and_versions(read_store(hybrid_store)));
}

INSTANTIATE_TEST_SUITE_P(optimizers, one_block_equals_host_hybrid,
                         ::testing::Values(optimizer_kind::sgd, optimizer_kind::adagrad,
                                           optimizer_kind::adam, optimizer_kind::ftrl),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(sharded_table_input, bad_batches_and_misuse_are_refused) {
  single_process_communicator alone;
  sharded_table_options o = table_options(optimizer_kind::sgd, 4);
  host_store<std::int64_t> store(store_options(o));
  o.num_blocks = 0;
  EXPECT_THROW(sharded_table<std::int64_t>(alone, store, o), error);
  o.num_blocks = 4;
  sharded_table<std::int64_t> t(alone, store, o);
  std::vector<float> out(64);
  EXPECT_THROW(static_cast<void>(t.backward(out.data())), error);
  const std::int64_t keys[2] = {1, 2};
  const std::int64_t offsets[5] = {0, 1, 2, 1, 2};  // decreasing at bag 2
  key_batch<std::int64_t> b{4, 1, offsets, keys, 2};
  status s = t.forward(b, out.data());
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_NE(s.message().find("offsets decrease at bag 2"), std::string::npos) << s.to_string();
  b.batch_size = 3;  // 3 samples do not split into 4 blocks
  b.num_keys = 1;
  s = t.forward(b, out.data());
  EXPECT_NE(s.message().find("does not split"), std::string::npos) << s.to_string();
  const std::int64_t good[5] = {0, 1, 1, 1, 2};
  b = key_batch<std::int64_t>{4, 1, good, keys, 2};
  EMBCACHE_EXPECT_OK(t.forward(b, out.data()));
  EXPECT_EQ(t.last_stats().unique_keys, 2u);
}

}  // namespace
}  // namespace embcache::test
