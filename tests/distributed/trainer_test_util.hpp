// What the sharded trainer's tests share: a small synthetic dataset, a small configuration, and
// the comparison of two saves' models.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/read_bytes.hpp"
#include "common/status_assertions.hpp"
#include "common/trainer_dataset.hpp"
#include "embcache/distributed/sharded_save.hpp"
#include "embcache/host_store.hpp"
#include "embcache/serving.hpp"
#include "embcache/shard.hpp"
#include "embcache/synth.hpp"
#include "embcache/trainer/trainer.hpp"
#include "test_util.hpp"

namespace embcache::test {

/// The synthetic dataset of the MPI trainer tests, in a folder every rank sees: written by rank
/// 0 at the first call (collective then), the same folder afterwards (trainer_mpi_test.cpp).
const std::string& trainer_data_dir();

/// Two passes (shards 0 and 1, then shard 2), evaluation on shard 3, host-hybrid tables, four
/// blocks per batch of 128 (the last batch of each shard, 92 samples, makes blocks of 23).
inline trainer_config sharded_trainer_config(const std::string& data_dir) {
  trainer_config c;
  c.mode = trainer_mode::host_hybrid;
  c.data_dir = data_dir;
  c.passes = {{{shard_file_name(0), shard_file_name(1)}}, {{shard_file_name(2)}}};
  c.eval_shard = shard_file_name(3);
  c.eval_max_samples = 700;
  c.model.hidden = {16, 8};
  c.model.dropout = 0.1f;  // on, so that its stream is part of what must agree
  c.model.seed = 7;
  c.batch_size = 128;
  c.crossed = true;
  c.seed = 3;
  c.log_interval = 0;
  c.threads = 1;
  c.num_blocks = 4;
  return c;
}

/// Every row of a table's sharded save, whatever the number of ranks that wrote it.
inline model sharded_rows(const std::string& save, const char* table, std::size_t row_width) {
  host_store_options o;
  o.table_name = table;
  o.row_width = row_width;
  host_store<std::int64_t> all(o);
  EMBCACHE_EXPECT_OK(load_sharded_part(save + "/sparse/" + table, 0, 1, all));
  return read_store(all);
}

/// Row widths of the trainer's default tables: wide (dim 1, FTRL: 2 state floats), deep (dim 16,
/// Adam: 32 state floats).
constexpr std::size_t wide_width = 3, deep_width = 48;

/// The same dense blob and the same bits in every row of both tables.
inline void expect_same_sharded_model(const std::string& a, const std::string& b) {
  EXPECT_TRUE(read_bytes(a + "/dense.bin") == read_bytes(b + "/dense.bin"))
      << "dense.bin differs between " << a << " and " << b;
  for (const auto& [table, width] : {std::pair{"wide", wide_width}, {"deep", deep_width}}) {
    const model x = sharded_rows(a, table, width), y = sharded_rows(b, table, width);
    EXPECT_GT(x.keys.size(), 0u) << table;
    EXPECT_TRUE(x.same_rows(y)) << "table " << table << " differs between " << a << " and " << b;
  }
}

/// The sharded save `sharded` holds the embeddings of the host-hybrid save `hybrid` (HugeCTR
/// layout: `key` int64s and `emb_vector` rows of dim floats).
inline void expect_same_rows_as_hybrid(const std::string& sharded, const std::string& hybrid) {
  for (const auto& [table, width, dim] :
       {std::tuple{"wide", wide_width, std::size_t{1}}, {"deep", deep_width, std::size_t{16}}}) {
    const model x = sharded_rows(sharded, table, width);
    const std::string keys = read_bytes(hybrid + "/sparse/" + table + "/key");
    const std::string emb = read_bytes(hybrid + "/sparse/" + table + "/emb_vector");
    const std::size_t n = keys.size() / 8;
    ASSERT_EQ(emb.size(), n * dim * 4) << table;
    ASSERT_EQ(x.keys.size(), n) << table;
    std::vector<std::pair<std::int64_t, std::size_t>> order(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::memcpy(&order[i].first, keys.data() + 8 * i, 8);
      order[i].second = i;
    }
    std::sort(order.begin(), order.end());
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(x.keys[i], order[i].first) << table;
      EXPECT_EQ(std::memcmp(x.rows.data() + i * width, emb.data() + order[i].second * dim * 4,
                            dim * 4),
                0)
          << table << " key " << x.keys[i];
    }
  }
}

/// The same losses and evaluations, pass by pass.
inline void expect_same_history(const std::vector<pass_metrics>& a,
                                const std::vector<pass_metrics>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].pass, b[i].pass);
    EXPECT_EQ(a[i].samples, b[i].samples);
    EXPECT_EQ(a[i].steps, b[i].steps);
    EXPECT_EQ(a[i].train_loss, b[i].train_loss) << "pass " << a[i].pass;
    EXPECT_EQ(a[i].eval_auc, b[i].eval_auc) << "pass " << a[i].pass;
    EXPECT_EQ(a[i].eval_logloss, b[i].eval_logloss) << "pass " << a[i].pass;
  }
}

/// The parts of delta `number` of a sharded run's export folder, in rank order.
inline std::vector<model_folder> delta_parts(const std::string& exports, std::uint64_t number) {
  char name[32];
  std::snprintf(name, sizeof name, "delta-%06llu", static_cast<unsigned long long>(number));
  const auto parts = nlohmann::json::parse(read_bytes(exports + "/" + name + ".parts.json"));
  std::vector<model_folder> out;
  for (const auto& p : parts.at("parts")) {
    auto d = read_delta_folder(exports + "/" + p.get<std::string>());
    EMBCACHE_EXPECT_OK(d);
    if (d.ok()) out.push_back(std::move(d).value());
  }
  return out;
}

/// Table `t` of every part of one delta together, sorted by key: keys, embeddings, optimizer
/// state and tombstones (versions are left out: they count each rank's own updates).
inline folder_table merged(const std::vector<model_folder>& parts, std::size_t t) {
  folder_table all;
  std::vector<std::pair<std::int64_t, std::pair<std::size_t, std::size_t>>> order;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const folder_table& x = parts[p].tables.at(t);
    all.name = x.name;
    all.dim = x.dim;
    all.state_width = x.state_width;
    for (std::size_t i = 0; i < x.keys.size(); ++i) order.push_back({x.keys[i], {p, i}});
    all.erased.insert(all.erased.end(), x.erased.begin(), x.erased.end());
  }
  std::sort(order.begin(), order.end());
  std::sort(all.erased.begin(), all.erased.end());
  for (const auto& [key, at] : order) {
    const folder_table& x = parts[at.first].tables[t];
    all.keys.push_back(key);
    all.vectors.insert(all.vectors.end(), x.vectors.begin() + at.second * x.dim,
                       x.vectors.begin() + (at.second + 1) * x.dim);
    all.states.insert(all.states.end(), x.states.begin() + at.second * x.state_width,
                      x.states.begin() + (at.second + 1) * x.state_width);
  }
  return all;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Keys, embeddings, optimizer state and tombstones of one table, bit for bit.
inline void expect_same_table_rows(const folder_table& a, const folder_table& b,
                                   const std::string& what) {
  EXPECT_GT(a.keys.size(), 0u) << what;
  EXPECT_EQ(a.keys, b.keys) << what;
  EXPECT_TRUE(same_bits(a.vectors, b.vectors)) << what << ": embeddings differ";
  EXPECT_GT(a.state_width, 0u) << what;
  EXPECT_EQ(a.state_width, b.state_width) << what;
  EXPECT_TRUE(same_bits(a.states, b.states)) << what << ": optimizer states differ";
  EXPECT_EQ(a.erased, b.erased) << what;
}

/// Deltas 1..`count` of two sharded runs' export folders hold the same rows, optimizer state and
/// tombstones, table by table, whatever the number of parts each was written in; returns the
/// tombstones seen in `a`.
inline std::size_t expect_same_sharded_deltas(const std::string& a, const std::string& b,
                                              std::uint64_t count, std::size_t tables) {
  std::size_t tombstones = 0;
  for (std::uint64_t n = 1; n <= count; ++n) {
    const std::vector<model_folder> x = delta_parts(a, n), y = delta_parts(b, n);
    EXPECT_FALSE(x.empty() || y.empty()) << "delta " << n;
    if (x.empty() || y.empty()) continue;
    for (std::size_t t = 0; t < tables; ++t) {
      const folder_table u = merged(x, t);
      expect_same_table_rows(u, merged(y, t), "delta " + std::to_string(n) + " table " + u.name);
      tombstones += u.erased.size();
    }
  }
  return tombstones;
}

}  // namespace embcache::test
