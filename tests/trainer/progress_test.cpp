// The progress arithmetic of the tools and the trainer: exact strings for given inputs, and when a
// line is due, on an injected clock.
#include "embcache/detail/progress.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace embcache::detail {
namespace {

const double nan = std::numeric_limits<double>::quiet_NaN();
const double inf = std::numeric_limits<double>::infinity();

TEST(progress, durations_read_as_minutes_or_hours) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(0.4), "0:00");
  EXPECT_EQ(format_duration(7.5), "0:08");
  EXPECT_EQ(format_duration(65), "1:05");
  EXPECT_EQ(format_duration(754), "12:34");
  EXPECT_EQ(format_duration(3599.4), "59:59");
  EXPECT_EQ(format_duration(3600), "1:00:00");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(100 * 3600 + 61), "100:01:01");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(nan), "?");
  EXPECT_EQ(format_duration(inf), "?");
  EXPECT_EQ(format_duration(1e30), "?");
}

TEST(progress, bytes_have_three_significant_digits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(999), "999 B");
  EXPECT_EQ(format_bytes(1500), "1.50 kB");
  EXPECT_EQ(format_bytes(12'345'678), "12.3 MB");
  EXPECT_EQ(format_bytes(999'499), "999 kB");
  EXPECT_EQ(format_bytes(999'500), "1.00 MB");
  EXPECT_EQ(format_bytes(9'996), "10.0 kB");
  EXPECT_EQ(format_bytes(123e9), "123 GB");
  EXPECT_EQ(format_bytes(5e15), "5000 TB");
  EXPECT_EQ(format_bytes(-1), "?");
  EXPECT_EQ(format_bytes(nan), "?");
}

TEST(progress, percentages_are_rounded_down) {
  EXPECT_EQ(format_percent(0), "0.0%");
  EXPECT_EQ(format_percent(0.4567), "45.6%");
  EXPECT_EQ(format_percent(0.9999), "99.9%");
  EXPECT_EQ(format_percent(1), "100.0%");
  EXPECT_EQ(format_percent(nan), "?%");
}

TEST(progress, figures_of_a_known_and_an_unknown_total) {
  progress_figures f = progress_of(2880, 6400, 2.0);
  EXPECT_DOUBLE_EQ(f.fraction, 0.45);
  EXPECT_DOUBLE_EQ(f.rate, 1440);
  EXPECT_DOUBLE_EQ(f.eta, 3520.0 / 1440.0);
  f = progress_of(7000, 6400, 2.0);  // more than announced: never past 100%, nothing left
  EXPECT_DOUBLE_EQ(f.fraction, 1.0);
  EXPECT_DOUBLE_EQ(f.eta, 0.0);
  f = progress_of(100, 0, 2.0);
  EXPECT_TRUE(std::isnan(f.fraction));
  EXPECT_DOUBLE_EQ(f.rate, 50);
  EXPECT_TRUE(std::isnan(f.eta));
  f = progress_of(0, 100, 0.0);  // no time yet: no rate, no ETA
  EXPECT_DOUBLE_EQ(f.rate, 0);
  EXPECT_TRUE(std::isnan(f.eta));
}

TEST(progress, count_and_byte_lines) {
  EXPECT_EQ(format_count_progress(2880, 6400, 2.0, "samples"),
            "45.0% of 6400 samples, 1440 samples/s, ETA 0:02");
  EXPECT_EQ(format_count_progress(2880, 0, 2.0, "samples"), "2880 samples, 1440 samples/s");
  EXPECT_EQ(format_count_progress(0, 6400, 0.0, "rows"), "0.0% of 6400 rows, 0 rows/s, ETA ?");
  // Rounded down: 100.0% only when done.
  EXPECT_EQ(format_count_progress(9999, 10000, 1.0, "rows"),
            "99.9% of 10000 rows, 9999 rows/s, ETA 0:00");
  EXPECT_EQ(format_count_progress(10000, 10000, 4.0, "rows"),
            "100.0% of 10000 rows, 2500 rows/s, ETA 0:00");
  EXPECT_EQ(format_byte_progress(540'000'000, 1'200'000'000, 15.34),
            "45.0% of 1.20 GB, 35.2 MB/s, ETA 0:19");
  EXPECT_EQ(format_byte_progress(540'000'000, 0, 15.34), "540 MB, 35.2 MB/s");
  EXPECT_EQ(format_byte_progress(1'200'000'000, 1'200'000'000, 3723.0),
            "100.0% of 1.20 GB, 322 kB/s, ETA 0:00");
}

// A clock the test moves by hand.
struct fake_clock {
  double t = 100;
  progress_meter::clock fn() {
    return [this] { return t; };
  }
};

TEST(progress, a_line_every_ten_percent_or_after_a_silence) {
  fake_clock c;
  progress_meter m(1000, 0.1, 2, 10, c.fn());
  EXPECT_FALSE(m.due(0));
  EXPECT_FALSE(m.due(100));  // 10%, but too soon after the start
  c.t += 2;
  EXPECT_FALSE(m.due(99));
  EXPECT_TRUE(m.due(100));  // 10%
  EXPECT_FALSE(m.due(150));
  c.t += 2;
  EXPECT_FALSE(m.due(199));
  EXPECT_TRUE(m.due(350));  // past 20% and 30% at once: one line
  c.t += 2;
  EXPECT_FALSE(m.due(390));
  c.t += 7.9;
  EXPECT_FALSE(m.due(391));
  c.t += 0.1;  // ten seconds without a line
  EXPECT_TRUE(m.due(392));
  EXPECT_EQ(m.count_text(392, "rows"), "39.2% of 1000 rows, 28 rows/s, ETA 0:22");
  EXPECT_FALSE(m.due(393));
  c.t += 1.5;
  EXPECT_FALSE(m.due(400));  // 40%, but 1.5 s after the last line
  c.t += 0.5;
  EXPECT_TRUE(m.due(400));
  c.t += 2;
  EXPECT_TRUE(m.due(1000));  // 100%
  c.t += 2;
  EXPECT_FALSE(m.due(1000));
  EXPECT_DOUBLE_EQ(m.seconds(), 20.0);
  EXPECT_EQ(m.byte_text(1000), "100.0% of 1.00 kB, 50 B/s, ETA 0:00");
}

TEST(progress, a_short_job_prints_no_line) {
  fake_clock c;
  progress_meter m(1000, 0.1, 2, 30, c.fn());
  for (std::uint64_t done = 0; done <= 1000; done += 50) {
    c.t += 0.09;
    EXPECT_FALSE(m.due(done)) << done;
  }
}

TEST(progress, an_unknown_total_gets_a_line_after_each_silence) {
  fake_clock c;
  progress_meter m(0, 0.1, 2, 5, c.fn());
  EXPECT_FALSE(m.due(1'000'000));
  c.t += 5;
  EXPECT_TRUE(m.due(2'000'000));
  EXPECT_EQ(m.byte_text(2'000'000), "2.00 MB, 400 kB/s");
  c.t += 4;
  EXPECT_FALSE(m.due(3'000'000));
  c.t += 1;
  EXPECT_TRUE(m.due(3'000'000));
}

TEST(progress, huge_counts_do_not_overflow_the_step_arithmetic) {
  fake_clock c;
  const std::uint64_t total = std::numeric_limits<std::uint64_t>::max();
  progress_meter m(total, 0.1, 0, 1e9, c.fn());
  EXPECT_FALSE(m.due(total / 20));
  EXPECT_TRUE(m.due(total / 10 + 1));
  EXPECT_FALSE(m.due(total / 10 + 2));
  EXPECT_TRUE(m.due(total));
}

}  // namespace
}  // namespace embcache::detail
