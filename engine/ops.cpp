// Op front-ends: argument checks, broadcasting, type promotion and output allocation, then the
// registered kernel of the input's device.
#include "orochi/engine/ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>

#include "cpu/blas.h"
#include "dispatch.h"
#include "front_end.h"
#include "orochi/base/check.h"
#include "orochi/engine/cpu_math.h"

namespace orochi::engine {
namespace {

// Comparisons and logical ops return bool.
bool IsComparison(Op op) {
  return op == Op::eq || op == Op::ne || op == Op::lt || op == Op::le || op == Op::gt ||
         op == Op::ge || op == Op::logical_and || op == Op::logical_or || op == Op::logical_xor;
}

// Unary ops that keep integral dtypes; the others compute integral input in float32.
bool KeepsIntegral(Op op) {
  return op == Op::neg || op == Op::abs || op == Op::relu || op == Op::floor || op == Op::ceil ||
         op == Op::round;
}

// c10's combine_categories: the higher-priority dtype wins unless the lower one is of a higher
// category (floating over integral over bool), in which case they promote.
DType CombineCategories(DType higher, DType lower) {
  if (IsFloating(higher)) return higher;
  if (higher == DType::kBool || IsFloating(lower)) return PromoteTypes(higher, lower);
  return higher;
}

bool IsCpuScalar(const Tensor& tensor) {
  return tensor.dim() == 0 && tensor.device().type == DeviceType::kCpu;
}

}  // namespace

Device CommonDevice(std::string_view op, std::initializer_list<const Tensor*> tensors,
                    CpuScalars scalars) {
  const Tensor* first = nullptr;
  for (const Tensor* tensor : tensors) {
    if (tensor == nullptr || !tensor->defined() ||
        (scalars == CpuScalars::kFollow && IsCpuScalar(*tensor))) {
      continue;
    }
    if (first == nullptr) {
      first = tensor;
      continue;
    }
    OROCHI_CHECK_ARG(tensor->device() == first->device(),
                     op << ": expected all tensors on the same device, got "
                        << DeviceName(first->device()) << " and " << DeviceName(tensor->device()));
  }
  if (first != nullptr) return first->device();
  for (const Tensor* tensor : tensors) {  // only CPU scalars (or absent tensors)
    if (tensor != nullptr && tensor->defined()) return tensor->device();
  }
  return Device{};
}

Tensor OnDevice(const Tensor& tensor, Device device) {
  if (tensor.device() == device) return tensor;
  OROCHI_INTERNAL_ASSERT(IsCpuScalar(tensor), "only 0-dim CPU tensors follow other devices");
  // A fill on the device queues behind earlier work like any kernel, where a copy from the host
  // would wait for a staging buffer. Doubles hold every value but int64s beyond 2^53 exactly.
  const double value = tensor.ItemAsDouble();
  if (tensor.dtype() != DType::kInt64 || std::abs(value) <= 0x1p53) {
    return Full({}, value, tensor.dtype(), device);
  }
  return tensor.To(device);
}

Tensor Full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor output = Tensor::Empty(shape, dtype, device);
  Kernels().Find<Op::fill>(device, dtype)(output, value);
  return output;
}
Tensor Zeros(const Shape& shape, DType dtype, Device device) {
  return Full(shape, 0, dtype, device);
}
Tensor Ones(const Shape& shape, DType dtype, Device device) {
  return Full(shape, 1, dtype, device);
}
Tensor Scalar(double value, DType dtype, Device device) { return Full({}, value, dtype, device); }

Tensor Arange(double start, double end, double step, DType dtype, Device device) {
  OROCHI_CHECK_ARG(step != 0, "arange: step must be non-zero");
  OROCHI_CHECK_ARG(std::isfinite(start) && std::isfinite(end), "arange: bounds must be finite");
  OROCHI_CHECK_ARG((end - start) / step >= 0, "arange: the range [" << start << ", " << end
                                                                    << ") and step " << step
                                                                    << " have inconsistent signs");
  auto count = static_cast<int64_t>(std::ceil((end - start) / step));
  Tensor output = Tensor::Empty({count}, dtype, device);
  Kernels().Find<Op::arange>(device, dtype)(output, start, step);
  return output;
}

namespace {

// int64 start + i * step for i in [0, count), on `device`, computed in int64 without overflow:
// positions times the step plus the start (0-dim CPU operands, exact where a double-valued
// Scalar is not, follow the positions to their device as Python numbers do). A range whose
// offsets would not fit in int64 (over 2^63 wide) is made in two halves, either side of zero.
Tensor ExactIntegerRange(int64_t start, int64_t count, int64_t step, Device device) {
  const __int128 last_offset = static_cast<__int128>(count - 1) * step;
  if (count > 0 && (last_offset > std::numeric_limits<int64_t>::max() ||
                    last_offset < std::numeric_limits<int64_t>::min())) {
    const __int128 distance_to_zero = step > 0 ? -static_cast<__int128>(start) : start;
    const __int128 magnitude = step > 0 ? step : -static_cast<__int128>(step);
    const auto before_zero = static_cast<int64_t>((distance_to_zero + magnitude - 1) / magnitude);
    const auto restart = static_cast<int64_t>(start + static_cast<__int128>(before_zero) * step);
    return Cat({ExactIntegerRange(start, before_zero, step, device),
                ExactIntegerRange(restart, count - before_zero, step, device)});
  }
  const auto exact = [](int64_t value) {
    Tensor scalar = Tensor::Empty({}, DType::kInt64);
    *scalar.mutable_data_as<int64_t>() = value;
    return scalar;
  };
  return Binary(
      Op::add,
      Binary(Op::mul, Arange(0, static_cast<double>(count), 1, DType::kInt64, device), exact(step)),
      exact(start));
}

}  // namespace

Tensor IntegerArange(int64_t start, int64_t end, int64_t step, DType dtype, Device device) {
  OROCHI_CHECK_ARG(IsIntegral(dtype),
                   "arange: integer bounds make an integer tensor, not " << DTypeName(dtype));
  OROCHI_CHECK_ARG(step != 0, "arange: step must be non-zero");
  const __int128 span = static_cast<__int128>(end) - start;
  OROCHI_CHECK_ARG(span == 0 || (span > 0) == (step > 0),
                   "arange: the range [" << start << ", " << end << ") and step " << step
                                         << " have inconsistent signs");
  const auto count = static_cast<int64_t>(span == 0 ? 0 : (span - (step > 0 ? 1 : -1)) / step + 1);
  // Doubles hold every value exactly up to 2^53: there the arange kernel computes the values in
  // one pass; past it, they are computed in int64.
  const auto magnitude = [](int64_t value) {
    return value < 0 ? -static_cast<__int128>(value) : static_cast<__int128>(value);
  };
  Tensor values;
  if (magnitude(start) + magnitude(end) + magnitude(step) <= (__int128{1} << 53)) {
    values = Tensor::Empty({count}, DType::kInt64, device);
    Kernels().Find<Op::arange>(device, DType::kInt64)(values, static_cast<double>(start),
                                                      static_cast<double>(step));
  } else {
    values = ExactIntegerRange(start, count, step, device);
  }
  return dtype == DType::kInt64 ? values : values.To(dtype);
}

Tensor Unary(Op op, const Tensor& input) {
  OROCHI_CHECK_ARG(input.defined(), OpName(op) << ": undefined tensor");
  OROCHI_CHECK_ARG(op != Op::neg || input.dtype() != DType::kBool,
                   "Negation, the `-` operator, on a bool tensor is not supported. If you are "
                   "trying to invert a mask, use the `~` or `logical_not()` operator instead.");
  DType dtype = input.dtype();
  if (!IsFloating(dtype) && !KeepsIntegral(op)) dtype = DType::kFloat32;
  auto kernel = Kernels().FindAs<UnaryKernel>(op, input.device(), dtype);
  Tensor output = Tensor::Empty(input.shape(), dtype, input.device());
  kernel(op, input.To(dtype), output);
  return output;
}

Shape BroadcastShapes(const Shape& a, const Shape& b) {
  size_t rank = std::max(a.size(), b.size());
  Shape shape(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t x = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t y = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    OROCHI_CHECK_ARG(x == y || x == 1 || y == 1, "shapes "
                                                     << ShapeString(a) << " and " << ShapeString(b)
                                                     << " cannot be broadcast (dimension " << i
                                                     << ": " << x << " vs " << y << ")");
    shape[i] = x == 1 ? y : x;
  }
  return shape;
}

DType ResultType(const Tensor& a, const Tensor& b) {
  bool a_scalar = a.dim() == 0;
  bool b_scalar = b.dim() == 0;
  if (a_scalar == b_scalar) return PromoteTypes(a.dtype(), b.dtype());
  return a_scalar ? CombineCategories(b.dtype(), a.dtype())
                  : CombineCategories(a.dtype(), b.dtype());
}

Tensor Binary(Op op, const Tensor& a, const Tensor& b) {
  OROCHI_CHECK_ARG(a.defined() && b.defined(), OpName(op) << ": undefined tensor");
  if (op == Op::sub) {  // PyTorch's messages, which say what was likely meant
    OROCHI_CHECK_ARG(a.dtype() != DType::kBool || b.dtype() != DType::kBool,
                     "Subtraction, the `-` operator, with two bool tensors is not supported. "
                     "Use the `^` or `logical_xor()` operator instead.");
    OROCHI_CHECK_ARG(a.dtype() != DType::kBool && b.dtype() != DType::kBool,
                     "Subtraction, the `-` operator, with a bool tensor is not supported. If you "
                     "are trying to invert a mask, use the `~` or `logical_not()` operator "
                     "instead.");
  }
  const Device device = CommonDevice(OpName(op), {&a, &b}, CpuScalars::kFollow);
  // Same shapes, device and dtype (the common case, and all of a tiny op's cost): the operands
  // as they are, with no temporary tensors.
  Shape broadcast;
  const Shape& shape =
      a.shape() == b.shape() ? a.shape() : (broadcast = BroadcastShapes(a.shape(), b.shape()));
  DType compute = ResultType(a, b);
  if (op == Op::div && !IsFloating(compute)) compute = DType::kFloat32;  // true division
  auto kernel = Kernels().FindAs<BinaryKernel>(op, device, compute);
  Tensor output = Tensor::Empty(shape, IsComparison(op) ? DType::kBool : compute, device);
  auto prepared = [&](const Tensor& operand, Tensor& converted) -> const Tensor& {
    if (operand.device() == device && operand.dtype() == compute && operand.shape() == shape) {
      return operand;
    }
    if (operand.device() == device && operand.dtype() == compute) {
      converted = operand.Expand(shape);
      return converted;
    }
    converted = OnDevice(operand, device).To(compute);
    if (converted.shape() != shape) converted = converted.Expand(shape);
    return converted;
  };
  Tensor converted_a;
  Tensor converted_b;
  kernel(op, prepared(a, converted_a), prepared(b, converted_b), output);
  return output;
}

Tensor Reduce(Op op, const Tensor& input, const std::vector<int64_t>& dims, bool keepdim) {
  OROCHI_CHECK_ARG(
      op == Op::sum || op == Op::mean || op == Op::amax || op == Op::amin || op == Op::prod,
      OpName(op) << " is not a reduction (argmax/argmin: ArgReduce)");
  if (input.dim() == 0 && !dims.empty()) {  // dim 0 or -1 of a 0-d tensor: its one element
    for (int64_t dim : dims) WrapScalarDim(dim, 0);
    return Reduce(op, input, {}, keepdim);
  }
  std::vector<bool> reduced(static_cast<size_t>(input.dim()), dims.empty());
  for (int64_t dim : dims) {
    int64_t wrapped = WrapDim(dim, input.dim());
    OROCHI_CHECK_ARG(!reduced[wrapped] || dims.empty(),
                     OpName(op) << ": dimension " << dim << " appears twice");
    reduced[wrapped] = true;
  }
  std::vector<int64_t> order;
  Shape kept_shape;
  Shape output_shape;
  int64_t inner = 1;
  for (int64_t d = 0; d < input.dim(); ++d) {
    if (!reduced[d]) {
      order.push_back(d);
      kept_shape.push_back(input.shape()[d]);
      output_shape.push_back(input.shape()[d]);
    } else if (keepdim) {
      output_shape.push_back(1);
    }
  }
  for (int64_t d = 0; d < input.dim(); ++d) {
    if (reduced[d]) {
      order.push_back(d);
      inner *= input.shape()[d];
    }
  }
  if (inner == 0 && op != Op::sum && op != Op::mean && op != Op::prod) {
    // PyTorch's split: a named empty dim is IndexError, a whole empty tensor RuntimeError.
    OROCHI_CHECK_ARG(!dims.empty(), OpName(op) << ": cannot reduce an empty tensor "
                                               << ShapeString(input.shape())
                                               << " without a dim to reduce over");
    OROCHI_CHECK_RANGE(false, OpName(op) << ": cannot reduce over an empty dimension of "
                                         << ShapeString(input.shape()));
  }
  DType output_dtype = input.dtype();
  if ((op == Op::sum || op == Op::prod) && !IsFloating(input.dtype())) {
    output_dtype = DType::kInt64;
  }
  auto kernel = Kernels().FindAs<ReduceKernel>(op, input.device(), input.dtype());
  Tensor output = Tensor::Empty(output_shape, output_dtype, input.device());
  if (output.numel() == 0) return output;  // an empty batch: nothing to reduce, nothing to launch
  Tensor arranged = input.Permute(order).Contiguous();
  kernel(op, arranged.View({NumElements(kept_shape), inner}), output);
  return output;
}

namespace {

Tensor SoftmaxLike(Op op, const Tensor& input, int64_t dim) {
  int64_t wrapped = WrapScalarDim(dim, input.dim());
  auto kernel = Kernels().FindAs<SoftmaxKernel>(op, input.device(), input.dtype());
  if (input.dim() == 0) {
    Tensor output = Tensor::Empty({}, input.dtype(), input.device());
    kernel(op, input.Contiguous(), output);
    return output;
  }
  int64_t last = input.dim() - 1;
  Tensor moved = input.Transpose(wrapped, last).Contiguous();
  Tensor output = Tensor::Empty(moved.shape(), moved.dtype(), input.device());
  kernel(op, moved, output);
  return output.Transpose(wrapped, last).Contiguous();
}

}  // namespace

Tensor Softmax(const Tensor& input, int64_t dim) { return SoftmaxLike(Op::softmax, input, dim); }
Tensor LogSoftmax(const Tensor& input, int64_t dim) {
  return SoftmaxLike(Op::log_softmax, input, dim);
}

Tensor Cumsum(const Tensor& input, int64_t dim) {
  if (IsFloating(input.dtype())) return SoftmaxLike(Op::cumsum, input, dim);
  return SoftmaxLike(Op::cumsum, input.To(DType::kInt64), dim);
}

namespace {

// `matrices` [..., rows, columns], already expanded to the batch shape, as the [batch, rows,
// columns] operand of a matmul kernel: a view when its batch dims collapse into one stride and
// its matrices are row- or column-major (see MatmulKernel), else a contiguous copy.
Tensor GemmOperand(const Tensor& matrices, int64_t batch_count) {
  const int64_t rank = matrices.dim();
  const int64_t rows = matrices.shape()[rank - 2];
  const int64_t columns = matrices.shape()[rank - 1];
  int64_t row_stride = matrices.strides()[rank - 2];
  int64_t column_stride = matrices.strides()[rank - 1];
  // The stride of a size-1 dim is never followed: give it one that reads as the layout below.
  if (columns == 1) column_stride = row_stride == 1 ? std::max<int64_t>(rows, 1) : 1;
  if (rows == 1) row_stride = column_stride == 1 ? std::max<int64_t>(columns, 1) : 1;
  const bool row_major = column_stride == 1 && row_stride >= std::max<int64_t>(columns, 1);
  const bool column_major = row_stride == 1 && column_stride >= std::max<int64_t>(rows, 1);
  // Batch dims collapse when each non-1 dim steps over the next ones, or all of them repeat.
  int64_t batch_stride = 0;
  int64_t inner_span = -1;  // elements spanned by the batch dims inside the current one
  bool collapses = true;
  bool broadcast = true;
  for (int64_t d = rank - 3; d >= 0; --d) {
    const int64_t size = matrices.shape()[d];
    const int64_t stride = matrices.strides()[d];
    if (size == 1) continue;
    broadcast = broadcast && stride == 0;
    if (inner_span < 0) {
      batch_stride = stride;
    } else {
      collapses = collapses && stride == inner_span;
    }
    inner_span = stride * size;
  }
  if (broadcast) {
    batch_stride = 0;
    collapses = true;
  }
  if ((row_major || column_major) && collapses) {
    return {matrices.storage(),
            {batch_count, rows, columns},
            {batch_stride, row_stride, column_stride},
            matrices.storage_offset(),
            matrices.dtype()};
  }
  return matrices.Contiguous().View({batch_count, rows, columns});
}

}  // namespace

Tensor Matmul(const Tensor& a, const Tensor& b) {
  CommonDevice("matmul", {&a, &b});
  OROCHI_CHECK_ARG(
      a.dim() >= 1 && b.dim() >= 1,
      "matmul: both arguments need at least 1 dimension, got " << a.dim() << " and " << b.dim());
  OROCHI_CHECK_ARG(a.dtype() == b.dtype(), "matmul: dtypes differ, " << DTypeName(a.dtype())
                                                                     << " and "
                                                                     << DTypeName(b.dtype()));
  auto kernel = Kernels().Find<Op::matmul>(a.device(), a.dtype());
  if (a.dim() == 2 && b.dim() == 2 && a.is_contiguous()) {
    // Two matrices (linear's [rows, in] x weight.T): one GEMM, without the batch bookkeeping
    // below, whose temporaries cost more than a small product itself.
    const int64_t m = a.shape()[0];
    const int64_t k = a.shape()[1];
    const int64_t n = b.shape()[1];
    OROCHI_CHECK_ARG(b.shape()[0] == k, "matmul: shapes " << ShapeString(a.shape()) << " and "
                                                          << ShapeString(b.shape())
                                                          << " cannot be multiplied");
    Tensor output = Tensor::Empty({m, n}, a.dtype(), a.device());
    Tensor output_batch(output.storage(), {1, m, n}, {m * n, n, 1}, 0, a.dtype());
    kernel(Tensor(a.storage(), {1, m, k}, {m * k, k, 1}, a.storage_offset(), a.dtype()),
           GemmOperand(b.Unsqueeze(0), 1), output_batch);
    return output;
  }
  // 1-D operands become matrices, and the added dimension is removed from the result.
  Tensor left = a.dim() == 1 ? a.Unsqueeze(0) : a;
  Tensor right = b.dim() == 1 ? b.Unsqueeze(1) : b;
  int64_t m = left.size(-2);
  int64_t k = left.size(-1);
  int64_t n = right.size(-1);
  OROCHI_CHECK_ARG(right.size(-2) == k, "matmul: shapes " << ShapeString(a.shape()) << " and "
                                                          << ShapeString(b.shape())
                                                          << " cannot be multiplied");
  Shape left_batch(left.shape().begin(), left.shape().end() - 2);
  Shape right_batch(right.shape().begin(), right.shape().end() - 2);
  Shape batch = BroadcastShapes(left_batch, right_batch);
  int64_t batch_count = NumElements(batch);
  auto with = [&batch](int64_t rows, int64_t columns) {
    Shape shape = batch;
    shape.push_back(rows);
    shape.push_back(columns);
    return shape;
  };
  Tensor output;
  if (right.dim() == 2 && left.is_contiguous()) {
    // One matrix on the right: the batch of the left is one tall matrix, one GEMM.
    const int64_t rows = batch_count * m;
    output = Tensor::Empty({1, rows, n}, a.dtype(), a.device());
    kernel(left.View({1, rows, k}), GemmOperand(right.Unsqueeze(0), 1), output);
  } else {
    output = Tensor::Empty({batch_count, m, n}, a.dtype(), a.device());
    kernel(GemmOperand(left.Expand(with(m, k)), batch_count),
           GemmOperand(right.Expand(with(k, n)), batch_count), output);
  }
  Shape result = with(m, n);
  if (b.dim() == 1) result.erase(result.end() - 1);
  if (a.dim() == 1) result.erase(result.end() - (b.dim() == 1 ? 1 : 2));
  return output.View(result);
}

std::string_view BlasCoreName() { return cpu::Blas().get_corename(); }

std::string_view BlasCoreChoice() { return cpu::Blas().core_choice; }

}  // namespace orochi::engine
