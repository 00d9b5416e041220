// embcache-prep and embcache-synth as a user runs them: exit codes and the messages of refused
// options and inputs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>

#include "common/status_assertions.hpp"
#include "embcache/shard.hpp"
#include "embcache/version.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;
using test::contains;
using test::scratch_dir;
using test::write_text;

#if defined(EMBCACHE_PREP_EXE) && defined(EMBCACHE_SYNTH_EXE)
#define EMBCACHE_NEED_TOOLS() (void)0
const std::string prep_exe = EMBCACHE_PREP_EXE;
const std::string synth_exe = EMBCACHE_SYNTH_EXE;
#else
#define EMBCACHE_NEED_TOOLS() GTEST_SKIP() << "the command-line tools are not built"
const std::string prep_exe;
const std::string synth_exe;
#endif

struct run_result {
  int rc = -1;
  std::string output;  // stdout and stderr
};

// Runs `exe args` through the shell (arguments are quoted by the caller).
run_result run(const std::string& exe, const std::string& args) {
  run_result r;
  const std::string cmd = "'" + exe + "' " + args + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int st = ::pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string q(const std::string& s) { return "'" + s + "'"; }

// A small valid TSV from the generator.
std::string make_input(const scratch_dir& dir) {
  const std::string path = dir / "in.tsv";
  const run_result r = run(synth_exe, "-f tsv -r 50 -o " + q(path));
  EXPECT_EQ(r.rc, 0) << r.output;
  return path;
}

TEST(tools, prep_force_with_a_missing_input_keeps_the_old_dataset) {
  EMBCACHE_NEED_TOOLS();
  scratch_dir dir;
  const std::string in = make_input(dir);
  const std::string out = dir / "out";
  ASSERT_EQ(run(prep_exe, q(in) + " -o " + q(out) + " -n 20").rc, 0);
  const run_result r =
      run(prep_exe, q(in) + " " + q(dir / "missing.tsv") + " -o " + q(out) + " -n 10 --force");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "not_found")) << r.output;
  EXPECT_TRUE(contains(r.output, dir / "missing.tsv")) << r.output;
  auto m = read_dataset_manifest(out);
  EMBCACHE_ASSERT_OK(m);
  EXPECT_EQ(m.value().rows, 50u);
  ASSERT_EQ(m.value().shards.size(), 3u);
  for (const auto& f : m.value().shards) EMBCACHE_EXPECT_OK(read_shard(f.shard)) << f.shard;
}

TEST(tools, error_lines_carry_a_timestamp_and_a_level) {
  EMBCACHE_NEED_TOOLS();
  scratch_dir dir;
  const run_result r = run(prep_exe, q(dir / "missing.tsv") + " -o " + q(dir / "out"));
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex("^\\[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}"
                           "\\.[0-9]{3}\\] \\[error\\] embcache-prep: not_found: ")))
      << r.output;
}

TEST(tools, prep_into_a_folder_in_use_fails_at_once_naming_it) {
  EMBCACHE_NEED_TOOLS();
  scratch_dir dir;
  const std::string in = make_input(dir);
  const std::string out = dir / "out";
  const int fd = ::open(dataset_lock_path(out).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const run_result r = run(prep_exe, q(in) + " -o " + q(out));
  ::close(fd);
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "output folder '" + out + "' is in use by another process"))
      << r.output;
  EXPECT_FALSE(fs::exists(out));
}

TEST(tools, prep_folder_input_is_an_error) {
  EMBCACHE_NEED_TOOLS();
  scratch_dir dir;
  fs::create_directory(dir / "in");
  const run_result r = run(prep_exe, q(dir / "in") + " -o " + q(dir / "out"));
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "input '" + (dir / "in") + "' is a folder")) << r.output;
}

TEST(tools, prep_input_with_only_malformed_lines_is_an_error) {
  EMBCACHE_NEED_TOOLS();
  scratch_dir dir;
  write_text(dir / "bad.tsv", "x\ny\n");
  const run_result r = run(prep_exe, q(dir / "bad.tsv") + " -o " + q(dir / "out"));
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "no valid rows: all 2 lines are malformed (the first: " +
                                     (dir / "bad.tsv") + ":1: has 1 fields, expected 40)"))
      << r.output;
}

TEST(tools, prep_rows_per_shard_out_of_range_names_the_option) {
  EMBCACHE_NEED_TOOLS();
  scratch_dir dir;
  const std::string in = make_input(dir);
  for (const char* bad : {"0", "-3", "1.5", "x"}) {
    const run_result r = run(prep_exe, q(in) + " -o " + q(dir / "out") + " -n " + bad);
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "--rows-per-shard")) << bad << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "an integer from 1 to 18446744073709551615"))
        << bad << ": " << r.output;
    EXPECT_FALSE(contains(r.output, "not in range")) << bad << ": " << r.output;
  }
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(tools, synth_rejects_non_finite_and_out_of_range_values_naming_the_option) {
  EMBCACHE_NEED_TOOLS();
  scratch_dir dir;
  const std::string out = q(dir / "s.tsv");
  struct bad_case {
    const char* args;
    const char* says;
  };
  for (const bad_case& c : {
           bad_case{"--signal nan", "--signal: 'nan' is not a finite number"},
           bad_case{"--signal inf", "--signal: 'inf' is not a finite number"},
           bad_case{"--signal -inf", "--signal: '-inf' is not a finite number"},
           bad_case{"--zipf nan", "--zipf: 'nan' is not a finite number"},
           bad_case{"--zipf 0", "--zipf: '0' is out of range, expected a number above 0"},
           bad_case{"--cardinality-scale inf", "--cardinality-scale: 'inf' is not a finite"},
           bad_case{"--cardinality-scale 0",
                    "--cardinality-scale: '0' is out of range, expected "
                    "a number above 0 and at most 1000000"},
           bad_case{"-n 0", "--rows-per-shard: '0' is out of range, expected an integer from 1"},
           bad_case{"--day -1",
                    "--day: '-1' is out of range, expected an integer from 0 to "
                    "4294967295"},
           bad_case{"--day 4294967296", "--day: '4294967296' is out of range"},
           bad_case{"--day 2.5", "--day: '2.5' is out of range"},
           bad_case{"--drift 1.01", "--drift: '1.01' is out of range, expected a number in [0, 1]"},
           bad_case{"--drift -0.5", "--drift: '-0.5' is out of range, expected a number in [0, 1]"},
           bad_case{"--drift nan", "--drift: 'nan' is not a finite number"},
           bad_case{"--drift x", "--drift: 'x' is not a number"},
       }) {
    const run_result r = run(synth_exe, std::string("-f tsv -r 5 -o ") + out + " " + c.args);
    EXPECT_EQ(r.rc, 2) << c.args << ": " << r.output;
    EXPECT_TRUE(contains(r.output, c.says)) << c.args << ": " << r.output;
  }
  EXPECT_FALSE(fs::exists(dir / "s.tsv"));
  const run_result ok = run(synth_exe, "-f tsv -r 5 -o " + out + " --signal -0.5");
  EXPECT_EQ(ok.rc, 0) << ok.output;
  const run_result day = run(synth_exe, "-f tsv -r 5 -o " + out + " --day 4294967295 --drift 1");
  EXPECT_EQ(day.rc, 0) << day.output;
}

TEST(tools, version_prints_name_version_and_spaces) {
  EMBCACHE_NEED_TOOLS();
  const std::string spaces = std::string(" ") + version_string + " (" + build_spaces + ")\n";
  // --version wins over the required options.
  const run_result p = run(prep_exe, "--version");
  EXPECT_EQ(p.rc, 0) << p.output;
  EXPECT_EQ(p.output, "embcache-prep" + spaces);
  const run_result s = run(synth_exe, "--version");
  EXPECT_EQ(s.rc, 0) << s.output;
  EXPECT_EQ(s.output, "embcache-synth" + spaces);
  EXPECT_NE(std::string(build_spaces).find("rocksdb "), std::string::npos);
}

TEST(tools, usage_errors_exit_two_and_run_time_failures_one) {
  EMBCACHE_NEED_TOOLS();
  scratch_dir dir;
  const std::string in = make_input(dir);
  const std::string out = " -o " + q(dir / "out");
  struct usage {
    const std::string* exe;
    std::string args;
  };
  for (const usage& u : {
           usage{&prep_exe, q(in) + out + " --bogus"},            // unknown option
           usage{&prep_exe, q(in)},                               // missing -o
           usage{&prep_exe, out},                                 // missing input
           usage{&prep_exe, q(in) + out + " -n"},                 // option without its value
           usage{&prep_exe, q(in) + out + " --keyset-format x"},  // bad value
           usage{&synth_exe, "-f tsv -r 5 -o " + q(dir / "s.tsv") + " --bogus"},
           usage{&synth_exe, "-f tsv -r 5"},                    // missing -o
           usage{&synth_exe, "-f csv -o " + q(dir / "s.tsv")},  // bad value
           usage{&synth_exe, "-r x -o " + q(dir / "s.tsv")},    // not a number
       }) {
    const run_result r = run(*u.exe, u.args);
    EXPECT_EQ(r.rc, 2) << *u.exe << " " << u.args << ": " << r.output;
  }
  EXPECT_FALSE(fs::exists(dir / "out"));
  EXPECT_FALSE(fs::exists(dir / "s.tsv"));
  // Run-time failures: a missing input, an output that cannot be written.
  EXPECT_EQ(run(prep_exe, q(dir / "missing.tsv") + out).rc, 1);
  EXPECT_EQ(run(synth_exe, "-f tsv -r 5 -o " + q(dir / "no/such/folder/s.tsv")).rc, 1);
}

// The bytes of a dataset's shards and keysets, in manifest order.
std::string dataset_bytes(const std::string& folder) {
  auto m = read_dataset_manifest(folder);
  EMBCACHE_EXPECT_OK(m);
  std::string all;
  if (!m.ok()) return all;
  for (const auto& f : m.value().shards)
    for (const std::string& file : {f.shard, f.keyset}) {
      const std::vector<char> b = test::read_bytes(file);
      all.append(b.begin(), b.end());
    }
  return all;
}

TEST(tools, prep_reads_standard_input_plain_or_gzip) {
  EMBCACHE_NEED_TOOLS();
  scratch_dir dir;
  const std::string in = make_input(dir);
  ASSERT_EQ(run(prep_exe, q(in) + " -o " + q(dir / "from_file") + " -n 20").rc, 0);
  // run() gives "'cat' ARGS 2>&1": the pipe feeds prep's standard input.
  const run_result plain =
      run("cat", q(in) + " | " + q(prep_exe) + " - -o " + q(dir / "plain") + " -n 20");
  ASSERT_EQ(plain.rc, 0) << plain.output;
  EXPECT_NE(plain.output.find("rows          50\n"), std::string::npos) << plain.output;
  const run_result gz =
      run("gzip", "-c " + q(in) + " | " + q(prep_exe) + " - -o " + q(dir / "gz") + " -n 20");
  ASSERT_EQ(gz.rc, 0) << gz.output;
  const std::string expected = dataset_bytes(dir / "from_file");
  EXPECT_GT(expected.size(), 1000u);
  EXPECT_TRUE(dataset_bytes(dir / "plain") == expected);
  EXPECT_TRUE(dataset_bytes(dir / "gz") == expected);
  // Standard input can be read once: not twice, not with the two passes of --rare-threshold.
  const run_result twice = run("cat", q(in) + " | " + q(prep_exe) + " - - -o " + q(dir / "t"));
  EXPECT_EQ(twice.rc, 1) << twice.output;
  EXPECT_NE(twice.output.find("input '-' (standard input) is named 2 times"), std::string::npos)
      << twice.output;
  const run_result rare =
      run("cat", q(in) + " | " + q(prep_exe) + " - -o " + q(dir / "r") + " --rare-threshold 3");
  EXPECT_EQ(rare.rc, 1) << rare.output;
  EXPECT_NE(rare.output.find("can be read only once, but rare_threshold 3 reads the inputs twice"),
            std::string::npos)
      << rare.output;
  EXPECT_FALSE(fs::exists(dir / "t"));
  EXPECT_FALSE(fs::exists(dir / "r"));
}

}  // namespace
}  // namespace embcache
