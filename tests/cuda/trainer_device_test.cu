// The trainer with its dense network, its embedding tables or both on the device against the same
// run on the host (skips without a device): same losses and AUC within float tolerance, the same
// bits run to run and across the cache modes within the cuda space, the same bits whether the
// pooled embeddings stay on the device or cross to the host and back, and saves that move between
// the devices unchanged.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/cuda_device.hpp"
#include "common/status_assertions.hpp"
#include "common/temp_dir.hpp"
#include "common/trainer_dataset.hpp"
#include "embcache/synth.hpp"
#include "embcache/trainer/dense_backend.hpp"
#include "embcache/trainer/trainer.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;

// Folders of this test binary, removed at exit (tests/common/temp_dir.hpp).
testing::process_temp_cleanup cleanup_at_exit{"embcache_trainer_cuda_test"};

std::string temp_dir(const std::string& name) {
  return testing::process_temp_dir("embcache_trainer_cuda_test", name);
}

// Four shards of 1,500 synthetic rows (the last one held out), made once per test binary.
const std::string& dataset() {
  static const std::string dir = [] {
    const std::string d = temp_dir("data");
    const status s = test::write_trainer_dataset(d, 6000, /*cross=*/false);
    if (!s.ok()) throw std::runtime_error(s.to_string());
    return d;
  }();
  return dir;
}

// `device` places the dense network, `embeddings` the tables (config.embedding_device).
trainer_config config(const std::string& device, trainer_mode mode,
                      const std::string& embeddings = "host") {
  trainer_config c;
  c.mode = mode;
  c.data_dir = dataset();
  c.passes = {{{shard_file_name(0), shard_file_name(1)}}, {{shard_file_name(2)}}};
  c.eval_shard = shard_file_name(3);
  c.model.hidden = {64, 32};
  c.model.dropout = 0.1f;
  c.model.seed = 5;
  c.batch_size = 128;
  c.seed = 2;
  c.log_interval = 0;
  EXPECT_TRUE(device_choice_from_name(device, &c.dense_device)) << device;
  EXPECT_TRUE(device_choice_from_name(embeddings, &c.embedding_device)) << embeddings;
  return c;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Tolerances: cuBLAS and OpenBLAS sum the GEMMs' products in different orders (pedantic math, no
// TF32), so every float differs by a few ulps per step; over 36 Adam steps the per-pass mean loss
// stays within 1e-3 and the AUC within 5e-3 of the host run. A wrong gradient, a dropped dropout
// mask or a lost Adam step moves them by far more (the loss falls by about 0.1 over the run).
constexpr double loss_tolerance = 1e-3, auc_tolerance = 5e-3;

TEST(trainer_dense_device, cuda_agrees_with_host_in_every_mode) {
  EMBCACHE_NEED_CUDA_DEVICE();
  register_cuda_dense_backend();
  for (trainer_mode mode :
       {trainer_mode::keyset, trainer_mode::on_demand, trainer_mode::host_hybrid}) {
    SCOPED_TRACE(to_string(mode));
    auto host = trainer::create(config("host", mode));
    auto dev = trainer::create(config("cuda", mode));
    EMBCACHE_ASSERT_OK(host);
    EMBCACHE_ASSERT_OK(dev);
    EXPECT_STREQ(host.value()->model().device(), "host");
    EXPECT_STREQ(dev.value()->model().device(), "cuda");
    EXPECT_EQ(dev.value()->dense_note(), "dense network on cuda");
    EMBCACHE_ASSERT_OK(host.value()->run());
    EMBCACHE_ASSERT_OK(dev.value()->run());
    EXPECT_GT(dev.value()->model().transfer_seconds(), 0.0);
    const auto& h = host.value()->history();
    const auto& d = dev.value()->history();
    ASSERT_EQ(h.size(), 2u);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(dev.value()->step(), host.value()->step());
    for (std::size_t p = 0; p < h.size(); ++p) {
      EXPECT_NEAR(d[p].train_loss, h[p].train_loss, loss_tolerance) << "pass " << p + 1;
      EXPECT_NEAR(d[p].eval_logloss, h[p].eval_logloss, loss_tolerance) << "pass " << p + 1;
      EXPECT_NEAR(d[p].eval_auc, h[p].eval_auc, auc_tolerance) << "pass " << p + 1;
    }
    // Learning happened on both, so the comparison above is not between two idle models.
    EXPECT_LT(d[1].train_loss, d[0].train_loss);
  }
  set_cuda_dense_backend_factory(nullptr);
}

TEST(trainer_dense_device, saves_move_between_devices_unchanged) {
  EMBCACHE_NEED_CUDA_DEVICE();
  register_cuda_dense_backend();
  trainer_config c = config("cuda", trainer_mode::keyset);
  c.passes = {c.passes[0]};
  c.save_dir = temp_dir("from_cuda") + "/save";
  auto dev = trainer::create(c);
  EMBCACHE_ASSERT_OK(dev);
  EMBCACHE_ASSERT_OK(dev.value()->run());
  const std::string saved = read_bytes(c.save_dir + "/dense.bin");
  ASSERT_GT(saved.size(), 0u);

  // The cuda save loads on the host and saves back the same bytes, and the other way round.
  trainer_config on_host = config("host", trainer_mode::keyset);
  on_host.resume_from = c.save_dir;
  auto host = trainer::create(on_host);
  EMBCACHE_ASSERT_OK(host);
  const auto blob = host.value()->model().save();
  EXPECT_TRUE(std::string(blob.begin(), blob.end()) == saved);
  EXPECT_EQ(host.value()->step(), dev.value()->step());

  trainer_config back = config("cuda", trainer_mode::keyset);
  back.passes = {{{shard_file_name(2)}}};
  back.resume_from = c.save_dir;
  auto again = trainer::create(back);
  EMBCACHE_ASSERT_OK(again);
  const auto blob2 = again.value()->model().save();
  EXPECT_TRUE(std::string(blob2.begin(), blob2.end()) == saved);
  EMBCACHE_ASSERT_OK(again.value()->run());
  EXPECT_EQ(again.value()->history().back().pass, 2u);
  set_cuda_dense_backend_factory(nullptr);
}

// --- the embedding tables in the cuda space -------------------------------------------------

// The model files of two saves are the same bytes: per table every file but `version` (the
// cache's update clock, which counts swaps too), and dense.bin.
void expect_same_model(const std::string& a, const std::string& b) {
  for (const char* table : {"wide", "deep"}) {
    const std::string folder = std::string("/sparse/") + table;
    std::size_t files = 0;
    for (const auto& e : fs::directory_iterator(a + folder)) {
      if (e.path().filename() == "version") continue;
      const std::string f = folder + "/" + e.path().filename().string();
      const std::string x = read_bytes(a + f), y = read_bytes(b + f);
      EXPECT_GT(x.size(), 0u) << f;
      EXPECT_TRUE(x == y) << f << " differs between " << a << " and " << b;
      ++files;
    }
    EXPECT_GE(files, 3u) << folder;  // key, emb_vector, slot_id (+ the optimizer's files)
  }
  EXPECT_TRUE(read_bytes(a + "/dense.bin") == read_bytes(b + "/dense.bin")) << "dense.bin";
}

// Every run after the first has the first's per-pass metrics, to the bit, and its model bytes.
void expect_same_runs(const std::vector<std::string>& saves,
                      const std::vector<std::vector<pass_metrics>>& histories) {
  for (std::size_t r = 1; r < saves.size(); ++r) {
    SCOPED_TRACE("run " + std::to_string(r) + ", saved in " + saves[r]);
    ASSERT_EQ(histories[r].size(), histories[0].size());
    for (std::size_t p = 0; p < histories[0].size(); ++p) {
      EXPECT_EQ(histories[r][p].train_loss, histories[0][p].train_loss) << "pass " << p + 1;
      EXPECT_EQ(histories[r][p].eval_auc, histories[0][p].eval_auc) << "pass " << p + 1;
      EXPECT_EQ(histories[r][p].eval_logloss, histories[0][p].eval_logloss) << "pass " << p + 1;
    }
    expect_same_model(saves[0], saves[r]);
  }
}

table_counters totals(const cache_counters& c) {
  table_counters sum;
  for (const auto& t : c.total) sum += t;
  return sum;
}

// Keyset mode twice, once more with the staged rows moved by index (config.move_staged_rows),
// and on-demand mode with caches too small for the tables (rows evicted and written back), all
// with the tables in the cuda space and the dense network on the host: the same metrics and model
// bytes. The sparse ops sum in batch order on the device as on the host, and each row's optimizer
// step depends on that row alone, wherever the row lies in the pool.
TEST(trainer_embedding_device, device_tables_give_the_same_bits_run_to_run_and_in_both_modes) {
  EMBCACHE_NEED_CUDA_DEVICE();
  const std::pair<trainer_mode, const char*> runs[] = {{trainer_mode::keyset, "emb_keyset_a"},
                                                       {trainer_mode::keyset, "emb_keyset_b"},
                                                       {trainer_mode::keyset, "emb_keyset_moved"},
                                                       {trainer_mode::on_demand, "emb_on_demand"}};
  std::vector<std::string> saves;
  std::vector<std::vector<pass_metrics>> histories;
  for (const auto& [mode, name] : runs) {
    SCOPED_TRACE(name);
    trainer_config c = config("host", mode, "cuda");
    const bool moved = std::string(name) == "emb_keyset_moved";
    c.move_staged_rows = moved;
    if (mode == trainer_mode::on_demand) {
      c.tables[0].capacity = 4096;  // a batch holds at most 128 * 26 distinct keys
      c.tables[1].capacity = 4096;
    }
    c.save_dir = temp_dir(name) + "/save";
    auto t = trainer::create(c);
    EMBCACHE_ASSERT_OK(t);
    EXPECT_STREQ(t.value()->embedding_device(), "cuda");
    EXPECT_EQ(t.value()->embedding_note(), "embeddings on cuda");
    EXPECT_THROW((void)t.value()->cache(), error);
    EMBCACHE_ASSERT_OK(t.value()->run());
    EXPECT_EQ(&t.value()->counters(), &t.value()->cuda_cache().counters());
    const table_counters sum = totals(t.value()->counters());
    EXPECT_GT(sum.hits, 0u);
    if (mode == trainer_mode::on_demand) EXPECT_GT(sum.rows_evicted, 0u);
    if (moved) EXPECT_GT(sum.rows_moved, 0u);
    saves.push_back(c.save_dir);
    histories.push_back(t.value()->history());
  }
  expect_same_runs(saves, histories);
}

// The tables in the cuda space (with the dense network on the host, and with everything on the
// device) against everything on the host, in both cache modes: within the tolerances above.
TEST(trainer_embedding_device, device_tables_agree_with_host_tables_in_both_modes) {
  EMBCACHE_NEED_CUDA_DEVICE();
  register_cuda_dense_backend();
  for (trainer_mode mode : {trainer_mode::keyset, trainer_mode::on_demand}) {
    auto host = trainer::create(config("host", mode, "host"));
    EMBCACHE_ASSERT_OK(host);
    EMBCACHE_ASSERT_OK(host.value()->run());
    const auto& h = host.value()->history();
    ASSERT_EQ(h.size(), 2u);
    for (const char* dense : {"host", "cuda"}) {
      SCOPED_TRACE(std::string(to_string(mode)) + ", dense network on " + dense);
      auto dev = trainer::create(config(dense, mode, "cuda"));
      EMBCACHE_ASSERT_OK(dev);
      EXPECT_STREQ(dev.value()->embedding_device(), "cuda");
      EXPECT_STREQ(dev.value()->model().device(), dense);
      EMBCACHE_ASSERT_OK(dev.value()->run());
      const auto& d = dev.value()->history();
      ASSERT_EQ(d.size(), 2u);
      EXPECT_EQ(dev.value()->step(), host.value()->step());
      for (std::size_t p = 0; p < h.size(); ++p) {
        EXPECT_EQ(d[p].samples, h[p].samples) << "pass " << p + 1;
        EXPECT_NEAR(d[p].train_loss, h[p].train_loss, loss_tolerance) << "pass " << p + 1;
        EXPECT_NEAR(d[p].eval_logloss, h[p].eval_logloss, loss_tolerance) << "pass " << p + 1;
        EXPECT_NEAR(d[p].eval_auc, h[p].eval_auc, auc_tolerance) << "pass " << p + 1;
      }
      EXPECT_LT(d[1].train_loss, d[0].train_loss);
    }
  }
  set_cuda_dense_backend_factory(nullptr);
}

// A save made with the tables in the cuda space loads into host tables and saves back the same
// model bytes, and the other way round; training goes on from it.
TEST(trainer_embedding_device, saves_move_between_host_and_device_tables_unchanged) {
  EMBCACHE_NEED_CUDA_DEVICE();
  trainer_config c = config("host", trainer_mode::keyset, "cuda");
  c.passes = {c.passes[0]};
  c.save_dir = temp_dir("emb_from_cuda") + "/save";
  auto dev = trainer::create(c);
  EMBCACHE_ASSERT_OK(dev);
  EMBCACHE_ASSERT_OK(dev.value()->run());

  trainer_config on_host = config("host", trainer_mode::keyset, "host");
  on_host.resume_from = c.save_dir;
  auto host = trainer::create(on_host);
  EMBCACHE_ASSERT_OK(host);
  const std::string host_save = temp_dir("emb_on_host") + "/save";
  EMBCACHE_ASSERT_OK(host.value()->save(host_save));
  expect_same_model(c.save_dir, host_save);

  trainer_config back = config("host", trainer_mode::on_demand, "cuda");
  back.passes = {{{shard_file_name(2)}}};
  back.resume_from = host_save;
  auto again = trainer::create(back);
  EMBCACHE_ASSERT_OK(again);
  const std::string back_save = temp_dir("emb_back") + "/save";
  EMBCACHE_ASSERT_OK(again.value()->save(back_save));
  expect_same_model(c.save_dir, back_save);
  EMBCACHE_ASSERT_OK(again.value()->run());
  EXPECT_EQ(again.value()->history().back().pass, 2u);
}

// --- the tables and the dense network both on the device ------------------------------------

// The cuda dense backend behind a wrapper that counts which forward_backward the trainer calls;
// with `offer_device_inputs` off it hides forward_backward_on_device, so the trainer takes the
// host round trip with the same backend.
struct forward_calls {
  int host_arrays = 0, device_inputs = 0;
};
forward_calls calls;
bool offer_device_inputs = true;

class counting_backend final : public dense_backend {
 public:
  explicit counting_backend(std::unique_ptr<dense_backend> inner) : inner_(std::move(inner)) {}
  const char* device() const noexcept override { return inner_->device(); }
  const wide_deep_options& options() const noexcept override { return inner_->options(); }
  void predict(const wide_deep_batch& b, std::vector<float>& logits) override {
    inner_->predict(b, logits);
  }
  double forward_backward(const wide_deep_batch& b, std::uint64_t step, float* d_wide,
                          float* d_deep, std::vector<float>* logits) override {
    ++calls.host_arrays;
    return inner_->forward_backward(b, step, d_wide, d_deep, logits);
  }
  bool takes_device_inputs() const noexcept override { return offer_device_inputs; }
  double forward_backward_on_device(const wide_deep_batch& b, std::uint64_t step, float* d_wide,
                                    float* d_deep, std::vector<float>* logits) override {
    ++calls.device_inputs;
    return inner_->forward_backward_on_device(b, step, d_wide, d_deep, logits);
  }
  void apply_dense_update() override { inner_->apply_dense_update(); }
  std::size_t num_gradients() const noexcept override { return inner_->num_gradients(); }
  void get_gradients(float* out) override { inner_->get_gradients(out); }
  void set_gradients(const float* in) override { inner_->set_gradients(in); }
  std::vector<std::uint8_t> save() const override { return inner_->save(); }
  status load(const std::uint8_t* data, std::size_t size) override {
    return inner_->load(data, size);
  }

 private:
  std::unique_ptr<dense_backend> inner_;
};

std::unique_ptr<dense_backend> make_counting_backend(const wide_deep_options& o) {
  return std::make_unique<counting_backend>(make_cuda_dense_backend(o));
}

// Everything on the device: each step's pooled embeddings go from the device tables to the cuda
// dense backend and their gradients back without leaving the device. The same bits as the host
// round trip with the same backend, run to run, and in on-demand mode with small caches.
TEST(trainer_embedding_device, pooled_embeddings_stay_on_the_device_with_the_same_bits) {
  EMBCACHE_NEED_CUDA_DEVICE();
  struct run_case {
    const char* name;
    trainer_mode mode;
    bool counting, offer;
  };
  const run_case runs[] = {{"device_step_a", trainer_mode::keyset, true, true},
                           {"device_step_b", trainer_mode::keyset, false, true},
                           {"round_trip", trainer_mode::keyset, true, false},
                           {"device_step_on_demand", trainer_mode::on_demand, true, true}};
  std::vector<std::string> saves;
  std::vector<std::vector<pass_metrics>> histories;
  for (const run_case& r : runs) {
    SCOPED_TRACE(r.name);
    if (r.counting)
      set_cuda_dense_backend_factory(&make_counting_backend);
    else
      register_cuda_dense_backend();
    offer_device_inputs = r.offer;
    calls = {};
    trainer_config c = config("cuda", r.mode, "cuda");
    if (r.mode == trainer_mode::on_demand) {
      c.tables[0].capacity = 4096;
      c.tables[1].capacity = 4096;
    }
    c.save_dir = temp_dir(r.name) + "/save";
    auto t = trainer::create(c);
    EMBCACHE_ASSERT_OK(t);
    EXPECT_STREQ(t.value()->embedding_device(), "cuda");
    EXPECT_STREQ(t.value()->model().device(), "cuda");
    EXPECT_EQ(t.value()->model().takes_device_inputs(), r.offer);
    EMBCACHE_ASSERT_OK(t.value()->run());
    if (r.counting) {
      const int steps = int(t.value()->step());
      EXPECT_EQ(calls.device_inputs, r.offer ? steps : 0);
      EXPECT_EQ(calls.host_arrays, r.offer ? 0 : steps);
    }
    saves.push_back(c.save_dir);
    histories.push_back(t.value()->history());
  }
  expect_same_runs(saves, histories);
  EXPECT_LT(histories[0][1].train_loss, histories[0][0].train_loss);
  set_cuda_dense_backend_factory(nullptr);
  offer_device_inputs = true;
}

// The check of the caches against the device's free memory: tables larger than the device are
// refused before anything is allocated, naming the field.
TEST(trainer_embedding_device, caches_larger_than_the_device_are_out_of_device_memory) {
  EMBCACHE_NEED_CUDA_DEVICE();
  trainer_config c = config("host", trainer_mode::on_demand, "cuda");
  c.tables[1].capacity = std::size_t{1} << 40;  // 1.25 Ti slots of 232 bytes
  auto t = trainer::create(c);
  ASSERT_FALSE(t.ok());
  // The host's memory is not asked about the caches (they are not there).
  const std::string& m = t.get_status().message();
  EXPECT_EQ(t.get_status().code(), status_code::out_of_device_memory) << m;
  EXPECT_EQ(
      m.rfind("config.tables[1].capacity: the cache of table \"deep\" (1374389534720 slots", 0), 0u)
      << m;
  EXPECT_NE(m.find(" bytes of free device memory"), std::string::npos) << m;
}

}  // namespace
}  // namespace embcache
