// The CUDA kernels of every engine op, with the registry's signatures: each checks what the
// front-end left to it, turns tensors into launch parameters (kernels.h), queues the work on the
// calling thread's stream and throws an Error naming the op if the launch failed. Matmul of
// floating types goes to cuBLAS.
#include "kernels.h"

#include <cublas_v2.h>

#include <climits>
#include <cstring>

#include "dispatch.h"
#include "orochi/base/check.h"
#include "orochi/engine/device.h"
#include "runtime.h"

namespace orochi::engine::cuda {

// convolution.cpp
void CudaConv2d(const Tensor& input, const Tensor& weight, const ConvGeometry& geometry,
                Tensor& output);

namespace {

#define OROCHI_SAME_ENUMERATOR(name, type, text, code, category) \
  static_assert(static_cast<int>(DType::name) == static_cast<int>(ScalarType::name));
OROCHI_ENGINE_DTYPES(OROCHI_SAME_ENUMERATOR)
#undef OROCHI_SAME_ENUMERATOR

ScalarType TypeOf(const Tensor& tensor) { return static_cast<ScalarType>(tensor.dtype()); }

// The layout of same-shaped `operands` (the output first), with size-1 dims dropped and
// neighbouring dims merged wherever every operand is contiguous across them.
Layout MakeLayout(std::string_view op, const Shape& shape,
                  std::initializer_list<const Tensor*> operands) {
  OROCHI_INTERNAL_ASSERT(operands.size() <= static_cast<size_t>(kMaxOperands),
                         "too many operands for a CUDA layout");
  struct Dim {
    int64_t size;
    int64_t strides[kMaxOperands];
  };
  std::vector<Dim> dims;  // innermost first
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 1) continue;
    Dim dim{shape[d], {}};
    int k = 0;
    for (const Tensor* operand : operands) dim.strides[k++] = operand->strides()[d];
    if (!dims.empty()) {
      Dim& inner = dims.back();
      bool mergeable = true;
      for (int i = 0; i < k; ++i) {
        mergeable = mergeable && dim.strides[i] == inner.strides[i] * inner.size;
      }
      if (mergeable) {
        inner.size *= dim.size;
        continue;
      }
    }
    dims.push_back(dim);
  }
  if (dims.empty()) dims.push_back(Dim{1, {}});  // one element
  OROCHI_CHECK(dims.size() <= static_cast<size_t>(kMaxLayoutDims), StatusCode::kUnimplemented,
               op << " on cuda: the tensors have " << dims.size()
                  << " dimensions that cannot be merged; the CUDA kernels take at most "
                  << kMaxLayoutDims << " (make the inputs contiguous first)");
  Layout layout;
  layout.dims = static_cast<int>(dims.size());
  for (int d = 0; d < layout.dims; ++d) {
    const Dim& dim = dims[dims.size() - 1 - d];
    layout.sizes[d] = dim.size;
    for (int k = 0; k < kMaxOperands; ++k) layout.strides[k][d] = dim.strides[k];
  }
  return layout;
}

uint64_t BitPattern(DType dtype, double value) {
  uint64_t pattern = 0;
  VisitDType(dtype, [&]<typename T>() {
    const T converted = Convert<T>(value);
    std::memcpy(&pattern, &converted, sizeof(T));
  });
  return pattern;
}

// --- copies and elementwise ----------------------------------------------------------------------

void CudaCopy(const Tensor& source, Tensor& destination) {
  const int64_t count = destination.numel();
  if (count == 0) return;
  StreamScope scope(destination, {&source});
  const Layout layout = MakeLayout("copy", destination.shape(), {&destination, &source});
  scope.Check(LaunchCopy(destination.mutable_data(), TypeOf(destination), source.data(),
                         TypeOf(source), layout, count, scope.stream()),
              "copy");
}

void CudaFill(Tensor& output, double value) {
  OROCHI_INTERNAL_ASSERT(output.is_contiguous(), "fill writes contiguous outputs");
  if (output.numel() == 0) return;
  StreamScope scope(output, {});
  scope.Check(LaunchFill(output.mutable_data(), static_cast<int>(ItemSize(output.dtype())),
                         BitPattern(output.dtype(), value), output.numel(), scope.stream()),
              "fill");
}

void CudaArangeFill(Tensor& output, double start, double step) {
  if (output.numel() == 0) return;
  StreamScope scope(output, {});
  scope.Check(LaunchArange(output.mutable_data(), TypeOf(output), start, step, output.numel(),
                           scope.stream()),
              "arange");
}

void CudaUnary(Op op, const Tensor& input, Tensor& output) {
  const int64_t count = output.numel();
  if (count == 0) return;
  StreamScope scope(output, {&input});
  const Layout layout = MakeLayout(OpName(op), output.shape(), {&output, &input});
  scope.Check(LaunchUnary(op, TypeOf(input), output.mutable_data(), input.data(), layout, count,
                          scope.stream()),
              OpName(op));
}

void CudaBinary(Op op, const Tensor& a, const Tensor& b, Tensor& output) {
  const int64_t count = output.numel();
  if (count == 0) return;
  StreamScope scope(output, {&a, &b});
  const Layout layout = MakeLayout(OpName(op), output.shape(), {&output, &a, &b});
  scope.Check(LaunchBinary(op, TypeOf(a), output.mutable_data(), a.data(), b.data(), layout, count,
                           scope.stream()),
              OpName(op));
}

void CudaWhere(const Tensor& condition, const Tensor& a, const Tensor& b, Tensor& output) {
  const int64_t count = output.numel();
  if (count == 0) return;
  StreamScope scope(output, {&condition, &a, &b});
  const Layout layout = MakeLayout("where", output.shape(), {&output, &condition, &a, &b});
  scope.Check(
      LaunchWhere(static_cast<int>(ItemSize(output.dtype())), output.mutable_data(),
                  condition.data_as<bool>(), a.data(), b.data(), layout, count, scope.stream()),
      "where");
}

// --- rows ----------------------------------------------------------------------------------------

struct Rows {
  int64_t outer;
  int64_t inner;
};
// A contiguous tensor as rows along its last dim (a 0-dim tensor is one row of one).
Rows RowsOf(const Tensor& input) {
  const int64_t inner = input.dim() == 0 ? 1 : input.shape().back();
  return {inner == 0 ? 0 : input.numel() / inner, inner};
}

void CudaReduce(Op op, const Tensor& input, Tensor& output) {
  const int64_t outer = output.numel();
  if (outer == 0) return;
  const int64_t inner = input.numel() / outer;
  Tensor scratch;
  if (const int64_t bytes = ReduceScratchBytes(outer, inner); bytes > 0) {
    scratch = Tensor::Empty({bytes}, DType::kUInt8, output.device());
  }
  StreamScope scope(output, {&input});
  scope.Check(
      LaunchReduce(op, TypeOf(input), input.data(), TypeOf(output), output.mutable_data(), outer,
                   inner, scratch.defined() ? scratch.mutable_data() : nullptr, scope.stream()),
      OpName(op));
}

void CudaSoftmax(Op op, const Tensor& input, Tensor& output) {
  const auto [outer, inner] = RowsOf(input);
  if (outer == 0) return;
  StreamScope scope(output, {&input});
  scope.Check(LaunchSoftmax(op == Op::log_softmax, TypeOf(input), input.data(),
                            output.mutable_data(), outer, inner, scope.stream()),
              OpName(op));
}

void CudaCumsum(Op op, const Tensor& input, Tensor& output) {
  const auto [outer, inner] = RowsOf(input);
  if (outer == 0) return;
  StreamScope scope(output, {&input});
  scope.Check(LaunchCumsum(TypeOf(input), input.data(), output.mutable_data(), outer, inner,
                           scope.stream()),
              OpName(op));
}

void CudaNorm(Op op, const Tensor& input, const Tensor* weight, const Tensor* bias, double eps,
              Tensor& output) {
  const auto [outer, inner] = RowsOf(input);
  if (outer == 0) return;
  StreamScope scope(output, {&input, weight, bias});
  scope.Check(LaunchNorm(op == Op::rms_norm, TypeOf(input), input.data(),
                         weight != nullptr ? weight->data() : nullptr,
                         bias != nullptr ? bias->data() : nullptr, eps, output.mutable_data(),
                         outer, inner, scope.stream()),
              OpName(op));
}

// --- positions -----------------------------------------------------------------------------------

void CudaIndexSelect(const Tensor& input, const Tensor& index, Tensor& output) {
  if (output.numel() == 0) return;
  StreamScope scope(output, {&input, &index});
  scope.Check(LaunchIndexSelect(static_cast<int>(ItemSize(input.dtype())), input.data(),
                                index.data_as<int64_t>(), output.mutable_data(), input.shape()[0],
                                input.shape()[1], input.shape()[2], index.numel(), scope.stream()),
              "index_select");
}

void CudaIm2col(const Tensor& input, const Im2colGeometry& geometry, Tensor& output) {
  if (output.numel() == 0) return;
  StreamScope scope(output, {&input});
  Im2colParams params{};
  params.planes = input.shape()[0] * input.shape()[1];
  params.height = input.shape()[2];
  params.width = input.shape()[3];
  for (int i = 0; i < 2; ++i) {
    params.kernel[i] = geometry.kernel[i];
    params.stride[i] = geometry.stride[i];
    params.padding[i] = geometry.padding[i];
    params.dilation[i] = geometry.dilation[i];
  }
  params.out_height = output.shape()[4];
  params.out_width = output.shape()[5];
  params.pad_pattern = BitPattern(input.dtype(), geometry.pad_value);
  scope.Check(LaunchIm2col(static_cast<int>(ItemSize(input.dtype())), input.data(),
                           output.mutable_data(), params, scope.stream()),
              "im2col");
}

void CudaSort(const Tensor& input, bool descending, Tensor& values, Tensor& indices) {
  const auto [outer, inner] = RowsOf(input);
  if (outer == 0) return;
  OROCHI_CHECK(
      inner <= INT32_MAX, StatusCode::kUnimplemented,
      "sort on cuda: rows of more than 2^31 - 1 elements are not supported, got " << inner);
  int64_t padded = 1;
  while (padded < inner) padded *= 2;
  const Device device = input.device();
  // Scratch: the keys (as int64, the same bytes) and positions, [outer, padded].
  Tensor keys = Tensor::Empty({outer, padded}, DType::kInt64, device);
  Tensor positions = Tensor::Empty({outer, padded}, DType::kInt32, device);
  StreamScope scope(values, {&input, &indices});
  auto* key_data = static_cast<uint64_t*>(keys.mutable_data());
  auto* position_data = positions.mutable_data_as<int32_t>();
  scope.Check(LaunchSortKeys(TypeOf(input), input.data(), descending, key_data, position_data,
                             outer, inner, padded, scope.stream()),
              "sort");
  scope.Check(LaunchSortRows(key_data, position_data, outer, padded, scope.stream()), "sort");
  scope.Check(
      LaunchSortGather(static_cast<int>(ItemSize(input.dtype())), input.data(), position_data,
                       values.mutable_data(), indices.mutable_data_as<int64_t>(), outer, inner,
                       padded, scope.stream()),
      "sort");
}

// --- matmul --------------------------------------------------------------------------------------

// How cuBLAS (column-major) reads one operand of a row-major product: a row-major matrix is, in
// column-major terms, its own transpose with the row stride as leading dimension; a
// column-major one is itself, to be transposed.
struct CublasOperand {
  cublasOperation_t operation;
  int64_t leading;
};
CublasOperand AsCublasOperand(const Tensor& matrices) {
  const int64_t row_stride = matrices.strides()[1];
  const int64_t column_stride = matrices.strides()[2];
  if (column_stride == 1) return {CUBLAS_OP_N, row_stride};
  return {CUBLAS_OP_T, column_stride};
}

void CudaMatmul(const Tensor& a, const Tensor& b, Tensor& output) {
  const int64_t batch = a.shape()[0];
  const int64_t m = a.shape()[1];
  const int64_t k = a.shape()[2];
  const int64_t n = b.shape()[2];
  if (output.numel() == 0) return;
  StreamScope scope(output, {&a, &b});
  const DType dtype = a.dtype();
  if (k == 0) {  // an empty sum
    scope.Check(
        cudaMemsetAsync(output.mutable_data(), 0,
                        static_cast<size_t>(output.numel()) * ItemSize(dtype), scope.stream()),
        "matmul");
    return;
  }
  if (!IsFloating(dtype)) {
    MatmulShape shape{batch, m, k, n, {}, {}};
    for (int i = 0; i < 3; ++i) {
      shape.a_strides[i] = a.strides()[i];
      shape.b_strides[i] = b.strides()[i];
    }
    scope.Check(LaunchIntegerMatmul(TypeOf(a), a.data(), b.data(), output.mutable_data(), shape,
                                    scope.stream()),
                "matmul");
    return;
  }
  const CublasOperand left = AsCublasOperand(b);  // C^T = B^T A^T: b comes first
  const CublasOperand right = AsCublasOperand(a);
  OROCHI_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && batch <= INT_MAX &&
                   left.leading <= INT_MAX && right.leading <= INT_MAX,
               StatusCode::kUnimplemented,
               "matmul on cuda: cuBLAS takes sizes up to 2^31 - 1, got batch "
                   << batch << ", m " << m << ", k " << k << ", n " << n);
  cudaDataType_t data_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  switch (dtype) {
    case DType::kFloat16:
      data_type = CUDA_R_16F;
      break;
    case DType::kBFloat16:
      data_type = CUDA_R_16BF;
      break;
    case DType::kFloat64:
      data_type = CUDA_R_64F;
      compute = CUBLAS_COMPUTE_64F;
      break;
    default:
      if (AllowTf32()) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
      break;
  }
  const float one = 1.0F;
  const float zero = 0.0F;
  const double one_double = 1.0;
  const double zero_double = 0.0;
  const bool double_scalars = compute == CUBLAS_COMPUTE_64F;
  // The row-major product C[m,n] = A[m,k] B[k,n] is, read column-major, C^T[n,m] = B^T A^T.
  const cublasStatus_t status = Cublas().gemm_strided_batched(
      CurrentCublas(scope.device()), left.operation, right.operation, static_cast<int>(n),
      static_cast<int>(m), static_cast<int>(k),
      double_scalars ? static_cast<const void*>(&one_double) : &one, b.data(), data_type,
      static_cast<int>(left.leading), b.strides()[0], a.data(), data_type,
      static_cast<int>(right.leading), a.strides()[0],
      double_scalars ? static_cast<const void*>(&zero_double) : &zero, output.mutable_data(),
      data_type, static_cast<int>(n), m * n, static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT);
  if (status != CUBLAS_STATUS_SUCCESS) {
    ThrowCublasError(status,
                     "matmul (cublasGemmStridedBatchedEx, " + std::string(DTypeName(dtype)) + ")",
                     scope.device());
  }
}

// Every op's CUDA kernel, in op.h's order; the dtypes are the CPU's (kKernelDTypes).
constexpr KernelTable kCudaKernels = {
    .copy = CudaCopy,
    .fill = CudaFill,
    .arange = CudaArangeFill,
    .neg = CudaUnary,
    .abs = CudaUnary,
    .exp = CudaUnary,
    .log = CudaUnary,
    .sqrt = CudaUnary,
    .rsqrt = CudaUnary,
    .sin = CudaUnary,
    .cos = CudaUnary,
    .tanh = CudaUnary,
    .sigmoid = CudaUnary,
    .relu = CudaUnary,
    .silu = CudaUnary,
    .gelu = CudaUnary,
    .gelu_tanh = CudaUnary,
    .erf = CudaUnary,
    .floor = CudaUnary,
    .ceil = CudaUnary,
    .round = CudaUnary,
    .add = CudaBinary,
    .sub = CudaBinary,
    .mul = CudaBinary,
    .div = CudaBinary,
    .pow = CudaBinary,
    .floor_divide = CudaBinary,
    .remainder = CudaBinary,
    .maximum = CudaBinary,
    .minimum = CudaBinary,
    .eq = CudaBinary,
    .ne = CudaBinary,
    .lt = CudaBinary,
    .le = CudaBinary,
    .gt = CudaBinary,
    .ge = CudaBinary,
    .logical_and = CudaBinary,
    .logical_or = CudaBinary,
    .logical_xor = CudaBinary,
    .where = CudaWhere,
    .sum = CudaReduce,
    .mean = CudaReduce,
    .amax = CudaReduce,
    .amin = CudaReduce,
    .prod = CudaReduce,
    .argmax = CudaReduce,
    .argmin = CudaReduce,
    .layer_norm = CudaNorm,
    .rms_norm = CudaNorm,
    .index_select = CudaIndexSelect,
    .im2col = CudaIm2col,
    // cuDNN for the floating dtypes, im2col + matmul for the integers (convolution.cpp).
    .conv2d = CudaConv2d,
    .sort = CudaSort,
    .softmax = CudaSoftmax,
    .log_softmax = CudaSoftmax,
    .cumsum = CudaCumsum,
    // float16/bfloat16/float32 (TF32 when allowed)/float64 through cuBLAS; bool and integers
    // with a plain kernel, as the CPU's loops.
    .matmul = CudaMatmul,
};
static_assert(HasEveryKernel(kCudaKernels), "CUDA has a kernel for every op of op.h");

}  // namespace

void RegisterCudaKernels(KernelRegistry& registry) {
  registry.Register(DeviceType::kCuda, kCudaKernels);
}

}  // namespace orochi::engine::cuda
