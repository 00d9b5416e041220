// Memory checks before an allocation sized from outside bytes (a manifest's counts that agree
// with huge, possibly sparse files): a clear status naming what needed the memory, instead of
// std::bad_alloc ending the process.
#pragma once

#include <cstdint>
#include <string>

#include "embcache/status.hpp"

namespace embcache::detail {

/// This machine's physical memory in bytes (sysconf), or UINT64_MAX when it cannot be read.
std::uint64_t machine_memory_bytes() noexcept;

/// ok when `bytes` fit in this machine's physical memory; else capacity_exceeded
/// "<what> needs N bytes of memory, more than this machine's M bytes".
[[nodiscard]] status check_fits_in_memory(const std::string& what, std::uint64_t bytes);

}  // namespace embcache::detail
