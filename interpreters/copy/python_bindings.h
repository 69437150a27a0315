// Private to the interpreter library: the pieces of the `_orochi_engine` module (see
// python_engine.h), split by subject.
//
// All functions need this copy's GIL. Engine errors propagate as orochi::engine::Error and are
// turned into Python exceptions by the translator registered in InitEngineModule.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string_view>
#include <vector>

#include "orochi/engine/ops.h"
#include "orochi/engine/tensor.h"

namespace orochi::copy::bindings {

namespace py = pybind11;
using engine::Device;
using engine::DType;
using engine::Op;
using engine::Shape;
using engine::Tensor;

// --- values: python_values.cpp ------------------------------------------------------------------
void BindValueTypes(py::module_& module);  // orochi.dtype, orochi.device, dtype constants

// The module's dtype object for `dtype` (one object per dtype, so `t.dtype is orochi.float32`).
py::object DTypeObject(DType dtype);
// An orochi.dtype or a name ("float32", "float", "long", ...); TypeError otherwise.
DType ParseDType(py::handle object);
std::optional<DType> ParseOptionalDType(py::handle object);  // None -> nullopt
py::object DeviceObject(Device device);
// `tensor` itself on the CPU, else a copy of it there (waiting for the device's work): for
// reading values on the host (item(), tolist(), bool(), index checks), as PyTorch does.
inline Tensor OnHost(const Tensor& tensor) { return tensor.To(Device{}); }
// An orochi.device, "cpu", "cuda", "cuda:N" or an int (CUDA index). Any device that this
// build cannot use is refused with a message naming it.
Device ParseDevice(py::handle object);
bool IsDeviceLike(py::handle object);

// Sizes given as separate ints or as one sequence: reshape(2, 3) and reshape((2, 3)).
Shape ParseSizes(const py::args& sizes, const char* function);
Shape ParseShape(py::handle sequence, const char* function);
// dim=None -> all dims (empty), an int, or a sequence of ints.
std::vector<int64_t> ParseDims(py::handle dims);

// A Python number as a 0-dim operand of `op` with `like` that takes part in promotion the way
// PyTorch's "wrapped numbers" do: it never widens a tensor of its own category, and an int
// converted to an integer dtype wraps as it does there.
Tensor ScalarTensor(py::handle number, const Tensor& like, Op op = Op::add);
// A numpy scalar (numpy.float32(2), numpy.int64(1), numpy.bool_): an operand or value like the
// Python number its item() gives.
bool IsNumpyScalar(py::handle object);
// The value of a Python int (not a bool); nullopt for anything else. RuntimeError past 64 bits
// (as PyTorch's "Overflow when unpacking long").
std::optional<int64_t> PythonInt(py::handle object);
// Raise RuntimeError, as PyTorch's checked conversion does, when a number stored into a tensor
// of `dtype` would not fit: an int or float outside an integer dtype's range (NaN included), or
// a finite number past a narrow float dtype's largest value (creation, fills, writes, where()
// and clamp bounds check; arithmetic operands wrap or round to inf). An unsigned dtype also
// takes negatives down to -max, which wrap, as in PyTorch (uint8 -1 is 255).
void RequireFits(int64_t value, DType dtype);
void RequireFits(double value, DType dtype);
// RequireFits for a Python number that will take `dtype` (an int with an integer dtype, a float
// with a floating one), as where(cond, int8_tensor, 300) checks in PyTorch; nothing otherwise.
void RequireFitsWhereKept(py::handle number, DType dtype);
// A value to store into a tensor of `dtype`: numbers are converted straight to `dtype` (no
// detour through float32) and must fit it, tensors and lists as they are.
Tensor ValueForWrite(py::handle value, DType dtype);
// `other` as an operand of `op` with `like`: a tensor as it is, a number as above.
// Raises TypeError for anything else.
class Operand {
 public:
  Operand(py::handle other, const Tensor& like, Op op = Op::add);
  const Tensor& get() const { return tensor_ != nullptr ? *tensor_ : scalar_; }

 private:
  const Tensor* tensor_ = nullptr;
  Tensor scalar_;
};

// orochi.tensor(data): nested sequences of numbers/bools/0-dim tensors, bytes, or any buffer;
// always copies.
Tensor TensorFromData(py::handle data, std::optional<DType> dtype);
// A tensor viewing the memory of a buffer-protocol object without copying (frombuffer,
// as_tensor); the tensor keeps the exporter alive.
Tensor TensorFromBuffer(py::handle object, std::optional<DType> dtype);
// torch.frombuffer: the raw bytes of `buffer` from `offset` as `count` elements of `dtype`
// (all that fit when count is -1), shared, not copied.
Tensor TensorFromRawBuffer(py::handle buffer, py::handle dtype, int64_t count, int64_t offset);
// The buffer-protocol format letter of `dtype`, or null for bfloat16 (which has none).
const char* BufferFormat(DType dtype);
py::object TensorToList(const Tensor& tensor);
py::object ItemToPython(const Tensor& tensor, int64_t flat_index);

// Makes `type(...)` and `type.__new__(type)` raise TypeError(message): for types whose instances
// only the bindings create.
void RefuseConstruction(py::handle type, const char* message);

// --- the Tensor type: python_tensor.cpp ---------------------------------------------------------
void BindTensor(py::module_& module);
// Python indexing: ints, slices, None, Ellipsis, bool and integer tensors (or lists of ints).
Tensor GetItem(const Tensor& tensor, py::handle index);
void SetItem(Tensor& tensor, py::handle index, py::handle value);

// --- module-level functions: python_functions.cpp ------------------------------------------------
void BindFunctions(py::module_& module);

}  // namespace orochi::copy::bindings
