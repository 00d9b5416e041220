// What the trainer reports: metrics files, progress lines, plots, and the command line's exit
// status and log lines.
#include <sys/wait.h>

#include <cstdio>
#include <regex>

#include "trainer_test_support.hpp"

namespace embcache::test {
namespace {

bool gnuplot_on_path() {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string d;
  while (std::getline(ss, d, ':'))
    if (!d.empty() && ::access((d + "/gnuplot").c_str(), X_OK) == 0) return true;
  return false;
}

std::vector<pass_metrics> two_passes(bool with_eval) {
  std::vector<pass_metrics> h(2);
  for (std::size_t i = 0; i < 2; ++i) {
    h[i].pass = i + 1;
    h[i].train_loss = 0.6 - 0.1 * double(i);
    h[i].eval_auc = with_eval ? 0.7 + 0.05 * double(i) : std::nan("");
    h[i].eval_logloss = with_eval ? 0.55 - 0.1 * double(i) : std::nan("");
    h[i].samples_per_s = 1000;
  }
  return h;
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::uintmax_t file_size_or_zero(const std::string& p) {
  std::error_code ec;
  const auto n = fs::file_size(p, ec);
  return ec ? 0 : n;
}

TEST(trainer_plot, an_output_dir_with_shell_characters_plots_without_a_shell) {
  if (!gnuplot_on_path()) GTEST_SKIP() << "gnuplot is not on the PATH";
  const std::string root = temp_dir("plot_quote");
  // Pasted into `cd '<dir>' && gnuplot ...` this name would run `touch <root>/pwned`.
  const std::string dir = root + "/x'; touch " + root + "/pwned; '$(touch " + root +
                          "/pwned2);`touch " + root + "/pwned3`";
  std::string note;
  const status s = plot_metrics(dir, two_passes(true), &note);
  EMBCACHE_ASSERT_OK(s);
  EXPECT_FALSE(fs::exists(root + "/pwned"));
  EXPECT_FALSE(fs::exists(root + "/pwned2"));
  EXPECT_FALSE(fs::exists(root + "/pwned3"));
  EXPECT_FALSE(fs::exists("pwned"));
  EXPECT_GT(file_size_or_zero(dir + "/loss.png"), 0u);
  EXPECT_GT(file_size_or_zero(dir + "/auc.png"), 0u);
  EXPECT_EQ(note, "drew " + dir + "/loss.png and " + dir + "/auc.png");
  // A folder that gnuplot would read as a command ("<cmd") is made absolute first.
  const std::string cwd = fs::current_path().string();
  fs::current_path(root);
  const status rel = plot_metrics("<touch pwned4", two_passes(true), &note);
  fs::current_path(cwd);
  EMBCACHE_EXPECT_OK(rel);
  EXPECT_FALSE(fs::exists(root + "/pwned4"));
  EXPECT_GT(file_size_or_zero(root + "/<touch pwned4/loss.png"), 0u);
}

TEST(trainer_plot, no_eval_shard_means_no_auc_plot) {
  const std::string dir = temp_dir("plot_no_eval");
  std::ofstream(dir + "/auc.png") << "an image of an earlier run";
  std::string note;
  const status s = plot_metrics(dir, two_passes(false), &note);
  EMBCACHE_ASSERT_OK(s);
  EXPECT_FALSE(fs::exists(dir + "/auc.png"));
  const std::string gp = read_bytes(dir + "/plot.gp");
  EXPECT_EQ(gp.find("auc.png"), std::string::npos) << gp;
  const std::string skipped = ", no auc.png (no eval AUC: no eval_shard, or a single class)";
  if (gnuplot_on_path()) {
    EXPECT_GT(file_size_or_zero(dir + "/loss.png"), 0u);
    EXPECT_EQ(note, "drew " + dir + "/loss.png" + skipped);
  }
  // No metric at all: no image, and no gnuplot run that would leave an empty one.
  std::vector<pass_metrics> none(1);
  none[0].pass = 1;
  none[0].train_loss = none[0].eval_auc = none[0].eval_logloss = std::nan("");
  EMBCACHE_ASSERT_OK(plot_metrics(dir, none, &note));
  EXPECT_FALSE(fs::exists(dir + "/loss.png"));
  EXPECT_FALSE(fs::exists(dir + "/auc.png"));
  EXPECT_EQ(note,
            "wrote " + dir + "/plot.gp and metrics.tsv, no loss.png (no finite loss)" + skipped);
}

TEST(trainer_plot, write_errors_name_the_file) {
  // Both files replace the previous ones atomically: a folder in the way fails the rename.
  for (const char* file : {"metrics.tsv", "plot.gp"}) {
    const std::string dir = temp_dir(std::string("plot_blocked_") + file);
    fs::create_directories(dir + "/" + file + "/inside");
    std::string note;
    const status s = plot_metrics(dir, two_passes(true), &note);
    EXPECT_EQ(s.code(), status_code::io_error) << s.to_string();
    EXPECT_EQ(s.message(), "cannot rename to '" + dir + "/" + file + "': Is a directory");
  }
  // An output folder that cannot be created.
  const std::string dir = temp_dir("plot_not_a_dir");
  std::ofstream(dir + "/file") << "x";
  std::string note;
  const status s = plot_metrics(dir + "/file/out", two_passes(true), &note);
  EXPECT_EQ(s.code(), status_code::io_error);
  EXPECT_EQ(s.message().rfind("output_dir: " + dir + "/file/out: cannot create (", 0), 0u)
      << s.message();
}

// Puts a stand-in gnuplot first on the PATH for the scope: a shell script with `body`, given the
// arguments plot_metrics passes (-c SCRIPT FOLDER SUFFIX).
class fake_gnuplot {
 public:
  fake_gnuplot(const std::string& name, const std::string& body) {
    const std::string bin = temp_dir(name + "_bin");
    std::ofstream(bin + "/gnuplot") << "#!/bin/sh\n" << body;
    fs::permissions(bin + "/gnuplot", fs::perms::owner_all);
    const char* path = std::getenv("PATH");
    old_ = path ? path : "";
    ::setenv("PATH", (bin + ":" + old_).c_str(), 1);
  }
  ~fake_gnuplot() { ::setenv("PATH", old_.c_str(), 1); }

 private:
  std::string old_;
};

// printf arguments of a PNG's first and last bytes.
const std::string png_start = "'\\211PNG\\r\\n\\032\\n'";
const std::string png_end = "'\\000\\000\\000\\000IEND\\256B`\\202'";

TEST(trainer_plot, an_incomplete_image_is_an_error_and_no_partial_png_remains) {
  // gnuplot exits 0 after its write failed on a full disk: 4096 bytes, no end.
  {
    const std::string dir = temp_dir("plot_truncated");
    fake_gnuplot fake("plot_truncated", "printf " + png_start +
                                            " > \"$3/loss.png$4\"\n"
                                            "head -c 4088 /dev/zero >> \"$3/loss.png$4\"\n"
                                            "printf " +
                                            png_start +
                                            " > \"$3/auc.png$4\"\n"
                                            "printf " +
                                            png_end + " >> \"$3/auc.png$4\"\n");
    // A temporary of a plot whose process is gone is removed; nothing else is touched.
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    ::waitpid(child, nullptr, 0);
    const std::string stale = dir + "/loss.png.tmp." + std::to_string(child);
    std::ofstream(stale) << "stale";
    std::ofstream(dir + "/loss.png.tmp.x") << "not ours";
    std::string note;
    const status s = plot_metrics(dir, two_passes(true), &note);
    EXPECT_EQ(s.code(), status_code::io_error) << s.to_string();
    EXPECT_EQ(s.message(), dir +
                               "/loss.png: gnuplot wrote an incomplete image (4096 bytes, no "
                               "PNG end; disk full?); no image kept");
    EXPECT_EQ(names_in(dir),
              (std::vector<std::string>{"loss.png.tmp.x", "metrics.tsv", "plot.gp"}));
  }
  // An empty auc.png beside a complete loss.png: neither is kept.
  {
    const std::string dir = temp_dir("plot_empty");
    fake_gnuplot fake("plot_empty", "printf " + png_start +
                                        " > \"$3/loss.png$4\"\n"
                                        "printf " +
                                        png_end +
                                        " >> \"$3/loss.png$4\"\n"
                                        ": > \"$3/auc.png$4\"\n");
    std::string note;
    const status s = plot_metrics(dir, two_passes(true), &note);
    EXPECT_EQ(s.message(), dir +
                               "/auc.png: gnuplot wrote an incomplete image (0 bytes, no PNG "
                               "end; disk full?); no image kept");
    EXPECT_EQ(names_in(dir), (std::vector<std::string>{"metrics.tsv", "plot.gp"}));
  }
  // gnuplot failing: its status and output, and no image.
  {
    const std::string dir = temp_dir("plot_failing");
    fake_gnuplot fake("plot_failing", "printf 'half' > \"$3/loss.png$4\"\necho cannot; exit 3\n");
    std::string note;
    const status s = plot_metrics(dir, two_passes(true), &note);
    EXPECT_EQ(s.message(),
              dir + "/plot.gp: gnuplot failed (exit status 3): cannot\n; no image was kept");
    EXPECT_EQ(names_in(dir), (std::vector<std::string>{"metrics.tsv", "plot.gp"}));
  }
  // Complete images are renamed into place.
  const std::string dir = temp_dir("plot_complete");
  fake_gnuplot fake("plot_complete", "for f in loss auc; do printf " + png_start +
                                         " > \"$3/$f.png$4\"; printf " + png_end +
                                         " >> \"$3/$f.png$4\"; done\n");
  std::string note;
  EMBCACHE_ASSERT_OK(plot_metrics(dir, two_passes(true), &note));
  EXPECT_EQ(note, "drew " + dir + "/loss.png and " + dir + "/auc.png");
  EXPECT_EQ(names_in(dir),
            (std::vector<std::string>{"auc.png", "loss.png", "metrics.tsv", "plot.gp"}));
}

TEST(trainer_metrics, a_full_disk_fails_the_run_naming_metrics_jsonl) {
  trainer_config c = small_config("metrics_full");
  c.passes = {{{shard(0)}}};
  c.save_dir.clear();
  c.output_dir = temp_dir("metrics_full_out");
  if (!make_full_device(c.output_dir + "/metrics.jsonl")) GTEST_SKIP() << "cannot mknod (not root)";
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  const status s = t.value()->run();
  EXPECT_EQ(s.code(), status_code::out_of_space) << s.to_string();
  EXPECT_EQ(s.message(),
            "cannot write '" + c.output_dir + "/metrics.jsonl': No space left on device");
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> lines;
  std::stringstream ss(read_bytes(path));
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  return lines;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Two passes of one 1,500-row shard, batches of 128: 12 steps a pass (the last of 92 samples), a
// progress line every 5 steps.
trainer_config step_config(const std::string& name) {
  trainer_config c = small_config(name);
  c.passes = {{{shard(0)}}, {{shard(1)}}};
  c.log_interval = 5;
  c.output_dir = temp_dir(name + "_out");
  return c;
}

TEST(trainer_metrics, step_metrics_hold_a_line_per_log_interval_and_the_callback_gets_every_line) {
  const trainer_config c = step_config("steps");
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  std::vector<std::string> log;  // as an embedder sees it: no timestamp, no level
  t.value()->set_log([&](const std::string& l) { log.push_back(l); });
  EMBCACHE_ASSERT_OK(t.value()->run());

  // metrics_steps.jsonl: steps 5 and 10 of pass 1, 17 and 22 (5 and 10 of pass 2).
  const std::vector<std::string> jsonl = lines_of(c.output_dir + "/metrics_steps.jsonl");
  ASSERT_EQ(jsonl.size(), 4u);
  const std::uint64_t steps[] = {5, 10, 17, 22}, passes[] = {1, 1, 2, 2};
  const std::uint64_t samples[] = {640, 1280, 1500 + 640, 1500 + 1280};
  for (std::size_t i = 0; i < 4; ++i) {
    const json j = json::parse(jsonl[i]);
    EXPECT_EQ(j.at("step").get<std::uint64_t>(), steps[i]) << jsonl[i];
    EXPECT_EQ(j.at("pass").get<std::uint64_t>(), passes[i]) << jsonl[i];
    EXPECT_EQ(j.at("samples").get<std::uint64_t>(), samples[i]) << jsonl[i];
    EXPECT_DOUBLE_EQ(j.at("pass_position").get<double>(),
                     double(passes[i] - 1) + double(i % 2 == 0 ? 640 : 1280) / 1500.0);
    EXPECT_TRUE(std::isfinite(j.at("train_loss").get<double>())) << jsonl[i];
    EXPECT_GT(j.at("samples_per_s").get<double>(), 0) << jsonl[i];
  }
  // Its TSV twin, gnuplot's input: a header, then the same steps.
  const std::vector<std::string> tsv = lines_of(c.output_dir + "/metrics_steps.tsv");
  ASSERT_EQ(tsv.size(), 5u);
  EXPECT_EQ(tsv[0], "# step\tpass\tpass_position\tsamples\ttrain_loss\tsamples_per_s\thit_rate");
  EXPECT_TRUE(starts_with(tsv[3], "17\t2\t1.42667\t2140\t")) << tsv[3];

  // The callback got the dense and the embedding notes, a progress line per interval with the
  // pass's and the run's percentage and ETA, a summary per pass and the save's line.
  ASSERT_EQ(log.size(), 2u + 4 + 2 + 1) << ::testing::PrintToString(log);
  EXPECT_EQ(log[0], "dense network on host (auto: this program has no cuda space)");
  EXPECT_EQ(log[1], "embeddings on host");
  const std::regex progress(
      "pass ([12])/2 step ([0-9]+) \\| ([0-9.]+)% of 1500 samples, [0-9]+ samples/s, ETA "
      "[0-9?]+:?[0-9]*:?[0-9]* \\| run ([0-9.]+)%, ETA [0-9?:]+ \\| loss [0-9.]+ \\| hit rate "
      "[0-9.]+");
  const char* const expected[][4] = {{"1", "5", "42.6", "21.3"},
                                     {"1", "10", "85.3", "42.6"},
                                     {"2", "17", "42.6", "71.3"},
                                     {"2", "22", "85.3", "92.6"}};
  const std::size_t at[] = {2, 3, 5, 6};
  for (std::size_t i = 0; i < 4; ++i) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(log[at[i]], m, progress)) << log[at[i]];
    for (std::size_t k = 0; k < 4; ++k) EXPECT_EQ(m[k + 1].str(), expected[i][k]) << log[at[i]];
  }
  EXPECT_TRUE(starts_with(log[4], "pass 1 done: 1500 samples in ")) << log[4];
  EXPECT_TRUE(starts_with(log[7], "pass 2 done: 1500 samples in ")) << log[7];
  EXPECT_TRUE(std::regex_match(
      log[8], std::regex("saved to " + c.save_dir + ": [0-9.]+ [kMG]?B in [0-9.]+ s \\(.*/s\\)")))
      << log[8];
}

TEST(trainer_plot, the_script_has_integer_pass_ticks_a_legend_off_the_curves_and_the_step_curve) {
  trainer_config c = step_config("plot_steps");
  c.passes.resize(1);
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  t.value()->set_log([](const std::string&) {});
  EMBCACHE_ASSERT_OK(t.value()->run());
  std::string note;
  const status s = plot_metrics(c.output_dir, t.value()->history(), &note);
  EMBCACHE_ASSERT_OK(s);
  const std::string gp = read_bytes(c.output_dir + "/plot.gp");
  for (const char* want :
       {"\nset xrange [-0.03:1.03]\nset xtics 0, 1\nset format x '%.0f'\n",
        "\nset key outside center bottom horizontal\n", "set title 'loss: '.d\n",
        "set title 'eval AUC: '.d\n", "plot d.'/metrics_steps.tsv' using 3:5 with lines",
        "d.'/metrics.tsv' using ($1-0.5):2:($1-1):1 with xerrorbars",
        "d.'/metrics.tsv' using 1:4 with linespoints", "set output d.'/auc.png'"})
    EXPECT_NE(gp.find(want), std::string::npos) << want << " is not in\n" << gp;
  if (gnuplot_on_path()) {
    EXPECT_GT(file_size_or_zero(c.output_dir + "/loss.png"), 0u);
    EXPECT_GT(file_size_or_zero(c.output_dir + "/auc.png"), 0u);
  }
  // Twelve passes: a tick every second pass, still integers; without a step file no step curve.
  std::vector<pass_metrics> many(12);
  for (std::size_t i = 0; i < many.size(); ++i) {
    many[i].pass = i + 1;
    many[i].train_loss = 0.6;
    many[i].eval_auc = many[i].eval_logloss = std::nan("");
  }
  const std::string dir = temp_dir("plot_many");
  EMBCACHE_ASSERT_OK(plot_metrics(dir, many, &note));
  const std::string gp12 = read_bytes(dir + "/plot.gp");
  EXPECT_NE(gp12.find("\nset xrange [-0.36:12.36]\nset xtics 0, 2\nset format x '%.0f'\n"),
            std::string::npos)
      << gp12;
  // A resumed run whose history starts at pass 4: the axis starts at that pass's start.
  std::vector<pass_metrics> later(many.begin() + 3, many.end());
  EMBCACHE_ASSERT_OK(plot_metrics(dir, later, &note));
  EXPECT_NE(read_bytes(dir + "/plot.gp").find("\nset xrange [2.73:12.27]\nset xtics 3, 1\n"),
            std::string::npos)
      << read_bytes(dir + "/plot.gp");
  EXPECT_EQ(gp12.find("metrics_steps.tsv' using"), std::string::npos) << gp12;
  EXPECT_EQ(gp12.find("eval log loss"), std::string::npos) << gp12;  // no eval: no such curve
}

// --- the command line ------------------------------------------------------------------------

#ifdef EMBCACHE_TRAIN_EXE
struct cli_result {
  int exit_code = -1;
  std::string output;
};

// Runs embcache-train on `config` (written to <dir>/run.json); stdout and stderr together.
cli_result train_cli(const std::string& dir, const json& config, const std::string& extra = "") {
  {
    std::ofstream f(dir + "/run.json");
    f << config.dump(2);
  }
  const std::string log = dir + "/cli.log";
  const std::string cmd = std::string("'") + EMBCACHE_TRAIN_EXE + "' --config '" + dir +
                          "/run.json' " + extra + " > '" + log + "' 2>&1";
  const int w = std::system(cmd.c_str());
  cli_result r;
  r.exit_code = WIFEXITED(w) ? WEXITSTATUS(w) : -1;
  r.output = read_bytes(log);
  return r;
}

json cli_config(const std::string& root) {
  return {{"data_dir", dataset()},       {"passes", {{shard(0)}}},    {"model", {{"hidden", {16}}}},
          {"batch_size", 128},           {"crossed", true},           {"log_interval", 0},
          {"output_dir", root + "/out"}, {"save_dir", root + "/save"}};
}

TEST(trainer_cli, failures_exit_non_zero_and_say_why) {
  // A full disk under metrics.jsonl.
  std::string root = temp_dir("cli_full");
  json c = cli_config(root);
  fs::create_directories(root + "/out");
  cli_result r;
  if (make_full_device(root + "/out/metrics.jsonl")) {
    r = train_cli(root, c);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("embcache-train: out_of_space: cannot write '" + root +
                            "/out/metrics.jsonl': No space left on device"),
              std::string::npos)
        << r.output;
    EXPECT_FALSE(fs::exists(root + "/save"));
  }

  // A diverged run.
  root = temp_dir("cli_diverged");
  c = cli_config(root);
  c["model"]["learning_rate"] = 1e30;
  c["tables"] = {{{"name", "wide"}}, {{"name", "deep"}, {"optimizer", {{"learning_rate", 1e30}}}}};
  r = train_cli(root, c);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("embcache-train: invalid_argument: pass 1 step "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("training diverged"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(root + "/save"));

  // A number out of range.
  root = temp_dir("cli_range");
  c = cli_config(root);
  c["batch_size"] = -1;
  r = train_cli(root, c);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("config.batch_size: expected an integer in [1, 1048576], got -1"),
            std::string::npos)
      << r.output;
}

TEST(trainer_cli, a_config_that_is_not_a_small_regular_file_is_a_usage_error_at_once) {
  const std::string root = temp_dir("cli_dev_zero");
  const std::string log = root + "/cli.log";
  const std::string cmd =
      std::string("'") + EMBCACHE_TRAIN_EXE + "' --config /dev/zero > '" + log + "' 2>&1";
  const int w = std::system(cmd.c_str());
  EXPECT_EQ(WIFEXITED(w) ? WEXITSTATUS(w) : -1, 2);
  EXPECT_NE(read_bytes(log).find("embcache-train: invalid_argument: the configuration file: "
                                 "'/dev/zero' is not a regular file"),
            std::string::npos)
      << read_bytes(log);
}

TEST(trainer_cli, lines_carry_a_timestamp_and_a_level) {
  const std::string root = temp_dir("cli_log");
  json c = cli_config(root);
  c["log_interval"] = 5;
  const cli_result r = train_cli(root, c, "--no-plot");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string stamp =
      "\\[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}\\] ";
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex("(^|\n)" + stamp + "\\[info\\] pass 1/1 step 5 \\| 42\\.6% of 1500 samples")))
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex("(^|\n)" + stamp + "\\[info\\] pass 1 done: 1500 samples")))
      << r.output;
  EXPECT_EQ(lines_of(root + "/out/metrics_steps.jsonl").size(), 2u);
  // A failure is an error line.
  c["data_dir"] = root + "/nowhere";
  const cli_result bad = train_cli(root, c, "--no-plot");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_TRUE(std::regex_search(
      bad.output, std::regex("(^|\n)" + stamp + "\\[error\\] embcache-train: not_found: ")))
      << bad.output;
}

TEST(trainer_cli, no_eval_shard_plots_the_loss_only) {
  const std::string root = temp_dir("cli_plot");
  const cli_result r = train_cli(root, cli_config(root));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(root + "/out/auc.png"));
  const std::string skipped = ", no auc.png (no eval AUC: no eval_shard, or a single class)";
  if (gnuplot_on_path()) {
    EXPECT_GT(file_size_or_zero(root + "/out/loss.png"), 0u);
    EXPECT_NE(r.output.find("plots: drew " + root + "/out/loss.png" + skipped), std::string::npos)
        << r.output;
  } else {
    EXPECT_NE(r.output.find("plots: gnuplot not found"), std::string::npos) << r.output;
  }
}
#endif

}  // namespace
}  // namespace embcache::test
