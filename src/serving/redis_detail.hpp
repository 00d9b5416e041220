// What the Redis serving store's translation units share (redis.cpp: connection, push, rows;
// redis_check.cpp: the address and the store checked against a save).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "embcache/redis.hpp"

namespace embcache::detail {

/// "redis HOST:PORT" ("redis [IPV6]:PORT"), the server as every message names it.
std::string redis_where(const redis_options& o);
/// Exactly the decimal digits of s[0, n) into `out`; false for anything else or an overflow.
bool parse_u64(const char* s, std::size_t n, std::uint64_t* out);

}  // namespace embcache::detail
