// One memory budget split between the parts that cannot shrink and the tiers that can
// (memory_plan.hpp). All arithmetic is in 128 bits: the inputs are any 64-bit values.
#include "embcache/memory_plan.hpp"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <string>

namespace embcache {
namespace {

using u128 = unsigned __int128;

std::string text(u128 v) {
  if (v >> 64) return "more than 2^64";
  return std::to_string(static_cast<std::uint64_t>(v));
}

status check_percent(const memory_plan_options& o, const char* name, unsigned v, unsigned max) {
  if (v <= max) return {};
  return status::invalid_argument(o.field + ": memory_plan_options::" + name +
                                  ": expected a percentage in [0, " + std::to_string(max) +
                                  "], got " + std::to_string(v));
}

}  // namespace

result<memory_plan> plan_memory(const memory_plan_options& o) {
  EMBCACHE_RETURN_IF_ERROR(check_percent(o, "reserve_percent", o.reserve_percent, 99));
  EMBCACHE_RETURN_IF_ERROR(check_percent(o, "dram_tier_percent", o.dram_tier_percent, 100));
  EMBCACHE_RETURN_IF_ERROR(check_percent(o, "row_cache_percent", o.row_cache_percent, 100));
  EMBCACHE_RETURN_IF_ERROR(check_percent(o, "memtable_percent", o.memtable_percent, 100));
  const unsigned shares = (o.dram_tier ? o.dram_tier_percent : 0) +
                          (o.row_cache ? o.row_cache_percent : 0) + o.memtable_percent;
  if (o.rocksdb_column_families > 0 && shares > 100)
    return status::invalid_argument(o.field + ": the shares of the DRAM tier, the row cache and " +
                                    "the memtables add up to " + std::to_string(shares) +
                                    "%, more than 100%");
  if (o.max_write_buffers < 2 || o.max_write_buffers > 64)
    return status::invalid_argument(o.field +
                                    ": memory_plan_options::max_write_buffers: expected an "
                                    "integer in [2, 64], got " +
                                    std::to_string(o.max_write_buffers));
  const bool rocksdb = o.rocksdb_column_families > 0;
  const u128 memtables = u128(o.rocksdb_column_families) * unsigned(o.max_write_buffers);
  // The least the tiers behind the caches may get.
  u128 tiers = 0;
  if (rocksdb) {
    tiers = min_block_cache_bytes + memtables * min_write_buffer_bytes;
    if (o.row_cache) tiers += min_row_cache_bytes;
    if (o.dram_tier) tiers += min_dram_tier_bytes;
  }
  const u128 fixed = u128(o.cache_bytes) + o.staging_bytes + o.other_bytes;
  // The budget B must satisfy B - B * reserve% >= fixed + tiers: B >= (fixed + tiers) * 100 /
  // (100 - reserve%), rounded up.
  const u128 needed =
      ((fixed + tiers) * 100 + (100 - o.reserve_percent) - 1) / (100 - o.reserve_percent);
  const u128 reserve = u128(o.budget_bytes) * o.reserve_percent / 100;
  if (o.budget_bytes == 0 || u128(o.budget_bytes) < needed) {
    std::string parts = "caches " + std::to_string(o.cache_bytes) + ", staging " +
                        std::to_string(o.staging_bytes) + ", other " +
                        std::to_string(o.other_bytes) + ", reserve " +
                        std::to_string(o.reserve_percent) + "%";
    if (rocksdb) parts += ", RocksDB at least " + text(tiers);
    if (needed >> 64)
      return status::capacity_exceeded(o.field + ": the parts need more than 2^64 bytes (" + parts +
                                       ")");
    return status::capacity_exceeded(o.field + ": " + std::to_string(o.budget_bytes) +
                                     " bytes is less than the " + text(needed) + " bytes needed (" +
                                     parts + ")");
  }
  memory_plan p;
  p.budget_bytes = o.budget_bytes;
  p.cache_bytes = o.cache_bytes;
  p.staging_bytes = o.staging_bytes;
  p.other_bytes = o.other_bytes;
  p.reserve_bytes = static_cast<std::uint64_t>(reserve);
  if (!rocksdb) return p;
  p.max_write_buffers = o.max_write_buffers;
  // What is left once the fixed parts and the reserve are out: at least `tiers` (checked).
  const std::uint64_t split = static_cast<std::uint64_t>(u128(o.budget_bytes) - reserve - fixed);
  const auto share = [split](unsigned percent) {
    return static_cast<std::uint64_t>(u128(split) * percent / 100);
  };
  const std::uint64_t per_memtable = static_cast<std::uint64_t>(
      std::max<u128>(min_write_buffer_bytes, share(o.memtable_percent) / memtables));
  p.write_buffer_bytes = per_memtable;
  p.memtable_bytes = static_cast<std::uint64_t>(memtables * per_memtable);
  if (o.row_cache) p.row_cache_bytes = std::max(min_row_cache_bytes, share(o.row_cache_percent));
  if (o.dram_tier) p.dram_tier_bytes = std::max(min_dram_tier_bytes, share(o.dram_tier_percent));
  // The block cache gets the rest. Where a minimum raised a part above its share, the DRAM tier
  // and then the row cache give back what the block cache's own minimum needs.
  u128 used = u128(p.memtable_bytes) + p.row_cache_bytes + p.dram_tier_bytes;
  for (std::uint64_t* part : {&p.dram_tier_bytes, &p.row_cache_bytes}) {
    const std::uint64_t least =
        part == &p.dram_tier_bytes ? min_dram_tier_bytes : min_row_cache_bytes;
    if (used + min_block_cache_bytes <= split || *part <= least) continue;
    const std::uint64_t give = static_cast<std::uint64_t>(
        std::min<u128>(used + min_block_cache_bytes - split, *part - least));
    *part -= give;
    used -= give;
  }
  p.block_cache_bytes = static_cast<std::uint64_t>(
      std::max<u128>(min_block_cache_bytes, used < split ? u128(split) - used : u128(0)));
  return p;
}

bool keep_allocator_within_budget() noexcept {
#ifdef __GLIBC__
  const int bytes = static_cast<int>(budget_allocator_threshold_bytes);
  // Setting either turns glibc's dynamic threshold off.
  return ::mallopt(M_MMAP_THRESHOLD, bytes) == 1 && ::mallopt(M_TRIM_THRESHOLD, bytes) == 1;
#else
  return false;
#endif
}

}  // namespace embcache
