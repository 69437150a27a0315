// CUDA kernels for copies, fills, arange, and elementwise unary, binary and where.
//
// One kernel per element type, with the op chosen at run time: the branch is the same for every
// thread, costs little next to the memory traffic, and keeps the number of instantiations (and
// nvcc's compile time) small. Arithmetic mirrors cpu/elementwise.cpp operation for operation.
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "device_common.cuh"
#include "scalar_rules.h"

namespace orochi::engine::cuda {
namespace {

// --- copy ----------------------------------------------------------------------------------------

// An element loaded for conversion: half types as float, like the CPU's Convert.
struct Loaded {
  enum Kind { kFloat, kDouble, kInteger } kind;
  float f;
  double d;
  int64_t i;
};

template <typename T>
__device__ __forceinline__ Loaded LoadAs(const void* base, int64_t offset) {
  const T value = static_cast<const T*>(base)[offset];
  Loaded loaded{Loaded::kInteger, 0.0F, 0.0, 0};
  if constexpr (kIsHalfType<T> || std::is_same_v<T, float>) {
    loaded.kind = Loaded::kFloat;
    loaded.f = Cast<float>(value);
  } else if constexpr (std::is_same_v<T, double>) {
    loaded.kind = Loaded::kDouble;
    loaded.d = value;
  } else {
    loaded.i = static_cast<int64_t>(value);
  }
  return loaded;
}

template <typename T>
__device__ __forceinline__ void StoreAs(void* base, int64_t offset, const Loaded& value) {
  T* out = static_cast<T*>(base) + offset;
  switch (value.kind) {
    case Loaded::kFloat:
      *out = Cast<T>(value.f);
      break;
    case Loaded::kDouble:
      *out = Cast<T>(value.d);
      break;
    default:
      *out = Cast<T>(value.i);
      break;
  }
}

__device__ Loaded Load(ScalarType type, const void* base, int64_t offset) {
  switch (type) {
    case ScalarType::kBool:
      return LoadAs<bool>(base, offset);
    case ScalarType::kUInt8:
      return LoadAs<uint8_t>(base, offset);
    case ScalarType::kInt8:
      return LoadAs<int8_t>(base, offset);
    case ScalarType::kInt16:
      return LoadAs<int16_t>(base, offset);
    case ScalarType::kInt32:
      return LoadAs<int32_t>(base, offset);
    case ScalarType::kInt64:
      return LoadAs<int64_t>(base, offset);
    case ScalarType::kFloat16:
      return LoadAs<__half>(base, offset);
    case ScalarType::kBFloat16:
      return LoadAs<__nv_bfloat16>(base, offset);
    case ScalarType::kFloat32:
      return LoadAs<float>(base, offset);
    default:
      return LoadAs<double>(base, offset);
  }
}

__device__ void Store(ScalarType type, void* base, int64_t offset, const Loaded& value) {
  switch (type) {
    case ScalarType::kBool:
      return StoreAs<bool>(base, offset, value);
    case ScalarType::kUInt8:
      return StoreAs<uint8_t>(base, offset, value);
    case ScalarType::kInt8:
      return StoreAs<int8_t>(base, offset, value);
    case ScalarType::kInt16:
      return StoreAs<int16_t>(base, offset, value);
    case ScalarType::kInt32:
      return StoreAs<int32_t>(base, offset, value);
    case ScalarType::kInt64:
      return StoreAs<int64_t>(base, offset, value);
    case ScalarType::kFloat16:
      return StoreAs<__half>(base, offset, value);
    case ScalarType::kBFloat16:
      return StoreAs<__nv_bfloat16>(base, offset, value);
    case ScalarType::kFloat32:
      return StoreAs<float>(base, offset, value);
    default:
      return StoreAs<double>(base, offset, value);
  }
}

// Same type: moves items of T's size.
template <typename T>
__global__ void CopyKernel(T* out, const T* in, Layout layout, int64_t count) {
  ForEachElement<2>(layout, count,
                    [&](int64_t, const int64_t(&offsets)[2]) { out[offsets[0]] = in[offsets[1]]; });
}

__global__ void ConvertKernel(void* out, ScalarType out_type, const void* in, ScalarType in_type,
                              Layout layout, int64_t count) {
  ForEachElement<2>(layout, count, [&](int64_t, const int64_t(&offsets)[2]) {
    Store(out_type, out, offsets[0], Load(in_type, in, offsets[1]));
  });
}

template <typename T>
__global__ void FillKernel(T* out, T value, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    out[i] = value;
  }
}

__global__ void ArangeKernel(void* out, ScalarType type, double start, double step, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    // Rounded twice as on the CPU, not fused into one FMA: truncation to integers must agree.
    Loaded value{Loaded::kDouble, 0.0F, __dadd_rn(start, __dmul_rn(static_cast<double>(i), step)),
                 0};
    Store(type, out, i, value);
  }
}

// --- unary ---------------------------------------------------------------------------------------

template <typename C>
__device__ __forceinline__ C ApplyUnary(Op op, C x) {
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case Op::neg:
        return -x;
      case Op::abs:
        return Fabs(x);
      case Op::exp:
        return Exp(x);
      case Op::log:
        return Log(x);
      case Op::sqrt:
        return Sqrt(x);
      case Op::rsqrt:
        return C{1} / Sqrt(x);
      case Op::sin:
        return Sin(x);
      case Op::cos:
        return Cos(x);
      case Op::tanh:
        return Tanh(x);
      case Op::sigmoid:
        return C{1} / (C{1} + Exp(-x));
      case Op::relu:
        return !(x <= C{0}) ? x : C{0};  // NaN stays NaN, as in PyTorch
      case Op::silu:
        return x / (C{1} + Exp(-x));
      case Op::gelu:  // 1 + erf(x / sqrt 2) as erfc(-x / sqrt 2): no cancellation for x < 0
        return C{0.5} * x * Erfc(x * C{-0.70710678118654752440});
      case Op::gelu_tanh: {
        const C inner = C{0.79788456080286535588} * (x + C{0.044715} * x * x * x);
        return C{0.5} * x * (C{1} + Tanh(inner));
      }
      case Op::erf:
        return Erf(x);
      case Op::floor:
        return Floor(x);
      case Op::ceil:
        return Ceil(x);
      case Op::round:
        return Rint(x);
      default:
        return x;
    }
  } else {  // integral: the ops that keep integral dtypes
    switch (op) {
      case Op::neg:
        return static_cast<C>(-x);
      case Op::abs:
        if constexpr (std::is_signed_v<C>) return x < C{0} ? static_cast<C>(-x) : x;
        return x;
      case Op::relu:
        return x > C{0} ? x : C{0};
      default:
        return x;  // floor, ceil and round are the identity on integers
    }
  }
}

template <typename T>
__global__ void UnaryKernel(Op op, T* out, const T* in, Layout layout, int64_t count) {
  using C = Compute<T>;
  ForEachElement<2>(layout, count, [&](int64_t, const int64_t(&offsets)[2]) {
    out[offsets[0]] = Cast<T>(ApplyUnary(op, Cast<C>(in[offsets[1]])));
  });
}

template <typename T>
cudaError_t LaunchUnaryOf(Op op, void* out, const void* in, const Layout& layout, int64_t count,
                          cudaStream_t stream) {
  if constexpr (std::is_same_v<T, bool>) {
    return cudaErrorInvalidValue;  // not registered: no unary op is defined on bool
  } else {
    OROCHI_LAUNCH(UnaryKernel<T>, GridFor(count), kBlockSize, stream, op, static_cast<T*>(out),
                  static_cast<const T*>(in), layout, count);
    return cudaGetLastError();
  }
}

// --- binary --------------------------------------------------------------------------------------

template <typename C>
__device__ __forceinline__ C ApplyArithmetic(Op op, C a, C b) {
  switch (op) {
    case Op::add:
      return static_cast<C>(a + b);
    case Op::sub:
      return static_cast<C>(a - b);
    case Op::mul:
      return static_cast<C>(a * b);
    case Op::div:
      return static_cast<C>(a / b);
    case Op::pow:
      if constexpr (std::is_floating_point_v<C>) {
        return Pow(a, b);
      } else {
        return IntegerPower(a, b);
      }
    case Op::floor_divide:
      return FloorDivide(a, b);
    case Op::remainder:
      return Remainder(a, b);
    case Op::maximum:
      if (IsNan(a) || IsNan(b)) return a + b;  // NaN
      return a > b ? a : b;
    case Op::minimum:
      if (IsNan(a) || IsNan(b)) return a + b;
      return a < b ? a : b;
    default:
      return a;
  }
}

// 16 bytes of items, moved as one load or store: one item at a time, a kernel that streams
// contiguous operands reaches about half the memory bandwidth that 16-byte accesses reach.
template <typename T>
struct PackOf {
  static constexpr int kItems = sizeof(T) < 16 ? static_cast<int>(16 / sizeof(T)) : 1;
  struct alignas(16) Items {
    T item[kItems];
  };
};

// Whether an arithmetic op over `layout` may run as BinaryPacksKernel: every operand contiguous
// (one dimension of stride 1; broadcasting leaves a stride of 0) and 16-byte aligned.
inline bool IsPackable(Op op, const Layout& layout, std::initializer_list<const void*> operands) {
  if (op >= Op::eq || layout.dims != 1) return false;
  for (size_t k = 0; k < operands.size(); ++k) {
    if (layout.strides[k][0] != 1) return false;
  }
  for (const void* operand : operands) {
    if (reinterpret_cast<uintptr_t>(operand) % 16 != 0) return false;
  }
  return true;
}

// An arithmetic op on contiguous, aligned operands of one dtype (activations and residuals, the
// common case): whole packs first, then the items after the last whole pack.
template <typename T>
__global__ void BinaryPacksKernel(Op op, T* out, const T* a, const T* b, int64_t count) {
  using C = Compute<T>;
  using Items = typename PackOf<T>::Items;
  constexpr int kItems = PackOf<T>::kItems;
  const int64_t packs = count / kItems;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t p = first; p < packs; p += stride) {
    const Items x = reinterpret_cast<const Items*>(a)[p];
    const Items y = reinterpret_cast<const Items*>(b)[p];
    Items z;
    for (int k = 0; k < kItems; ++k) {
      z.item[k] = Cast<T>(ApplyArithmetic(op, Cast<C>(x.item[k]), Cast<C>(y.item[k])));
    }
    reinterpret_cast<Items*>(out)[p] = z;
  }
  for (int64_t i = packs * kItems + first; i < count; i += stride) {
    out[i] = Cast<T>(ApplyArithmetic(op, Cast<C>(a[i]), Cast<C>(b[i])));
  }
}

// BinaryKernel tells comparisons by their place in the op list: after every arithmetic op.
static_assert(static_cast<int>(Op::minimum) + 1 == static_cast<int>(Op::eq) &&
              static_cast<int>(Op::add) < static_cast<int>(Op::minimum) &&
              static_cast<int>(Op::logical_xor) + 1 == static_cast<int>(Op::where));

template <typename T>
__global__ void BinaryKernel(Op op, void* out, const T* a, const T* b, Layout layout,
                             int64_t count) {
  using C = Compute<T>;
  if (op >= Op::eq) {  // comparisons and logical ops, after the arithmetic ones in the list
    auto* flags = static_cast<bool*>(out);
    ForEachElement<3>(layout, count, [&](int64_t, const int64_t(&offsets)[3]) {
      flags[offsets[0]] = ApplyComparison(op, Cast<C>(a[offsets[1]]), Cast<C>(b[offsets[2]]));
    });
    return;
  }
  auto* values = static_cast<T*>(out);
  ForEachElement<3>(layout, count, [&](int64_t, const int64_t(&offsets)[3]) {
    values[offsets[0]] =
        Cast<T>(ApplyArithmetic(op, Cast<C>(a[offsets[1]]), Cast<C>(b[offsets[2]])));
  });
}

template <typename T>
__global__ void WhereKernel(T* out, const bool* condition, const T* a, const T* b, Layout layout,
                            int64_t count) {
  ForEachElement<4>(layout, count, [&](int64_t, const int64_t(&offsets)[4]) {
    out[offsets[0]] = condition[offsets[1]] ? a[offsets[2]] : b[offsets[3]];
  });
}

}  // namespace

cudaError_t LaunchCopy(void* out, ScalarType out_type, const void* in, ScalarType in_type,
                       const Layout& layout, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (out_type == in_type) {
    const int item_size = ItemSizeOf(out_type);
    if (layout.dims == 1 && layout.strides[0][0] == 1 && layout.strides[1][0] == 1) {
      return cudaMemcpyAsync(out, in, static_cast<size_t>(count) * item_size,
                             cudaMemcpyDeviceToDevice, stream);
    }
    OROCHI_CUDA_DISPATCH_SIZE(
        item_size, T,
        OROCHI_LAUNCH(CopyKernel<T>, GridFor(count), kBlockSize, stream, static_cast<T*>(out),
                      static_cast<const T*>(in), layout, count));
    return cudaGetLastError();
  }
  OROCHI_LAUNCH(ConvertKernel, GridFor(count), kBlockSize, stream, out, out_type, in, in_type,
                layout, count);
  return cudaGetLastError();
}

cudaError_t LaunchFill(void* out, int item_size, uint64_t pattern, int64_t count,
                       cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  bool bytes_equal = true;  // then a memset does it
  for (int i = 1; i < item_size; ++i) {
    bytes_equal = bytes_equal && ((pattern >> (8 * i)) & 0xFFU) == (pattern & 0xFFU);
  }
  if (bytes_equal) {
    return cudaMemsetAsync(out, static_cast<int>(pattern & 0xFFU),
                           static_cast<size_t>(count) * item_size, stream);
  }
  OROCHI_CUDA_DISPATCH_SIZE(item_size, T,
                            OROCHI_LAUNCH(FillKernel<T>, GridFor(count), kBlockSize, stream,
                                          static_cast<T*>(out), static_cast<T>(pattern), count));
  return cudaGetLastError();
}

cudaError_t LaunchArange(void* out, ScalarType type, double start, double step, int64_t count,
                         cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  OROCHI_LAUNCH(ArangeKernel, GridFor(count), kBlockSize, stream, out, type, start, step, count);
  return cudaGetLastError();
}

cudaError_t LaunchUnary(Op op, ScalarType type, void* out, const void* in, const Layout& layout,
                        int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  OROCHI_CUDA_DISPATCH(type, T, return LaunchUnaryOf<T>(op, out, in, layout, count, stream));
  return cudaErrorInvalidValue;
}

cudaError_t LaunchBinary(Op op, ScalarType type, void* out, const void* a, const void* b,
                         const Layout& layout, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (IsPackable(op, layout, {out, a, b})) {
    OROCHI_CUDA_DISPATCH(type, T,
                         OROCHI_LAUNCH(BinaryPacksKernel<T>, GridFor(count / PackOf<T>::kItems + 1),
                                       kBlockSize, stream, op, static_cast<T*>(out),
                                       static_cast<const T*>(a), static_cast<const T*>(b), count));
    return cudaGetLastError();
  }
  OROCHI_CUDA_DISPATCH(
      type, T,
      OROCHI_LAUNCH(BinaryKernel<T>, GridFor(count), kBlockSize, stream, op, out,
                    static_cast<const T*>(a), static_cast<const T*>(b), layout, count));
  return cudaGetLastError();
}

cudaError_t LaunchWhere(int item_size, void* out, const bool* condition, const void* a,
                        const void* b, const Layout& layout, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  OROCHI_CUDA_DISPATCH_SIZE(
      item_size, T,
      OROCHI_LAUNCH(WhereKernel<T>, GridFor(count), kBlockSize, stream, static_cast<T*>(out),
                    condition, static_cast<const T*>(a), static_cast<const T*>(b), layout, count));
  return cudaGetLastError();
}

}  // namespace orochi::engine::cuda
