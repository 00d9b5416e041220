#include "embcache/synth.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "common/status_assertions.hpp"
#include "embcache/criteo.hpp"
#include "embcache/shard.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

using test::read_bytes;
using test::scratch_dir;

// Area under the ROC curve by the rank-sum formula, ties sharing their mean rank.
double auc(const std::vector<double>& score, const std::vector<int>& label) {
  std::vector<std::size_t> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](auto a, auto b) { return score[a] < score[b]; });
  double rank_sum = 0, pos = 0;
  for (std::size_t i = 0; i < idx.size();) {
    std::size_t j = i;
    while (j < idx.size() && score[idx[j]] == score[idx[i]]) ++j;
    const double mean_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2.0;
    for (std::size_t k = i; k < j; ++k) {
      if (label[idx[k]]) {
        rank_sum += mean_rank;
        ++pos;
      }
    }
    i = j;
  }
  const double neg = static_cast<double>(score.size()) - pos;
  return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg);
}

TEST(synth_auc, rank_sum_matches_hand_counted_cases) {
  EXPECT_DOUBLE_EQ(auc({0.1, 0.2, 0.3, 0.4}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(auc({0.1, 0.2, 0.3, 0.4}, {1, 1, 0, 0}), 0.0);
  EXPECT_DOUBLE_EQ(auc({0.1, 0.4, 0.3, 0.2}, {0, 1, 0, 1}), 0.75);
  EXPECT_DOUBLE_EQ(auc({0.5, 0.5}, {0, 1}), 0.5);
}

struct signal_stats {
  double auc;
  double label_mean;
};

signal_stats measure(const synth_options& o, int rows) {
  const synth_generator gen(o);
  std::vector<double> logits(rows);
  std::vector<int> labels(rows);
  synth_row r;
  for (int i = 0; i < rows; ++i) {
    gen.row(i, r);
    logits[i] = r.logit;
    labels[i] = r.label;
  }
  return {auc(logits, labels),
          std::accumulate(labels.begin(), labels.end(), 0.0) / static_cast<double>(rows)};
}

TEST(synth, hidden_model_carries_a_learnable_signal) {
  synth_options o;
  o.seed = 3;
  const signal_stats s = measure(o, 20000);
  EXPECT_GT(s.auc, 0.8);
  EXPECT_GT(s.label_mean, 0.18);
  EXPECT_LT(s.label_mean, 0.35);
  // With the signal off the same logits say nothing about the labels.
  o.signal = 0;
  const signal_stats none = measure(o, 20000);
  EXPECT_GT(none.auc, 0.47);
  EXPECT_LT(none.auc, 0.53);
}

TEST(synth, rows_are_pure_functions_of_seed_and_index) {
  synth_options o;
  o.seed = 9;
  const synth_generator a(o), b(o);
  synth_row x, y;
  std::string tx, ty;
  for (std::uint64_t i : {0ull, 5ull, 123456789ull, 3ull}) {
    a.row(i, x);
    b.row(i, y);
    tx.clear();
    ty.clear();
    a.append_tsv(x, tx);
    b.append_tsv(y, ty);
    EXPECT_EQ(tx, ty);
    EXPECT_EQ(x.logit, y.logit);
  }
  o.seed = 10;
  const synth_generator c(o);
  a.row(7, x);
  c.row(7, y);
  tx.clear();
  ty.clear();
  a.append_tsv(x, tx);
  c.append_tsv(y, ty);
  EXPECT_NE(tx, ty);
}

TEST(synth, values_follow_cardinalities_zipf_and_missing_rates) {
  synth_options o;
  o.cardinality_scale = 0.01;
  const synth_generator gen(o);
  EXPECT_EQ(gen.cardinalities()[2], 101312u);  // C3: 10,131,227 * 0.01
  EXPECT_EQ(gen.cardinalities()[8], 1u);       // C9: 3 * 0.01, at least one value
  synth_row r;
  std::vector<int> c3(gen.cardinalities()[2]);
  int missing22 = 0, missing_i1 = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    gen.row(i, r);
    for (std::size_t j = 0; j < criteo_slot_count; ++j) {
      ASSERT_LT(r.values[j], static_cast<std::int64_t>(gen.cardinalities()[j]));
      ASSERT_GE(r.values[j], -1);
    }
    if (r.values[2] >= 0) ++c3[r.values[2]];
    missing22 += r.values[21] < 0;
    missing_i1 += !r.dense_present[0];
    ASSERT_GE(r.dense[1], -3);
  }
  // Zipf: the head dominates and frequencies fall with the rank.
  EXPECT_GT(c3[0], c3[10]);
  EXPECT_GT(c3[10], c3[1000]);
  EXPECT_GT(c3[0], n / 50);
  EXPECT_NEAR(missing22 / double(n), 0.76, 0.02);
  EXPECT_NEAR(missing_i1 / double(n), 0.45, 0.02);
  synth_options no_cardinality;
  no_cardinality.rows = 1;
  no_cardinality.cardinality_scale = 0.0;
  EXPECT_THROW(synth_generator{no_cardinality}, error);
}

TEST(synth, tsv_writes_are_deterministic_and_parse) {
  scratch_dir dir;
  synth_options o;
  o.rows = 500;
  o.seed = 4;
  EMBCACHE_ASSERT_OK(write_synth_tsv(dir / "a.tsv", o));
  EMBCACHE_ASSERT_OK(write_synth_tsv(dir / "b.tsv", o));
  EMBCACHE_ASSERT_OK(write_synth_tsv(dir / "c.tsv.gz", o));
  const auto a = read_bytes(dir / "a.tsv");
  EXPECT_EQ(a, read_bytes(dir / "b.tsv"));
  EXPECT_EQ(std::count(a.begin(), a.end(), '\n'), 500);
  EXPECT_LT(read_bytes(dir / "c.tsv.gz").size(), a.size() / 2);
  o.rows = 200;  // a shorter run is a prefix of a longer one
  EMBCACHE_ASSERT_OK(write_synth_tsv(dir / "p.tsv", o));
  const auto p = read_bytes(dir / "p.tsv");
  ASSERT_LT(p.size(), a.size());
  EXPECT_TRUE(std::equal(p.begin(), p.end(), a.begin()));
  o.seed = 5;
  EMBCACHE_ASSERT_OK(write_synth_tsv(dir / "d.tsv", o));
  EXPECT_NE(read_bytes(dir / "d.tsv"), p);
}

TEST(synth, direct_shards_equal_prep_of_the_tsv) {
  scratch_dir dir;
  synth_options o;
  o.rows = 700;
  o.seed = 8;
  o.cardinality_scale = 0.001;
  EMBCACHE_ASSERT_OK(write_synth_tsv(dir / "s.tsv.gz", o));
  prep_options p;
  p.inputs = {dir / "s.tsv.gz"};
  p.output_dir = dir / "prep";
  p.rows_per_shard = 300;
  p.cross = true;
  p.parse.hash_seed = 77;
  auto prepped = prepare_criteo(p);
  EMBCACHE_ASSERT_OK(prepped);
  EXPECT_EQ(prepped.value().malformed, 0u);

  dataset_writer_options w;
  w.output_dir = dir / "direct";
  w.rows_per_shard = 300;
  auto direct = write_synth_dataset(o, w, true, p.parse);
  EMBCACHE_ASSERT_OK(direct);
  const auto& a = prepped.value().dataset;
  const auto& b = direct.value();
  EXPECT_EQ(b.rows, 700u);
  EXPECT_EQ(a.unique_keys, b.unique_keys);
  EXPECT_EQ(a.label_mean, b.label_mean);
  ASSERT_EQ(a.shards.size(), 3u);
  ASSERT_EQ(b.shards.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(read_bytes(a.shards[i].shard), read_bytes(b.shards[i].shard)) << i;
    EXPECT_EQ(read_bytes(a.shards[i].keyset), read_bytes(b.shards[i].keyset)) << i;
    EXPECT_EQ(read_bytes(a.shards[i].crossed_keyset), read_bytes(b.shards[i].crossed_keyset)) << i;
  }
  // And again: same bytes.
  w.output_dir = dir / "again";
  auto again = write_synth_dataset(o, w, true, p.parse);
  EMBCACHE_ASSERT_OK(again);
  EXPECT_EQ(read_bytes(again.value().shards[2].shard), read_bytes(b.shards[2].shard));
}

TEST(synth, non_finite_and_out_of_range_options_are_refused_by_name) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct bad_case {
    double synth_options::*field;
    double value;
    const char* name;
  };
  for (const bad_case& c :
       {bad_case{&synth_options::signal, nan, "signal"},
        bad_case{&synth_options::signal, -inf, "signal"},
        bad_case{&synth_options::bias, inf, "bias"},
        bad_case{&synth_options::zipf_exponent, nan, "zipf_exponent"},
        bad_case{&synth_options::zipf_exponent, inf, "zipf_exponent"},
        bad_case{&synth_options::zipf_exponent, 0.0, "zipf_exponent"},
        bad_case{&synth_options::cardinality_scale, inf, "cardinality_scale"},
        bad_case{&synth_options::cardinality_scale, 2e6, "cardinality_scale"},
        bad_case{&synth_options::cardinality_scale, nan, "cardinality_scale"}}) {
    synth_options o;
    o.*c.field = c.value;
    try {
      synth_generator g(o);
      ADD_FAILURE() << c.name << " = " << c.value << " was accepted";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), status_code::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(std::string("synth_generator: ") + c.name + " is "),
                std::string::npos)
          << e.what();
    }
  }
  synth_options edge;
  edge.signal = -2;
  edge.cardinality_scale = synth_max_cardinality_scale;
  EXPECT_NO_THROW(synth_generator{edge});
}

}  // namespace
}  // namespace embcache
