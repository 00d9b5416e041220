// The run's memory budget (config.memory_budget_bytes): read, written and range-checked like
// every field; a budget too small refused before any work, naming the field and the bytes
// needed; RocksDB's block cache and memtables counted and sized from it; and a store's disk that
// fills during a pass: out_of_space, and the last save still loads.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "embedding_path.hpp"
#include "store/store_test_util.hpp"
#include "trainer_test_support.hpp"

namespace embcache::test {
namespace {

constexpr std::uint64_t mib = std::uint64_t{1} << 20;

TEST(trainer_memory_budget, the_field_round_trips_and_its_range_is_named) {
  json j = {{"passes", {{"a.bin"}}}, {"memory_budget_bytes", 1610612736}};
  auto c = trainer_config_from_json(j);
  EMBCACHE_ASSERT_OK(c);
  EXPECT_EQ(c.value().memory_budget_bytes, 1610612736u);
  json back;
  to_json(back, c.value());
  EXPECT_EQ(back.at("memory_budget_bytes"), 1610612736u);
  auto again = trainer_config_from_json(back);
  EMBCACHE_ASSERT_OK(again);
  EXPECT_EQ(again.value().memory_budget_bytes, 1610612736u);
  // The default: none, written as 0.
  to_json(back, trainer_config{});
  EXPECT_EQ(back.at("memory_budget_bytes"), 0u);
  for (const json& bad :
       {json(-1), json(1.5e9), json("1.5GiB"), json((std::uint64_t{1} << 50) + 1)}) {
    j["memory_budget_bytes"] = bad;
    auto r = trainer_config_from_json(j);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.get_status().message(),
              "config.memory_budget_bytes: expected an integer in [0, 1125899906842624], got " +
                  bad.dump());
  }
  trainer_config direct = c.value();
  direct.memory_budget_bytes = (std::uint64_t{1} << 50) + 1;
  EXPECT_EQ(validate(direct).message(),
            "config.memory_budget_bytes: expected an integer in [0, 1125899906842624], got "
            "1125899906842625");
}

trainer_config rocksdb_config(const std::string& path) {
  trainer_config c;
  c.passes = {{{"a.bin"}}};
  c.tables[0].capacity = 1000;     // wide: 1,280 slots of (1 + 2) * 4 + 45 bytes
  c.tables[1].capacity = 1 << 20;  // deep: 1,310,720 slots of (16 + 32) * 4 + 45 bytes
  c.tables[1].store = "rocksdb";
  c.tables[1].store_path = path;
  // Staged rows copied: the counts below. Moved (the host's default): spare_rows_count_with_...
  c.move_staged_rows = false;
  return c;
}

TEST(trainer_memory_budget, rocksdb_block_cache_and_memtables_count_against_physical_memory) {
  trainer_config c = rocksdb_config("/no/such/db");
  c.tables[0].capacity = 1 << 20;  // wide: 1,310,720 slots
  // The deep cache (310,681,600 bytes) and the wide one fit; the database's default block cache
  // (1 GiB) and 2 column families of 4 memtables of 256 MiB do not.
  status s = check_memory(c, std::uint64_t{2} << 30);
  EXPECT_EQ(s.code(), status_code::capacity_exceeded);
  EXPECT_EQ(s.message(),
            "config.tables[1].store_path: the RocksDB database at '/no/such/db' (block cache "
            "1073741824 bytes, 8 memtables of 268435456 bytes) needs 3221225472 bytes, more than "
            "the 2147483648 bytes of physical memory");
  // Both tables on the database: 3 column families, named for the first table on it.
  c.tables[0].store = "rocksdb";
  c.tables[0].store_path = "/no/such/db";
  s = check_memory(c, std::uint64_t{3} << 30);
  EXPECT_EQ(s.message(),
            "config.tables[0].store_path: the RocksDB database at '/no/such/db' (block cache "
            "1073741824 bytes, 12 memtables of 268435456 bytes) needs 4294967296 bytes, more than "
            "the 3221225472 bytes of physical memory");
  // Each part fits, not all together.
  s = check_memory(c, std::uint64_t{4} << 30);
  EXPECT_EQ(s.message(),
            "config: the caches, the dense network, the batch and the RocksDB stores need "
            "4724867088 bytes together (config.tables[0].capacity 74752000 bytes, "
            "config.tables[1].capacity 310681600 bytes, config.model.hidden 23855120 bytes, "
            "config.batch_size 20611072 bytes, config.tables[0].store_path 4294967296 bytes), more "
            "than the 4294967296 bytes of physical memory");
  EMBCACHE_EXPECT_OK(check_memory(c, std::uint64_t{8} << 30));
}

TEST(trainer_memory_budget, a_budget_too_small_is_refused_before_any_work) {
  const std::string dir = temp_dir("budget_small");
  trainer_config c = rocksdb_config(dir + "/db");
  c.memory_budget_bytes = 64 * mib;  // less than the deep cache alone
  auto t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::capacity_exceeded);
  EXPECT_EQ(t.get_status().message(),
            "config.tables[1].capacity: the cache of table \"deep\" (1310720 slots of 237 bytes) "
            "needs 310681600 bytes, more than the 67108864 bytes of config.memory_budget_bytes");
  EXPECT_FALSE(fs::exists(dir + "/db"));  // nothing opened, nothing allocated
  // Each part fits; the caches, their boundary scratch, the prefetch staging and write-behind,
  // the network and the batch do not leave RocksDB its least (8 MiB of block cache and 2
  // column families of 2 memtables of 1 MiB) with the 10% reserve.
  auto plan = plan_trainer_memory(rocksdb_config(dir + "/db"), false);
  EXPECT_EQ(plan.get_status().message(), "config.memory_budget_bytes: not set (0)");
  c.memory_budget_bytes = 2048 * mib;
  // Given, not derived from the budget (a quarter and a 32nd of it), so that the bytes needed
  // below do not move with the budget.
  c.staging_bytes = 512 * mib;
  c.write_back_bytes = 64 * mib;
  auto ok = plan_trainer_memory(c);
  EMBCACHE_ASSERT_OK(ok);
  const memory_plan& m = ok.value();
  const std::uint64_t fixed = m.cache_bytes + m.staging_bytes + m.other_bytes;
  // The deep cache and its scratch are in cache_bytes. The staging, as the cache reserves it
  // with 512 MiB for staging and 64 MiB per write-back: the
  // rows of both capacities (wide 3 floats, deep 48), 41 bytes of keys per key, three write-behind
  // buffers (wide: its 1000 rows; deep: 349,525 rows of 192 bytes) with 16 bytes of key and
  // version a row, and two batches of 16384 rows for the worker.
  EXPECT_EQ(m.staging_bytes, 1000u * 12 + (1u << 20) * 192 + (1000u + (1u << 20)) * 41 +
                                 1000u * (3 * 12 + 16) + 349525u * (3 * 192 + 16) + 2 * 1000u * 12 +
                                 2 * 16384u * 192);
  EXPECT_EQ(m.max_write_buffers, 2);
  EXPECT_EQ(m.memtable_bytes, 4 * m.write_buffer_bytes);
  EXPECT_LE(m.total_bytes(), c.memory_budget_bytes);
  const std::uint64_t needed = ((fixed + 12 * mib) * 100 + 89) / 90;
  c.memory_budget_bytes = needed - 1;
  t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::capacity_exceeded);
  EXPECT_EQ(t.get_status().message().rfind(
                "config.memory_budget_bytes: " + std::to_string(needed - 1) +
                    " bytes is less than the " + std::to_string(needed) + " bytes needed (caches ",
                0),
            0u)
      << t.get_status().message();
  EXPECT_FALSE(fs::exists(dir + "/db"));
  c.memory_budget_bytes = needed;
  EMBCACHE_EXPECT_OK(check_memory(c, std::uint64_t{1} << 40));
  // More than the machine has.
  EXPECT_EQ(check_memory(c, needed - 1).message(),
            "config.memory_budget_bytes: " + std::to_string(needed) + " bytes is more than the " +
                std::to_string(needed - 1) + " bytes of physical memory");
}

TEST(trainer_memory_budget, staging_and_write_back_fields_round_trip_and_their_ranges_are_named) {
  for (const char* field : {"staging_bytes", "write_back_bytes"}) {
    json j = {{"passes", {{"a.bin"}}}, {field, 1 << 20}};
    auto c = trainer_config_from_json(j);
    EMBCACHE_ASSERT_OK(c);
    json back;
    to_json(back, c.value());
    EXPECT_EQ(back.at(field), 1u << 20);
    to_json(back, trainer_config{});
    EXPECT_EQ(back.at(field), 0u);  // the default: from the budget, or the cache's own
    for (const json& bad : {json(-1), json("1MiB"), json((std::uint64_t{1} << 50) + 1)}) {
      j[field] = bad;
      EXPECT_EQ(trainer_config_from_json(j).get_status().message(),
                std::string("config.") + field +
                    ": expected an integer in [0, 1125899906842624], got " + bad.dump());
    }
  }
  trainer_config direct;
  direct.passes = {{{"a.bin"}}};
  direct.staging_bytes = (std::uint64_t{1} << 50) + 1;
  EXPECT_EQ(validate(direct).message(),
            "config.staging_bytes: expected an integer in [0, 1125899906842624], got "
            "1125899906842625");
}

// The staging the plan counts is what the training cache is given and reserves: its rows within
// config.staging_bytes (tables in order, a capacity's rows at most each), the keys, and the
// write-behind buffers of config.write_back_bytes.
TEST(trainer_memory_budget, the_staging_counted_is_what_the_cache_reserves) {
  trainer_config c = rocksdb_config("/no/such/db");
  c.tables[1].store = "host";  // build_embedding_stores below opens no database
  c.memory_budget_bytes = 2048 * mib;
  c.staging_bytes = 1000 * 12 + 5000 * 192;  // every wide row, 5000 deep ones
  c.write_back_bytes = 300 * 192;            // wide: its 1000 rows (4800 fit); deep: 300 rows
  auto plan = plan_trainer_memory(c);
  EMBCACHE_ASSERT_OK(plan);
  const std::uint64_t wide = 1000u * 41 + 1000u * (3 * 12 + 16) + 2 * 1000u * 12;
  const std::uint64_t deep = (1u << 20) * 41u + 300u * (3 * 192 + 16) + 2 * 16384u * 192;
  EXPECT_EQ(plan.value().staging_bytes, c.staging_bytes + wide + deep);
  // Without prefetch: no staging, two write-behind buffers, and the boundary's two batches.
  c.prefetch = false;
  plan = plan_trainer_memory(c);
  EMBCACHE_ASSERT_OK(plan);
  EXPECT_EQ(plan.value().staging_bytes,
            1000u * (2 * 12 + 16) + 300u * (2 * 192 + 16) + 2 * 1000u * 12 + 2 * 16384u * 192);
  c.prefetch = true;
  // The training cache gets the same options.
  auto stores = detail::build_embedding_stores(c, host_space{}, false);
  EMBCACHE_ASSERT_OK(stores);
  EXPECT_EQ(stores.value().options.staging_bytes, c.staging_bytes);
  EXPECT_EQ(stores.value().options.write_back_bytes, c.write_back_bytes);
  EXPECT_EQ(stores.value().options.prefetch_batch, 16384u);
  // Unset, they come from the budget; without a budget they are the cache's defaults.
  c.staging_bytes = c.write_back_bytes = 0;
  stores = detail::build_embedding_stores(c, host_space{}, false);
  EMBCACHE_ASSERT_OK(stores);
  EXPECT_EQ(stores.value().options.staging_bytes, 512 * mib);
  EXPECT_EQ(stores.value().options.write_back_bytes, 64 * mib);
  c.memory_budget_bytes = 0;
  stores = detail::build_embedding_stores(c, host_space{}, false);
  EMBCACHE_ASSERT_OK(stores);
  const training_cache_options defaults;
  EXPECT_EQ(stores.value().options.staging_bytes, defaults.staging_bytes);
  EXPECT_EQ(stores.value().options.write_back_bytes, defaults.write_back_bytes);
  EXPECT_EQ(stores.value().options.prefetch_batch, defaults.prefetch_batch);
}

// config.move_staged_rows: each cache's spare rows (its share of staging_bytes, tables in order,
// at most twice its capacity) and its row index per slot count with the caches, as many bytes as
// the training cache then allocates more.
TEST(trainer_memory_budget, spare_rows_count_with_the_caches_as_the_cache_allocates_them) {
  trainer_config c = rocksdb_config("/no/such/db");
  c.tables[1].store = "host";  // build_embedding_tables below opens no database
  c.tables[1].capacity = 20000;
  c.memory_budget_bytes = 2048 * mib;
  const auto cache_bytes = [](const trainer_config& config) {
    auto plan = plan_trainer_memory(config);
    EMBCACHE_EXPECT_OK(plan);
    return plan.ok() ? plan.value().cache_bytes : 0;
  };
  const auto allocated = [](const trainer_config& config) {
    auto tables = detail::build_embedding_tables(config, host_space{}, false);
    EMBCACHE_EXPECT_OK(tables);
    std::size_t bytes = 0;
    if (tables.ok())
      for (std::size_t t = 0; t < config.tables.size(); ++t)
        bytes += tables.value().cache->cache(t).allocated_bytes();
    return bytes;
  };
  const std::uint64_t planned = cache_bytes(c), held = allocated(c);
  // Room for every spare row: wide 2 * 1,000 rows of 12 bytes, deep 2 * 20,000 of 192; a row
  // index of 4 bytes per slot (1,280 and 25,088 slots).
  c.move_staged_rows = true;
  c.staging_bytes = 2000 * 12 + 40000 * 192 + 100;
  const std::uint64_t spare = 2000 * 12 + 40000 * 192 + (1280 + 25088) * 4;
  EXPECT_EQ(cache_bytes(c), planned + spare);
  EXPECT_EQ(allocated(c), held + spare);
  // On the host the spare rows are the staging: the staging counts one batch of 16384 rows per
  // table (wide: its 1000 rows; deep 16384 of 192 bytes) instead of the 1000 + 20000 rows staged
  // otherwise; on the device the staging stays in host memory.
  const auto staging = [](const trainer_config& config, bool on_device) {
    auto plan = plan_trainer_memory(config, on_device);
    EMBCACHE_EXPECT_OK(plan);
    return plan.ok() ? plan.value().staging_bytes : 0;
  };
  trainer_config copied = c;
  copied.move_staged_rows = false;
  EXPECT_EQ(staging(c, false) + 20000 * 192, staging(copied, false) + 16384 * 192);
  EXPECT_EQ(staging(c, true), staging(copied, true));
  // Unset, the plan moves them with the caches on the host and copies them on the device.
  trainer_config unset = c;
  unset.move_staged_rows.reset();
  EXPECT_EQ(cache_bytes(unset), cache_bytes(c));
  EXPECT_EQ(allocated(unset), allocated(c));
  EXPECT_EQ(staging(unset, false), staging(c, false));
  EXPECT_EQ(staging(unset, true), staging(copied, true));
  EXPECT_EQ(plan_trainer_memory(unset, true).value().cache_bytes,
            plan_trainer_memory(copied, true).value().cache_bytes);
  // Room for part of them: the wide table's 2,000 first, the deep table what is left.
  c.staging_bytes = 2000 * 12 + 777 * 192 + 191;
  const std::uint64_t part = 2000 * 12 + 777 * 192 + (1280 + 25088) * 4;
  EXPECT_EQ(cache_bytes(c), planned + part);
  EXPECT_EQ(allocated(c), held + part);
  // The message of a cache too large names its spare rows.
  c.memory_budget_bytes = 4 * mib;
  // (241 bytes a slot: 192 of row, 45 of metadata, 4 of row index; 196 buckets of 4 bytes.)
  const std::uint64_t deep = 25088 * 241 + 196 * 4 + 777 * 192;
  EXPECT_EQ(plan_trainer_memory(c).get_status().message(),
            "config.tables[1].capacity: the cache of table \"deep\" (25088 slots of 241 bytes, 777 "
            "spare rows of 192 bytes) needs " +
                std::to_string(deep) +
                " bytes, more than the 4194304 bytes of "
                "config.memory_budget_bytes");
}

// The shard reader holds a shard and the one it reads ahead: twice the run's largest shard (the
// eval shard's included, with its shuffle order of 8 bytes a record) are counted with the dense
// network and the batch, and named when they do not fit.
TEST(trainer_memory_budget, the_shard_readers_two_shards_are_counted) {
  trainer_config c = rocksdb_config("/no/such/db");
  c.tables[1].store = "host";
  c.memory_budget_bytes = 2048 * mib;
  auto none = plan_trainer_memory(c);  // "a.bin" is not there: nothing to count
  EMBCACHE_ASSERT_OK(none);
  c.data_dir = dataset();
  c.passes = {{{shard(0), shard(1)}}, {{shard(2)}}};
  c.eval_shard = shard(5);
  std::uint64_t largest = 0, rows = 0;
  for (int i : {0, 1, 2, 5}) {
    auto h = read_shard_header(c.data_dir + "/" + shard(i));
    EMBCACHE_ASSERT_OK(h);
    if (h.value().rows * h.value().record_size > largest) {
      largest = h.value().rows * h.value().record_size;
      rows = h.value().rows;
    }
  }
  ASSERT_GT(largest, 0u);
  auto counted = plan_trainer_memory(c);
  EMBCACHE_ASSERT_OK(counted);
  EXPECT_EQ(counted.value().other_bytes, none.value().other_bytes + 2 * largest);
  c.shuffle = true;
  counted = plan_trainer_memory(c);
  EMBCACHE_ASSERT_OK(counted);
  EXPECT_EQ(counted.value().other_bytes, none.value().other_bytes + 2 * (largest + 8 * rows));
  // Without a budget, against the machine: the part is listed where every part fits alone but
  // not all together (raised to each part that does not fit alone, in turn).
  c.memory_budget_bytes = 0;
  std::uint64_t machine = 1;
  status s = check_memory(c, machine);
  for (int i = 0; i < 10 && s.message().find(" together ") == std::string::npos; ++i) {
    const auto at = s.message().find(" needs ");
    ASSERT_NE(at, std::string::npos) << s.message();
    machine = std::stoull(s.message().substr(at + 7));
    s = check_memory(c, machine);
  }
  EXPECT_EQ(s.code(), status_code::capacity_exceeded);
  EXPECT_NE(
      s.message().find(", config.passes " + std::to_string(2 * (largest + 8 * rows)) + " bytes"),
      std::string::npos)
      << s.message();
}

// The builders name what they allocate: a std::bad_alloc while building a part is a
// capacity_exceeded status naming it (the training cache: every table with its capacity), and
// anything else passes through unchanged.
TEST(trainer_memory, a_part_out_of_memory_is_a_status_naming_it) {
  const status s = detail::allocating("config.model: the dense network",
                                      []() -> status { throw std::bad_alloc(); });
  EXPECT_EQ(s.code(), status_code::capacity_exceeded);
  EXPECT_EQ(s.message(),
            "config.model: the dense network: out of memory (std::bad_alloc) while allocating it; "
            "lower the capacity or the model size");
  EXPECT_EQ(detail::allocating("x", []() -> status { return status::not_found("y"); }).to_string(),
            status::not_found("y").to_string());
  const result<int> r = detail::allocating("x", []() -> result<int> { return 7; });
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(r.value(), 7);
  trainer_config c;
  c.tables[1].capacity = 4096;
  auto stores = detail::build_embedding_stores(c, host_space{}, false);
  EMBCACHE_ASSERT_OK(stores);
  EXPECT_EQ(detail::training_cache_field(stores.value().tables),
            "config.tables: the training cache of table \"wide\" (config.tables[0].capacity "
            "1048576) and table \"deep\" (config.tables[1].capacity 4096)");
}

TEST(trainer_log_store, the_field_is_checked_and_trains_the_host_stores_model) {
  json j = {{"passes", {{"a.bin"}}}, {"tables", {{{"name", "wide"}}, {{"name", "deep"}}}}};
  j["tables"][1]["store"] = "log";
  EXPECT_EQ(trainer_config_from_json(j).get_status().message(),
            "config.tables[1].store_path: required with store \"log\"");
  j["tables"][1]["store"] = "disk";
  EXPECT_EQ(trainer_config_from_json(j).get_status().message(),
            "config.tables[1].store: \"disk\" is not a store (\"host\", \"rocksdb\" or \"log\")");
  j["tables"][1]["store"] = "log";
  j["tables"][1]["store_path"] = "/logs";
  j["tables"][1]["store_block_bytes"] = 4096;
  EXPECT_NE(trainer_config_from_json(j).get_status().message().find("not store \"log\""),
            std::string::npos);

  // Three passes with the deep table's cache under a pass's keys: rows leave, are appended to the
  // log and come back. The model is the host store's; each table has its folder.
  const auto train = [](const std::string& name, const std::string& store) {
    trainer_config c = small_config(name);
    for (auto& tc : c.tables) {
      tc.store = store;
      tc.store_path = store == "log" ? temp_dir(name) + "/logs" : "";
      tc.capacity = 40000;
    }
    c.tables[1].capacity = 8000;
    run(c);
    return c;
  };
  const trainer_config host = train("log_host", "host");
  trainer_config log = train("log_log", "log");
  expect_same_model(host.save_dir, log.save_dir);
  EXPECT_TRUE(fs::exists(log.tables[1].store_path + "/deep/state.json"));
  EXPECT_TRUE(fs::exists(log.tables[0].store_path + "/wide/state.json"));
  // A fresh run does not train from the rows left there, unless asked to.
  log.save_dir += "2";
  auto again = trainer::create(log);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.get_status().message().find("already holds"), std::string::npos)
      << again.get_status().message();
  EXPECT_NE(again.get_status().message().find("config.tables[0].store_path"), std::string::npos)
      << again.get_status().message();
  for (auto& tc : log.tables) tc.reuse_store = true;
  EMBCACHE_EXPECT_OK(trainer::create(log));
}

TEST(trainer_log_store, store_rows_comes_from_the_datasets_and_counts_in_the_budget) {
  json j = {{"passes", {{"a.bin"}}}, {"tables", {{{"name", "wide"}}, {{"name", "deep"}}}}};
  j["tables"][1]["store_rows"] = 1000;
  EXPECT_EQ(trainer_config_from_json(j).get_status().message(),
            "config.tables[1].store_rows: the rows a log store's index is sized for (store "
            "\"log\"), not store \"host\"");
  j["tables"][1]["store"] = "log";
  j["tables"][1]["store_path"] = "/logs";
  auto r = trainer_config_from_json(j);
  EMBCACHE_ASSERT_OK(r);
  json back;
  to_json(back, r.value());
  EXPECT_EQ(back["tables"][1]["store_rows"], 1000);
  j["tables"][1]["store_rows"] = (std::uint64_t{1} << 40) + 1;
  EXPECT_NE(trainer_config_from_json(j).get_status().message().find("store_rows"),
            std::string::npos);

  // 0: the unique keys the dataset's manifest counted (slot keys; the wide table's crossed keys
  // too, as the run crosses).
  trainer_config c = small_config("log_rows");
  for (auto& tc : c.tables) {
    tc.store = "log";
    tc.store_path = temp_dir("log_rows") + "/logs";
  }
  auto m = read_dataset_manifest(dataset());
  EMBCACHE_ASSERT_OK(m);
  ASSERT_TRUE(m.value().has_unique_stats);
  std::uint64_t slot_keys = 0;
  for (auto n : m.value().unique_keys) slot_keys += n;
  auto resolved = resolve_trainer_config(c);
  EMBCACHE_ASSERT_OK(resolved);
  EXPECT_EQ(resolved.value().tables[1].store_rows, slot_keys);
  EXPECT_EQ(resolved.value().tables[0].store_rows, slot_keys + m.value().unique_crossed_keys);
  // The index sized for them is part of the budget: too many rows is refused before any work.
  c.memory_budget_bytes = 512 * mib;
  c.tables[1].store_rows = std::uint64_t{1} << 30;
  auto t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.get_status().code(), status_code::capacity_exceeded);
  EXPECT_NE(t.get_status().message().find("config.tables[1].store_rows: the log store index of "
                                          "table \"deep\" (1073741824 rows) needs"),
            std::string::npos)
      << t.get_status().message();
  EXPECT_FALSE(fs::exists(c.tables[1].store_path));
}

#ifdef EMBCACHE_TEST_ROCKSDB
// The RocksDB database's options as RocksDB wrote them (its latest OPTIONS file).
std::string rocksdb_options_text(const std::string& db) {
  std::string latest;
  for (const auto& e : fs::directory_iterator(db)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("OPTIONS-", 0) == 0 && name > latest) latest = name;
  }
  return latest.empty() ? "" : read_bytes(db + "/" + latest);
}

TEST(trainer_memory_budget, the_budget_sizes_the_rocksdb_memtables) {
  trainer_config c = small_config("budget_sizes");
  const std::string db = temp_dir("budget_sizes") + "/db";
  for (auto& tc : c.tables) {
    tc.store = "rocksdb";
    tc.store_path = db;
    tc.capacity = 40000;
  }
  c.passes.resize(1);
  c.memory_budget_bytes = 256 * mib;
  auto plan = plan_trainer_memory(c);
  EMBCACHE_ASSERT_OK(plan);
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  EMBCACHE_ASSERT_OK(t.value()->run_pass(c.passes[0]));
  const std::string options = rocksdb_options_text(db);
  for (const char* table : {"wide", "deep"}) {
    const std::string section = std::string("[CFOptions \"") + table + "\"]";
    const std::size_t at = options.find(section);
    ASSERT_NE(at, std::string::npos) << section;
    const std::string rest = options.substr(at, options.find("[TableOptions", at) - at);
    EXPECT_NE(
        rest.find("write_buffer_size=" + std::to_string(plan.value().write_buffer_bytes) + "\n"),
        std::string::npos)
        << rest;
    EXPECT_NE(rest.find("max_write_buffer_number=2\n"), std::string::npos) << rest;
  }
  // Under a budget the table is read, flushed and compacted with direct I/O where the file
  // system takes O_DIRECT (tmpfs does not: there the page cache stays).
  const std::string probe = fs::path(db).parent_path().string() + "/direct_probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_DIRECT, 0600);
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
  }
  const std::string direct = fd >= 0 ? "true" : "false";
  EXPECT_NE(options.find("use_direct_reads=" + direct + "\n"), std::string::npos) << options;
  EXPECT_NE(options.find("use_direct_io_for_flush_and_compaction=" + direct + "\n"),
            std::string::npos)
      << options;
}

TEST(trainer_memory_budget, a_dram_tier_is_checked_and_trains_the_same_model) {
  json j = {{"passes", {{"a.bin"}}},
            {"tables",
             {{{"name", "wide"}},
              {{"name", "deep"},
               {"store", "rocksdb"},
               {"store_path", "/db"},
               {"dram_tier_bytes", "auto"}}}}};
  auto r = trainer_config_from_json(j);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.get_status().message(),
            "config.tables[1].dram_tier_bytes: \"auto\" takes a share of "
            "config.memory_budget_bytes, which is not set");
  j["memory_budget_bytes"] = 1 << 30;
  r = trainer_config_from_json(j);
  EMBCACHE_ASSERT_OK(r);
  EXPECT_TRUE(r.value().tables[1].dram_tier_auto);
  json back;
  to_json(back, r.value());
  EXPECT_EQ(back["tables"][1]["dram_tier_bytes"], "auto");
  EXPECT_EQ(back["tables"][0]["dram_tier_bytes"], 0);
  j["tables"][1]["dram_tier_bytes"] = "most";
  EXPECT_EQ(trainer_config_from_json(j).get_status().message(),
            "config.tables[1].dram_tier_bytes: expected an integer in [0, 1125899906842624] or "
            "\"auto\", got \"most\"");
  j["tables"][1]["dram_tier_bytes"] = 1 << 20;
  j["tables"][1]["store"] = "host";
  EXPECT_EQ(trainer_config_from_json(j).get_status().message(),
            "config.tables[1].dram_tier_bytes: a DRAM tier sits in front of a RocksDB store (store "
            "\"rocksdb\"), not store \"host\"");
  // A fixed tier counts against physical memory like the caches.
  trainer_config fixed = rocksdb_config("/no/such/db");
  fixed.tables[1].dram_tier_bytes = std::uint64_t{1} << 40;
  EXPECT_EQ(check_memory(fixed, std::uint64_t{1} << 39).message(),
            "config.tables[1].dram_tier_bytes: the DRAM tier of table \"deep\" needs "
            "1099511627776 bytes, more than the 549755813888 bytes of physical memory");

  // One pass with the deep table behind a DRAM tier sized from the budget (smaller than the
  // table: rows are demoted during the pass) gives the same model as without the tier.
  const auto train = [](const std::string& name, bool tier) {
    trainer_config c = small_config(name);
    c.passes.resize(2);
    for (auto& tc : c.tables) {
      tc.store = "rocksdb";
      tc.store_path = temp_dir(name) + "/db";
      tc.capacity = 40000;
    }
    if (tier) {
      c.memory_budget_bytes = 256 * mib;
      c.tables[1].dram_tier_bytes = 1 << 20;  // about 3,900 rows of 192 + 8 + 80 bytes
      c.tables[0].dram_tier_auto = true;
    }
    run(c);
    return c.save_dir;
  };
  expect_same_model(train("tier_off", false), train("tier_on", true));
}

TEST(trainer_store_block_bytes,
     the_field_is_checked_sets_the_tables_blocks_and_trains_the_same_model) {
  json j = {{"passes", {{"a.bin"}}},
            {"tables",
             {{{"name", "wide"}},
              {{"name", "deep"},
               {"store", "rocksdb"},
               {"store_path", "/db"},
               {"store_block_bytes", 16384}}}}};
  auto r = trainer_config_from_json(j);
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(r.value().tables[1].store_block_bytes, 16384u);
  json back;
  to_json(back, r.value());
  EXPECT_EQ(back["tables"][1]["store_block_bytes"], 16384);
  EXPECT_EQ(back["tables"][0]["store_block_bytes"], 0);
  j["tables"][1]["store_block_bytes"] = 512;
  EXPECT_EQ(trainer_config_from_json(j).get_status().message(),
            "config.tables[1].store_block_bytes: 512 is under a block's least, 1024 bytes (0 "
            "derives it from the row)");
  j["tables"][1]["store_block_bytes"] = (1 << 28) + 1;
  EXPECT_EQ(trainer_config_from_json(j).get_status().message(),
            "config.tables[1].store_block_bytes: expected an integer in [0, 268435456], got "
            "268435457");
  j["tables"][1]["store_block_bytes"] = 4096;
  j["tables"][1]["store"] = "host";
  EXPECT_EQ(trainer_config_from_json(j).get_status().message(),
            "config.tables[1].store_block_bytes: blocks are those of a RocksDB store (store "
            "\"rocksdb\"), not store \"host\"");

  // Three passes (rows written back, then read again across many blocks) with the deep table's
  // blocks at their least and at 64 KiB give the model of the derived size; each column family
  // is written with its own size.
  const auto train = [](const std::string& name, std::size_t block_bytes) {
    trainer_config c = small_config(name);
    const std::string db = temp_dir(name) + "/db";
    for (auto& tc : c.tables) {
      tc.store = "rocksdb";
      tc.store_path = db;
      tc.capacity = 40000;
    }
    c.tables[1].store_block_bytes = block_bytes;
    c.tables[1].capacity = 8000;  // under the keys of a pass: rows leave and come back
    run(c);
    const std::string options = rocksdb_options_text(db);
    const std::string section = "[TableOptions/BlockBasedTable \"deep\"]";
    const std::size_t at = options.find(section);
    EXPECT_NE(at, std::string::npos) << section;
    const std::string rest = options.substr(at, options.find("\n[", at + 1) - at);
    const std::size_t want = block_bytes ? block_bytes : 4096;  // rows under 4 KiB: a page
    EXPECT_NE(rest.find("block_size=" + std::to_string(want) + "\n"), std::string::npos) << rest;
    return c.save_dir;
  };
  const std::string derived = train("block_derived", 0);
  expect_same_model(derived, train("block_least", 1024));
  expect_same_model(derived, train("block_64k", 65536));
}

// The free bytes of the file system at `dir`.
std::uint64_t free_bytes(const std::string& dir) {
  struct statvfs v {};
  if (::statvfs(dir.c_str(), &v) != 0) return 0;
  return std::uint64_t(v.f_bavail) * v.f_frsize;
}

TEST(trainer_memory_budget,
     a_store_disk_that_fills_during_a_pass_is_out_of_space_and_the_last_save_loads) {
  small_tmpfs disk(64 * mib);
  if (!disk.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  trainer_config c = small_config("budget_full");
  c.tables[1].dim = 64;  // larger rows fill the disk sooner
  for (auto& tc : c.tables) {
    tc.store = "rocksdb";
    tc.store_path = disk.sub("db");
    tc.capacity = 40000;
  }
  c.save_every_pass = false;
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  EMBCACHE_ASSERT_OK(t.value()->run_pass(c.passes[0]));
  const std::string save = c.save_dir;
  EMBCACHE_ASSERT_OK(t.value()->save(save));
  // The disk shrinks to what the database holds now plus 128 KiB: the next rows do not fit.
  std::string mount_point = disk.sub("");
  mount_point.pop_back();
  const std::uint64_t used = 64 * mib - free_bytes(mount_point);
  const std::string size = "size=" + std::to_string(used + 128 * 1024);
  ASSERT_EQ(::mount("tmpfs", mount_point.c_str(), "tmpfs", MS_REMOUNT, size.c_str()), 0);
  status failure;
  for (std::size_t p = 1; p < c.passes.size() && failure.ok(); ++p) {
    auto r = t.value()->run_pass(c.passes[p]);
    failure = r.ok() ? t.value()->save(temp_dir("budget_full_later")) : r.get_status();
  }
  EXPECT_EQ(failure.code(), status_code::out_of_space) << failure.to_string();
  EXPECT_NE(failure.message().find(c.tables[0].store_path), std::string::npos) << failure.message();
  t.value().reset();
  // The save made before the disk filled loads into a new run (on a disk with room) whole.
  trainer_config resumed = c;
  for (auto& tc : resumed.tables) tc.store_path = temp_dir("budget_full_resume") + "/db";
  resumed.resume_from = save;
  auto r = trainer::create(resumed);
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(r.value()->passes_done(), 1u);
  const std::string again = temp_dir("budget_full_again");
  EMBCACHE_ASSERT_OK(r.value()->save(again));
  expect_same_model(save, again);
}
#endif

}  // namespace
}  // namespace embcache::test
