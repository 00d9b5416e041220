// The trainer's checkpoints: a resume gives the model of an uninterrupted run, a save cut short
// between its renames still loads, and a save that fails leaves the previous one whole.
#include <sys/resource.h>

#include <csignal>
#include <fstream>
#include <map>

#include "trainer_test_support.hpp"

namespace embcache::test {
namespace {

// Trains `whole` (three passes) once straight and once as a save after pass 1 resumed for
// passes 2 and 3; both must end with the same model and history, and write the same incremental
// exports (the interrupted run's three deltas in one folder, as a resumed job writes them).
// Returns the resumed config (and the uninterrupted run's result in `whole_run` when given).
trainer_config expect_resume_equals_whole(trainer_config whole, const std::string& name,
                                          run_result* whole_run = nullptr) {
  size_to_largest_shard(whole);
  whole.export_dir = temp_dir(name + "_whole_deltas") + "/deltas";
  whole.export_with_state = true;
  const run_result rw = run(whole);
  if (whole_run) *whole_run = rw;

  trainer_config first = whole;
  first.passes = {whole.passes[0]};
  first.save_dir = temp_dir(name + "_first") + "/save";
  first.export_dir = temp_dir(name + "_deltas") + "/deltas";
  run(first);

  trainer_config rest = whole;
  rest.passes = {whole.passes[1], whole.passes[2]};
  rest.resume_from = first.save_dir;
  rest.save_dir = temp_dir(name + "_rest") + "/save";
  rest.export_dir = first.export_dir;
  auto t = trainer::create(rest);
  EXPECT_TRUE(t.ok()) << t.get_status().to_string();
  if (!t.ok()) return rest;
  EXPECT_EQ(t.value()->passes_done(), 1u);
  EXPECT_EQ(t.value()->step(), 24u);
  EMBCACHE_EXPECT_OK(t.value()->run());
  EXPECT_EQ(t.value()->step(), rw.step);
  EXPECT_EQ(t.value()->history().size(), 3u);
  if (t.value()->history().size() == 3u) {
    EXPECT_EQ(t.value()->history()[2].pass, 3u);
    EXPECT_EQ(t.value()->history()[2].eval_auc, rw.history[2].eval_auc);
    EXPECT_EQ(t.value()->history()[2].train_loss, rw.history[2].train_loss);
  }
  expect_same_model(whole.save_dir, rest.save_dir);
  expect_same_deltas(rest.export_dir, whole.export_dir, 3);
  return rest;
}

TEST(trainer_checkpoint, resume_equals_an_uninterrupted_run) {
  const trainer_config rest = expect_resume_equals_whole(small_config("whole"), "whole");
  const std::string first_save = rest.resume_from;

  // A corrupted dense blob is refused, naming the file.
  {
    std::fstream f(first_save + "/dense.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  auto bad = trainer::create(rest);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.get_status().message().find("dense.bin"), std::string::npos)
      << bad.get_status().to_string();
}

// config.move_staged_rows: a save taken while rows sit in the caches' spare rows (staged for the
// next pass, leavers moved out; the default on the host) resumes into the model and deltas of an
// uninterrupted run, and so does one with the staged rows copied.
TEST(trainer_checkpoint, a_resume_with_staged_rows_moved_or_copied_equals_an_uninterrupted_run) {
  trainer_config whole = small_config("moved_whole");
  ASSERT_FALSE(whole.move_staged_rows.has_value());
  run_result rw;
  expect_resume_equals_whole(whole, "moved", &rw);
  EXPECT_GT(rw.totals.rows_moved, 0u);
  EXPECT_GT(rw.totals.rows_detached, 0u);
  trainer_config copied = small_config("copied_whole");
  copied.move_staged_rows = false;
  run_result rc;
  expect_resume_equals_whole(copied, "copied", &rc);
  EXPECT_EQ(rc.totals.rows_moved, 0u);
  EXPECT_EQ(rc.totals.rows_detached, 0u);
  EXPECT_GT(rc.totals.rows_staged, 0u);
}

// Host-hybrid saves are written from the stores directly (no training cache involved): resuming
// from one gives the model of an uninterrupted host-hybrid run, which is the cache's model.
TEST(trainer_checkpoint, a_host_hybrid_resume_equals_an_uninterrupted_run) {
  trainer_config whole = small_config("hybrid_whole");
  whole.mode = trainer_mode::host_hybrid;
  const trainer_config rest = expect_resume_equals_whole(whole, "hybrid");
  // The run's identity is recorded as the cache's saves record it, and a resume keeps it.
  const auto run_of = [](const std::string& save) {
    return nlohmann::json::parse(read_bytes(save + "/sparse/manifest.json")).value("run_id", "");
  };
  EXPECT_EQ(run_of(rest.resume_from).size(), 32u);
  EXPECT_EQ(run_of(rest.save_dir), run_of(rest.resume_from));
  EXPECT_NE(run_of(whole.save_dir), run_of(rest.save_dir));
}

// Feature admission and expiry, in every mode: the admission counts travel with the save
// (`admission` beside each table's rows) and so does the expiry clock (rows leave at shard
// starts), so a resume admits and expires exactly what an uninterrupted run does and ends with
// its model. Host-hybrid saves them from the cache that keeps them beside its stores.
// Admission and expiry in one mode: the sketch and the expiry clock travel with the save, so a
// resume admits and expires exactly what the uninterrupted run does.
void expect_admission_and_expiry_resume_equals_whole(trainer_mode mode) {
  const std::string name = std::string("admission_expiry_") + to_string(mode);
  trainer_config whole = small_config(name);
  whole.mode = mode;
  for (auto& t : whole.tables) {
    t.admission.min_count = 2;
    t.admission.sketch_width = 4096;
    t.expiry.ttl_passes = 1;
  }
  run_result whole_run;
  const trainer_config rest = expect_resume_equals_whole(whole, name, &whole_run);
  EXPECT_TRUE(fs::exists(rest.save_dir + "/sparse/deep/admission")) << name;
  EXPECT_TRUE(fs::exists(rest.resume_from + "/sparse/wide/admission")) << name;
  // Keys were refused and rows expired: the save holds fewer deep rows than the passes' keysets.
  EXPECT_GT(whole_run.totals.keys_refused, 0u) << name;
  EXPECT_GT(whole_run.totals.rows_expired, 0u) << name;
  const std::size_t saved = fs::file_size(whole.save_dir + "/sparse/deep/key") / 8;
  EXPECT_LT(saved, count_keys(whole, "deep")) << name;
}

TEST(trainer_checkpoint, a_keyset_resume_with_admission_and_expiry_equals_an_uninterrupted_run) {
  expect_admission_and_expiry_resume_equals_whole(trainer_mode::keyset);
}

TEST(trainer_checkpoint,
     an_on_demand_resume_with_admission_and_expiry_equals_an_uninterrupted_run) {
  expect_admission_and_expiry_resume_equals_whole(trainer_mode::on_demand);
}

TEST(trainer_checkpoint,
     a_host_hybrid_resume_with_admission_and_expiry_equals_an_uninterrupted_run) {
  expect_admission_and_expiry_resume_equals_whole(trainer_mode::host_hybrid);
}

// Expiry by steps: the step clock travels with the save (the table's `expiry` object), so a
// resume expires at each shard start exactly the rows an uninterrupted run does. Host-hybrid,
// which takes the steps' clock from its stores; keyset mode's resume is
// expiry.save_and_load_keep_the_step_clock (training_tests), its trainer run checked once here.
TEST(trainer_checkpoint, a_resume_with_ttl_steps_equals_an_uninterrupted_run) {
  const auto clock_of = [](const std::string& save) {
    return nlohmann::json::parse(read_bytes(save + "/sparse/manifest.json"))
        .at("tables")
        .at(1)
        .at("expiry");
  };
  trainer_config whole = small_config("ttl_steps_hybrid");
  whole.mode = trainer_mode::host_hybrid;
  for (auto& t : whole.tables) t.expiry.ttl_steps = 6;
  run_result whole_run;
  const trainer_config rest = expect_resume_equals_whole(whole, "ttl_steps_hybrid", &whole_run);
  EXPECT_GT(whole_run.totals.rows_expired, 0u);
  const auto clock = clock_of(rest.resume_from);
  EXPECT_GT(clock.at("steps").get<std::uint64_t>(), 6u);
  EXPECT_EQ(clock.at("step_versions").size(), 6u);

  trainer_config keyset = small_config("ttl_steps_keyset");
  keyset.passes = {keyset.passes[0]};
  for (auto& t : keyset.tables) t.expiry.ttl_steps = 6;
  const run_result one = run(keyset);
  EXPECT_GT(one.totals.rows_expired, 0u);
  EXPECT_EQ(clock_of(keyset.save_dir).at("steps").get<std::uint64_t>(), one.step);
}

// Copies the files of a save (to compare it with what a later save or load left).
std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file())
      files[fs::relative(e.path(), dir).string()] = read_bytes(e.path().string());
  return files;
}

TEST(trainer_checkpoint, a_save_cut_short_between_its_renames_loads_from_the_previous_folder) {
  trainer_config c = small_config("cut_short");
  c.passes = {c.passes[0]};
  run(c);
  const std::string save = c.save_dir, old = save + ".old";
  // A save replaces the previous one whole and leaves nothing beside it.
  EXPECT_FALSE(fs::exists(save + ".tmp"));
  EXPECT_FALSE(fs::exists(old));
  const auto saved = files_of(save);
  // Where the two renames of a publish without an atomic exchange stop: the previous save moved
  // aside, the new one not yet in place (or only a part of a folder there).
  for (const bool partial_in_place : {false, true}) {
    fs::remove_all(old);
    fs::rename(save, old);
    if (partial_in_place) fs::create_directories(save + "/sparse");
    trainer_config resumed = c;
    resumed.passes = {c.passes[0]};
    resumed.resume_from = save;
    resumed.save_dir = temp_dir("cut_short_again") + "/save";
    auto t = trainer::create(resumed);
    EMBCACHE_ASSERT_OK(t);
    EXPECT_EQ(t.value()->passes_done(), 1u) << partial_in_place;
    EXPECT_EQ(t.value()->step(), 24u) << partial_in_place;
    EMBCACHE_ASSERT_OK(t.value()->save(resumed.save_dir));
    expect_same_model(old, resumed.save_dir);
    fs::remove_all(save);
    fs::rename(old, save);
    EXPECT_EQ(files_of(save), saved);
  }
}

// Lets the files this process writes grow to `bytes` at most (writes beyond fail with EFBIG
// instead of raising SIGXFSZ); the destructor restores the limit.
class file_size_limit {
 public:
  explicit file_size_limit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{bytes, saved_.rlim_max};
    ok_ = ::setrlimit(RLIMIT_FSIZE, &limit) == 0;
  }
  ~file_size_limit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  void (*previous_handler_)(int) = nullptr;
  bool ok_ = false;
};

TEST(trainer_checkpoint, a_failed_dense_write_leaves_the_previous_save_whole) {
  trainer_config c = small_config("dense_fails");
  c.passes = {{{shard(0)}}, {{shard(2)}}};
  c.model.hidden = {2048};  // dense.bin of about 10 MB, larger than every sparse file
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  EMBCACHE_ASSERT_OK(t.value()->run_pass(c.passes[0]));
  EMBCACHE_ASSERT_OK(t.value()->save(c.save_dir));
  const auto saved = files_of(c.save_dir);
  std::size_t largest_sparse = 0;
  for (const auto& [name, bytes] : saved)
    if (name.rfind("sparse/", 0) == 0) largest_sparse = std::max(largest_sparse, bytes.size());
  const std::size_t dense = saved.at("dense.bin").size(), limit = 4u << 20;
  ASSERT_LT(largest_sparse, limit);
  ASSERT_GT(dense, limit);

  EMBCACHE_ASSERT_OK(t.value()->run_pass(c.passes[1]));
  status s;
  {
    file_size_limit small(limit);
    ASSERT_TRUE(small.ok());
    s = t.value()->save(c.save_dir);
  }
  EXPECT_EQ(s.code(), status_code::io_error) << s.to_string();
  EXPECT_EQ(s.message(), "cannot write '" + c.save_dir + ".tmp/dense.bin': File too large");
  // The previous save is untouched and loads; nothing of the failed one is left.
  EXPECT_EQ(files_of(c.save_dir), saved);
  EXPECT_FALSE(fs::exists(c.save_dir + ".tmp"));
  EXPECT_FALSE(fs::exists(c.save_dir + ".old"));
  trainer_config resumed = c;
  resumed.resume_from = c.save_dir;
  auto again = trainer::create(resumed);
  EMBCACHE_ASSERT_OK(again);
  EXPECT_EQ(again.value()->passes_done(), 1u);
  // Once the disk has room again, the next save goes through.
  EMBCACHE_EXPECT_OK(t.value()->save(c.save_dir));
  EXPECT_NE(files_of(c.save_dir).at("dense.bin"), saved.at("dense.bin"));
}

// Two trainers writing one save_dir or one export_dir: while the first runs, a second is refused
// "in use", naming the folder, before it trains; once the first is done the folders are free.
TEST(trainer_checkpoint, a_second_trainer_on_the_same_save_or_export_dir_is_refused) {
  trainer_config c = small_config("two_trainers");
  c.passes = {c.passes[0]};
  c.export_dir = temp_dir("two_trainers_export") + "/deltas";
  trainer_config same_save = c;
  same_save.export_dir = temp_dir("two_trainers_other_export") + "/deltas";
  trainer_config same_export = c;
  same_export.save_dir = temp_dir("two_trainers_other_save") + "/save";
  auto first = trainer::create(c);
  EMBCACHE_ASSERT_OK(first);
  status save_clash, export_clash;
  bool tried = false;
  first.value()->set_log([&](const std::string& line) {
    if (tried || line.rfind("pass 1 done", 0) != 0) return;
    tried = true;
    auto a = trainer::create(same_save);
    auto b = trainer::create(same_export);
    if (!a.ok() || !b.ok()) return;
    a.value()->set_log([](const std::string&) {});
    b.value()->set_log([](const std::string&) {});
    save_clash = a.value()->run();
    export_clash = b.value()->run();
  });
  EMBCACHE_ASSERT_OK(first.value()->run());
  ASSERT_TRUE(tried);
  const std::string save_parent = fs::path(c.save_dir).parent_path().string();
  const std::string export_parent = fs::path(c.export_dir).parent_path().string();
  EXPECT_EQ(save_clash.code(), status_code::invalid_argument) << save_clash.to_string();
  EXPECT_EQ(save_clash.message(), "config.save_dir '" + c.save_dir +
                                      "' is in use by another process (lock '" + save_parent +
                                      "/.save.lock' is held)");
  EXPECT_EQ(export_clash.code(), status_code::invalid_argument) << export_clash.to_string();
  EXPECT_EQ(export_clash.message(), "config.export_dir '" + c.export_dir +
                                        "' is in use by another process (lock '" + export_parent +
                                        "/.deltas.lock' is held)");
  // The refused runs wrote nothing: one delta, of the first run.
  EXPECT_TRUE(fs::exists(c.export_dir + "/delta-000001"));
  EXPECT_FALSE(fs::exists(c.export_dir + "/delta-000002"));
  EXPECT_FALSE(fs::exists(same_save.export_dir + "/delta-000001"));
  EXPECT_FALSE(fs::exists(same_export.save_dir));
  // After the first run, the same folders are free.
  same_save.resume_from = c.save_dir;
  run(same_save);
}

// A save whose sparse part was rewritten after it was taken (embcache-apply on the save, here:
// the sparse part of a later save put in its place) does not resume with the dense network of
// the earlier point: the resume is refused, naming both files and what each records.
TEST(trainer_checkpoint, a_save_whose_sparse_part_was_rewritten_is_refused_on_resume) {
  trainer_config c = small_config("rewritten");
  c.passes = {c.passes[0]};
  run(c);
  trainer_config later = c;
  later.resume_from = c.save_dir;
  later.save_dir = temp_dir("rewritten_later") + "/save";
  run(later);
  // The save records the export point of its sparse part beside dense.bin.
  const auto state = nlohmann::json::parse(read_bytes(c.save_dir + "/trainer.json"));
  ASSERT_TRUE(state.contains("sparse"));
  const auto manifest = nlohmann::json::parse(read_bytes(c.save_dir + "/sparse/manifest.json"));
  EXPECT_EQ(state.at("sparse").at("run_id"), manifest.at("run_id"));
  EXPECT_EQ(state.at("sparse").at("applied_delta"), 0);
  EXPECT_EQ(state.at("sparse").at("versions").at("deep"), manifest.at("tables")[1].at("version"));
  // A resumed run keeps the identity of the save it resumed.
  EXPECT_EQ(
      nlohmann::json::parse(read_bytes(later.save_dir + "/sparse/manifest.json")).at("run_id"),
      manifest.at("run_id"));
  fs::remove_all(c.save_dir + "/sparse");
  fs::copy(later.save_dir + "/sparse", c.save_dir + "/sparse", fs::copy_options::recursive);
  trainer_config resumed = c;
  resumed.resume_from = c.save_dir;
  resumed.save_dir = temp_dir("rewritten_resumed") + "/save";
  auto t = trainer::create(resumed);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::invalid_argument) << t.get_status().to_string();
  EXPECT_NE(t.get_status().message().find("'" + c.save_dir +
                                          "/sparse' is not the sparse part 'dense.bin' was saved "
                                          "with: " +
                                          c.save_dir + "/trainer.json records"),
            std::string::npos)
      << t.get_status().message();
}

// A table folder in HugeCTR's layout: key (int64), emb_vector (float32[n][dim]), slot_id
// (uint64[n]) and the optimizer's files.
template <class T>
void write_items(const std::string& path, const std::vector<T>& v) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(T)));
}

// embcache-train starts from a plain HugeCTR sparse model folder (config.start_from_hugectr):
// rows, slot ids and Adam's files arrive as written, with the library's checks; resume_from
// pointing at such a folder says which field to use.
TEST(trainer_checkpoint, a_run_starts_from_a_hugectr_folder) {
  trainer_config c = small_config("from_hugectr");
  c.passes = {c.passes[0]};
  const std::size_t dim = c.tables[1].dim;
  const std::string dir = temp_dir("hugectr_folder");
  fs::create_directories(dir + "/wide");
  fs::create_directories(dir + "/deep");
  const std::vector<std::int64_t> keys = {11, 22, 33};
  std::vector<float> deep(keys.size() * dim), m(deep.size()), v(deep.size());
  for (std::size_t i = 0; i < deep.size(); ++i) {
    deep[i] = 0.001f * float(i + 1);
    m[i] = 0.0001f * float(i);
    v[i] = 0.00001f * float(i + 2);
  }
  write_items(dir + "/wide/key", keys);
  write_items(dir + "/wide/emb_vector", std::vector<float>{0.5f, -0.25f, 0.125f});
  write_items(dir + "/deep/key", keys);
  write_items(dir + "/deep/emb_vector", deep);
  write_items(dir + "/deep/slot_id", std::vector<std::uint64_t>{1, 2, 3});
  write_items(dir + "/deep/Adam.m", m);
  write_items(dir + "/deep/Adam.v", v);
  ASSERT_EQ(c.tables[1].optimizer.kind, optimizer_kind::adam);

  c.start_from_hugectr = dir;
  {
    auto t = trainer::create(c);
    ASSERT_TRUE(t.ok()) << t.get_status().to_string();
    training_cache<std::int64_t>& cache = t.value()->cache();
    const std::size_t width = cache.row_width(1);
    ASSERT_EQ(width, 3 * dim);
    std::vector<float> rows(keys.size() * width);
    bool found[3] = {};
    EMBCACHE_ASSERT_OK(cache.read(1, keys.data(), keys.size(), rows.data(), found));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      ASSERT_TRUE(found[i]) << keys[i];
      for (std::size_t d = 0; d < dim; ++d) {
        EXPECT_EQ(rows[i * width + d], deep[i * dim + d]) << keys[i];
        EXPECT_EQ(rows[i * width + dim + d], m[i * dim + d]) << keys[i];
        EXPECT_EQ(rows[i * width + 2 * dim + d], v[i * dim + d]) << keys[i];
      }
    }
    auto slot = cache.slot_id(1, 22);
    ASSERT_TRUE(slot.ok());
    EXPECT_EQ(slot.value(), 2u);
    EMBCACHE_EXPECT_OK(t.value()->run());
    EXPECT_EQ(t.value()->passes_done(), 1u);
  }
  // The config round-trips the field; resume_from with it is refused naming both.
  const nlohmann::json j = c;
  EXPECT_EQ(j.at("start_from_hugectr"), dir);
  trainer_config both = c;
  both.resume_from = c.save_dir;
  auto refused = trainer::create(both);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.get_status().message().find(
                "config.start_from_hugectr: set together with config.resume_from"),
            std::string::npos)
      << refused.get_status().message();
  // resume_from on a HugeCTR folder names the field that starts from one.
  trainer_config resume = c;
  resume.start_from_hugectr.clear();
  resume.resume_from = dir;
  auto wrong = trainer::create(resume);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.get_status().message().find("it is a HugeCTR sparse model folder, not a trainer "
                                              "save; a run starts from one with "
                                              "config.start_from_hugectr"),
            std::string::npos)
      << wrong.get_status().message();
  // The library's checks: a repeated key names the file and the key.
  write_items(dir + "/wide/key", std::vector<std::int64_t>{11, 22, 11});
  auto repeated = trainer::create(c);
  ASSERT_FALSE(repeated.ok());
  EXPECT_NE(repeated.get_status().message().find("config.start_from_hugectr"), std::string::npos)
      << repeated.get_status().message();
  EXPECT_NE(repeated.get_status().message().find("11"), std::string::npos)
      << repeated.get_status().message();
  // A torn file: emb_vector shorter than its keys need.
  write_items(dir + "/wide/key", keys);
  write_items(dir + "/wide/emb_vector", std::vector<float>{0.5f, -0.25f});
  auto torn = trainer::create(c);
  ASSERT_FALSE(torn.ok());
  EXPECT_NE(torn.get_status().message().find("wide/emb_vector' has 8 bytes"), std::string::npos)
      << torn.get_status().message();
}

}  // namespace
}  // namespace embcache::test
