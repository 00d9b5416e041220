// The synthetic dataset the trainer tests train on: shards of 1,500 rows at 1% of Criteo's
// cardinalities, so that a whole run takes a fraction of a second.
#pragma once

#include <cstddef>
#include <string>

#include "embcache/status.hpp"
#include "embcache/synth.hpp"

namespace embcache::test {

/// Writes `rows` synthetic rows (a multiple of 1,500: one shard each) to `dir`, with the crossed
/// keysets beside each shard when `cross`.
inline status write_trainer_dataset(const std::string& dir, std::size_t rows = 6000,
                                    bool cross = true) {
  synth_options so;
  so.rows = rows;
  so.cardinality_scale = 0.01;
  dataset_writer_options wo;
  wo.output_dir = dir;
  wo.rows_per_shard = 1500;
  return write_synth_dataset(so, wo, cross).get_status();
}

}  // namespace embcache::test
