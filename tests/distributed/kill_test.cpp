// A rank killed (SIGKILL) in the middle of a sharded save leaves the previous save whole: this
// test runs a 2-rank job of the MPI test binary (kill_child_test.cpp) that saves, trains on and
// dies inside its second save, then loads what is left in this process.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/status_assertions.hpp"
#include "common/temp_dir.hpp"
#include "embcache/distributed/sharded_save.hpp"
#include "test_util.hpp"
#ifdef EMBCACHE_TEST_TRAINER_MPI_BINARY
#include "trainer_test_util.hpp"
#endif

namespace embcache::test {
namespace {

namespace fs = std::filesystem;

struct child_job {
  int rc = 0;
  std::string log;  // what its ranks printed
};

// Runs `env` + the MPI test binary `binary` on 2 ranks with the filter `test`, the ranks' output in
// `log_path` (scripts/mpirun_local.sh gives the job a session folder of its own, so a job ending
// beside it cannot break its launch).
child_job run_child_job(const std::string& env, const char* binary, const std::string& test,
                        const std::string& log_path) {
  const std::string cmd = env + " " + EMBCACHE_TEST_RUN_MPI " 2 '" + binary +
                          "' --gtest_filter=" + test + " > '" + log_path + "' 2>&1";
  child_job job;
  job.rc = std::system(cmd.c_str());
  std::ifstream in(log_path);
  job.log.assign(std::istreambuf_iterator<char>(in), {});
  return job;
}

class sharded_save_kill_test : public ::testing::TestWithParam<const char*> {};

TEST_P(sharded_save_kill_test, last_complete_save_stays_loadable) {
  const testing::temp_dir tmp("embcache_kill");
  const std::string& root = tmp.path();
  const std::string dir = root + "/save";
  const auto [rc, log] =
      run_child_job("EMBCACHE_TEST_KILL_DIR='" + dir + "' EMBCACHE_TEST_KILL_MODE=" + GetParam(),
                    EMBCACHE_TEST_MPI_BINARY, "sharded_save_kill.child", root + "/child.log");
  ASSERT_NE(rc, 0) << "the child job should have died:\n" << log;
  // The first save completed (its expected rows are written after it), the second did not.
  ASSERT_TRUE(fs::exists(dir + ".expected")) << log;
  EXPECT_TRUE(fs::exists(dir + "/gen-000002")) << "the second save never started:\n" << log;

  auto m = read_sharded_manifest(dir);
  EMBCACHE_ASSERT_OK(m) << log;
  EXPECT_EQ(m.value().generation, 1u);
  EXPECT_EQ(m.value().world_size, 2);
  EXPECT_EQ(m.value().info.step, 2u);
  const sharded_table_options o = table_options(optimizer_kind::adam, 4);
  host_store<std::int64_t> one(store_options(o));
  EMBCACHE_ASSERT_OK(load_sharded_part(dir, 0, 1, one));
  const model got = read_store(one);
  std::ifstream in(dir + ".expected", std::ios::binary);
  std::vector<std::int64_t> keys(got.keys.size());
  std::vector<float> rows(got.rows.size());
  in.read(reinterpret_cast<char*>(keys.data()), keys.size() * 8);
  in.read(reinterpret_cast<char*>(rows.data()), rows.size() * 4);
  ASSERT_TRUE(in.good());
  EXPECT_EQ(in.peek(), EOF) << "the expected model holds more rows than the save";
  EXPECT_EQ(got.keys, keys);
  EXPECT_EQ(got.rows, rows);
}

INSTANTIATE_TEST_SUITE_P(modes, sharded_save_kill_test,
                         ::testing::Values("in_checkpoint", "before_publish"));

#ifdef EMBCACHE_TEST_TRAINER_MPI_BINARY
// A rank of a 2-rank embcache trainer killed (SIGKILL) once pass 2 has trained leaves the save
// of pass 1 whole: it loads in one process and holds the model of pass 1 trained alone.
TEST(sharded_trainer_kill_test, the_save_of_the_last_pass_stays_whole) {
  const testing::temp_dir tmp("embcache_kill_trainer");
  const std::string& root = tmp.path();
  const std::string data = root + "/data", save = root + "/save";
  EMBCACHE_ASSERT_OK(write_trainer_dataset(data));
  const auto [rc, log] = run_child_job("EMBCACHE_TEST_KILL_TRAINER_SAVE='" + save +
                                           "' EMBCACHE_TEST_KILL_TRAINER_DATA='" + data + "'",
                                       EMBCACHE_TEST_TRAINER_MPI_BINARY,
                                       "sharded_trainer_kill.child", root + "/child.log");
  ASSERT_NE(rc, 0) << "the child job should have died:\n" << log;
  // Pass 1's save was published before rank 1 died.
  ASSERT_TRUE(fs::exists(save + "/trainer.json")) << "no save of pass 1:\n" << log;

  single_process_communicator one;
  trainer_config c = sharded_trainer_config(data);
  c.passes = {c.passes[0]};
  c.save_dir = root + "/reference";
  auto reference = trainer::create(c, one);
  EMBCACHE_ASSERT_OK(reference);
  EMBCACHE_ASSERT_OK(reference.value()->run());
  expect_same_sharded_model(c.save_dir, save);
  // And it resumes: the loaded trainer is after pass 1.
  c.save_dir.clear();
  c.resume_from = save;
  auto resumed = trainer::create(c, one);
  EMBCACHE_ASSERT_OK(resumed);
  EXPECT_EQ(resumed.value()->passes_done(), 1u);
  EXPECT_EQ(resumed.value()->step(), reference.value()->step());
}
#endif

}  // namespace
}  // namespace embcache::test
