// The training-cache suite (training_cache_suite.hpp) in the host space: every case, on host
// stores of both key types and, where built, on RocksDB. Plus, host only, an allocation that
// fails under a capped address space.
#include <sys/resource.h>

#include <cstdio>
#include <fstream>

#include "../common/address_space.hpp"
#include "../common/sanitizers.hpp"
#include "training_cache_suite.hpp"

namespace embcache::testing::training_suite {
namespace {

INSTANTIATE_TYPED_TEST_SUITE_P(training_cache_host, stores, store_cases<host_space>);
INSTANTIATE_TYPED_TEST_SUITE_P(training_cache_host, conformance, ::testing::Types<host_space>);

#ifndef EMBCACHE_TEST_SANITIZED
// In a child process: 200,000 resident rows of 64 floats, then the address space capped 16 MB
// above what the process uses, so that the export's 54,400,000 bytes of host vectors cannot be
// allocated. Prints the status; exit 0 when it is capacity_exceeded.
int export_under_an_address_space_limit() {
  training_cache<std::int64_t> tc({}, {table_of("t", 64, 200000)});
  std::vector<std::int64_t> keys(200000);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = std::int64_t(i);
  if (!tc.begin_pass({keys}).ok()) return 2;
  if (const int e = embcache::test::cap_address_space_above_use(16u << 20)) return 2 + e;
  auto d = tc.export_incremental();
  if (d.ok()) return 5;
  std::fprintf(stderr, "%s\n", d.get_status().to_string().c_str());
  return d.get_status().code() == status_code::capacity_exceeded ? 0 : 6;
}
#endif

TEST(training_cache_host_memory, an_export_without_host_memory_is_a_status_naming_the_bytes) {
#ifdef EMBCACHE_TEST_SANITIZED
  GTEST_SKIP() << "a sanitizer reserves more address space than the cap leaves";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(export_under_an_address_space_limit()), ::testing::ExitedWithCode(0),
              "capacity_exceeded: export of table 't': embedding_cache::export_to_host: out of "
              "host memory \\(std::bad_alloc\\) allocating 54400000 bytes for 200000 rows");
#endif
}

}  // namespace
}  // namespace embcache::testing::training_suite
