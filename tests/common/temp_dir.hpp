// Scratch folders of the tests, in one place for every suite: a folder per scope (temp_dir), and
// named folders per process removed when the test binary exits (process_temp_dir).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace embcache::testing {

/// The folder scratch folders go in: $TMPDIR when set, else /tmp.
inline std::string temp_root() { return std::filesystem::temp_directory_path().string(); }

/// A fresh folder `<temp_root>/<prefix>_XXXXXX`, removed with everything in it at destruction.
class temp_dir {
 public:
  explicit temp_dir(const std::string& prefix = "embcache_test") {
    const std::string templ = temp_root() + "/" + prefix + "_XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed for " + templ);
    path_ = buf.data();
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  /// The folder.
  const std::string& path() const noexcept { return path_; }
  /// `path()/name`.
  std::string sub(const std::string& name) const { return path_ + "/" + name; }
  /// `path()/name`.
  std::string operator/(const std::string& name) const { return sub(name); }

 private:
  std::string path_;
};

/// `<temp_root>/<prefix>_<pid>_<name>`, created empty (what was there is removed first): a named
/// folder of this process that tests of one binary share; a process_temp_cleanup of the same
/// prefix removes it at exit.
inline std::string process_temp_dir(const std::string& prefix, const std::string& name) {
  const std::string d =
      temp_root() + "/" + prefix + "_" + std::to_string(::getpid()) + "_" + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

/// Removes this process's process_temp_dir folders of `prefix` at destruction: one inline
/// variable per suite, destroyed when the test binary exits.
struct process_temp_cleanup {
  std::string prefix;
  ~process_temp_cleanup() {
    const std::string mine = prefix + "_" + std::to_string(::getpid()) + "_";
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(temp_root(), ec))
      if (e.path().filename().string().rfind(mine, 0) == 0)
        std::filesystem::remove_all(e.path(), ec);
  }
};

}  // namespace embcache::testing
