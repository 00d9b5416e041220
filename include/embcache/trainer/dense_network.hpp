/// @file trainer/dense_network.hpp
/// @brief The dense part of the reference trainer: an MLP with ReLU, dropout and one output logit,
/// trained with Adam. GEMMs run through a BLAS (host space: OpenBLAS via CBLAS; cuda space:
/// cuBLAS); no GEMM is written by hand.
///
/// Layout: matrices are row-major, one sample per row. Hidden layer l computes
/// `H_l = dropout(relu(H_{l-1} W_l + b_l))` with `W_l` of shape [fan_in x fan_out]; the output
/// layer computes `logit = H_L w + b`. All weights and biases live in one flat parameter array
/// (layer by layer: W_l row-major, then b_l), and so do the gradients and Adam's two moments.
///
/// Determinism: Xavier/Glorot initialization and the dropout masks are counter-based hashes:
/// weight i of layer l is a function of (seed, l, i) only; the mask of element i (= row * width +
/// column) of hidden layer l at dropout step t is a function of (seed, t, l, i) only. Neither
/// depends on the thread count or the space, so runs with the same seed are reproducible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "embcache/buffer.hpp"
#include "embcache/space.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// Adam hyperparameters of the dense weights. Defaults are TensorFlow 1's (tf.compat.v1.train),
/// the same as the sparse optimizers' (optimizers.hpp); the learning rate is HugeCTR's Wide&Deep
/// sample's.
struct dense_adam_options {
  float learning_rate = 0.001f;  ///< step size (default 0.001)
  float beta1 = 0.9f;            ///< decay of the first moment (default 0.9)
  float beta2 = 0.999f;          ///< decay of the second moment (default 0.999)
  float epsilon = 1e-8f;         ///< added to the root in the denominator (default 1e-8)
};

/// Shape and training hyperparameters of a dense_network.
struct dense_network_options {
  std::size_t input_dim = 0;                       ///< input columns, > 0; no default
  std::vector<std::size_t> hidden = {1024, 1024};  ///< hidden widths (default 1024-1024)
  float dropout = 0.5f;     ///< drop probability after each hidden ReLU, in [0, 1) (default 0.5)
  std::uint64_t seed = 0;   ///< seed of the initialization and of the dropout masks (default 0)
  dense_adam_options adam;  ///< optimizer of the weights and biases
};

/// Checks the options (input_dim > 0, every hidden width > 0, dropout in [0, 1), Adam's learning
/// rate > 0, betas in [0, 1), epsilon > 0); the message names the field and its value.
[[nodiscard]] status check_options(const dense_network_options& options);

/// A contiguous block of input columns: `data` holds `batch * cols` floats, row-major, in the
/// memory of the network's space. The network's input is the concatenation of its blocks, in
/// order, so callers never copy embeddings and dense features into one matrix.
struct input_block {
  const float* data = nullptr;  ///< batch rows of `cols` floats (default nullptr)
  std::size_t cols = 0;         ///< columns of the block (default 0)
};

/// The mask of dropout: true when element `index` of hidden layer `layer` is kept at `step`.
/// A pure function of its arguments (a counter-based hash); the same on every space.
bool dropout_keep(std::uint64_t seed, std::uint64_t step, std::size_t layer, std::uint64_t index,
                  float rate) noexcept;

/// An MLP in the memory of `Space` (host_space: OpenBLAS; cuda_space: cuBLAS, in
/// embcache::trainer's cuda build). Not thread-safe; one batch at a time.
template <class Space>
class dense_network {
 public:
  /// Builds the network and initializes it (Xavier/Glorot uniform weights, zero biases, zero
  /// Adam state). Throws embcache::error (invalid_argument) when check_options fails.
  explicit dense_network(const dense_network_options& options, Space space = {});
  ~dense_network() = default;
  dense_network(dense_network&&) noexcept = default;
  dense_network& operator=(dense_network&&) noexcept = default;
  dense_network(const dense_network&) = delete;
  dense_network& operator=(const dense_network&) = delete;

  /// The options it was built with.
  const dense_network_options& options() const noexcept { return options_; }
  /// The space it runs in.
  const Space& space() const noexcept { return space_; }
  /// Layers with weights: hidden layers plus the output layer.
  std::size_t num_layers() const noexcept { return options_.hidden.size() + 1; }
  /// Floats in the parameter array (all weights and biases).
  std::size_t num_parameters() const noexcept { return num_parameters_; }
  /// Input width of layer `l` (0 <= l < num_layers()).
  std::size_t fan_in(std::size_t l) const;
  /// Output width of layer `l` (1 for the output layer).
  std::size_t fan_out(std::size_t l) const;
  /// Offset of W_l in the parameter array; b_l follows at weight_offset(l) + fan_in * fan_out.
  std::size_t weight_offset(std::size_t l) const;
  /// Adam steps applied so far (0 after construction).
  std::uint64_t adam_step() const noexcept { return adam_step_; }

  /// Forward pass over `batch` rows: writes `batch` logits (space memory). With `training`,
  /// dropout applies with the masks of `dropout_step` (inverted dropout: kept values are scaled by
  /// 1/(1-rate)); without, dropout is the identity. Keeps the activations for backward(). Throws
  /// embcache::error (invalid_argument) when the blocks' columns do not add up to input_dim.
  void forward(const input_block* blocks, std::size_t num_blocks, std::size_t batch, bool training,
               std::uint64_t dropout_step, float* logits);
  /// forward() on one block.
  void forward(const float* input, std::size_t batch, bool training, std::uint64_t dropout_step,
               float* logits) {
    const input_block b{input, options_.input_dim};
    forward(&b, 1, batch, training, dropout_step, logits);
  }

  /// Backward pass of the last forward() (whose input blocks must still be valid): from
  /// `d_logits` (batch floats, space memory) computes the gradients of every parameter (they
  /// replace the previous ones) and, for each block whose entry of `d_blocks` is not null, the
  /// gradient with respect to that block (batch * cols floats). `d_blocks` may be null.
  void backward(const float* d_logits, float* const* d_blocks);

  /// One Adam step on every parameter with the gradients of the last backward().
  void apply_adam();

  /// Host copy of the parameters (num_parameters floats).
  std::vector<float> parameters() const;
  /// Replaces the parameters; invalid_argument when the size differs from num_parameters().
  [[nodiscard]] status set_parameters(const std::vector<float>& values);
  /// Host copy of the gradients of the last backward().
  std::vector<float> gradients() const;
  /// Copies the gradients of the last backward() into `out` (num_parameters floats, host).
  void get_gradients(float* out) const;
  /// Replaces the gradients apply_adam() applies with `in` (num_parameters floats, host).
  void set_gradients(const float* in);

  /// Parameters, Adam state and step as a self-describing blob with a checksum (format in
  /// docs/model.md).
  std::vector<std::uint8_t> save() const;
  /// Restores a blob of save(). corruption when it is truncated, has a bad magic or checksum;
  /// invalid_argument when its shape differs from this network's. Nothing changes on failure.
  [[nodiscard]] status load(const std::uint8_t* data, std::size_t size);
  /// save() into a file, durably: a temporary beside it, fsynced and renamed over it, then the
  /// folder fsynced, so that a crash leaves the previous file or the new one. A failure names
  /// the path (out_of_space for a full disk, io_error otherwise).
  [[nodiscard]] status save_file(const std::string& path) const;
  /// load() from a file; not_found / io_error / corruption naming the path.
  [[nodiscard]] status load_file(const std::string& path);

 private:
  void ensure_batch(std::size_t batch);

  dense_network_options options_;
  Space space_;
  std::size_t num_parameters_ = 0;
  std::vector<std::size_t> offsets_;  // weight_offset per layer
  buffer<float, Space> params_, grads_, adam_m_, adam_v_;
  std::vector<buffer<float, Space>> acts_;    // output of each hidden layer, batch x width
  std::vector<buffer<float, Space>> deltas_;  // gradient of each hidden layer's output
  buffer<float, Space> ones_;                 // batch ones: bias add and bias gradient as GEMMs
  std::vector<input_block> blocks_;           // inputs of the last forward
  std::size_t capacity_ = 0, batch_ = 0;
  float scale_ = 1.0f;  // dropout scale of the last forward
  std::uint64_t adam_step_ = 0;
  std::shared_ptr<void> blas_;  // cuBLAS handle in the cuda space; null in the host space
};

}  // namespace embcache
