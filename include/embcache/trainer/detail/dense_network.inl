/// @file trainer/detail/dense_network.inl
/// @brief Definitions of dense_network, shared by the spaces; included by the translation unit
/// that instantiates each space (src/trainer/dense_network.cpp for host_space,
/// src/trainer/dense_network.cu for cuda_space).
#pragma once

#include <cmath>
#include <string>
#include <utility>

#include "embcache/trainer/dense_network.hpp"
#include "embcache/trainer/detail/dense_kernels.hpp"

namespace embcache {
namespace detail {

/// Xavier/Glorot uniform weight `index` of layer `layer`: U(-a, a), a = sqrt(6 / (in + out)).
inline float xavier_weight(std::uint64_t seed, std::size_t layer, std::uint64_t index,
                           std::size_t fan_in, std::size_t fan_out) noexcept {
  const std::uint64_t h = splitmix64_finalize(
      splitmix64_finalize(splitmix64_finalize(seed ^ 0x786176696572ull) ^ layer) ^ index);
  const double u = double(h >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
  const double a = std::sqrt(6.0 / double(fan_in + fan_out));
  return float((2.0 * u - 1.0) * a);
}

// Serialization helpers (src/trainer/dense_network.cpp).
std::vector<std::uint8_t> dense_blob(const dense_network_options& o, std::uint64_t step,
                                     const std::vector<float>& params, const std::vector<float>& m,
                                     const std::vector<float>& v);
status parse_dense_blob(const dense_network_options& o, std::size_t num_parameters,
                        const std::uint8_t* data, std::size_t size, std::uint64_t& step,
                        std::vector<float>& params, std::vector<float>& m, std::vector<float>& v);
// The files of save_file / load_file, through the library's durable-file module (src/common).
status write_dense_file(const std::string& path, const std::vector<std::uint8_t>& bytes);
status read_dense_file(const std::string& path, std::vector<std::uint8_t>& bytes);

}  // namespace detail

template <class Space>
dense_network<Space>::dense_network(const dense_network_options& options, Space space)
    : options_(options), space_(space) {
  check_options(options).throw_if_error();
  const std::size_t layers = num_layers();
  offsets_.resize(layers);
  std::size_t off = 0;
  for (std::size_t l = 0; l < layers; ++l) {
    offsets_[l] = off;
    off += fan_in(l) * fan_out(l) + fan_out(l);
  }
  num_parameters_ = off;
  std::vector<float> init(off, 0.0f);
  for (std::size_t l = 0; l < layers; ++l) {
    const std::size_t n = fan_in(l) * fan_out(l);
    for (std::size_t i = 0; i < n; ++i)
      init[offsets_[l] + i] = detail::xavier_weight(options_.seed, l, i, fan_in(l), fan_out(l));
  }
  params_ = buffer<float, Space>(off, space_);
  grads_ = buffer<float, Space>(off, space_);
  adam_m_ = buffer<float, Space>(off, space_);
  adam_v_ = buffer<float, Space>(off, space_);
  params_.copy_from_host(init.data(), off);
  grads_.fill_bytes(0);
  adam_m_.fill_bytes(0);
  adam_v_.fill_bytes(0);
  acts_.resize(options_.hidden.size());
  deltas_.resize(options_.hidden.size());
  blas_ = detail::blas_create(space_);
  detail::synchronize(space_);
}

template <class Space>
std::size_t dense_network<Space>::fan_in(std::size_t l) const {
  if (l >= num_layers())
    throw error(status_code::invalid_argument, "dense_network: no layer " + std::to_string(l));
  return l == 0 ? options_.input_dim : options_.hidden[l - 1];
}

template <class Space>
std::size_t dense_network<Space>::fan_out(std::size_t l) const {
  if (l >= num_layers())
    throw error(status_code::invalid_argument, "dense_network: no layer " + std::to_string(l));
  return l < options_.hidden.size() ? options_.hidden[l] : 1;
}

template <class Space>
std::size_t dense_network<Space>::weight_offset(std::size_t l) const {
  if (l >= num_layers())
    throw error(status_code::invalid_argument, "dense_network: no layer " + std::to_string(l));
  return offsets_[l];
}

template <class Space>
void dense_network<Space>::ensure_batch(std::size_t batch) {
  if (batch <= capacity_) return;
  for (std::size_t l = 0; l < options_.hidden.size(); ++l) {
    acts_[l] = buffer<float, Space>(batch * options_.hidden[l], space_);
    deltas_[l] = buffer<float, Space>(batch * options_.hidden[l], space_);
  }
  ones_ = buffer<float, Space>(batch, space_);
  detail::for_each_dense(space_, batch, detail::fill_value{ones_.data(), 1.0f});
  capacity_ = batch;
}

template <class Space>
void dense_network<Space>::forward(const input_block* blocks, std::size_t num_blocks,
                                   std::size_t batch, bool training, std::uint64_t dropout_step,
                                   float* logits) {
  std::size_t cols = 0;
  for (std::size_t k = 0; k < num_blocks; ++k) cols += blocks[k].cols;
  if (cols != options_.input_dim)
    throw error(status_code::invalid_argument,
                "dense_network::forward: the input blocks have " + std::to_string(cols) +
                    " columns, expected input_dim " + std::to_string(options_.input_dim));
  blocks_.assign(blocks, blocks + num_blocks);
  batch_ = batch;
  if (batch == 0) return;
  ensure_batch(batch);
  const bool drop = training && options_.dropout > 0.0f;
  scale_ = drop ? 1.0f / (1.0f - options_.dropout) : 1.0f;
  const std::uint32_t threshold = drop ? detail::dropout_threshold(options_.dropout) : 0;
  void* h = blas_.get();
  float* w_all = params_.data();
  for (std::size_t l = 0; l < num_layers(); ++l) {
    const std::size_t in = fan_in(l), out = fan_out(l);
    const float* w = w_all + offsets_[l];
    const float* b = w + in * out;
    float* z = l + 1 < num_layers() ? acts_[l].data() : logits;
    // Bias first (ones x b), then accumulate input x W onto it.
    detail::gemm_row_major(space_, h, false, false, batch, out, 1, 1.0f, ones_.data(), 1, b, out,
                           0.0f, z, out);
    if (l == 0) {
      std::size_t row = 0;
      for (const input_block& blk : blocks_) {
        if (blk.cols)
          detail::gemm_row_major(space_, h, false, false, batch, out, blk.cols, 1.0f, blk.data,
                                 blk.cols, w + row * out, out, 1.0f, z, out);
        row += blk.cols;
      }
    } else {
      detail::gemm_row_major(space_, h, false, false, batch, out, in, 1.0f, acts_[l - 1].data(), in,
                             w, out, 1.0f, z, out);
    }
    if (l + 1 < num_layers()) {
      detail::for_each_dense(
          space_, batch * out,
          detail::relu_dropout_forward{z, detail::dropout_base(options_.seed, dropout_step, l),
                                       threshold, scale_});
    }
  }
}

template <class Space>
void dense_network<Space>::backward(const float* d_logits, float* const* d_blocks) {
  const std::size_t batch = batch_;
  if (batch == 0) {
    grads_.fill_bytes(0);
    return;
  }
  void* h = blas_.get();
  const float* w_all = params_.data();
  float* g_all = grads_.data();
  for (std::size_t l = num_layers(); l-- > 0;) {
    const std::size_t in = fan_in(l), out = fan_out(l);
    const float* dz = l + 1 < num_layers() ? deltas_[l].data() : d_logits;
    const float* w = w_all + offsets_[l];
    float* gw = g_all + offsets_[l];
    float* gb = gw + in * out;
    // dW = input^T dZ, db = ones^T dZ.
    if (l == 0) {
      std::size_t row = 0;
      for (const input_block& blk : blocks_) {
        if (blk.cols)
          detail::gemm_row_major(space_, h, true, false, blk.cols, out, batch, 1.0f, blk.data,
                                 blk.cols, dz, out, 0.0f, gw + row * out, out);
        row += blk.cols;
      }
    } else {
      detail::gemm_row_major(space_, h, true, false, in, out, batch, 1.0f, acts_[l - 1].data(), in,
                             dz, out, 0.0f, gw, out);
    }
    detail::gemm_row_major(space_, h, false, false, 1, out, batch, 1.0f, ones_.data(), batch, dz,
                           out, 0.0f, gb, out);
    // d(input) = dZ W^T, through ReLU and dropout for hidden inputs.
    if (l > 0) {
      float* dh = deltas_[l - 1].data();
      detail::gemm_row_major(space_, h, false, true, batch, in, out, 1.0f, dz, out, w, out, 0.0f,
                             dh, in);
      detail::for_each_dense(space_, batch * in,
                             detail::relu_dropout_backward{acts_[l - 1].data(), dh, scale_});
    } else if (d_blocks) {
      std::size_t row = 0;
      for (std::size_t k = 0; k < blocks_.size(); ++k) {
        const std::size_t c = blocks_[k].cols;
        if (d_blocks[k] && c)
          detail::gemm_row_major(space_, h, false, true, batch, c, out, 1.0f, dz, out,
                                 w + row * out, out, 0.0f, d_blocks[k], c);
        row += c;
      }
    }
  }
}

template <class Space>
void dense_network<Space>::apply_adam() {
  ++adam_step_;
  const dense_adam_options& a = options_.adam;
  const double t = double(adam_step_);
  detail::dense_adam_step f{params_.data(),
                            grads_.data(),
                            adam_m_.data(),
                            adam_v_.data(),
                            double(a.learning_rate),
                            double(a.beta1),
                            double(a.beta2),
                            double(a.epsilon),
                            1.0 / (1.0 - std::pow(double(a.beta1), t)),
                            1.0 / (1.0 - std::pow(double(a.beta2), t))};
  detail::for_each_dense(space_, num_parameters_, f);
}

template <class Space>
std::vector<float> dense_network<Space>::parameters() const {
  std::vector<float> v(num_parameters_);
  params_.copy_to_host(v.data(), v.size());
  detail::synchronize(space_);
  return v;
}

template <class Space>
status dense_network<Space>::set_parameters(const std::vector<float>& values) {
  if (values.size() != num_parameters_)
    return status::invalid_argument("dense_network::set_parameters: got " +
                                    std::to_string(values.size()) + " floats, expected " +
                                    std::to_string(num_parameters_));
  params_.copy_from_host(values.data(), values.size());
  detail::synchronize(space_);
  return status::ok_status();
}

template <class Space>
std::vector<float> dense_network<Space>::gradients() const {
  std::vector<float> v(num_parameters_);
  grads_.copy_to_host(v.data(), v.size());
  detail::synchronize(space_);
  return v;
}

template <class Space>
void dense_network<Space>::get_gradients(float* out) const {
  grads_.copy_to_host(out, num_parameters_);
  detail::synchronize(space_);
}

template <class Space>
void dense_network<Space>::set_gradients(const float* in) {
  grads_.copy_from_host(in, num_parameters_);
  detail::synchronize(space_);
}

template <class Space>
std::vector<std::uint8_t> dense_network<Space>::save() const {
  std::vector<float> m(num_parameters_), v(num_parameters_);
  adam_m_.copy_to_host(m.data(), m.size());
  adam_v_.copy_to_host(v.data(), v.size());
  return detail::dense_blob(options_, adam_step_, parameters(), m, v);
}

template <class Space>
status dense_network<Space>::load(const std::uint8_t* data, std::size_t size) {
  std::uint64_t step = 0;
  std::vector<float> p, m, v;
  EMBCACHE_RETURN_IF_ERROR(
      detail::parse_dense_blob(options_, num_parameters_, data, size, step, p, m, v));
  params_.copy_from_host(p.data(), p.size());
  adam_m_.copy_from_host(m.data(), m.size());
  adam_v_.copy_from_host(v.data(), v.size());
  detail::synchronize(space_);
  adam_step_ = step;
  return status::ok_status();
}

template <class Space>
status dense_network<Space>::save_file(const std::string& path) const {
  return detail::write_dense_file(path, save());
}

template <class Space>
status dense_network<Space>::load_file(const std::string& path) {
  std::vector<std::uint8_t> bytes;
  EMBCACHE_RETURN_IF_ERROR(detail::read_dense_file(path, bytes));
  return load(bytes.data(), bytes.size()).with_context(path);
}

}  // namespace embcache
