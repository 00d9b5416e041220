// embcache's trainer as the ranks of one job (ctest runs this binary on 1, 2 and 4 ranks): the
// model of a sharded, data-parallel run is the same bits on every number of ranks, one rank with
// one block is the host-hybrid run, a save of N ranks resumes on M, and a configuration that does
// not fit the job is refused on every rank. The child of the kill test (kill_test.cpp) is here too.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "embcache/serving.hpp"
#include "mpi_env.hpp"
#include "trainer_test_util.hpp"

namespace embcache::test {

const std::string& trainer_data_dir() {
  static const std::string dir = [] {
    const std::string d = shared_temp_dir("trainer-data");
    status s;
    if (world().rank() == 0) s = write_trainer_dataset(d);
    agree(world(), s, "write the dataset").throw_if_error();
    return d;
  }();
  return dir;
}

namespace {

namespace fs = std::filesystem;

const std::string& data_dir() { return trainer_data_dir(); }

result<std::unique_ptr<trainer>> run_sharded(const trainer_config& c, communicator& comm) {
  auto t = trainer::create(c, comm);
  if (!t.ok()) return t.get_status();
  EMBCACHE_RETURN_IF_ERROR(t.value()->run());
  return t;
}

/// Feature admission and expiry by passes and by steps on every table of a host-hybrid run:
/// keys get rows at their second shard, rows untouched for two shards or for the last 8 steps
/// (of 12 a shard) leave at the next shard's start.
void with_lifetime(trainer_config& c) {
  for (auto& t : c.tables) {
    t.admission.min_count = 2;
    t.admission.sketch_width = 4096;
    t.expiry.ttl_passes = 2;
    t.expiry.ttl_steps = 8;
  }
}

// Mode host_hybrid with admission, expiry (passes and steps) and incremental exports: each owner
// admits, expires and exports its own rows, and the model, its saves and every delta (all parts
// together: rows, optimizer state, tombstones) are the single rank's, bit for bit.
TEST(sharded_trainer, the_model_is_the_same_bits_on_every_number_of_ranks) {
  const std::string dir = shared_temp_dir("trainer-bits");
  trainer_config c = sharded_trainer_config(data_dir());
  with_lifetime(c);
  c.export_with_state = true;
  c.export_dir = dir + "/export_world";
  c.save_dir = dir + "/world";
  auto t = run_sharded(c, world());
  EMBCACHE_ASSERT_OK(t);
  EXPECT_EQ(t.value()->history().size(), 2u);
  ASSERT_TRUE(world().barrier().ok());
  if (world().rank() == 0) {
    single_process_communicator one;
    trainer_config c1 = c;
    c1.export_dir = dir + "/export_one";
    c1.save_dir = dir + "/one";
    auto t1 = run_sharded(c1, one);
    EMBCACHE_ASSERT_OK(t1);
    expect_same_sharded_model(c.save_dir, c1.save_dir);
    expect_same_history(t.value()->history(), t1.value()->history());
    table_counters total;
    for (const auto& tc : t1.value()->cache().counters().total) total += tc;
    EXPECT_GT(total.keys_refused, 0u);
    EXPECT_GT(total.rows_expired, 0u);
    for (std::uint64_t n : {1, 2}) {
      ASSERT_EQ(delta_parts(c.export_dir, n).size(), std::size_t(world().size())) << "delta " << n;
      ASSERT_EQ(delta_parts(c1.export_dir, n).size(), 1u) << "delta " << n;
    }
    EXPECT_GT(expect_same_sharded_deltas(c.export_dir, c1.export_dir, 2, 2), 0u);
    // The save records the step clock of every step, in every part.
    auto m = read_sharded_manifest(c.save_dir + "/sparse/deep");
    EMBCACHE_ASSERT_OK(m);
    ASSERT_EQ(m.value().parts.size(), std::size_t(world().size()));
    for (const sharded_part& p : m.value().parts) {
      EXPECT_EQ(p.expiry.steps, t1.value()->step()) << p.path;
      EXPECT_EQ(p.expiry.step_versions.size(), 8u) << p.path;
    }
  }
  ASSERT_TRUE(world().barrier().ok());
}

// Keyset mode: each rank's training cache takes its part of every shard's keyset; the model is
// the host-hybrid one, bit for bit, and the ranks' exports hold the rows one rank exports. The
// ranks move their staged rows by index (config.move_staged_rows), the single rank copies them.
TEST(sharded_trainer, keyset_mode_gives_the_host_hybrid_model_and_exports_per_rank) {
  const std::string dir = shared_temp_dir("trainer-keyset");
  trainer_config c = sharded_trainer_config(data_dir());
  c.mode = trainer_mode::keyset;
  c.move_staged_rows = true;
  for (auto& t : c.tables) t.capacity_auto = true;
  c.export_dir = dir + "/export_world";
  c.save_dir = dir + "/keyset_world";
  auto t = run_sharded(c, world());
  EMBCACHE_ASSERT_OK(t);
  ASSERT_EQ(t.value()->history().size(), 2u);
  table_counters moved;
  for (const auto& tc : t.value()->cache().counters().total) moved += tc;
  EXPECT_GT(moved.rows_moved, 0u);
  ASSERT_TRUE(world().barrier().ok());
  if (world().rank() == 0) {
    single_process_communicator one;
    trainer_config h = sharded_trainer_config(data_dir());
    h.save_dir = dir + "/hybrid_one";
    auto th = run_sharded(h, one);
    EMBCACHE_ASSERT_OK(th);
    expect_same_sharded_model(c.save_dir, h.save_dir);
    expect_same_history(t.value()->history(), th.value()->history());
    trainer_config k1 = c;
    k1.move_staged_rows = false;
    k1.export_dir = dir + "/export_one";
    k1.save_dir = dir + "/keyset_one";
    auto tk = run_sharded(k1, one);
    EMBCACHE_ASSERT_OK(tk);
    for (std::size_t p = 0; p < 2; ++p) {
      const pass_metrics& a = t.value()->history()[p];
      const pass_metrics& b = tk.value()->history()[p];
      EXPECT_GT(a.rows_exported, 0u);
      EXPECT_EQ(a.rows_exported, b.rows_exported) << "pass " << a.pass;
      const std::string parts = read_bytes(a.export_path);
      EXPECT_NE(parts.find("\"world_size\": " + std::to_string(world().size())),
                std::string::npos)
          << parts;
      for (int r = 0; r < world().size(); ++r) {
        char part[64];
        std::snprintf(part, sizeof part, "/rank-%05d/delta-%06zu", r, p + 1);
        EXPECT_TRUE(fs::exists(c.export_dir + part + "/manifest.json")) << part;
      }
    }
    // Served (docs/serving.md): each sharded save, written as one model folder, holds the same
    // tables (slot ids included) and stands at the last delta before it, which the run's exports
    // do not pass.
    apply_options ao;
    ao.output = dir + "/served_world";
    auto served = apply_deltas(c.save_dir, c.export_dir, ao);
    EMBCACHE_ASSERT_OK(served);
    EXPECT_EQ(served.value().from_delta, 2u);
    EXPECT_TRUE(served.value().deltas.empty());
    ao.output = dir + "/served_one";
    EMBCACHE_ASSERT_OK(apply_deltas(k1.save_dir, "", ao));
    for (const char* table : {"wide", "deep"}) {
      const std::string one = dir + "/served_one/" + table;
      EXPECT_TRUE(fs::exists(one + "/slot_id")) << table;
      for (const auto& e : fs::directory_iterator(one)) {
        const std::string f = e.path().filename().string();
        if (f == "version") continue;  // each rank's clock stamps its own rows
        EXPECT_EQ(read_bytes(dir + "/served_world/" + table + "/" + f), read_bytes(one + "/" + f))
            << table << "/" << f;
      }
    }
  }
  ASSERT_TRUE(world().barrier().ok());
}

/// Keyset mode with `lifetime` applied to every table (admission, expiry), run on this job's ranks
/// and, on rank 0, on one rank alone: the same model and history, bit for bit. Returns rank 0's
/// single-rank trainer (null elsewhere, or when it failed), for the caller's own checks.
template <class Lifetime>
std::unique_ptr<trainer> expect_keyset_bits_on_every_number_of_ranks(const std::string& dir,
                                                                     Lifetime lifetime) {
  trainer_config c = sharded_trainer_config(data_dir());
  c.mode = trainer_mode::keyset;
  for (auto& t : c.tables) {
    t.capacity_auto = true;
    lifetime(t);
  }
  c.save_dir = dir + "/world";
  auto t = run_sharded(c, world());
  EMBCACHE_EXPECT_OK(t);
  EXPECT_TRUE(world().barrier().ok());
  std::unique_ptr<trainer> alone;
  if (world().rank() == 0 && t.ok()) {
    single_process_communicator one;
    trainer_config c1 = c;
    c1.save_dir = dir + "/one";
    auto t1 = run_sharded(c1, one);
    EMBCACHE_EXPECT_OK(t1);
    if (t1.ok()) {
      expect_same_sharded_model(c.save_dir, c1.save_dir);
      expect_same_history(t.value()->history(), t1.value()->history());
      alone = std::move(t1).value();
    }
  }
  EXPECT_TRUE(world().barrier().ok());
  return alone;
}

// Feature admission in keyset mode: every rank counts the whole keyset of a shard and admits the
// keys it owns, so the model is the single rank's, bit for bit, and some keys got no row.
TEST(sharded_trainer, admission_gives_the_same_bits_on_every_number_of_ranks) {
  const std::string dir = shared_temp_dir("trainer-admission");
  const auto alone = expect_keyset_bits_on_every_number_of_ranks(dir, [](trainer_table_config& t) {
    t.admission.min_count = 2;
    t.admission.sketch_width = 4096;
  });
  if (alone) {
    // Admission left keys out: fewer rows than without it.
    single_process_communicator one;
    trainer_config all = alone->config();
    for (auto& tc : all.tables) tc.admission = {};
    all.save_dir = dir + "/all";
    EMBCACHE_EXPECT_OK(run_sharded(all, one));
    EXPECT_LT(sharded_rows(dir + "/one", "deep", deep_width).keys.size(),
              sharded_rows(all.save_dir, "deep", deep_width).keys.size());
  }
  EXPECT_EQ(alone != nullptr, world().rank() == 0);
  ASSERT_TRUE(world().barrier().ok());
}

// Expiry in a sharded keyset run, by passes and by steps (8 of a shard's 12): each owner expires
// its own rows at every shard's start, and the model is the one a single rank trains, bit for bit.
TEST(sharded_trainer, expiry_gives_the_same_bits_on_every_number_of_ranks) {
  const auto alone = expect_keyset_bits_on_every_number_of_ranks(shared_temp_dir("trainer-expiry"),
                                                                 [](trainer_table_config& t) {
                                                                   t.expiry.ttl_passes = 1;
                                                                   t.expiry.ttl_steps = 8;
                                                                 });
  EXPECT_EQ(alone != nullptr, world().rank() == 0);
  if (!alone) return;
  std::uint64_t expired = 0;
  for (const auto& tc : alone->cache().counters().total) expired += tc.rows_expired;
  EXPECT_GT(expired, 0u);
}

// RocksDB stores: each rank its database under store_path/rank-R; the save's parts are RocksDB
// checkpoints, which a run of another number of ranks on host stores loads.
TEST(sharded_trainer, rocksdb_stores_give_the_same_model_and_their_saves_resume_anywhere) {
  const std::string dir = shared_temp_dir("trainer-rocksdb");
  trainer_config c = sharded_trainer_config(data_dir());
  c.passes = {c.passes[0]};
  for (auto& t : c.tables) {
    t.store = "rocksdb";
    t.store_path = dir + "/db";
  }
  c.save_dir = dir + "/rocksdb_world";
  auto t = run_sharded(c, world());
  if (!t.ok() && t.get_status().code() == status_code::unsupported)
    GTEST_SKIP() << t.get_status().to_string();
  EMBCACHE_ASSERT_OK(t);
  ASSERT_TRUE(world().barrier().ok());
  if (world().rank() == 0) {
    EXPECT_TRUE(fs::exists(dir + "/db/rank-00000"));
    single_process_communicator one;
    trainer_config h = sharded_trainer_config(data_dir());
    h.passes = {h.passes[0]};
    h.save_dir = dir + "/host_one";
    EMBCACHE_ASSERT_OK(run_sharded(h, one));
    // Loaded into host stores on one rank and saved again: host-store parts to compare.
    trainer_config again = h;
    again.passes = {h.passes[0]};
    again.resume_from = c.save_dir;
    again.save_dir = dir + "/resaved_one";
    auto r = trainer::create(again, one);
    EMBCACHE_ASSERT_OK(r);
    EXPECT_EQ(r.value()->passes_done(), 1u);
    EMBCACHE_ASSERT_OK(r.value()->save(again.save_dir));
    expect_same_sharded_model(h.save_dir, again.save_dir);
  }
  ASSERT_TRUE(world().barrier().ok());
}

// With one block the data-parallel step is the plain step: the same model as mode host_hybrid
// in one process.
TEST(sharded_trainer, one_rank_with_one_block_is_the_host_hybrid_run) {
  if (world().size() != 1) GTEST_SKIP() << "one rank only";
  const std::string dir = shared_temp_dir("trainer-hybrid");
  trainer_config c = sharded_trainer_config(data_dir());
  c.num_blocks = 1;
  c.save_dir = dir + "/sharded";
  single_process_communicator one;
  auto sharded = run_sharded(c, one);
  EMBCACHE_ASSERT_OK(sharded);
  trainer_config h = c;
  h.save_dir = dir + "/hybrid";
  auto hybrid = trainer::create(h);
  EMBCACHE_ASSERT_OK(hybrid);
  EMBCACHE_ASSERT_OK(hybrid.value()->run());
  EXPECT_TRUE(read_bytes(c.save_dir + "/dense.bin") == read_bytes(h.save_dir + "/dense.bin"));
  expect_same_history(sharded.value()->history(), hybrid.value()->history());
  // The rows: each table read back through both trainers' stores.
  expect_same_rows_as_hybrid(c.save_dir, h.save_dir);
}

// Mode host_hybrid with admission and expiry by passes and steps: the save carries the admission
// counts and every rank's pass and step clocks, which a run on another number of ranks resumes
// with (ages as classes of the clocks' values, sharded_save.hpp).
TEST(sharded_trainer, a_save_resumes_on_another_number_of_ranks) {
  const std::string dir = shared_temp_dir("trainer-resume");
  trainer_config whole = sharded_trainer_config(data_dir());
  with_lifetime(whole);
  whole.export_with_state = true;
  trainer_config first = whole;
  first.passes = {whole.passes[0]};
  trainer_config rest = whole;
  rest.passes = {whole.passes[1]};

  // Pass 1 on this job's ranks, pass 2 on one rank; pass 1 on one rank, pass 2 on this job's.
  // Each resumed run exports into the folder of the run it resumes: its delta 2 follows delta 1.
  first.save_dir = dir + "/first_world";
  first.export_dir = dir + "/deltas_world_then_one";
  EMBCACHE_ASSERT_OK(run_sharded(first, world()));
  single_process_communicator one;
  if (world().rank() == 0) {
    trainer_config f1 = first;
    f1.save_dir = dir + "/first_one";
    f1.export_dir = dir + "/deltas_one_then_world";
    EMBCACHE_ASSERT_OK(run_sharded(f1, one));
  }
  ASSERT_TRUE(world().barrier().ok());
  trainer_config rest_world = rest;
  rest_world.resume_from = dir + "/first_one";
  rest_world.save_dir = dir + "/rest_world";
  rest_world.export_dir = dir + "/deltas_one_then_world";
  auto resumed = run_sharded(rest_world, world());
  EMBCACHE_ASSERT_OK(resumed);
  EXPECT_EQ(resumed.value()->passes_done(), 2u);
  ASSERT_TRUE(world().barrier().ok());
  if (world().rank() == 0) {
    trainer_config reference = whole;
    reference.save_dir = dir + "/whole_one";
    reference.export_dir = dir + "/deltas_whole_one";
    auto r = run_sharded(reference, one);
    EMBCACHE_ASSERT_OK(r);
    trainer_config rest_one = rest;
    rest_one.resume_from = dir + "/first_world";
    rest_one.save_dir = dir + "/rest_one";
    rest_one.export_dir = dir + "/deltas_world_then_one";
    auto r1 = run_sharded(rest_one, one);
    EMBCACHE_ASSERT_OK(r1);
    expect_same_sharded_model(reference.save_dir, rest_one.save_dir);
    expect_same_sharded_model(reference.save_dir, rest_world.save_dir);
    expect_same_history(r.value()->history(), r1.value()->history());
    expect_same_history(r.value()->history(), resumed.value()->history());
    // Every delta of the resumed runs, the uninterrupted run's (rows, state, tombstones).
    expect_same_sharded_deltas(dir + "/deltas_world_then_one", reference.export_dir, 2, 2);
    expect_same_sharded_deltas(dir + "/deltas_one_then_world", reference.export_dir, 2, 2);
  }
  ASSERT_TRUE(world().barrier().ok());
}

TEST(sharded_trainer, a_configuration_that_does_not_fit_the_job_is_refused_on_every_rank) {
  trainer_config c = sharded_trainer_config(data_dir());
  c.world = world().size() + 1;
  c.num_blocks = 4 * std::size_t(c.world);
  auto t = trainer::create(c, world());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.get_status().message().find("config.world: " + std::to_string(c.world) +
                                          " ranks, but the launcher started " +
                                          std::to_string(world().size())),
            std::string::npos)
      << t.get_status().to_string();
  c = sharded_trainer_config(data_dir());
  c.mode = trainer_mode::on_demand;
  t = trainer::create(c, world());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.get_status().message().find("config.mode"), std::string::npos)
      << t.get_status().to_string();
  // A save of one process (training-cache layout) is not a sharded save.
  const std::string dir = shared_temp_dir("trainer-refuse");
  if (world().rank() == 0) {
    trainer_config h = sharded_trainer_config(data_dir());
    h.passes = {h.passes[0]};
    h.save_dir = dir + "/hybrid";
    auto ht = trainer::create(h);
    EMBCACHE_ASSERT_OK(ht);
    EMBCACHE_ASSERT_OK(ht.value()->run());
  }
  ASSERT_TRUE(world().barrier().ok());
  c = sharded_trainer_config(data_dir());
  c.resume_from = dir + "/hybrid";
  t = trainer::create(c, world());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.get_status().message().find("a sharded run resumes from the save of a sharded run"),
            std::string::npos)
      << t.get_status().to_string();
}

// The child job of sharded_trainer_kill_test (kill_test.cpp), skipped otherwise: three passes
// saved after each; rank 1 dies by SIGKILL once pass 2 has trained, before its save.
TEST(sharded_trainer_kill, child) {
  const char* save = std::getenv("EMBCACHE_TEST_KILL_TRAINER_SAVE");
  const char* data = std::getenv("EMBCACHE_TEST_KILL_TRAINER_DATA");
  if (save == nullptr || data == nullptr) GTEST_SKIP() << "run by sharded_trainer_kill_test";
  trainer_config c = sharded_trainer_config(data);
  c.passes.push_back(c.passes[0]);
  c.save_every_pass = true;
  c.save_dir = save;
  auto t = trainer::create(c, world());
  EMBCACHE_ASSERT_OK(t);
  const int rank = world().rank();
  t.value()->set_log([rank](const std::string& line) {
    if (rank == 1 && line.rfind("pass 2 done", 0) == 0) std::raise(SIGKILL);
  });
  EMBCACHE_EXPECT_OK(t.value()->run());
  ADD_FAILURE() << "rank " << rank << " should not get here";
}

}  // namespace
}  // namespace embcache::test
