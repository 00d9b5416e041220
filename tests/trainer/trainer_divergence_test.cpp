// Non-finite data, losses, rows, dense state and logits stop the run at their step, naming pass
// and step, and nothing is saved or exported after them.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <chrono>

#include "trainer_test_support.hpp"

namespace embcache::test {
namespace {

// A copy of shard `i` and its keysets in a folder of its own, with a NaN dense feature in
// sample `row`.
std::string poisoned_shard(std::size_t i, std::uint64_t row, const std::string& name) {
  const std::string dir = temp_dir(name);
  const std::string src = dataset() + "/" + shard(i);
  auto d = read_shard(src);
  EMBCACHE_EXPECT_OK(d);
  const std::size_t crossed_count = d.value().header.num_crossed;
  auto w = shard_writer::create(dir + "/poisoned.bin", crossed_count);
  EMBCACHE_EXPECT_OK(w);
  std::vector<std::int64_t> crossed(crossed_count);
  for (std::uint64_t r = 0; r < d.value().header.rows; ++r) {
    criteo_sample sample;
    d.value().get(r, sample, crossed.data());
    if (r == row) sample.dense[3] = std::numeric_limits<float>::quiet_NaN();
    EMBCACHE_EXPECT_OK(w.value()->append(sample, crossed.data()));
  }
  EMBCACHE_EXPECT_OK(w.value()->finish());
  const std::string base = src.substr(0, src.size() - 4);
  fs::copy_file(base + ".keys", dir + "/poisoned.keys");
  fs::copy_file(base + ".cross.keys", dir + "/poisoned.cross.keys");
  return dir + "/poisoned.bin";
}

std::size_t entries(const std::string& dir) {
  std::error_code ec;
  std::size_t n = 0;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); ++it) ++n;
  return n;
}

std::uint64_t saved_passes(const std::string& save) {
  return json::parse(read_bytes(save + "/trainer.json")).at("passes_done").get<std::uint64_t>();
}

const std::string stops_without_saving =
    "; the run stops here, saving and exporting nothing (lower the learning rates, check the data "
    "for non-finite features)";

TEST(trainer_data, nan_in_the_data_stops_at_its_step_naming_pass_step_and_shard) {
  trainer_config c = small_config("nan_data");
  const std::string root = fs::path(c.save_dir).parent_path().string();
  const std::string poisoned = poisoned_shard(1, 200, "nan_data_shard");
  c.passes = {{{shard(0)}}, {{poisoned}}, {{shard(2)}}};
  c.export_dir = root + "/exports";
  c.output_dir = root + "/out";
  c.save_every_pass = true;
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  const status s = t.value()->run();
  // Pass 1 has 12 steps (1,500 rows, batch 128); sample 200 is in the second batch of pass 2.
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_EQ(s.message(), "pass 2 step 14 (step 2 of the pass): shard " + poisoned +
                             ": the batch holds 1 non-finite dense features or labels; the run "
                             "stops before training on it");
  EXPECT_EQ(t.value()->step(), 13u);
  // Pass 1's export, save and metrics line are all there is.
  EXPECT_EQ(t.value()->history().size(), 1u);
  EXPECT_EQ(entries(c.export_dir), 1u);
  EXPECT_EQ(saved_passes(c.save_dir), 1u);
  std::ifstream jsonl(c.output_dir + "/metrics.jsonl");
  std::string line;
  std::size_t lines = 0;
  while (std::getline(jsonl, line)) ++lines;
  EXPECT_EQ(lines, 1u);

  // The same in the eval shard: the pass neither exports nor saves.
  trainer_config e = small_config("nan_eval");
  const std::string eroot = fs::path(e.save_dir).parent_path().string();
  e.passes = {{{shard(0)}}};
  e.eval_shard = poisoned;
  e.export_dir = eroot + "/exports";
  t = trainer::create(e);
  EMBCACHE_ASSERT_OK(t);
  EXPECT_EQ(t.value()->run().message(),
            "pass 1 step 12, evaluation on " + poisoned +
                ": samples 128..255 hold 1 non-finite dense features or labels");
  EXPECT_FALSE(fs::exists(e.save_dir));
  EXPECT_EQ(entries(e.export_dir), 0u);
}

TEST(trainer_divergence, huge_learning_rate_ends_the_run_fast_without_saving) {
  trainer_config c = small_config("huge_lr");
  const std::string root = fs::path(c.save_dir).parent_path().string();
  c.passes = {{{shard(0), shard(1)}}, {{shard(2)}}};
  c.model.adam.learning_rate = 1e30f;
  c.tables[1].optimizer.learning_rate = 1e30f;
  c.export_dir = root + "/exports";
  auto t = trainer::create(c);
  EMBCACHE_ASSERT_OK(t);
  const auto t0 = std::chrono::steady_clock::now();
  const status s = t.value()->run();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(s.ok());
  EXPECT_LT(seconds, 30.0);
  EXPECT_EQ(s.message().rfind("pass 1 step ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find(" of the pass): training diverged: "), std::string::npos)
      << s.message();
  EXPECT_LT(t.value()->step(), 24u);  // stopped inside pass 1
  EXPECT_TRUE(t.value()->history().empty());
  EXPECT_FALSE(fs::exists(c.save_dir));
  EXPECT_EQ(entries(c.export_dir), 0u);
}

// Makes one float of a save's dense.bin NaN and fixes the blob's checksum: `offset` 8 is the
// wide bias, 16 its Adam second moment (docs/model.md).
void poison_dense_state(const std::string& save, std::size_t offset) {
  std::string blob = read_bytes(save + "/dense.bin");
  ASSERT_GT(blob.size(), 36u);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&blob[offset], &nan, 4);
  const std::uint64_t h = XXH64(blob.data(), blob.size() - 8, 0);
  std::memcpy(&blob[blob.size() - 8], &h, 8);
  std::ofstream(save + "/dense.bin", std::ios::binary | std::ios::trunc) << blob;
}

TEST(trainer_divergence, non_finite_dense_state_after_the_pass_is_not_saved) {
  // A save whose wide bias has a NaN Adam second moment: the next dense update makes the bias
  // NaN. With one step in the pass no loss sees it; the end-of-pass check must.
  trainer_config first = small_config("nan_dense_first");
  first.passes = {{{shard(0)}}};
  ASSERT_EQ(run(first).step, 12u);
  poison_dense_state(first.save_dir, 16);
  trainer_config next = small_config("nan_dense_next");
  const std::string root = fs::path(next.save_dir).parent_path().string();
  next.passes = {{{shard(1)}}};
  next.batch_size = 2048;  // the whole shard in one step
  next.resume_from = first.save_dir;
  next.export_dir = root + "/exports";
  auto t = trainer::create(next);
  EMBCACHE_ASSERT_OK(t);
  const status s = t.value()->run();
  EXPECT_EQ(s.message(),
            "pass 2 step 13 (the pass's last step): training diverged: the dense weights or their "
            "Adam state are not finite" +
                stops_without_saving);
  EXPECT_FALSE(fs::exists(next.save_dir));
  EXPECT_EQ(entries(next.export_dir), 0u);
}

TEST(trainer_divergence, non_finite_logits_mark_the_model_diverged_and_nothing_is_saved) {
  // A NaN wide bias reaches every logit. Evaluation says so, and from then on the trainer
  // neither saves, nor exports, nor trains.
  trainer_config first = small_config("nan_bias_first");
  first.passes = {{{shard(0)}}};
  ASSERT_EQ(run(first).step, 12u);
  poison_dense_state(first.save_dir, 8);
  trainer_config next = small_config("nan_bias_next");
  const std::string root = fs::path(next.save_dir).parent_path().string();
  next.resume_from = first.save_dir;
  next.export_dir = root + "/exports";
  auto t = trainer::create(next);
  EMBCACHE_ASSERT_OK(t);
  auto e = t.value()->evaluate();
  ASSERT_FALSE(e.ok());
  const std::string expected = "pass 1 step 12, evaluation on " + next.data_dir + "/" + shard(5) +
                               ": training diverged: 128 of the 128 logits of samples 0..127 are "
                               "not finite" +
                               stops_without_saving;
  EXPECT_EQ(e.get_status().message(), expected);
  EXPECT_EQ(t.value()->save(root + "/later").message(), expected);
  EXPECT_FALSE(fs::exists(root + "/later"));
  EXPECT_EQ(t.value()->export_incremental().get_status().message(), expected);
  EXPECT_EQ(entries(next.export_dir), 0u);
  EXPECT_EQ(t.value()->run().message(), expected);
  EXPECT_EQ(t.value()->step(), 12u);
  EXPECT_FALSE(fs::exists(next.save_dir));
}

}  // namespace
}  // namespace embcache::test
