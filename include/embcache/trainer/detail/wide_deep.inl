/// @file trainer/detail/wide_deep.inl
/// @brief Definitions of wide_deep_model, shared by the spaces; they bring the primitives of the
/// space they are compiled for (detail/space_algorithms.hpp), so nothing has to come before them.
#pragma once

// First: the qualified calls below bind to the overloads declared before them.
#include "embcache/detail/space_algorithms.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "embcache/trainer/detail/dense_kernels.hpp"
#include "embcache/trainer/wide_deep.hpp"

namespace embcache {
namespace detail {

// Wide&Deep blob framing (src/trainer/wide_deep.cpp).
std::vector<std::uint8_t> wide_deep_blob(const float bias_state[3],
                                         const std::vector<std::uint8_t>& mlp_blob);
status parse_wide_deep_blob(const std::uint8_t* data, std::size_t size, float bias_state[3],
                            const std::uint8_t*& mlp_blob, std::size_t& mlp_size);
// Sum over n samples of the loss divided by `mean_over`, and its gradient per logit.
double bce_loss_and_gradient(const float* logits, const float* labels, std::size_t n,
                             std::size_t mean_over, float* d_logits);

}  // namespace detail

template <class Space>
wide_deep_model<Space>::wide_deep_model(const wide_deep_options& options, Space space)
    : options_(options), space_(space), mlp_(mlp_options(options), space) {}

template <class Space>
void wide_deep_model<Space>::run_forward(const wide_deep_batch& batch, bool training,
                                         std::uint64_t step) {
  const std::size_t n = batch.size;
  if (mlp_logits_.size() < n) {
    mlp_logits_ = buffer<float, Space>(n, space_);
    d_logits_space_ = buffer<float, Space>(n, space_);
  }
  const input_block blocks[2] = {{batch.deep, options_.num_deep_slots * options_.deep_dim},
                                 {batch.dense, options_.num_dense}};
  mlp_.forward(blocks, 2, n, training, step, mlp_logits_.data());
  // The wide part joins in the space, so the pooled wide embeddings stay where they are; only
  // the logits come to the host, for the loss against the host labels.
  detail::for_each_index(space_, n,
                         detail::wide_logit{mlp_logits_.data(), batch.wide,
                                            options_.num_wide_slots, bias_, mlp_logits_.data()});
  host_logits_.resize(n);
  detail::copy(space_, host_logits_.data(), mlp_logits_.data(), n * sizeof(float));
  detail::synchronize(space_);
}

template <class Space>
void wide_deep_model<Space>::predict(const wide_deep_batch& batch, std::vector<float>& logits) {
  run_forward(batch, false, 0);
  logits.assign(host_logits_.begin(), host_logits_.begin() + batch.size);
}

template <class Space>
double wide_deep_model<Space>::forward_backward(const wide_deep_batch& batch,
                                                std::uint64_t dropout_step, float* d_wide,
                                                float* d_deep, std::vector<float>* logits) {
  const std::size_t n = batch.size;
  run_forward(batch, true, dropout_step);
  if (logits) logits->assign(host_logits_.begin(), host_logits_.begin() + n);
  d_logits_.resize(n);
  const double loss = detail::bce_loss_and_gradient(host_logits_.data(), batch.labels, n,
                                                    batch.mean_over ? batch.mean_over : n,
                                                    d_logits_.data());
  double bias_grad = 0;
  for (std::size_t b = 0; b < n; ++b) bias_grad += d_logits_[b];
  bias_grad_ = float(bias_grad);
  d_logits_space_.copy_from_host(d_logits_.data(), n);
  // Every wide slot of a sample receives the sample's logit gradient.
  const std::size_t w = options_.num_wide_slots;
  if (w) {
    detail::for_each_index(space_, n * w,
                           detail::spread_wide_gradient{d_logits_space_.data(), w, d_wide});
  }
  float* d_blocks[2] = {d_deep, nullptr};
  mlp_.backward(d_logits_space_.data(), d_blocks);
  detail::synchronize(space_);
  return loss;
}

template <class Space>
void wide_deep_model<Space>::apply_dense_update() {
  mlp_.apply_adam();
  // The bias follows the MLP's Adam step count (they always step together).
  const dense_adam_options& a = options_.adam;
  const double t = double(mlp_.adam_step());
  detail::dense_adam_step f{&bias_,
                            &bias_grad_,
                            &bias_m_,
                            &bias_v_,
                            double(a.learning_rate),
                            double(a.beta1),
                            double(a.beta2),
                            double(a.epsilon),
                            1.0 / (1.0 - std::pow(double(a.beta1), t)),
                            1.0 / (1.0 - std::pow(double(a.beta2), t))};
  f(0);
}

template <class Space>
void wide_deep_model<Space>::get_gradients(float* out) const {
  out[0] = bias_grad_;
  mlp_.get_gradients(out + 1);
}

template <class Space>
void wide_deep_model<Space>::set_gradients(const float* in) {
  bias_grad_ = in[0];
  mlp_.set_gradients(in + 1);
}

template <class Space>
std::vector<std::uint8_t> wide_deep_model<Space>::save() const {
  const float state[3] = {bias_, bias_m_, bias_v_};
  return detail::wide_deep_blob(state, mlp_.save());
}

template <class Space>
status wide_deep_model<Space>::load(const std::uint8_t* data, std::size_t size) {
  float state[3];
  const std::uint8_t* mlp_blob = nullptr;
  std::size_t mlp_size = 0;
  EMBCACHE_RETURN_IF_ERROR(detail::parse_wide_deep_blob(data, size, state, mlp_blob, mlp_size));
  EMBCACHE_RETURN_IF_ERROR(mlp_.load(mlp_blob, mlp_size));
  bias_ = state[0];
  bias_m_ = state[1];
  bias_v_ = state[2];
  return status::ok_status();
}

}  // namespace embcache
