#include "common/memory_check.hpp"

#include <unistd.h>

namespace embcache::detail {

std::uint64_t machine_memory_bytes() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return UINT64_MAX;
  const std::uint64_t p = static_cast<std::uint64_t>(pages), s = static_cast<std::uint64_t>(page);
  return p > UINT64_MAX / s ? UINT64_MAX : p * s;
}

status check_fits_in_memory(const std::string& what, std::uint64_t bytes) {
  const std::uint64_t have = machine_memory_bytes();
  if (bytes <= have) return {};
  return status::capacity_exceeded(what + " needs " + std::to_string(bytes) +
                                   " bytes of memory, more than this machine's " +
                                   std::to_string(have) + " bytes");
}

}  // namespace embcache::detail
