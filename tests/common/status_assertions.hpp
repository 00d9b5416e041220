// Assertions on statuses and results that print the status when they fail:
//   EMBCACHE_ASSERT_OK(tc.save(dir));   // "... is not ok: io_error: /tmp/x: cannot create (...)"
//   EMBCACHE_EXPECT_OK(reader.open(path));
// Every suite includes this header rather than writing ASSERT_TRUE(x.ok()) << x.to_string().
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "embcache/status.hpp"

namespace embcache::test {

inline const status& status_of(const status& s) { return s; }
template <class T>
const status& status_of(const result<T>& r) {
  return r.get_status();
}

/// gtest predicate: success when the status (or the result's status) is ok, else a message that
/// names the expression and prints the status.
template <class S>
::testing::AssertionResult is_ok(const char* expr, const S& s) {
  const status& st = status_of(s);
  if (st.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expr << " is not ok: " << st.to_string();
}

}  // namespace embcache::test

#define EMBCACHE_ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::embcache::test::is_ok, expr)
#define EMBCACHE_EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::embcache::test::is_ok, expr)
