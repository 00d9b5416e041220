// parse_criteo_line on the bytes as one line, and the plain/gzip line reader of embcache-prep on
// the bytes as a file, each line of which is parsed too.
#include <cmath>
#include <cstring>
#include <string_view>

#include "../../src/data/line_reader.hpp"
#include "embcache/criteo.hpp"
#include "fuzz_target.hpp"

namespace {

void check_parse(std::string_view line, embcache::dense_transform t) {
  embcache::criteo_parse_options o;
  o.transform = t;
  embcache::criteo_sample s;
  const embcache::status st = embcache::parse_criteo_line(line, o, s);
  if (!st.ok()) {
    EMBCACHE_FUZZ_CHECK(st.code() == embcache::status_code::corruption);
    EMBCACHE_FUZZ_CHECK(!st.message().empty());
    return;
  }
  EMBCACHE_FUZZ_CHECK(s.label == 0.0f || s.label == 1.0f);
  for (float d : s.dense) {
    EMBCACHE_FUZZ_CHECK(std::isfinite(d));
    if (t == embcache::dense_transform::log1p) EMBCACHE_FUZZ_CHECK(d >= 0.0f);
  }
  for (std::size_t j = 0; j < embcache::criteo_slot_count; ++j) {
    EMBCACHE_FUZZ_CHECK(s.keys[j] > 0);
    EMBCACHE_FUZZ_CHECK(embcache::criteo_key_tag(s.keys[j]) == j);
  }
  // A line that parses has exactly 40 fields: 39 tabs (a trailing '\r' aside).
  std::size_t tabs = 0;
  for (char c : line) tabs += c == '\t';
  EMBCACHE_FUZZ_CHECK(tabs == embcache::criteo_field_count - 1);
}

}  // namespace

EMBCACHE_FUZZ_TARGET(criteo_line) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_parse(text, embcache::dense_transform::log1p);
  check_parse(text, embcache::dense_transform::identity);

  // A small line limit reaches the over-long-line paths with small inputs.
  const std::size_t max_line = 512;
  const std::string path = embcache::fuzz::scratch_file(data, size);
  embcache::detail::line_reader reader(max_line);
  if (!reader.open(path).ok()) return;
  const bool plain = size < 2 || data[0] != 0x1f || data[1] != 0x8b;
  std::size_t newlines = 0;
  for (std::size_t i = 0; i < size; ++i) newlines += data[i] == '\n';
  std::uint64_t events = 0;
  while (true) {
    const auto ev = reader.next();
    if (ev == embcache::detail::line_reader::event::end) break;
    ++events;
    EMBCACHE_FUZZ_CHECK(reader.line_number() == events);
    if (ev == embcache::detail::line_reader::event::broken) {
      EMBCACHE_FUZZ_CHECK(!reader.message().empty());
      break;
    }
    if (ev == embcache::detail::line_reader::event::line) {
      const std::string_view line = reader.line();
      EMBCACHE_FUZZ_CHECK(line.size() <= max_line);
      EMBCACHE_FUZZ_CHECK(line.find('\n') == std::string_view::npos);
      check_parse(line, embcache::dense_transform::log1p);
    }
    // Plain text: one event per newline, plus one for a last line without it.
    if (plain) EMBCACHE_FUZZ_CHECK(events <= newlines + 1);
  }
  if (plain) EMBCACHE_FUZZ_CHECK(reader.bytes() == size);
}
