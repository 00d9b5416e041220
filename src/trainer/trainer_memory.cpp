// How much memory a configuration needs: the estimate trainer::create checks against the
// machine's physical memory before it allocates anything, and the cuda path against the device's
// free memory for caches in the cuda space (trainer.hpp: check_memory).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "embcache/criteo.hpp"
#include "embcache/embedding_cache.hpp"
#include "embcache/optimizers.hpp"
#include "embcache/shard.hpp"
#include "embcache/trainer/trainer.hpp"
#include "embcache/training_cache.hpp"
#include "trainer_config_store.hpp"

namespace embcache {
namespace {

// a * b, or false when it does not fit in 64 bits.
bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}
bool checked_add(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_add_overflow(a, b, &out);
}

// One part of the run's memory: the field that sizes it and what it is.
struct memory_part {
  std::string field, what;
  bool overflow = false;
  std::uint64_t bytes = 0;
};

std::string bytes_text(const memory_part& p) {
  return p.overflow ? "more than 2^64 bytes" : std::to_string(p.bytes) + " bytes";
}

// The parts one memory holds, each and together against its `available` bytes: `memory` names it
// ("physical memory", "config.memory_budget_bytes"), `all` the parts in the message about their sum
// ("config: the caches, the dense network and the batch").
status check_parts(const std::vector<memory_part>& parts, std::uint64_t available,
                   const std::string& memory, const std::string& all, status_code code) {
  const std::string limit = ", more than the " + std::to_string(available) + " bytes of " + memory;
  memory_part total;
  for (const memory_part& p : parts) {
    if (p.overflow || p.bytes > available)
      return status(code, p.field + ": " + p.what + " needs " + bytes_text(p) + limit);
    total.overflow = total.overflow || !checked_add(total.bytes, p.bytes, total.bytes);
  }
  if (!total.overflow && total.bytes <= available) return {};
  std::string list;
  for (const memory_part& p : parts)
    list += (list.empty() ? "" : ", ") + p.field + " " + bytes_text(p);
  return status(code, all + " need " + bytes_text(total) + " together (" + list + ")" + limit);
}

// The trainer's tables (int64 keys; the same arrays in both spaces): their bytes per slot and
// per bucket, and a boundary's scratch per slot, come from the table's own arrays.
using trainer_table = embedding_cache<std::int64_t, host_space>;

// The parts of a run that its configuration sizes, before any RocksDB store.
struct run_parts {
  std::vector<memory_part> caches;  // one per table (host_hybrid: none)
  memory_part scratch;              // the largest table's boundary scratch
  bool has_scratch = false;
  std::vector<memory_part> staging;  // keyset mode: prefetch staging and write-behind per table
  memory_part model, batch;
  memory_part data;  // the shard reader's shards in memory (0 bytes when none could be read)
};

// The shard reader holds a whole shard and, reading ahead, the next one (shard_reader), with
// its shuffle order of 8 bytes a record: twice the largest shard of the run, evaluation's
// included. Shards whose header cannot be read now are left out (the pass names them when it
// opens them); passes that still name a dataset folder were not resolved and count nothing.
memory_part data_part(const trainer_config& c) {
  memory_part p;
  p.field = "config.passes";
  std::string largest;
  std::uint64_t largest_bytes = 0;
  auto consider = [&](const std::string& shard) {
    const std::string path = resolve_data_path(c.data_dir, shard);
    auto h = read_shard_header(path);
    if (!h.ok()) return;
    std::uint64_t bytes = 0, order = 0;
    bool ok = checked_mul(h.value().rows, h.value().record_size, bytes);
    if (ok && c.shuffle)
      ok = checked_mul(h.value().rows, 8, order) && checked_add(bytes, order, bytes);
    if (!ok) p.overflow = true;
    if (ok && bytes > largest_bytes) {
      largest_bytes = bytes;
      largest = path;
    }
  };
  for (const trainer_pass_config& pass : c.passes)
    for (const std::string& shard : pass.shards) consider(shard);
  if (!c.eval_shard.empty()) consider(c.eval_shard);
  p.overflow = p.overflow || !checked_mul(largest_bytes, 2, p.bytes);
  p.what = "the shard reader's two shards in memory (the largest: '" + largest + "', " +
           std::to_string(largest_bytes) + " bytes" + (c.shuffle ? " with its shuffle order" : "") +
           ")";
  return p;
}

}  // namespace

bool moves_staged_rows(const trainer_config& c, bool caches_on_device) {
  if (c.mode != trainer_mode::keyset || !c.prefetch) return false;
  // The training cache's own default for the space the caches are in (one home for the rule).
  training_cache_options o;
  o.move_staged_rows = c.move_staged_rows;
  return caches_on_device ? resolved_move_staged_rows<cuda_space>(o)
                          : resolved_move_staged_rows<host_space>(o);
}

namespace {

run_parts parts_of(const trainer_config& c, bool caches_on_device) {
  run_parts r;
  std::uint64_t largest_slots = 0;
  std::uint64_t dim = 16;  // the deep table's
  for (const auto& tc : c.tables)
    if (tc.name == "deep") dim = tc.dim;

  // The caches (host_hybrid keeps a one-row cache per table): the tables' real arrays
  // (embedding_cache::bytes_per_slot, bytes_per_bucket) and, when moves_staged_rows(), their
  // spare rows as the training cache sizes them (training_cache_options::move_staged_rows: each
  // table's share of staging_bytes, tables in order, at most twice its capacity).
  const bool moved = moves_staged_rows(c, caches_on_device);
  std::uint64_t spare_left = moved ? detail::cache_memory_of(c).staging_bytes : 0;
  if (c.mode != trainer_mode::host_hybrid)
    for (std::size_t t = 0; t < c.tables.size(); ++t) {
      const trainer_table_config& tc = c.tables[t];
      memory_part p;
      p.field = "config.tables[" + std::to_string(t) + "]." + (tc.slots ? "slots" : "capacity");
      // The training cache's table (table_slots), rounded up to whole buckets.
      constexpr std::uint64_t bucket = trainer_table::bucket_size;
      std::uint64_t slots = 0;
      // (A dim past 2^32 counts as overflow: the row's bytes would not fit.)
      bool ok = tc.dim < (std::uint64_t{1} << 32) && table_slots(tc.capacity, tc.slots, &slots);
      ok = ok && checked_add(slots, bucket - 1, slots);
      slots = slots / bucket * bucket;
      cache_options co;
      co.dim = tc.dim;
      co.state_width = state_width(tc.optimizer.kind, tc.dim);
      const std::uint64_t row = (std::uint64_t{tc.dim} + co.state_width) * sizeof(float);
      if (ok && spare_left >= row) {
        co.spare_rows = std::min(tc.capacity > UINT64_MAX / 2 ? tc.capacity : 2 * tc.capacity,
                                 spare_left / row);
        spare_left -= co.spare_rows * row;  // <= spare_left
      }
      const std::uint64_t per_slot = trainer_table::bytes_per_slot(co);
      std::uint64_t buckets = 0;
      ok = ok && checked_mul(slots, per_slot, p.bytes) &&
           checked_mul(slots / bucket, trainer_table::bytes_per_bucket, buckets) &&
           checked_add(p.bytes, buckets, p.bytes) &&
           checked_add(p.bytes, co.spare_rows * row, p.bytes);
      p.overflow = !ok;
      p.what = "the cache of table \"" + tc.name + "\" (" +
               (ok ? std::to_string(slots) + " slots of " + std::to_string(per_slot) + " bytes"
                   : std::to_string(tc.slots ? tc.slots : tc.capacity) +
                         (tc.slots ? " slots" : " rows")) +
               (ok && co.spare_rows ? ", " + std::to_string(co.spare_rows) + " spare rows of " +
                                          std::to_string(row) + " bytes"
                                    : std::string()) +
               ")";
      // At a pass boundary the largest table's select_victims / export_if hold scratch per slot
      // beside the tables (one table at a time; the pool keeps it for the next boundary).
      if (ok && slots > largest_slots) {
        largest_slots = slots;
        r.has_scratch = true;
        memory_part& scratch = r.scratch;
        scratch.field = p.field + " (boundary scratch)";
        scratch.what = "the pass boundary's scratch for table \"" + tc.name + "\" (" +
                       std::to_string(slots) + " slots of " +
                       std::to_string(trainer_table::scratch_bytes_per_slot) + " bytes)";
        scratch.bytes = slots * trainer_table::scratch_bytes_per_slot;  // < the table's bytes
      }
      r.caches.push_back(p);
    }
  // The MLP: parameters, gradients and two Adam moments, 16 bytes per parameter.
  {
    memory_part p;
    p.field = "config.model.hidden";
    p.what = "the dense network's parameters, gradients and Adam state";
    std::uint64_t in = 0, params = 0;
    bool ok = checked_mul(c.num_slots, dim, in) && checked_add(in, c.num_dense, in);
    std::vector<std::uint64_t> widths(c.model.hidden.begin(), c.model.hidden.end());
    widths.push_back(1);
    for (std::uint64_t w : widths) {
      std::uint64_t layer = 0;
      ok = ok && checked_mul(in, w, layer) && checked_add(layer, w, layer) &&
           checked_add(params, layer, params);
      in = w;
    }
    ok = ok && checked_mul(params, 16, p.bytes);
    p.overflow = !ok;
    r.model = p;
  }
  // One batch: the pooled inputs and their gradients, and each hidden layer's activations and
  // deltas, 4 bytes each.
  {
    memory_part p;
    p.field = "config.batch_size";
    p.what = "the buffers of one batch of " + std::to_string(c.batch_size) + " samples";
    std::uint64_t per_sample = 0, deep = 0;
    bool ok = checked_mul(c.num_slots, dim, deep) &&
              checked_add(deep, c.num_slots + criteo_cross_count + c.num_dense, per_sample) &&
              checked_mul(per_sample, 2, per_sample);
    for (std::uint64_t w : c.model.hidden) {
      std::uint64_t two = 0;
      ok = ok && checked_mul(w, 2, two) && checked_add(per_sample, two, per_sample);
    }
    ok = ok && checked_mul(per_sample, 4, per_sample) &&
         checked_mul(per_sample, c.batch_size, p.bytes);
    p.overflow = !ok;
    r.batch = p;
  }
  r.data = data_part(c);
  // Keyset mode, as the training cache reserves it with the options the run gives it
  // (cache_memory_of): the rows the prefetch stages, within staging_bytes over the tables in
  // order, a capacity's rows at most each; per table the staging's keys (the keyset, the missing
  // keys with their versions and found flags, the unstaged and the still missing ones: 41 bytes a
  // key) and the write-behind buffers of write_back_bytes of rows each with their keys and
  // versions (the one pushed, a recycled one and, with prefetch, the worker's gather buffer), and
  // two batches of prefetch_batch rows: the worker's (its early eviction's and its early
  // insert's), then, once it is done, the boundary's chunk of missing rows and of those it pulls.
  //
  // When moves_staged_rows() with the caches on the host, the caches' spare rows are the
  // staging (counted with the caches): the worker stages one batch at a time into them.
  if (c.mode == trainer_mode::keyset) {
    const detail::cache_memory_options m = detail::cache_memory_of(c);
    const bool in_spare_rows = moved && !caches_on_device;
    memory_part rows;
    rows.field = "config.staging_bytes";
    std::uint64_t left = m.staging_bytes, staged_rows = 0;
    for (std::size_t t = 0; t < c.tables.size(); ++t) {
      const trainer_table_config& tc = c.tables[t];
      memory_part p;
      p.field = "config.tables[" + std::to_string(t) + "].capacity (staging)";
      std::uint64_t row = 0, keys = 0, chunk = 0, buffers = 0, batch = 0;
      bool ok = tc.dim < (std::uint64_t{1} << 32) &&
                checked_add(tc.dim, state_width(tc.optimizer.kind, tc.dim), row) &&
                checked_mul(row, sizeof(float), row);
      if (ok && c.prefetch) {
        const std::uint64_t n = in_spare_rows
                                    ? std::min<std::uint64_t>(tc.capacity, m.prefetch_batch)
                                    : std::min<std::uint64_t>(tc.capacity, left / row);
        if (!in_spare_rows) left -= n * row;  // n * row <= left
        staged_rows += n;
        rows.bytes += n * row;
        ok = checked_mul(tc.capacity, 41, keys);
      }
      if (ok) {
        batch = std::min<std::uint64_t>(m.prefetch_batch, tc.capacity);
        ok = checked_mul(batch, 2 * row, batch);
      }
      if (ok) {
        chunk = std::min<std::uint64_t>(tc.capacity,
                                        std::max<std::uint64_t>(1, m.write_back_bytes / row));
        ok = checked_mul(chunk, (c.prefetch ? 3 : 2) * row + 16, buffers) &&
             checked_add(keys, buffers, p.bytes) && checked_add(p.bytes, batch, p.bytes);
      }
      p.overflow = !ok;
      p.what = std::string("the ") + (c.prefetch ? "prefetch staging's keys and " : "") +
               "write-behind buffers of table \"" + tc.name + "\" (" +
               std::to_string(c.prefetch ? 3 : 2) + " buffers of " + std::to_string(chunk) +
               " rows, config.write_back_bytes " + std::to_string(m.write_back_bytes) + ")";
      r.staging.push_back(p);
    }
    if (c.prefetch) {
      rows.what = "the prefetch staging's " + std::to_string(staged_rows) + " rows " +
                  (in_spare_rows ? "(a batch per table, the rest in the caches' spare rows)"
                                 : "(at most " + std::to_string(m.staging_bytes) + " bytes)");
      r.staging.insert(r.staging.begin(), rows);
    }
  }
  return r;
}

// The memory of one RocksDB database: its block cache and every memtable of its column families
// (its tables and the default one), as the trainer opens it.
memory_part rocksdb_part(const detail::rocksdb_database_use& d, std::uint64_t block_cache,
                         std::uint64_t write_buffer, int max_write_buffers) {
  memory_part p;
  p.field = "config.tables[" + std::to_string(d.first_table) + "].store_path";
  const std::uint64_t memtables =
      std::uint64_t(d.tables + 1) * std::uint64_t(std::max(2, max_write_buffers));
  std::uint64_t bytes = 0;
  p.overflow =
      !checked_mul(memtables, write_buffer, bytes) || !checked_add(bytes, block_cache, p.bytes);
  p.what = "the RocksDB database at '" + d.path + "' (block cache " + std::to_string(block_cache) +
           " bytes, " + std::to_string(memtables) + " memtables of " +
           std::to_string(write_buffer) + " bytes)";
  return p;
}

// The DRAM tiers of a fixed size (tables[i].dram_tier_bytes) and the admission sketches.
std::vector<memory_part> dram_tier_parts(const trainer_config& c) {
  std::vector<memory_part> parts;
  for (std::size_t t = 0; t < c.tables.size(); ++t)
    if (c.tables[t].dram_tier_bytes != 0 && !c.tables[t].dram_tier_auto) {
      memory_part p;
      p.field = "config.tables[" + std::to_string(t) + "].dram_tier_bytes";
      p.what = "the DRAM tier of table \"" + c.tables[t].name + "\"";
      p.bytes = c.tables[t].dram_tier_bytes;
      parts.push_back(p);
    }
  // Feature admission's sketches (4 bytes a counter; the product is checked at validation).
  for (std::size_t t = 0; t < c.tables.size(); ++t)
    if (c.tables[t].admission.enabled()) {
      const admission_options& a = c.tables[t].admission;
      memory_part p;
      p.field = "config.tables[" + std::to_string(t) + "].admission";
      p.what = "the admission sketch of table \"" + c.tables[t].name + "\"";
      p.bytes = a.sketch_width * a.sketch_depth * 4;
      parts.push_back(p);
    }
  return parts;
}

// The log stores' indexes, each sized for its tables[i].store_rows up front, with their write
// and read buffers (log_store::memory_bound; the trainer's keys are int64).
std::vector<memory_part> log_store_parts(const trainer_config& c) {
  std::vector<memory_part> parts;
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    if (c.tables[t].store != "log") continue;
    memory_part p;
    p.field = "config.tables[" + std::to_string(t) + "].store_rows";
    p.what = "the log store index of table \"" + c.tables[t].name + "\" (" +
             std::to_string(c.tables[t].store_rows) + " rows)";
    p.bytes = log_store<std::int64_t>::memory_bound(
        static_cast<std::size_t>(c.tables[t].store_rows), detail::log_options_of(c, t));
    parts.push_back(p);
  }
  return parts;
}

std::uint64_t sum_of(const std::vector<memory_part>& parts) {
  std::uint64_t sum = 0;
  for (const memory_part& p : parts) sum += p.bytes;  // checked against the budget first
  return sum;
}

}  // namespace

std::uint64_t physical_memory_bytes() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  std::uint64_t bytes = 0;
  if (pages <= 0 || page <= 0 || !checked_mul(std::uint64_t(pages), std::uint64_t(page), bytes))
    return std::numeric_limits<std::uint64_t>::max();
  return bytes;
}

status check_memory(const trainer_config& c, std::uint64_t available_bytes) {
  memory_budget budget;
  budget.host_bytes = available_bytes;
  return check_memory(c, budget);
}

status check_memory(const trainer_config& c, const memory_budget& budget) {
  const run_parts r = parts_of(c, budget.caches_on_device);
  std::vector<memory_part> caches = r.caches;
  if (c.memory_budget_bytes != 0) {
    // The budget replaces the estimate: it must fit in the machine, and its plan must hold.
    if (c.memory_budget_bytes > budget.host_bytes)
      return status::capacity_exceeded(
          "config.memory_budget_bytes: " + std::to_string(c.memory_budget_bytes) +
          " bytes is more than the " + std::to_string(budget.host_bytes) +
          " bytes of physical memory");
    auto plan = plan_trainer_memory(c, budget.caches_on_device);
    if (!plan.ok()) return plan.get_status();
  } else {
    std::vector<memory_part> parts;
    if (!budget.caches_on_device) parts = caches;
    parts.push_back(r.model);
    parts.push_back(r.batch);
    if (r.data.bytes != 0 || r.data.overflow) parts.push_back(r.data);
    const rocksdb_store_options defaults;
    const auto databases = detail::rocksdb_databases_of(c);
    for (const memory_part& p : dram_tier_parts(c)) parts.push_back(p);
    for (const memory_part& p : log_store_parts(c)) parts.push_back(p);
    for (const auto& d : databases)
      parts.push_back(rocksdb_part(d, defaults.block_cache_bytes, defaults.write_buffer_bytes,
                                   defaults.max_write_buffers));
    std::string all = budget.caches_on_device ? "config: the dense network"
                                              : "config: the caches, the dense network";
    all += databases.empty() ? " and the batch" : ", the batch and the RocksDB stores";
    EMBCACHE_RETURN_IF_ERROR(check_parts(parts, budget.host_bytes, "physical memory", all,
                                         status_code::capacity_exceeded));
  }
  if (!budget.caches_on_device) return {};
  if (r.has_scratch) caches.push_back(r.scratch);
  return check_parts(caches, budget.device_bytes, "free device memory",
                     "config.tables: the caches and a pass boundary's scratch",
                     status_code::out_of_device_memory);
}

result<memory_plan> plan_trainer_memory(const trainer_config& c, bool caches_on_device) {
  const std::string field = "config.memory_budget_bytes";
  if (c.memory_budget_bytes == 0) return status::invalid_argument(field + ": not set (0)");
  const run_parts r = parts_of(c, caches_on_device);
  std::vector<memory_part> caches, staging = r.staging, other = dram_tier_parts(c);
  for (const memory_part& p : log_store_parts(c)) other.push_back(p);
  other.push_back(r.model);
  other.push_back(r.batch);
  if (r.data.bytes != 0 || r.data.overflow) other.push_back(r.data);
  if (!caches_on_device) {
    caches = r.caches;
    if (r.has_scratch) caches.push_back(r.scratch);
  }
  std::vector<memory_part> fixed = caches;
  fixed.insert(fixed.end(), staging.begin(), staging.end());
  fixed.insert(fixed.end(), other.begin(), other.end());
  EMBCACHE_RETURN_IF_ERROR(check_parts(fixed, c.memory_budget_bytes, field,
                                       "config: the caches, the staging, the dense network and "
                                       "the batch",
                                       status_code::capacity_exceeded));
  memory_plan_options o;
  o.budget_bytes = c.memory_budget_bytes;
  o.cache_bytes = sum_of(caches);
  o.staging_bytes = sum_of(staging);
  o.other_bytes = sum_of(other);
  for (const auto& d : detail::rocksdb_databases_of(c)) o.rocksdb_column_families += d.tables + 1;
  for (const auto& tc : c.tables) o.dram_tier = o.dram_tier || tc.dram_tier_auto;
  o.field = field;
  return plan_memory(o);
}

}  // namespace embcache
