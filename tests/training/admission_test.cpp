// Feature admission (embcache/admission.hpp): the sketch's rule (admitted at exactly the
// min_count-th sighting, seeded draws close to p), and the training cache in both modes: refused
// keys get no row, read zeros, get no gradient and reach no store, save or export; the counts
// survive save/load bit for bit; a corrupted admission file is refused clearly.
#include "embcache/admission.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status_assertions.hpp"
#include "common/temp_dir.hpp"
#include "embcache/json.hpp"
#include "embcache/slot_rows.hpp"
#include "embcache/sparse_ops.hpp"
#include "embcache/training_cache.hpp"
#include "test_util.hpp"

namespace embcache::testing {
namespace {

using key = std::int64_t;

admission_options counting(std::uint32_t min_count) {
  admission_options o;
  o.min_count = min_count;
  o.sketch_width = 4096;
  o.sketch_depth = 4;
  o.seed = 11;
  return o;
}

TEST(admission_sketch, admits_at_exactly_the_min_count_th_sighting) {
  admission_sketch s(counting(3));
  ASSERT_TRUE(s.enabled());
  EXPECT_EQ(s.bytes(), 4096u * 4 * 4);
  for (key k = 1; k <= 50; ++k) {
    EXPECT_FALSE(s.sight(k)) << k;
    EXPECT_FALSE(s.sight(k)) << k;
    EXPECT_FALSE(s.admitted(k)) << k;
    EXPECT_TRUE(s.sight(k)) << k;
    EXPECT_TRUE(s.admitted(k)) << k;
    EXPECT_EQ(s.count(k), 3u) << k;  // 150 sightings in 4096 counters: no overcount here
  }
  EXPECT_EQ(s.total(), 150u);
}

// sight_all (the batch path begin_pass and lookup take) gives what counting every key and then
// asking each gives, on a narrow sketch where keys share counters, whatever their order.
TEST(admission_sketch, sight_all_equals_counting_then_deciding) {
  for (const double p : {0.0, 0.3}) {
    admission_options o;
    o.min_count = 3;
    o.probability = p;
    o.sketch_width = 64;  // 300 keys: many share counters
    o.sketch_depth = 3;
    o.seed = 5;
    admission_sketch batch(o), one(o);
    for (int round = 0; round < 4; ++round) {
      std::vector<std::uint64_t> keys;
      for (std::uint64_t k = 0; k < 300; ++k)
        if ((k * 7 + std::uint64_t(round)) % 3 != 0) keys.push_back(k * 1000003 + 17);
      if (round % 2) std::reverse(keys.begin(), keys.end());
      std::unique_ptr<bool[]> got(new bool[keys.size()]);
      batch.sight_all(keys.data(), keys.size(), got.get());
      for (const auto k : keys) one.count_sighting(k);
      for (std::size_t i = 0; i < keys.size(); ++i)
        ASSERT_EQ(got[i], one.admitted(keys[i]))
            << "p " << p << " round " << round << " key " << keys[i];
      EXPECT_EQ(batch.to_words(), one.to_words());
    }
  }
}

// count_all (the batch path of count_sightings) leaves the counters and the total that counting
// each key alone leaves, a repeated key included.
TEST(admission_sketch, count_all_equals_counting_each_key) {
  admission_options o;
  o.min_count = 2;
  o.sketch_width = 16;  // 200 keys: most share counters
  o.sketch_depth = 4;
  o.seed = 9;
  admission_sketch batch(o), one(o);
  std::vector<std::uint64_t> keys;
  for (std::uint64_t k = 0; k < 200; ++k) keys.push_back(k * 2654435761u + (k % 3 == 0 ? 0 : 1));
  keys.push_back(keys.front());  // a key given twice counts twice
  for (int round = 0; round < 3; ++round) {
    batch.count_all(keys.data(), keys.size());
    for (const auto k : keys) one.count_sighting(k);
    ASSERT_EQ(batch.to_words(), one.to_words()) << "round " << round;
  }
  EXPECT_EQ(batch.total(), 3 * keys.size());
  admission_sketch off;  // admission off: nothing to count, nothing held
  off.count_all(keys.data(), keys.size());
  EXPECT_EQ(off.total(), 0u);
  EXPECT_EQ(off.bytes(), 0u);
}

// admitted_all (no counting): with 0 added sightings it is admitted(); with 1 it foresees the
// next sighting: every key it admits is admitted by sight_all of any batch that holds it, and on
// a sketch where no keys share counters it foresees exactly.
TEST(admission_sketch, admitted_all_is_admitted_and_foresees_the_next_sighting) {
  for (const std::uint64_t width : {std::uint64_t{64}, std::uint64_t{1} << 20}) {
    admission_options o;
    o.min_count = 3;
    o.probability = 0.2;
    o.sketch_width = width;
    o.sketch_depth = 3;
    o.seed = 9;
    admission_sketch s(o);
    std::vector<std::uint64_t> keys;
    for (std::uint64_t k = 0; k < 200; ++k) keys.push_back(k * 7919 + 3);
    std::unique_ptr<bool[]> now(new bool[keys.size()]), next(new bool[keys.size()]),
        got(new bool[keys.size()]);
    for (int round = 0; round < 4; ++round) {
      s.admitted_all(keys.data(), keys.size(), 0, now.get());
      s.admitted_all(keys.data(), keys.size(), 1, next.get());
      std::size_t foreseen = 0;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        ASSERT_EQ(now[i], s.admitted(keys[i])) << width << " " << round << " " << keys[i];
        if (now[i]) ASSERT_TRUE(next[i]);
        foreseen += next[i];
      }
      const std::vector<std::uint32_t> before = s.to_words();
      s.sight_all(keys.data(), keys.size(), got.get());
      EXPECT_NE(s.to_words(), before);  // admitted_all counted nothing; sight_all did
      std::size_t admitted = 0;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (next[i]) ASSERT_TRUE(got[i]) << width << " " << round << " " << keys[i];
        admitted += got[i];
      }
      if (width > 64) EXPECT_EQ(foreseen, admitted) << round;
    }
  }
}

TEST(admission_sketch, off_costs_nothing_and_admits_everything) {
  admission_sketch s;
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.bytes(), 0u);
  EXPECT_TRUE(s.sight(7));
  EXPECT_TRUE(s.to_words().empty());
}

TEST(admission_sketch, probability_draws_are_seeded_and_close_to_p) {
  admission_options o;
  o.probability = 0.25;
  o.sketch_width = 1 << 16;
  o.seed = 5;
  admission_sketch a(o), b(o);
  const int n = 20000;
  int first = 0;
  double sum = 0;
  for (key k = 0; k < n; ++k) {
    const std::uint32_t t = a.threshold(k);
    ASSERT_GE(t, 1u);
    EXPECT_EQ(t, b.threshold(k));  // the same draw in every run
    first += t == 1 ? 1 : 0;
    sum += t;
  }
  // P(admitted at the first sighting) = p; mean sighting of admission = 1 / p. 5 sigma bounds.
  const double p = 0.25, sigma = std::sqrt(p * (1 - p) / n);
  EXPECT_NEAR(double(first) / n, p, 5 * sigma);
  EXPECT_NEAR(sum / n, 1 / p, 5 * std::sqrt((1 - p) / (p * p) / n));
  // Another seed draws otherwise.
  o.seed = 6;
  admission_sketch c(o);
  int same = 0;
  for (key k = 0; k < 1000; ++k) same += c.threshold(k) == a.threshold(k) ? 1 : 0;
  EXPECT_LT(same, 900);
  // p = 1 admits at once; with min_count too, the smaller threshold wins.
  o.probability = 1;
  EXPECT_EQ(admission_sketch(o).threshold(3), 1u);
  o.probability = 1e-9;
  o.min_count = 2;
  EXPECT_EQ(admission_sketch(o).threshold(3), 2u);
}

TEST(admission_sketch, words_round_trip_and_bad_words_are_refused) {
  admission_sketch s(counting(2));
  for (key k = 0; k < 100; ++k) s.sight(k * 7);
  const auto w = s.to_words();
  ASSERT_EQ(w.size(), s.word_count());
  admission_sketch r(counting(2));
  EMBCACHE_ASSERT_OK(r.from_words(w.data(), w.size(), "f"));
  EXPECT_EQ(r.to_words(), w);
  EXPECT_EQ(r.total(), 100u);
  auto bad = w;
  bad[0] ^= 1;
  status st = r.from_words(bad.data(), bad.size(), "some/admission");
  EXPECT_EQ(st.code(), status_code::corruption);
  EXPECT_NE(st.message().find("some/admission"), std::string::npos) << st.message();
  st = r.from_words(w.data(), w.size() - 1, "f");
  EXPECT_EQ(st.code(), status_code::corruption);
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
  st = r.from_words(w.data(), 3, "f");
  EXPECT_EQ(st.code(), status_code::corruption);
  auto other = counting(2);
  other.seed = 12;
  admission_sketch o(other);
  st = o.from_words(w.data(), w.size(), "f");
  EXPECT_EQ(st.code(), status_code::corruption);
  EXPECT_NE(st.message().find("seed"), std::string::npos) << st.message();
  other = counting(2);
  other.sketch_width = 2048;
  st = admission_sketch(other).from_words(w.data(), w.size(), "f");
  EXPECT_EQ(st.code(), status_code::corruption);
  EXPECT_NE(st.message().find("sketch_width"), std::string::npos) << st.message();
}

TEST(admission_sketch, options_are_checked_naming_the_field) {
  admission_options o;
  o.probability = 1.5;
  EXPECT_NE(check_admission_options(o, "t.admission").message().find("t.admission.probability"),
            std::string::npos);
  o = {};
  o.sketch_depth = 0;
  EXPECT_NE(check_admission_options(o).message().find("admission.sketch_depth"), std::string::npos);
  o = {};
  o.sketch_width = 0;
  EXPECT_NE(check_admission_options(o).message().find("admission.sketch_width"), std::string::npos);
  table_options<key> t;
  t.name = "t";
  t.dim = 2;
  t.capacity = 8;
  t.admission.min_count = 1;
  t.admission.sketch_depth = 17;
  EXPECT_THROW(training_cache<key>({}, {t}), error);
}

// A cache of one table "t" (dim 2, sgd) with admission `a`.
std::unique_ptr<training_cache<key>> make_cache(cache_mode mode, const admission_options& a) {
  training_cache_options o;
  o.mode = mode;
  table_options<key> t;
  t.name = "t";
  t.dim = 2;
  t.capacity = 64;
  t.admission = a;
  return std::make_unique<training_cache<key>>(o, std::vector<table_options<key>>{t});
}

std::vector<key> resident_of(training_cache<key>& tc, const std::vector<key>& keys) {
  std::vector<std::int64_t> slots(keys.size());
  EMBCACHE_EXPECT_OK(tc.cache(0).lookup_slots(keys.data(), keys.size(), slots.data()));
  std::vector<key> out;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (slots[i] >= 0) out.push_back(keys[i]);
  return out;
}

std::vector<key> keys_of(const model<key>& m) {
  std::vector<key> k;
  for (const auto& [kk, row] : m) k.push_back(kk);
  return k;
}

// One sgd step through the sparse ops on the batch `keys` (one-hot, one slot): every pooled value
// gets gradient 1, as the trainer's keyset path runs it (slot -1 for a key without a row).
void train_step(training_cache<key>& tc, const std::vector<key>& keys) {
  auto& c = tc.cache(0);
  std::vector<std::int64_t> slots(keys.size()), offsets(keys.size() + 1);
  EMBCACHE_EXPECT_OK(c.lookup_slots(keys.data(), keys.size(), slots.data()));
  for (std::size_t i = 0; i <= keys.size(); ++i) offsets[i] = std::int64_t(i);
  const slot_batch b{keys.size(), 1, offsets.data(), slots.data(), keys.size()};
  EMBCACHE_EXPECT_OK(check_batch(b, c.slots()));
  std::vector<float> pooled(keys.size() * 2, 5.0f), grads(keys.size() * 2, 1.0f);
  slot_rows<key> batch_rows, updated_rows;  // rows move between slots by index
  slot_batch r = b;
  r.row_indices = batch_rows.of(c, b.row_indices, b.num_indices, host_space{});
  lookup_combine(host_space{}, c.row_pool(), c.row_width(), 2, r, combiner::sum, pooled.data());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (slots[i] < 0) {  // refused: reads zeros
      EXPECT_EQ(pooled[2 * i], 0.0f);
      EXPECT_EQ(pooled[2 * i + 1], 0.0f);
    }
  }
  sparse_gradients<host_space> g;
  aggregate_gradients(host_space{}, b, combiner::sum, grads.data(), 2, g);
  optimizer_options sgd;
  sgd.learning_rate = 0.5f;
  apply_optimizer(host_space{}, sgd, c.row_pool(), c.row_width(), g.dim,
                  updated_rows.of(c, g.rows.data(), g.size, host_space{}), g.values.data(), g.size,
                  1);
  c.mark_updated(g.rows.data(), g.size);
}

TEST(admission_keyset, refused_keys_get_no_row_and_reach_no_store_save_or_export) {
  temp_dir dir;
  auto tc = make_cache(cache_mode::keyset, counting(2));
  EMBCACHE_ASSERT_OK(tc->begin_pass({{1, 2, 3, 3}}));
  EXPECT_TRUE(resident_of(*tc, {1, 2, 3}).empty());
  EXPECT_EQ(tc->counters().last[0].keys_refused, 3u);
  EXPECT_EQ(tc->counters().last[0].keys_admitted, 0u);
  train_step(*tc, {1, 2, 3, 3});
  EMBCACHE_ASSERT_OK(tc->begin_pass({{1, 2, 4}}));
  EXPECT_EQ(resident_of(*tc, {1, 2, 3, 4}), (std::vector<key>{1, 2}));
  EXPECT_EQ(tc->counters().last[0].keys_admitted, 2u);
  EXPECT_EQ(tc->counters().last[0].keys_refused, 1u);
  train_step(*tc, {1, 4, 2, 4});
  // A key with a row stays admitted and is not counted again.
  EMBCACHE_ASSERT_OK(tc->begin_pass({{1, 5}}));
  EXPECT_EQ(tc->counters().last[0].keys_admitted, 0u);
  EXPECT_EQ(tc->counters().last[0].keys_refused, 1u);
  EXPECT_EQ(resident_of(*tc, {1}), (std::vector<key>{1}));
  auto delta = tc->export_incremental();
  EMBCACHE_ASSERT_OK(delta.get_status());
  EXPECT_EQ(delta.value()[0].keys, (std::vector<key>{1, 2}));
  EMBCACHE_ASSERT_OK(tc->end_training());
  EXPECT_EQ(keys_of(store_model(*tc, 0)), (std::vector<key>{1, 2}));
  // Trained once with gradient 1 at lr 0.5 from their initial rows; key 1 read, 2 read.
  EMBCACHE_ASSERT_OK(tc->save(dir.sub("save")));
  EXPECT_TRUE(std::filesystem::exists(dir.sub("save/t/admission")));
  EXPECT_EQ(std::filesystem::file_size(dir.sub("save/t/key")), 2 * sizeof(std::int64_t));
  const nlohmann::json j = tc->counters();
  EXPECT_EQ(j["tables"]["t"]["total"]["keys_admitted"], 2);
  EXPECT_EQ(j["tables"]["t"]["total"]["keys_refused"], 5);
}

// Tables trained in their stores (the trainer's host-hybrid mode): begin_pass_in_stores counts
// and refuses as begin_pass does, and expires the stored rows at the same boundaries, keeping the
// keyset's keys; the rows the caller pushes between boundaries count as touched.
TEST(admission_keyset, begin_pass_in_stores_refuses_and_expires_as_begin_pass_does) {
  training_cache_options o;
  table_options<key> t;
  t.name = "t";
  t.dim = 2;
  t.capacity = 1;  // holds none of the rows
  t.admission = counting(2);
  t.expiry.ttl_passes = 1;
  training_cache<key> tc(o, {t});
  std::vector<std::vector<key>> refused;
  EMBCACHE_ASSERT_OK(tc.begin_pass_in_stores({{3, 1, 2, 3}}, &refused));
  EXPECT_EQ(refused, (std::vector<std::vector<key>>{{1, 2, 3}}));
  EXPECT_EQ(tc.counters().last[0].keys_refused, 3u);
  EMBCACHE_ASSERT_OK(tc.begin_pass_in_stores({{1, 2, 4}}, &refused));
  EXPECT_EQ(refused, (std::vector<std::vector<key>>{{4}}));
  EXPECT_EQ(tc.counters().last[0].keys_admitted, 2u);
  // The caller trains 1 and 2 in the store (stamped by the store).
  const std::vector<key> trained{1, 2};
  const std::vector<float> rows(4, 0.5f);
  EMBCACHE_ASSERT_OK(tc.store(0).push(trained.data(), 2, rows.data()));
  // Touched in the last pass: nothing expires; 1 has a row, so it is admitted, 5 is refused.
  EMBCACHE_ASSERT_OK(tc.begin_pass_in_stores({{1, 5}}, &refused));
  EXPECT_EQ(refused, (std::vector<std::vector<key>>{{5}}));
  EXPECT_EQ(tc.counters().last[0].rows_expired, 0u);
  // Untouched for one pass: 2 expires; 1 is in the keyset being begun and stays.
  EMBCACHE_ASSERT_OK(tc.begin_pass_in_stores({{1, 5}}, &refused));
  EXPECT_TRUE(refused[0].empty());
  EXPECT_EQ(tc.counters().last[0].keys_admitted, 1u);  // 5, at its second sighting
  EXPECT_EQ(tc.counters().last[0].rows_expired, 1u);
  EXPECT_EQ(keys_of(store_model(tc, 0)), (std::vector<key>{1}));
  EXPECT_EQ(tc.counters().passes, 4u);
  EXPECT_EQ(tc.counters().total[0].keys_refused, 5u);
  // Misuse: the keysets must match the tables.
  EXPECT_EQ(tc.begin_pass_in_stores({}, &refused).code(), status_code::invalid_argument);
}

TEST(admission_keyset, off_writes_nothing_new) {
  temp_dir dir;
  auto tc = make_cache(cache_mode::keyset, {});
  EMBCACHE_ASSERT_OK(tc->begin_pass({{1, 2}}));
  EXPECT_EQ(resident_of(*tc, {1, 2}).size(), 2u);
  EMBCACHE_ASSERT_OK(tc->save(dir.sub("save")));
  EXPECT_FALSE(std::filesystem::exists(dir.sub("save/t/admission")));
  const nlohmann::json j = tc->counters();
  EXPECT_FALSE(j["tables"]["t"]["total"].contains("keys_admitted"));
  EXPECT_FALSE(j["tables"]["t"]["total"].contains("keys_refused"));
}

// The passes of the resume tests: a drifting keyset, each key seen now and then.
std::vector<key> pass_keys(int p) {
  std::vector<key> k;
  // Keys 0-4 every pass; the others once or twice in passes 0-7 (3p mod 10 takes 8 values).
  for (key x = 0; x < 40; ++x)
    if (x < 5 || (x * 7 + p * 3) % 10 < 2) k.push_back(x);
  return k;
}

// Runs passes [from, to) with a prefetch of the next pass's keyset when `prefetch`.
void run_passes(training_cache<key>& tc, int from, int to, bool prefetch) {
  for (int p = from; p < to; ++p) {
    EMBCACHE_ASSERT_OK(tc.begin_pass({pass_keys(p)}));
    if (prefetch && p + 1 < to) EMBCACHE_ASSERT_OK(tc.prefetch({pass_keys(p + 1)}));
    train_step(tc, pass_keys(p));
  }
}

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(admission_keyset, save_load_resume_is_bit_exact_and_prefetch_changes_nothing) {
  temp_dir dir;
  auto whole = make_cache(cache_mode::keyset, counting(2));
  run_passes(*whole, 0, 8, false);
  EMBCACHE_ASSERT_OK(whole->save(dir.sub("whole")));

  auto first = make_cache(cache_mode::keyset, counting(2));
  run_passes(*first, 0, 4, true);
  EMBCACHE_ASSERT_OK(first->save(dir.sub("half")));
  auto resumed = make_cache(cache_mode::keyset, counting(2));
  EMBCACHE_ASSERT_OK(resumed->load(dir.sub("half")));
  run_passes(*resumed, 4, 8, true);
  EMBCACHE_ASSERT_OK(resumed->save(dir.sub("resumed")));

  EXPECT_EQ(store_model(*whole, 0), store_model(*resumed, 0));
  EXPECT_LT(store_model(*whole, 0).size(), 40u);  // keys seen once were never admitted
  EXPECT_GT(store_model(*whole, 0).size(), 5u);   // keys seen twice were
  for (const char* f : {"t/key", "t/emb_vector", "t/admission"}) {
    EXPECT_EQ(file_bytes(dir.sub(std::string("whole/") + f)),
              file_bytes(dir.sub(std::string("resumed/") + f)))
        << f;
  }
}

// The prefetch of the next pass stages the rows of the keys that pass's sighting admits (here:
// keys seen for the second time), so begin_pass installs them from the staging; the keys it
// refuses get nothing staged.
TEST(admission_keyset, prefetch_stages_the_rows_of_keys_the_next_pass_admits) {
  auto tc = make_cache(cache_mode::keyset, counting(2));
  std::vector<key> first, second;
  for (key k = 1; k <= 10; ++k) first.push_back(k);
  for (key k = 1; k <= 20; ++k) second.push_back(k);
  EMBCACHE_ASSERT_OK(tc->begin_pass({first}));
  EXPECT_EQ(tc->counters().last[0].keys_refused, 10u);
  EMBCACHE_ASSERT_OK(tc->prefetch({second}));
  EMBCACHE_ASSERT_OK(tc->begin_pass({second}));
  const table_counters& c = tc->counters().last[0];
  EXPECT_EQ(c.keys_admitted, 10u);
  EXPECT_EQ(c.keys_refused, 10u);
  EXPECT_EQ(c.rows_initialized, 10u);
  EXPECT_EQ(c.rows_staged, 10u);  // all made by the worker, none by begin_pass
  EXPECT_EQ(resident_of(*tc, second), first);
}

TEST(admission_keyset, a_corrupted_or_mismatched_admission_file_is_refused_naming_it) {
  temp_dir dir;
  auto tc = make_cache(cache_mode::keyset, counting(2));
  run_passes(*tc, 0, 3, false);
  EMBCACHE_ASSERT_OK(tc->save(dir.sub("save")));
  const std::string file = dir.sub("save/t/admission");
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(60);
    f.put('\x7f');
  }
  auto other = make_cache(cache_mode::keyset, counting(2));
  status st = other->load(dir.sub("save"));
  EXPECT_EQ(st.code(), status_code::corruption);
  EXPECT_NE(st.message().find("admission"), std::string::npos) << st.message();
  // Truncated.
  std::filesystem::resize_file(file, 20);
  st = other->load(dir.sub("save"));
  EXPECT_EQ(st.code(), status_code::corruption);
  EXPECT_NE(st.message().find("admission"), std::string::npos) << st.message();
  // A sketch of another shape than the table's.
  EMBCACHE_ASSERT_OK(tc->save(dir.sub("save2")));
  auto wider = counting(2);
  wider.sketch_width = 8192;
  st = make_cache(cache_mode::keyset, wider)->load(dir.sub("save2"));
  EXPECT_EQ(st.code(), status_code::corruption);
  EXPECT_NE(st.message().find("admission"), std::string::npos) << st.message();
  // Without admission the file is not read: the rows load.
  EMBCACHE_EXPECT_OK(make_cache(cache_mode::keyset, {})->load(dir.sub("save")));
}

TEST(admission_keyset, rows_loaded_without_counts_stay_admitted) {
  temp_dir dir;
  auto plain = make_cache(cache_mode::keyset, {});
  EMBCACHE_ASSERT_OK(plain->begin_pass({{1, 2}}));
  EMBCACHE_ASSERT_OK(plain->save(dir.sub("save")));
  auto tc = make_cache(cache_mode::keyset, counting(5));
  EMBCACHE_ASSERT_OK(tc->load(dir.sub("save")));
  EMBCACHE_ASSERT_OK(tc->begin_pass({{1, 2, 3}}));
  EXPECT_EQ(resident_of(*tc, {1, 2, 3}), (std::vector<key>{1, 2}));
  EXPECT_EQ(tc->counters().last[0].keys_refused, 1u);
}

TEST(admission_on_demand, refused_keys_get_slot_minus_one_until_admitted) {
  auto tc = make_cache(cache_mode::on_demand, counting(2));
  const std::vector<key> batch = {4, 5, 4};
  std::vector<std::int64_t> slots(3);
  EMBCACHE_ASSERT_OK(tc->lookup(0, batch.data(), 3, slots.data()));
  EXPECT_EQ(slots, (std::vector<std::int64_t>{-1, -1, -1}));
  EXPECT_EQ(tc->counters().last[0].keys_refused, 2u);
  const std::vector<key> next = {4, 6};
  EMBCACHE_ASSERT_OK(tc->lookup(0, next.data(), 2, slots.data()));
  EXPECT_GE(slots[0], 0);
  EXPECT_EQ(slots[1], -1);
  EXPECT_EQ(tc->counters().last[0].keys_admitted, 1u);
  EMBCACHE_ASSERT_OK(tc->end_training());
  EXPECT_EQ(keys_of(store_model(*tc, 0)), (std::vector<key>{4}));
}

// restore_lifetime (what a sharded resume calls): the counts of a sketch's words, or zero for
// none; words of another seed refused naming their file, nothing changed; an expiry clock taken,
// the version clock moved past it; a clock with more versions than boundaries refused.
TEST(admission, restore_lifetime_takes_counts_and_clocks_and_refuses_another_sketch) {
  auto tc = make_cache(cache_mode::keyset, counting(2));
  const std::vector<key> seen{1, 2};
  EMBCACHE_ASSERT_OK(tc->count_sightings(0, seen.data(), seen.size()));
  const std::vector<std::uint32_t> words = tc->admission_state(0);
  const std::vector<std::uint32_t> zero =
      make_cache(cache_mode::keyset, counting(2))->admission_state(0);
  ASSERT_NE(words, zero);
  auto other = make_cache(cache_mode::keyset, counting(2));
  EMBCACHE_ASSERT_OK(other->restore_lifetime(0, words, {}, "w"));
  EXPECT_EQ(other->admission_state(0), words);
  EMBCACHE_ASSERT_OK(other->restore_lifetime(0, {}, {}, "w"));
  EXPECT_EQ(other->admission_state(0), zero);

  admission_options seeded = counting(2);
  seeded.seed = 9;
  auto third = make_cache(cache_mode::keyset, seeded);
  const std::vector<std::uint32_t> before = third->admission_state(0);
  const status s = third->restore_lifetime(0, words, {}, "/save/wide/gen-000001/admission");
  EXPECT_EQ(s.code(), status_code::corruption) << s.to_string();
  EXPECT_NE(s.message().find("/save/wide/gen-000001/admission"), std::string::npos)
      << s.to_string();
  EXPECT_EQ(third->admission_state(0), before);

  training_cache_options o;
  o.mode = cache_mode::keyset;
  table_options<key> t;
  t.name = "t";
  t.dim = 2;
  t.capacity = 64;
  t.expiry.ttl_passes = 2;
  training_cache<key> expiring(o, {t});
  EMBCACHE_ASSERT_OK(expiring.restore_lifetime(0, words, {5, {3, 7}}, "m"));
  EXPECT_EQ(expiring.expiry_state(0).boundaries, 5u);
  EXPECT_EQ(expiring.expiry_state(0).versions, (std::vector<std::uint64_t>{3, 7}));
  EXPECT_GE(expiring.cache(0).version(), 7u);
  EXPECT_TRUE(expiring.admission_state(0).empty());  // admission off: the words are ignored
  EXPECT_EQ(expiring.restore_lifetime(0, {}, {1, {3, 7}}, "m").code(),
            status_code::invalid_argument);
  EXPECT_EQ(expiring.restore_lifetime(0, {}, {5, {7, 3}}, "m").code(),
            status_code::invalid_argument);
  EXPECT_EQ(expiring.restore_lifetime(1, {}, {}, "m").code(), status_code::invalid_argument);
}

}  // namespace
}  // namespace embcache::testing
