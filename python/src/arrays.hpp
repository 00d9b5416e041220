// Arrays that cross between Python and C++ without copies: inputs are borrowed from any object
// with the buffer protocol (NumPy) or `__dlpack__` (torch), checked for dtype, shape, contiguity,
// memory and writability before any pointer is used; outputs are NumPy arrays that the C++ calls
// fill in place.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace embcache::python {

namespace py = pybind11;

/// Element types the bindings accept.
enum class dtype : std::uint8_t { int64, uint64, uint32, float32, boolean };

/// The element type of keys of type `Key` (int64 or uint32, the key types the library builds).
template <class Key>
constexpr dtype key_dtype() noexcept {
  static_assert(std::is_same_v<Key, std::int64_t> || std::is_same_v<Key, std::uint32_t>,
                "keys are int64 or uint32");
  return std::is_same_v<Key, std::int64_t> ? dtype::int64 : dtype::uint32;
}

/// The suffix of the Python class names of `Key`: "" for int64 (EmbeddingCache), "U32" for
/// uint32 (EmbeddingCacheU32).
template <class Key>
constexpr const char* key_suffix() noexcept {
  return std::is_same_v<Key, std::int64_t> ? "" : "U32";
}

/// Name of an element type as NumPy spells it ("int64", "float32", ...).
const char* to_string(dtype t) noexcept;

/// Where an array's memory must be.
enum class memory : std::uint8_t {
  host,  ///< CPU memory (NumPy, CPU tensors, CUDA host memory)
  cuda,  ///< memory of a CUDA device (DLPack only)
};

/// A borrowed array: its data stays valid (the exporter is kept alive) for the object's lifetime,
/// also while the GIL is released. Move-only.
class array_arg {
 public:
  array_arg() = default;
  ~array_arg();
  array_arg(array_arg&& o) noexcept;
  array_arg& operator=(array_arg&& o) noexcept;
  array_arg(const array_arg&) = delete;
  array_arg& operator=(const array_arg&) = delete;

  /// Borrows `obj` as an array of `type` elements in `where` memory, C-contiguous, with `ndim`
  /// dimensions (a 1-d array is accepted for ndim 2 when `flat_ok`). `name` starts every message.
  /// TypeError: not an array, or another element type; ValueError: another ndim, not contiguous,
  /// read-only while `writable`, or in the wrong memory.
  static array_arg borrow(py::handle obj, const char* name, dtype type, int ndim, bool writable,
                          memory where = memory::host);

  void* data() const noexcept { return data_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  /// Elements in all.
  std::size_t size() const noexcept { return size_; }
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  /// The device of a cuda array (DLPack device id); 0 otherwise.
  int device() const noexcept { return device_; }

  /// ValueError unless the array holds exactly `n` elements.
  void require_size(std::size_t n, const char* what) const;
  /// ValueError unless the array is (rows, cols) or, flat, rows * cols elements.
  void require_rows(std::size_t rows, std::size_t cols) const;

 private:
  void release() noexcept;

  std::string name_;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  std::vector<std::int64_t> shape_;
  int device_ = 0;
  std::unique_ptr<Py_buffer> view_;  // buffer protocol: released in the destructor
  void* managed_ = nullptr;          // DLPack: DLManagedTensor*, its deleter called at the end
};

/// `obj` borrowed as in array_arg::borrow when it is not None; otherwise nothing.
std::optional<array_arg> borrow_optional(py::handle obj, const char* name, dtype type, int ndim,
                                         bool writable);

/// A new NumPy array of `shape` (uninitialized), C-contiguous.
template <class T>
py::array_t<T> new_array(std::vector<py::ssize_t> shape) {
  return py::array_t<T>(std::move(shape));
}

/// An array a call writes into: the caller's `out` (checked: writable, `type`, C-contiguous,
/// exactly `shape`) or, for None, a new NumPy array of `shape`. `object` is what the call returns.
struct output {
  py::object object;
  array_arg view;

  static output make(py::handle out, const char* name, dtype type,
                     const std::vector<std::int64_t>& shape);
  template <class T>
  T* as() const noexcept {
    return view.as<T>();
  }
};

/// A NumPy array of `shape` that takes over the vector's memory (no copy).
template <class T>
py::array_t<T> to_numpy(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule free(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(std::move(shape), owned->data(), free);
}

/// A NumPy view of `count` rows of `width` floats at `data`, which `owner` keeps alive.
py::array_t<float> rows_view(float* data, std::size_t count, std::size_t width, py::handle owner);

}  // namespace embcache::python
