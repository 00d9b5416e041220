/// @file trainer/score.hpp
/// @brief Lookup-only scoring: a trainer save's Wide&Deep network on rows a serving store holds
/// (a model folder, Redis). The scorer lives with the model it runs; the serving stores below it
/// (serving.hpp, redis.hpp) need no trainer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "embcache/serving.hpp"
#include "embcache/status.hpp"

namespace embcache {

/// Options of score_shard.
struct score_options {
  std::size_t batch_size = 0;  ///< samples per batch (default 0: the save's batch_size)
  std::size_t max_samples =
      0;  ///< score at most this many (default 0: the save's eval_max_samples)
  /// Threads of the host BLAS while scoring (set_host_blas_threads, for the whole process);
  /// default -1: the save's `blas_threads`, so that the GEMMs split as in the training run; 0:
  /// leave the process's setting.
  int blas_threads = -1;
};

/// AUC and log loss of a shard, as trainer::evaluate gives them (its eval_metrics).
struct score_metrics {
  std::uint64_t samples = 0;  ///< samples scored
  double auc = 0;             ///< exact AUC (NaN for a single class)
  double logloss = 0;         ///< mean binary cross-entropy
};

/// Scores `shard` with the model of the trainer save `save_dir` (its trainer.json gives the
/// configuration, dense.bin the dense network) and the embeddings `rows` holds: lookup only, no
/// training, dense network on the host. A key the store does not hold pools as a zero row, as
/// trainer::evaluate treats a key never trained; so with the rows of the save's final model the
/// result equals trainer::evaluate's to the bit (same batches, same arithmetic, the same BLAS
/// threads: the save's `blas_threads` unless `options.blas_threads` says otherwise; a save with
/// `blas_threads` 0 ran with OpenBLAS's own setting, which the scoring process must then share).
result<score_metrics> score_shard(const std::string& save_dir, const std::string& shard,
                                  row_lookup& rows, const score_options& options = {});

}  // namespace embcache
