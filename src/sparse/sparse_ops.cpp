// Host-space instantiations of the sparse ops and optimizers, and their non-template helpers.
#include <cmath>
#include <string>

#include "embcache/detail/optimizers.inl"
#include "embcache/detail/sparse_ops.inl"

namespace embcache {

status check_batch(const slot_batch& batch, std::size_t num_rows) {
  const std::size_t bags = batch.num_bags();
  if (bags > 0 && batch.offsets == nullptr)
    return status::invalid_argument("slot batch of " + std::to_string(bags) +
                                    " bags has no offsets");
  if (bags == 0) {
    if (batch.num_indices != 0)
      return status::invalid_argument("slot batch without bags has " +
                                      std::to_string(batch.num_indices) + " row indices");
    return {};
  }
  if (batch.offsets[0] != 0)
    return status::invalid_argument("slot batch: offsets[0] is " +
                                    std::to_string(batch.offsets[0]) + ", expected 0");
  for (std::size_t b = 0; b < bags; ++b) {
    if (batch.offsets[b + 1] < batch.offsets[b])
      return status::invalid_argument("slot batch: offsets decrease at bag " + std::to_string(b) +
                                      " (sample " + std::to_string(b / batch.num_slots) +
                                      ", slot " + std::to_string(b % batch.num_slots) +
                                      "): " + std::to_string(batch.offsets[b]) + " then " +
                                      std::to_string(batch.offsets[b + 1]));
  }
  if (static_cast<std::size_t>(batch.offsets[bags]) != batch.num_indices)
    return status::invalid_argument("slot batch: offsets end at " +
                                    std::to_string(batch.offsets[bags]) +
                                    ", expected num_indices " + std::to_string(batch.num_indices));
  if (batch.num_indices > 0 && batch.row_indices == nullptr)
    return status::invalid_argument("slot batch of " + std::to_string(batch.num_indices) +
                                    " occurrences has no row indices");
  for (std::size_t k = 0; k < batch.num_indices; ++k) {
    const std::int64_t r = batch.row_indices[k];
    if (r < -1 || (r >= 0 && static_cast<std::size_t>(r) >= num_rows))
      return status::invalid_argument(
          "slot batch: row index " + std::to_string(r) + " at occurrence " + std::to_string(k) +
          " is neither -1 (no row) nor in [0, " + std::to_string(num_rows) + ")");
  }
  return {};
}

const char* to_string(optimizer_kind kind) noexcept {
  switch (kind) {
    case optimizer_kind::sgd:
      return "sgd";
    case optimizer_kind::adagrad:
      return "adagrad";
    case optimizer_kind::adam:
      return "adam";
    case optimizer_kind::ftrl:
      return "ftrl";
  }
  return "unknown";
}

bool optimizer_kind_from_string(const std::string& name, optimizer_kind* out) noexcept {
  for (optimizer_kind k : {optimizer_kind::sgd, optimizer_kind::adagrad, optimizer_kind::adam,
                           optimizer_kind::ftrl}) {
    if (name == to_string(k)) {
      *out = k;
      return true;
    }
  }
  return false;
}

std::vector<const char*> hugectr_state_files(optimizer_kind kind) {
  switch (kind) {
    case optimizer_kind::adagrad:
      return {"AdaGrad.accm"};
    case optimizer_kind::adam:
      return {"Adam.m", "Adam.v"};
    case optimizer_kind::ftrl:
      return {"Ftrl.n", "Ftrl.z"};
    case optimizer_kind::sgd:
      break;
  }
  return {};
}

std::size_t state_width(optimizer_kind kind, std::size_t dim) noexcept {
  switch (kind) {
    case optimizer_kind::sgd:
      return 0;
    case optimizer_kind::adagrad:
      return dim;
    case optimizer_kind::adam:
      return 2 * dim;
    case optimizer_kind::ftrl:
      return 2 * dim;
  }
  return 0;
}

float initial_state_value(const optimizer_options& options) noexcept {
  switch (options.kind) {
    case optimizer_kind::adagrad:
      return options.adagrad_initial_accumulator;
    case optimizer_kind::ftrl:
      return options.ftrl_initial_accumulator;
    default:
      return 0.0f;
  }
}

float initial_state_value(const optimizer_options& options, std::size_t dim,
                          std::size_t j) noexcept {
  // Accumulators come first in the state; FTRL's linear part (the second half) starts at 0.
  if (options.kind == optimizer_kind::adagrad) return options.adagrad_initial_accumulator;
  if (options.kind == optimizer_kind::ftrl && j < dim) return options.ftrl_initial_accumulator;
  return 0.0f;
}

void initialize_state(const optimizer_options& options, std::size_t dim, float* state) noexcept {
  const std::size_t w = state_width(options.kind, dim);
  for (std::size_t j = 0; j < w; ++j) state[j] = initial_state_value(options, dim, j);
}

namespace {
status check_field(bool ok, const char* field, float value, const char* expected) {
  if (ok) return {};
  return status::invalid_argument(std::string("optimizer_options.") + field + " is " +
                                  std::to_string(value) + ", expected " + expected);
}
}  // namespace

status check_options(const optimizer_options& o) {
  const bool finite = std::isfinite(o.learning_rate) && std::isfinite(o.ftrl_alpha);
  EMBCACHE_RETURN_IF_ERROR(
      check_field(finite && o.learning_rate > 0, "learning_rate", o.learning_rate, "> 0"));
  EMBCACHE_RETURN_IF_ERROR(check_field(o.beta1 >= 0 && o.beta1 < 1, "beta1", o.beta1, "in [0, 1)"));
  EMBCACHE_RETURN_IF_ERROR(check_field(o.beta2 >= 0 && o.beta2 < 1, "beta2", o.beta2, "in [0, 1)"));
  EMBCACHE_RETURN_IF_ERROR(check_field(o.epsilon >= 0, "epsilon", o.epsilon, ">= 0"));
  EMBCACHE_RETURN_IF_ERROR(check_field(o.adagrad_initial_accumulator >= 0,
                                       "adagrad_initial_accumulator", o.adagrad_initial_accumulator,
                                       ">= 0"));
  EMBCACHE_RETURN_IF_ERROR(check_field(o.ftrl_alpha > 0, "ftrl_alpha", o.ftrl_alpha, "> 0"));
  EMBCACHE_RETURN_IF_ERROR(check_field(o.ftrl_beta >= 0, "ftrl_beta", o.ftrl_beta, ">= 0"));
  EMBCACHE_RETURN_IF_ERROR(check_field(o.ftrl_l1 >= 0, "ftrl_l1", o.ftrl_l1, ">= 0"));
  EMBCACHE_RETURN_IF_ERROR(check_field(o.ftrl_l2 >= 0, "ftrl_l2", o.ftrl_l2, ">= 0"));
  EMBCACHE_RETURN_IF_ERROR(
      check_field(o.ftrl_lr_power <= 0, "ftrl_lr_power", o.ftrl_lr_power, "<= 0"));
  EMBCACHE_RETURN_IF_ERROR(check_field(o.ftrl_initial_accumulator > 0, "ftrl_initial_accumulator",
                                       o.ftrl_initial_accumulator, "> 0"));
  return {};
}

template void lookup_combine<host_space>(const host_space&, const float*, std::size_t, std::size_t,
                                         const slot_batch&, combiner, float*, const float*);
template void aggregate_gradients<host_space>(const host_space&, const slot_batch&, combiner,
                                              const float*, std::size_t,
                                              sparse_gradients<host_space>&);
template void apply_optimizer<host_space>(const host_space&, const optimizer_options&, float*,
                                          std::size_t, std::size_t, const std::int64_t*,
                                          const float*, std::size_t, std::uint64_t, std::int8_t*);

}  // namespace embcache
