// A parameter store as Python holds it: the store, shared with the training caches it is given
// to, and a lock that keeps the calls made from Python threads from overlapping (param_store.hpp:
// calls on one store are not meant to overlap).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "embcache/param_store.hpp"

namespace embcache::python {

template <class Key>
struct store_ref_of {
  std::shared_ptr<param_store<Key>> store;
  std::shared_ptr<std::mutex> calls = std::make_shared<std::mutex>();
};
using store_ref = store_ref_of<std::int64_t>;

/// The Python classes HostStore, RocksDBStore and LogStore (subclasses of ParamStore), and their
/// uint32 twins HostStoreU32, RocksDBStoreU32 and LogStoreU32 (of ParamStoreU32).
template <class Key>
struct host_store_ref_of : store_ref_of<Key> {};
template <class Key>
struct rocksdb_store_ref_of : store_ref_of<Key> {};
template <class Key>
struct log_store_ref_of : store_ref_of<Key> {};

}  // namespace embcache::python
