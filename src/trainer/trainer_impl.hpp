// The trainer's state, shared by its parts: the pass loop (trainer.cpp) and the checkpoints
// (trainer_checkpoint.cpp). The tables are behind the embedding path.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "embcache/distributed/communicator.hpp"
#include "embcache/distributed/ownership.hpp"
#include "embcache/trainer/trainer.hpp"
#include "embedding_path.hpp"

namespace embcache {
namespace detail {

/// Embeddings of `count` one-hot keys of one table, into `out` (count * dim floats).
struct table_read {
  std::size_t table = 0;
  const trainer_key* keys = nullptr;
  std::size_t count = 0, dim = 0;
  float* out = nullptr;
};

/// The buffers a training or evaluation step reuses from step to step (grown, never shrunk).
struct step_scratch {
  std::vector<trainer_key> wide_keys;  // slot keys, then crossed keys, of the batch's samples
  std::vector<std::int64_t> offsets;   // one-hot offsets of the pooled reads
  std::vector<float> in_wide, in_deep, d_wide, d_deep, rows_buf, logits;
  std::vector<float> dense_partials, dense_sum;  // sharded: per-block dense gradients, their sum
  std::vector<double> block_losses;              // sharded: per-block losses
  /// A buffer of at least `n` bools (std::vector<bool> has no data()); reused.
  bool* found(std::size_t n) {
    if (found_size_ < n) {
      found_.reset(new bool[n]);
      found_size_ = n;
    }
    return found_.get();
  }

 private:
  std::unique_ptr<bool[]> found_;
  std::size_t found_size_ = 0;
};

/// How far training has come: the totals a save records (step, passes_done, samples, history)
/// and the run() in progress, for the run part of the progress lines.
struct run_progress {
  std::uint64_t step = 0, passes_done = 0, samples = 0;
  std::vector<pass_metrics> history;
  // The run() in progress: its last pass number, the samples of all its passes (shard headers;
  // 0 when unknown or outside run()), those done, and when it began.
  std::uint64_t run_last_pass = 0, run_total = 0, run_done = 0;
  std::chrono::steady_clock::time_point run_t0;
};

/// What a run tells once and what stops it: where the dense network and the embeddings run
/// (logged before the first pass) and the divergence that ends training.
struct run_notes {
  std::string dense_note, embedding_note;
  bool dense_note_logged = false;  // and the embedding note after it
  // Set when the model was found non-finite: from then on no pass, save or export runs.
  status diverged;
};

/// The checks of a sharded run's configuration against its ranks (trainer_sharded.cpp).
status check_sharded_config(const trainer_config& config, const communicator& comm);

/// A warning line when config.eval_shard is also one of the run's training shards (the same
/// file; passes numbered from passes_done + 1): the eval metrics then measure samples the model
/// trained on. "" when it is not (trainer_datasets.cpp).
std::string eval_shard_in_training(const trainer_config& c, std::uint64_t passes_done);

class file_lock;
/// Takes the lock file `<parent>/.<name>.lock` of config.save_dir and config.export_dir (those
/// set; the leader of a sharded run for all its ranks) into `held`, for a run() that writes them:
/// a second trainer writing one of them meanwhile fails "in use" naming the folder
/// (trainer_checkpoint.cpp).
status lock_output_folders(const trainer::impl& s, std::vector<std::unique_ptr<file_lock>>* held);

}  // namespace detail

struct trainer::impl {
  using clock_type = std::chrono::steady_clock;

  trainer_config config;
  host_space space;
  // The ranks of a sharded run (null: one process) and this rank's blocks of every batch.
  communicator* comm = nullptr;
  block_range blocks;
  detail::table_roles roles;
  std::size_t num_wide_slots = 0;  // slot keys, plus crossed keys when crossing
  std::unique_ptr<detail::embedding_path> path;
  std::unique_ptr<dense_backend> model;
  // The tables and the dense network both on the device: each step's pooled embeddings and
  // their gradients stay there (embedding_path::forward_in_space, backward_in_space).
  bool pooled_on_device = false;
  detail::run_progress progress;
  detail::run_notes notes;
  std::function<void(const std::string&)> log;

  // Whether this process logs and writes the metrics files and the save's own files: the only
  // process, or rank 0 of a sharded run.
  bool leader() const noexcept { return comm == nullptr || comm->rank() == 0; }
  detail::step_scratch scratch;

  impl();
  // Checks the memory estimate, then builds the embedding path and the dense model; an
  // allocation that fails anyway becomes a status naming what was being built.
  status build();
  // The wide keys (slot keys, then crossed keys) of samples [first, first + n) of the batch (all
  // of it by default) and enough one-hot offsets.
  void fill_keys(const shard_batch& b, std::size_t first = 0, std::size_t n = SIZE_MAX);
  status train_step(const shard_batch& b, std::uint64_t pass, std::uint64_t pass_step,
                    double* loss);
  // train_step of a sharded run (trainer_sharded.cpp): this rank's blocks of the batch, the
  // dense gradients summed over every block in block order.
  status train_step_sharded(const shard_batch& b, std::uint64_t pass, std::uint64_t pass_step,
                            double* loss);
  // The logits of samples [0, n) of an evaluation batch (sharded: each rank predicts its blocks,
  // then every rank gets all of them in sample order). Reads the rows through the path.
  status predict_batch(const shard_batch& b, std::size_t n);
  status predict_batch_sharded(const shard_batch& b, std::size_t n);
  // The rows of p.keys through the path, their first p.dim floats into p.out (zeros for a key
  // never trained).
  status read_embeddings(const detail::table_read& p);
  // Records a divergence (what went non-finite, where) and returns it.
  status diverge(const std::string& where, const std::string& what);
};

namespace detail {

/// "pass 2 step 14 (step 2 of the pass)": the global step counts from 1, resumes included.
std::string step_label(std::uint64_t pass, std::uint64_t global_step, std::uint64_t pass_step);

/// The status of an exception that escaped a run (`where`: "pass 2 step 14"): capacity_exceeded
/// for std::bad_alloc, the code of an embcache::error, internal for anything else; the message
/// starts with `where` and names the exception.
status status_of_exception(std::exception_ptr e, const std::string& where);

/// Whether every float of a wide_deep_model blob is finite (trainer_checkpoint.cpp).
bool dense_blob_finite(const std::vector<std::uint8_t>& blob);

}  // namespace detail
}  // namespace embcache
