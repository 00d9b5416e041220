#include "line_reader.hpp"

#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "file_io.hpp"

namespace embcache::detail {

line_reader::line_reader(std::size_t max_line_bytes)
    : max_line_(max_line_bytes < 16 ? 16 : max_line_bytes),
      buf_(std::max<std::size_t>(std::size_t{1} << 20, 2 * max_line_ + 1)) {}

line_reader::~line_reader() { close(); }

void line_reader::close() {
  if (file_) gzclose(static_cast<gzFile>(file_));
  file_ = nullptr;
}

status line_reader::open(const std::string& path) {
  close();
  begin_ = end_ = 0;
  eof_ = broken_ = skipping_ = false;
  line_number_ = bytes_ = 0;
  message_.clear();
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return errno_status("cannot open", path, errno ? errno : EIO);
  gzbuffer(f, 1 << 18);
  file_ = f;
  return {};
}

bool line_reader::fill() {
  if (eof_ || broken_) return false;
  if (begin_ > 0) {
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  auto f = static_cast<gzFile>(file_);
  const int n = gzread(f, buf_.data() + end_, static_cast<unsigned>(buf_.size() - end_));
  if (n > 0) {
    // Data that arrived before a break is good data; the break shows on the next read.
    end_ += static_cast<std::size_t>(n);
    bytes_ += static_cast<std::uint64_t>(n);
    return true;
  }
  int err = Z_OK;
  const char* what = gzerror(f, &err);
  if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) {
    broken_ = true;
    message_ = std::string("gzip stream broken: ") +
               (err == Z_BUF_ERROR ? "unexpected end of file (truncated)" : what);
    return false;
  }
  eof_ = true;
  return false;
}

line_reader::event line_reader::next() {
  while (true) {
    const char* base = buf_.data();
    const void* nl = begin_ < end_ ? std::memchr(base + begin_, '\n', end_ - begin_) : nullptr;
    if (nl) {
      const std::size_t stop = static_cast<const char*>(nl) - base;
      line_ = std::string_view(base + begin_, stop - begin_);
      begin_ = stop + 1;
      ++line_number_;
      if (skipping_ || line_.size() > max_line_) {
        skipping_ = false;
        return event::too_long;
      }
      return event::line;
    }
    if (end_ - begin_ > max_line_) {
      // No newline within the limit: drop what we have and skip to the next newline.
      skipping_ = true;
      begin_ = end_ = 0;
    }
    if (!fill()) {
      if (broken_) {
        ++line_number_;
        begin_ = end_ = 0;
        skipping_ = false;
        return event::broken;
      }
      if (begin_ < end_ || skipping_) {
        // A last line without a newline.
        line_ = std::string_view(buf_.data() + begin_, end_ - begin_);
        begin_ = end_;
        ++line_number_;
        const bool was_skipping = skipping_;
        skipping_ = false;
        return was_skipping || line_.size() > max_line_ ? event::too_long : event::line;
      }
      return event::end;
    }
  }
}

}  // namespace embcache::detail
