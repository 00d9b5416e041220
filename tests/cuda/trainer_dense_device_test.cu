// The trainer with its dense network on the device against the same run on the host (skips
// without a device): same losses and AUC within float tolerance, and saves that move between the
// two devices unchanged.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/status_assertions.hpp"
#include "embcache/synth.hpp"
#include "embcache/trainer/dense_backend.hpp"
#include "embcache/trainer/trainer.hpp"

namespace embcache {
namespace {

namespace fs = std::filesystem;

// One folder per test binary, removed at exit.
const std::string& root() {
  static const std::string r =
      (fs::temp_directory_path() / ("embcache_trainer_cuda_test_" + std::to_string(::getpid())))
          .string();
  return r;
}
struct root_cleanup {
  ~root_cleanup() {
    std::error_code ec;
    fs::remove_all(root(), ec);
  }
} cleanup_at_exit;

std::string temp_dir(const std::string& name) {
  const std::string d = root() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Four shards of 1,500 synthetic rows (the last one held out), made once per test binary.
const std::string& dataset() {
  static const std::string dir = [] {
    const std::string d = temp_dir("data");
    synth_options so;
    so.rows = 6000;
    so.cardinality_scale = 0.01;
    dataset_writer_options wo;
    wo.output_dir = d;
    wo.rows_per_shard = 1500;
    auto s = write_synth_dataset(so, wo);
    if (!s.ok()) throw std::runtime_error(s.get_status().to_string());
    return d;
  }();
  return dir;
}

trainer_config config(const std::string& device, trainer_mode mode) {
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
  c.dense_device = device;
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

TEST(trainer_dense_device, CudaAgreesWithHostInEveryMode) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
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

TEST(trainer_dense_device, SavesMoveBetweenDevicesUnchanged) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
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

}  // namespace
}  // namespace embcache
