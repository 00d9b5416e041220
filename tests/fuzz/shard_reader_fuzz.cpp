// A shard file: the header check, the whole-file read and the streaming reader. Each input is
// also parsed with both checksums recomputed, so mutated sizes reach the size checks.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstring>
#include <string>
#include <vector>

#include "embcache/shard.hpp"
#include "fuzz_target.hpp"

namespace {

void check_shard(const std::string& path, std::size_t size, std::uint8_t flags) {
  auto h = embcache::read_shard_header(path);
  auto d = embcache::read_shard(path);
  if (d.ok()) {
    EMBCACHE_FUZZ_CHECK(h.ok());  // the full read checks a superset of the header checks
  }
  if (h.ok()) {
    const embcache::shard_header& hd = h.value();
    EMBCACHE_FUZZ_CHECK(hd.record_size == embcache::shard_record_size(hd.num_crossed));
    EMBCACHE_FUZZ_CHECK(hd.rows <= (size - embcache::shard_header_size) / hd.record_size);
    EMBCACHE_FUZZ_CHECK(embcache::shard_header_size + hd.rows * hd.record_size == size);
  }
  if (d.ok()) {
    const embcache::shard_data& sd = d.value();
    EMBCACHE_FUZZ_CHECK(sd.header.rows == h.value().rows);
    EMBCACHE_FUZZ_CHECK(sd.records.size() == sd.header.rows * sd.header.record_size);
    std::vector<std::int64_t> crossed(sd.header.num_crossed);
    embcache::criteo_sample s;
    for (std::uint64_t i = 0; i < sd.header.rows; ++i) sd.get(i, s, crossed.data());
  }

  embcache::shard_reader_options o;
  o.batch_size = 1 + flags % 7;
  o.shuffle = (flags & 0x10) != 0;
  o.drop_last = (flags & 0x20) != 0;
  o.read_ahead = (flags & 0x40) != 0;
  o.seed = flags;
  auto r = embcache::shard_reader::open({path, path}, o);
  EMBCACHE_FUZZ_CHECK(r.ok() == h.ok());
  if (!r.ok()) return;
  const std::uint64_t rows = h.value().rows;
  EMBCACHE_FUZZ_CHECK(r.value()->total_rows() == 2 * rows);
  embcache::shard_batch b;
  std::uint64_t seen = 0;
  for (std::uint64_t calls = 0;; ++calls) {
    EMBCACHE_FUZZ_CHECK(calls <= 2 * rows + 2);  // every call hands out a sample or ends
    const embcache::status s = r.value()->next(b);
    if (!s.ok()) {
      EMBCACHE_FUZZ_CHECK(!d.ok());  // only a shard that fails read_shard stops the reader
      return;
    }
    if (b.size == 0) break;
    EMBCACHE_FUZZ_CHECK(b.size <= o.batch_size);
    EMBCACHE_FUZZ_CHECK(b.shard_index < 2);
    for (std::uint64_t i = 0; i < b.size; ++i) EMBCACHE_FUZZ_CHECK(b.rows[i] < rows);
    seen += b.size;
  }
  EMBCACHE_FUZZ_CHECK(d.ok());
  if (!o.drop_last) EMBCACHE_FUZZ_CHECK(seen == 2 * rows);
  EMBCACHE_FUZZ_CHECK(seen <= 2 * rows);
}

}  // namespace

EMBCACHE_FUZZ_TARGET(shard_reader) {
  const std::uint8_t flags = size > 0 ? data[size - 1] : 0;
  check_shard(embcache::fuzz::scratch_file(data, size), size, flags);
  if (size < embcache::shard_header_size) return;
  // The same bytes with valid checksums: the record checksum at 32, then the header's at 56.
  std::vector<std::uint8_t> fixed(data, data + size);
  const std::uint64_t records =
      XXH64(fixed.data() + embcache::shard_header_size, size - embcache::shard_header_size, 0);
  std::memcpy(fixed.data() + 32, &records, 8);
  const std::uint64_t header = XXH64(fixed.data(), 56, 0);
  std::memcpy(fixed.data() + 56, &header, 8);
  check_shard(embcache::fuzz::scratch_file(fixed.data(), size, "fixed"), size, flags);
}
