// The trainer's checked file writes (trainer_files.hpp).
#include "trainer_files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

namespace embcache::detail {

namespace {

// A failed write: out_of_space for a full disk or quota, io_error otherwise; names the file and
// the system's reason.
status write_error(const std::string& path, const char* what, int e) {
  const std::string m = path + ": " + what + ": " + errno_text(e);
  return e == ENOSPC || e == EDQUOT ? status::out_of_space(m) : status::io_error(m);
}

}  // namespace

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

status write_file_checked(const std::string& path, const void* data, std::size_t size, bool append,
                          bool durable) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd < 0) return write_error(path, "cannot open for writing", errno);
  const char* p = static_cast<const char*>(data);
  std::size_t left = size;
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = w < 0 ? errno : ENOSPC;  // a write of 0 bytes: no room
      ::close(fd);
      return write_error(path, "write failed", e);
    }
    p += w;
    left -= std::size_t(w);
  }
  if (durable && ::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    return write_error(path, "fsync failed", e);
  }
  if (::close(fd) != 0) return write_error(path, "close failed", errno);
  return {};
}

status write_file_durable(const std::string& path, const void* data, std::size_t size) {
  return write_file_checked(path, data, size, /*append=*/false, /*durable=*/true);
}

status write_text_file(const std::string& path, const std::string& text, bool append) {
  return write_file_checked(path, text.data(), text.size(), append, /*durable=*/false);
}

status create_folder(const std::string& dir, const std::string& field) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return status::io_error(field + ": " + dir + ": cannot create (" + ec.message() + ")");
  return {};
}

}  // namespace embcache::detail
