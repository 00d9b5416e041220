// The library's one home for durable files and folders: every file the library writes for
// keeps (saves, deltas, shards, keysets, manifests, dense weights) goes through here, so that a
// crash or a full disk leaves either the previous version or the complete new one, and every
// failure names the operation, the path and the system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "embcache/status.hpp"

namespace embcache::detail {

/// Status for a failed system call: "<what> '<path>': <strerror(err)>"; out_of_space for
/// ENOSPC/EDQUOT, not_found for ENOENT, io_error for everything else.
status errno_status(const std::string& what, const std::string& path, int err);

/// Where a durable_file_writer's bytes go until commit().
enum class file_placement {
  /// A temporary beside the target, renamed over it by commit(): readers see the previous file
  /// or the complete new one (for a file published on its own).
  replace_atomically,
  /// The target itself, in a staged folder that publish_folder() moves into place as a whole.
  in_staged_folder,
};

/// Buffered writer of one file: every write, the fsync, the close and the rename are checked.
/// It also hashes the appended bytes (xxHash64, seed 0) for manifests that carry a checksum.
/// Destroying an uncommitted writer removes what it wrote.
class durable_file_writer {
 public:
  durable_file_writer();
  ~durable_file_writer();
  durable_file_writer(const durable_file_writer&) = delete;
  durable_file_writer& operator=(const durable_file_writer&) = delete;

  [[nodiscard]] status open(const std::string& path,
                            file_placement placement = file_placement::replace_atomically);
  /// Appends `n` bytes (buffered).
  [[nodiscard]] status write(const void* data, std::size_t n);
  /// Overwrites `n` bytes at `offset` of what was already written (a header patched at the
  /// end); not part of digest().
  [[nodiscard]] status write_at(std::uint64_t offset, const void* data, std::size_t n);
  /// Writes what is buffered, fsyncs and closes; with replace_atomically also renames the
  /// temporary over the target and fsyncs the folder.
  [[nodiscard]] status commit();
  /// Closes and removes what was written; no-op when nothing is open.
  void abort() noexcept;

  const std::string& path() const noexcept { return path_; }
  /// Bytes appended by write().
  std::uint64_t bytes() const noexcept { return bytes_; }
  /// xxHash64 (seed 0) of the bytes appended by write().
  std::uint64_t digest() const noexcept;

 private:
  [[nodiscard]] status flush();

  std::string path_;
  std::string write_path_;  // the temporary, or path_ itself in a staged folder
  int fd_ = -1;
  std::vector<char> buf_;
  std::uint64_t bytes_ = 0;
  void* hash_state_ = nullptr;
};

/// Writes `n` bytes as the file `path`, replacing it atomically (temporary, fsync, rename,
/// fsync of the folder).
[[nodiscard]] status write_file_durably(const std::string& path, const void* data, std::size_t n);
/// write_file_durably of a text.
[[nodiscard]] status write_text_durably(const std::string& path, const std::string& text);

/// Appends `text` to `path` in place (created when missing; with `truncate` emptied first), every
/// write checked, no fsync: for append-only logs such as metrics lines, which a crash may cut
/// short but not replace. A failure names the file, as errno_status.
[[nodiscard]] status append_to_file(const std::string& path, const std::string& text,
                                    bool truncate = false);

/// fsyncs a folder so that the entries created or renamed in it are durable.
[[nodiscard]] status sync_folder(const std::string& dir);

/// The temporary sibling a folder is staged in before publish_folder(): `target` + ".tmp".
std::string staging_folder_of(const std::string& target);
/// The sibling the previous folder waits in while a publish replaces it: `target` + ".old".
std::string previous_folder_of(const std::string& target);

/// Moves the complete folder `staged` to `target` (fsyncing it and the parent). A previous
/// `target` is exchanged atomically where the file system can (renameat2), else moved to
/// previous_folder_of(target) until the new one is in place, and removed at the end; at every
/// instant either `target` or previous_folder_of(target) holds a complete folder.
[[nodiscard]] status publish_folder(const std::string& staged, const std::string& target);

/// The folder to read a published `dir` from: `dir`, or previous_folder_of(dir) when a publish
/// was interrupted between its renames (`dir` lacks `marker_file` and the previous one has it).
std::string published_folder(const std::string& dir, const std::string& marker_file);

/// An exclusive advisory lock (flock) on a lock file, held until unlock() or destruction.
/// Another process (or another open of the file) cannot take it meanwhile.
class file_lock {
 public:
  file_lock() = default;
  file_lock(const file_lock&) = delete;
  file_lock& operator=(const file_lock&) = delete;
  ~file_lock() { unlock(); }

  /// Creates `path` when missing and locks it without waiting; when another holder has it,
  /// fails with invalid_argument "`holder` is in use by another process (lock 'path' is held)".
  [[nodiscard]] status try_lock(const std::string& path, const std::string& holder);
  void unlock() noexcept;

 private:
  int fd_ = -1;
};

/// The whole content of the regular file `path` (not_found when it does not exist).
result<std::vector<char>> read_file_bytes(const std::string& path);

}  // namespace embcache::detail
