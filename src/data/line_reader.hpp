// Reads lines from a plain or gzip file (zlib detects which) without per-line allocation, and
// turns over-long lines and broken gzip streams into results instead of failures. A background
// thread reads and decompresses the next chunks while the caller parses the current one.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "embcache/status.hpp"

namespace embcache::detail {

class line_reader {
 public:
  enum class event {
    line,      ///< `line()` holds the next line (no newline)
    too_long,  ///< the next line exceeded max_line_bytes and was skipped
    broken,    ///< the stream broke (message()); the file ends here
    end,       ///< no more lines
  };

  explicit line_reader(std::size_t max_line_bytes = 65536);
  ~line_reader();
  line_reader(const line_reader&) = delete;
  line_reader& operator=(const line_reader&) = delete;

  /// Opens `path` ("-": standard input), plain or gzip (detected by its magic bytes).
  [[nodiscard]] status open(const std::string& path);
  event next();
  std::string_view line() const noexcept { return line_; }
  /// 1-based number of the line last returned (or where the stream broke).
  std::uint64_t line_number() const noexcept { return line_number_; }
  /// Uncompressed bytes read so far.
  std::uint64_t bytes() const noexcept { return bytes_; }
  /// Bytes of the file consumed so far: for gzip the compressed bytes behind the data handed
  /// out, else the same as bytes(); at most the file's size.
  std::uint64_t consumed() const noexcept { return consumed_; }
  /// The size of the file when open() found a regular file, else 0 (unknown: a pipe).
  std::uint64_t file_size() const noexcept { return file_size_; }
  const std::string& message() const noexcept { return message_; }

 private:
  struct chunk {
    std::vector<char> data;
    bool broken = false;       // the stream broke after `data`
    std::uint64_t offset = 0;  // file bytes consumed once `data` was read (gzoffset)
    std::string message;
  };
  bool fill();  // false at end of data or on error (then broken_ is set)
  void close();
  void produce();  // the read-ahead thread

  void* file_ = nullptr;  // gzFile, used by the read-ahead thread only
  std::size_t max_line_;
  std::vector<char> buf_;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  bool eof_ = false;
  bool broken_ = false;
  bool skipping_ = false;
  std::string_view line_;
  std::uint64_t line_number_ = 0;
  std::uint64_t bytes_ = 0;
  std::uint64_t consumed_ = 0;
  std::uint64_t file_size_ = 0;
  std::string message_;

  std::thread producer_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<chunk> ready_;               // filled chunks, oldest first; an empty one marks the end
  std::vector<std::vector<char>> spare_;  // buffers to reuse
  bool stop_ = false;
};

}  // namespace embcache::detail
