// The RocksDB store's bulk operations; its encoding, database and table state are in the .inl
// parts included below (one translation unit: RocksDB's headers are heavy).
#include "embcache/rocksdb_store.hpp"

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/sst_file_writer.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/utilities/options_util.h>
#include <rocksdb/write_batch.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/durable_file.hpp"
#include "embcache/detail/host_algorithms.hpp"
#include "format/checked_io.hpp"
// The store's parts, in the order they build on each other.
#include "rocksdb_database.inl"
#include "rocksdb_direct_reads.inl"
#include "rocksdb_encoding.inl"
#include "rocksdb_table.inl"

namespace embcache {

namespace {

// Collects the first failure of a parallel loop.
struct first_error {
  std::mutex mutex;
  status st;
  std::atomic<bool> failed{false};
  void set(status s) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failed) {
      st = std::move(s);
      failed = true;
    }
  }
};

}  // namespace

template <class Key>
std::size_t rocksdb_store<Key>::row_width() const noexcept {
  return state_->options.row_width;
}

template <class Key>
const std::string& rocksdb_store<Key>::table_name() const noexcept {
  return state_->options.table_name;
}

template <class Key>
std::size_t rocksdb_store<Key>::size() const noexcept {
  auto& s = *state_;
  if (!s.count_stale.load(std::memory_order_acquire)) return s.count;
  std::lock_guard<std::mutex> lock(s.count_mutex);
  if (s.count_stale.load() && s.recount().ok()) s.count_stale = false;
  return s.count;
}

template <class Key>
rocksdb_read_counts rocksdb_store<Key>::read_counts() const noexcept {
  const auto& s = *state_;
  rocksdb_read_counts c;
  c.keys_looked_up = s.keys_looked_up.load();
  c.keys_scanned = s.keys_scanned.load();
  c.scan_steps = s.scan_steps.load();
  c.scan_seeks = s.scan_seeks.load();
  return c;
}

template <class Key>
std::uint64_t rocksdb_store<Key>::max_version() const noexcept {
  return state_->max_version;
}

template <class Key>
status rocksdb_store<Key>::pull(const Key* keys, std::size_t n, float* rows_out, bool* found_out,
                                std::uint64_t* versions_out) {
  auto& s = *state_;
  if (n == 0) return {};
  if (!keys || !found_out || (!rows_out && s.options.row_width))
    return status::invalid_argument(s.who + ": pull needs keys, rows_out and found_out");
  if (n >= 0xFFFFFFFFu) return status::invalid_argument(s.who + ": batch too large");
  std::vector<std::uint64_t> su;
  std::vector<std::uint32_t> pos;
  s.sort_keys(keys, n, su, pos);
  const std::size_t row_bytes = s.options.row_width * sizeof(float);
  const std::size_t vbytes = s.value_bytes();
  first_error err;
  s.read_sorted(su.data(), n,
                [&](std::size_t j, const rocksdb::Status& st, const rocksdb::Slice& v) {
                  const std::size_t i = pos[j];
                  if (st.ok()) {
                    if (v.size() != vbytes) {
                      found_out[i] = false;
                      err.set(status::corruption(s.who + ": the value of key " + key_text(keys[i]) +
                                                 " has " + std::to_string(v.size()) +
                                                 " bytes, expected " + std::to_string(vbytes)));
                      return;
                    }
                    found_out[i] = true;
                    if (rows_out)
                      std::memcpy(rows_out + i * s.options.row_width, v.data(), row_bytes);
                    if (versions_out) std::memcpy(&versions_out[i], v.data() + row_bytes, 8);
                  } else {
                    found_out[i] = false;
                    if (!st.IsNotFound())
                      err.set(from_rocksdb(st, s.who + ": reading key " + key_text(keys[i])));
                  }
                });
  return err.st;
}

template <class Key>
status rocksdb_store<Key>::contains(const Key* keys, std::size_t n, bool* found_out) {
  auto& s = *state_;
  if (n == 0) return {};
  if (!keys || !found_out)
    return status::invalid_argument(s.who + ": contains needs keys and found_out");
  // A pull that copies nothing.
  std::vector<std::uint64_t> su;
  std::vector<std::uint32_t> pos;
  s.sort_keys(keys, n, su, pos);
  first_error err;
  s.read_sorted(su.data(), n, [&](std::size_t j, const rocksdb::Status& st, const rocksdb::Slice&) {
    found_out[pos[j]] = st.ok();
    if (!st.ok() && !st.IsNotFound())
      err.set(from_rocksdb(st, s.who + ": reading key " + key_text(keys[pos[j]])));
  });
  return err.st;
}

namespace {

// Rows an SST file of an ingested push holds at most: parts of about 64 MiB, written in parallel.
constexpr std::size_t ingest_file_bytes = std::size_t{64} << 20;

// What a push writes: the sorted, deduplicated keys `su` with the batch positions `pos` of their
// rows, each row's version (`versions` or `stamp`), and what it found out.
template <class Key>
struct push_job {
  typename rocksdb_store<Key>::state& s;
  const std::vector<std::uint64_t>& su;
  const std::vector<std::uint32_t>& pos;
  const float* rows;
  const std::uint64_t* versions;
  std::uint64_t stamp;
  bool count;  // count_on_push: look every key up first
  std::atomic<std::size_t> added{0};
  std::atomic<std::uint64_t> vmax{0};
  first_error err;

  std::uint64_t version_of(std::size_t i) const { return versions ? versions[i] : stamp; }
  void saw_version(std::uint64_t local_max) {
    std::uint64_t cur = vmax.load();
    while (cur < local_max && !vmax.compare_exchange_weak(cur, local_max)) {
    }
  }
  // With count_on_push, counts the keys of su[b, e) that the table does not hold yet.
  bool count_fresh(std::size_t b, std::size_t e) {
    if (!count) return true;
    std::size_t fresh = 0;
    const std::size_t step = std::max<std::size_t>(1, s.options.batch_keys);
    for (std::size_t c = b; c < e; c += step)
      s.multi_get(su.data(), c, std::min(e, c + step),
                  [&](std::size_t, const rocksdb::Status& st, const rocksdb::PinnableSlice&) {
                    if (st.IsNotFound())
                      ++fresh;
                    else if (!st.ok())
                      err.set(from_rocksdb(st, s.who + ": push lookup"));
                  });
    added += fresh;
    return !err.failed;
  }

  // Writes su[b, e) as WriteBatches of push_batch_keys rows (into the memtables).
  void write_batch(std::size_t b, std::size_t e) {
    if (err.failed || !count_fresh(b, e)) return;
    const std::size_t width = s.options.row_width;
    // Reserved up front: a batch that grows by doubling copies its rows several times.
    rocksdb::WriteBatch wb((e - b) * (s.value_bytes() + sizeof(Key) + 16) + 64);
    std::uint64_t local_max = 0;
    char kb[sizeof(Key)];
    for (std::size_t j = b; j < e; ++j) {
      const std::size_t i = pos[j];
      const std::uint64_t v = version_of(i);
      local_max = std::max(local_max, v);
      encode_key<Key>(su[j], kb);
      rocksdb::Slice key(kb, sizeof(Key));
      rocksdb::Slice parts[2] = {
          rocksdb::Slice(reinterpret_cast<const char*>(rows + i * width), width * sizeof(float)),
          rocksdb::Slice(reinterpret_cast<const char*>(&v), 8)};
      rocksdb::Status ps =
          wb.Put(s.cf, rocksdb::SliceParts(&key, 1), rocksdb::SliceParts(parts, 2));
      if (!ps.ok()) {
        err.set(from_rocksdb(ps, s.who + ": building a write batch"));
        return;
      }
    }
    rocksdb::Status ws = s.db->db->Write(s.write_options(), &wb);
    if (!ws.ok()) {
      err.set(from_rocksdb(ws, s.who + ": writing " + std::to_string(e - b) + " rows"));
      return;
    }
    saw_version(local_max);
  }

  // Writes su[b, e) as one SST file at `path` (keys ascending, as the file needs them).
  void write_file(std::size_t b, std::size_t e, const std::string& path,
                  const rocksdb::Options& file_options) {
    if (err.failed || !count_fresh(b, e)) return;
    const std::size_t width = s.options.row_width;
    const std::size_t row_bytes = width * sizeof(float);
    rocksdb::SstFileWriter w(rocksdb::EnvOptions(s.db->options), file_options, s.cf);
    rocksdb::Status st = w.Open(path);
    std::vector<char> value(s.value_bytes());
    std::uint64_t local_max = 0;
    char kb[sizeof(Key)];
    for (std::size_t j = b; st.ok() && j < e; ++j) {
      const std::size_t i = pos[j];
      const std::uint64_t v = version_of(i);
      local_max = std::max(local_max, v);
      std::memcpy(value.data(), rows + i * width, row_bytes);
      std::memcpy(value.data() + row_bytes, &v, 8);
      encode_key<Key>(su[j], kb);
      st = w.Put(rocksdb::Slice(kb, sizeof(Key)), rocksdb::Slice(value.data(), value.size()));
    }
    if (st.ok()) st = w.Finish();
    if (!st.ok()) {
      err.set(from_rocksdb(st, s.who + ": writing " + std::to_string(e - b) +
                                   " rows into the SST file '" + path + "'"));
      return;
    }
    saw_version(local_max);
  }

  // Writes every row as SST files of about ingest_file_bytes and ingests them in one step.
  void ingest(std::size_t m) {
    namespace fs = std::filesystem;
    // Ingested files are durable at once. The memtables' earlier rows, and the metadata
    // entry's dirty mark that recovery recounts by, must reach the disk before them.
    rocksdb::FlushOptions fo;
    fo.wait = true;
    std::vector<rocksdb::ColumnFamilyHandle*> cfs{s.cf, s.db->default_cf()};
    status flushed = from_rocksdb(s.db->db->Flush(fo, cfs), s.who + ": flush before an ingest");
    if (!flushed.ok()) return err.set(std::move(flushed));
    const std::string dir = ingest_folder(s.db->path);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return err.set(status::io_error(s.who + ": creating '" + dir + "': " + ec.message()));
    const std::size_t per_file = std::max<std::size_t>(1, ingest_file_bytes / s.value_bytes());
    const std::size_t files = (m + per_file - 1) / per_file;
    // Named by the column family's id, not the table's name: any name is a valid table name.
    const std::string stem = dir + "/cf" + std::to_string(s.cf->GetID()) + "-" +
                             std::to_string(s.ingests.fetch_add(1)) + "-";
    std::vector<std::string> paths(files);
    for (std::size_t f = 0; f < files; ++f) paths[f] = stem + std::to_string(f) + ".sst";
    const rocksdb::Options file_options(s.db->options, s.db->cf_options(s.block_bytes));
    s.for_batches(m, per_file, [&](std::size_t b, std::size_t e) {
      write_file(b, e, paths[b / per_file], file_options);
    });
    if (!err.failed) {
      rocksdb::IngestExternalFileOptions io;
      io.move_files = true;           // linked into the database, not copied
      io.write_global_seqno = false;  // the sequence number lives in the MANIFEST
      rocksdb::Status st = s.db->db->IngestExternalFile(s.cf, paths, io);
      if (!st.ok()) err.set(from_rocksdb(st, s.who + ": ingesting " + std::to_string(m) + " rows"));
    }
    for (const auto& p : paths) fs::remove(p, ec);
  }
};

}  // namespace

template <class Key>
status rocksdb_store<Key>::push(const Key* keys, std::size_t n, const float* rows,
                                const std::uint64_t* versions) {
  auto& s = *state_;
  if (n == 0) return {};
  if (!keys || !rows) return status::invalid_argument(s.who + ": push needs keys and rows");
  std::vector<std::uint64_t> su;
  std::vector<std::uint32_t> pos;
  auto prepared = s.prepare_write(keys, n, su, pos);
  if (!prepared.ok()) return prepared.get_status();
  const std::size_t m = prepared.value();
  const bool count = s.options.count_on_push && !s.count_stale;
  push_job<Key> job{s, su, pos, rows, versions, s.max_version + 1, count, {}, {}, {}};
  const std::size_t ingest_bytes =
      s.options.ingest_bytes ? s.options.ingest_bytes : s.options.write_buffer_bytes;
  const std::size_t vbytes = s.value_bytes();
  // m * vbytes >= ingest_bytes, without the product.
  if (m >= ingest_bytes / vbytes + (ingest_bytes % vbytes != 0)) {
    job.ingest(m);
  } else {
    s.for_batches(m, std::max<std::size_t>(1, s.options.push_batch_keys),
                  [&](std::size_t b, std::size_t e) { job.write_batch(b, e); });
  }
  // A blind push may have added keys: size() counts them when asked. A failed push may have
  // written some rows, so the count is stale either way.
  if (!count || job.err.failed) s.count_stale = true;
  s.count += job.added.load();
  s.max_version = std::max(s.max_version, job.vmax.load());
  return job.err.st;
}

template <class Key>
status rocksdb_store<Key>::erase(const Key* keys, std::size_t n, std::size_t* erased_out) {
  auto& s = *state_;
  if (erased_out) *erased_out = 0;
  if (n == 0) return {};
  if (!keys) return status::invalid_argument(s.who + ": erase needs keys");
  std::vector<std::uint64_t> su;
  std::vector<std::uint32_t> pos;
  auto prepared = s.prepare_write(keys, n, su, pos);
  if (!prepared.ok()) return prepared.get_status();
  const std::size_t m = prepared.value();
  std::atomic<std::size_t> removed{0};
  first_error err;
  const auto wo = s.write_options();
  s.for_read_batches(m, s.options.batch_keys, [&](std::size_t b, std::size_t e) {
    if (err.failed) return;
    rocksdb::WriteBatch batch;
    std::size_t c = 0;
    s.multi_get(su.data(), b, e,
                [&](std::size_t j, const rocksdb::Status& st, const rocksdb::PinnableSlice&) {
                  if (st.ok()) {
                    char kb[sizeof(Key)];
                    encode_key<Key>(su[j], kb);
                    rocksdb::Status ds = batch.Delete(s.cf, rocksdb::Slice(kb, sizeof(Key)));
                    if (!ds.ok()) err.set(from_rocksdb(ds, s.who + ": building a delete batch"));
                    ++c;
                  } else if (!st.IsNotFound()) {
                    err.set(from_rocksdb(st, s.who + ": erase lookup"));
                  }
                });
    if (c == 0 || err.failed) return;
    rocksdb::Status ws = s.db->db->Write(wo, &batch);
    if (!ws.ok()) {
      err.set(from_rocksdb(ws, s.who + ": deleting rows"));
      return;
    }
    removed += c;
  });
  s.count -= std::min(s.count, removed.load());
  if (erased_out) *erased_out = removed.load();
  return err.st;
}

template <class Key>
status rocksdb_store<Key>::scan(bool changed_only, std::uint64_t version, std::size_t batch_size,
                                const store_batch_fn<Key>& fn) {
  auto& s = *state_;
  const std::size_t width = s.options.row_width;
  const std::size_t row_bytes = width * sizeof(float);
  // The count may be stale after blind pushes: the buffers grow up to batch_size as needed.
  const std::size_t cap = std::min(batch_size, std::max<std::size_t>(s.count, 1));
  std::vector<Key> k;
  std::vector<float> r;
  std::vector<std::uint64_t> v;
  k.reserve(cap);
  r.reserve(cap * width);
  v.reserve(cap);
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;  // a full scan would evict the rows that pulls need
  ro.readahead_size = 2 << 20;
  std::unique_ptr<rocksdb::Iterator> it(s.db->db->NewIterator(ro, s.cf));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto key = it->key();
    auto val = it->value();
    if (key.size() != sizeof(Key) || val.size() != s.value_bytes())
      return status::corruption(s.who + ": an entry with a " + std::to_string(key.size()) +
                                "-byte key and a " + std::to_string(val.size()) +
                                "-byte value, expected " + std::to_string(sizeof(Key)) + " and " +
                                std::to_string(s.value_bytes()));
    std::uint64_t ver;
    std::memcpy(&ver, val.data() + row_bytes, 8);
    if (changed_only && ver <= version) continue;
    k.push_back(from_sortable<Key>(decode_key<Key>(key.data())));
    v.push_back(ver);
    r.resize(r.size() + width);
    std::memcpy(r.data() + r.size() - width, val.data(), row_bytes);
    if (k.size() == batch_size) {
      EMBCACHE_RETURN_IF_ERROR(fn(k.data(), r.data(), v.data(), k.size()));
      k.clear();
      r.clear();
      v.clear();
    }
  }
  EMBCACHE_RETURN_IF_ERROR(from_rocksdb(it->status(), s.who + ": iteration"));
  if (!k.empty()) EMBCACHE_RETURN_IF_ERROR(fn(k.data(), r.data(), v.data(), k.size()));
  return {};
}

template <class Key>
status rocksdb_store<Key>::flush() {
  auto& s = *state_;
  EMBCACHE_RETURN_IF_ERROR(s.write_meta(false));
  rocksdb::FlushOptions fo;
  fo.wait = true;
  std::vector<rocksdb::ColumnFamilyHandle*> cfs{s.cf, s.db->default_cf()};
  return from_rocksdb(s.db->db->Flush(fo, cfs), s.who + ": flush");
}

template <class Key>
status rocksdb_store<Key>::checkpoint(const std::string& dir) {
  EMBCACHE_RETURN_IF_ERROR(flush());
  return db_->checkpoint(dir).with_context(state_->who);
}

template class rocksdb_store<std::int64_t>;
template class rocksdb_store<std::uint32_t>;

}  // namespace embcache
