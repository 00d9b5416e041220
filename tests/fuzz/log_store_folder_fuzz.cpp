// log_store<std::int64_t>::open of a folder whose state.json and segment files are the input.
// The first byte chooses what follows the split; the rest is cut at the first two occurrences of
// the line "%%segment%%" (the bytes "\n%%segment%%\n"):
//   state.json text \n%%segment%%\n seg-00000001.log bytes \n%%segment%%\n second segment bytes
// Without a separator there is no segment file, with one there is no second segment; whatever
// follows the second separator is the second segment, further separators included.
//   bit 0  every record of the segments, from the start up to the first without a sound header
//          (magic, kind, size), gets its checksum recomputed (so mutated keys, kinds and sequence
//          numbers reach the index instead of stopping at the checksum)
//   bit 1  each segment state.json lists gets its file's size as `bytes` (when the text parses
//          as an object with a `segments` array)
//   bit 2  the second segment is seg-00000003.log instead of seg-00000002.log (a gap)
//   bit 3  no state.json at all
// The folder is opened with create_if_missing = false, once read with pread and, when the file
// system accepts O_DIRECT, once more from a fresh copy of the same bytes with direct_io; both
// give the same answer. A refusal is a status with a message. When the folder opens:
// - every segment state.json lists is still there, at least as long as listed (a flush made it
//   durable);
// - the store holds each key once: for_each visits exactly size() rows, pull and contains find
//   every key it visits with the same row and version and no key it does not, live_bytes() is
//   one record per row and disk_bytes() at least that;
// - a push of a new key and an erase of an old one succeed (a push without versions is
//   capacity_exceeded only when max_version() is 2^64 - 1), and after a flush the folder opens
//   again holding exactly the rows read plus the push, less the erase.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "embcache/log_store.hpp"
#include "fuzz_target.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace {

using embcache::status_code;

constexpr std::string_view segment_separator = "\n%%segment%%\n";
constexpr std::size_t log_row_width = 4;
constexpr std::size_t log_header_bytes = 40;  // magic, kind, key, seq, version, sum
constexpr std::size_t log_record_bytes = log_header_bytes + 16;  // a row of 4 floats
constexpr std::uint32_t log_record_magic = 0x524c4345u;          // "ECLR"

// key -> (version, row bytes)
using row_map = std::map<std::int64_t, std::pair<std::uint64_t, std::string>>;

struct folder_input {
  std::uint8_t mode = 0;
  std::string state;
  std::vector<std::string> segments;  // seg-00000001.log, then the second segment

  folder_input(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return;
    mode = data[0];
    std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    std::vector<std::string_view> parts;
    while (parts.size() < 2) {
      const std::size_t at = rest.find(segment_separator);
      if (at == std::string_view::npos) break;
      parts.push_back(rest.substr(0, at));
      rest.remove_prefix(at + segment_separator.size());
    }
    parts.push_back(rest);
    state.assign(parts[0]);
    for (std::size_t i = 1; i < parts.size(); ++i) segments.emplace_back(parts[i]);
  }
  std::uint64_t segment_id(std::size_t i) const { return i == 0 ? 1 : (mode & 4 ? 3 : 2); }
};

std::string segment_name(std::uint64_t id) {
  char b[32];
  std::snprintf(b, sizeof b, "seg-%08llu.log", static_cast<unsigned long long>(id));
  return b;
}

// Recomputes the checksum of each record from the start of `seg` while a sound header starts
// there and the record fits: the record layout of log_store.hpp (a row, a tombstone, or a pad
// whose key is its size, 40 to 4135 bytes and a multiple of 8).
void reseal(std::string& seg) {
  std::size_t at = 0;
  while (seg.size() - at >= log_header_bytes) {
    char* p = seg.data() + at;
    std::uint32_t magic, kind;
    std::uint64_t key;
    std::memcpy(&magic, p, 4);
    std::memcpy(&kind, p + 4, 4);
    std::memcpy(&key, p + 8, 8);
    if (magic != log_record_magic) return;
    std::size_t n = 0, payload = 0;
    if (kind == 1) {
      n = log_record_bytes;
      payload = log_row_width * sizeof(float);
    } else if (kind == 2) {
      n = log_header_bytes;
    } else if (kind == 3 && key >= log_header_bytes && key < 4096 + log_header_bytes &&
               key % 8 == 0) {
      n = static_cast<std::size_t>(key);
    } else {
      return;
    }
    if (seg.size() - at < n) return;
    std::uint64_t sum = XXH3_64bits(p, 32);
    if (payload) sum = XXH3_64bits_withSeed(p + log_header_bytes, payload, sum);
    std::memcpy(p + 32, &sum, 8);
    at += n;
  }
}

// The input's state.json with each listed segment's `bytes` set to its file's size; the text
// itself when it is not an object with a `segments` array.
std::string sized_state(const folder_input& in) {
  nlohmann::json j = nlohmann::json::parse(in.state, nullptr, false);
  if (!j.is_object()) return in.state;
  auto list = j.find("segments");
  if (list == j.end() || !list->is_array()) return in.state;
  for (auto& e : *list) {
    if (!e.is_object()) continue;
    auto id = e.find("id");
    if (id == e.end() || !id->is_number_unsigned()) continue;
    for (std::size_t i = 0; i < in.segments.size(); ++i)
      if (id->get<std::uint64_t>() == in.segment_id(i)) e["bytes"] = in.segments[i].size();
  }
  return j.dump(1) + "\n";
}

// The state.json the folder gets.
std::string state_text(const folder_input& in) { return in.mode & 2 ? sized_state(in) : in.state; }

// The segments a state.json lists, (id, bytes), as far as it can be read.
std::vector<std::pair<std::uint64_t, std::uint64_t>> listed_segments(const std::string& state) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  const nlohmann::json j = nlohmann::json::parse(state, nullptr, false);
  if (!j.is_object()) return out;
  const auto list = j.find("segments");
  if (list == j.end() || !list->is_array()) return out;
  for (const auto& e : *list) {
    if (!e.is_object()) continue;
    const auto id = e.find("id"), bytes = e.find("bytes");
    if (id == e.end() || bytes == e.end() || !id->is_number_unsigned() ||
        !bytes->is_number_unsigned())
      continue;
    out.emplace_back(id->get<std::uint64_t>(), bytes->get<std::uint64_t>());
  }
  return out;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A fresh folder holding the input's files.
std::string write_folder(const folder_input& in) {
  const std::string dir = embcache::fuzz::fresh_dir("log_store_folder");
  std::vector<std::string> segments = in.segments;
  if (in.mode & 1)
    for (auto& s : segments) reseal(s);
  if (!(in.mode & 8)) write_file(dir + "state.json", state_text(in));
  for (std::size_t i = 0; i < segments.size(); ++i)
    write_file(dir + segment_name(in.segment_id(i)), segments[i]);
  return dir;
}

// Whether the scratch folder's file system accepts O_DIRECT (probed once).
bool direct_io_ok() {
  static const bool ok = embcache::direct_io_supported(embcache::fuzz::scratch_dir());
  return ok;
}

// A key `rows` does not hold.
std::int64_t absent_key(const row_map& rows) {
  std::int64_t k = 0x5eed;
  while (rows.count(k)) ++k;
  return k;
}

embcache::log_store_options store_options(const std::string& dir, bool direct) {
  embcache::log_store_options o;
  o.path = dir;
  o.table_name = "emb";
  o.row_width = log_row_width;
  o.dim = 2;
  o.optimizer = "adagrad";
  o.create_if_missing = false;
  o.segment_bytes = std::uint64_t{1} << 20;
  o.read_threads = 2;
  o.read_gap_bytes = 0;
  o.max_read_bytes = 3 * log_record_bytes;  // a pull reads in runs of up to three records
  o.write_buffer_bytes = std::size_t{64} << 10;
  o.direct_io = direct;
  return o;
}

using store_ptr = std::unique_ptr<embcache::log_store<std::int64_t>>;

// Opens the folder; nothing when it is refused (with a status that says why).
store_ptr open_store(const std::string& dir, bool direct) {
  auto r = embcache::log_store<std::int64_t>::open(store_options(dir, direct));
  if (!r.ok()) {
    const auto c = r.get_status().code();
    EMBCACHE_FUZZ_CHECK(c == status_code::corruption || c == status_code::invalid_argument ||
                        c == status_code::not_found || c == status_code::capacity_exceeded);
    EMBCACHE_FUZZ_CHECK(!r.get_status().message().empty());
    return nullptr;
  }
  EMBCACHE_FUZZ_CHECK(r.value()->row_width() == log_row_width);
  return std::move(r.value());
}

// Every row of the store, read three ways that must agree: for_each, pull and contains.
row_map read_rows(embcache::log_store<std::int64_t>& store) {
  row_map rows;
  std::size_t visits = 0;
  const embcache::status scanned = store.for_each(
      3, [&](const std::int64_t* k, const float* v, const std::uint64_t* ver, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) {
          ++visits;
          std::string row(reinterpret_cast<const char*>(v + i * log_row_width),
                          log_row_width * sizeof(float));
          EMBCACHE_FUZZ_CHECK(rows.emplace(k[i], std::make_pair(ver[i], std::move(row))).second);
        }
        return embcache::status{};
      });
  // The open checked every record for_each reads.
  EMBCACHE_FUZZ_CHECK(scanned.ok());
  EMBCACHE_FUZZ_CHECK(visits == store.size());
  EMBCACHE_FUZZ_CHECK(store.live_bytes() == store.size() * log_record_bytes);
  EMBCACHE_FUZZ_CHECK(store.disk_bytes() >= store.live_bytes());

  // The keys visited, then one key that was not.
  std::vector<std::int64_t> keys;
  for (const auto& [k, vr] : rows) {
    keys.push_back(k);
    EMBCACHE_FUZZ_CHECK(vr.first <= store.max_version());
  }
  keys.push_back(absent_key(rows));
  const std::size_t n = keys.size();
  std::vector<float> pulled(n * log_row_width, 0.0f);
  std::vector<std::uint64_t> versions(n, 0);
  std::unique_ptr<bool[]> found(new bool[n]);
  std::unique_ptr<bool[]> held(new bool[n]);
  EMBCACHE_FUZZ_CHECK(store.pull(keys.data(), n, pulled.data(), found.get(), versions.data()).ok());
  EMBCACHE_FUZZ_CHECK(store.contains(keys.data(), n, held.get()).ok());
  for (std::size_t i = 0; i + 1 < n; ++i) {
    const auto& [version, row] = rows.at(keys[i]);
    EMBCACHE_FUZZ_CHECK(found[i] && held[i]);
    EMBCACHE_FUZZ_CHECK(versions[i] == version);
    EMBCACHE_FUZZ_CHECK(std::memcmp(pulled.data() + i * log_row_width, row.data(), row.size()) ==
                        0);
  }
  EMBCACHE_FUZZ_CHECK(!found[n - 1] && !held[n - 1]);
  return rows;
}

// Writes the input's folder and opens it. When it opens: reads its rows, pushes a row of a new
// key, erases the smallest key, and opens the folder again, which must then hold exactly those
// rows. Returns the rows read first, or nothing when the folder is refused.
std::optional<row_map> open_write_reopen(const folder_input& in, bool direct) {
  const std::string dir = write_folder(in);
  row_map rows, expected;
  {
    store_ptr store = open_store(dir, direct);
    if (!store) return std::nullopt;
    // What state.json lists was made durable by a flush: the open keeps all of it.
    if (!(in.mode & 8)) {
      for (const auto& [id, bytes] : listed_segments(state_text(in))) {
        std::error_code ec;
        const std::uint64_t on_disk = std::filesystem::file_size(dir + segment_name(id), ec);
        EMBCACHE_FUZZ_CHECK(!ec && on_disk >= bytes);
      }
    }
    rows = read_rows(*store);
    expected = rows;
    const std::int64_t added = absent_key(rows);
    const float row[log_row_width] = {1.5f, -2.0f, 0.25f, 8.0f};
    // Stamped with max_version() + 1, unless versions ran out: then given one.
    const std::uint64_t given[1] = {1};
    if (store->max_version() == ~std::uint64_t{0}) {
      EMBCACHE_FUZZ_CHECK(store->push(&added, 1, row).code() == status_code::capacity_exceeded);
      EMBCACHE_FUZZ_CHECK(store->push(&added, 1, row, given).ok());
    } else {
      EMBCACHE_FUZZ_CHECK(store->push(&added, 1, row).ok());
    }
    std::uint64_t version = 0;
    float back[log_row_width];
    bool found = false;
    EMBCACHE_FUZZ_CHECK(store->pull(&added, 1, back, &found, &version).ok());
    EMBCACHE_FUZZ_CHECK(found && std::memcmp(back, row, sizeof row) == 0);
    expected[added] = {version, std::string(reinterpret_cast<const char*>(row), sizeof row)};
    if (!rows.empty()) {
      const std::int64_t gone = rows.begin()->first;
      std::size_t erased = 0;
      EMBCACHE_FUZZ_CHECK(store->erase(&gone, 1, &erased).ok());
      EMBCACHE_FUZZ_CHECK(erased == 1);
      expected.erase(gone);
    }
    EMBCACHE_FUZZ_CHECK(store->size() == expected.size());
    EMBCACHE_FUZZ_CHECK(store->flush().ok());
  }
  // The first open cut what it could not read and recorded the rest, the writes were flushed:
  // the folder opens again, holding the rows it had and the writes.
  store_ptr again = open_store(dir, direct);
  EMBCACHE_FUZZ_CHECK(again != nullptr);
  EMBCACHE_FUZZ_CHECK(read_rows(*again) == expected);
  return rows;
}

}  // namespace

EMBCACHE_FUZZ_TARGET(log_store_folder) {
  const folder_input in(data, size);
  const std::optional<row_map> rows = open_write_reopen(in, false);
  if (!direct_io_ok()) return;
  // The same bytes read with O_DIRECT: the same answer.
  const std::optional<row_map> direct = open_write_reopen(in, true);
  EMBCACHE_FUZZ_CHECK(direct.has_value() == rows.has_value());
  if (direct) EMBCACHE_FUZZ_CHECK(*direct == *rows);
}
