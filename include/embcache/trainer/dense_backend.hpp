/// @file trainer/dense_backend.hpp
/// @brief Where the dense part of Wide&Deep runs, behind one interface whose inputs and outputs
/// are in host memory: the host space (OpenBLAS) or the cuda space (cuBLAS). The trainer and the
/// host-hybrid sample hand each batch's pooled embeddings and dense features to a dense_backend,
/// which gives back the gradients with respect to the embeddings for the sparse optimizers.
///
/// A backend on the device also takes the pooled embeddings where they already are
/// (forward_backward_on_device): in device memory, with their gradients written there. The
/// trainer uses it when its tables are in the cuda space too (embedding_device "cuda"), so that
/// neither the pooled embeddings nor their gradients cross PCIe. Tables on the host, and
/// host-hybrid, use forward_backward with host arrays.
///
/// This header compiles with g++ alone. The cuda implementation is part of embcache::trainer in a
/// build with the cuda space; a program calls register_cuda_dense_backend() once, after which
/// make_dense_backend() can pick "cuda". A host-only build has neither and never needs CUDA.
///
/// Both implementations save the same blob (wide_deep_model::save, docs/model.md), so a model
/// trained on one device resumes on the other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "embcache/space.hpp"
#include "embcache/status.hpp"
#include "embcache/trainer/wide_deep.hpp"

namespace embcache {

/// The dense part of a Wide&Deep model (the MLP and the wide bias with their Adam state) on some
/// device. Every pointer it takes or fills is in host memory, except the pooled embeddings and
/// their gradients of forward_backward_on_device. Not thread-safe.
class dense_backend {
 public:
  virtual ~dense_backend() = default;
  dense_backend() = default;
  dense_backend(const dense_backend&) = delete;
  dense_backend& operator=(const dense_backend&) = delete;

  /// Where it runs: "host" or "cuda".
  virtual const char* device() const noexcept = 0;
  /// The model's options.
  virtual const wide_deep_options& options() const noexcept = 0;
  /// wide_deep_model::predict on a batch in host memory.
  virtual void predict(const wide_deep_batch& batch, std::vector<float>& logits) = 0;
  /// wide_deep_model::forward_backward on a batch in host memory; `d_wide` and `d_deep` are host
  /// arrays of B * num_wide_slots and B * num_deep_slots * deep_dim floats.
  virtual double forward_backward(const wide_deep_batch& batch, std::uint64_t dropout_step,
                                  float* d_wide, float* d_deep,
                                  std::vector<float>* logits = nullptr) = 0;
  /// Whether forward_backward_on_device can be called: true for the cuda backend, false for the
  /// host one.
  virtual bool takes_device_inputs() const noexcept { return false; }
  /// forward_backward with the pooled embeddings in device memory: `batch.wide` (B *
  /// num_wide_slots floats) and `batch.deep` (B * num_deep_slots * deep_dim floats) are read from,
  /// and `d_wide` and `d_deep` (as many floats) written to, the memory of the cuda space's device;
  /// `batch.dense` and `batch.labels` are host arrays as in forward_backward. The inputs must be
  /// complete when it is called (their writer synchronized); the gradients are when it returns.
  /// Gives the same loss, gradients and dense state, bit for bit, as forward_backward on the same
  /// values: only the copies differ. A backend whose takes_device_inputs() is false throws
  /// embcache::error (unsupported) and changes nothing.
  virtual double forward_backward_on_device(const wide_deep_batch& batch,
                                            std::uint64_t dropout_step, float* d_wide,
                                            float* d_deep, std::vector<float>* logits = nullptr);
  /// One Adam step of the MLP and the wide bias (wide_deep_model::apply_dense_update).
  virtual void apply_dense_update() = 0;
  /// Floats of the dense gradient (wide_deep_model::num_gradients).
  virtual std::size_t num_gradients() const noexcept = 0;
  /// The last forward_backward's dense gradient into `out` (host, num_gradients() floats).
  virtual void get_gradients(float* out) = 0;
  /// Replaces the gradient apply_dense_update() applies (host, num_gradients() floats): the
  /// data-parallel trainer sets the sum over every rank's blocks.
  virtual void set_gradients(const float* in) = 0;
  /// wide_deep_model::save: the same bytes whatever the device.
  virtual std::vector<std::uint8_t> save() const = 0;
  /// wide_deep_model::load.
  [[nodiscard]] virtual status load(const std::uint8_t* data, std::size_t size) = 0;
  /// Seconds spent copying batches and gradients between host and device memory since it was
  /// built (always 0 on the host).
  virtual double transfer_seconds() const noexcept { return 0.0; }
};

/// The host implementation: a wide_deep_model<host_space> used in place (no copies). Throws
/// embcache::error (invalid_argument) for bad options.
std::unique_ptr<dense_backend> make_host_dense_backend(const wide_deep_options& options,
                                                       host_space space = {});

/// Threads of the host BLAS (OpenBLAS), for the whole process: `threads` > 0 sets them
/// (openblas_set_num_threads); 0 leaves OpenBLAS's own setting (OPENBLAS_NUM_THREADS, else one per
/// core). Returns the count in effect afterwards. On a machine with few cores, OpenBLAS's threads
/// spin against oneTBB's workers between GEMMs; one thread can then be faster (docs/trainer.md).
int set_host_blas_threads(int threads);

/// Builds a cuda dense_backend; throws embcache::error on a CUDA or cuBLAS failure.
using dense_backend_factory = std::unique_ptr<dense_backend> (*)(const wide_deep_options&);

/// Installs the factory make_dense_backend() uses for "cuda" (nullptr removes it). Normally
/// called through register_cuda_dense_backend(); tests may install their own.
void set_cuda_dense_backend_factory(dense_backend_factory factory) noexcept;
/// The installed factory (nullptr when the program registered none).
dense_backend_factory cuda_dense_backend_factory() noexcept;

/// Defined by embcache::trainer in a build with the cuda space (src/trainer/dense_backend.cu;
/// EMBCACHE_BUILT_WITH_CUDA is 1), so only programs of such a build may call these.
/// make_cuda_dense_backend builds a wide_deep_model<cuda_space> behind the
/// interface (forward_backward copies the batch to the device and the gradients back;
/// forward_backward_on_device copies only the dense features); register_cuda_dense_backend
/// installs it as the "cuda" factory.
std::unique_ptr<dense_backend> make_cuda_dense_backend(const wide_deep_options& options);
/// See make_cuda_dense_backend.
void register_cuda_dense_backend();

/// Where a part of the trainer runs (trainer_config::dense_device and embedding_device). The
/// configuration's JSON spells it "auto", "host" or "cuda" (to_string, device_choice_from_name).
enum class device_choice : std::uint8_t {
  automatic,  ///< "auto": cuda when the program can use it and a device is present, else host
  host,       ///< "host"
  cuda,       ///< "cuda"
};

/// The configuration's name of a device choice ("auto", "host" or "cuda"; "?" for a value no
/// enumerator names).
const char* to_string(device_choice d) noexcept;
/// The device choice named `name` ("auto", "host" or "cuda"); false (and `*out` untouched) when
/// `name` names none.
bool device_choice_from_name(const std::string& name, device_choice* out) noexcept;
/// OK for an enumerator; for another value (an integer cast to device_choice) invalid_argument
/// starting with `field`, e.g. `config.dense_device: 7 is not a device (host, cuda, auto)`.
status check_device_choice(device_choice d, const std::string& field);

/// Builds the dense part on the device `requested` names: host, cuda (needs a registered
/// factory and a CUDA device) or automatic (cuda when both are there, else host). `note` (may be
/// null) receives one line saying where it runs and, for "auto", why, e.g. "dense network on
/// host (auto: no CUDA device)". Errors are invalid_argument or unsupported and start with
/// `field`, e.g. `config.dense_device: "cuda" but no CUDA device is present`.
result<std::unique_ptr<dense_backend>> make_dense_backend(device_choice requested,
                                                          const wide_deep_options& options,
                                                          host_space space, std::string* note,
                                                          const std::string& field);

}  // namespace embcache
