// Names shared by the writer and the reader of dataset folders.
#pragma once

namespace embcache::detail {

/// The manifest of a dataset folder, beside its shards and keysets.
inline constexpr const char* dataset_manifest_file = "manifest.json";

}  // namespace embcache::detail
