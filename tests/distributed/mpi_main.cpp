// main() of the MPI test binary: every rank runs every test; collectives inside a test are
// called by all ranks in the same order. Only rank 0 prints progress; every rank prints its own
// failures, and the job fails when any rank fails.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "mpi_env.hpp"

namespace embcache::test {
namespace {
mpi_communicator* g_world = nullptr;
// The folders shared_temp_dir made on rank 0, removed when every rank has run every test.
std::vector<std::string> g_shared_dirs;

// Prints the failures of a rank other than 0, prefixed by the rank.
class failure_printer : public ::testing::EmptyTestEventListener {
 public:
  explicit failure_printer(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                   r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

mpi_communicator& world() { return *g_world; }

std::string shared_temp_dir(const std::string& tag) {
  char name[512] = {};
  if (world().rank() == 0) {
    std::string pattern = ::testing::TempDir() + "embcache-dist-" + tag + "-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) pattern.clear();
    std::snprintf(name, sizeof(name), "%s", pattern.c_str());
    if (!pattern.empty()) g_shared_dirs.push_back(pattern);
  }
  world().broadcast(name, sizeof(name), 0).throw_if_error();
  if (name[0] == '\0') throw std::runtime_error("shared_temp_dir: mkdtemp failed on rank 0");
  return name;
}

}  // namespace embcache::test

int main(int argc, char** argv) {
  embcache::mpi_session session(&argc, &argv);
  int rc = 0;
  {
    embcache::mpi_communicator world;
    embcache::test::g_world = &world;
    ::testing::InitGoogleTest(&argc, argv);
    if (world.rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new embcache::test::failure_printer(world.rank()));
    }
    rc = RUN_ALL_TESTS();
    std::uint64_t failed = rc != 0 ? 1 : 0;
    if (!world.all_reduce_max(&failed, 1).ok()) failed = 1;
    rc = failed != 0 ? 1 : 0;
    // Every rank is past its tests (the reduction above is collective): no rank reads the shared
    // folders any more.
    for (const std::string& dir : embcache::test::g_shared_dirs) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
    embcache::test::g_world = nullptr;
  }
  return rc;
}
