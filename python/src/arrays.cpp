#include "arrays.hpp"

#include <dlpack/dlpack.h>

#include <cstring>
#include <utility>

namespace embcache::python {

const char* to_string(dtype t) noexcept {
  switch (t) {
    case dtype::int64:
      return "int64";
    case dtype::uint64:
      return "uint64";
    case dtype::uint32:
      return "uint32";
    case dtype::float32:
      return "float32";
    case dtype::boolean:
      return "bool";
  }
  return "unknown";
}

namespace {

std::size_t item_bytes(dtype t) noexcept {
  switch (t) {
    case dtype::int64:
    case dtype::uint64:
      return 8;
    case dtype::uint32:
    case dtype::float32:
      return 4;
    case dtype::boolean:
      return 1;
  }
  return 0;
}

// The NumPy name of a buffer-protocol format of one item ("float64", ...), or the format itself.
std::string format_name(const char* format, Py_ssize_t itemsize) {
  std::string f = format ? format : "B";
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.erase(0, 1);
  if (f.size() != 1) return "format '" + std::string(format ? format : "") + "'";
  const auto bits = std::to_string(itemsize * 8);
  switch (f[0]) {
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
      return "int" + bits;
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
      return "uint" + bits;
    case 'e':
    case 'f':
    case 'd':
      return "float" + bits;
    case '?':
      return "bool";
    default:
      return "format '" + f + "'";
  }
}

std::string dl_type_name(const DLDataType& t) {
  std::string kind;
  switch (t.code) {
    case kDLInt:
      kind = "int";
      break;
    case kDLUInt:
      kind = "uint";
      break;
    case kDLFloat:
      kind = "float";
      break;
    case kDLBfloat:
      kind = "bfloat";
      break;
    default:
      kind = "type code " + std::to_string(t.code) + " of ";
  }
  std::string s = kind + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

bool dl_type_is(const DLDataType& t, dtype want) {
  if (t.lanes != 1) return false;
  switch (want) {
    case dtype::int64:
      return t.code == kDLInt && t.bits == 64;
    case dtype::uint64:
      return t.code == kDLUInt && t.bits == 64;
    case dtype::uint32:
      return t.code == kDLUInt && t.bits == 32;
    case dtype::float32:
      return t.code == kDLFloat && t.bits == 32;
    case dtype::boolean:  // DLPack 0.8's kDLBool is 6; earlier producers export bool as uint8
      return (t.code == kDLUInt || t.code == 6) && t.bits == 8;
  }
  return false;
}

[[noreturn]] void type_error(const std::string& m) { throw py::type_error(m); }
[[noreturn]] void value_error(const std::string& m) { throw py::value_error(m); }

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

void check_ndim(const std::string& name, const std::vector<std::int64_t>& shape, int ndim) {
  if (ndim >= 0 && shape.size() != std::size_t(ndim))
    value_error(name + ": expected a " + std::to_string(ndim) + "-d array, got shape " +
                shape_string(shape));
}

}  // namespace

array_arg::~array_arg() { release(); }

void array_arg::release() noexcept {
  if (view_) PyBuffer_Release(view_.get());
  view_.reset();
  if (managed_) {
    auto* m = static_cast<DLManagedTensor*>(managed_);
    if (m->deleter) m->deleter(m);
    managed_ = nullptr;
  }
  data_ = nullptr;
  size_ = 0;
}

array_arg::array_arg(array_arg&& o) noexcept
    : name_(std::move(o.name_)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      shape_(std::move(o.shape_)),
      device_(o.device_),
      view_(std::move(o.view_)),
      managed_(std::exchange(o.managed_, nullptr)) {}

array_arg& array_arg::operator=(array_arg&& o) noexcept {
  if (this != &o) {
    release();
    name_ = std::move(o.name_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    shape_ = std::move(o.shape_);
    device_ = o.device_;
    view_ = std::move(o.view_);
    managed_ = std::exchange(o.managed_, nullptr);
  }
  return *this;
}

array_arg array_arg::borrow(py::handle obj, const char* name, dtype type, int ndim, bool writable,
                            memory where) {
  array_arg a;
  a.name_ = name;
  const std::string n = name;
  if (PyObject_CheckBuffer(obj.ptr())) {
    if (where == memory::cuda)
      value_error(n + ": expected an array in CUDA device memory (a tensor with __dlpack__), got " +
                  std::string(Py_TYPE(obj.ptr())->tp_name) + " in host memory");
    a.view_ = std::make_unique<Py_buffer>();
    if (PyObject_GetBuffer(obj.ptr(), a.view_.get(), PyBUF_STRIDES | PyBUF_FORMAT) != 0) {
      a.view_.reset();
      PyErr_Clear();
      type_error(n + ": the object's buffer cannot be read as an array (" +
                 std::string(Py_TYPE(obj.ptr())->tp_name) + ")");
    }
    const Py_buffer& v = *a.view_;
    a.shape_.assign(v.shape, v.shape + v.ndim);
    if (v.ndim == 0) a.shape_.clear();
    const std::string got = format_name(v.format, v.itemsize);
    if (got != to_string(type) || std::size_t(v.itemsize) != item_bytes(type))
      type_error(n + ": expected " + to_string(type) + " elements, got " + got);
    check_ndim(n, a.shape_, ndim);
    if (!PyBuffer_IsContiguous(&v, 'C'))
      value_error(n + ": expected a C-contiguous array (make one with numpy.ascontiguousarray)");
    if (writable && v.readonly)
      value_error(n + ": the array is read-only; the call writes into it");
    a.data_ = v.buf;
  } else if (py::hasattr(obj, "__dlpack__")) {
    py::object capsule = obj.attr("__dlpack__")();
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (m == nullptr) {
      PyErr_Clear();
      type_error(n + ": __dlpack__ did not give a DLPack capsule");
    }
    // The capsule is ours now: its deleter is called when the borrow ends.
    PyCapsule_SetName(capsule.ptr(), "used_dltensor");
    a.managed_ = m;
    const DLTensor& t = m->dl_tensor;
    if (!dl_type_is(t.dtype, type))
      type_error(n + ": expected " + to_string(type) + " elements, got " + dl_type_name(t.dtype));
    a.shape_.assign(t.shape, t.shape + t.ndim);
    check_ndim(n, a.shape_, ndim);
    if (t.strides != nullptr) {
      std::int64_t expected = 1;
      for (int d = t.ndim - 1; d >= 0; --d) {
        if (t.shape[d] != 1 && t.strides[d] != expected)
          value_error(n + ": expected a C-contiguous tensor (call .contiguous())");
        expected *= t.shape[d];
      }
    }
    const bool on_host = t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost ||
                         t.device.device_type == kDLCUDAManaged;
    const bool on_cuda = t.device.device_type == kDLCUDA || t.device.device_type == kDLCUDAManaged;
    if (where == memory::host && !on_host)
      value_error(n + ": expected an array in host memory, got one on DLPack device type " +
                  std::to_string(t.device.device_type) + " (device " +
                  std::to_string(t.device.device_id) + "); move it with .cpu()");
    if (where == memory::cuda && !on_cuda)
      value_error(n + ": expected an array in CUDA device memory, got DLPack device type " +
                  std::to_string(t.device.device_type));
    a.device_ = t.device.device_id;
    a.data_ = static_cast<char*>(t.data) + t.byte_offset;
  } else {
    type_error(n + ": expected a NumPy array or a tensor (buffer protocol or __dlpack__), got " +
               std::string(Py_TYPE(obj.ptr())->tp_name));
  }
  a.size_ = 1;
  for (auto d : a.shape_) a.size_ *= std::size_t(d);
  return a;
}

void array_arg::require_size(std::size_t n, const char* what) const {
  if (size_ != n)
    value_error(name_ + ": expected " + std::to_string(n) + " elements (" + what + "), got " +
                std::to_string(size_));
}

void array_arg::require_rows(std::size_t rows, std::size_t cols) const {
  const bool ok =
      (shape_.size() == 2 && std::size_t(shape_[0]) == rows && std::size_t(shape_[1]) == cols) ||
      (shape_.size() == 1 && size_ == rows * cols);
  if (!ok)
    value_error(name_ + ": expected shape (" + std::to_string(rows) + ", " + std::to_string(cols) +
                ") or " + std::to_string(rows * cols) + " flat elements, got shape " +
                shape_string(shape_));
}

std::optional<array_arg> borrow_optional(py::handle obj, const char* name, dtype type, int ndim,
                                         bool writable) {
  if (obj.is_none()) return std::nullopt;
  return array_arg::borrow(obj, name, type, ndim, writable);
}

output output::make(py::handle out, const char* name, dtype type,
                    const std::vector<std::int64_t>& shape) {
  output o;
  if (out.is_none()) {
    std::vector<py::ssize_t> s(shape.begin(), shape.end());
    switch (type) {
      case dtype::int64:
        o.object = py::array_t<std::int64_t>(s);
        break;
      case dtype::uint64:
        o.object = py::array_t<std::uint64_t>(s);
        break;
      case dtype::uint32:
        o.object = py::array_t<std::uint32_t>(s);
        break;
      case dtype::float32:
        o.object = py::array_t<float>(s);
        break;
      case dtype::boolean:
        o.object = py::array_t<bool>(s);
        break;
    }
  } else {
    o.object = py::reinterpret_borrow<py::object>(out);
  }
  o.view = array_arg::borrow(o.object, name, type, int(shape.size()), true);
  if (o.view.shape() != shape)
    value_error(std::string(name) + ": expected shape " + shape_string(shape) + ", got " +
                shape_string(o.view.shape()));
  return o;
}

py::array_t<float> rows_view(float* data, std::size_t count, std::size_t width, py::handle owner) {
  return py::array_t<float>({py::ssize_t(count), py::ssize_t(width)},
                            {py::ssize_t(width * sizeof(float)), py::ssize_t(sizeof(float))}, data,
                            owner);
}

}  // namespace embcache::python
