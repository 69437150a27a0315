// orochi.Tensor: the engine's Tensor as a Python type, with PyTorch's method names, operators,
// indexing and the buffer protocol. Module-level twins of methods (orochi.exp(t), ...) are
// bound here too, from the same functions.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "orochi/engine/error.h"
#include "orochi/engine/ops.h"
#include "python_bindings.h"
#include "python_engine.h"

namespace orochi::copy::bindings {
namespace {

// Above this many multiply-adds an op runs with the GIL released, so other Python threads of
// the copy run meanwhile; below it the release costs more than it gives.
constexpr int64_t kReleaseGilWork = int64_t{1} << 16;

template <typename Fn>
Tensor MaybeWithoutGil(int64_t work, Fn&& fn) {
  if (work < kReleaseGilWork) return fn();
  py::gil_scoped_release release;
  return fn();
}

int64_t MatmulWork(const Tensor& a, const Tensor& b) {
  return a.numel() * (b.dim() > 0 ? b.shape().back() : 1);
}

PyTypeObject* g_tensor_type = nullptr;

// Binds `fn` as Tensor.name and as orochi.name (whose first argument is called `input`).
template <typename Fn, typename... Extra>
void DefBoth(py::class_<Tensor>& cls, py::module_& module, const char* name, Fn&& fn,
             const Extra&... extra) {
  cls.def(name, fn, extra...);
  module.def(name, std::forward<Fn>(fn), py::arg("input"), extra...);
}

// --- the buffer protocol ----------------------------------------------------------------------

struct ExportedBuffer {
  Tensor tensor;
  std::vector<Py_ssize_t> shape;
  std::vector<Py_ssize_t> strides;
};

int ExportBuffer(PyObject* object, Py_buffer* view, int flags) {
  view->obj = nullptr;
  const Tensor* tensor = TensorFromPython(object);
  if (tensor == nullptr) {
    PyErr_SetString(PyExc_BufferError, "not an orochi.Tensor");
    return -1;
  }
  if (tensor->device().type != engine::DeviceType::kCpu) {
    PyErr_Format(PyExc_BufferError,
                 "a tensor on %s has no buffer in host memory; call .cpu() first",
                 engine::DeviceName(tensor->device()).c_str());
    return -1;
  }
  const char* format = BufferFormat(tensor->dtype());
  if (format == nullptr) {
    PyErr_SetString(PyExc_BufferError,
                    "bfloat16 tensors have no buffer format; convert with .to(orochi.float32)");
    return -1;
  }
  if ((flags & PyBUF_WRITABLE) == PyBUF_WRITABLE && tensor->read_only()) {
    PyErr_SetString(PyExc_BufferError,
                    "a writable buffer was requested from a read-only tensor (shared weights)");
    return -1;
  }
  bool contiguous = tensor->is_contiguous();
  bool wants_strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES;
  bool wants_contiguous = (flags & PyBUF_ANY_CONTIGUOUS) == PyBUF_ANY_CONTIGUOUS ||
                          (flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS ||
                          (flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS;
  if (!contiguous && (!wants_strides || wants_contiguous)) {
    PyErr_SetString(PyExc_BufferError,
                    "the consumer needs a contiguous buffer and this tensor is a strided view; "
                    "call .contiguous() first");
    return -1;
  }
  if ((flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS && tensor->dim() > 1) {
    PyErr_SetString(PyExc_BufferError, "tensors are row-major; Fortran order is not available");
    return -1;
  }
  auto* exported = new ExportedBuffer{*tensor, {}, {}};
  auto item = static_cast<Py_ssize_t>(engine::ItemSize(tensor->dtype()));
  for (int64_t d = 0; d < tensor->dim(); ++d) {
    exported->shape.push_back(static_cast<Py_ssize_t>(tensor->shape()[d]));
    exported->strides.push_back(static_cast<Py_ssize_t>(tensor->strides()[d]) * item);
  }
  view->buf = const_cast<void*>(tensor->data());
  view->obj = Py_NewRef(object);
  view->len = static_cast<Py_ssize_t>(tensor->numel()) * item;
  view->itemsize = item;
  view->readonly = tensor->read_only() ? 1 : 0;
  view->format = (flags & PyBUF_FORMAT) == PyBUF_FORMAT ? const_cast<char*>(format) : nullptr;
  // Without PyBUF_ND the consumer reads plain bytes: one dimension, as CPython's own exporters
  // report it.
  view->ndim = (flags & PyBUF_ND) == PyBUF_ND ? static_cast<int>(tensor->dim()) : 1;
  view->shape = (flags & PyBUF_ND) == PyBUF_ND ? exported->shape.data() : nullptr;
  view->strides = wants_strides ? exported->strides.data() : nullptr;
  view->suboffsets = nullptr;
  view->internal = exported;
  return 0;
}

// A C callback: nothing may propagate out of it.
int GetBuffer(PyObject* object, Py_buffer* view, int flags) {
  try {
    return ExportBuffer(object, view, flags);
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_BufferError, error.what());
  }
  return -1;
}

void ReleaseBuffer(PyObject* /*object*/, Py_buffer* view) {
  delete static_cast<ExportedBuffer*>(view->internal);
}

// --- arguments --------------------------------------------------------------------------------

// A clamp bound: a tensor, or a number that must fit `like`'s integer dtype, as in PyTorch.
std::optional<Tensor> ClampBound(py::handle object, const Tensor& like) {
  if (object.is_none()) return std::nullopt;
  if (std::optional<int64_t> integer = PythonInt(object)) RequireFits(*integer, like.dtype());
  return Operand(object, like).get();
}

std::vector<int64_t> IntList(const py::args& args, const char* function) {
  return ParseSizes(args, function);
}

// t.to(dtype), t.to(device), t.to(device, dtype), t.to(other), with dtype=/device= keywords.
Tensor ToAnything(const Tensor& self, const py::args& args, const py::kwargs& kwargs) {
  std::optional<DType> dtype;
  std::optional<Device> device;
  for (py::handle arg : args) {
    if (const Tensor* other = TensorFromPython(arg.ptr())) {
      dtype = other->dtype();
      device = other->device();
    } else if (IsDeviceLike(arg) || PyLong_Check(arg.ptr()) != 0) {
      device = ParseDevice(arg);
    } else {
      dtype = ParseDType(arg);
    }
  }
  if (kwargs.contains("dtype")) dtype = ParseOptionalDType(kwargs["dtype"]);
  if (kwargs.contains("device") && !kwargs["device"].is_none()) {
    device = ParseDevice(kwargs["device"]);
  }
  bool copy = kwargs.contains("copy") && kwargs["copy"].cast<bool>();
  Tensor result = device ? self.To(*device) : self;
  if (dtype) result = result.To(*dtype);
  return copy && result.storage().get() == self.storage().get() ? result.Clone() : result;
}

py::object ReduceWithIndices(Op values_op, Op index_op, const Tensor& self, py::handle dim,
                             bool keepdim) {
  // max(dim) / min(dim): a (values, indices) pair like torch.return_types.max.
  auto d = dim.cast<int64_t>();
  Tensor values = engine::Reduce(values_op, self, {d}, keepdim);
  Tensor indices = engine::ArgReduce(index_op, self, d, keepdim);
  py::object pair = py::module_::import("orochi").attr("_values_indices");
  return pair(py::cast(std::move(values)), py::cast(std::move(indices)));
}

py::object SortPair(const engine::SortResult& result) {
  py::object pair = py::module_::import("orochi").attr("_values_indices");
  return pair(py::cast(result.values), py::cast(result.indices));
}

// Several elements of `tensor` at one address (an expanded view): writing it is ambiguous.
bool HasSelfOverlap(const Tensor& tensor) {
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    if (tensor.strides()[d] == 0 && tensor.shape()[d] > 1) return true;
  }
  return false;
}

// Stores an op's result into `self`, with PyTorch's rules for in-place ops: the result's kind
// (bool < integer < floating) may not be higher than self's, and self may not overlap itself.
Tensor& InPlace(Tensor& self, const Tensor& result) {
  OROCHI_CHECK_ARG(engine::Category(result.dtype()) <= engine::Category(self.dtype()),
                   "result type " << engine::DTypeName(result.dtype())
                                  << " can't be cast to the in-place output type "
                                  << engine::DTypeName(self.dtype()));
  OROCHI_CHECK_ARG(!HasSelfOverlap(self),
                   "in-place write into an expanded tensor: several of its elements share one "
                   "memory location; clone() it first");
  self.CopyFrom(result);
  return self;
}

struct UnaryEntry {
  const char* name;
  Op op;
};
constexpr UnaryEntry kUnaryOps[] = {
    {"neg", Op::neg}, {"negative", Op::neg}, {"abs", Op::abs},         {"exp", Op::exp},
    {"log", Op::log}, {"sqrt", Op::sqrt},    {"rsqrt", Op::rsqrt},     {"sin", Op::sin},
    {"cos", Op::cos}, {"tanh", Op::tanh},    {"sigmoid", Op::sigmoid}, {"relu", Op::relu},
    {"erf", Op::erf}, {"floor", Op::floor},  {"ceil", Op::ceil},       {"round", Op::round},
};

struct BinaryEntry {
  const char* name;     // method and function: t.add(o), orochi.add(t, o)
  const char* forward;  // operator: __add__
  const char* reverse;  // reflected operator: __radd__ (or null)
  const char* inplace;  // __iadd__ (or null)
  Op op;
};
constexpr BinaryEntry kBinaryOps[] = {
    {"add", "__add__", "__radd__", "__iadd__", Op::add},
    {"sub", "__sub__", "__rsub__", "__isub__", Op::sub},
    {"mul", "__mul__", "__rmul__", "__imul__", Op::mul},
    {"div", "__truediv__", "__rtruediv__", "__itruediv__", Op::div},
    {"pow", "__pow__", "__rpow__", "__ipow__", Op::pow},
    {"floor_divide", "__floordiv__", "__rfloordiv__", "__ifloordiv__", Op::floor_divide},
    {"remainder", "__mod__", "__rmod__", "__imod__", Op::remainder},
    {"maximum", nullptr, nullptr, nullptr, Op::maximum},
    {"minimum", nullptr, nullptr, nullptr, Op::minimum},
    {"eq", "__eq__", nullptr, nullptr, Op::eq},
    {"ne", "__ne__", nullptr, nullptr, Op::ne},
    {"lt", "__lt__", nullptr, nullptr, Op::lt},
    {"le", "__le__", nullptr, nullptr, Op::le},
    {"gt", "__gt__", nullptr, nullptr, Op::gt},
    {"ge", "__ge__", nullptr, nullptr, Op::ge},
    {"logical_and", "__and__", "__rand__", "__iand__", Op::logical_and},
    {"logical_or", "__or__", "__ror__", "__ior__", Op::logical_or},
    {"logical_xor", "__xor__", "__rxor__", "__ixor__", Op::logical_xor},
};

// &, | and ^ are bitwise in PyTorch; the engine has logical ops only, which agree on bools.
void RequireBoolForBitwise(Op op, const Tensor& self, py::handle other) {
  if (op != Op::logical_and && op != Op::logical_or && op != Op::logical_xor) return;
  const Tensor* other_tensor = TensorFromPython(other.ptr());
  bool other_bool = other_tensor != nullptr ? other_tensor->dtype() == DType::kBool
                                            : PyBool_Check(other.ptr()) != 0;
  if (self.dtype() != DType::kBool || !other_bool) {
    throw py::type_error(
        "&, | and ^ are supported on bool tensors only (bitwise operations on "
        "integers are not implemented); use logical_and/or/xor for truth values");
  }
}

bool IsOperand(py::handle other) {
  PyObject* raw = other.ptr();
  return TensorFromPython(raw) != nullptr || PyFloat_Check(raw) != 0 || PyLong_Check(raw) != 0 ||
         IsNumpyScalar(other);
}

// `self op other`, or `other op self` when reflected, with `other` a tensor or a number, and
// PyTorch's refusals: an integer tensor to a negative int power (a tensor of exponents gives 0
// instead, see IntegerPower), and integer floor division or remainder by zero (ZeroDivisionError's
// text as a RuntimeError).
Tensor ApplyBinary(Op op, const Tensor& self, py::handle other, bool reflected = false) {
  if (op == Op::pow && !reflected && !engine::IsFloating(self.dtype())) {
    std::optional<int64_t> exponent = PythonInt(other);
    OROCHI_CHECK_ARG(!exponent || *exponent >= 0,
                     "Integers to negative integer powers are not allowed.");
  }
  Operand operand(other, self, op);
  const Tensor& a = reflected ? operand.get() : self;
  const Tensor& b = reflected ? self : operand.get();
  const bool divides_by_zero = (op == Op::floor_divide || op == Op::remainder) &&
                               !engine::IsFloating(engine::ResultType(a, b)) &&
                               engine::Any(engine::Binary(Op::eq, b, engine::Scalar(0, b.dtype())))
                                       .To(Device{})
                                       .ItemAsDouble() != 0;
  OROCHI_CHECK_ARG(!divides_by_zero,
                   (op == Op::remainder ? "ZeroDivisionError: integer modulo by zero"
                                        : "ZeroDivisionError: integer floor division by zero"));
  return engine::Binary(op, a, b);
}

void BindOperators(py::class_<Tensor>& cls, py::module_& module) {
  for (const UnaryEntry& entry : kUnaryOps) {
    Op op = entry.op;
    DefBoth(cls, module, entry.name, [op](const Tensor& self) { return engine::Unary(op, self); });
    std::string inplace = std::string(entry.name) + "_";
    cls.def(inplace.c_str(),
            [op](Tensor& self) -> Tensor& { return InPlace(self, engine::Unary(op, self)); });
  }
  cls.def("__neg__", [](const Tensor& self) { return engine::Unary(Op::neg, self); });
  cls.def("__abs__", [](const Tensor& self) { return engine::Unary(Op::abs, self); });
  cls.def("__pos__", [](const Tensor& self) { return self; });
  cls.def("__invert__", [](const Tensor& self) {
    if (self.dtype() != DType::kBool) {
      throw py::type_error("~ is only defined for bool tensors here, not " +
                           std::string(engine::DTypeName(self.dtype())));
    }
    return engine::LogicalNot(self);
  });
  DefBoth(cls, module, "logical_not", [](const Tensor& self) { return engine::LogicalNot(self); });

  for (const BinaryEntry& entry : kBinaryOps) {
    Op op = entry.op;
    DefBoth(
        cls, module, entry.name,
        [op](const Tensor& self, py::handle other) { return ApplyBinary(op, self, other); },
        py::arg("other"));
    std::string inplace_method = std::string(entry.name) + "_";
    cls.def(inplace_method.c_str(), [op](Tensor& self, py::handle other) -> Tensor& {
      return InPlace(self, ApplyBinary(op, self, other));
    });
    if (entry.forward != nullptr) {
      cls.def(entry.forward, [op](const Tensor& self, py::handle other) -> py::object {
        if (!IsOperand(other)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
        RequireBoolForBitwise(op, self, other);
        return py::cast(ApplyBinary(op, self, other));
      });
    }
    if (entry.reverse != nullptr) {
      cls.def(entry.reverse, [op](const Tensor& self, py::handle other) -> py::object {
        if (!IsOperand(other)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
        RequireBoolForBitwise(op, self, other);
        return py::cast(ApplyBinary(op, self, other, /*reflected=*/true));
      });
    }
    if (entry.inplace != nullptr) {
      cls.def(entry.inplace, [op](py::object self_object, py::handle other) -> py::object {
        if (!IsOperand(other)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
        auto& self = self_object.cast<Tensor&>();
        RequireBoolForBitwise(op, self, other);
        InPlace(self, ApplyBinary(op, self, other));
        return self_object;
      });
    }
  }
  // orochi.pow(2, t): a number raised to a tensor of exponents.
  module.def(
      "pow",
      [](py::handle base, const Tensor& exponent) {
        if (!IsOperand(base)) {
          throw py::type_error("pow: the base must be a tensor or a number, not " +
                               std::string(Py_TYPE(base.ptr())->tp_name));
        }
        return ApplyBinary(Op::pow, exponent, base, /*reflected=*/true);
      },
      py::arg("self"), py::arg("exponent"));
  // Aliases with PyTorch's other spellings.
  DefBoth(
      cls, module, "true_divide",
      [](const Tensor& self, py::handle other) { return ApplyBinary(Op::div, self, other); },
      py::arg("other"));
  cls.def("__matmul__", [](const Tensor& self, const Tensor& other) {
    return MaybeWithoutGil(MatmulWork(self, other), [&] { return engine::Matmul(self, other); });
  });
  cls.def("__rmatmul__", [](const Tensor& self, const Tensor& other) {
    return MaybeWithoutGil(MatmulWork(other, self), [&] { return engine::Matmul(other, self); });
  });
  DefBoth(
      cls, module, "matmul",
      [](const Tensor& self, const Tensor& other) {
        return MaybeWithoutGil(MatmulWork(self, other),
                               [&] { return engine::Matmul(self, other); });
      },
      py::arg("other"));
  DefBoth(
      cls, module, "bmm",
      [](const Tensor& self, const Tensor& other) {
        return MaybeWithoutGil(MatmulWork(self, other), [&] { return engine::Bmm(self, other); });
      },
      py::arg("mat2"));
  cls.def("__hash__", [](py::handle self) { return reinterpret_cast<intptr_t>(self.ptr()); });
}

void BindReductions(py::class_<Tensor>& cls, py::module_& module) {
  auto reduce = [](Op op) {
    return [op](const Tensor& self, py::handle dim, bool keepdim, py::handle dtype) {
      std::optional<DType> as = ParseOptionalDType(dtype);
      Tensor result = engine::Reduce(op, as ? self.To(*as) : self, ParseDims(dim), keepdim);
      // The engine sums integers into int64; dtype= asks for that dtype itself (wrapping).
      return as ? result.To(*as) : result;
    };
  };
  for (auto [name, op] :
       {std::pair{"sum", Op::sum}, std::pair{"mean", Op::mean}, std::pair{"prod", Op::prod}}) {
    DefBoth(cls, module, name, reduce(op), py::arg("dim") = py::none(), py::arg("keepdim") = false,
            py::kw_only(), py::arg("dtype") = py::none());
  }
  for (auto [name, op] : {std::pair{"amax", Op::amax}, std::pair{"amin", Op::amin}}) {
    DefBoth(
        cls, module, name,
        [op = op](const Tensor& self, py::handle dim, bool keepdim) {
          return engine::Reduce(op, self, ParseDims(dim), keepdim);
        },
        py::arg("dim") = py::none(), py::arg("keepdim") = false);
  }
  for (auto [name, values, indices, pairwise] :
       {std::tuple{"max", Op::amax, Op::argmax, Op::maximum},
        std::tuple{"min", Op::amin, Op::argmin, Op::minimum}}) {
    DefBoth(
        cls, module, name,
        [values = values, indices = indices, pairwise = pairwise](
            const Tensor& self, py::handle dim, bool keepdim) -> py::object {
          if (dim.is_none()) return py::cast(engine::Reduce(values, self));
          if (const Tensor* other = TensorFromPython(dim.ptr())) {
            return py::cast(engine::Binary(pairwise, self, *other));
          }
          return ReduceWithIndices(values, indices, self, dim, keepdim);
        },
        py::arg("dim") = py::none(), py::arg("keepdim") = false);
  }
  for (auto [name, op] : {std::pair{"argmax", Op::argmax}, std::pair{"argmin", Op::argmin}}) {
    DefBoth(
        cls, module, name,
        [op = op](const Tensor& self, std::optional<int64_t> dim, bool keepdim) {
          return engine::ArgReduce(op, self, dim, keepdim);
        },
        py::arg("dim") = py::none(), py::arg("keepdim") = false);
  }
  auto spread = [](bool standard_deviation) {
    return [standard_deviation](const Tensor& self, py::handle dim, py::handle unbiased,
                                bool keepdim, py::handle correction) {
      double bessel = 1;
      if (!correction.is_none()) bessel = correction.cast<double>();
      if (!unbiased.is_none()) bessel = unbiased.cast<bool>() ? 1 : 0;
      std::vector<int64_t> dims = ParseDims(dim);
      return standard_deviation ? engine::Std(self, dims, bessel, keepdim)
                                : engine::Var(self, dims, bessel, keepdim);
    };
  };
  for (auto [name, is_std] : {std::pair{"var", false}, std::pair{"std", true}}) {
    DefBoth(cls, module, name, spread(is_std), py::arg("dim") = py::none(),
            py::arg("unbiased") = py::none(), py::arg("keepdim") = false, py::kw_only(),
            py::arg("correction") = py::none());
  }
  DefBoth(
      cls, module, "any",
      [](const Tensor& self, py::handle dim, bool keepdim) {
        return engine::Any(self, ParseDims(dim), keepdim);
      },
      py::arg("dim") = py::none(), py::arg("keepdim") = false);
  DefBoth(
      cls, module, "all",
      [](const Tensor& self, py::handle dim, bool keepdim) {
        return engine::All(self, ParseDims(dim), keepdim);
      },
      py::arg("dim") = py::none(), py::arg("keepdim") = false);
  for (auto [name, log] : {std::pair{"softmax", false}, std::pair{"log_softmax", true}}) {
    DefBoth(
        cls, module, name,
        [log = log](const Tensor& self, int64_t dim, py::handle dtype) {
          std::optional<DType> as = ParseOptionalDType(dtype);
          const Tensor input = as ? self.To(*as) : self;
          return log ? engine::LogSoftmax(input, dim) : engine::Softmax(input, dim);
        },
        py::arg("dim"), py::arg("dtype") = py::none());
  }
  DefBoth(
      cls, module, "cumsum",
      [](const Tensor& self, int64_t dim, py::handle dtype) {
        std::optional<DType> as = ParseOptionalDType(dtype);
        return engine::Cumsum(as ? self.To(*as) : self, dim);
      },
      py::arg("dim"), py::kw_only(), py::arg("dtype") = py::none());
}

void BindSelection(py::class_<Tensor>& cls, py::module_& module) {
  cls.def("where", [](const Tensor& self, const Tensor& condition, py::handle other) {
    RequireFitsWhereKept(other, self.dtype());
    Operand operand(other, self);
    return engine::Where(condition, self, operand.get());
  });
  DefBoth(
      cls, module, "masked_fill",
      [](const Tensor& self, const Tensor& mask, py::handle value) {
        return engine::MaskedFill(self, mask, ValueForWrite(value, self.dtype()));
      },
      py::arg("mask"), py::arg("value"));
  cls.def("masked_fill_", [](Tensor& self, const Tensor& mask, py::handle value) -> Tensor& {
    return InPlace(self, engine::MaskedFill(self, mask, ValueForWrite(value, self.dtype())));
  });
  auto clamp = [](const Tensor& self, py::handle min, py::handle max) {
    OROCHI_CHECK_ARG(!min.is_none() || !max.is_none(),
                     "clamp: at least one of min and max must be given");
    return engine::Clamp(self, ClampBound(min, self), ClampBound(max, self));
  };
  DefBoth(cls, module, "clamp", clamp, py::arg("min") = py::none(), py::arg("max") = py::none());
  DefBoth(cls, module, "clip", clamp, py::arg("min") = py::none(), py::arg("max") = py::none());
  cls.def(
      "clamp_",
      [clamp](Tensor& self, py::handle min, py::handle max) -> Tensor& {
        return InPlace(self, clamp(self, min, max));
      },
      py::arg("min") = py::none(), py::arg("max") = py::none());
  DefBoth(
      cls, module, "sort",
      // The engine's sorts are stable on every device, so stable=True asks for nothing more.
      [](const Tensor& self, int64_t dim, bool descending, bool /*stable*/) {
        return SortPair(engine::Sort(self, dim, descending));
      },
      py::arg("dim") = -1, py::arg("descending") = false, py::kw_only(), py::arg("stable") = false);
  DefBoth(
      cls, module, "topk",
      [](const Tensor& self, int64_t k, int64_t dim, bool largest, bool /*sorted*/) {
        return SortPair(engine::TopK(self, k, dim, largest));
      },
      py::arg("k"), py::arg("dim") = -1, py::arg("largest") = true, py::arg("sorted") = true);
  DefBoth(
      cls, module, "argsort",
      [](const Tensor& self, int64_t dim, bool descending, bool /*stable*/) {
        return engine::Sort(self, dim, descending).indices;
      },
      py::arg("dim") = -1, py::arg("descending") = false, py::kw_only(), py::arg("stable") = false);
  DefBoth(
      cls, module, "gather",
      [](const Tensor& self, int64_t dim, const Tensor& index) {
        return engine::Gather(self, dim, index);
      },
      py::arg("dim"), py::arg("index"));
  DefBoth(
      cls, module, "index_select",
      [](const Tensor& self, int64_t dim, const Tensor& index) {
        return engine::IndexSelect(self, dim, index);
      },
      py::arg("dim"), py::arg("index"));
  DefBoth(
      cls, module, "masked_select",
      [](const Tensor& self, const Tensor& mask) { return engine::MaskedSelect(self, mask); },
      py::arg("mask"));
  DefBoth(
      cls, module, "split",
      [](const Tensor& self, py::handle split_size, int64_t dim) {
        if (PyLong_Check(split_size.ptr()) != 0) {
          return py::tuple(py::cast(engine::Split(self, split_size.cast<int64_t>(), dim)));
        }
        if (PyList_Check(split_size.ptr()) == 0 && PyTuple_Check(split_size.ptr()) == 0) {
          throw py::type_error("split: expected an int or a list of ints, got " +
                               std::string(Py_TYPE(split_size.ptr())->tp_name));
        }
        std::vector<int64_t> sizes;
        for (py::handle size : py::reinterpret_borrow<py::sequence>(split_size)) {
          sizes.push_back(size.cast<int64_t>());
        }
        return py::tuple(py::cast(engine::SplitWithSizes(self, sizes, dim)));
      },
      py::arg("split_size_or_sections"), py::arg("dim") = 0);
  DefBoth(
      cls, module, "chunk",
      [](const Tensor& self, int64_t chunks, int64_t dim) {
        return py::tuple(py::cast(engine::Chunk(self, chunks, dim)));
      },
      py::arg("chunks"), py::arg("dim") = 0);
}

// The shape as an orochi.Size (a tuple subclass defined by the orochi package).
py::object SizeObject(const Tensor& self) {
  py::tuple shape(self.dim());
  for (int64_t d = 0; d < self.dim(); ++d) shape[d] = py::int_(self.shape()[d]);
  return py::module_::import("orochi").attr("Size")(shape);
}

void BindShapeMethods(py::class_<Tensor>& cls, py::module_& module) {
  DefBoth(cls, module, "flip", [](const Tensor& self, const py::args& dims) {
    return engine::Flip(self, IntList(dims, "flip"));
  });
  cls.def_property_readonly("shape", &SizeObject)
      .def_property_readonly("ndim", &Tensor::dim)
      .def("dim", &Tensor::dim)
      .def("ndimension", &Tensor::dim)
      .def(
          "size",
          [](const Tensor& self, py::handle dim) -> py::object {
            if (dim.is_none()) return SizeObject(self);
            return py::int_(self.size(dim.cast<int64_t>()));
          },
          py::arg("dim") = py::none())
      .def(
          "stride",
          [](const Tensor& self, py::handle dim) -> py::object {
            if (dim.is_none()) return py::tuple(py::cast(std::vector<int64_t>(self.strides())));
            return py::int_(self.strides()[engine::WrapDim(dim.cast<int64_t>(), self.dim())]);
          },
          py::arg("dim") = py::none())
      .def("numel", &Tensor::numel)
      .def("nelement", &Tensor::numel)
      .def("element_size", [](const Tensor& self) { return engine::ItemSize(self.dtype()); })
      .def("storage_offset", &Tensor::storage_offset)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("data_ptr", [](const Tensor& self) { return reinterpret_cast<uintptr_t>(self.data()); })
      .def("__len__",
           [](const Tensor& self) {
             if (self.dim() == 0) throw py::type_error("len() of a 0-d tensor");
             return self.shape()[0];
           })
      .def("__iter__",
           [](const py::object& self_object) {
             const auto& self = self_object.cast<const Tensor&>();
             if (self.dim() == 0) throw py::type_error("iteration over a 0-d tensor");
             py::list rows(self.shape()[0]);
             for (int64_t i = 0; i < self.shape()[0]; ++i) {
               rows[static_cast<size_t>(i)] = TensorToPython(self.Select(0, i));
             }
             return py::iter(rows);
           })
      .def("view", [](const Tensor& self,
                      const py::args& sizes) { return self.View(IntList(sizes, "view")); })
      .def("view_as",
           [](const Tensor& self, const Tensor& other) { return self.View(other.shape()); })
      .def("reshape_as",
           [](const Tensor& self, const Tensor& other) { return self.Reshape(other.shape()); })
      .def("permute", [](const Tensor& self,
                         const py::args& dims) { return self.Permute(IntList(dims, "permute")); })
      .def("expand", [](const Tensor& self,
                        const py::args& sizes) { return self.Expand(IntList(sizes, "expand")); })
      .def("expand_as",
           [](const Tensor& self, const Tensor& other) { return self.Expand(other.shape()); })
      .def("repeat",
           [](const Tensor& self, const py::args& sizes) {
             return engine::Repeat(self, IntList(sizes, "repeat"));
           })
      .def("t",
           [](const Tensor& self) {
             OROCHI_CHECK_ARG(self.dim() <= 2,
                              "t() expects a tensor with <= 2 dims, got " << self.dim());
             return self.dim() < 2 ? self : self.Transpose(0, 1);
           })
      .def_property_readonly("T",
                             [](const Tensor& self) {
                               std::vector<int64_t> order;
                               for (int64_t d = self.dim() - 1; d >= 0; --d) order.push_back(d);
                               return self.Permute(order);
                             })
      .def_property_readonly("mT", [](const Tensor& self) { return self.Transpose(-2, -1); })
      .def("contiguous", &Tensor::Contiguous)
      .def("clone", &Tensor::Clone)
      .def("detach", [](const Tensor& self) { return self; })
      .def(
          "requires_grad_", [](py::object self, bool /*requires*/) { return self; },
          py::arg("requires_grad") = true)
      .def_property_readonly("requires_grad", [](const Tensor&) { return false; })
      .def_property_readonly("grad", [](const Tensor&) { return py::none(); })
      .def("__getitem__", [](const Tensor& self, py::handle index) { return GetItem(self, index); })
      .def("__setitem__",
           [](Tensor& self, py::handle index, py::handle value) { SetItem(self, index, value); });
  DefBoth(cls, module, "reshape", [](const Tensor& self, const py::args& sizes) {
    return self.Reshape(IntList(sizes, "reshape"));
  });
  DefBoth(
      cls, module, "transpose",
      [](const Tensor& self, int64_t dim0, int64_t dim1) { return self.Transpose(dim0, dim1); },
      py::arg("dim0"), py::arg("dim1"));
  DefBoth(
      cls, module, "swapaxes",
      [](const Tensor& self, int64_t dim0, int64_t dim1) { return self.Transpose(dim0, dim1); },
      py::arg("axis0"), py::arg("axis1"));
  DefBoth(
      cls, module, "flatten",
      [](const Tensor& self, int64_t start_dim, int64_t end_dim) {
        return self.Flatten(start_dim, end_dim);
      },
      py::arg("start_dim") = 0, py::arg("end_dim") = -1);
  DefBoth(
      cls, module, "unsqueeze", [](const Tensor& self, int64_t dim) { return self.Unsqueeze(dim); },
      py::arg("dim"));
  DefBoth(
      cls, module, "squeeze",
      [](const Tensor& self, std::optional<int64_t> dim) { return self.Squeeze(dim); },
      py::arg("dim") = py::none());
  DefBoth(
      cls, module, "narrow",
      [](const Tensor& self, int64_t dim, int64_t start, int64_t length) {
        return self.Narrow(dim, start, length);
      },
      py::arg("dim"), py::arg("start"), py::arg("length"));
  DefBoth(
      cls, module, "select",
      [](const Tensor& self, int64_t dim, int64_t index) { return self.Select(dim, index); },
      py::arg("dim"), py::arg("index"));
}

void BindConversions(py::class_<Tensor>& cls) {
  cls.def_property_readonly("dtype", [](const Tensor& self) { return DTypeObject(self.dtype()); })
      .def_property_readonly("device",
                             [](const Tensor& self) { return DeviceObject(self.device()); })
      .def_property_readonly(
          "is_cuda",
          [](const Tensor& self) { return self.device().type == engine::DeviceType::kCuda; })
      .def_property_readonly("is_read_only", &Tensor::read_only)
      .def("is_floating_point", [](const Tensor& self) { return engine::IsFloating(self.dtype()); })
      .def("to", &ToAnything)
      .def("type_as",
           [](const Tensor& self, const Tensor& other) { return self.To(other.dtype()); })
      .def("cpu", [](const Tensor& self) { return self.To(Device{}); })
      .def(
          "cuda",
          [](const Tensor& self, py::handle device) {
            return self.To(ParseDevice(device.is_none() ? py::str("cuda") : device));
          },
          py::arg("device") = py::none())
      .def("item",
           [](const Tensor& self) {
             if (self.numel() != 1) {
               throw py::value_error("a tensor with " + std::to_string(self.numel()) +
                                     " elements cannot be converted to a Python scalar");
             }
             return ItemToPython(OnHost(self), 0);
           })
      .def("tolist", [](const Tensor& self) { return TensorToList(self); })
      .def("__bool__",
           [](const Tensor& self) {
             OROCHI_CHECK_ARG(self.numel() == 1, "the truth value of a tensor with "
                                                     << self.numel()
                                                     << " elements is ambiguous; use .any() or "
                                                        ".all()");
             return OnHost(self).ItemAsDouble() != 0;
           })
      .def("__float__",
           [](const Tensor& self) {
             if (self.numel() != 1) {
               throw py::value_error("only one-element tensors convert to float");
             }
             return OnHost(self).ItemAsDouble();
           })
      .def("__int__",
           [](const Tensor& self) {
             if (self.numel() != 1) {
               throw py::value_error("only one-element tensors convert to int");
             }
             return py::int_(ItemToPython(OnHost(self), 0).attr("__int__")());
           })
      .def("__index__", [](const Tensor& self) {
        if (self.numel() != 1 || !engine::IsIntegral(self.dtype())) {
          throw py::type_error("only one-element integer tensors can be used as an index");
        }
        return ItemToPython(OnHost(self), 0);
      });
  for (auto [name, dtype] :
       {std::pair{"float", DType::kFloat32}, std::pair{"double", DType::kFloat64},
        std::pair{"half", DType::kFloat16}, std::pair{"bfloat16", DType::kBFloat16},
        std::pair{"long", DType::kInt64}, std::pair{"int", DType::kInt32},
        std::pair{"short", DType::kInt16}, std::pair{"char", DType::kInt8},
        std::pair{"byte", DType::kUInt8}, std::pair{"bool", DType::kBool}}) {
    DType target = dtype;
    cls.def(name, [target](const Tensor& self) { return self.To(target); });
  }
  cls.def("copy_",
          [](Tensor& self, const Tensor& source) -> Tensor& {
            self.CopyFrom(source);
            return self;
          })
      .def("fill_",
           [](Tensor& self, py::handle value) -> Tensor& {
             return InPlace(self, ValueForWrite(value, self.dtype()));
           })
      .def("zero_", [](Tensor& self) -> Tensor& {
        self.CopyFrom(engine::Scalar(0, self.dtype()));
        return self;
      });
}

}  // namespace

void BindTensor(py::module_& module) {
  py::class_<Tensor> cls(module, "Tensor", py::buffer_protocol(),
                         "An n-dimensional array of the shared engine. Views share storage.");
  g_tensor_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  // pybind11's own buffer export ignores the consumer's contiguity flags; this one honours them.
  auto* heap_type = reinterpret_cast<PyHeapTypeObject*>(cls.ptr());
  heap_type->as_buffer.bf_getbuffer = GetBuffer;
  heap_type->as_buffer.bf_releasebuffer = ReleaseBuffer;
  heap_type->ht_type.tp_as_buffer = &heap_type->as_buffer;
  PyType_Modified(g_tensor_type);
  // Instances come only from the engine (pybind11 makes them without calling __new__); a bare
  // Tensor.__new__ would give an object with no tensor inside.
  RefuseConstruction(cls,
                     "orochi.Tensor cannot be constructed directly; use orochi.tensor(), "
                     "orochi.zeros() or another factory function");

  BindShapeMethods(cls, module);
  BindConversions(cls);
  BindOperators(cls, module);
  BindReductions(cls, module);
  BindSelection(cls, module);
}

}  // namespace orochi::copy::bindings

namespace orochi::copy {

PyObject* TensorToPython(engine::Tensor tensor) {
  // A tensor may arrive from the host before any code in this copy imported orochi.
  if (bindings::g_tensor_type == nullptr) {
    PyObject* module = PyImport_ImportModule("_orochi_engine");
    if (module == nullptr) return nullptr;
    Py_DECREF(module);
  }
  try {
    return pybind11::cast(std::move(tensor)).release().ptr();
  } catch (pybind11::error_already_set& error) {
    error.restore();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_MemoryError, error.what());
  }
  return nullptr;
}

const engine::Tensor* TensorFromPython(PyObject* object) {
  if (bindings::g_tensor_type == nullptr || !PyObject_TypeCheck(object, bindings::g_tensor_type)) {
    return nullptr;
  }
  try {
    return &pybind11::cast<const engine::Tensor&>(pybind11::handle(object));
  } catch (const std::exception&) {
    return nullptr;  // an instance without a tensor inside
  }
}

}  // namespace orochi::copy
