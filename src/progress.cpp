// Percentage, rate and time left of the tools' and the trainer's progress lines.
#include "embcache/detail/progress.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

namespace embcache::detail {

namespace {

// Durations from a year on read as unknown: no job of ours runs that long, and the cast to an
// integer stays defined.
constexpr double longest_duration = 365.0 * 24 * 3600;

std::string printf_string(const char* format, double v, const char* unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v, unit);
  return buf;
}

// Steps of `steps` crossed by `done` of `total`, in 128 bits so that no product overflows.
std::uint64_t steps_crossed(std::uint64_t done, std::uint64_t total, std::uint64_t steps) {
  if (total == 0) return 0;
  if (done >= total) return steps;
  return static_cast<std::uint64_t>(static_cast<unsigned __int128>(done) * steps / total);
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds >= longest_duration) return "?";
  const long long s = std::llround(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s % 3600 / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

std::string format_bytes(double bytes) {
  if (!std::isfinite(bytes) || bytes < 0) return "?";
  static const char* const units[] = {"B", "kB", "MB", "GB", "TB"};
  std::size_t u = 0;
  double v = bytes;
  // 999.5 of a unit would print as 1000: it moves to the next unit instead.
  while (v >= 999.5 && u + 1 < std::size(units)) {
    v /= 1000;
    ++u;
  }
  if (u == 0) return printf_string("%.0f %s", v, units[u]);
  if (v < 9.995) return printf_string("%.2f %s", v, units[u]);
  if (v < 99.95) return printf_string("%.1f %s", v, units[u]);
  return printf_string("%.0f %s", v, units[u]);
}

progress_figures progress_of(std::uint64_t done, std::uint64_t total, double seconds) {
  progress_figures f;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  f.fraction = total ? std::min(1.0, double(done) / double(total)) : nan;
  f.rate = seconds > 0 ? double(done) / seconds : 0.0;
  f.eta = total && f.rate > 0 ? double(total - std::min(done, total)) / f.rate : nan;
  return f;
}

std::string format_percent(double fraction) {
  if (!std::isfinite(fraction)) return "?%";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", std::floor(fraction * 1000.0) / 10.0);
  return buf;
}

std::string format_count_progress(std::uint64_t done, std::uint64_t total, double seconds,
                                  const std::string& unit) {
  const progress_figures f = progress_of(done, total, seconds);
  const std::string rate = printf_string("%.0f %s/s", f.rate, unit.c_str());
  if (total == 0) return std::to_string(done) + " " + unit + ", " + rate;
  return format_percent(f.fraction) + " of " + std::to_string(total) + " " + unit + ", " + rate +
         ", ETA " + format_duration(f.eta);
}

std::string format_byte_progress(std::uint64_t done, std::uint64_t total, double seconds) {
  const progress_figures f = progress_of(done, total, seconds);
  const std::string rate = format_bytes(f.rate) + "/s";
  if (total == 0) return format_bytes(double(done)) + ", " + rate;
  return format_percent(f.fraction) + " of " + format_bytes(double(total)) + ", " + rate +
         ", ETA " + format_duration(f.eta);
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

progress_meter::progress_meter(std::uint64_t total, double step, double min_gap, double max_silence,
                               clock now)
    : total_(total),
      step_(step > 0 && step <= 1 ? step : 0.1),
      min_gap_(min_gap),
      max_silence_(max_silence),
      now_(std::move(now)),
      start_(now_()),
      last_line_(start_) {}

bool progress_meter::due(std::uint64_t done) {
  const double now = now_();
  const std::uint64_t steps = static_cast<std::uint64_t>(std::llround(1.0 / step_));
  const std::uint64_t crossed = steps_crossed(done, total_, std::max<std::uint64_t>(steps, 1));
  const double quiet = now - last_line_;
  if (!(crossed > last_step_ && quiet >= min_gap_) && quiet < max_silence_) return false;
  last_step_ = std::max(last_step_, crossed);
  last_line_ = now;
  return true;
}

double progress_meter::seconds() const { return now_() - start_; }

std::string progress_meter::count_text(std::uint64_t done, const std::string& unit) const {
  return format_count_progress(done, total_, seconds(), unit);
}

std::string progress_meter::byte_text(std::uint64_t done) const {
  return format_byte_progress(done, total_, seconds());
}

}  // namespace embcache::detail
