// Every definition of training_cache<Key, Space>, for the translation units that instantiate it:
// src/training/training_cache.cpp (host space, library embcache) and
// src/training/training_cache_cuda.cpp (cuda space, library embcache::cuda). Nothing else includes
// the files below.
//
//   cache_bridge.hpp          the device cache's calls with host-memory arguments
//   table_state.hpp           per-table state in named parts, shared helpers
//   background.hpp            the prefetch worker's and the flusher's threads and shared state
//   training_cache_core.hpp   the state behind a training_cache and the map of its operations
//   write_behind.inl          store access, the flusher, end_training()'s write-back
//   prefetch.inl              the prefetch worker: staging and early install
//   boundary.inl              begin_pass: leaving, staying and arriving rows
//   on_demand.inl             lookup batches with eviction by score
//   admission.inl             which keys of a keyset or batch are admitted (feature admission)
//   expiry.inl                expiry at a pass boundary (embcache/expiry.hpp)
//   export.inl                incremental export, in memory and as delta folders
//   persistence.inl           save and load through the model-folder module (model_folder.hpp)
//   training_cache_members.inl  the public members
#pragma once

#include "training/admission.inl"
#include "training/boundary.inl"
#include "training/expiry.inl"
#include "training/export.inl"
#include "training/on_demand.inl"
#include "training/persistence.inl"
#include "training/prefetch.inl"
#include "training/training_cache_members.inl"
#include "training/write_behind.inl"
