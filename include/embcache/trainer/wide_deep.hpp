/// @file trainer/wide_deep.hpp
/// @brief Wide&Deep forward and backward for one batch, independent of where the embeddings come
/// from (a training cache, a plain table, the host-hybrid path).
///
/// Inputs per sample b, all produced by lookup_combine (sparse_ops.hpp):
///   - `wide`: [B x num_wide_slots] pooled dim-1 embeddings (26 slots, plus crossed slots);
///   - `deep`: [B x num_deep_slots * deep_dim] pooled embeddings, slot-major within a row;
///   - `dense`: [B x num_dense] dense features.
/// The logit is `sum_s wide[b, s] + wide_bias + mlp([deep[b] | dense[b]])` and the loss the mean
/// over the batch of the binary cross-entropy with logits. backward gives d(loss)/d(wide) and
/// d(loss)/d(deep) per (sample, slot), ready for aggregate_gradients() and apply_optimizer().
///
/// The reduction over the wide slots runs in the model's space, in double, in slot order; the
/// loss and its gradient on the host in double, in sample order. Both give the same bits in every
/// space (only additions and exactly rounded conversions), and only one logit and one logit
/// gradient per sample cross between the space and the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "embcache/space.hpp"
#include "embcache/status.hpp"
#include "embcache/trainer/dense_network.hpp"

namespace embcache {

/// Shape and dense hyperparameters of a Wide&Deep model.
struct wide_deep_options {
  std::size_t num_wide_slots = 26;                 ///< wide bags per sample (default 26)
  std::size_t num_deep_slots = 26;                 ///< deep bags per sample (default 26)
  std::size_t deep_dim = 16;                       ///< deep embedding width (default 16)
  std::size_t num_dense = 13;                      ///< dense features per sample (default 13)
  std::vector<std::size_t> hidden = {1024, 1024};  ///< MLP hidden widths (default 1024-1024)
  float dropout = 0.5f;     ///< MLP dropout after each hidden ReLU (default 0.5, HugeCTR's sample)
  std::uint64_t seed = 0;   ///< MLP initialization and dropout (default 0)
  dense_adam_options adam;  ///< optimizer of the MLP and of the wide bias
};

/// The options of the MLP of a Wide&Deep model (input_dim = deep slots * dim + dense).
dense_network_options mlp_options(const wide_deep_options& options);

/// One batch of Wide&Deep inputs. Pointers wide, deep and dense are in the memory of the model's
/// space; labels are in host memory.
struct wide_deep_batch {
  std::size_t size = 0;           ///< samples B (default 0)
  const float* wide = nullptr;    ///< B * num_wide_slots floats
  const float* deep = nullptr;    ///< B * num_deep_slots * deep_dim floats
  const float* dense = nullptr;   ///< B * num_dense floats (may be null when num_dense is 0)
  const float* labels = nullptr;  ///< B labels in [0, 1], host memory (forward_backward only)
  /// The loss is the mean over this many samples (default 0: B). A block of a larger batch
  /// trained piece by piece passes the whole batch's size, so that its gradients are its share
  /// of the batch's mean (forward_backward only).
  std::size_t mean_over = 0;
};

/// Wide&Deep in the memory of `Space`; the dense part is a dense_network<Space>.
template <class Space>
class wide_deep_model {
 public:
  /// Builds the model; throws embcache::error (invalid_argument) for bad options.
  explicit wide_deep_model(const wide_deep_options& options, Space space = {});

  /// The options it was built with.
  const wide_deep_options& options() const noexcept { return options_; }
  /// Logits of a batch without dropout, into `logits` (host, resized to batch.size).
  void predict(const wide_deep_batch& batch, std::vector<float>& logits);
  /// Forward with dropout step `dropout_step`, loss, and backward for one batch. Writes
  /// d(loss)/d(wide) into `d_wide` (B * num_wide_slots floats) and d(loss)/d(deep) into `d_deep`
  /// (B * num_deep_slots * deep_dim floats), both in space memory, and keeps the dense gradients
  /// for apply_dense_update(). Returns the batch's mean loss; `logits` (host) when not null.
  double forward_backward(const wide_deep_batch& batch, std::uint64_t dropout_step, float* d_wide,
                          float* d_deep, std::vector<float>* logits = nullptr);
  /// One Adam step of the MLP and of the wide bias with the last forward_backward's gradients.
  void apply_dense_update();

  /// The MLP.
  dense_network<Space>& mlp() noexcept { return mlp_; }
  const dense_network<Space>& mlp() const noexcept { return mlp_; }
  /// The wide bias.
  float wide_bias() const noexcept { return bias_; }
  /// Gradient of the wide bias from the last forward_backward.
  float wide_bias_gradient() const noexcept { return bias_grad_; }

  /// Floats of the dense gradient: the wide bias's, then the MLP's (its parameter order).
  std::size_t num_gradients() const noexcept { return 1 + mlp_.num_parameters(); }
  /// Copies the last forward_backward's dense gradient into `out` (num_gradients() floats,
  /// host memory).
  void get_gradients(float* out) const;
  /// Replaces the dense gradient that apply_dense_update() applies with `in` (num_gradients()
  /// floats, host memory): data-parallel training sums the ranks' gradients first.
  void set_gradients(const float* in);

  /// The dense state (wide bias with its Adam state, then the MLP's blob) with a checksum.
  std::vector<std::uint8_t> save() const;
  /// Restores save(); corruption / invalid_argument as dense_network::load.
  [[nodiscard]] status load(const std::uint8_t* data, std::size_t size);

 private:
  void run_forward(const wide_deep_batch& batch, bool training, std::uint64_t step);

  wide_deep_options options_;
  Space space_;
  dense_network<Space> mlp_;
  float bias_ = 0, bias_m_ = 0, bias_v_ = 0, bias_grad_ = 0;
  buffer<float, Space> mlp_logits_, d_logits_space_;
  std::vector<float> host_logits_, d_logits_;
};

}  // namespace embcache
