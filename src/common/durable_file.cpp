#include "common/durable_file.hpp"

#include "common/memory_check.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace embcache::detail {

namespace fs = std::filesystem;

status errno_status(const std::string& what, const std::string& path, int err) {
  std::string msg = what + " '" + path + "': " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return status::out_of_space(std::move(msg));
  if (err == ENOENT) return status::not_found(std::move(msg));
  return status::io_error(std::move(msg));
}

namespace {
constexpr std::size_t write_buffer_bytes = std::size_t{1} << 20;

XXH64_state_t* hash_of(void* p) { return static_cast<XXH64_state_t*>(p); }

std::string parent_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

status write_all(int fd, const char* p, std::size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno_status("cannot write", path, errno);
    }
    if (w == 0) return status::io_error("cannot write '" + path + "': no progress");
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return {};
}

status rename_path(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    return errno_status("cannot rename '" + from + "' to", to, errno);
  return {};
}
}  // namespace

durable_file_writer::durable_file_writer() : hash_state_(XXH64_createState()) {
  XXH64_reset(hash_of(hash_state_), 0);
}

durable_file_writer::~durable_file_writer() {
  abort();
  XXH64_freeState(hash_of(hash_state_));
}

status durable_file_writer::open(const std::string& path, file_placement placement) {
  abort();
  static std::atomic<std::uint64_t> counter{0};
  path_ = path;
  write_path_ = placement == file_placement::in_staged_folder
                    ? path
                    : path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(counter.fetch_add(1));
  fd_ = ::open(write_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    status s = errno_status("cannot create", write_path_, err);
    write_path_.clear();
    return s;
  }
  buf_.reserve(write_buffer_bytes);
  bytes_ = 0;
  XXH64_reset(hash_of(hash_state_), 0);
  return {};
}

status durable_file_writer::flush() {
  if (buf_.empty()) return {};
  status s = write_all(fd_, buf_.data(), buf_.size(), write_path_);
  buf_.clear();
  return s;
}

status durable_file_writer::write(const void* data, std::size_t n) {
  if (fd_ < 0) throw error(status_code::invalid_argument, "durable_file_writer: write before open");
  const char* p = static_cast<const char*>(data);
  XXH64_update(hash_of(hash_state_), p, n);
  bytes_ += n;
  if (buf_.size() + n > write_buffer_bytes) {
    EMBCACHE_RETURN_IF_ERROR(flush());
    if (n >= write_buffer_bytes) return write_all(fd_, p, n, write_path_);
  }
  buf_.insert(buf_.end(), p, p + n);
  return {};
}

status durable_file_writer::write_at(std::uint64_t offset, const void* data, std::size_t n) {
  if (fd_ < 0)
    throw error(status_code::invalid_argument, "durable_file_writer: write_at before open");
  EMBCACHE_RETURN_IF_ERROR(flush());
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno_status("cannot write", write_path_, errno);
    }
    if (w == 0) return status::io_error("cannot write '" + write_path_ + "': no progress");
    p += w;
    offset += static_cast<std::uint64_t>(w);
    n -= static_cast<std::size_t>(w);
  }
  return {};
}

status durable_file_writer::commit() {
  if (fd_ < 0)
    throw error(status_code::invalid_argument, "durable_file_writer: commit before open");
  EMBCACHE_RETURN_IF_ERROR(flush());
  if (::fsync(fd_) != 0) return errno_status("cannot fsync", write_path_, errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) return errno_status("cannot close", write_path_, errno);
  if (write_path_ == path_) {  // in a staged folder: publish_folder() makes the entry durable
    write_path_.clear();
    return {};
  }
  if (std::rename(write_path_.c_str(), path_.c_str()) != 0) {
    status s = errno_status("cannot rename to", path_, errno);
    return s;  // abort() (or the destructor) removes the temporary
  }
  write_path_.clear();
  return sync_folder(parent_of(path_));
}

void durable_file_writer::abort() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!write_path_.empty()) {
    ::unlink(write_path_.c_str());
    write_path_.clear();
  }
  buf_.clear();
}

std::uint64_t durable_file_writer::digest() const noexcept {
  return XXH64_digest(hash_of(hash_state_));
}

status write_file_durably(const std::string& path, const void* data, std::size_t n) {
  durable_file_writer w;
  EMBCACHE_RETURN_IF_ERROR(w.open(path));
  EMBCACHE_RETURN_IF_ERROR(w.write(data, n));
  return w.commit();
}

status write_text_durably(const std::string& path, const std::string& text) {
  return write_file_durably(path, text.data(), text.size());
}

status append_to_file(const std::string& path, const std::string& text, bool truncate) {
  const int fd =
      ::open(path.c_str(),
             O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (truncate ? O_TRUNC : O_APPEND), 0644);
  if (fd < 0 && errno == ELOOP)
    return status::invalid_argument("'" + path +
                                    "' is a symbolic link: a log is never written through one "
                                    "(it would truncate or grow the file it points to); remove it");
  if (fd < 0) return errno_status("cannot open", path, errno);
  status s = write_all(fd, text.data(), text.size(), path);
  if (::close(fd) != 0 && s.ok()) s = errno_status("cannot close", path, errno);
  return s;
}

status sync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_status("cannot open folder", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a folder (EINVAL); their entries are as durable as they get.
  if (rc != 0 && err != EINVAL) return errno_status("cannot fsync folder", dir, err);
  return {};
}

std::string output_folder_of(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  // A bounded walk down a chain of links, as the kernel's own limit on them (a loop stops here
  // and fails later, when the folder is created).
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) break;
    std::error_code ec;
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) break;
    p = (to.is_absolute() ? to : fs::path(p).parent_path() / to).lexically_normal().string();
    while (p.size() > 1 && p.back() == '/') p.pop_back();
  }
  return p;
}

std::string staging_folder_of(const std::string& target) {
  return output_folder_of(target) + ".tmp";
}
std::string previous_folder_of(const std::string& target) {
  return output_folder_of(target) + ".old";
}

status check_output_path_length(const std::string& field, const std::string& path,
                                std::size_t sibling_suffix) {
  constexpr std::size_t name_max = 255, path_max = 4096, inside = 512;
  if (path.size() + inside > path_max)
    return status::invalid_argument(field + ": '" + path + "' is " + std::to_string(path.size()) +
                                    " bytes long; at most " + std::to_string(path_max - inside) +
                                    " fit (PATH_MAX " + std::to_string(path_max) + ", less " +
                                    std::to_string(inside) + " for the files written inside it)");
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  std::size_t begin = 0;
  while (begin < p.size()) {
    std::size_t end = p.find('/', begin);
    if (end == std::string::npos) end = p.size();
    const bool last = end == p.size();
    const std::size_t limit = last ? name_max - sibling_suffix : name_max;
    if (end - begin > limit)
      return status::invalid_argument(
          field + ": '" + path + "': the name '" + p.substr(begin, end - begin) + "' is " +
          std::to_string(end - begin) + " bytes long; at most " + std::to_string(limit) +
          " fit (NAME_MAX " + std::to_string(name_max) +
          (last && sibling_suffix ? ", less " + std::to_string(sibling_suffix) +
                                        " for the '.tmp' and '.old' folders beside it"
                                  : std::string()) +
          ")");
    begin = end + 1;
  }
  return {};
}

status remove_staging_folder(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return errno_status("cannot inspect the temporary folder", path, errno);
  }
  if (!S_ISDIR(st.st_mode))
    return status::invalid_argument(
        "'" + path +
        "' is in the way of a temporary folder and is not one (only our own temporary folders "
        "are removed); move it away");
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec)
    return status::io_error("cannot remove the temporary folder '" + path + "': " + ec.message());
  return {};
}

status staging_folder::create(const std::string& path) {
  discard();
  EMBCACHE_RETURN_IF_ERROR(remove_staging_folder(path));
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (!ec && !fs::create_directory(path, ec) && !ec)
    ec = std::make_error_code(std::errc::file_exists);
  if (ec) return errno_status("cannot create the temporary folder", path, ec.value());
  path_ = path;
  return {};
}

status staging_folder::publish(const std::string& target) {
  const std::string staged = path_;
  path_.clear();  // publish_folder removes what is left of it (the previous folder) itself
  return publish_folder(staged, target);
}

void staging_folder::discard() noexcept {
  if (path_.empty()) return;
  std::error_code ec;
  fs::remove_all(path_, ec);  // a failure to clean up must not hide the failure being reported
  path_.clear();
}

status publish_folder(const std::string& staged, const std::string& target_in) {
  const std::string target = output_folder_of(target_in);
  EMBCACHE_RETURN_IF_ERROR(sync_folder(staged));
  const std::string parent = parent_of(target);
  std::error_code ec;
  if (!fs::exists(target, ec)) {
    EMBCACHE_RETURN_IF_ERROR(rename_path(staged, target));
    return sync_folder(parent);
  }
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    EMBCACHE_RETURN_IF_ERROR(sync_folder(parent));
    fs::remove_all(staged, ec);  // it holds the previous folder now
    return {};
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    return errno_status("cannot exchange '" + staged + "' with", target, errno);
  // No atomic exchange on this file system: two renames, the previous folder kept aside until
  // the new one is in place (published_folder() reads it meanwhile).
  const std::string old = previous_folder_of(target);
  fs::remove_all(old, ec);
  EMBCACHE_RETURN_IF_ERROR(rename_path(target, old));
  EMBCACHE_RETURN_IF_ERROR(sync_folder(parent));
  status s = rename_path(staged, target);
  if (!s.ok()) {
    (void)std::rename(old.c_str(), target.c_str());
    return s;
  }
  EMBCACHE_RETURN_IF_ERROR(sync_folder(parent));
  fs::remove_all(old, ec);
  return {};
}

std::string published_folder(const std::string& dir, const std::string& marker_file) {
  std::error_code ec;
  const std::string old = previous_folder_of(dir);
  if (!fs::exists(fs::path(dir) / marker_file, ec) && fs::exists(fs::path(old) / marker_file, ec))
    return old;
  return dir;
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

result<std::vector<char>> read_file_bytes(const std::string& path, std::uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return errno_status("cannot open", path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    status s = errno_status("cannot stat", path, errno);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return status::invalid_argument("'" + path + "' is " +
                                    (S_ISDIR(st.st_mode) ? "a folder, not a regular file"
                                                         : "not a regular file (a FIFO, a device "
                                                           "or a socket is never read)"));
  }
  if (std::uint64_t(st.st_size) > max_bytes) {
    ::close(fd);
    return status::invalid_argument("'" + path + "' is " + std::to_string(st.st_size) +
                                    " bytes, more than the " + std::to_string(max_bytes) +
                                    " bytes allowed for it");
  }
  // A huge (sparse) file must end in a status naming it, not in std::bad_alloc.
  if (status s = check_fits_in_memory("reading '" + path + "'", std::uint64_t(st.st_size));
      !s.ok()) {
    ::close(fd);
    return s;
  }
  std::vector<char> bytes(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
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
