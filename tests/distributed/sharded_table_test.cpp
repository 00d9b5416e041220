// Sharded tables under MPI (ctest runs this binary on 1, 2 and 4 ranks). Each test trains the same
// global batches on the job's ranks and, on rank 0, on one rank alone (single_process
// communicator), and pins that the models are the same bits. Collectives first, assertions after:
// a rank that returned early would leave the others waiting.
#include "embcache/distributed/sharded_table.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/status_assertions.hpp"
#include "embcache/distributed/ownership.hpp"
#include "embcache/distributed/sharded_save.hpp"
#include "mpi_env.hpp"
#include "test_util.hpp"

namespace embcache::test {
namespace {

constexpr std::size_t num_blocks = 8;  // divisible by 1, 2 and 4 ranks; 2+ blocks per rank
constexpr std::size_t steps = 5;

// The model one rank alone makes from the same batches.
model one_rank_model(const sharded_table_options& o, const batch_spec& spec, std::size_t n) {
  single_process_communicator alone;
  host_store<std::int64_t> store(store_options(o));
  sharded_table<std::int64_t> t(alone, store, o);
  train(t, spec, 0, n).throw_if_error();
  return read_store(store);
}

class sharded_table_determinism : public ::testing::TestWithParam<optimizer_kind> {};

TEST_P(sharded_table_determinism, same_bits_on_every_world_size) {
  const sharded_table_options o = table_options(GetParam(), num_blocks);
  const batch_spec spec;
  host_store<std::int64_t> store(store_options(o));
  sharded_table<std::int64_t> t(world(), store, o);
  EMBCACHE_ASSERT_OK(train(t, spec, 0, steps));
  const std::size_t my_rows = store.size();
  const model all = gather_model(world(), store);
  EXPECT_EQ(t.step(), steps);
  EXPECT_GT(my_rows, 0u) << "rank " << world().rank() << " owns no key: the test shards nothing";
  // Every rank holds exactly the keys it owns.
  for (const std::int64_t k : read_store(store).keys)
    ASSERT_EQ(owner_of(k, world().size()), world().rank());
  if (world().rank() != 0) return;

  const model ref = one_rank_model(o, spec, steps);
  ASSERT_EQ(all.keys.size(), ref.keys.size());
  EXPECT_TRUE(all.same_rows(ref)) << world().size() << " ranks and one rank disagree";
  // The run trains: rows moved away from their initial values (a model equal to its
  // initialization would pass the comparison above for any summation order).
  std::size_t moved = 0;
  for (std::size_t i = 0; i < ref.keys.size(); ++i)
    for (std::size_t d = 0; d < o.table.dim; ++d)
      if (ref.rows[i * ref.width + d] !=
          default_embedding_value(o.table.init_seed, static_cast<std::uint64_t>(ref.keys[i]), d,
                                  o.table.init_scale)) {
        ++moved;
        break;
      }
  EXPECT_GT(moved, ref.keys.size() * 9 / 10);
}

INSTANTIATE_TEST_SUITE_P(optimizers, sharded_table_determinism,
                         ::testing::Values(optimizer_kind::sgd, optimizer_kind::adagrad,
                                           optimizer_kind::adam, optimizer_kind::ftrl),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(sharded_table_mean, mean_combiner_is_the_same_bits_on_every_world_size) {
  const sharded_table_options o = table_options(optimizer_kind::adam, num_blocks, combiner::mean);
  const batch_spec spec{num_blocks, 5, 4, 21};
  host_store<std::int64_t> store(store_options(o));
  sharded_table<std::int64_t> t(world(), store, o);
  EMBCACHE_ASSERT_OK(train(t, spec, 0, steps));
  const model all = gather_model(world(), store);
  if (world().rank() == 0) EXPECT_TRUE(all.same_rows(one_rank_model(o, spec, steps)));
}

// Save on this job's ranks; load on the same number through load_sharded, and on 1, 3 and 4
// simulated ranks through load_sharded_part: every load gives back the same rows and versions.
TEST(sharded_save_test, save_on_n_ranks_loads_on_any_number) {
  const sharded_table_options o = table_options(optimizer_kind::adagrad, num_blocks);
  const batch_spec spec;
  host_store<std::int64_t> store(store_options(o));
  sharded_table<std::int64_t> t(world(), store, o);
  EMBCACHE_ASSERT_OK(train(t, spec, 0, 3));
  const std::string dir = shared_temp_dir("save");
  EMBCACHE_ASSERT_OK(t.save(dir));
  const model saved = gather_model(world(), store);

  host_store<std::int64_t> loaded_store(store_options(o));
  sharded_table<std::int64_t> loaded(world(), loaded_store, o);
  EMBCACHE_ASSERT_OK(loaded.load(dir));
  EXPECT_EQ(loaded.step(), 3u);
  const model back = gather_model(world(), loaded_store);

  if (world().rank() == 0) {
    EXPECT_TRUE(back.same_rows_and_versions(saved));
    auto manifest = read_sharded_manifest(dir);
    EMBCACHE_ASSERT_OK(manifest);
    EXPECT_EQ(manifest.value().world_size, world().size());
    EXPECT_EQ(manifest.value().total_rows, saved.keys.size());
    for (const int m : {1, 3, 4}) {
      model merged;
      merged.width = saved.width;
      for (int r = 0; r < m; ++r) {
        host_store<std::int64_t> part(store_options(o));
        EMBCACHE_ASSERT_OK(load_sharded_part(dir, r, m, part));
        const model got = read_store(part);
        for (const std::int64_t k : got.keys) ASSERT_EQ(owner_of(k, m), r);
        merged.keys.insert(merged.keys.end(), got.keys.begin(), got.keys.end());
        merged.rows.insert(merged.rows.end(), got.rows.begin(), got.rows.end());
        merged.versions.insert(merged.versions.end(), got.versions.begin(), got.versions.end());
      }
      EXPECT_TRUE(sorted(merged).same_rows_and_versions(saved)) << "loaded on " << m << " ranks";
    }
  }
  EMBCACHE_EXPECT_OK(world().barrier());
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

// uint32 keys: the same bits on every world size, and a save that records its key type, which a
// store of the other key type refuses.
TEST(sharded_table_uint32, same_bits_on_every_world_size_and_saves_carry_the_key_type) {
  using Key = std::uint32_t;
  const sharded_table_options o = table_options(optimizer_kind::adam, num_blocks);
  const batch_spec spec;
  host_store<Key> store(store_options(o));
  sharded_table<Key> t(world(), store, o);
  EMBCACHE_ASSERT_OK(train(t, spec, 0, steps));
  for (const Key k : read_store(store).keys) ASSERT_EQ(owner_of(k, world().size()), world().rank());
  const auto all = gather_model(world(), store);
  const std::string dir = shared_temp_dir("save-uint32");
  EMBCACHE_ASSERT_OK(t.save(dir));
  host_store<Key> loaded_store(store_options(o));
  sharded_table<Key> loaded(world(), loaded_store, o);
  EMBCACHE_ASSERT_OK(loaded.load(dir));
  const auto back = gather_model(world(), loaded_store);
  if (world().rank() == 0) {
    single_process_communicator alone;
    host_store<Key> one_store(store_options(o));
    sharded_table<Key> one(alone, one_store, o);
    EMBCACHE_ASSERT_OK(train(one, spec, 0, steps));
    const auto ref = read_store(one_store);
    ASSERT_GT(ref.keys.size(), 0u);
    EXPECT_TRUE(all.same_rows(ref)) << world().size() << " ranks and one rank disagree";
    EXPECT_TRUE(back.same_rows_and_versions(all));
    auto manifest = read_sharded_manifest(dir);
    EMBCACHE_ASSERT_OK(manifest);
    EXPECT_EQ(manifest.value().key_type, key_type::uint32);
    host_store<std::int64_t> wide_keys(store_options(o));
    auto refused = load_sharded_part(dir, 0, 1, wide_keys);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.get_status().code(), status_code::invalid_argument);
    EXPECT_NE(refused.get_status().message().find("the save holds uint32 keys (field 'key_type')"),
              std::string::npos)
        << refused.get_status().to_string();
  }
  EMBCACHE_EXPECT_OK(world().barrier());
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

// Save after 3 steps, load into new tables and train 2 more: the same bits as 5 uninterrupted
// steps (Adam's step counter comes back with the save).
TEST(sharded_save_test, resume_from_a_save_matches_an_uninterrupted_run) {
  const sharded_table_options o = table_options(optimizer_kind::adam, num_blocks);
  const batch_spec spec;
  host_store<std::int64_t> store(store_options(o));
  sharded_table<std::int64_t> t(world(), store, o);
  EMBCACHE_ASSERT_OK(train(t, spec, 0, 3));
  const std::string dir = shared_temp_dir("resume");
  EMBCACHE_ASSERT_OK(t.save(dir));
  EMBCACHE_ASSERT_OK(train(t, spec, 3, 2));
  const model straight = gather_model(world(), store);

  host_store<std::int64_t> resumed_store(store_options(o));
  sharded_table<std::int64_t> resumed(world(), resumed_store, o);
  EMBCACHE_ASSERT_OK(resumed.load(dir));
  EMBCACHE_ASSERT_OK(train(resumed, spec, 3, 2));
  const model again = gather_model(world(), resumed_store);
  if (world().rank() == 0) {
    EXPECT_TRUE(again.same_rows(straight));
    EXPECT_TRUE(again.same_rows(one_rank_model(o, spec, 5)));
    std::filesystem::remove_all(dir);
  }
}

// A batch one rank gets wrong fails the step on every rank, naming that rank, and nobody waits.
TEST(sharded_table_errors, a_bad_batch_on_one_rank_fails_every_rank) {
  const sharded_table_options o = table_options(optimizer_kind::sgd, num_blocks);
  host_store<std::int64_t> store(store_options(o));
  sharded_table<std::int64_t> t(world(), store, o);
  const batch_spec spec;
  block_batch b = make_blocks(spec, 0, t.blocks().first, t.blocks().count);
  const int bad = world().size() - 1;
  if (world().rank() == bad) b.batch_size += 1;  // no longer splits into the rank's blocks
  std::vector<float> out((b.batch_size * b.num_slots + 1) * o.table.dim);
  const status s = t.forward(b.view(), out.data());
  EXPECT_EQ(s.code(),
            world().rank() == bad ? status_code::invalid_argument : status_code::internal);
  EXPECT_NE(s.message().find("rank " + std::to_string(bad)), std::string::npos) << s.to_string();
  EXPECT_THROW(static_cast<void>(t.backward(out.data())), error);
}

}  // namespace
}  // namespace embcache::test
