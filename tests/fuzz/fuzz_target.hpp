// Fuzz targets for the parsers of outside bytes (TSV lines, shards, keysets, saves, configs).
//
// One target per file, tests/fuzz/<name>_fuzz.cpp:
//
//   EMBCACHE_FUZZ_TARGET(shard_reader) {          // (const std::uint8_t* data, std::size_t size)
//     auto r = embcache::read_shard(embcache::fuzz::scratch_file(data, size));
//     if (r.ok()) EMBCACHE_FUZZ_CHECK(r.value().header.rows <= size);
//   }
//
// with its seed corpus, a few small valid inputs, in tests/fuzz/corpus/<name>/. A target must
// return normally on any bytes: a crash, a sanitizer report, an escaping exception, a hang or
// a failed EMBCACHE_FUZZ_CHECK is a defect of the parser it drives.
//
// The same file builds two ways:
// - into `fuzz_tests`, a bounded random-mutation driver that runs every target as the ctest
//   `fuzz.<name>` (fuzz_driver.cpp; EMBCACHE_FUZZ_ITERATIONS, EMBCACHE_FUZZ_SECONDS,
//   EMBCACHE_FUZZ_SEED and EMBCACHE_FUZZ_INPUT tune or replay it);
// - with clang and -DEMBCACHE_LIBFUZZER=ON (preset `fuzz`), into one coverage-guided libFuzzer
//   executable per target, `fuzz_<name>`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace embcache::fuzz {

/// Signature of a target's body.
using target_fn = void (*)(const std::uint8_t* data, std::size_t size);

/// Records a target for the mutation driver; returns true. Used by EMBCACHE_FUZZ_TARGET.
bool register_target(const char* name, target_fn fn);

/// A folder private to this process, created on first use and removed at exit.
const std::string& scratch_dir();

/// Writes the bytes to `<scratch_dir>/<name>` (replacing what was there) and returns its path.
std::string scratch_file(const std::uint8_t* data, std::size_t size,
                         const std::string& name = "input");

/// Returns `<scratch_dir>/<name>/`, emptied: a fresh folder for one input.
std::string fresh_dir(const std::string& name);

/// Reports a violated invariant (file, line, condition), saves the current input, aborts.
[[noreturn]] void check_failed(const char* file, int line, const char* condition);

}  // namespace embcache::fuzz

/// Checks an invariant of a parser's answer inside a target.
#define EMBCACHE_FUZZ_CHECK(cond) \
  ((cond) ? (void)0 : ::embcache::fuzz::check_failed(__FILE__, __LINE__, #cond))

#if defined(EMBCACHE_FUZZ_LIBFUZZER)
#define EMBCACHE_FUZZ_ENTRY_(name)                                                    \
  extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) { \
    embcache_fuzz_##name(data, size);                                                 \
    return 0;                                                                         \
  }
#else
#define EMBCACHE_FUZZ_ENTRY_(name)
#endif

/// Defines the target `name`; the braces that follow are its body.
#define EMBCACHE_FUZZ_TARGET(name)                                              \
  static void embcache_fuzz_##name(const std::uint8_t* data, std::size_t size); \
  [[maybe_unused]] static const bool embcache_fuzz_registered_##name =          \
      ::embcache::fuzz::register_target(#name, &embcache_fuzz_##name);          \
  EMBCACHE_FUZZ_ENTRY_(name)                                                    \
  static void embcache_fuzz_##name(const std::uint8_t* data, std::size_t size)
