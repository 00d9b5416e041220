// The dense part behind dense_backend: the host implementation, the registry of the cuda one and
// the choice between them.
#include "embcache/trainer/dense_backend.hpp"

#include <atomic>
#include <string>
#include <utility>

namespace embcache {
namespace {

class host_dense_backend final : public dense_backend {
 public:
  host_dense_backend(const wide_deep_options& options, host_space space) : model_(options, space) {}
  const char* device() const noexcept override { return "host"; }
  const wide_deep_options& options() const noexcept override { return model_.options(); }
  void predict(const wide_deep_batch& batch, std::vector<float>& logits) override {
    model_.predict(batch, logits);
  }
  double forward_backward(const wide_deep_batch& batch, std::uint64_t dropout_step, float* d_wide,
                          float* d_deep, std::vector<float>* logits) override {
    return model_.forward_backward(batch, dropout_step, d_wide, d_deep, logits);
  }
  void apply_dense_update() override { model_.apply_dense_update(); }
  std::size_t num_gradients() const noexcept override { return model_.num_gradients(); }
  void get_gradients(float* out) override { model_.get_gradients(out); }
  void set_gradients(const float* in) override { model_.set_gradients(in); }
  std::vector<std::uint8_t> save() const override { return model_.save(); }
  status load(const std::uint8_t* data, std::size_t size) override {
    return model_.load(data, size);
  }

 private:
  wide_deep_model<host_space> model_;
};

std::atomic<dense_backend_factory> cuda_factory{nullptr};

}  // namespace

double dense_backend::forward_backward_on_device(const wide_deep_batch&, std::uint64_t, float*,
                                                 float*, std::vector<float>*) {
  throw error(status_code::unsupported,
              std::string("dense_backend::forward_backward_on_device: the dense network on ") +
                  device() + " takes host arrays (use forward_backward)");
}

std::unique_ptr<dense_backend> make_host_dense_backend(const wide_deep_options& options,
                                                       host_space space) {
  return std::make_unique<host_dense_backend>(options, space);
}

void set_cuda_dense_backend_factory(dense_backend_factory factory) noexcept {
  cuda_factory.store(factory);
}

dense_backend_factory cuda_dense_backend_factory() noexcept { return cuda_factory.load(); }

namespace {

// The device choices by name: to_string and device_choice_from_name share this list.
constexpr std::pair<device_choice, const char*> device_names[] = {
    {device_choice::automatic, "auto"},
    {device_choice::host, "host"},
    {device_choice::cuda, "cuda"}};

}  // namespace

const char* to_string(device_choice d) noexcept {
  for (const auto& [c, name] : device_names)
    if (c == d) return name;
  return "?";
}

bool device_choice_from_name(const std::string& name, device_choice* out) noexcept {
  for (const auto& [c, n] : device_names) {
    if (name == n) {
      *out = c;
      return true;
    }
  }
  return false;
}

status check_device_choice(device_choice d, const std::string& field) {
  for (const auto& [c, name] : device_names)
    if (c == d) return {};
  return status::invalid_argument(field + ": " + std::to_string(int(d)) +
                                  " is not a device (host, cuda, auto)");
}

result<std::unique_ptr<dense_backend>> make_dense_backend(device_choice requested,
                                                          const wide_deep_options& options,
                                                          host_space space, std::string* note,
                                                          const std::string& field) {
  EMBCACHE_RETURN_IF_ERROR(check_device_choice(requested, field));
  const dense_backend_factory factory = cuda_dense_backend_factory();
  // The device is probed only when the program can use it: a host-only program says so instead.
  const bool device = factory != nullptr && cuda_device_available();
  std::string why;
  bool use_cuda = false;
  if (requested == device_choice::cuda) {
    if (!factory)
      return status::unsupported(field +
                                 ": \"cuda\" needs the cuda space, and this program was built "
                                 "without it (build embcache with CUDA, call "
                                 "register_cuda_dense_backend())");
    if (!device) return status::unsupported(field + ": \"cuda\" but no CUDA device is present");
    use_cuda = true;
  } else if (requested == device_choice::automatic) {
    use_cuda = device;
    why = !factory ? " (auto: this program has no cuda space)"
          : device ? " (auto: CUDA device present)"
                   : " (auto: no CUDA device)";
  }
  try {
    std::unique_ptr<dense_backend> b =
        use_cuda ? factory(options) : make_host_dense_backend(options, space);
    if (note) *note = std::string("dense network on ") + b->device() + why;
    return b;
  } catch (const error& e) {
    return status(e.code(), field + ": " + e.what());
  }
}

}  // namespace embcache
