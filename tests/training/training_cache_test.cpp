// The training-cache suite (training_cache_suite.hpp) in the host space: every case, on host
// stores of both key types and, where built, on RocksDB.
#include "training_cache_suite.hpp"

namespace embcache::testing::training_suite {
namespace {

INSTANTIATE_TYPED_TEST_SUITE_P(training_cache_host, stores, store_cases<host_space>);
INSTANTIATE_TYPED_TEST_SUITE_P(training_cache_host, conformance, ::testing::Types<host_space>);

}  // namespace
}  // namespace embcache::testing::training_suite
