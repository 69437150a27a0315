// Conversions between Python values and engine values: dtypes, devices, shapes, numbers,
// nested lists and buffers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "copy_state.h"
#include "orochi/base/check.h"
#include "orochi/engine/device.h"
#include "orochi/engine/dtype.h"
#include "orochi/engine/error.h"
#include "orochi/engine/ops.h"
#include "python_bindings.h"
#include "python_engine.h"

namespace orochi::copy::bindings {
namespace {

using engine::DTypeName;
using engine::kDTypeCount;
using engine::VisitDType;

struct PyDType {
  DType value;
};
struct PyDevice {
  Device value;
};

// One Python object per dtype, made when the module is created. Plain pointers on purpose: this
// library's static destructors run after the copy's CPython is gone.
std::array<PyObject*, kDTypeCount> g_dtype_objects{};

struct DTypeAlias {
  const char* name;
  DType dtype;
};
// PyTorch's alternative names, so `orochi.long` and `dtype="float"` read as they would in torch.
constexpr DTypeAlias kDTypeAliases[] = {
    {"float", DType::kFloat32}, {"double", DType::kFloat64}, {"half", DType::kFloat16},
    {"long", DType::kInt64},    {"int", DType::kInt32},      {"short", DType::kInt16},
};

std::string DeviceRepr(Device device) {
  if (device.type == engine::DeviceType::kCpu) return "device(type='cpu')";
  return "device(type='cuda', index=" + std::to_string(device.index) + ")";
}

Device ParseDeviceText(const std::string& text) {
  if (text == "cpu") return {};
  std::string prefix = "cuda";
  if (text.starts_with(prefix)) {
    int index = 0;
    if (text.size() > prefix.size()) {
      if (text[prefix.size()] != ':') throw py::value_error("unknown device '" + text + "'");
      try {
        index = std::stoi(text.substr(prefix.size() + 1));
      } catch (const std::exception&) {
        throw py::value_error("unknown device '" + text + "'");
      }
    }
    return {engine::DeviceType::kCuda, index};
  }
  throw py::value_error("unknown device '" + text + "' (expected 'cpu', 'cuda' or 'cuda:N')");
}

void RequireUsable(Device device) {
  if (const Status usable = engine::DeviceStatus(device); !usable.ok()) {
    throw py::value_error("device '" + engine::DeviceName(device) +
                          "' is not available: " + usable.message());
  }
}

// Python buffer format letters (the struct module's) and their dtypes; bfloat16 has none.
// Exports use the first letter listed for a dtype, imports accept them all.
struct BufferFormatLetter {
  const char* letter;
  DType dtype;
};
constexpr BufferFormatLetter kBufferFormats[] = {
    {"?", DType::kBool},    {"B", DType::kUInt8},   {"c", DType::kUInt8},   {"b", DType::kInt8},
    {"h", DType::kInt16},   {"i", DType::kInt32},   {"q", DType::kInt64},   {"l", DType::kInt64},
    {"e", DType::kFloat16}, {"f", DType::kFloat32}, {"d", DType::kFloat64},
};

// The dtype a buffer's struct format describes; native or little-endian only.
DType DTypeOfFormat(const char* format) {
  std::string_view text = format == nullptr ? "B" : format;
  if (!text.empty() && (text[0] == '@' || text[0] == '=' || text[0] == '<')) text.remove_prefix(1);
  for (const BufferFormatLetter& entry : kBufferFormats) {
    if (text == entry.letter) return entry.dtype;
  }
  throw py::type_error("cannot make a tensor from a buffer of format '" + std::string(format) +
                       "': Orochi supports bool, uint8, int8, int16, int32, int64, float16, "
                       "float32 and float64 elements");
}

// Releases a Python buffer lent to a borrowed storage. Runs on whichever thread drops the last
// reference, so it takes this copy's GIL; after finalization the buffer is simply left.
void ReleaseBuffer(void* context) {
  auto* view = static_cast<Py_buffer*>(context);
  if (Py_IsInitialized() != 0 && !State().finalized) {
    PyGILState_STATE gil = PyGILState_Ensure();
    PyBuffer_Release(view);
    PyGILState_Release(gil);
  }
  delete view;
}

// One leaf of a nested sequence.
struct Leaf {
  enum Kind : uint8_t { kBool, kInt, kFloat } kind;
  int64_t integer = 0;
  double floating = 0;
};

class NestedReader {
 public:
  void Walk(py::handle object, size_t depth) {
    if (depth > engine::kMaxDims) {
      throw py::value_error("orochi.tensor: the data is nested deeper than " +
                            std::to_string(engine::kMaxDims) + " levels");
    }
    if (PyList_Check(object.ptr()) || PyTuple_Check(object.ptr())) {
      auto sequence = py::reinterpret_borrow<py::sequence>(object);
      auto length = static_cast<int64_t>(sequence.size());
      if (leaf_depth_ >= 0 && static_cast<int64_t>(depth) >= leaf_depth_) MixedDepth(depth);
      if (shape_.size() == depth) {
        shape_.push_back(length);
      } else if (shape_[depth] != length) {
        throw py::value_error("orochi.tensor: expected a sequence of length " +
                              std::to_string(shape_[depth]) + " at dim " + std::to_string(depth) +
                              ", got " + std::to_string(length));
      }
      for (py::handle item : sequence) Walk(item, depth + 1);
      return;
    }
    if (const Tensor* tensor = TensorFromPython(object.ptr())) {
      // A tensor inside a list contributes its elements and its dims.
      AtLeaf(depth + static_cast<size_t>(tensor->dim()));
      for (int64_t d = 0; d < tensor->dim(); ++d) {
        size_t at = depth + static_cast<size_t>(d);
        if (shape_.size() == at) shape_.push_back(tensor->shape()[d]);
        if (shape_[at] != tensor->shape()[d]) {
          throw py::value_error("orochi.tensor: tensors in a list must have equal shapes");
        }
      }
      tensor_dtype_ =
          tensor_dtype_ ? engine::PromoteTypes(*tensor_dtype_, tensor->dtype()) : tensor->dtype();
      Tensor contiguous = OnHost(tensor->Contiguous());
      for (int64_t i = 0; i < contiguous.numel(); ++i) {
        AddNumber(ItemToPython(contiguous, i), depth, /*from_tensor=*/true);
      }
      return;
    }
    AtLeaf(depth);
    AddNumber(object, depth, /*from_tensor=*/false);
  }

  const Shape& shape() const { return shape_; }
  const std::vector<Leaf>& leaves() const { return leaves_; }

  // PyTorch's choice: the dtype of the tensors in the data, else bool, int64 or float32 by the
  // kinds of its numbers, float32 for no data at all; both promoted together when mixed.
  DType InferredDType() const {
    std::optional<DType> numbers;
    if (number_kind_ >= 0) {
      numbers = number_kind_ == Leaf::kFloat ? DType::kFloat32
                : number_kind_ == Leaf::kInt ? DType::kInt64
                                             : DType::kBool;
    }
    if (tensor_dtype_ && numbers) return engine::PromoteTypes(*tensor_dtype_, *numbers);
    if (tensor_dtype_) return *tensor_dtype_;
    return numbers.value_or(DType::kFloat32);
  }

 private:
  void AtLeaf(size_t depth) {
    if (leaf_depth_ < 0) {
      leaf_depth_ = static_cast<int64_t>(depth);
      if (shape_.size() > depth) MixedDepth(depth);
    } else if (leaf_depth_ != static_cast<int64_t>(depth)) {
      MixedDepth(depth);
    }
  }
  [[noreturn]] static void MixedDepth(size_t depth) {
    throw py::value_error(
        "orochi.tensor: the nested sequence is ragged (a number and a "
        "sequence both appear at dim " +
        std::to_string(depth) + ")");
  }
  void AddNumber(py::handle object, size_t /*depth*/, bool from_tensor) {
    AddLeaf(object);
    if (!from_tensor) number_kind_ = std::max<int>(number_kind_, leaves_.back().kind);
  }
  void AddLeaf(py::handle object) {
    PyObject* raw = object.ptr();
    if (PyBool_Check(raw)) {
      leaves_.push_back({Leaf::kBool, raw == Py_True ? 1 : 0, 0});
    } else if (PyLong_Check(raw)) {
      int overflow = 0;
      int64_t value = PyLong_AsLongLongAndOverflow(raw, &overflow);
      OROCHI_CHECK_ARG(overflow == 0, "orochi.tensor: an int does not fit in 64 bits");
      leaves_.push_back({Leaf::kInt, value, 0});
    } else if (PyFloat_Check(raw)) {
      leaves_.push_back({Leaf::kFloat, 0, PyFloat_AS_DOUBLE(raw)});
    } else if (PyIndex_Check(raw) != 0) {
      leaves_.push_back({Leaf::kInt, object.cast<int64_t>(), 0});
    } else {
      throw py::type_error(
          "orochi.tensor: expected numbers, bools, tensors or sequences of "
          "them, got " +
          std::string(Py_TYPE(raw)->tp_name));
    }
  }

  Shape shape_;
  std::vector<Leaf> leaves_;
  int64_t leaf_depth_ = -1;
  int number_kind_ = -1;  // the highest Leaf::Kind among plain numbers
  std::optional<DType> tensor_dtype_;
};

// bool elements copied from raw bytes may hold any byte; the engine's kernels need 0 or 1.
void NormalizeBools(Tensor& tensor) {
  if (tensor.dtype() != DType::kBool || !tensor.is_contiguous()) return;
  auto* bytes = static_cast<unsigned char*>(tensor.mutable_data());
  for (int64_t i = 0; i < tensor.numel(); ++i) bytes[i] = bytes[i] != 0 ? 1 : 0;
}

// Owns a Python buffer export until it is handed to a borrowed storage.
class BufferExport {
 public:
  BufferExport() : view_(std::make_unique<Py_buffer>()) {}
  BufferExport(const BufferExport&) = delete;
  BufferExport& operator=(const BufferExport&) = delete;
  ~BufferExport() {
    if (acquired_) PyBuffer_Release(view_.get());
  }
  void Acquire(py::handle object, int flags) {
    if (PyObject_GetBuffer(object.ptr(), view_.get(), flags) != 0) throw py::error_already_set();
    acquired_ = true;
  }
  Py_buffer* operator->() const { return view_.get(); }
  Py_buffer* get() const { return view_.get(); }
  // Gives the export to a storage, whose release function (ReleaseBuffer) ends it.
  void* HandOver() {
    acquired_ = false;
    return view_.release();
  }

 private:
  std::unique_ptr<Py_buffer> view_;
  bool acquired_ = false;
};

template <typename T>
T LeafAs(const Leaf& leaf, DType dtype) {
  if (leaf.kind == Leaf::kFloat) {
    // As torch.tensor: a float must fit an integer dtype, but becomes inf in a narrow float one.
    if (engine::IsIntegral(dtype)) RequireFits(leaf.floating, dtype);
    return engine::Convert<T>(leaf.floating);
  }
  if (leaf.kind == Leaf::kInt && engine::IsIntegral(dtype)) RequireFits(leaf.integer, dtype);
  return engine::Convert<T>(leaf.integer);
}

}  // namespace

const char* BufferFormat(DType dtype) {
  for (const BufferFormatLetter& entry : kBufferFormats) {
    if (entry.dtype == dtype) return entry.letter;
  }
  return nullptr;
}

void RefuseConstruction(py::handle type, const char* message) {
  py::cpp_function refuse(
      [message](const py::args& /*args*/, const py::kwargs& /*kwargs*/) -> py::object {
        throw py::type_error(message);
      });
  type.attr("__new__") = py::reinterpret_steal<py::object>(PyStaticMethod_New(refuse.ptr()));
}

void BindValueTypes(py::module_& module) {
  py::class_<PyDType> dtype_type(module, "dtype", "An element type, e.g. orochi.float32.");
  dtype_type
      .def_property_readonly("itemsize",
                             [](const PyDType& self) { return engine::ItemSize(self.value); })
      .def_property_readonly("is_floating_point",
                             [](const PyDType& self) { return engine::IsFloating(self.value); })
      .def("__repr__",
           [](const PyDType& self) { return "orochi." + std::string(DTypeName(self.value)); })
      .def("__reduce__", [](const PyDType& self) { return std::string(DTypeName(self.value)); });
  RefuseConstruction(dtype_type,
                     "orochi.dtype cannot be constructed; use orochi.float32 and "
                     "the other dtype constants");
  for (DType dtype : engine::kAllDTypeList) {
    py::object object = py::cast(PyDType{dtype});
    module.attr(std::string(DTypeName(dtype)).c_str()) = object;
    g_dtype_objects[static_cast<size_t>(dtype)] = object.release().ptr();
  }
  for (const DTypeAlias& alias : kDTypeAliases) module.attr(alias.name) = DTypeObject(alias.dtype);

  py::class_<PyDevice> device_type(module, "device",
                                   "A device: orochi.device('cpu'), orochi.device('cuda', 0).");
  // Made whole in __new__ (an __init__ would leave `device.__new__(device)` half-built).
  py::cpp_function make_device(
      [](py::handle /*cls*/, py::handle spec, std::optional<int> index) {
        Device device = PyUnicode_Check(spec.ptr()) != 0 ? ParseDeviceText(spec.cast<std::string>())
                                                         : ParseDevice(spec);
        if (index) device.index = *index;
        return py::cast(PyDevice{device});
      },
      py::arg("cls"), py::arg("type"), py::arg("index") = py::none());
  device_type.attr("__new__") =
      py::reinterpret_steal<py::object>(PyStaticMethod_New(make_device.ptr()));
  device_type.attr("__init__") = py::cpp_function(
      [](py::handle /*self*/, const py::args& /*args*/, const py::kwargs& /*kwargs*/) {},
      py::is_method(device_type));
  device_type
      .def_property_readonly("type",
                             [](const PyDevice& self) {
                               return self.value.type == engine::DeviceType::kCpu ? "cpu" : "cuda";
                             })
      .def_property_readonly("index",
                             [](const PyDevice& self) -> py::object {
                               if (self.value.type == engine::DeviceType::kCpu) return py::none();
                               return py::int_(self.value.index);
                             })
      .def("__repr__", [](const PyDevice& self) { return DeviceRepr(self.value); })
      .def("__str__", [](const PyDevice& self) { return engine::DeviceName(self.value); })
      .def("__eq__",
           [](const PyDevice& self, py::handle other) {
             return IsDeviceLike(other) && PyUnicode_Check(other.ptr()) == 0
                        ? self.value == other.cast<const PyDevice&>().value
                        : PyUnicode_Check(other.ptr()) != 0 &&
                              engine::DeviceName(self.value) == other.cast<std::string>();
           })
      .def("__hash__",
           [](const PyDevice& self) { return py::hash(py::str(engine::DeviceName(self.value))); });
}

py::object DTypeObject(DType dtype) {
  auto index = static_cast<size_t>(dtype);
  OROCHI_INTERNAL_ASSERT(index < g_dtype_objects.size(), "DTypeObject: not a dtype");
  return py::reinterpret_borrow<py::object>(g_dtype_objects[index]);
}

DType ParseDType(py::handle object) {
  if (py::isinstance<PyDType>(object)) return object.cast<const PyDType&>().value;
  if (object.ptr() == reinterpret_cast<PyObject*>(&PyFloat_Type)) return DType::kFloat64;
  if (object.ptr() == reinterpret_cast<PyObject*>(&PyLong_Type)) return DType::kInt64;
  if (object.ptr() == reinterpret_cast<PyObject*>(&PyBool_Type)) return DType::kBool;
  if (PyUnicode_Check(object.ptr()) != 0) {
    auto text = object.cast<std::string>();
    std::string_view name = text;
    if (name.starts_with("orochi.")) name.remove_prefix(7);
    for (const DTypeAlias& alias : kDTypeAliases) {
      if (name == alias.name) return alias.dtype;
    }
    DType dtype;
    for (DType candidate : engine::kAllDTypeList) {
      if (DTypeName(candidate) == name) return candidate;
    }
    if (engine::ParseDType(name, &dtype)) return dtype;
    throw py::type_error("unknown dtype '" + text + "'");
  }
  throw py::type_error("expected an orochi.dtype such as orochi.float32, got " +
                       std::string(Py_TYPE(object.ptr())->tp_name));
}

std::optional<DType> ParseOptionalDType(py::handle object) {
  if (object.is_none()) return std::nullopt;
  return ParseDType(object);
}

py::object DeviceObject(Device device) { return py::cast(PyDevice{device}); }

bool IsDeviceLike(py::handle object) {
  if (py::isinstance<PyDevice>(object)) return true;
  if (PyUnicode_Check(object.ptr()) == 0) return false;
  auto text = object.cast<std::string>();
  return text == "cpu" || text.starts_with("cuda");
}

Device ParseDevice(py::handle object) {
  Device device;
  if (py::isinstance<PyDevice>(object)) {
    device = object.cast<const PyDevice&>().value;
  } else if (PyUnicode_Check(object.ptr()) != 0) {
    device = ParseDeviceText(object.cast<std::string>());
  } else if (PyLong_Check(object.ptr()) != 0) {
    device = {engine::DeviceType::kCuda, object.cast<int>()};
  } else {
    throw py::type_error("expected a device ('cpu', 'cuda:0' or orochi.device), got " +
                         std::string(Py_TYPE(object.ptr())->tp_name));
  }
  RequireUsable(device);
  return device;
}

Shape ParseShape(py::handle sequence, const char* function) {
  if (PyLong_Check(sequence.ptr()) != 0) return {sequence.cast<int64_t>()};
  if ((PyList_Check(sequence.ptr()) != 0 || PyTuple_Check(sequence.ptr()) != 0) &&
      static_cast<size_t>(PySequence_Size(sequence.ptr())) > engine::kMaxDims) {
    throw py::value_error(std::string(function) + ": tensors have at most " +
                          std::to_string(engine::kMaxDims) + " dimensions");
  }
  if (PyList_Check(sequence.ptr()) == 0 && PyTuple_Check(sequence.ptr()) == 0) {
    throw py::type_error(std::string(function) + ": expected a sequence of ints as the size, got " +
                         Py_TYPE(sequence.ptr())->tp_name);
  }
  Shape shape;
  for (py::handle item : py::reinterpret_borrow<py::sequence>(sequence)) {
    if (PyIndex_Check(item.ptr()) == 0 || PyBool_Check(item.ptr()) != 0) {
      throw py::type_error(std::string(function) + ": sizes must be ints, got " +
                           Py_TYPE(item.ptr())->tp_name);
    }
    shape.push_back(item.cast<int64_t>());
  }
  return shape;
}

Shape ParseSizes(const py::args& sizes, const char* function) {
  if (sizes.size() == 1 && PyLong_Check(sizes[0].ptr()) == 0) return ParseShape(sizes[0], function);
  return ParseShape(sizes, function);
}

std::vector<int64_t> ParseDims(py::handle dims) {
  if (dims.is_none()) return {};
  return ParseShape(dims, "dim");
}

namespace {

// A 0-dim tensor of `dtype` holding `value` converted the way C++ converts (integers wrap
// modulo the width, as PyTorch's wrapped numbers do).
template <typename Number>
Tensor TypedScalar(Number value, DType dtype) {
  Tensor scalar = Tensor::Empty({}, dtype);
  VisitDType(dtype,
             [&]<typename T>() { *scalar.mutable_data_as<T>() = engine::Convert<T>(value); });
  return scalar;
}

}  // namespace

std::optional<int64_t> PythonInt(py::handle object) {
  PyObject* raw = object.ptr();
  if (PyLong_Check(raw) == 0 || PyBool_Check(raw) != 0) return std::nullopt;
  int overflow = 0;
  const int64_t value = PyLong_AsLongLongAndOverflow(raw, &overflow);
  OROCHI_CHECK_ARG(overflow == 0, "an int operand does not fit in 64 bits");
  return value;
}

namespace {

// The largest finite value of a floating dtype narrower than float64 (nullopt otherwise).
std::optional<double> LargestFinite(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 65504.0;
    case DType::kBFloat16:
      return 3.3895313892515355e38;
    case DType::kFloat32:
      return static_cast<double>(std::numeric_limits<float>::max());
    default:
      return std::nullopt;
  }
}

[[noreturn]] void ThrowOverflow(const std::string& value, DType dtype) {
  engine::detail::Throw(StatusCode::kInvalidArgument,
                        "value " + value + " cannot be converted to " +
                            std::string(DTypeName(dtype)) + " without overflow");
}

}  // namespace

void RequireFits(int64_t value, DType dtype) {
  if (std::optional<double> largest = LargestFinite(dtype)) {
    if (std::abs(static_cast<double>(value)) > *largest) {
      ThrowOverflow(std::to_string(value), dtype);
    }
    return;
  }
  if (!engine::IsIntegral(dtype)) return;
  VisitDType(dtype, [&]<typename T>() {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      // c10's rule: an unsigned type also takes negatives down to -max, which wrap (uint8 -1 is
      // 255), so only values no wrap can explain are refused.
      bool fits = std::in_range<T>(value);
      if constexpr (std::is_unsigned_v<T>) {
        fits = fits || (value < 0 && -value <= static_cast<int64_t>(std::numeric_limits<T>::max()));
      }
      const int64_t lowest = std::is_unsigned_v<T>
                                 ? -static_cast<int64_t>(std::numeric_limits<T>::max())
                                 : static_cast<int64_t>(std::numeric_limits<T>::min());
      OROCHI_CHECK_ARG(fits, "value " << value << " cannot be converted to " << DTypeName(dtype)
                                      << " without overflow (range " << lowest << " to "
                                      << +std::numeric_limits<T>::max() << ")");
    }
  });
}

void RequireFits(double value, DType dtype) {
  if (std::optional<double> largest = LargestFinite(dtype)) {
    // Infinities and NaN are values of every floating dtype; only a finite value past the
    // largest one would silently become an infinity.
    if (std::isfinite(value) && std::abs(value) > *largest) {
      ThrowOverflow(py::repr(py::float_(value)).cast<std::string>(), dtype);
    }
    return;
  }
  if (!engine::IsIntegral(dtype)) return;
  VisitDType(dtype, [&]<typename T>() {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      // NaN fails both comparisons' negation, so it is refused too (as in c10's overflows()).
      const bool fits = value >= static_cast<double>(std::numeric_limits<T>::lowest()) &&
                        value <= static_cast<double>(std::numeric_limits<T>::max());
      if (!fits) ThrowOverflow(py::repr(py::float_(value)).cast<std::string>(), dtype);
    }
  });
}

void RequireFitsWhereKept(py::handle number, DType dtype) {
  PyObject* raw = number.ptr();
  if (PyBool_Check(raw) != 0) return;
  if (engine::IsIntegral(dtype)) {
    if (std::optional<int64_t> integer = PythonInt(number)) RequireFits(*integer, dtype);
  } else if (engine::IsFloating(dtype) && PyFloat_Check(raw) != 0) {
    RequireFits(PyFloat_AS_DOUBLE(raw), dtype);
  }
}

bool IsNumpyScalar(py::handle object) {
  // Only when the model's code has imported numpy: the check never imports it.
  PyObject* numpy = PyImport_GetModule(py::str("numpy").ptr());
  if (numpy == nullptr) {
    PyErr_Clear();
    return false;
  }
  auto module = py::reinterpret_steal<py::object>(numpy);
  py::object generic = py::getattr(module, "generic", py::none());
  return !generic.is_none() && PyObject_IsInstance(object.ptr(), generic.ptr()) == 1;
}

Tensor ScalarTensor(py::handle number, const Tensor& like, Op op) {
  // PyTorch's "wrapped number" rule: a Python number takes the tensor's dtype when its kind
  // (bool < int < float) is no higher than the tensor's, and otherwise the default dtype of its
  // kind (int64, float32). Made in that dtype, the 0-dim operand never widens the result, even
  // when `like` is 0-dim itself.
  PyObject* raw = number.ptr();
  const DType dtype = like.dtype();
  // Subtraction keeps a bool a bool, so that the engine refuses it as PyTorch does.
  if (PyBool_Check(raw)) return TypedScalar(raw == Py_True, op == Op::sub ? DType::kBool : dtype);
  if (std::optional<int64_t> integer = PythonInt(number)) {
    const int64_t value = *integer;
    // True division of integers computes in float32, so the int keeps its value (int16 / 32768
    // is not int16 / -32768), as PyTorch's does.
    if (op == Op::div && !engine::IsFloating(dtype)) return TypedScalar(value, DType::kFloat32);
    return TypedScalar(value, dtype == DType::kBool ? DType::kInt64 : dtype);
  }
  if (PyFloat_Check(raw)) {
    double value = PyFloat_AS_DOUBLE(raw);
    return TypedScalar(value, engine::IsFloating(dtype) ? dtype : DType::kFloat32);
  }
  if (IsNumpyScalar(number)) return ScalarTensor(number.attr("item")(), like, op);
  throw py::type_error("unsupported operand type " + std::string(Py_TYPE(raw)->tp_name) +
                       " for a tensor operation (expected a tensor, int, float or bool)");
}

Tensor ValueForWrite(py::handle value, DType dtype) {
  if (const Tensor* tensor = TensorFromPython(value.ptr())) return *tensor;
  PyObject* raw = value.ptr();
  if (PyBool_Check(raw)) return TypedScalar(raw == Py_True, dtype);
  if (std::optional<int64_t> integer = PythonInt(value)) {
    RequireFits(*integer, dtype);
    return TypedScalar(*integer, dtype);
  }
  if (PyFloat_Check(raw)) {
    const double number = PyFloat_AS_DOUBLE(raw);
    RequireFits(number, dtype);
    return TypedScalar(number, dtype);
  }
  if (PyList_Check(raw) || PyTuple_Check(raw)) return TensorFromData(value, dtype);
  if (IsNumpyScalar(value)) return ValueForWrite(value.attr("item")(), dtype);
  throw py::type_error("cannot write a " + std::string(Py_TYPE(raw)->tp_name) +
                       " into a tensor (expected a tensor, a number or a list)");
}

Operand::Operand(py::handle other, const Tensor& like, Op op)
    : tensor_(TensorFromPython(other.ptr())) {
  if (tensor_ == nullptr) scalar_ = ScalarTensor(other, like, op);
}

Tensor TensorFromData(py::handle data, std::optional<DType> dtype) {
  if (const Tensor* tensor = TensorFromPython(data.ptr())) {
    return dtype ? tensor->To(*dtype).Clone() : tensor->Clone();
  }
  if (PyBytes_Check(data.ptr()) != 0 || PyByteArray_Check(data.ptr()) != 0) {
    // Raw bytes are data of `dtype` (uint8 by default), the way payloads arrive over the wire.
    DType target = dtype.value_or(DType::kUInt8);
    std::string_view bytes =
        PyBytes_Check(data.ptr()) != 0
            ? std::string_view(PyBytes_AS_STRING(data.ptr()),
                               static_cast<size_t>(PyBytes_GET_SIZE(data.ptr())))
            : std::string_view(PyByteArray_AS_STRING(data.ptr()),
                               static_cast<size_t>(PyByteArray_GET_SIZE(data.ptr())));
    const size_t item = engine::ItemSize(target);
    if (bytes.size() % item != 0) {
      throw py::value_error("orochi.tensor: " + std::to_string(bytes.size()) +
                            " bytes are not a whole number of " + std::string(DTypeName(target)) +
                            " elements (" + std::to_string(item) + " bytes each)");
    }
    Tensor result = Tensor::Empty({static_cast<int64_t>(bytes.size() / item)}, target);
    if (!bytes.empty()) std::memcpy(result.mutable_data(), bytes.data(), bytes.size());
    NormalizeBools(result);
    return result;
  }
  if (PyObject_CheckBuffer(data.ptr()) != 0) {
    Tensor copy = TensorFromBuffer(data, std::nullopt).Clone();
    NormalizeBools(copy);
    return dtype ? copy.To(*dtype) : copy;
  }
  NestedReader reader;
  reader.Walk(data, 0);
  DType target = dtype.value_or(reader.InferredDType());
  Tensor result = Tensor::Empty(reader.shape(), target);
  VisitDType(target, [&]<typename T>() {
    T* out = result.mutable_data_as<T>();
    for (const Leaf& leaf : reader.leaves()) *out++ = LeafAs<T>(leaf, target);
  });
  return result;
}

Tensor TensorFromBuffer(py::handle object, std::optional<DType> dtype) {
  BufferExport view;
  view.Acquire(object, PyBUF_RECORDS_RO);
  const char* format = view->format != nullptr ? view->format : "B";
  DType element = DTypeOfFormat(format);
  if (static_cast<size_t>(view->itemsize) != engine::ItemSize(element)) {
    throw py::type_error("buffer format '" + std::string(format) + "' has item size " +
                         std::to_string(view->itemsize) + ", expected " +
                         std::to_string(engine::ItemSize(element)));
  }
  if (view->ndim < 0 || static_cast<size_t>(view->ndim) > engine::kMaxDims) {
    throw py::value_error("a buffer with " + std::to_string(view->ndim) + " dimensions");
  }
  const auto ndim = static_cast<size_t>(view->ndim);
  Shape shape = view->shape != nullptr ? Shape(view->shape, view->shape + ndim)
                                       : Shape{static_cast<int64_t>(view->len / view->itemsize)};
  if (view->shape == nullptr && ndim == 0) shape.clear();
  Shape strides = engine::ContiguousStrides(shape);
  const auto item = static_cast<Py_ssize_t>(engine::ItemSize(element));
  int64_t extent = engine::NumElements(shape) > 0 ? 1 : 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (view->strides != nullptr) {
      Py_ssize_t stride = view->strides[d];
      if (stride < 0 || stride % item != 0) {
        throw py::value_error(
            "cannot share a buffer with negative or unaligned strides; copy it "
            "with orochi.tensor() instead");
      }
      strides[d] = stride / item;
    }
    if (shape[d] > 0) extent += (shape[d] - 1) * strides[d];
  }
  auto* data = static_cast<std::byte*>(view->buf);
  if (reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(item) != 0) {
    // Misaligned elements cannot be shared with the engine's kernels: copy them.
    Tensor copy = Tensor::Empty(shape, element);
    if (PyBuffer_ToContiguous(copy.mutable_data(), view.get(), view->len, 'C') != 0) {
      throw py::error_already_set();
    }
    NormalizeBools(copy);
    return dtype ? copy.To(*dtype) : copy;
  }
  const size_t bytes = static_cast<size_t>(extent) * static_cast<size_t>(item);
  const bool read_only = view->readonly != 0;
  engine::StoragePtr storage =
      engine::Storage::Borrow(data, bytes, read_only, ReleaseBuffer, view.get());
  view.HandOver();
  Tensor tensor(std::move(storage), std::move(shape), std::move(strides), 0, element);
  if (dtype && *dtype != element) return tensor.To(*dtype);
  return tensor;
}

Tensor TensorFromRawBuffer(py::handle buffer, py::handle dtype, int64_t count, int64_t offset) {
  const DType element = ParseDType(dtype);
  BufferExport view;
  view.Acquire(buffer, PyBUF_SIMPLE);
  const auto item = static_cast<int64_t>(engine::ItemSize(element));
  const int64_t available = static_cast<int64_t>(view->len) - offset;
  if (offset < 0 || available < 0 || (count < 0 && available % item != 0) ||
      (count >= 0 && count > available / item)) {
    throw py::value_error(
        "frombuffer: a buffer of " + std::to_string(view->len) + " bytes does not hold " +
        (count < 0 ? std::string("a whole number of") : std::to_string(count)) + " " +
        std::string(DTypeName(element)) + " elements after offset " + std::to_string(offset));
  }
  auto* data = static_cast<std::byte*>(view->buf) + offset;
  if (reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(item) != 0) {
    throw py::value_error("frombuffer: the data at offset " + std::to_string(offset) +
                          " is not aligned for " + std::string(DTypeName(element)) + " (" +
                          std::to_string(item) + "-byte items)");
  }
  const int64_t elements = count < 0 ? available / item : count;
  const bool read_only = view->readonly != 0;
  engine::StoragePtr storage = engine::Storage::Borrow(data, static_cast<size_t>(elements * item),
                                                       read_only, ReleaseBuffer, view.get());
  view.HandOver();
  return {std::move(storage), {elements}, {1}, 0, element};
}

py::object ItemToPython(const Tensor& tensor, int64_t flat_index) {
  const auto* base = static_cast<const std::byte*>(tensor.data());
  // flat_index counts elements of a contiguous tensor; strided callers pass element offsets.
  return VisitDType(tensor.dtype(), [&]<typename T>() -> py::object {
    T value{};
    std::memcpy(&value, base + flat_index * static_cast<int64_t>(sizeof(T)), sizeof(T));
    if constexpr (std::is_same_v<T, bool>) {
      return py::bool_(value);
    } else if constexpr (std::is_integral_v<T>) {
      return py::int_(static_cast<int64_t>(value));
    } else {
      return py::float_(engine::Convert<double>(value));
    }
  });
}

namespace {
py::object ListLevel(const Tensor& tensor, int64_t dim, int64_t offset) {
  if (dim == tensor.dim()) return ItemToPython(tensor, offset);
  int64_t size = tensor.shape()[dim];
  py::list list(size);
  for (int64_t i = 0; i < size; ++i) {
    list[static_cast<size_t>(i)] = ListLevel(tensor, dim + 1, offset + i * tensor.strides()[dim]);
  }
  return list;
}
}  // namespace

py::object TensorToList(const Tensor& tensor) { return ListLevel(OnHost(tensor), 0, 0); }

}  // namespace orochi::copy::bindings
