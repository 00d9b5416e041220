/// @file embcache.hpp
/// @brief Umbrella header: everything a trainer needs from embcache's host library.
#pragma once

#include "embcache/admission.hpp"
#include "embcache/buffer.hpp"
#include "embcache/cache_options.hpp"
#include "embcache/embedding_cache.hpp"
#include "embcache/embedding_cache_ref.hpp"
#include "embcache/host_hybrid.hpp"
#include "embcache/log_store.hpp"
#include "embcache/optimizers.hpp"
#include "embcache/param_store.hpp"
#include "embcache/slot_rows.hpp"
#include "embcache/space.hpp"
#include "embcache/sparse_ops.hpp"
#include "embcache/status.hpp"
#include "embcache/tiered_store.hpp"
#include "embcache/training_cache.hpp"
#include "embcache/version.hpp"
