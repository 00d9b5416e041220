/// @file status.hpp
/// @brief Run-time outcome of an operation: a cheap value that says what failed and where.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace embcache {

/// What kind of failure a status reports.
enum class status_code : std::uint8_t {
  ok = 0,
  invalid_argument,      ///< a caller passed a value outside what the operation accepts
  not_found,             ///< a file, table or key that should exist does not
  capacity_exceeded,     ///< a table, cache or buffer has no room left for what was asked
  io_error,              ///< the operating system refused a read, write, sync or rename
  corruption,            ///< a file is truncated, has a bad checksum or does not parse
  out_of_space,          ///< a disk (or a quota) is full
  unsupported,           ///< the build or the data asks for something this build lacks
  internal,              ///< an invariant broke; please report it
  out_of_device_memory,  ///< a device (GPU) allocation failed: the device's memory is exhausted
  out_of_host_memory,    ///< a host allocation the device needs (pinned memory) failed
};

/// The name of a status code ("ok", "invalid_argument", ...).
const char* to_string(status_code code) noexcept;

/// Exception thrown for misuse, and by status::throw_if_error().
class error : public std::runtime_error {
 public:
  error(status_code code, const std::string& what) : std::runtime_error(what), code_(code) {}
  /// The code of the status that was thrown.
  status_code code() const noexcept { return code_; }

 private:
  status_code code_;
};

/// Outcome of an operation that can fail at run time (I/O, corruption, capacity, bad input).
/// Default-constructed it is ok; otherwise it carries a message naming what failed and where.
class [[nodiscard]] status {
 public:
  status() = default;
  status(status_code code, std::string message) : code_(code), message_(std::move(message)) {}

  static status ok_status() { return {}; }
  static status invalid_argument(std::string m) {
    return {status_code::invalid_argument, std::move(m)};
  }
  static status not_found(std::string m) { return {status_code::not_found, std::move(m)}; }
  static status capacity_exceeded(std::string m) {
    return {status_code::capacity_exceeded, std::move(m)};
  }
  static status io_error(std::string m) { return {status_code::io_error, std::move(m)}; }
  static status corruption(std::string m) { return {status_code::corruption, std::move(m)}; }
  static status out_of_space(std::string m) { return {status_code::out_of_space, std::move(m)}; }
  static status unsupported(std::string m) { return {status_code::unsupported, std::move(m)}; }
  static status internal(std::string m) { return {status_code::internal, std::move(m)}; }
  static status out_of_device_memory(std::string m) {
    return {status_code::out_of_device_memory, std::move(m)};
  }
  static status out_of_host_memory(std::string m) {
    return {status_code::out_of_host_memory, std::move(m)};
  }

  /// True when the operation succeeded.
  bool ok() const noexcept { return code_ == status_code::ok; }
  status_code code() const noexcept { return code_; }
  /// What failed and where; empty when ok.
  const std::string& message() const noexcept { return message_; }
  /// "<code>: <message>", or "ok".
  std::string to_string() const;
  /// Throws embcache::error when not ok.
  void throw_if_error() const {
    if (!ok()) throw error(code_, to_string());
  }
  /// A copy whose message is prefixed by `context: `.
  status with_context(const std::string& context) const {
    return ok() ? *this : status(code_, context + ": " + message_);
  }

 private:
  status_code code_ = status_code::ok;
  std::string message_;
};

/// A value or a failed status.
template <class T>
class [[nodiscard]] result {
 public:
  result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  result(status s)                               // NOLINT(google-explicit-constructor)
      : status_(s.ok() ? status(status_code::internal,
                                "result constructed from an ok status without a value")
                       : std::move(s)) {}
  bool ok() const noexcept { return status_.ok(); }
  const status& get_status() const noexcept { return status_; }
  /// The value; throws embcache::error when the result holds a failure.
  T& value() & {
    status_.throw_if_error();
    return value_;
  }
  const T& value() const& {
    status_.throw_if_error();
    return value_;
  }
  T&& value() && {
    status_.throw_if_error();
    return std::move(value_);
  }

 private:
  status status_;
  T value_{};
};

inline const char* to_string(status_code code) noexcept {
  // In the order of the enumerators.
  constexpr const char* names[] = {
      "ok",       "invalid_argument",     "not_found",         "capacity_exceeded",
      "io_error", "corruption",           "out_of_space",      "unsupported",
      "internal", "out_of_device_memory", "out_of_host_memory"};
  const auto i = static_cast<std::size_t>(code);
  return i < sizeof(names) / sizeof(names[0]) ? names[i] : "unknown";
}

inline std::string status::to_string() const {
  if (ok()) return "ok";
  return std::string(embcache::to_string(code_)) + ": " + message_;
}

}  // namespace embcache

/// Returns the status of `expr` from the enclosing function when it is not ok.
#define EMBCACHE_RETURN_IF_ERROR(expr)         \
  do {                                         \
    ::embcache::status _embcache_s = (expr);   \
    if (!_embcache_s.ok()) return _embcache_s; \
  } while (0)
