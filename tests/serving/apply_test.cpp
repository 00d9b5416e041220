// apply_deltas and embcache-apply: base + deltas equals the save taken at the end, gaps and old
// deltas are refused, a failing apply leaves the base untouched.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "embcache/serving.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;
using test::file_bytes;
using test::folder_bytes;
using test::history;
using test::scratch;

// `dir` holds the same table files as the save `want` (`files` of each table).
void expect_same_tables(const std::string& dir, const std::string& want,
                        const std::vector<std::string>& files) {
  for (const char* t : {"emb", "lin"}) {
    for (const auto& name : files) {
      // "state": the table's optimizer files, as save() writes them (AdaGrad, FTRL).
      std::vector<std::string> expanded = {name};
      if (name == "state")
        expanded = t == std::string("emb") ? std::vector<std::string>{"AdaGrad.accm"}
                                           : std::vector<std::string>{"Ftrl.n", "Ftrl.z"};
      for (const auto& f : expanded)
        EXPECT_EQ(file_bytes(dir + "/" + t + "/" + f), file_bytes(want + "/" + t + "/" + f))
            << t << "/" << f;
    }
  }
}

std::string copy_of(const std::string& dir, const std::string& to) {
  fs::copy(dir, to, fs::copy_options::recursive);
  return to;
}

TEST(apply_deltas, base_and_deltas_equal_the_final_save) {
  const std::string root = scratch("equal");
  const history h = test::make_history(root, /*with_state=*/true);
  auto r = apply_deltas(h.base, h.deltas);
  ASSERT_TRUE(r.ok()) << r.get_status().to_string();
  EXPECT_TRUE(r.value().changed);
  EXPECT_EQ(r.value().deltas, (std::vector<std::uint64_t>{1, 2}));
  EXPECT_EQ(r.value().applied_delta, 2u);
  EXPECT_EQ(r.value().rows_erased, 1u);  // key 12 of table emb
  EXPECT_FALSE(r.value().state_dropped);
  expect_same_tables(h.base, h.final_save, {"key", "emb_vector", "state", "version"});
  const auto m = nlohmann::json::parse(file_bytes(h.base + "/manifest.json"));
  EXPECT_EQ(m.at("applied_delta"), 2);
  EXPECT_FALSE(fs::exists(h.base + ".tmp"));
  EXPECT_FALSE(fs::exists(h.base + ".old"));
  // The result is a save: load() takes it and holds the final rows.
  auto tc = test::history_cache();
  ASSERT_TRUE(tc->load(h.base).ok());
  const std::int64_t k = 12;
  float row[8];
  bool found = true;
  ASSERT_TRUE(tc->read(0, &k, 1, row, &found).ok());
  EXPECT_FALSE(found);
  // Applying again finds nothing to do and leaves the folder alone.
  const auto before = folder_bytes(h.base);
  auto again = apply_deltas(h.base, h.deltas);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again.value().changed);
  EXPECT_EQ(again.value().applied_delta, 2u);
  EXPECT_EQ(folder_bytes(h.base), before);
}

// Expiry: a key that expired in training is a tombstone of the next delta, and applying the
// deltas leaves the served model equal to the final save, without that key.
TEST(apply_deltas, expired_rows_leave_the_served_model) {
  const std::string root = scratch("expired");
  const history h = test::make_expiring_history(root);
  auto delta = read_delta_folder(h.deltas + "/delta-000002");
  ASSERT_TRUE(delta.ok()) << delta.get_status().to_string();
  EXPECT_EQ(delta.value().tables[0].erased, (std::vector<std::int64_t>{1}));
  EXPECT_TRUE(delta.value().tables[1].erased.empty());
  auto r = apply_deltas(h.base, h.deltas);
  ASSERT_TRUE(r.ok()) << r.get_status().to_string();
  EXPECT_EQ(r.value().rows_erased, 1u);
  for (const char* t : {"emb", "lin"})
    for (const char* f : {"key", "emb_vector"})
      EXPECT_EQ(file_bytes(h.base + "/" + t + "/" + f),
                file_bytes(h.final_save + "/" + t + "/" + f))
          << t << "/" << f;
  auto served = read_model_folder(h.base);
  ASSERT_TRUE(served.ok());
  EXPECT_EQ(served.value().tables[0].keys, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(served.value().tables[1].keys, (std::vector<std::int64_t>{1, 2, 3}));
}

TEST(apply_deltas, one_at_a_time_with_until_and_deltas_without_state_give_a_serving_model) {
  const std::string root = scratch("until");
  const history h = test::make_history(root, /*with_state=*/false);
  apply_options one;
  one.until = 1;
  auto r1 = apply_deltas(h.base, h.deltas, one);
  ASSERT_TRUE(r1.ok()) << r1.get_status().to_string();
  EXPECT_EQ(r1.value().deltas, std::vector<std::uint64_t>{1});
  EXPECT_TRUE(r1.value().state_dropped);
  auto r2 = apply_deltas(h.base, h.deltas);
  ASSERT_TRUE(r2.ok()) << r2.get_status().to_string();
  EXPECT_EQ(r2.value().deltas, std::vector<std::uint64_t>{2});
  expect_same_tables(h.base, h.final_save, {"key", "emb_vector", "version"});
  EXPECT_FALSE(fs::exists(h.base + "/emb/AdaGrad.accm"));  // no state: no optimizer files
  EXPECT_FALSE(fs::exists(h.base + "/emb/opt_state"));
  auto m = read_model_folder(h.base);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m.value().tables[0].state_width, 0u);
  // load() refuses it for a table with optimizer state, naming the widths.
  auto tc = test::history_cache();
  const status s = tc->load(h.base);
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_NE(s.message().find("state width 0"), std::string::npos) << s.message();
  // The base is at delta 2: going back to 1 is refused.
  const status back = apply_deltas(h.base, h.deltas, one).get_status();
  EXPECT_EQ(back.code(), status_code::invalid_argument);
  EXPECT_NE(back.message().find("at delta 2, past --until 1"), std::string::npos) << back.message();
}

TEST(apply_deltas, gaps_are_refused) {
  const std::string root = scratch("gaps");
  const history h = test::make_history(root, true);
  const auto before = folder_bytes(h.base);
  // Versions: without delta-000001, delta-000002 starts after changes the base lacks.
  fs::rename(h.deltas + "/delta-000001", root + "/delta-000001");
  const status s = apply_deltas(h.base, h.deltas).get_status();
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_NE(s.message().find("gap before '" + h.deltas + "/delta-000002': table 'emb'"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(folder_bytes(h.base), before);
  // Numbers: at delta 1, delta-000003 without delta-000002.
  fs::rename(root + "/delta-000001", h.deltas + "/delta-000001");
  apply_options one;
  one.until = 1;
  ASSERT_TRUE(apply_deltas(h.base, h.deltas, one).ok());
  fs::rename(h.deltas + "/delta-000002", h.deltas + "/delta-000003");
  const status n = apply_deltas(h.base, h.deltas).get_status();
  EXPECT_EQ(n.code(), status_code::invalid_argument);
  EXPECT_NE(n.message().find("delta-2 is missing"), std::string::npos) << n.message();
}

// Every run has an identity in its saves and deltas: another run's deltas are refused, naming
// both identities and the delta, and the base stays as it was. Folders of earlier versions (no
// identity) are not checked: they apply as before.
TEST(apply_deltas, deltas_of_another_run_are_refused) {
  const history a = test::make_history(scratch("run_a"), false);
  const history d = test::make_history(scratch("run_d"), false);
  const std::string run_a =
      nlohmann::json::parse(file_bytes(a.base + "/manifest.json")).at("run_id");
  const std::string run_d =
      nlohmann::json::parse(file_bytes(d.deltas + "/delta-000001/manifest.json")).at("run_id");
  ASSERT_EQ(run_a.size(), 32u);
  ASSERT_NE(run_a, run_d);
  // One run's folders share its identity, the final save included.
  EXPECT_EQ(
      nlohmann::json::parse(file_bytes(a.deltas + "/delta-000002/manifest.json")).at("run_id"),
      run_a);
  EXPECT_EQ(nlohmann::json::parse(file_bytes(a.final_save + "/manifest.json")).at("run_id"), run_a);
  const auto before = folder_bytes(a.base);
  {  // One run's own deltas: checked.
    const std::string copy = copy_of(a.base, scratch("run_a_copy") + "/base");
    auto own = apply_deltas(copy, a.deltas);
    ASSERT_TRUE(own.ok()) << own.get_status().to_string();
    EXPECT_FALSE(own.value().run_unchecked);
  }
  auto r = apply_deltas(a.base, d.deltas);
  EXPECT_EQ(r.get_status().code(), status_code::invalid_argument);
  EXPECT_EQ(r.get_status().message(), "apply: '" + d.deltas + "/delta-000001' belongs to run " +
                                          run_d + ", the base '" + a.base + "' to run " + run_a +
                                          " (deltas of different runs do not mix)");
  EXPECT_EQ(folder_bytes(a.base), before);
  // A base and a delta without identities (as earlier versions wrote them) are not checked.
  for (const std::string& m :
       {a.base + "/manifest.json", d.deltas + "/delta-000001/manifest.json"}) {
    auto j = nlohmann::json::parse(file_bytes(m));
    j.erase("run_id");
    std::ofstream(m, std::ios::trunc) << j.dump(2);
  }
  auto old = apply_deltas(a.base, d.deltas);
  ASSERT_TRUE(old.ok()) << old.get_status().to_string();
  EXPECT_TRUE(old.value().run_unchecked);
  // The result takes the identity of the first delta that has one.
  EXPECT_EQ(nlohmann::json::parse(file_bytes(a.base + "/manifest.json")).at("run_id"), run_d);
  // A run identity that is not 32 hex digits is refused by the reader, naming the field.
  auto j = nlohmann::json::parse(file_bytes(a.base + "/manifest.json"));
  j["run_id"] = "not-hex";
  std::ofstream(a.base + "/manifest.json", std::ios::trunc) << j.dump(2);
  auto bad = read_model_folder(a.base);
  EXPECT_EQ(bad.get_status().code(), status_code::corruption);
  EXPECT_EQ(bad.get_status().message(), "'" + a.base +
                                            "/manifest.json': field 'run_id' must be 32 lowercase "
                                            "hex digits");
}

TEST(apply_deltas, a_corrupted_delta_leaves_the_base_untouched) {
  const std::string root = scratch("corrupt");
  const history h = test::make_history(root, true);
  const auto before = folder_bytes(h.base);
  const std::string victim = h.deltas + "/delta-000002/emb/emb_vector";
  std::string bytes = file_bytes(victim);
  bytes[5] ^= 0x40;
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;
  const status s = apply_deltas(h.base, h.deltas).get_status();
  EXPECT_EQ(s.code(), status_code::corruption);
  EXPECT_NE(s.message().find("'" + victim + "' has checksum"), std::string::npos) << s.message();
  EXPECT_EQ(folder_bytes(h.base), before);  // delta-000001 was fine, but nothing is written
  EXPECT_FALSE(fs::exists(h.base + ".tmp"));
}

TEST(apply_deltas, a_trainer_save_is_applied_through_its_sparse_folder) {
  const std::string root = scratch("trainer_save");
  const history h = test::make_history(root, true);
  fs::create_directories(root + "/save");
  fs::rename(h.base, root + "/save/sparse");
  auto r = apply_deltas(root + "/save/", h.deltas);
  ASSERT_TRUE(r.ok()) << r.get_status().to_string();
  EXPECT_EQ(r.value().model_dir, root + "/save/sparse");
  expect_same_tables(root + "/save/sparse", h.final_save, {"key", "emb_vector"});
}

// Deltas carry the slot ids of their rows when each row has one, and apply_deltas keeps them: a
// key new in a delta without them is counted as without one (the folder then has no `slot_id`
// file, as a save where a row has none), and a later delta whose rows know theirs brings it back.
TEST(apply_deltas, slot_ids_travel_with_the_deltas) {
  const std::string root = scratch("slot_ids");
  table_options<std::int64_t> o;
  o.name = "emb";
  o.dim = 2;
  o.capacity = 8;
  training_cache<std::int64_t> tc(training_cache_options{}, {o});
  const std::vector<std::int64_t> k0 = {1, 2};
  const std::vector<std::uint64_t> s0 = {10, 20};
  ASSERT_TRUE(tc.begin_pass({k0}).ok());
  test::touch(tc, 0, k0, 1.0f);
  ASSERT_TRUE(tc.set_slot_ids(0, k0.data(), s0.data(), k0.size()).ok());
  ASSERT_TRUE(tc.save(root + "/base").ok());
  ASSERT_TRUE(fs::exists(root + "/base/emb/slot_id"));
  ASSERT_TRUE(tc.begin_pass({{2, 3}}).ok());
  test::touch(tc, 0, {2, 3}, 2.0f);  // key 3 has no slot id yet
  ASSERT_TRUE(tc.export_incremental_to(root + "/deltas").ok());
  EXPECT_FALSE(fs::exists(root + "/deltas/delta-000001/emb/slot_id"));
  auto r = apply_deltas(root + "/base", root + "/deltas");
  ASSERT_TRUE(r.ok()) << r.get_status().to_string();
  EXPECT_FALSE(fs::exists(root + "/base/emb/slot_id"));
  auto m = nlohmann::json::parse(file_bytes(root + "/base/manifest.json"));
  EXPECT_EQ(m.at("tables")[0].value("rows_without_slot_id", 0), 1);
  const std::int64_t three = 3;
  const std::uint64_t thirty = 30;
  ASSERT_TRUE(tc.set_slot_ids(0, &three, &thirty, 1).ok());
  ASSERT_TRUE(tc.begin_pass({{1, 2, 3}}).ok());
  test::touch(tc, 0, {1, 2, 3}, 3.0f);
  ASSERT_TRUE(tc.export_incremental_to(root + "/deltas").ok());
  EXPECT_TRUE(fs::exists(root + "/deltas/delta-000002/emb/slot_id"));
  r = apply_deltas(root + "/base", root + "/deltas");
  ASSERT_TRUE(r.ok()) << r.get_status().to_string();
  m = nlohmann::json::parse(file_bytes(root + "/base/manifest.json"));
  EXPECT_FALSE(m.at("tables")[0].contains("rows_without_slot_id"));
  const std::string ids = file_bytes(root + "/base/emb/slot_id");
  std::vector<std::uint64_t> got(ids.size() / 8);
  std::memcpy(got.data(), ids.data(), ids.size());
  EXPECT_EQ(got, (std::vector<std::uint64_t>{10, 20, 30}));
}

#ifdef EMBCACHE_APPLY_EXE
std::pair<int, std::string> run_tool(const std::string& args) {
  return test::run_tool(std::string(EMBCACHE_APPLY_EXE) + " " + args);
}

TEST(apply_tool, exit_codes_and_result) {
  const std::string root = scratch("tool");
  const history h = test::make_history(root, true);
  const std::string copy = copy_of(h.base, root + "/copy");
  EXPECT_EQ(run_tool("").first, 2);
  EXPECT_EQ(run_tool("'" + h.base + "' '" + h.deltas + "' --until x").first, 2);
  EXPECT_EQ(run_tool("'" + h.base + "' '" + h.deltas + "' --redis nowhere").first, 2);
  const auto ok = run_tool("'" + h.base + "' '" + h.deltas + "'");
  EXPECT_EQ(ok.first, 0) << ok.second;
  EXPECT_NE(ok.second.find("deltas        1 2\napplied       2 (was 0)"), std::string::npos)
      << ok.second;
  expect_same_tables(h.base, h.final_save, {"key", "emb_vector", "state"});
  std::ofstream(h.deltas + "/delta-000001/manifest.json", std::ios::trunc) << "{";
  const auto bad = run_tool("'" + copy + "' '" + h.deltas + "'");
  EXPECT_EQ(bad.first, 1) << bad.second;
  EXPECT_NE(bad.second.find("corruption: apply: '" + h.deltas +
                            "/delta-000001/manifest.json' is not a JSON object"),
            std::string::npos)
      << bad.second;
}
#endif

}  // namespace
}  // namespace embcache
