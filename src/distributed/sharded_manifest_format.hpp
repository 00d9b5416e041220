// What a sharded save's manifest.json names, shared by the code that writes a save
// (sharded_save.cpp) and the code that reads and checks it (sharded_manifest.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "embcache/distributed/sharded_save.hpp"

namespace embcache::detail {

/// The manifest's "format" and "format_version".
inline constexpr const char* sharded_manifest_format = "embcache.sharded_save";
inline constexpr std::uint64_t sharded_manifest_format_version = 1;

/// The admission sketch of a generation, relative to the save's folder.
inline std::string sharded_admission_path(std::uint64_t generation) {
  return sharded_generation_name(generation) + "/admission";
}

}  // namespace embcache::detail
