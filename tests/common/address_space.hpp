// Caps a (child) process's address space a little above what it uses, so that a test can show
// that an allocation failure becomes a status instead of an uncaught std::bad_alloc.
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace embcache::test {

/// Sets RLIMIT_AS to the process's current VmSize plus `extra_bytes`. Returns 0 when set, 1 when
/// /proc/self/status has no VmSize, 2 when setrlimit refused.
inline int cap_address_space_above_use(std::uint64_t extra_bytes) {
  std::ifstream st("/proc/self/status");
  std::string line;
  std::uint64_t vm_kb = 0;
  while (std::getline(st, line))
    if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stoull(line.substr(7));
  if (vm_kb == 0) return 1;
  const rlim_t cap = rlim_t(vm_kb * 1024 + extra_bytes);
  const rlimit rl{cap, cap};
  return ::setrlimit(RLIMIT_AS, &rl) == 0 ? 0 : 2;
}

}  // namespace embcache::test
