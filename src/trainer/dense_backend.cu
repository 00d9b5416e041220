// The trainer's dense part in the cuda space: each batch's pooled embeddings and dense features
// are copied to the device, forward, backward and Adam run there (cuBLAS, dense_network.cu),
// and the gradients with respect to the embeddings come back for the sparse optimizers on the
// host. When the pooled embeddings are already on the device (forward_backward_on_device: the
// trainer's tables in the cuda space) only the dense features are copied and the gradients stay
// there. Both run the same kernels on the same device values, hence the same bits. Nothing here
// launches a kernel: the copies go through buffer<>, whose CUDA calls are checked and throw
// embcache::error.
#include <chrono>
#include <exception>
#include <optional>
#include <utility>

#include "embcache/buffer.hpp"
#include "embcache/trainer/dense_backend.hpp"

namespace embcache {
namespace {

using clock_type = std::chrono::steady_clock;

// Grows `b` to hold at least `n` floats; contents are not kept.
void reserve(buffer<float, cuda_space>& b, std::size_t n, const cuda_space& space) {
  if (b.size() < n) b = buffer<float, cuda_space>(n, space);
}

class cuda_dense_backend final : public dense_backend {
 public:
  // The model, its cuBLAS handle and buffers live on the device current here; every call makes
  // that device current again (the trainer may call from another thread or device).
  explicit cuda_dense_backend(const wide_deep_options& options)
      : device_(detail::cuda_current_device()), space_{} {
    model_.emplace(options, space_);
  }
  ~cuda_dense_backend() override {
    // The model's memory and cuBLAS handle go back on their own device (never throw here).
    std::optional<cuda_device_guard> on_device;
    try {
      on_device.emplace(device_);
    } catch (const std::exception&) {
    }
    model_.reset();
    for (auto* b : {&wide_, &deep_, &dense_, &d_wide_, &d_deep_}) b->reset();
  }

  const char* device() const noexcept override { return "cuda"; }
  const wide_deep_options& options() const noexcept override { return model_->options(); }

  void predict(const wide_deep_batch& batch, std::vector<float>& logits) override {
    const cuda_device_guard current(device_);
    model_->predict(upload(batch, /*pooled_on_device=*/false), logits);
  }

  double forward_backward(const wide_deep_batch& batch, std::uint64_t dropout_step, float* d_wide,
                          float* d_deep, std::vector<float>* logits) override {
    const cuda_device_guard current(device_);
    const wide_deep_options& o = model_->options();
    const std::size_t n_wide = batch.size * o.num_wide_slots;
    const std::size_t n_deep = batch.size * o.num_deep_slots * o.deep_dim;
    const wide_deep_batch on_device = upload(batch, /*pooled_on_device=*/false);
    reserve(d_wide_, n_wide, space_);
    reserve(d_deep_, n_deep, space_);
    // forward_backward synchronizes the stream before it returns.
    const double loss =
        model_->forward_backward(on_device, dropout_step, d_wide_.data(), d_deep_.data(), logits);
    const auto t0 = clock_type::now();
    d_wide_.copy_to_host(d_wide, n_wide);
    d_deep_.copy_to_host(d_deep, n_deep);
    transfer_ += std::chrono::duration<double>(clock_type::now() - t0).count();
    return loss;
  }

  bool takes_device_inputs() const noexcept override { return true; }
  double forward_backward_on_device(const wide_deep_batch& batch, std::uint64_t dropout_step,
                                    float* d_wide, float* d_deep,
                                    std::vector<float>* logits) override {
    const cuda_device_guard current(device_);
    // forward_backward synchronizes the stream before it returns: the gradients are complete.
    return model_->forward_backward(upload(batch, /*pooled_on_device=*/true), dropout_step, d_wide,
                                   d_deep, logits);
  }

  void apply_dense_update() override {
    const cuda_device_guard current(device_);
    model_->apply_dense_update();
    // The step's kernels are asynchronous; a failure surfaces here rather than in a later batch.
    detail::synchronize(space_);
  }
  std::size_t num_gradients() const noexcept override { return model_->num_gradients(); }
  void get_gradients(float* out) override {
    const cuda_device_guard current(device_);
    const auto t0 = clock_type::now();
    model_->get_gradients(out);  // synchronizes
    transfer_ += std::chrono::duration<double>(clock_type::now() - t0).count();
  }
  void set_gradients(const float* in) override {
    const cuda_device_guard current(device_);
    const auto t0 = clock_type::now();
    model_->set_gradients(in);  // synchronizes
    transfer_ += std::chrono::duration<double>(clock_type::now() - t0).count();
  }
  std::vector<std::uint8_t> save() const override {
    const cuda_device_guard current(device_);
    return model_->save();
  }
  status load(const std::uint8_t* data, std::size_t size) override {
    const cuda_device_guard current(device_);
    return model_->load(data, size);
  }
  double transfer_seconds() const noexcept override { return transfer_; }

 private:
  // The batch with its arrays on the device: the dense features copied there and, unless
  // `pooled_on_device` says they already are, the pooled embeddings too (the labels stay on the
  // host, where the loss is computed). buffer<>::copy_from_host synchronizes, so the host arrays
  // may change right after.
  wide_deep_batch upload(const wide_deep_batch& b, bool pooled_on_device) {
    const wide_deep_options& o = model_->options();
    const std::size_t n_dense = b.dense ? b.size * o.num_dense : 0;
    const auto t0 = clock_type::now();
    wide_deep_batch d = b;
    if (!pooled_on_device) {
      const std::size_t n_wide = b.size * o.num_wide_slots;
      const std::size_t n_deep = b.size * o.num_deep_slots * o.deep_dim;
      reserve(wide_, n_wide, space_);
      reserve(deep_, n_deep, space_);
      wide_.copy_from_host(b.wide, n_wide);
      deep_.copy_from_host(b.deep, n_deep);
      d.wide = wide_.data();
      d.deep = deep_.data();
    }
    reserve(dense_, n_dense, space_);
    if (n_dense) dense_.copy_from_host(b.dense, n_dense);
    d.dense = n_dense ? dense_.data() : nullptr;
    transfer_ += std::chrono::duration<double>(clock_type::now() - t0).count();
    return d;
  }

  int device_;
  cuda_space space_;
  std::optional<wide_deep_model<cuda_space>> model_;  // reset by the destructor on device_
  buffer<float, cuda_space> wide_, deep_, dense_, d_wide_, d_deep_;
  double transfer_ = 0;
};

std::unique_ptr<dense_backend> make_cuda(const wide_deep_options& options) {
  return std::make_unique<cuda_dense_backend>(options);
}

}  // namespace

std::unique_ptr<dense_backend> make_cuda_dense_backend(const wide_deep_options& options) {
  return make_cuda(options);
}

void register_cuda_dense_backend() { set_cuda_dense_backend_factory(&make_cuda); }

}  // namespace embcache
