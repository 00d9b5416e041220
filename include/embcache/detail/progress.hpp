// Progress arithmetic of the tools and the trainer: percentage, rate and time left of a job whose
// size is known, formatted the same way everywhere, and when a progress line is due. The clock is
// injected, so that every figure and every decision is a function of its inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace embcache::detail {

/// A duration as "m:ss" below an hour and "h:mm:ss" from an hour on, rounded to whole seconds
/// ("0:07", "12:34", "1:02:03"); "?" for a negative or non-finite time, or a year or more.
std::string format_duration(double seconds);

/// A byte count in decimal units with three significant digits: "512 B", "1.50 kB", "12.3 MB",
/// "123 GB" (up to TB); "?" for a negative or non-finite count.
std::string format_bytes(double bytes);

/// A fraction as a percentage with one decimal, rounded down so that "100.0%" means done:
/// 0.4567 is "45.6%"; "?%" when not finite.
std::string format_percent(double fraction);

/// Where a job stands after `done` of `total` units in `seconds`.
struct progress_figures {
  double fraction = 0;  ///< done / total, at most 1; NaN when total is 0 (size unknown)
  double rate = 0;      ///< units per second; 0 before any time has passed
  double eta = 0;       ///< seconds left at that rate; NaN without a total or a rate
};

/// The figures of `done` units of `total` (0: unknown) after `seconds`.
progress_figures progress_of(std::uint64_t done, std::uint64_t total, double seconds);

/// "45.0% of 6400 samples, 1234 samples/s, ETA 0:03": the percentage (one decimal), the rate
/// (no decimal) and the time left; without a total "2880 samples, 1234 samples/s".
std::string format_count_progress(std::uint64_t done, std::uint64_t total, double seconds,
                                  const std::string& unit);

/// Same for bytes: "45.0% of 1.20 GB, 35.2 MB/s, ETA 0:19"; without a total "540 MB, 35.2 MB/s".
std::string format_byte_progress(std::uint64_t done, std::uint64_t total, double seconds);

/// Seconds on a monotonic clock (std::chrono::steady_clock); the default clock of progress_meter.
double steady_seconds();

/// Decides when a progress line is due, so that a job prints a sane number of them: when it
/// has crossed another `step` fraction of its total (10%, 20%, ... 100%) and `min_gap` seconds
/// have passed since the last line (or the start), and in any case after `max_silence` seconds
/// without a line (the only rule when the total is unknown). A job shorter than `min_gap` prints
/// no line; one of a minute about ten; a long one a line per step or per `max_silence`.
class progress_meter {
 public:
  using clock = std::function<double()>;  ///< seconds on a monotonic clock

  /// A job of `total` units (0: unknown) that begins now on `now`; `step` in (0, 1] (default
  /// 10%), `min_gap` and `max_silence` in seconds (default 2 and 30).
  explicit progress_meter(std::uint64_t total, double step = 0.1, double min_gap = 2,
                          double max_silence = 30, clock now = steady_seconds);

  /// Whether a line is due now that `done` units are done (then it counts as printed).
  bool due(std::uint64_t done);
  /// Seconds since the job began.
  double seconds() const;
  /// format_count_progress of `done` at the current time.
  std::string count_text(std::uint64_t done, const std::string& unit) const;
  /// format_byte_progress of `done` at the current time.
  std::string byte_text(std::uint64_t done) const;
  /// The size of the job (0: unknown).
  std::uint64_t total() const noexcept { return total_; }

 private:
  std::uint64_t total_;
  double step_, min_gap_, max_silence_;
  clock now_;
  double start_, last_line_;
  std::uint64_t last_step_ = 0;  // steps crossed at the last line
};

}  // namespace embcache::detail
