/// @file detail/embedding_cache_access.hpp
/// @brief Test access to an embedding_cache's internals: states that take too many calls to
/// reach (the claim epoch near its end). No stability promise.
#pragma once

#include <cstdint>

#include "embcache/embedding_cache.hpp"

namespace embcache::detail {

/// Reads and sets an embedding_cache's private counters, for tests.
struct embedding_cache_access {
  /// The last claim epoch handed out (insert_or_assign and assign_slots take one per call).
  template <class Key, class Space>
  static std::uint64_t claim_epoch(const embedding_cache<Key, Space>& c) noexcept {
    return c.claim_epoch_.load();
  }
  /// Makes `epoch` the last claim epoch handed out, as if that many calls had run. Only values
  /// not below the current one keep the claims meaningful.
  template <class Key, class Space>
  static void set_claim_epoch(embedding_cache<Key, Space>& c, std::uint64_t epoch) noexcept {
    c.claim_epoch_ = epoch;
  }
};

}  // namespace embcache::detail
