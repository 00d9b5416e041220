// What prep leaves behind when things go wrong: a failed --force keeps the old dataset, a
// crashed run's temporaries are cleaned by the next one, two runs never share a folder, and
// inputs that cannot give a dataset are errors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "common/status_assertions.hpp"
#include "embcache/criteo.hpp"
#include "embcache/shard.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;
using test::contains;
using test::read_bytes;
using test::scratch_dir;
using test::write_bytes;
using test::write_text;

// A well-formed line from row number i (made-up values).
std::string line(int i) {
  std::string s = std::to_string(i % 2);
  for (int j = 0; j < 13; ++j) s += "\t" + std::to_string((i + j) % 7);
  for (int j = 0; j < 26; ++j) s += "\tv" + std::to_string((i * (j + 3)) % 5);
  return s;
}

std::string tsv(int first, int n) {
  std::string s;
  for (int i = first; i < first + n; ++i) s += line(i) + "\n";
  return s;
}

prep_options options(const std::string& out, std::vector<std::string> inputs) {
  prep_options o;
  o.inputs = std::move(inputs);
  o.output_dir = out;
  o.rows_per_shard = 4;
  return o;
}

// Every shard and keyset of the dataset in `dir` reads back; returns its row count.
std::uint64_t load_all(const std::string& dir) {
  auto m = read_dataset_manifest(dir);
  EMBCACHE_EXPECT_OK(m);
  if (!m.ok()) return 0;
  std::uint64_t rows = 0;
  for (const auto& f : m.value().shards) {
    auto d = read_shard(f.shard);
    EMBCACHE_EXPECT_OK(d);
    if (d.ok()) rows += d.value().header.rows;
    EMBCACHE_EXPECT_OK(read_keyset<std::int64_t>(f.keyset)) << f.keyset;
  }
  EXPECT_EQ(rows, m.value().rows);
  return rows;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Holds the flock of a lock file, as a second prep process would.
class held_lock {
 public:
  explicit held_lock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    EXPECT_GE(fd_, 0) << path;
    EXPECT_EQ(::flock(fd_, LOCK_EX | LOCK_NB), 0) << path;
  }
  ~held_lock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_ = -1;
};

TEST(prep_safety, force_with_a_missing_input_leaves_the_old_dataset_loadable) {
  scratch_dir dir;
  write_text(dir / "a.tsv", tsv(0, 10));
  const std::string out = dir / "out";
  EMBCACHE_ASSERT_OK(prepare_criteo(options(out, {dir / "a.tsv"})));
  const auto before = read_bytes(dir / "out/manifest.json");

  auto o = options(out, {dir / "a.tsv", dir / "missing.tsv"});
  o.overwrite = true;
  auto r = prepare_criteo(o);
  ASSERT_EQ(r.get_status().code(), status_code::not_found) << r.get_status().to_string();
  EXPECT_TRUE(contains(r.get_status().message(), dir / "missing.tsv"));
  EXPECT_EQ(load_all(out), 10u);
  EXPECT_EQ(read_bytes(dir / "out/manifest.json"), before);
  // Nothing of the failed run is left: no staging folder beside the dataset.
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{".out.lock", "a.tsv", "out"}));
}

TEST(prep_safety, force_that_fails_midway_leaves_the_old_dataset_loadable) {
  scratch_dir dir;
  write_text(dir / "a.tsv", tsv(0, 10));
  const std::string out = dir / "out";
  EMBCACHE_ASSERT_OK(prepare_criteo(options(out, {dir / "a.tsv"})));
  // The second input breaks the strict run after the first input's shards were written.
  write_text(dir / "b.tsv", tsv(10, 9) + "1\t2\n");
  auto o = options(out, {dir / "b.tsv"});
  o.overwrite = true;
  o.strict = true;
  auto r = prepare_criteo(o);
  ASSERT_EQ(r.get_status().code(), status_code::corruption);
  EXPECT_EQ(load_all(out), 10u);
}

TEST(prep_safety, force_swaps_in_the_new_dataset_and_keeps_other_entries) {
  scratch_dir dir;
  write_text(dir / "a.tsv", tsv(0, 10));
  write_text(dir / "b.tsv", tsv(100, 3));
  const std::string out = dir / "out";
  EMBCACHE_ASSERT_OK(prepare_criteo(options(out, {dir / "a.tsv"})));
  write_text(dir / "out/notes.txt", "mine");
  fs::create_directory(dir / "out/sub");
  write_text(dir / "out/sub/more.txt", "also mine");
  auto o = options(out, {dir / "b.tsv"});
  o.overwrite = true;
  auto r = prepare_criteo(o);
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(r.value().dataset.shards.at(0).shard, (fs::path(out) / "shard-00000.bin").string());
  EXPECT_EQ(load_all(out), 3u);
  EXPECT_EQ(names_in(out),
            (std::vector<std::string>{"manifest.json", "notes.txt", "shard-00000.bin",
                                      "shard-00000.keys", "sub"}));
  EXPECT_EQ(read_bytes(dir / "out/sub/more.txt").size(), 9u);
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{".out.lock", "a.tsv", "b.tsv", "out"}));
}

TEST(prep_safety, output_folder_given_as_a_link_is_written_through_never_replaced) {
  scratch_dir dir;
  write_text(dir / "a.tsv", tsv(0, 10));
  write_text(dir / "b.tsv", tsv(100, 3));
  fs::create_directory(dir / "real");
  fs::create_directory_symlink("real", dir / "out");  // relative to the link's folder
  const std::string out = dir / "out";
  EMBCACHE_ASSERT_OK(prepare_criteo(options(out, {dir / "a.tsv"})));
  EXPECT_TRUE(fs::is_symlink(out));
  EXPECT_EQ(load_all(dir / "real"), 10u);
  auto o = options(out, {dir / "b.tsv"});
  o.overwrite = true;  // the swap happens at the folder the link points to
  EMBCACHE_ASSERT_OK(prepare_criteo(o));
  EXPECT_TRUE(fs::is_symlink(out));
  EXPECT_EQ(load_all(out), 3u);
  EXPECT_EQ(names_in(dir.path()),
            (std::vector<std::string>{".real.lock", "a.tsv", "b.tsv", "out", "real"}));
}

TEST(prep_safety, second_prep_into_a_folder_in_use_fails_at_once) {
  scratch_dir dir;
  write_text(dir / "a.tsv", tsv(0, 10));
  const std::string out = dir / "out";
  ASSERT_EQ(dataset_lock_path(out), dir / ".out.lock");
  {
    held_lock other(dataset_lock_path(out));
    auto r = prepare_criteo(options(out, {dir / "a.tsv"}));
    ASSERT_EQ(r.get_status().code(), status_code::invalid_argument) << r.get_status().to_string();
    EXPECT_TRUE(contains(r.get_status().message(), "output folder '" + out + "'"))
        << r.get_status().message();
    EXPECT_TRUE(contains(r.get_status().message(), "in use by another process"));
    EXPECT_FALSE(fs::exists(out));
  }
  // A writer of this process holds it the same way, from create() to finish().
  dataset_writer_options wo;
  wo.output_dir = out;
  auto w = dataset_writer::create(wo);
  EMBCACHE_ASSERT_OK(w);
  auto o = options(dir / "out/", {dir / "a.tsv"});
  EXPECT_EQ(prepare_criteo(o).get_status().code(), status_code::invalid_argument);
  EMBCACHE_ASSERT_OK(w.value()->append(criteo_sample{}));
  EMBCACHE_ASSERT_OK(w.value()->finish());
  o.overwrite = true;
  auto r = prepare_criteo(o);  // the lock is free again
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(load_all(out), 10u);
}

TEST(prep_safety, stale_temporaries_of_a_crashed_run_are_removed) {
  scratch_dir dir;
  write_text(dir / "a.tsv", tsv(0, 10));
  const std::string out = dir / "out";
  // What a killed run leaves: temporaries in the folder and a staging folder beside it.
  fs::create_directory(out);
  const std::vector<char> big(1 << 20, 'x');
  write_bytes(dir / "out/shard-00003.bin.tmp.4242.0", big);
  write_bytes(dir / "out/shard-00003.cross.keys.tmp.4242.1", big);
  write_bytes(dir / "out/manifest.json.tmp.4242.2", big);
  write_bytes(dir / "out/notes.tmp.1.2", {'k'});  // not ours: stays
  fs::create_directory(dir / ".out.new.4242.0");
  write_bytes(dir / ".out.new.4242.0/shard-00000.bin", big);
  write_bytes(dir / ".out.new.4242.0/shard-00001.keys.tmp.4242.7", big);
  fs::create_directory(dir / ".out.new.4243.0");
  write_bytes(dir / ".out.new.4243.0/shard-00000.bin", big);
  write_bytes(dir / ".out.new.4243.0/keep.txt", {'k'});  // not ours: it and its folder stay
  fs::create_directory(dir / ".other.new.1.0");          // another dataset's: stays
  write_bytes(dir / ".other.new.1.0/shard-00000.bin", big);

  EMBCACHE_ASSERT_OK(prepare_criteo(options(out, {dir / "a.tsv"})));
  EXPECT_EQ(load_all(out), 10u);
  EXPECT_EQ(names_in(out),
            (std::vector<std::string>{"manifest.json", "notes.tmp.1.2", "shard-00000.bin",
                                      "shard-00000.keys", "shard-00001.bin", "shard-00001.keys",
                                      "shard-00002.bin", "shard-00002.keys"}));
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{".other.new.1.0", ".out.lock",
                                                            ".out.new.4243.0", "a.tsv", "out"}));
  EXPECT_EQ(names_in(dir / ".out.new.4243.0"), (std::vector<std::string>{"keep.txt"}));

  // --force into a finished dataset cleans them the same way.
  write_bytes(dir / "out/shard-00000.keys.tmp.4242.9", big);
  auto o = options(out, {dir / "a.tsv"});
  o.overwrite = true;
  EMBCACHE_ASSERT_OK(prepare_criteo(o));
  EXPECT_FALSE(fs::exists(dir / "out/shard-00000.keys.tmp.4242.9"));
  EXPECT_EQ(load_all(out), 10u);
}

TEST(prep_safety, folder_as_input_is_an_error_naming_it) {
  scratch_dir dir;
  fs::create_directory(dir / "in");
  auto r = prepare_criteo(options(dir / "out", {dir / "in"}));
  ASSERT_EQ(r.get_status().code(), status_code::invalid_argument) << r.get_status().to_string();
  EXPECT_TRUE(contains(r.get_status().message(), "input '" + (dir / "in") + "' is a folder"))
      << r.get_status().message();
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(prep_safety, input_with_only_malformed_lines_is_an_error) {
  scratch_dir dir;
  write_text(dir / "bad.tsv", "1\t2\nzz\n\n");
  auto r = prepare_criteo(options(dir / "out", {dir / "bad.tsv"}));
  ASSERT_EQ(r.get_status().code(), status_code::corruption) << r.get_status().to_string();
  EXPECT_EQ(r.get_status().message(),
            "prep: no valid rows: all 3 lines are malformed (the first: " + (dir / "bad.tsv") +
                ":1: has 2 fields, expected 40)");
  EXPECT_FALSE(fs::exists(dir / "out"));

  write_text(dir / "empty.tsv", "");
  auto e = prepare_criteo(options(dir / "out", {dir / "empty.tsv"}));
  ASSERT_EQ(e.get_status().code(), status_code::invalid_argument);
  EXPECT_TRUE(contains(e.get_status().message(), "no valid rows"));

  // One good line among them is enough.
  write_text(dir / "one.tsv", "1\t2\n" + line(3) + "\n");
  auto ok = prepare_criteo(options(dir / "out", {dir / "one.tsv"}));
  EMBCACHE_ASSERT_OK(ok);
  EXPECT_EQ(ok.value().dataset.rows, 1u);
  EXPECT_EQ(ok.value().malformed, 1u);
}

}  // namespace
}  // namespace embcache
