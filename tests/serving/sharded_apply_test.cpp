// A sharded run's save and deltas served: a 2-rank history built in one process (a training cache
// per rank holding the keys the rank owns, its store checkpointed as the rank's part of the save,
// its exports as the rank's parts of each delta) applied to a serving folder gives the tables of
// the same history trained by one cache; the save written as one folder holds its rows and loads
// into a training cache; a missing part, parts of two runs and a sharded base without an output
// are refused naming what is wrong.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "embcache/serving.hpp"
#include "sharded_history.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;
using test::file_bytes;
using test::run_a;
using test::run_b;
using test::scratch;
using test::sharded_history;

// `dir` holds the tables of `want` (the one cache's final save), byte for byte, but the row
// versions (each rank's clock stamps its own).
void expect_same_tables(const std::string& dir, const std::string& want) {
  for (const char* f : {"emb/key", "emb/emb_vector", "emb/AdaGrad.accm", "lin/key",
                        "lin/emb_vector", "lin/Ftrl.n", "lin/Ftrl.z"})
    EXPECT_EQ(file_bytes(dir + "/" + f), file_bytes(want + "/" + f)) << f;
}

const sharded_history& history_once() {
  static const sharded_history h = test::make_sharded_history(scratch("history"));
  return h;
}

TEST(sharded_apply, a_sharded_save_and_the_ranks_deltas_give_the_single_process_tables) {
  const sharded_history& h = history_once();
  const std::string out = scratch("served") + "/model";
  apply_options o;
  o.output = out;
  auto r = apply_deltas(h.base, h.exports, o);
  ASSERT_TRUE(r.ok()) << r.get_status().to_string();
  EXPECT_EQ(r.value().deltas, (std::vector<std::uint64_t>{2, 3}));  // delta 1 is in the base
  EXPECT_EQ(r.value().from_delta, 1u);
  EXPECT_EQ(r.value().applied_delta, 3u);
  EXPECT_EQ(r.value().rows_erased, 1u);  // key 12 of table emb
  EXPECT_EQ(r.value().model_dir, out);
  expect_same_tables(out, h.one_final);
  // The single-process base with its deltas: the same tables.
  const std::string one = scratch("served_one") + "/model";
  fs::copy(h.one_base, one, fs::copy_options::recursive);
  ASSERT_TRUE(apply_deltas(one, h.one_deltas).ok());
  expect_same_tables(out, one);
  const auto m = nlohmann::json::parse(file_bytes(out + "/manifest.json"));
  EXPECT_EQ(m.at("applied_delta"), 3);
  EXPECT_EQ(m.at("run_id"), run_a);
  // The serving folder is an ordinary model folder: the next apply takes it in place, and finds
  // nothing more to do.
  auto again = apply_deltas(out, h.exports);
  ASSERT_TRUE(again.ok()) << again.get_status().to_string();
  EXPECT_FALSE(again.value().changed);
  // Applied one delta at a time, the folder ends the same.
  const std::string step = scratch("served_step") + "/model";
  o.output = step;
  o.until = 2;
  ASSERT_TRUE(apply_deltas(h.base, h.exports, o).ok());
  auto rest = apply_deltas(step, h.exports);
  ASSERT_TRUE(rest.ok()) << rest.get_status().to_string();
  EXPECT_EQ(rest.value().deltas, std::vector<std::uint64_t>{3});
  expect_same_tables(step, h.one_final);
}

TEST(sharded_apply, a_sharded_save_written_as_one_folder_holds_its_rows_and_loads) {
  const sharded_history& h = history_once();
  const std::string out = scratch("merged") + "/model";
  apply_options o;
  o.output = out;
  auto r = apply_deltas(h.final_save, "", o);
  ASSERT_TRUE(r.ok()) << r.get_status().to_string();
  EXPECT_TRUE(r.value().changed);
  EXPECT_TRUE(r.value().deltas.empty());
  expect_same_tables(out, h.one_final);
  // Row for row the rows of the parts, with their versions.
  auto saved = read_sharded_save(h.final_save);
  ASSERT_TRUE(saved.ok()) << saved.get_status().to_string();
  auto merged = read_model_folder(out);
  ASSERT_TRUE(merged.ok()) << merged.get_status().to_string();
  ASSERT_EQ(merged.value().tables.size(), 2u);
  for (std::size_t t = 0; t < 2; ++t) {
    const folder_table& a = saved.value().tables[t];
    const folder_table& b = merged.value().tables[t];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.keys, b.keys);
    EXPECT_EQ(a.vectors, b.vectors);
    EXPECT_EQ(a.states, b.states);
    EXPECT_EQ(a.versions, b.versions);
    EXPECT_EQ(b.version, 3u);
  }
  EXPECT_EQ(merged.value().sequence, 3u);
  EXPECT_EQ(merged.value().run_id, run_a);
  // A training cache loads it and reads the rows of the one cache's final save.
  auto tc = test::history_cache();
  ASSERT_TRUE(tc->load(out).ok());
  auto want = test::history_cache();
  ASSERT_TRUE(want->load(h.one_final).ok());
  const std::vector<std::int64_t> keys = {-7, 0, 3, 5, 77, 1000, std::int64_t{1} << 40};
  for (std::size_t t = 0; t < 2; ++t) {
    const std::size_t w = tc->row_width(t);
    std::vector<float> got(keys.size() * w), expect(keys.size() * w);
    ASSERT_TRUE(tc->read(t, keys.data(), keys.size(), got.data(), nullptr).ok());
    ASSERT_TRUE(want->read(t, keys.data(), keys.size(), expect.data(), nullptr).ok());
    EXPECT_EQ(got, expect) << "table " << t;
  }
}

TEST(sharded_apply, a_sharded_base_needs_an_output_folder) {
  const sharded_history& h = history_once();
  auto r = apply_deltas(h.base, h.exports);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.get_status().code(), status_code::invalid_argument);
  EXPECT_NE(r.get_status().message().find("is a sharded save"), std::string::npos)
      << r.get_status().to_string();
  // An output that is something else than a model folder is not replaced.
  const std::string other = scratch("not_a_model");
  std::ofstream(other + "/notes.txt") << "keep me";
  apply_options o;
  o.output = other;
  r = apply_deltas(h.base, h.exports, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.get_status().message().find("is not a model folder"), std::string::npos)
      << r.get_status().to_string();
  EXPECT_TRUE(fs::exists(other + "/notes.txt"));
}

TEST(sharded_apply, a_missing_rank_part_is_refused_naming_the_rank_and_the_folder) {
  const sharded_history& h = history_once();
  const std::string root = scratch("missing_part");
  const std::string exports = root + "/exports";
  fs::copy(h.exports, exports, fs::copy_options::recursive);
  fs::remove_all(exports + "/rank-00001/delta-000002");
  apply_options o;
  o.output = root + "/model";
  auto r = apply_deltas(h.base, exports, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.get_status().code(), status_code::not_found);
  EXPECT_NE(r.get_status().message().find("rank 1's part '" + exports +
                                          "/rank-00001/delta-000002' is missing"),
            std::string::npos)
      << r.get_status().to_string();
  EXPECT_FALSE(fs::exists(root + "/model"));
  // A missing part of the save, likewise.
  const std::string base = root + "/base";
  fs::copy(h.base, base, fs::copy_options::recursive);
  fs::remove_all(base + "/lin/gen-000001/rank-00000");
  r = apply_deltas(base, h.exports, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.get_status().message().find("rank 0's part '" + base +
                                          "/lin/gen-000001/rank-00000' is missing"),
            std::string::npos)
      << r.get_status().to_string();
}

TEST(sharded_apply, parts_of_two_runs_and_gaps_are_refused) {
  const sharded_history& h = history_once();
  const std::string root = scratch("two_runs");
  const std::string exports = root + "/exports";
  fs::copy(h.exports, exports, fs::copy_options::recursive);
  // Rank 1's part of delta 3 says it belongs to another run.
  const std::string part = exports + "/rank-00001/delta-000003/manifest.json";
  auto m = nlohmann::json::parse(file_bytes(part));
  m["run_id"] = run_b;
  std::ofstream(part) << m.dump(2);
  apply_options o;
  o.output = root + "/model";
  auto r = apply_deltas(h.base, exports, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.get_status().code(), status_code::invalid_argument);
  EXPECT_NE(r.get_status().message().find("rank 1's part"), std::string::npos)
      << r.get_status().to_string();
  EXPECT_NE(r.get_status().message().find(std::string("belongs to run ") + run_b),
            std::string::npos)
      << r.get_status().to_string();
  EXPECT_FALSE(fs::exists(root + "/model"));
  // A whole delta of another run than the save's.
  auto p = nlohmann::json::parse(file_bytes(exports + "/delta-000003.parts.json"));
  p["run_id"] = run_b;
  std::ofstream(exports + "/delta-000003.parts.json") << p.dump(2);
  m["run_id"] = run_b;
  for (const char* rank : {"rank-00000", "rank-00001"}) {
    const std::string f = exports + "/" + rank + "/delta-000003/manifest.json";
    auto x = nlohmann::json::parse(file_bytes(f));
    x["run_id"] = run_b;
    std::ofstream(f) << x.dump(2);
  }
  r = apply_deltas(h.base, exports, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.get_status().message().find("deltas of different runs do not mix"), std::string::npos)
      << r.get_status().to_string();
  // A delta missing between the save and the next: a gap.
  fs::remove(exports + "/delta-000002.parts.json");
  r = apply_deltas(h.base, exports, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.get_status().message().find("gap in the deltas: delta-2 is missing"),
            std::string::npos)
      << r.get_status().to_string();
  // A folder of both kinds of deltas is the exports of two runs.
  fs::copy(h.one_deltas + "/delta-000001", exports + "/delta-000001", fs::copy_options::recursive);
  r = apply_deltas(h.base, exports, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.get_status().message().find("holds both delta folders"), std::string::npos)
      << r.get_status().to_string();
}

#ifdef EMBCACHE_APPLY_EXE
TEST(sharded_apply, the_tool_applies_a_sharded_save_and_writes_one_folder) {
  const sharded_history& h = history_once();
  const std::string root = scratch("tool");
  auto [rc, out] = test::run_tool(std::string(EMBCACHE_APPLY_EXE) + " '" + h.base + "' '" +
                                  h.exports + "' --output '" + root + "/served'");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("deltas        2 3"), std::string::npos) << out;
  expect_same_tables(root + "/served", h.one_final);
  std::tie(rc, out) = test::run_tool(std::string(EMBCACHE_APPLY_EXE) + " '" + h.final_save +
                                     "' --output '" + root + "/merged'");
  ASSERT_EQ(rc, 0) << out;
  expect_same_tables(root + "/merged", h.one_final);
  // In place is refused for a sharded save, naming it; no deltas and no output is a usage error.
  std::tie(rc, out) =
      test::run_tool(std::string(EMBCACHE_APPLY_EXE) + " '" + h.base + "' '" + h.exports + "'");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("is a sharded save"), std::string::npos) << out;
  std::tie(rc, out) = test::run_tool(std::string(EMBCACHE_APPLY_EXE) + " '" + h.base + "'");
  EXPECT_EQ(rc, 2) << out;
}
#endif

}  // namespace
}  // namespace embcache
