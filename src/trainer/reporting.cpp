// What the trainer reports (reporting.hpp) and plot_metrics: gnuplot draws the curves of
// metrics.tsv and metrics_steps.tsv, run without a shell.
#include "reporting.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/durable_file.hpp"
#include "embcache/detail/progress.hpp"

extern char** environ;  // handed to gnuplot

namespace embcache {
namespace detail {

namespace fs = std::filesystem;

namespace {

// A metric for metrics.tsv: "nan" (gnuplot's missing value) when not finite, whatever its sign.
std::string tsv_number(double v) {
  if (!std::isfinite(v)) return "nan";
  std::ostringstream ss;
  ss << v;
  return ss.str();
}

const char* const step_tsv_header =
    "# step\tpass\tpass_position\tsamples\ttrain_loss\tsamples_per_s\thit_rate\n";

}  // namespace

status create_folder(const std::string& dir, const std::string& field) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return status::io_error(field + ": " + dir + ": cannot create (" + ec.message() + ")");
  return {};
}

status start_metrics_files(const std::string& output_dir) {
  for (const char* log : {"/metrics.jsonl", "/metrics_steps.jsonl"})
    EMBCACHE_RETURN_IF_ERROR(append_to_file(output_dir + log, "", /*truncate=*/true));
  return append_to_file(output_dir + "/metrics_steps.tsv", step_tsv_header, /*truncate=*/true);
}

status append_step_metrics(const std::string& output_dir, const step_metrics& m) {
  // nlohmann::json writes NaN as null.
  const nlohmann::json j = {{"step", m.step},
                            {"pass", m.pass},
                            {"pass_position", m.pass_position},
                            {"samples", m.samples},
                            {"train_loss", m.train_loss},
                            {"samples_per_s", m.samples_per_s},
                            {"hit_rate", m.hit_rate}};
  EMBCACHE_RETURN_IF_ERROR(append_to_file(output_dir + "/metrics_steps.jsonl", j.dump() + "\n"));
  const std::string line = std::to_string(m.step) + '\t' + std::to_string(m.pass) + '\t' +
                           tsv_number(m.pass_position) + '\t' + std::to_string(m.samples) + '\t' +
                           tsv_number(m.train_loss) + '\t' + tsv_number(m.samples_per_s) + '\t' +
                           tsv_number(m.hit_rate) + '\n';
  return append_to_file(output_dir + "/metrics_steps.tsv", line);
}

status append_pass_metrics(const std::string& output_dir, const pass_metrics& m) {
  return append_to_file(output_dir + "/metrics.jsonl", nlohmann::json(m).dump() + "\n");
}

pass_metrics pass_metrics_from_json(const nlohmann::json& j) {
  const auto num = [&](const char* k) {
    return j.at(k).is_null() ? std::nan("") : j.at(k).get<double>();
  };
  pass_metrics m;
  m.pass = j.at("pass").get<std::uint64_t>();
  m.samples = j.at("samples").get<std::uint64_t>();
  m.steps = j.at("steps").get<std::uint64_t>();
  m.train_loss = num("train_loss");
  m.eval_auc = num("eval_auc");
  m.eval_logloss = num("eval_logloss");
  m.swap_seconds = num("swap_seconds");
  m.rows_in = j.at("rows_in").get<std::uint64_t>();
  m.rows_out = j.at("rows_out").get<std::uint64_t>();
  m.hit_rate = num("hit_rate");
  m.samples_per_s = num("samples_per_s");
  m.seconds = num("seconds");
  m.rows_exported = j.at("rows_exported").get<std::uint64_t>();
  m.export_path = j.at("export_path").get<std::string>();
  return m;
}

std::string training_progress_line(const training_progress& p) {
  std::string line = "pass " + std::to_string(p.pass);
  if (p.passes) line += "/" + std::to_string(p.passes);
  line += " step " + std::to_string(p.step) + " | " +
          format_count_progress(p.pass_done, p.pass_total, p.pass_seconds, "samples");
  if (p.run_total) {
    const progress_figures run = progress_of(p.run_done, p.run_total, p.run_seconds);
    line += " | run " + format_percent(run.fraction) + ", ETA " + format_duration(run.eta);
  }
  char tail[96];
  std::snprintf(tail, sizeof tail, " | loss %.5f | hit rate ", p.loss);
  return line + tail + p.hit_rate;
}

std::string pass_summary_line(const pass_metrics& m) {
  char line[512];
  std::snprintf(line, sizeof line,
                "pass %llu done: %llu samples in %.2f s (%.0f samples/s), train loss %.5f, eval "
                "AUC %.5f, eval logloss %.5f, swap %.3f s, rows in %llu, rows out %llu, hit rate "
                "%.4f",
                (unsigned long long)m.pass, (unsigned long long)m.samples, m.seconds,
                m.samples_per_s, m.train_loss, m.eval_auc, m.eval_logloss, m.swap_seconds,
                (unsigned long long)m.rows_in, (unsigned long long)m.rows_out, m.hit_rate);
  std::string s = line;
  if (!m.export_path.empty())
    s += ", exported " + std::to_string(m.rows_exported) + " rows to " + m.export_path;
  return s;
}

std::string save_summary_line(const std::string& dir, double seconds) {
  std::uint64_t bytes = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) {
      const auto n = it->file_size(size_ec);
      if (!size_ec) bytes += n;
    }
  }
  char time[64];
  std::snprintf(time, sizeof time, " in %.2f s (", seconds);
  return "saved to " + dir + ": " + format_bytes(double(bytes)) + time +
         format_bytes(seconds > 0 ? double(bytes) / seconds : 0.0) + "/s)";
}

namespace {

// Runs `argv` (argv[0] looked up on the PATH by posix_spawnp, no shell) with stdin from
// /dev/null and stdout and stderr into `output`; returns its wait status. not_found when the
// program is not on the PATH.
result<int> run_program(const std::vector<std::string>& args, std::string* output) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
    return status::io_error("pipe for " + args[0] + ": " + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (rc != 0) {
    ::close(pipe_fds[0]);
    if (rc == ENOENT) return status::not_found(args[0] + " is not on the PATH");
    return status::io_error("cannot start " + args[0] + ": " + std::strerror(rc));
  }
  char buf[4096];
  for (;;) {
    const ssize_t r = ::read(pipe_fds[0], buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (output && output->size() < 65536) output->append(buf, std::size_t(r));
  }
  ::close(pipe_fds[0]);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR)
      return status::io_error("waiting for " + args[0] + ": " + std::strerror(errno));
  }
  return wstatus;
}

// Whether `path` exists and holds a line that is not a comment.
bool has_data_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') return true;
  return false;
}

// The last 12 bytes of every complete PNG: the empty IEND chunk (length 0, type, CRC).
constexpr unsigned char png_signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
constexpr unsigned char png_iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};

std::string describe_wait_status(int w) {
  if (WIFEXITED(w)) return "exit status " + std::to_string(WEXITSTATUS(w));
  if (WIFSIGNALED(w)) return "signal " + std::to_string(WTERMSIG(w));
  return "wait status " + std::to_string(w);
}

}  // namespace

temporary_images::~temporary_images() {
  for (const auto& p : paths) ::unlink(p.c_str());
}

status check_png(const std::string& drawn, const std::string& image) {
  std::ifstream in(drawn, std::ios::binary);
  if (!in) return status::io_error(image + ": gnuplot wrote no image (disk full?); no image kept");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const bool complete = bytes.size() >= sizeof png_signature + sizeof png_iend &&
                        std::equal(png_signature, png_signature + 8, b) &&
                        std::equal(png_iend, png_iend + 12, b + bytes.size() - 12);
  if (!complete)
    return status::io_error(image + ": gnuplot wrote an incomplete image (" +
                            std::to_string(bytes.size()) +
                            " bytes, no PNG end; disk full?); no image kept");
  return {};
}

}  // namespace detail

namespace fs = std::filesystem;
using detail::create_folder;
using detail::describe_wait_status;
using detail::has_data_line;
using detail::run_program;
using detail::tsv_number;
using detail::write_text_durably;

status plot_metrics(const std::string& dir_in, const std::vector<pass_metrics>& history,
                    std::string* note) {
  EMBCACHE_RETURN_IF_ERROR(create_folder(dir_in, "output_dir"));
  // gnuplot receives the folder as an argument (ARG1), never inside its script or a shell
  // command; absolute, so that it cannot read as gnuplot's "<command" or "|command".
  std::error_code ec;
  const fs::path abs = fs::absolute(dir_in, ec);
  if (ec)
    return status::io_error(dir_in + ": cannot make the path absolute (" + ec.message() + ")");
  const std::string dir = abs.lexically_normal().string();
  std::string tsv = "# pass\ttrain_loss\teval_auc\teval_logloss\tsamples_per_s\n";
  bool have_train = false, have_eval_loss = false, have_auc = false;
  for (const auto& m : history) {
    have_train = have_train || std::isfinite(m.train_loss);
    have_eval_loss = have_eval_loss || std::isfinite(m.eval_logloss);
    have_auc = have_auc || std::isfinite(m.eval_auc);
    tsv += std::to_string(m.pass) + '\t' + tsv_number(m.train_loss) + '\t' +
           tsv_number(m.eval_auc) + '\t' + tsv_number(m.eval_logloss) + '\t' +
           tsv_number(m.samples_per_s) + '\n';
  }
  EMBCACHE_RETURN_IF_ERROR(write_text_durably(dir + "/metrics.tsv", tsv));
  const bool have_steps = has_data_line(dir + "/metrics_steps.tsv");
  const bool have_loss = have_train || have_eval_loss || have_steps;
  // A plot with no point would leave an empty PNG: such a plot is left out of the script, and so
  // is a curve with no point (it would only add a legend entry).
  std::vector<std::string> images;
  std::string gp =
      "# Draws the curves of metrics.tsv (one line per pass) and metrics_steps.tsv (one line per\n"
      "# log_interval steps, at its fractional position in the pass) into PNG files. Run it as\n"
      "#   gnuplot -c plot.gp FOLDER    (or, inside the folder, gnuplot plot.gp)\n"
      "# A second argument is appended to the image names (the trainer draws into temporaries).\n"
      "d = (ARGC >= 1) ? ARG1 : '.'\n"
      "o = (ARGC >= 2) ? ARG2 : ''\n"
      "set terminal png size 900,550 noenhanced\n"
      "set datafile missing 'nan'\n"
      "set xlabel 'pass'\nset grid\n"
      "# The legend sits below the plot, off the curves.\n"
      "set key outside center bottom horizontal\n"
      "# The run's name in each title: the metrics folder (the run's output_dir).\n"
      "set title noenhanced\n"
      "# Room above and below the curves: no point on the border.\n"
      "set offsets 0, 0, graph 0.05, graph 0.05\n";
  if (!history.empty()) {
    // Pass k spans (k-1, k]: its steps inside it, its evaluation at its end, its mean train loss
    // drawn across it. The axis starts at the first pass's start and pads both ends by 3% of the
    // span, so that no point sits on the border (a one-pass run included).
    const std::uint64_t first = history.front().pass, last = history.back().pass;
    const std::uint64_t from = first > 0 ? first - 1 : 0, span = last > from ? last - from : 1;
    char range[96];
    std::snprintf(range, sizeof range, "[%.2f:%.2f]", double(from) - 0.03 * double(span),
                  double(from + span) + 0.03 * double(span));
    gp += "# Integer pass ticks.\nset xrange " + std::string(range) + "\nset xtics " +
          std::to_string(from) + ", " + std::to_string((span + 9) / 10) + "\nset format x '%.0f'\n";
  }
  if (have_loss) {
    images.push_back("loss.png");
    std::vector<std::string> curves;
    if (have_steps)
      curves.push_back(
          "d.'/metrics_steps.tsv' using 3:5 with lines lc rgb '#9ecae1' title 'train loss per "
          "log_interval steps'");
    if (have_train)
      curves.push_back(
          "d.'/metrics.tsv' using ($1-0.5):2:($1-1):1 with xerrorbars lc rgb '#08519c' pt 7 "
          "title 'train loss, mean of the pass (drawn across it)'");
    if (have_eval_loss)
      curves.push_back(
          "d.'/metrics.tsv' using 1:4 with linespoints lc rgb '#d95f0e' pt 5 title 'eval log "
          "loss'");
    gp += "set output d.'/loss.png'.o\nset ylabel 'loss'\nset title 'loss: '.d\nplot ";
    for (std::size_t i = 0; i < curves.size(); ++i) gp += (i ? ", \\\n     " : "") + curves[i];
    gp += "\n";
  }
  if (have_auc) {
    images.push_back("auc.png");
    gp +=
        "set output d.'/auc.png'.o\nset ylabel 'AUC'\nset title 'eval AUC: '.d\n"
        "plot d.'/metrics.tsv' using 1:3 with linespoints lc rgb '#31a354' pt 7 title 'eval AUC'\n";
  }
  gp += "unset output\n";
  EMBCACHE_RETURN_IF_ERROR(write_text_durably(dir + "/plot.gp", gp));
  std::string skipped;
  if (!have_loss) skipped += ", no loss.png (no finite loss)";
  if (!have_auc) skipped += ", no auc.png (no eval AUC: no eval_shard, or a single class)";
  // Temporaries of a plot whose process died (killed while gnuplot drew): "<png>.tmp.<pid>",
  // regular files only, of a process that no longer exists; nothing else is touched.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    for (const std::string prefix : {"loss.png.tmp.", "auc.png.tmp."}) {
      if (n.size() <= prefix.size() || n.compare(0, prefix.size(), prefix) != 0 ||
          n.size() - prefix.size() > 9 ||
          !std::all_of(n.begin() + prefix.size(), n.end(),
                       [](char c) { return c >= '0' && c <= '9'; }))
        continue;
      std::error_code e2;
      const pid_t pid = static_cast<pid_t>(std::stol(n.substr(prefix.size())));
      if (e.is_regular_file(e2) && !e.is_symlink(e2) && ::kill(pid, 0) != 0 && errno == ESRCH)
        fs::remove(e.path(), e2);
    }
  }
  ec.clear();
  // A PNG of an earlier run must not pass for this run's.
  for (const char* png : {"loss.png", "auc.png"}) {
    fs::remove(dir + "/" + png, ec);
    if (ec)
      return status::io_error(dir + "/" + png + ": cannot remove the old image (" + ec.message() +
                              ")");
  }
  if (images.empty()) {
    if (note) *note = "wrote " + dir + "/plot.gp and metrics.tsv" + skipped;
    return {};
  }
  // gnuplot draws into temporaries, each checked whole (it may exit 0 after a failed write)
  // and only then renamed into place: a failure leaves no partial image, and says so.
  const std::string suffix = ".tmp." + std::to_string(::getpid());
  detail::temporary_images temps;
  for (const auto& png : images) temps.paths.push_back(dir + "/" + png + suffix);
  std::string output;
  auto ran = run_program({"gnuplot", "-c", dir + "/plot.gp", dir, suffix}, &output);
  if (!ran.ok() && ran.get_status().code() == status_code::not_found) {
    if (note) *note = "gnuplot not found: wrote " + dir + "/plot.gp and metrics.tsv, no PNG";
    return {};
  }
  if (!ran.ok()) return ran.get_status();
  if (!WIFEXITED(ran.value()) || WEXITSTATUS(ran.value()) != 0) {
    if (output.size() > 2000) output = "..." + output.substr(output.size() - 2000);
    return status::io_error(dir + "/plot.gp: gnuplot failed (" + describe_wait_status(ran.value()) +
                            ")" + (output.empty() ? "" : ": " + output) + "; no image was kept");
  }
  for (std::size_t i = 0; i < images.size(); ++i)
    EMBCACHE_RETURN_IF_ERROR(detail::check_png(temps.paths[i], dir + "/" + images[i]));
  std::string drew;
  for (std::size_t i = 0; i < images.size(); ++i) {
    const std::string path = dir + "/" + images[i];
    if (std::rename(temps.paths[i].c_str(), path.c_str()) != 0)
      return detail::errno_status("cannot rename to", path, errno);
    drew += (drew.empty() ? "" : " and ") + path;
  }
  temps.paths.clear();
  if (note) *note = "drew " + drew + skipped;
  return {};
}

void to_json(nlohmann::json& j, const pass_metrics& m) {
  auto num = [](double v) {
    return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  };
  j = nlohmann::json{{"pass", m.pass},
                     {"samples", m.samples},
                     {"steps", m.steps},
                     {"train_loss", num(m.train_loss)},
                     {"eval_auc", num(m.eval_auc)},
                     {"eval_logloss", num(m.eval_logloss)},
                     {"swap_seconds", m.swap_seconds},
                     {"rows_in", m.rows_in},
                     {"rows_out", m.rows_out},
                     {"hit_rate", num(m.hit_rate)},
                     {"samples_per_s", m.samples_per_s},
                     {"seconds", m.seconds},
                     {"rows_exported", m.rows_exported},
                     {"export_path", m.export_path}};
}

}  // namespace embcache
