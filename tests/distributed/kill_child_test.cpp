// The child job of sharded_save_kill_test (run by it under mpirun, skipped otherwise): saves once,
// trains on, and saves again while one rank is killed with SIGKILL inside the second save.
// EMBCACHE_TEST_KILL_DIR names the save folder; EMBCACHE_TEST_KILL_MODE says when the last rank
// dies: "in_checkpoint" (before its part is written) or "before_publish" (its part complete, the
// manifest not yet replaced).
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common/status_assertions.hpp"
#include "mpi_env.hpp"
#include "test_util.hpp"

namespace embcache::test {
namespace {

// A store that forwards everything and dies in checkpoint().
class dying_store final : public param_store<std::int64_t> {
 public:
  dying_store(param_store<std::int64_t>& inner, bool after) : inner_(inner), after_(after) {}
  std::size_t row_width() const noexcept override { return inner_.row_width(); }
  const std::string& table_name() const noexcept override { return inner_.table_name(); }
  status pull(const std::int64_t* k, std::size_t n, float* r, bool* f, std::uint64_t* v) override {
    return inner_.pull(k, n, r, f, v);
  }
  status push(const std::int64_t* k, std::size_t n, const float* r,
              const std::uint64_t* v) override {
    return inner_.push(k, n, r, v);
  }
  status erase(const std::int64_t* k, std::size_t n, std::size_t* e) override {
    return inner_.erase(k, n, e);
  }
  status contains(const std::int64_t* k, std::size_t n, bool* f) override {
    return inner_.contains(k, n, f);
  }
  std::size_t size() const noexcept override { return inner_.size(); }
  std::uint64_t max_version() const noexcept override { return inner_.max_version(); }
  status for_each(std::size_t b, const store_batch_fn<std::int64_t>& fn) override {
    return inner_.for_each(b, fn);
  }
  status for_each_changed_since(std::uint64_t v, std::size_t b,
                                const store_batch_fn<std::int64_t>& fn) override {
    return inner_.for_each_changed_since(v, b, fn);
  }
  status flush() override { return inner_.flush(); }
  status checkpoint(const std::string& dir) override {
    if (armed && !after_) std::raise(SIGKILL);
    status s = inner_.checkpoint(dir);
    if (armed && after_) std::raise(SIGKILL);
    return s;
  }
  bool armed = false;

 private:
  param_store<std::int64_t>& inner_;
  bool after_;
};

TEST(sharded_save_kill, child) {
  const char* dir = std::getenv("EMBCACHE_TEST_KILL_DIR");
  const char* mode = std::getenv("EMBCACHE_TEST_KILL_MODE");
  if (dir == nullptr || mode == nullptr) GTEST_SKIP() << "run by sharded_save_kill_test only";
  const sharded_table_options o = table_options(optimizer_kind::adam, 4);
  host_store<std::int64_t> inner(store_options(o));
  dying_store store(inner, std::string(mode) == "before_publish");
  sharded_table<std::int64_t> t(world(), store, o);
  const batch_spec spec;
  EMBCACHE_ASSERT_OK(train(t, spec, 0, 2));
  EMBCACHE_ASSERT_OK(t.save(dir));
  // What the parent must find after the crash: the first save's rows.
  const model first = gather_model(world(), inner);
  if (world().rank() == 0) {
    std::ofstream out(std::string(dir) + ".expected", std::ios::binary);
    out.write(reinterpret_cast<const char*>(first.keys.data()), first.keys.size() * 8);
    out.write(reinterpret_cast<const char*>(first.rows.data()), first.rows.size() * 4);
  }
  EMBCACHE_ASSERT_OK(train(t, spec, 2, 2));
  store.armed = world().rank() == world().size() - 1;
  const status s = t.save(dir);
  ADD_FAILURE() << "the second save returned (" << s.to_string() << ") instead of dying";
}

}  // namespace
}  // namespace embcache::test
