#include "line_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/durable_file.hpp"

namespace embcache::detail {

namespace {
constexpr std::size_t chunk_bytes = std::size_t{1} << 20;
constexpr std::size_t chunks_ahead = 3;
}  // namespace

line_reader::line_reader(std::size_t max_line_bytes)
    : max_line_(max_line_bytes < 16 ? 16 : max_line_bytes),
      buf_(std::max<std::size_t>(chunk_bytes, 2 * max_line_ + 1) + chunk_bytes) {}

line_reader::~line_reader() { close(); }

void line_reader::close() {
  if (producer_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    producer_.join();
  }
  if (file_) gzclose(static_cast<gzFile>(file_));
  file_ = nullptr;
  ready_.clear();
  stop_ = false;
}

status line_reader::open(const std::string& path) {
  close();
  begin_ = end_ = 0;
  eof_ = broken_ = skipping_ = false;
  line_number_ = bytes_ = consumed_ = file_size_ = 0;
  message_.clear();
  // "-" is standard input (a duplicate of it: closing the reader leaves stdin open).
  const int fd = path == "-" ? ::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 0)
                             : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status("cannot open", path == "-" ? "standard input" : path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    const int err = S_ISDIR(st.st_mode) ? EISDIR : errno;
    ::close(fd);
    return errno_status("cannot read input", path, err);
  }
  if (S_ISREG(st.st_mode)) file_size_ = static_cast<std::uint64_t>(st.st_size);
  errno = 0;
  gzFile f = gzdopen(fd, "rb");
  if (!f) {
    ::close(fd);
    return errno_status("cannot open", path, errno ? errno : EIO);
  }
  gzbuffer(f, 1 << 18);
  file_ = f;
  producer_ = std::thread(&line_reader::produce, this);
  return {};
}

void line_reader::produce() {
  auto f = static_cast<gzFile>(file_);
  while (true) {
    chunk c;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || ready_.size() < chunks_ahead; });
      if (stop_) return;
      if (!spare_.empty()) {
        c.data = std::move(spare_.back());
        spare_.pop_back();
      }
    }
    c.data.resize(chunk_bytes);
    const int n = gzread(f, c.data.data(), static_cast<unsigned>(c.data.size()));
    c.data.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    const z_off_t at = gzoffset(f);
    c.offset = at > 0 ? static_cast<std::uint64_t>(at) : 0;
    bool last = false;
    if (n <= 0) {
      // Data that arrived before a break was delivered by earlier reads; the break shows here.
      int err = Z_OK;
      const char* what = gzerror(f, &err);
      if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) {
        c.broken = true;
        c.message = std::string("gzip stream broken: ") +
                    (err == Z_BUF_ERROR ? "unexpected end of file (truncated)" : what);
      }
      last = true;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.push_back(std::move(c));
    }
    cv_.notify_all();
    if (last) return;
  }
}

bool line_reader::fill() {
  if (eof_ || broken_) return false;
  if (begin_ > 0) {
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  chunk c;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !ready_.empty(); });
    c = std::move(ready_.front());
    ready_.pop_front();
  }
  cv_.notify_all();
  // The buffer holds at most max_line_ carried bytes plus one chunk.
  std::memcpy(buf_.data() + end_, c.data.data(), c.data.size());
  end_ += c.data.size();
  bytes_ += c.data.size();
  consumed_ = std::max(consumed_, c.offset);
  if (file_size_ > 0) consumed_ = std::min(consumed_, file_size_);
  const bool got = !c.data.empty();
  if (c.broken) {
    broken_ = true;
    message_ = std::move(c.message);
  } else if (!got) {
    eof_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    spare_.push_back(std::move(c.data));
  }
  return got;
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
