#include "file_io.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace embcache::detail {

status errno_status(const std::string& what, const std::string& path, int err) {
  std::string msg = what + " '" + path + "': " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return status::out_of_space(std::move(msg));
  if (err == ENOENT) return status::not_found(std::move(msg));
  return status::io_error(std::move(msg));
}

namespace {
constexpr std::size_t write_buffer_bytes = std::size_t{1} << 20;

std::string parent_dir(const std::string& path) {
  auto pos = path.find_last_of('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return path.substr(0, pos);
}

status write_all(int fd, const char* p, std::size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno_status("cannot write", path, errno);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return {};
}
}  // namespace

atomic_file_writer::~atomic_file_writer() { abort(); }

status atomic_file_writer::open(const std::string& path) {
  abort();
  static std::atomic<std::uint64_t> counter{0};
  path_ = path;
  tmp_path_ = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return errno_status("cannot create", tmp_path_, errno);
  buf_.reserve(write_buffer_bytes);
  return {};
}

status atomic_file_writer::flush() {
  if (buf_.empty()) return {};
  status s = write_all(fd_, buf_.data(), buf_.size(), tmp_path_);
  buf_.clear();
  return s;
}

status atomic_file_writer::write(const void* data, std::size_t n) {
  if (fd_ < 0) throw error(status_code::invalid_argument, "atomic_file_writer: write before open");
  const char* p = static_cast<const char*>(data);
  if (buf_.size() + n > write_buffer_bytes) {
    EMBCACHE_RETURN_IF_ERROR(flush());
    if (n >= write_buffer_bytes) return write_all(fd_, p, n, tmp_path_);
  }
  buf_.insert(buf_.end(), p, p + n);
  return {};
}

status atomic_file_writer::write_at(std::uint64_t offset, const void* data, std::size_t n) {
  if (fd_ < 0) throw error(status_code::invalid_argument, "atomic_file_writer: write before open");
  EMBCACHE_RETURN_IF_ERROR(flush());
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno_status("cannot write", tmp_path_, errno);
    }
    p += w;
    offset += static_cast<std::uint64_t>(w);
    n -= static_cast<std::size_t>(w);
  }
  return {};
}

status atomic_file_writer::commit() {
  if (fd_ < 0) throw error(status_code::invalid_argument, "atomic_file_writer: commit before open");
  EMBCACHE_RETURN_IF_ERROR(flush());
  if (::fsync(fd_) != 0) return errno_status("cannot fsync", tmp_path_, errno);
  if (::close(fd_) != 0) {
    fd_ = -1;
    return errno_status("cannot close", tmp_path_, errno);
  }
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    status s = errno_status("cannot rename to", path_, errno);
    ::unlink(tmp_path_.c_str());
    return s;
  }
  tmp_path_.clear();
  // The rename is durable only once the folder entry is.
  int dfd = ::open(parent_dir(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

void atomic_file_writer::abort() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!tmp_path_.empty()) {
    ::unlink(tmp_path_.c_str());
    tmp_path_.clear();
  }
  buf_.clear();
}

status file_lock::try_lock(const std::string& path, const std::string& holder) {
  unlock();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status("cannot open lock file", path, errno);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return status::invalid_argument(holder + " is in use by another process (lock '" + path +
                                      "' is held)");
    }
    return errno_status("cannot lock", path, err);
  }
  fd_ = fd;
  return {};
}

void file_lock::unlock() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);  // releases the flock
    fd_ = -1;
  }
}

result<std::vector<char>> read_file_bytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status("cannot open", path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    status s = errno_status("cannot stat", path, errno);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return status::invalid_argument("'" + path + "' is not a regular file");
  }
  std::vector<char> bytes(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < bytes.size()) {
    ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      status s = errno_status("cannot read", path, errno);
      ::close(fd);
      return s;
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  ::close(fd);
  bytes.resize(got);
  return bytes;
}

}  // namespace embcache::detail
