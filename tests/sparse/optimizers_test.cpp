// In-row optimizers against double-precision references, and the host-hybrid path against the
// same ops on a dense row array.
#include "embcache/optimizers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/status_assertions.hpp"
#include "embcache/embedding_cache.hpp"
#include "embcache/host_hybrid.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

using test::random_batch;
using test::random_floats;

// --- plain double reference ----------------------------------------------------------------

// One element of one row, in the textbook formulas (TensorFlow's ApplyAdagrad / ApplyAdam /
// ApplyFtrl, lazy Adam as LazyAdamOptimizer); s1 and s2 are the two state halves.
void reference_update(const optimizer_options& o, double& w, double& s1, double& s2, double g,
                      std::uint64_t t) {
  const double lr = o.learning_rate;
  switch (o.kind) {
    case optimizer_kind::sgd:
      w -= lr * g;
      break;
    case optimizer_kind::adagrad:
      s1 += g * g;
      w -= lr * g / (std::sqrt(s1) + double(o.epsilon));
      break;
    case optimizer_kind::adam: {
      const double b1 = o.beta1, b2 = o.beta2;
      s1 = b1 * s1 + (1 - b1) * g;
      s2 = b2 * s2 + (1 - b2) * g * g;
      const double lr_t =
          lr * std::sqrt(1 - std::pow(b2, double(t))) / (1 - std::pow(b1, double(t)));
      w -= lr_t * s1 / (std::sqrt(s2) + double(o.epsilon));
      break;
    }
    case optimizer_kind::ftrl: {
      const double alpha = o.ftrl_alpha, p = -double(o.ftrl_lr_power), l1 = o.ftrl_l1;
      const double l2 = double(o.ftrl_l2) + double(o.ftrl_beta) / (2 * alpha);
      const double n_new = s1 + g * g;
      s2 += g - (std::pow(n_new, p) - std::pow(s1, p)) / alpha * w;
      const double quadratic = std::pow(n_new, p) / alpha + 2 * l2;
      w = std::fabs(s2) > l1 ? ((s2 > 0 ? l1 : -l1) - s2) / quadratic : 0.0;
      s1 = n_new;
      break;
    }
  }
}

struct reference_run {
  double max_rel_error_rounded = 0;  // against the reference that stores float every step
  double max_rel_error_exact = 0;    // against the reference that never rounds
  bool untouched_rows_kept = true;
};

double rel_error(float a, double r) {
  if (double(a) == r) return 0;
  return std::fabs(double(a) - r) / std::max(std::fabs(r), 1e-30);
}

// `steps` steps on `num_rows` random rows; each step updates a random subset with random grads.
reference_run run_against_reference(const optimizer_options& o, std::size_t dim, int steps,
                                    std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::size_t num_rows = 48;
  const std::size_t sw = state_width(o.kind, dim);
  const std::size_t width = dim + sw + 1;  // one trailing float that must never change
  std::vector<float> rows(num_rows * width);
  std::vector<double> rounded(num_rows * width), exact(num_rows * width);
  auto init = random_floats(rng, num_rows * dim, -0.5f, 0.5f);
  for (std::size_t r = 0; r < num_rows; ++r) {
    for (std::size_t d = 0; d < dim; ++d) rows[r * width + d] = init[r * dim + d];
    initialize_state(o, dim, &rows[r * width + dim]);
    rows[r * width + dim + sw] = 42.0f;
  }
  for (std::size_t i = 0; i < rows.size(); ++i) rounded[i] = exact[i] = rows[i];

  std::bernoulli_distribution pick(0.6);
  std::uniform_real_distribution<float> grad(-1, 1);
  reference_run result;
  for (int t = 1; t <= steps; ++t) {
    std::vector<std::int64_t> unique;
    for (std::size_t r = 0; r < num_rows; ++r)
      if (pick(rng)) unique.push_back(static_cast<std::int64_t>(r));
    // Rows in any order: the optimizer must not care.
    std::shuffle(unique.begin(), unique.end(), rng);
    std::vector<float> g(unique.size() * dim);
    for (auto& x : g) x = grad(rng);
    std::vector<float> before = rows;
    apply_optimizer(host_space{}, o, rows.data(), width, dim, unique.data(), g.data(),
                    unique.size(), static_cast<std::uint64_t>(t));
    std::vector<bool> in_batch(num_rows, false);
    for (std::size_t u = 0; u < unique.size(); ++u) {
      const std::size_t r = static_cast<std::size_t>(unique[u]);
      in_batch[r] = true;
      for (std::size_t d = 0; d < dim; ++d) {
        double* ref[2] = {&rounded[r * width], &exact[r * width]};
        for (int k = 0; k < 2; ++k) {
          double& w = ref[k][d];
          double dummy1 = 0, dummy2 = 0;
          double& s1 = sw >= dim ? ref[k][dim + d] : dummy1;
          double& s2 = sw >= 2 * dim ? ref[k][2 * dim + d] : dummy2;
          reference_update(o, w, s1, s2, g[u * dim + d], static_cast<std::uint64_t>(t));
          if (k == 0) {  // rows are stored as float: round the stored state once per step
            w = float(w);
            s1 = float(s1);
            s2 = float(s2);
          }
        }
      }
    }
    for (std::size_t r = 0; r < num_rows; ++r)
      if (!in_batch[r] &&
          std::memcmp(&rows[r * width], &before[r * width], width * sizeof(float)) != 0)
        result.untouched_rows_kept = false;
  }
  // Elementwise against the rounded reference; normwise per part (weights, each state half)
  // against the exact one, where single elements near zero make elementwise ratios meaningless.
  for (std::size_t i = 0; i < rows.size(); ++i)
    result.max_rel_error_rounded =
        std::max(result.max_rel_error_rounded, rel_error(rows[i], rounded[i]));
  for (std::size_t part = 0; part * dim < dim + sw; ++part) {
    double max_err = 0, max_ref = 0;
    for (std::size_t r = 0; r < num_rows; ++r)
      for (std::size_t d = 0; d < dim; ++d) {
        const std::size_t i = r * width + part * dim + d;
        max_err = std::max(max_err, std::fabs(double(rows[i]) - exact[i]));
        max_ref = std::max(max_ref, std::fabs(exact[i]));
      }
    result.max_rel_error_exact = std::max(result.max_rel_error_exact, max_err / max_ref);
  }
  for (std::size_t r = 0; r < num_rows; ++r)
    if (rows[r * width + dim + sw] != 42.0f) result.untouched_rows_kept = false;
  return result;
}

// The float implementation must match, element by element, the double reference that rounds its
// stored state to float after every step (rows are float; the implementation computes each step
// in double) to 1e-6 relative; in practice the two are equal to the last bit. Against the
// never-rounded double trajectory the difference is the float storage rounding accumulated over
// 300 steps (2^-24 per store, a random walk: about 1e-6 of the largest value of each part, seen
// up to 7.6e-7), so that one is checked normwise at 5e-6, which a wrong formula exceeds by far.
void expect_matches_reference(const optimizer_options& o) {
  for (std::size_t dim : {1u, 16u}) {
    const reference_run r = run_against_reference(o, dim, 300, 1000 + dim);
    EXPECT_LE(r.max_rel_error_rounded, 1e-6) << to_string(o.kind) << " dim " << dim;
    EXPECT_LE(r.max_rel_error_exact, 5e-6) << to_string(o.kind) << " dim " << dim;
    EXPECT_TRUE(r.untouched_rows_kept) << to_string(o.kind) << " dim " << dim;
  }
}

// One case per optimizer (and FTRL once more with beta, another power and a start value).
struct reference_case {
  const char* name;
  optimizer_options options;
};

optimizer_options reference_options(optimizer_kind kind) {
  optimizer_options o;
  o.kind = kind;
  switch (kind) {
    case optimizer_kind::sgd:
    case optimizer_kind::adam:
      o.learning_rate = 0.01f;
      break;
    case optimizer_kind::adagrad:
      o.learning_rate = 0.05f;
      break;
    case optimizer_kind::ftrl:
      o.ftrl_alpha = 0.05f;
      o.ftrl_l1 = 0.001f;
      o.ftrl_l2 = 0.01f;
      break;
  }
  return o;
}

optimizer_options ftrl_with_beta_and_another_power() {
  optimizer_options o;
  o.kind = optimizer_kind::ftrl;
  o.ftrl_alpha = 0.1f;
  o.ftrl_beta = 1.0f;
  o.ftrl_l1 = 0.01f;
  o.ftrl_l2 = 0.001f;
  o.ftrl_lr_power = -0.3f;
  o.ftrl_initial_accumulator = 0.5f;
  return o;
}

class optimizer_reference : public ::testing::TestWithParam<reference_case> {};

TEST_P(optimizer_reference, matches_the_double_reference) {
  expect_matches_reference(GetParam().options);
}

INSTANTIATE_TEST_SUITE_P(
    optimizers, optimizer_reference,
    ::testing::Values(reference_case{"sgd", reference_options(optimizer_kind::sgd)},
                      reference_case{"adagrad", reference_options(optimizer_kind::adagrad)},
                      reference_case{"lazy_adam", reference_options(optimizer_kind::adam)},
                      reference_case{"ftrl", reference_options(optimizer_kind::ftrl)},
                      reference_case{"ftrl_with_beta_and_another_power",
                                     ftrl_with_beta_and_another_power()}),
    [](const ::testing::TestParamInfo<reference_case>& info) { return info.param.name; });

// --- exact single steps ----------------------------------------------------------------------

TEST(optimizers, sgd_step_is_exact) {
  optimizer_options o;
  o.learning_rate = 0.25f;
  std::vector<float> rows = {1, 2, 3, 4};  // two rows of dim 2
  const std::int64_t r[] = {1};
  const float g[] = {0.5f, -4};
  apply_optimizer(host_space{}, o, rows.data(), 2, 2, r, g, 1, 0);
  EXPECT_EQ(rows, (std::vector<float>{1, 2, 2.875f, 5}));
}

TEST(optimizers, adagrad_accumulates_squares) {
  optimizer_options o;
  o.kind = optimizer_kind::adagrad;
  o.learning_rate = 1.0f;
  o.epsilon = 0;
  o.adagrad_initial_accumulator = 0.0f;
  std::vector<float> rows = {1, 0};
  initialize_state(o, 1, &rows[1]);
  const std::int64_t r[] = {0};
  const float g1[] = {3}, g2[] = {4};
  apply_optimizer(host_space{}, o, rows.data(), 2, 1, r, g1, 1, 1);
  EXPECT_EQ(rows, (std::vector<float>{0, 9}));  // a = 9, w = 1 - 3/3
  apply_optimizer(host_space{}, o, rows.data(), 2, 1, r, g2, 1, 2);
  EXPECT_EQ(rows, (std::vector<float>{-0.8f, 25}));  // a = 25, w = 0 - 4/5
}

TEST(optimizers, adam_first_step_moves_by_the_learning_rate) {
  // With bias correction, step 1 moves w by lr * g / (|g| + eps'): by lr against the gradient.
  optimizer_options o;
  o.kind = optimizer_kind::adam;
  o.learning_rate = 0.125f;
  std::vector<float> rows = {1, -1, 0, 0, 0, 0};
  const std::int64_t r[] = {0};
  const float g[] = {0.5f, -2};
  apply_optimizer(host_space{}, o, rows.data(), 6, 2, r, g, 1, 1);
  EXPECT_NEAR(rows[0], 0.875f, 1e-6);
  EXPECT_NEAR(rows[1], -0.875f, 1e-6);
  // m = (1 - beta1) g, v = (1 - beta2) g^2, with the betas as the floats the options hold.
  EXPECT_EQ(rows[2], float((1 - double(0.9f)) * 0.5));
  EXPECT_EQ(rows[3], float((1 - double(0.9f)) * -2));
  EXPECT_EQ(rows[4], float((1 - double(0.999f)) * 0.25));
  EXPECT_EQ(rows[5], float((1 - double(0.999f)) * 4));
  EXPECT_THROW(apply_optimizer(host_space{}, o, rows.data(), 6, 2, r, g, 1, 0), error);
}

TEST(optimizers, non_finite_rows_are_flagged_by_the_update_itself) {
  // SGD, dim 2, rows of 4 floats (2 past what SGD needs, also checked). Row 0 stays finite; row 1
  // overflows to -inf; row 2 gets a NaN gradient; row 3 held a NaN in its last float already;
  // row 4 is not updated (not in unique_rows) and holds an infinity, which nothing flags.
  optimizer_options o;
  o.kind = optimizer_kind::sgd;
  o.learning_rate = 1.0f;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> rows = {1, 2, 0, 0, -3e38f, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, nan, inf, 0, 0, 0};
  std::vector<float> plain = rows;
  const std::int64_t r[] = {0, 1, 2, 3};
  const float g[] = {0.5f, 0.5f, 3e38f, 0, nan, 0, 0, 0};
  std::vector<std::int8_t> flags(4, 7);
  apply_optimizer(host_space{}, o, rows.data(), 4, 2, r, g, 4, 1, flags.data());
  EXPECT_EQ(flags, (std::vector<std::int8_t>{0, 1, 1, 1}));
  // The flags change nothing in the update.
  apply_optimizer(host_space{}, o, plain.data(), 4, 2, r, g, 4, 1);
  EXPECT_EQ(std::memcmp(rows.data(), plain.data(), rows.size() * sizeof(float)), 0);
  EXPECT_EQ(rows[0], 0.5f);
  EXPECT_EQ(rows[4], -inf);
  // Every kind flags the same rows (Adam's and FTRL's state included).
  for (optimizer_kind kind :
       {optimizer_kind::adagrad, optimizer_kind::adam, optimizer_kind::ftrl}) {
    optimizer_options k;
    k.kind = kind;
    const std::size_t width = 2 + state_width(kind, 2);
    std::vector<float> rw(3 * width, 1.0f);
    rw[2 * width + width - 1] = nan;  // row 2's last state float
    const float gk[] = {0.5f, 0.5f, nan, 0, 0.25f, 0.25f};
    const std::int64_t rk[] = {0, 1, 2};
    std::vector<std::int8_t> fk(3, 7);
    apply_optimizer(host_space{}, k, rw.data(), width, 2, rk, gk, 3, 1, fk.data());
    EXPECT_EQ(fk, (std::vector<std::int8_t>{0, 1, 1})) << to_string(kind);
  }
}

TEST(optimizers, ftrl_l1_zeroes_small_weights) {
  optimizer_options o;
  o.kind = optimizer_kind::ftrl;
  o.ftrl_alpha = 1.0f;
  o.ftrl_l1 = 1.0f;
  o.ftrl_initial_accumulator = 1.0f;
  // n = 1 -> 1 + 0.25; z = 0.5 - (sqrt(1.25) - 1) * 2: |z| < l1, so w = 0.
  std::vector<float> rows = {2, 0, 0};
  initialize_state(o, 1, &rows[1]);
  EXPECT_EQ(rows, (std::vector<float>{2, 1, 0}));
  const std::int64_t r[] = {0};
  const float g[] = {0.5f};
  apply_optimizer(host_space{}, o, rows.data(), 3, 1, r, g, 1, 1);
  EXPECT_EQ(rows[0], 0.0f);
  EXPECT_EQ(rows[1], 1.25f);
  EXPECT_FLOAT_EQ(rows[2], float(0.5 - (std::sqrt(1.25) - 1) * 2));
}

TEST(optimizers, state_widths_and_start_values) {
  EXPECT_EQ(state_width(optimizer_kind::sgd, 16), 0u);
  EXPECT_EQ(state_width(optimizer_kind::adagrad, 16), 16u);
  EXPECT_EQ(state_width(optimizer_kind::adam, 16), 32u);
  EXPECT_EQ(state_width(optimizer_kind::ftrl, 16), 32u);
  optimizer_options o;
  EXPECT_EQ(initial_state_value(o), 0.0f);
  o.kind = optimizer_kind::adagrad;
  EXPECT_EQ(initial_state_value(o), 0.1f);
  o.kind = optimizer_kind::adam;
  EXPECT_EQ(initial_state_value(o), 0.0f);
  o.kind = optimizer_kind::ftrl;
  o.ftrl_initial_accumulator = 0.25f;
  EXPECT_EQ(initial_state_value(o), 0.25f);
  std::vector<float> state(4, -1.0f);
  initialize_state(o, 2, state.data());
  EXPECT_EQ(state, (std::vector<float>{0.25f, 0.25f, 0, 0}));
}

TEST(optimizers, defaults_are_mind_spore_and_tensor_flow_ones) {
  const optimizer_options o;
  EXPECT_EQ(o.kind, optimizer_kind::sgd);
  EXPECT_EQ(o.learning_rate, 0.001f);
  EXPECT_EQ(o.beta1, 0.9f);
  EXPECT_EQ(o.beta2, 0.999f);
  EXPECT_EQ(o.epsilon, 1e-8f);
  EXPECT_EQ(o.adagrad_initial_accumulator, 0.1f);
  EXPECT_EQ(o.ftrl_alpha, 0.001f);
  EXPECT_EQ(o.ftrl_beta, 0.0f);
  EXPECT_EQ(o.ftrl_l1, 0.0f);
  EXPECT_EQ(o.ftrl_l2, 0.0f);
  EXPECT_EQ(o.ftrl_lr_power, -0.5f);
  EXPECT_EQ(o.ftrl_initial_accumulator, 0.1f);
  EMBCACHE_EXPECT_OK(check_options(o));
}

TEST(optimizers, bad_options_and_row_widths_are_refused) {
  optimizer_options o;
  o.beta2 = 1.0f;
  status s = check_options(o);
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_NE(s.message().find("beta2 is 1.000000, expected in [0, 1)"), std::string::npos)
      << s.message();
  o = {};
  o.ftrl_lr_power = 0.5f;
  EXPECT_EQ(check_options(o).code(), status_code::invalid_argument);
  o = {};
  o.learning_rate = std::nanf("");
  EXPECT_EQ(check_options(o).code(), status_code::invalid_argument);

  o = {};
  o.kind = optimizer_kind::adam;
  std::vector<float> rows(40);
  const std::int64_t r[] = {0};
  const float g[8] = {};
  EXPECT_THROW(apply_optimizer(host_space{}, o, rows.data(), 23, 8, r, g, 1, 1), error);
  EXPECT_NO_THROW(apply_optimizer(host_space{}, o, rows.data(), 24, 8, r, g, 1, 1));
}

TEST(optimizers, bit_identical_whatever_the_thread_count) {
  std::mt19937_64 rng(21);
  const std::size_t dim = 16, num_rows = 20000;
  for (optimizer_kind kind :
       {optimizer_kind::sgd, optimizer_kind::adagrad, optimizer_kind::adam, optimizer_kind::ftrl}) {
    optimizer_options o;
    o.kind = kind;
    o.learning_rate = 0.01f;
    o.ftrl_alpha = 0.05f;
    o.ftrl_l1 = 0.001f;
    const std::size_t width = dim + state_width(kind, dim);
    auto rows1 = random_floats(rng, num_rows * width, 0.0f, 0.5f);
    auto rows2 = rows1;
    const auto b = random_batch(rng, 1024, 8, num_rows, 1, 3);
    const auto d_out = random_floats(rng, 1024 * 8 * dim, -1, 1);
    sparse_gradients<host_space> g1, g2;
    aggregate_gradients(host_space{1}, b.view(), combiner::mean, d_out.data(), dim, g1);
    aggregate_gradients(host_space{2}, b.view(), combiner::mean, d_out.data(), dim, g2);
    for (std::uint64_t step = 1; step <= 3; ++step) {
      apply_optimizer(host_space{1}, o, rows1.data(), width, g1, step);
      apply_optimizer(host_space{2}, o, rows2.data(), width, g2, step);
    }
    EXPECT_EQ(0, std::memcmp(rows1.data(), rows2.data(), rows1.size() * sizeof(float)))
        << to_string(kind);
  }
}

// --- host-hybrid ------------------------------------------------------------------------------

// A parameter store over std::map, enough for the host-hybrid path (no files, no checkpoints).
class map_store final : public param_store<std::int64_t> {
 public:
  explicit map_store(std::size_t row_width) : row_width_(row_width) {}
  std::size_t row_width() const noexcept override { return row_width_; }
  const std::string& table_name() const noexcept override { return name_; }
  status pull(const std::int64_t* keys, std::size_t n, float* rows_out, bool* found_out,
              std::uint64_t* versions_out) override {
    if (fail_) return status::io_error("map_store: pull of " + std::to_string(n) + " keys failed");
    for (std::size_t i = 0; i < n; ++i) {
      auto it = rows_.find(keys[i]);
      found_out[i] = it != rows_.end();
      if (!found_out[i]) continue;
      std::copy(it->second.first.begin(), it->second.first.end(), rows_out + i * row_width_);
      if (versions_out) versions_out[i] = it->second.second;
    }
    ++pulls_;
    return {};
  }
  status push(const std::int64_t* keys, std::size_t n, const float* rows,
              const std::uint64_t* versions) override {
    const std::uint64_t v = max_version_ + 1;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t vi = versions ? versions[i] : v;
      rows_[keys[i]] = {std::vector<float>(rows + i * row_width_, rows + (i + 1) * row_width_), vi};
      max_version_ = std::max(max_version_, vi);
    }
    return {};
  }
  status erase(const std::int64_t* keys, std::size_t n, std::size_t* erased_out) override {
    std::size_t e = 0;
    for (std::size_t i = 0; i < n; ++i) e += rows_.erase(keys[i]);
    if (erased_out) *erased_out = e;
    return {};
  }
  status contains(const std::int64_t* keys, std::size_t n, bool* found_out) override {
    for (std::size_t i = 0; i < n; ++i) found_out[i] = rows_.count(keys[i]) > 0;
    return {};
  }
  std::size_t size() const noexcept override { return rows_.size(); }
  std::uint64_t max_version() const noexcept override { return max_version_; }
  status for_each(std::size_t, const store_batch_fn<std::int64_t>&) override {
    return status::unsupported("map_store::for_each");
  }
  status for_each_changed_since(std::uint64_t, std::size_t,
                                const store_batch_fn<std::int64_t>&) override {
    return status::unsupported("map_store::for_each_changed_since");
  }
  status flush() override { return {}; }
  status checkpoint(const std::string&) override { return status::unsupported("checkpoint"); }

  const std::vector<float>* row(std::int64_t key) const {
    auto it = rows_.find(key);
    return it == rows_.end() ? nullptr : &it->second.first;
  }
  int pulls() const { return pulls_; }
  void fail_next_pulls() { fail_ = true; }

 private:
  std::size_t row_width_;
  std::string name_ = "map_table";
  std::map<std::int64_t, std::pair<std::vector<float>, std::uint64_t>> rows_;
  std::uint64_t max_version_ = 0;
  int pulls_ = 0;
  bool fail_ = false;
};

key_batch<std::int64_t> keys_of(const test::owned_batch& b) {
  return {b.batch_size, b.num_slots, b.offsets.data(), b.indices.data(), b.indices.size()};
}

// The host-hybrid path and the same ops on a dense row array indexed by key (the row pool the
// cache path trains) leave bit-identical rows, and pool to bit-identical outputs.
void check_hybrid_equals_row_array(optimizer_kind kind, combiner comb) {
  std::mt19937_64 rng(100 + int(kind) * 2 + int(comb));
  host_hybrid_options ho;
  ho.dim = 8;
  ho.comb = comb;
  ho.optimizer.kind = kind;
  ho.optimizer.learning_rate = 0.01f;
  ho.optimizer.ftrl_alpha = 0.05f;
  ho.optimizer.ftrl_l1 = 0.001f;
  ho.optimizer.ftrl_l2 = 0.01f;
  ho.init_seed = 77;
  const std::size_t dim = ho.dim, width = dim + state_width(kind, dim), num_keys = 300;

  map_store store(width);
  std::vector<float> dense(num_keys * width);
  for (std::size_t k = 0; k < num_keys; ++k) {
    for (std::size_t d = 0; d < dim; ++d)
      dense[k * width + d] = default_embedding_value(ho.init_seed, k, d, ho.init_scale);
    initialize_state(ho.optimizer, dim, &dense[k * width + dim]);
  }
  // Keys 0..9 already live in the store, with rows of their own.
  std::set<std::int64_t> expected_keys;
  for (std::int64_t k = 0; k < 10; ++k) {
    auto row = random_floats(rng, width, 0.01f, 0.2f);
    std::copy(row.begin(), row.end(), &dense[k * width]);
    EMBCACHE_ASSERT_OK(store.push(&k, 1, row.data(), nullptr));
    expected_keys.insert(k);
  }

  host_hybrid_table<std::int64_t> table(store, ho);
  sparse_gradients<host_space> grads;
  const int steps = 20;
  for (int t = 1; t <= steps; ++t) {
    const auto b = random_batch(rng, 32, 4, num_keys, 0, 3);
    for (auto k : b.indices) expected_keys.insert(k);
    const std::size_t bags = 32 * 4;
    std::vector<float> out_h(bags * dim), out_d(bags * dim);
    EMBCACHE_ASSERT_OK(table.forward(keys_of(b), out_h.data()));
    lookup_combine(host_space{}, dense.data(), width, dim, b.view(), comb, out_d.data());
    ASSERT_EQ(0, std::memcmp(out_h.data(), out_d.data(), out_h.size() * sizeof(float)))
        << "step " << t;
    const auto d_out = random_floats(rng, bags * dim, -1, 1);
    EMBCACHE_ASSERT_OK(table.backward(d_out.data()));
    aggregate_gradients(host_space{}, b.view(), comb, d_out.data(), dim, grads);
    apply_optimizer(host_space{}, ho.optimizer, dense.data(), width, grads,
                    static_cast<std::uint64_t>(t));
  }
  EXPECT_EQ(table.step(), static_cast<std::uint64_t>(steps));
  EXPECT_EQ(store.size(), expected_keys.size());
  for (std::int64_t k = 0; k < std::int64_t(num_keys); ++k) {
    const std::vector<float>* row = store.row(k);
    if (!expected_keys.count(k)) {
      EXPECT_EQ(row, nullptr) << "key " << k << " was never in a batch";
      continue;
    }
    ASSERT_NE(row, nullptr) << "key " << k;
    EXPECT_EQ(0, std::memcmp(row->data(), &dense[k * width], width * sizeof(float)))
        << "key " << k << " " << to_string(kind);
  }
}

TEST(host_hybrid, leaves_the_same_rows_as_the_row_array_path_sgd_sum) {
  check_hybrid_equals_row_array(optimizer_kind::sgd, combiner::sum);
}
TEST(host_hybrid, leaves_the_same_rows_as_the_row_array_path_adagrad_mean) {
  check_hybrid_equals_row_array(optimizer_kind::adagrad, combiner::mean);
}
TEST(host_hybrid, leaves_the_same_rows_as_the_row_array_path_adam_sum) {
  check_hybrid_equals_row_array(optimizer_kind::adam, combiner::sum);
}
TEST(host_hybrid, leaves_the_same_rows_as_the_row_array_path_ftrl_mean) {
  check_hybrid_equals_row_array(optimizer_kind::ftrl, combiner::mean);
}

// The host-hybrid path against the device cache's path (embedding_cache in the host space:
// lookup_slots with insertion, the ops on its row pool, mark_updated). New keys start from the
// cache's own initializer in both paths; their state from initialize_state (the cache fills
// state with one value, which FTRL's linear half must not take, so the test sets it).
void check_hybrid_equals_cache(optimizer_kind kind, combiner comb) {
  std::mt19937_64 rng(300 + int(kind) * 2 + int(comb));
  host_hybrid_options ho;
  ho.dim = 8;
  ho.comb = comb;
  ho.optimizer.kind = kind;
  ho.optimizer.learning_rate = 0.01f;
  ho.optimizer.ftrl_alpha = 0.05f;
  ho.optimizer.ftrl_l1 = 0.001f;
  const std::size_t dim = ho.dim, sw = state_width(kind, dim), width = dim + sw;
  const std::int64_t num_keys = 400;
  cache_options co;
  co.slots = 4096;
  co.dim = dim;
  co.state_width = sw;
  co.init.seed = 99;
  embedding_cache<std::int64_t, host_space> cache(co);

  // The cache's initial embedding of every key, from a twin cache, for the hybrid's initializer.
  std::vector<float> initial(num_keys * width);
  {
    embedding_cache<std::int64_t, host_space> twin(co);
    std::vector<std::int64_t> all(num_keys);
    for (std::int64_t k = 0; k < num_keys; ++k) all[k] = k;
    EMBCACHE_ASSERT_OK(twin.find_or_insert(all.data(), all.size(), initial.data(), nullptr));
  }
  map_store store(width);
  host_hybrid_table<std::int64_t> table(store, ho, [&](std::int64_t key, float* e, std::size_t d) {
    std::copy(&initial[key * width], &initial[key * width] + d, e);
  });
  std::vector<float> state(sw);
  initialize_state(ho.optimizer, dim, state.data());
  sparse_gradients<host_space> grads;
  for (int t = 1; t <= 15; ++t) {
    auto b = random_batch(rng, 32, 4, num_keys, 0, 3);
    const std::size_t bags = 32 * 4, n = b.indices.size();
    std::vector<float> out_h(bags * dim), out_c(bags * dim);
    EMBCACHE_ASSERT_OK(table.forward(keys_of(b), out_h.data()));

    std::vector<std::int64_t> slots(n);
    std::unique_ptr<bool[]> inserted(new bool[n]);
    EMBCACHE_ASSERT_OK(cache.lookup_slots(b.indices.data(), n, slots.data(), true, inserted.get()));
    for (std::size_t i = 0; i < n; ++i) {
      if (!inserted[i]) continue;
      std::vector<float> row(width);
      cache.read_slots(&slots[i], 1, row.data());
      std::copy(state.begin(), state.end(), row.begin() + dim);
      cache.assign_slots(&slots[i], 1, row.data());
    }
    const slot_batch sb{b.batch_size, b.num_slots, b.offsets.data(), slots.data(), n};
    lookup_combine(host_space{}, cache.row_pool(), cache.row_width(), dim, sb, comb, out_c.data());
    ASSERT_EQ(0, std::memcmp(out_h.data(), out_c.data(), out_h.size() * sizeof(float)))
        << "step " << t;

    const auto d_out = random_floats(rng, bags * dim, -1, 1);
    EMBCACHE_ASSERT_OK(table.backward(d_out.data()));
    aggregate_gradients(host_space{}, sb, comb, d_out.data(), dim, grads);
    apply_optimizer(host_space{}, ho.optimizer, cache.row_pool(), cache.row_width(), grads,
                    static_cast<std::uint64_t>(t));
    cache.mark_updated(grads.rows.data(), grads.size);
  }
  ASSERT_EQ(store.size(), cache.size());
  for (std::int64_t k = 0; k < num_keys; ++k) {
    const std::vector<float>* row = store.row(k);
    std::int64_t slot = -1;
    EMBCACHE_ASSERT_OK(cache.lookup_slots(&k, 1, &slot));
    ASSERT_EQ(row != nullptr, slot >= 0) << "key " << k;
    if (!row) continue;
    std::vector<float> cached(width);
    cache.read_slots(&slot, 1, cached.data());
    EXPECT_EQ(0, std::memcmp(row->data(), cached.data(), width * sizeof(float))) << "key " << k;
  }
}

TEST(host_hybrid, leaves_the_same_rows_as_the_cache_path_adam_sum) {
  check_hybrid_equals_cache(optimizer_kind::adam, combiner::sum);
}
TEST(host_hybrid, leaves_the_same_rows_as_the_cache_path_ftrl_mean) {
  check_hybrid_equals_cache(optimizer_kind::ftrl, combiner::mean);
}

TEST(host_hybrid, caller_initializer_fills_missing_keys_and_state_starts_at_its_initial_value) {
  host_hybrid_options ho;
  ho.dim = 2;
  ho.optimizer.kind = optimizer_kind::adagrad;
  map_store store(4);
  host_hybrid_table<std::int64_t> table(store, ho, [](std::int64_t key, float* e, std::size_t dim) {
    for (std::size_t d = 0; d < dim; ++d) e[d] = float(key) + float(d) / 4;
  });
  // One sample, slots {7, 7} and {9}: sum pooling.
  const std::int64_t offsets[] = {0, 2, 3};
  const std::int64_t keys[] = {7, 7, 9};
  std::vector<float> out(4);
  EMBCACHE_ASSERT_OK(table.forward({1, 2, offsets, keys, 3}, out.data()));
  EXPECT_EQ(table.num_unique_keys(), 2u);
  EXPECT_EQ(out, (std::vector<float>{14, 14.5f, 9, 9.25f}));
  const std::vector<float> zero(4, 0.0f);
  EMBCACHE_ASSERT_OK(table.backward(zero.data()));
  ASSERT_NE(store.row(7), nullptr);
  EXPECT_EQ(*store.row(7), (std::vector<float>{7, 7.25f, 0.1f, 0.1f}));
  EXPECT_EQ(*store.row(9), (std::vector<float>{9, 9.25f, 0.1f, 0.1f}));
  EXPECT_EQ(store.max_version(), 1u);
}

// Keys feature admission refused (forward's `refused`) have no row: they read zeros, get no
// gradient and never reach the store; the other keys train as without them. advance_version()
// lifts the next push's stamp above a given clock.
TEST(host_hybrid, refused_keys_read_zeros_and_never_reach_the_store) {
  host_hybrid_options ho;
  ho.dim = 2;
  ho.optimizer.kind = optimizer_kind::sgd;
  ho.optimizer.learning_rate = 0.5f;
  map_store store(2);
  host_hybrid_table<std::int64_t> table(store, ho, [](std::int64_t key, float* e, std::size_t dim) {
    for (std::size_t d = 0; d < dim; ++d) e[d] = float(key) + float(d) / 4;
  });
  // One sample, slots {7, 5} and {5}, then {9}: sum pooling; 5 refused (and 3, not in the batch).
  const std::int64_t offsets[] = {0, 2, 3, 4};
  const std::int64_t keys[] = {7, 5, 5, 9};
  const std::int64_t refused[] = {3, 5};
  std::vector<float> out(6);
  EMBCACHE_ASSERT_OK(table.forward({1, 3, offsets, keys, 4}, out.data(), refused, 2));
  EXPECT_EQ(table.num_unique_keys(), 2u);
  EXPECT_EQ(out, (std::vector<float>{7, 7.25f, 0, 0, 9, 9.25f}));
  const std::vector<float> ones(6, 1.0f);
  table.advance_version(40);
  EMBCACHE_ASSERT_OK(table.backward(ones.data()));
  EXPECT_EQ(store.row(5), nullptr);
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(*store.row(7), (std::vector<float>{6.5f, 6.75f}));
  EXPECT_EQ(*store.row(9), (std::vector<float>{8.5f, 8.75f}));
  EXPECT_EQ(store.max_version(), 41u);
  // Without refused keys, 5 gets its row; the stamps continue from the store's clock.
  EMBCACHE_ASSERT_OK(table.forward({1, 3, offsets, keys, 4}, out.data()));
  EXPECT_EQ(out, (std::vector<float>{11.5f, 12, 5, 5.25f, 8.5f, 8.75f}));
  EMBCACHE_ASSERT_OK(table.backward(ones.data()));
  ASSERT_NE(store.row(5), nullptr);
  EXPECT_EQ(*store.row(5), (std::vector<float>{4, 4.25f}));  // two occurrences' gradients
  EXPECT_EQ(store.max_version(), 42u);
  EXPECT_EQ(table.forward({1, 3, offsets, keys, 4}, out.data(), nullptr, 1).code(),
            status_code::invalid_argument);
}

// With default rows (admission's refused_row::slot) a refused key of slot s reads slot s's row,
// and still gets no gradient and no row in the store.
TEST(host_hybrid, refused_keys_read_their_slots_default_row_when_given) {
  host_hybrid_options ho;
  ho.dim = 2;
  ho.optimizer.kind = optimizer_kind::sgd;
  ho.optimizer.learning_rate = 0.5f;
  map_store store(2);
  host_hybrid_table<std::int64_t> table(store, ho, [](std::int64_t key, float* e, std::size_t dim) {
    for (std::size_t d = 0; d < dim; ++d) e[d] = float(key) + float(d) / 4;
  });
  // One sample, three slots: {7, 5}, {5}, {9}; 5 refused.
  const std::int64_t offsets[] = {0, 2, 3, 4};
  const std::int64_t keys[] = {7, 5, 5, 9};
  const std::int64_t refused[] = {5};
  const float defaults[] = {0.5f, -1, 2, 0.25f, 100, 100};  // slots 0, 1, 2
  std::vector<float> out(6);
  EMBCACHE_ASSERT_OK(table.forward({1, 3, offsets, keys, 4}, out.data(), refused, 1, defaults));
  EXPECT_EQ(out, (std::vector<float>{7.5f, 6.25f, 2, 0.25f, 9, 9.25f}));
  const std::vector<float> ones(6, 1.0f);
  EMBCACHE_ASSERT_OK(table.backward(ones.data()));
  EXPECT_EQ(store.row(5), nullptr);
  EXPECT_EQ(*store.row(7), (std::vector<float>{6.5f, 6.75f}));
}

TEST(host_hybrid, misuse_throws_and_bad_batches_are_refused) {
  host_hybrid_options ho;
  ho.dim = 4;
  ho.optimizer.kind = optimizer_kind::adam;
  map_store narrow(8);
  EXPECT_THROW(host_hybrid_table<std::int64_t>(narrow, ho), error);

  map_store store(12);
  host_hybrid_table<std::int64_t> table(store, ho);
  const float d_out[8] = {};
  EXPECT_THROW((void)table.backward(d_out), error);

  const std::int64_t offsets[] = {0, 2, 1};
  const std::int64_t keys[] = {1, 2};
  float out[8];
  status s = table.forward({1, 2, offsets, keys, 2}, out);
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_NE(s.message().find("offsets decrease at bag 1 (sample 0, slot 1)"), std::string::npos)
      << s.message();
  EXPECT_EQ(store.size(), 0u);
  EXPECT_THROW((void)table.backward(d_out), error);  // the failed forward left nothing pending

  store.fail_next_pulls();
  const std::int64_t good_offsets[] = {0, 1, 2};
  s = table.forward({1, 2, good_offsets, keys, 2}, out);
  EXPECT_EQ(s.code(), status_code::io_error);
  EXPECT_NE(s.message().find("pull from 'map_table': map_store: pull of 2 keys failed"),
            std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace embcache
