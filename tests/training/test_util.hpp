// Helpers shared by the training-cache tests of both spaces (tests/training, tests/cuda).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/status_assertions.hpp"
#include "common/temp_dir.hpp"
#include "embcache/host_store.hpp"
#include "embcache/training_cache.hpp"

namespace embcache::testing {

/// Rows by key.
template <class Key>
using model = std::map<Key, std::vector<float>>;

/// Every row of table `t`'s store (call end_training() first).
template <class Key, class Space>
model<Key> store_model(training_cache<Key, Space>& tc, std::size_t t) {
  model<Key> m;
  const std::size_t w = tc.row_width(t);
  EMBCACHE_EXPECT_OK(tc.store(t).for_each(
      1000, [&](const Key* k, const float* r, const std::uint64_t*, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) {
          m[k[i]].assign(r + i * w, r + (i + 1) * w);
        }
        return status{};
      }));
  return m;
}

/// A training cache of one table "t" (sgd, so rows are `dim` floats) over a host store of its
/// own, which the test may read or write behind the cache's back.
struct cache_over_host_store {
  std::shared_ptr<host_store<std::int64_t>> store;
  std::unique_ptr<training_cache<std::int64_t>> tc;

  cache_over_host_store(std::size_t dim, std::size_t capacity,
                        const training_cache_options& co = {}) {
    host_store_options so;
    so.table_name = "t";
    so.row_width = dim;
    store = std::make_shared<host_store<std::int64_t>>(so);
    table_options<std::int64_t> o;
    o.name = "t";
    o.dim = dim;
    o.capacity = capacity;
    o.store = store;
    tc = std::make_unique<training_cache<std::int64_t>>(co, std::vector{o});
  }
};

}  // namespace embcache::testing
