// A sharded run in keyset mode interrupted after pass 1 (saved on N ranks) and resumed for pass 2
// on M ranks gives what the uninterrupted run on M ranks gives: every row of the save (embedding
// and optimizer state), dense.bin, the losses, and every row of every delta; and every delta and
// save of a run, on every rank and across the resume, records one run identity; admission counts
// and expiry clocks travel with the save. ctest runs this binary on 1, 2 and 4 ranks, so the
// pairs are 1 -> 1, 2 -> 1, 1 -> 2, 4 -> 1 and 1 -> 4 (and 2 -> 2, 4 -> 4 for the lifetime state).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <vector>

#include "embcache/distributed/ownership.hpp"
#include "embcache/serving.hpp"
#include "mpi_env.hpp"
#include "trainer_test_util.hpp"

namespace embcache::test {
namespace {

namespace fs = std::filesystem;

/// Keyset mode over the shared dataset, exports with optimizer state.
trainer_config keyset_config(const std::string& save, const std::string& exports) {
  trainer_config c = sharded_trainer_config(trainer_data_dir());
  c.mode = trainer_mode::keyset;
  for (auto& t : c.tables) t.capacity_auto = true;
  c.export_with_state = true;
  c.save_dir = save;
  c.export_dir = exports;
  return c;
}

std::unique_ptr<trainer> run_on(const trainer_config& c, communicator& comm) {
  auto t = trainer::create(c, comm);
  EMBCACHE_EXPECT_OK(t);
  if (!t.ok()) return nullptr;
  EMBCACHE_EXPECT_OK(t.value()->run());
  return std::move(t).value();
}

/// The largest version among the rows of table `table` (row width `width`) in the sharded save
/// `save` that rank `rank` of `world` owns: the version that rank's tables resume at.
std::uint64_t resumed_version(const std::string& save, const char* table, std::size_t width,
                              int rank, int world) {
  const model m = sharded_rows(save, table, width);
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < m.keys.size(); ++i)
    if (owner_of(m.keys[i], world) == rank) v = std::max(v, m.versions[i]);
  return v;
}

/// The export folder `resumed` (pass 1 on `first_world` ranks with its save in `first_save`,
/// pass 2 resumed on the ranks of `uninterrupted`'s run) against `uninterrupted`: every delta's
/// rows, all parts together, and part by part where both ran on as many ranks. Versions count
/// each rank's own updates and swaps (and the uninterrupted run prefetched pass 2's keys during
/// pass 1), so they are not compared across runs; instead each part of pass 2 starts at the
/// version its rank resumed at (that of the newest row it loaded), which on the same number of
/// ranks is where the rank's delta of pass 1 ended, and holds only rows newer than that: a model
/// at pass 1 takes it whole (embcache-apply skipped it as contained when it said "since 0").
void expect_same_deltas(const std::string& resumed, const std::string& uninterrupted,
                        int first_world, int world, const std::string& first_save) {
  const std::size_t widths[2] = {wide_width, deep_width};
  std::vector<model_folder> before;
  for (std::uint64_t n : {1, 2}) {
    const std::vector<model_folder> a = delta_parts(resumed, n), b = delta_parts(uninterrupted, n);
    ASSERT_EQ(a.size(), std::size_t(n == 1 ? first_world : world)) << resumed << " delta " << n;
    ASSERT_EQ(b.size(), std::size_t(world)) << uninterrupted << " delta " << n;
    for (std::size_t t = 0; t < 2; ++t)
      expect_same_table_rows(merged(a, t), merged(b, t),
                             resumed + " delta " + std::to_string(n) + " table " +
                                 a[0].tables.at(t).name + " against " + uninterrupted);
    if (a.size() == b.size())
      for (std::size_t r = 0; r < a.size(); ++r)
        for (std::size_t t = 0; t < 2; ++t)
          expect_same_table_rows(a[r].tables.at(t), b[r].tables.at(t),
                                 a[r].path + " table " + std::to_string(t) + " against " +
                                     b[r].path);
    if (n == 1) {
      before = a;
      continue;
    }
    for (std::size_t r = 0; r < a.size(); ++r)
      for (std::size_t t = 0; t < 2; ++t) {
        const folder_table& x = a[r].tables[t];
        const std::string what = a[r].path + " table " + x.name;
        const std::uint64_t at =
            resumed_version(first_save, x.name.c_str(), widths[t], int(r), world);
        EXPECT_GT(at, 0u) << what;
        EXPECT_EQ(x.since_version, at) << what;
        if (first_world == world) EXPECT_EQ(x.since_version, before[r].tables[t].version) << what;
        EXPECT_GT(x.version, x.since_version) << what;
        for (std::size_t i = 0; i < x.keys.size(); ++i) {
          EXPECT_GT(x.versions[i], x.since_version) << what << " key " << x.keys[i];
          EXPECT_LE(x.versions[i], x.version) << what << " key " << x.keys[i];
        }
      }
  }
}

/// The run identity table `table`'s sharded save in the trainer save `save` records ("" when
/// none).
std::string saved_run_id(const std::string& save, const char* table) {
  auto m = read_sharded_manifest(save + "/sparse/" + table);
  EMBCACHE_EXPECT_OK(m);
  return m.ok() ? m.value().info.run_id : std::string();
}

/// One run identity in every part of deltas 1 and 2 of the export folder `exports` (and in
/// their parts files), and in both tables of every trainer save of `saves`; returns it.
std::string expect_one_run(const std::string& exports, const std::vector<std::string>& saves) {
  const std::vector<model_folder> first = delta_parts(exports, 1);
  if (first.empty()) {
    ADD_FAILURE() << exports << ": no delta 1";
    return {};
  }
  const std::string id = first[0].run_id;
  EXPECT_EQ(id.size(), 32u) << first[0].path << ": run_id '" << id << "'";
  for (const char* name : {"delta-000001", "delta-000002"}) {
    const auto parts = nlohmann::json::parse(read_bytes(exports + "/" + name + ".parts.json"));
    EXPECT_EQ(parts.value("run_id", ""), id) << exports << "/" << name << ".parts.json";
  }
  for (std::uint64_t n : {1, 2})
    for (const model_folder& part : delta_parts(exports, n))
      EXPECT_EQ(part.run_id, id) << part.path << " against " << first[0].path;
  for (const std::string& save : saves)
    for (const char* table : {"wide", "deep"})
      EXPECT_EQ(saved_run_id(save, table), id) << save << " table " << table;
  return id;
}

/// Copies the export folder of pass 1 for the run that resumes from its save.
void copy_exports(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::copy(from, to, fs::copy_options::recursive, ec);
  ASSERT_FALSE(ec) << from << " -> " << to << ": " << ec.message();
}

// The bug this pins: after loading a sharded save in keyset mode the training cache's version
// clock restarted below the loaded rows' versions, so rows updated in pass 2 were not written
// back (the save held their pass-1 values) and the next delta said "since 0" (skipped by apply
// as contained in the first).
TEST(sharded_trainer_resume, keyset_resume_saves_and_exports_what_the_uninterrupted_run_does) {
  const int world_size = world().size();
  const std::string dir = shared_temp_dir("trainer-keyset-resume");
  single_process_communicator one;
  const trainer_config whole = keyset_config(dir + "/whole_world", dir + "/exports_whole_world");
  trainer_config first = whole;
  first.passes = {whole.passes[0]};
  first.save_dir = dir + "/first_world";
  first.export_dir = dir + "/exports_first_world";
  trainer_config rest = whole;
  rest.passes = {whole.passes[1]};

  // Uninterrupted and pass 1 on this job's ranks, and (several ranks) on one.
  auto whole_world = run_on(whole, world());
  ASSERT_NE(whole_world, nullptr);
  ASSERT_NE(run_on(first, world()), nullptr);
  trainer_config whole_one = whole, first_one = first;
  whole_one.save_dir = dir + "/whole_one";
  whole_one.export_dir = dir + "/exports_whole_one";
  first_one.save_dir = dir + "/first_one";
  first_one.export_dir = dir + "/exports_first_one";
  // Rank 0 alone: failures are counted, not returned on, so that the others are not left waiting.
  std::unique_ptr<trainer> whole_alone;
  if (world().rank() == 0 && world_size > 1) {
    whole_alone = run_on(whole_one, one);
    EXPECT_NE(run_on(first_one, one), nullptr);
  }
  if (world_size == 1) first_one = first;
  // Each resumed run continues the export folder of the run whose save it loads.
  trainer_config rest_world = rest;  // 1 -> this job's ranks
  rest_world.resume_from = first_one.save_dir;
  rest_world.save_dir = dir + "/rest_world";
  rest_world.export_dir = dir + "/exports_rest_world";
  trainer_config rest_one = rest;  // this job's ranks -> 1
  rest_one.resume_from = first.save_dir;
  rest_one.save_dir = dir + "/rest_one";
  rest_one.export_dir = dir + "/exports_rest_one";
  if (world().rank() == 0) {
    copy_exports(first_one.export_dir, rest_world.export_dir);
    if (world_size > 1) copy_exports(first.export_dir, rest_one.export_dir);
  }
  ASSERT_TRUE(world().barrier().ok());
  auto resumed_world = run_on(rest_world, world());
  ASSERT_NE(resumed_world, nullptr);
  EXPECT_EQ(resumed_world->passes_done(), 2u);
  ASSERT_TRUE(world().barrier().ok());
  if (world().rank() != 0) return;

  // One run identity per run, on every rank and across the resume (its save records it).
  const std::string whole_id = expect_one_run(whole.export_dir, {whole.save_dir});
  const std::string resumed_id =
      expect_one_run(rest_world.export_dir, {first_one.save_dir, rest_world.save_dir});
  EXPECT_NE(whole_id, resumed_id) << "two runs, one identity";

  // 1 -> world.
  expect_same_sharded_model(whole.save_dir, rest_world.save_dir);
  expect_same_history(whole_world->history(), resumed_world->history());
  expect_same_deltas(rest_world.export_dir, whole.export_dir, 1, world_size, first_one.save_dir);
  if (world_size == 1) return;

  // world -> 1.
  ASSERT_NE(whole_alone, nullptr);
  auto resumed_one = run_on(rest_one, one);
  ASSERT_NE(resumed_one, nullptr);
  expect_same_sharded_model(whole_one.save_dir, rest_one.save_dir);
  expect_same_history(whole_alone->history(), resumed_one->history());
  expect_same_deltas(rest_one.export_dir, whole_one.export_dir, world_size, 1, first.save_dir);
  expect_one_run(rest_one.export_dir, {first.save_dir, rest_one.save_dir});
}

// Admission and expiry across a resume: the sharded save of pass 1 carries each table's
// admission counts (once, rank 0's file) and every rank's expiry clock, so the run resumed from it
// admits and expires in pass 2 exactly what the uninterrupted run does (without them it would
// count from zero: keys seen once in pass 1 refused again, no row expired at pass 2's boundary).
// Pairs: this job's ranks -> the same ranks, -> 1 and 1 -> this job's ranks.
TEST(sharded_trainer_resume, admission_counts_and_expiry_clocks_resume_on_any_number_of_ranks) {
  const int world_size = world().size();
  const std::string dir = shared_temp_dir("trainer-lifetime-resume");
  single_process_communicator one;
  trainer_config whole = keyset_config(dir + "/whole", "");
  for (auto& t : whole.tables) {
    t.admission.min_count = 2;
    t.admission.sketch_width = 4096;
    t.expiry.ttl_passes = 1;
  }
  trainer_config first = whole;
  first.passes = {whole.passes[0]};
  first.save_dir = dir + "/first_world";
  trainer_config rest = whole;
  rest.passes = {whole.passes[1]};
  auto whole_world = run_on(whole, world());
  ASSERT_NE(whole_world, nullptr);
  ASSERT_NE(run_on(first, world()), nullptr);
  trainer_config first_one = first;
  first_one.save_dir = dir + "/first_one";
  if (world().rank() == 0 && world_size > 1) EXPECT_NE(run_on(first_one, one), nullptr);
  ASSERT_TRUE(world().barrier().ok());

  // The save holds the lifetime state: one admission file, a clock per part.
  for (const char* table : {"wide", "deep"}) {
    auto m = read_sharded_manifest(first.save_dir + "/sparse/" + table);
    EMBCACHE_ASSERT_OK(m);
    EXPECT_EQ(m.value().admission.path,
              sharded_generation_name(m.value().generation) + "/admission");
    EXPECT_GT(m.value().admission.bytes, 4096u * 4) << table;
    for (const sharded_part& p : m.value().parts) {
      EXPECT_TRUE(p.has_expiry) << table << " " << p.path;
      EXPECT_EQ(p.expiry.boundaries, 2u) << table << " " << p.path;  // shards 0 and 1
      EXPECT_EQ(p.expiry.versions.size(), 1u) << table << " " << p.path;
    }
  }

  trainer_config same = rest;  // this job's ranks -> the same ranks
  same.resume_from = first.save_dir;
  same.save_dir = dir + "/rest_same";
  auto resumed = run_on(same, world());
  ASSERT_NE(resumed, nullptr);
  trainer_config grown = rest;  // 1 -> this job's ranks
  grown.resume_from = first_one.save_dir;
  grown.save_dir = dir + "/rest_grown";
  std::unique_ptr<trainer> resumed_grown;
  if (world_size > 1) {
    resumed_grown = run_on(grown, world());
    ASSERT_NE(resumed_grown, nullptr);
  }
  ASSERT_TRUE(world().barrier().ok());
  if (world().rank() != 0) return;

  std::uint64_t expired = 0;
  for (const auto& tc : resumed->cache().counters().last) expired += tc.rows_expired;
  EXPECT_GT(expired, 0u) << "pass 2 expired nothing: the test would not see a lost clock";
  expect_same_sharded_model(whole.save_dir, same.save_dir);
  expect_same_history(whole_world->history(), resumed->history());
  if (world_size == 1) return;
  expect_same_sharded_model(whole.save_dir, grown.save_dir);
  expect_same_history(whole_world->history(), resumed_grown->history());
  trainer_config shrunk = rest;  // this job's ranks -> 1
  shrunk.resume_from = first.save_dir;
  shrunk.save_dir = dir + "/rest_shrunk";
  auto resumed_one = run_on(shrunk, one);
  ASSERT_NE(resumed_one, nullptr);
  expect_same_sharded_model(whole.save_dir, shrunk.save_dir);
  expect_same_history(whole_world->history(), resumed_one->history());
}

}  // namespace
}  // namespace embcache::test
