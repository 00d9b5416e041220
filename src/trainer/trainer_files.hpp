// The trainer's checked file writes: every write, fsync and close is checked, and a failure names
// the file and the system's reason (out_of_space for a full disk or quota, io_error otherwise).
#pragma once

#include <cstddef>
#include <string>

#include "embcache/status.hpp"

namespace embcache::detail {

/// The system's text for an errno value.
std::string errno_text(int e);

/// Writes `size` bytes to `path` (truncated, or appended to with `append`), checking every write
/// and the close; with `durable` also fsync.
[[nodiscard]] status write_file_checked(const std::string& path, const void* data, std::size_t size,
                                        bool append, bool durable);

/// write_file_checked, truncating and with fsync.
[[nodiscard]] status write_file_durable(const std::string& path, const void* data,
                                        std::size_t size);

/// write_file_checked of `text`, without fsync.
[[nodiscard]] status write_text_file(const std::string& path, const std::string& text,
                                     bool append = false);

/// Creates `dir` and its parents; io_error "<field>: <dir>: cannot create (<reason>)".
[[nodiscard]] status create_folder(const std::string& dir, const std::string& field);

}  // namespace embcache::detail
