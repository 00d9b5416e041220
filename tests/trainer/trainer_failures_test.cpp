// What the trainer's failures leave: an exception inside a pass ends run() with a status, a save
// too large for memory is refused before it is allocated, output folders given as links are
// written through, and a failure leaves no temporary folder behind nor removes a file not ours.
#include <sys/wait.h>

#include <exception>
#include <new>
#include <stdexcept>

#include "embcache/distributed/communicator.hpp"
#include "embcache/serving.hpp"
#include "store/store_test_util.hpp"
#include "trainer_test_support.hpp"

namespace embcache::test {
namespace {

// One rank, as single_process_communicator, whose collectives throw `thrown` once armed: an
// exception from deep inside a pass (std::bad_alloc from an allocation, an error a device call
// throws) without needing the allocation or the device. `armed` arms every collective but
// all_reduce_max (the one agree() takes, as the run's folder locks do at its start), `armed_max`
// that one alone.
class throwing_communicator final : public communicator {
 public:
  explicit throwing_communicator(std::exception_ptr thrown) : thrown_(std::move(thrown)) {}
  bool armed = false;
  bool armed_max = false;

  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  status barrier() override { return maybe_throw(one_.barrier()); }
  status broadcast(void* data, std::size_t bytes, int root) override {
    return maybe_throw(one_.broadcast(data, bytes, root));
  }
  status all_to_all_v(const void* send, const std::size_t* send_counts,
                      const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                      const std::size_t* recv_displs) override {
    return maybe_throw(
        one_.all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs));
  }
  status all_to_all(const void* send, std::size_t bytes_per_rank, void* recv) override {
    return maybe_throw(one_.all_to_all(send, bytes_per_rank, recv));
  }
  status all_gather(const void* send, std::size_t bytes, void* recv) override {
    return maybe_throw(one_.all_gather(send, bytes, recv));
  }
  status all_reduce_sum(float* d, std::size_t n) override {
    return maybe_throw(one_.all_reduce_sum(d, n));
  }
  status all_reduce_sum(double* d, std::size_t n) override {
    return maybe_throw(one_.all_reduce_sum(d, n));
  }
  status all_reduce_sum(std::uint64_t* d, std::size_t n) override {
    return maybe_throw(one_.all_reduce_sum(d, n));
  }
  status all_reduce_max(std::uint64_t* d, std::size_t n) override {
    if (armed_max) std::rethrow_exception(thrown_);
    return one_.all_reduce_max(d, n);
  }

 private:
  status maybe_throw(status s) {
    if (armed) std::rethrow_exception(thrown_);
    return s;
  }

  single_process_communicator one_;
  std::exception_ptr thrown_;
};

TEST(trainer_failures, an_exception_inside_a_pass_is_a_status_naming_the_pass_and_the_step) {
  struct expected {
    std::exception_ptr thrown;
    status_code code;
    std::string message;
  };
  const std::vector<expected> cases = {
      {std::make_exception_ptr(std::bad_alloc()), status_code::capacity_exceeded,
       "pass 1 step 1: out of memory (std::bad_alloc); the run stops here, saving nothing more "
       "(lower the tables' capacity, batch_size or the model size, or free memory)"},
      {std::make_exception_ptr(error(status_code::out_of_device_memory, "cudaMalloc: 4 GiB")),
       status_code::out_of_device_memory, "pass 1 step 1: cudaMalloc: 4 GiB"},
      {std::make_exception_ptr(std::runtime_error("boom")), status_code::internal,
       "pass 1 step 1: unexpected exception: boom"},
  };
  for (const expected& e : cases) {
    throwing_communicator comm(e.thrown);
    trainer_config c = small_config("pass_exception");
    c.passes = {{{shard(0)}}};
    auto t = trainer::create(c, comm);
    EMBCACHE_ASSERT_OK(t);
    comm.armed = true;
    const status s = t.value()->run();
    EXPECT_EQ(s.code(), e.code) << s.to_string();
    EXPECT_EQ(s.message(), e.message);
    EXPECT_FALSE(fs::exists(c.save_dir));
  }
  // Before the first pass: the ranks' agreement on the output folders' locks.
  throwing_communicator comm(std::make_exception_ptr(std::runtime_error("boom")));
  trainer_config c = small_config("start_exception");
  c.passes = {{{shard(0)}}};
  auto t = trainer::create(c, comm);
  EMBCACHE_ASSERT_OK(t);
  comm.armed_max = true;
  const status s = t.value()->run();
  EXPECT_EQ(s.code(), status_code::internal) << s.to_string();
  EXPECT_EQ(s.message(), "the start of the run: unexpected exception: boom");
  EXPECT_FALSE(fs::exists(c.save_dir));
}

// A resume from `save` is refused before anything is allocated: capacity_exceeded naming the
// file (`file` under the save) and the `bytes` its reading would need.
void expect_resume_refused_for_memory(const std::string& save, const std::string& file,
                                      const std::string& bytes) {
  trainer_config resume = small_config("huge_resume");
  resume.resume_from = save;
  auto t = trainer::create(resume);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::capacity_exceeded) << t.get_status().to_string();
  EXPECT_NE(t.get_status().message().find("reading '" + save + file + "' needs " + bytes +
                                          " bytes of memory, more than this machine's "),
            std::string::npos)
      << t.get_status().message();
}

// A save whose `deep` table claims 2^36 rows, with a key file of exactly that many keys (sparse,
// 512 GiB): the counts agree, the memory does not exist.
TEST(trainer_failures, a_save_too_large_for_memory_is_refused_before_it_is_allocated) {
  trainer_config c = small_config("huge_save");
  c.passes = {{{shard(0)}}};
  run(c);
  const std::string manifest_path = c.save_dir + "/sparse/manifest.json";
  json m = json::parse(read_bytes(manifest_path));
  const std::uint64_t count = std::uint64_t{1} << 36, key_bytes = count * 8;
  for (auto& t : m["tables"])
    if (t["name"] == "deep") {
      t["count"] = count;
      t["files"]["key"]["bytes"] = key_bytes;
    }
  std::ofstream(manifest_path, std::ios::trunc) << m.dump(2);
  std::error_code ec;
  fs::resize_file(c.save_dir + "/sparse/deep/key", key_bytes, ec);
  if (ec) GTEST_SKIP() << "no sparse file of 512 GiB here: " << ec.message();
  expect_resume_refused_for_memory(c.save_dir, "/sparse/deep/key", "549755813888");
}

// A save whose dense.bin is a sparse file of 1 TiB: a status naming it, before anything is
// allocated for it.
TEST(trainer_failures, a_dense_file_too_large_for_memory_is_refused_before_it_is_allocated) {
  trainer_config c = small_config("huge_dense");
  c.passes = {{{shard(0)}}};
  run(c);
  std::error_code ec;
  fs::resize_file(c.save_dir + "/dense.bin", std::uint64_t{1} << 40, ec);
  if (ec) GTEST_SKIP() << "no sparse file of 1 TiB here: " << ec.message();
  expect_resume_refused_for_memory(c.save_dir, "/dense.bin", "1099511627776");
}

// --- output folders --------------------------------------------------------------------------

TEST(trainer_outputs, output_folders_given_as_links_are_written_through_never_replaced) {
  const std::string root = temp_dir("outputs_links");
  trainer_config c = small_config("outputs_links");
  c.passes = {{{shard(0)}}, {{shard(1)}}};
  fs::create_directories(root + "/real_save");
  fs::create_directories(root + "/real_out");
  fs::create_directories(root + "/real_deltas");
  fs::create_symlink(root + "/real_save", root + "/save");
  fs::create_symlink("real_out", root + "/out");  // relative to the link's folder
  fs::create_symlink(root + "/real_deltas", root + "/deltas");
  c.save_dir = root + "/save";
  c.output_dir = root + "/out";
  c.export_dir = root + "/deltas";
  c.save_every_pass = true;  // two saves: the second replaces the first through the link
  run(c);
  for (const char* link : {"save", "out", "deltas"})
    EXPECT_TRUE(fs::is_symlink(root + "/" + link)) << link;
  EXPECT_TRUE(fs::exists(root + "/real_save/dense.bin"));
  EXPECT_TRUE(fs::exists(root + "/real_save/sparse/manifest.json"));
  EXPECT_TRUE(fs::exists(root + "/real_out/metrics.jsonl"));
  EXPECT_TRUE(fs::exists(root + "/real_deltas/delta-000002"));
  EXPECT_FALSE(fs::exists(root + "/save.tmp"));
  EXPECT_FALSE(fs::exists(root + "/real_save.tmp"));
  // The save loads through the link.
  trainer_config resume = small_config("outputs_links_resume");
  resume.resume_from = root + "/save";
  auto t = trainer::create(resume);
  EMBCACHE_ASSERT_OK(t);
  EXPECT_EQ(t.value()->passes_done(), 2u);
}

TEST(trainer_outputs, a_link_planted_as_a_metrics_log_is_refused_and_its_target_kept) {
  trainer_config c = small_config("metrics_link");
  c.passes = {{{shard(0)}}};
  c.save_dir.clear();
  c.output_dir = temp_dir("metrics_link_out");
  const std::string precious = temp_dir("metrics_link_keep") + "/precious.txt";
  std::ofstream(precious) << "keep me";
  fs::create_symlink(precious, c.output_dir + "/metrics.jsonl");
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  const status s = t.value()->run();
  EXPECT_EQ(s.code(), status_code::invalid_argument) << s.to_string();
  EXPECT_EQ(s.message(), "'" + c.output_dir +
                             "/metrics.jsonl' is a symbolic link: a log is never written through "
                             "one (it would truncate or grow the file it points to); remove it");
  EXPECT_EQ(read_bytes(precious), "keep me");
}

TEST(trainer_outputs, a_file_named_like_a_temporary_folder_is_refused_and_kept) {
  // The trainer's save.
  trainer_config c = small_config("staging_file");
  c.passes = {{{shard(0)}}};
  std::ofstream(c.save_dir + ".tmp") << "not ours";
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  status s = t.value()->run();
  EXPECT_EQ(s.code(), status_code::invalid_argument) << s.to_string();
  EXPECT_EQ(s.message(), "'" + c.save_dir +
                             ".tmp' is in the way of a temporary folder and is not one (only our "
                             "own temporary folders are removed); move it away");
  EXPECT_EQ(read_bytes(c.save_dir + ".tmp"), "not ours");
  EXPECT_FALSE(fs::exists(c.save_dir));
  // A folder of that name is a leftover of ours: removed, and the save goes through.
  fs::remove(c.save_dir + ".tmp");
  fs::create_directories(c.save_dir + ".tmp/sparse");
  EMBCACHE_ASSERT_OK(t.value()->save(c.save_dir));
  EXPECT_FALSE(fs::exists(c.save_dir + ".tmp"));
  // training_cache::save's own temporary folder.
  const std::string model = temp_dir("staging_file_model") + "/model";
  std::ofstream(model + ".tmp") << "not ours either";
  s = t.value()->cache().save(model);
  EXPECT_EQ(s.code(), status_code::invalid_argument) << s.to_string();
  EXPECT_EQ(read_bytes(model + ".tmp"), "not ours either");
  EXPECT_FALSE(fs::exists(model));
}

// The sizes of every file under `dir`.
std::uint64_t bytes_under(const std::string& dir) {
  std::uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(trainer_outputs, a_full_disk_leaves_no_temporary_folder) {
  // A delta export onto a full disk: no `.delta-000001.tmp`.
  {
    small_tmpfs disk(64 << 10);
    if (!disk.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
    trainer_config c = small_config("full_export");
    c.passes = {{{shard(0)}}};
    c.save_dir.clear();
    c.export_dir = disk.sub("deltas");
    auto t = trainer::create(c);
    EMBCACHE_ASSERT_OK(t);
    const status s = t.value()->run();
    EXPECT_EQ(s.code(), status_code::out_of_space) << s.to_string();
    EXPECT_EQ(names_in(c.export_dir), std::vector<std::string>{});
  }
  // embcache-apply's result onto a full disk: no `<base>.tmp`, the base as it was.
  const std::string root = temp_dir("full_apply");
  trainer_config c = small_config("full_apply");
  c.passes = {{{shard(0)}}, {{shard(1)}}};
  c.save_dir.clear();
  c.export_dir = root + "/deltas";
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  EMBCACHE_ASSERT_OK(t.value()->run_pass(c.passes[0], nullptr));
  EMBCACHE_ASSERT_OK(t.value()->save(root + "/base"));
  EMBCACHE_ASSERT_OK(t.value()->run_pass(c.passes[1], nullptr));
  // A file where apply writes its result is not ours: refused, kept, the base untouched.
  std::ofstream(root + "/base/sparse.tmp") << "not ours";
  auto refused = apply_deltas(root + "/base", c.export_dir);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.get_status().message(),
            "apply: writing the result: '" + root +
                "/base/sparse.tmp' is in the way of a temporary folder and is not one (only our "
                "own temporary folders are removed); move it away");
  EXPECT_EQ(read_bytes(root + "/base/sparse.tmp"), "not ours");
  fs::remove(root + "/base/sparse.tmp");
  const std::uint64_t base_bytes = bytes_under(root + "/base");
  small_tmpfs disk(base_bytes + base_bytes / 2);
  ASSERT_TRUE(disk.ok());
  const std::string base = disk.sub("base");
  fs::copy(root + "/base", base, fs::copy_options::recursive);
  const std::string before = read_bytes(base + "/sparse/deep/emb_vector");
  auto r = apply_deltas(base, c.export_dir);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.get_status().code(), status_code::out_of_space) << r.get_status().to_string();
  EXPECT_FALSE(fs::exists(base + "/sparse.tmp"));
  EXPECT_EQ(names_in(base + "/sparse"), names_in(root + "/base/sparse"));
  EXPECT_TRUE(read_bytes(base + "/sparse/deep/emb_vector") == before);
}

TEST(trainer_outputs, a_delta_number_too_large_for_64_bits_is_refused_naming_the_folder) {
  const std::string dir = temp_dir("delta_names");
  fs::create_directories(dir + "/delta-000001");
  fs::create_directories(dir + "/delta-18446744073709551615");  // the largest that fits
  auto l = list_deltas(dir);
  EMBCACHE_ASSERT_OK(l);
  ASSERT_EQ(l.value().size(), 2u);
  EXPECT_EQ(l.value()[1].sequence, UINT64_MAX);
  fs::create_directories(dir + "/delta-18446744073709551616");
  l = list_deltas(dir);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.get_status().code(), status_code::invalid_argument);
  EXPECT_EQ(l.get_status().message(),
            "'" + dir +
                "/delta-18446744073709551616': the delta number 18446744073709551616 does not fit "
                "in 64 bits (at most 18446744073709551615)");
}

}  // namespace
}  // namespace embcache::test
