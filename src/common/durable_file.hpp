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
/// short but not replace. A failure names the file, as errno_status. A symbolic link at `path`
/// is never followed (O_NOFOLLOW): one planted in an output folder would make the log truncate
/// or grow the file it points to; it is refused with invalid_argument naming it.
[[nodiscard]] status append_to_file(const std::string& path, const std::string& text,
                                    bool truncate = false);

/// fsyncs a folder so that the entries created or renamed in it are durable.
[[nodiscard]] status sync_folder(const std::string& dir);

/// The folder an output path names: `path` without trailing slashes, and when that is a
/// symbolic link (or a chain of them), the folder it points to, whether it exists or not. A
/// symlink given as an output folder is followed and its target written into, never replaced
/// by a real folder (docs/reliability.md).
std::string output_folder_of(const std::string& path);

/// The temporary sibling a folder is staged in before publish_folder():
/// output_folder_of(`target`) + ".tmp".
std::string staging_folder_of(const std::string& target);
/// The sibling the previous folder waits in while a publish replaces it:
/// output_folder_of(`target`) + ".old".
std::string previous_folder_of(const std::string& target);

/// Checks before a run that the output folder `path` can be written: each of its names at most
/// NAME_MAX (255) bytes, its last `sibling_suffix` bytes fewer (the ".tmp" and ".old" of a
/// published folder), and the whole at most PATH_MAX (4096) less 512 bytes for what is written
/// inside it. invalid_argument "<field>: '<path>': ..." naming the name that is too long, so
/// that a run fails at its start, not after training. An empty path passes.
[[nodiscard]] status check_output_path_length(const std::string& field, const std::string& path,
                                              std::size_t sibling_suffix);

/// Removes the staging folder `path` (a leftover of an interrupted run) with everything in it;
/// nothing to do when it is absent. Anything else of that name (a regular file, a symbolic
/// link, a device) is not ours and is never removed: invalid_argument naming it.
[[nodiscard]] status remove_staging_folder(const std::string& path);

/// A staging folder that exists from create() until publish(), and is removed with everything
/// in it on every other way out (a failed write, an early return, an exception), so that a
/// failure leaves no folder behind.
class staging_folder {
 public:
  staging_folder() = default;
  staging_folder(const staging_folder&) = delete;
  staging_folder& operator=(const staging_folder&) = delete;
  ~staging_folder() { discard(); }

  /// Creates `path` (and its parents), empty: a leftover folder of that name is removed first,
  /// anything else of that name is refused as by remove_staging_folder().
  [[nodiscard]] status create(const std::string& path);
  /// publish_folder(path(), `target`); the folder is no longer this object's afterwards, even
  /// when the publish fails (publish_folder keeps `target` or its previous folder whole).
  [[nodiscard]] status publish(const std::string& target);
  /// Removes the folder now unless it was published; no-op after publish().
  void discard() noexcept;

  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;  // empty when there is nothing to remove
};

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

/// The whole content of the regular file `path` (not_found when it does not exist). A folder, a
/// FIFO or a device is refused without reading it (invalid_argument naming it), and so is a
/// file of more than `max_bytes` bytes, before anything is allocated; a file larger than this
/// machine's memory is capacity_exceeded (check_fits_in_memory).
result<std::vector<char>> read_file_bytes(const std::string& path,
                                          std::uint64_t max_bytes = UINT64_MAX);

}  // namespace embcache::detail
