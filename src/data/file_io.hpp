// Forwarding header while the data part moves to common/durable_file.hpp.
#pragma once

#include "common/durable_file.hpp"

namespace embcache::detail {
using atomic_file_writer = durable_file_writer;
}  // namespace embcache::detail
