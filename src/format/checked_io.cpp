#include "format/checked_io.hpp"

#include "common/durable_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace embcache::detail {

namespace {
XXH64_state_t* state_of(void* p) { return static_cast<XXH64_state_t*>(p); }
}  // namespace

checked_file_reader::checked_file_reader() : hash_state_(XXH64_createState()) {
  XXH64_reset(state_of(hash_state_), 0);
}

checked_file_reader::~checked_file_reader() {
  if (fd_ >= 0) ::close(fd_);
  XXH64_freeState(state_of(hash_state_));
}

status checked_file_reader::open(const std::string& path, std::uint64_t* size_out) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) return errno_status("cannot open", path, errno);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return errno_status("cannot stat", path, errno);
  if (size_out) *size_out = static_cast<std::uint64_t>(st.st_size);
  return {};
}

status checked_file_reader::read(void* data, std::size_t bytes) {
  char* p = static_cast<char*>(data);
  std::size_t done = 0;
  while (done < bytes) {
    ssize_t r = ::read(fd_, p + done, bytes - done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_status("cannot read", path_, errno);
    }
    if (r == 0)
      return status::corruption("'" + path_ + "' ends at byte " + std::to_string(offset_ + done) +
                                ", expected at least " + std::to_string(offset_ + bytes) +
                                " bytes (truncated)");
    done += static_cast<std::size_t>(r);
  }
  XXH64_update(state_of(hash_state_), data, bytes);
  offset_ += bytes;
  return {};
}

std::uint64_t checked_file_reader::digest() const noexcept {
  return XXH64_digest(state_of(hash_state_));
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool parse_hex64(const std::string& text, std::uint64_t* out) {
  if (text.size() != 16) return false;
  std::uint64_t v = 0;
  for (char c : text) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return false;
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  *out = v;
  return true;
}

status check_checkpoint_target(const std::string& dir, const char* who) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty()) return status::invalid_argument(std::string(who) + ": empty checkpoint folder");
  auto st = fs::status(dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    return status::io_error(std::string(who) + ": cannot stat '" + dir + "': " + ec.message());
  if (!fs::exists(st)) return {};
  if (!fs::is_directory(st))
    return status::invalid_argument(std::string(who) + ": checkpoint target '" + dir +
                                    "' exists and is not a folder");
  if (!fs::is_empty(dir, ec) || ec)
    return status::invalid_argument(std::string(who) + ": checkpoint folder '" + dir +
                                    "' exists and is not empty");
  return {};
}

std::string strip_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::string parent_dir(const std::string& dir) {
  std::filesystem::path p(dir);
  auto parent = p.parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace embcache::detail
