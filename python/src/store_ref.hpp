// A parameter store as Python holds it: the store, shared with the training caches it is given
// to, and a lock that keeps the calls made from Python threads from overlapping (param_store.hpp:
// calls on one store are not meant to overlap).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "embcache/param_store.hpp"

namespace embcache::python {

struct store_ref {
  std::shared_ptr<param_store<std::int64_t>> store;
  std::shared_ptr<std::mutex> calls = std::make_shared<std::mutex>();
};

/// The Python classes HostStore and RocksDBStore (subclasses of ParamStore).
struct host_store_ref : store_ref {};
struct rocksdb_store_ref : store_ref {};

}  // namespace embcache::python
