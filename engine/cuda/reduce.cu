// CUDA kernels over the rows of contiguous [outer, inner] tensors: reductions, softmax and
// layer/RMS norm. Each row gets a group of threads (see GroupsFor): part of a warp for short
// rows, a whole block for long ones; a reduction of few long rows splits each across blocks.
//
// Accumulation follows cpu/reduce.cpp: reductions in double for floating types and int64 for the
// rest; softmax and norms in float (double for float64). Sums are added in a different order than
// on the CPU, so floating results differ by rounding only.
#include <cfloat>

#include "device_common.cuh"

namespace orochi::engine::cuda {
namespace {

// --- reductions ----------------------------------------------------------------------------------

template <typename T>
using Accumulator = std::conditional_t<kIsFloating<T>, double, int64_t>;

// A partial result: the value, and for arg reductions its position (-1: nothing seen yet, which
// is also the state of an empty amax/amin before its first element).
template <typename A>
struct Partial {
  A value;
  int64_t index;
};

template <typename A>
__device__ __forceinline__ Partial<A> ShuffleXor(Partial<A> partial, int mask, int width) {
  partial.value = __shfl_xor_sync(0xffffffffU, partial.value, mask, width);
  partial.index = __shfl_xor_sync(0xffffffffU, partial.index, mask, width);
  return partial;
}

template <typename A>
__device__ __forceinline__ Partial<A> Identity(Op op) {
  if (op == Op::prod) return {A{1}, 0};
  if (op == Op::sum || op == Op::mean) return {A{0}, 0};
  return {A{0}, -1};
}

// Associative and commutative, so any grouping gives the CPU's answer: for amax/amin any NaN
// wins; for argmax/argmin the first NaN, else the first extreme.
template <typename A>
__device__ __forceinline__ Partial<A> Combine(Op op, Partial<A> x, Partial<A> y) {
  switch (op) {
    case Op::sum:
    case Op::mean:
      return {x.value + y.value, 0};
    case Op::prod:
      return {x.value * y.value, 0};
    default:
      break;
  }
  if (x.index < 0) return y;
  if (y.index < 0) return x;
  const bool x_nan = IsNan(x.value);
  const bool y_nan = IsNan(y.value);
  if (op == Op::amax || op == Op::amin) {
    if (x_nan) return x;
    if (y_nan) return y;
    const bool take_y = op == Op::amax ? y.value > x.value : y.value < x.value;
    return take_y ? y : x;
  }
  if (x_nan || y_nan) {
    if (x_nan && y_nan) return x.index < y.index ? x : y;
    return x_nan ? x : y;
  }
  const bool y_better = op == Op::argmax ? y.value > x.value : y.value < x.value;
  const bool x_better = op == Op::argmax ? x.value > y.value : x.value < y.value;
  if (y_better) return y;
  if (x_better) return x;
  return x.index < y.index ? x : y;
}

// The result of row `row` from its combined partial: the position for arg reductions, the value
// (divided by the count for mean) otherwise.
template <typename T, typename A>
__device__ __forceinline__ void WriteReduction(Op op, Partial<A> partial, int64_t inner, void* out,
                                               bool out_int64, int64_t row) {
  if (op == Op::argmax || op == Op::argmin) {
    static_cast<int64_t*>(out)[row] = partial.index;
    return;
  }
  A result = partial.value;
  if constexpr (std::is_floating_point_v<A>) {
    if (op == Op::mean) result /= static_cast<A>(inner);
  }
  if (out_int64) {
    static_cast<int64_t*>(out)[row] = Cast<int64_t>(result);
  } else {
    static_cast<T*>(out)[row] = Cast<T>(result);
  }
}

template <typename T>
__global__ void ReduceKernel(Op op, const T* in, void* out, bool out_int64, int64_t outer,
                             int64_t inner, int group) {
  using A = Accumulator<T>;
  __shared__ Partial<A> shared[32];
  const int rows_per_block = blockDim.x / group;
  const int lane = threadIdx.x % group;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block; first < outer;
       first += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t row = first + threadIdx.x / group;
    Partial<A> partial = Identity<A>(op);
    if (row < outer) {
      const T* values = in + row * inner;
      for (int64_t i = lane; i < inner; i += group) {
        partial = Combine(op, partial, Partial<A>{Cast<A>(values[i]), i});
      }
    }
    partial = GroupAllReduce(partial, group, shared,
                             [op](Partial<A> x, Partial<A> y) { return Combine(op, x, y); });
    if (row < outer && lane == 0) WriteReduction<T>(op, partial, inner, out, out_int64, row);
  }
}

// Few long rows: a row's single block would leave most of the GPU idle (the mean of a whole
// tensor is one row), so each row is cut into chunks, one block each, whose partial results go
// to scratch and are combined by a second kernel. Combine is associative and partials keep
// their global positions, so the answer is the one-pass answer (sums up to rounding).
constexpr int64_t kSplitRowsBelow = 128;          // from this many rows, one block per row fills it
constexpr int64_t kSplitFrom = int64_t{1} << 16;  // shorter rows are quick in one block
constexpr int64_t kChunkElements = int64_t{1} << 14;
constexpr int64_t kMaxChunks = 1024;
constexpr int kSplitBlock = 512;

int64_t ChunksFor(int64_t outer, int64_t inner) {
  if (outer >= kSplitRowsBelow || inner < kSplitFrom) return 1;
  const int64_t chunks = (inner + kChunkElements - 1) / kChunkElements;
  return chunks < kMaxChunks ? chunks : kMaxChunks;
}

template <typename T>
__global__ void ReduceChunksKernel(Op op, const T* in, Partial<Accumulator<T>>* partials,
                                   int64_t inner, int64_t chunks) {
  using A = Accumulator<T>;
  __shared__ Partial<A> shared[32];
  const int64_t row = blockIdx.x / chunks;
  const int64_t chunk = blockIdx.x % chunks;
  const int64_t length = (inner + chunks - 1) / chunks;
  const int64_t begin = chunk * length;
  const int64_t end = begin + length < inner ? begin + length : inner;
  const T* values = in + row * inner;
  Partial<A> partial = Identity<A>(op);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    partial = Combine(op, partial, Partial<A>{Cast<A>(values[i]), i});
  }
  partial = GroupAllReduce(partial, blockDim.x, shared,
                           [op](Partial<A> x, Partial<A> y) { return Combine(op, x, y); });
  if (threadIdx.x == 0) partials[blockIdx.x] = partial;
}

template <typename T>
__global__ void CombineChunksKernel(Op op, const Partial<Accumulator<T>>* partials, int64_t chunks,
                                    void* out, bool out_int64, int64_t inner) {
  using A = Accumulator<T>;
  __shared__ Partial<A> shared[32];
  const int64_t row = blockIdx.x;
  Partial<A> partial = Identity<A>(op);
  for (int64_t i = threadIdx.x; i < chunks; i += blockDim.x) {
    partial = Combine(op, partial, partials[row * chunks + i]);
  }
  partial = GroupAllReduce(partial, blockDim.x, shared,
                           [op](Partial<A> x, Partial<A> y) { return Combine(op, x, y); });
  if (threadIdx.x == 0) WriteReduction<T>(op, partial, inner, out, out_int64, row);
}

// --- softmax and norms ---------------------------------------------------------------------------

template <typename T>
using RowCompute = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
__global__ void SoftmaxKernel(bool log, const T* in, T* out, int64_t outer, int64_t inner,
                              int group) {
  using C = RowCompute<T>;
  __shared__ C shared[32];
  const int rows_per_block = blockDim.x / group;
  const int lane = threadIdx.x % group;
  auto add = [](C x, C y) { return x + y; };
  // std::max's rule, as on the CPU: a NaN element does not become the maximum.
  auto maximum = [](C x, C y) { return x < y ? y : x; };
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block; first < outer;
       first += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t row = first + threadIdx.x / group;
    const bool active = row < outer;
    const T* x = in + (active ? row : 0) * inner;
    C largest = -INFINITY;
    if (active) {
      for (int64_t i = lane; i < inner; i += group) largest = maximum(largest, Cast<C>(x[i]));
    }
    largest = GroupAllReduce(largest, group, shared, maximum);
    C total = 0;
    if (active) {
      for (int64_t i = lane; i < inner; i += group) total += Exp(Cast<C>(x[i]) - largest);
    }
    total = GroupAllReduce(total, group, shared, add);
    if (!active) continue;
    T* y = out + row * inner;
    if (log) {
      const C log_total = Log(total);
      for (int64_t i = lane; i < inner; i += group)
        y[i] = Cast<T>(Cast<C>(x[i]) - largest - log_total);
    } else {
      for (int64_t i = lane; i < inner; i += group)
        y[i] = Cast<T>(Exp(Cast<C>(x[i]) - largest) / total);
    }
  }
}

// One thread per row, adding in the row's order as the CPU does (rows here are a sampler's or a
// scan's, short and many, rather than long and few).
template <typename T>
__global__ void CumsumKernel(const T* in, T* out, int64_t outer, int64_t inner) {
  using C = std::conditional_t<std::is_same_v<T, int64_t>, int64_t, RowCompute<T>>;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; row < outer;
       row += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    C total = 0;
    for (int64_t i = row * inner; i < (row + 1) * inner; ++i) {
      total += Cast<C>(in[i]);
      out[i] = Cast<T>(total);
    }
  }
}

template <typename T>
__global__ void NormKernel(bool rms, const T* in, const T* weight, const T* bias, double eps,
                           T* out, int64_t outer, int64_t inner, int group) {
  using C = RowCompute<T>;
  __shared__ C shared[32];
  const int rows_per_block = blockDim.x / group;
  const int lane = threadIdx.x % group;
  auto add = [](C x, C y) { return x + y; };
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block; first < outer;
       first += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t row = first + threadIdx.x / group;
    const bool active = row < outer;
    const T* x = in + (active ? row : 0) * inner;
    C mean = 0;
    if (!rms) {
      if (active) {
        for (int64_t i = lane; i < inner; i += group) mean += Cast<C>(x[i]);
      }
      mean = GroupAllReduce(mean, group, shared, add) / static_cast<C>(inner);
    }
    C square_sum = 0;  // of deviations from the mean (layer_norm) or of values (rms_norm)
    if (active) {
      for (int64_t i = lane; i < inner; i += group) {
        const C deviation = Cast<C>(x[i]) - mean;
        square_sum += deviation * deviation;
      }
    }
    square_sum = GroupAllReduce(square_sum, group, shared, add);
    if (!active) continue;
    const C scale = C{1} / Sqrt(square_sum / static_cast<C>(inner) + static_cast<C>(eps));
    T* y = out + row * inner;
    for (int64_t i = lane; i < inner; i += group) {
      C value = (Cast<C>(x[i]) - mean) * scale;
      if (weight != nullptr) value *= Cast<C>(weight[i]);
      if (bias != nullptr) value += Cast<C>(bias[i]);
      y[i] = Cast<T>(value);
    }
  }
}

template <typename T>
cudaError_t LaunchSoftmaxOf(bool log, const void* in, void* out, int64_t outer, int64_t inner,
                            cudaStream_t stream) {
  if constexpr (!kIsFloating<T>) {
    return cudaErrorInvalidValue;  // registered for floating types only
  } else {
    const RowGroups groups = GroupsFor(inner);
    OROCHI_LAUNCH(SoftmaxKernel<T>, RowGrid(outer, groups), groups.block, stream, log,
                  static_cast<const T*>(in), static_cast<T*>(out), outer, inner, groups.group);
    return cudaGetLastError();
  }
}

template <typename T>
cudaError_t LaunchCumsumOf(const void* in, void* out, int64_t outer, int64_t inner,
                           cudaStream_t stream) {
  if constexpr (!kIsFloating<T> && !std::is_same_v<T, int64_t>) {
    return cudaErrorInvalidValue;  // registered for floating types and int64 only
  } else {
    constexpr int64_t kThreads = 128;
    const auto blocks =
        static_cast<unsigned>(std::min<int64_t>((outer + kThreads - 1) / kThreads, 65535));
    OROCHI_LAUNCH(CumsumKernel<T>, blocks, static_cast<unsigned>(kThreads), stream,
                  static_cast<const T*>(in), static_cast<T*>(out), outer, inner);
    return cudaGetLastError();
  }
}

template <typename T>
cudaError_t LaunchNormOf(bool rms, const void* in, const void* weight, const void* bias, double eps,
                         void* out, int64_t outer, int64_t inner, cudaStream_t stream) {
  if constexpr (!kIsFloating<T>) {
    return cudaErrorInvalidValue;  // registered for floating types only
  } else {
    const RowGroups groups = GroupsFor(inner);
    OROCHI_LAUNCH(NormKernel<T>, RowGrid(outer, groups), groups.block, stream, rms,
                  static_cast<const T*>(in), static_cast<const T*>(weight),
                  static_cast<const T*>(bias), eps, static_cast<T*>(out), outer, inner,
                  groups.group);
    return cudaGetLastError();
  }
}

}  // namespace

int64_t ReduceScratchBytes(int64_t outer, int64_t inner) {
  const int64_t chunks = ChunksFor(outer, inner);
  static_assert(sizeof(Partial<double>) == sizeof(Partial<int64_t>));
  return chunks == 1 ? 0 : outer * chunks * static_cast<int64_t>(sizeof(Partial<double>));
}

cudaError_t LaunchReduce(Op op, ScalarType in_type, const void* in, ScalarType out_type, void* out,
                         int64_t outer, int64_t inner, void* scratch, cudaStream_t stream) {
  if (outer == 0) return cudaSuccess;
  const bool out_int64 = out_type == ScalarType::kInt64;
  const int64_t chunks = ChunksFor(outer, inner);
  if (chunks > 1) {
    if (scratch == nullptr) return cudaErrorInvalidValue;
    OROCHI_CUDA_DISPATCH(in_type, T, {
      auto* partials = static_cast<Partial<Accumulator<T>>*>(scratch);
      OROCHI_LAUNCH(ReduceChunksKernel<T>, static_cast<unsigned>(outer * chunks), kSplitBlock,
                    stream, op, static_cast<const T*>(in), partials, inner, chunks);
      OROCHI_LAUNCH(CombineChunksKernel<T>, static_cast<unsigned>(outer), kSplitBlock, stream, op,
                    partials, chunks, out, out_int64, inner);
    });
    return cudaGetLastError();
  }
  const RowGroups groups = GroupsFor(inner);
  OROCHI_CUDA_DISPATCH(
      in_type, T,
      OROCHI_LAUNCH(ReduceKernel<T>, RowGrid(outer, groups), groups.block, stream, op,
                    static_cast<const T*>(in), out, out_int64, outer, inner, groups.group));
  return cudaGetLastError();
}

cudaError_t LaunchSoftmax(bool log, ScalarType type, const void* in, void* out, int64_t outer,
                          int64_t inner, cudaStream_t stream) {
  if (outer == 0 || inner == 0) return cudaSuccess;
  OROCHI_CUDA_DISPATCH(type, T, return LaunchSoftmaxOf<T>(log, in, out, outer, inner, stream));
  return cudaErrorInvalidValue;
}

cudaError_t LaunchCumsum(ScalarType type, const void* in, void* out, int64_t outer, int64_t inner,
                         cudaStream_t stream) {
  if (outer == 0 || inner == 0) return cudaSuccess;
  OROCHI_CUDA_DISPATCH(type, T, return LaunchCumsumOf<T>(in, out, outer, inner, stream));
  return cudaErrorInvalidValue;
}

cudaError_t LaunchNorm(bool rms, ScalarType type, const void* in, const void* weight,
                       const void* bias, double eps, void* out, int64_t outer, int64_t inner,
                       cudaStream_t stream) {
  if (outer == 0 || inner == 0) return cudaSuccess;
  OROCHI_CUDA_DISPATCH(
      type, T, return LaunchNormOf<T>(rms, in, weight, bias, eps, out, outer, inner, stream));
  return cudaErrorInvalidValue;
}

}  // namespace orochi::engine::cuda
