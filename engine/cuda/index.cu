// CUDA kernels that move elements by position: index_select, im2col and sort; and the integer
// matmul that cuBLAS does not provide.
#include "device_common.cuh"

namespace orochi::engine::cuda {
namespace {

// --- index_select and im2col ---------------------------------------------------------------------

template <typename T>
__global__ void IndexSelectKernel(const T* in, const int64_t* index, T* out, int64_t size,
                                  int64_t inner, int64_t count, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t k = i % inner;
    const int64_t row = i / inner;  // o * count + n
    const int64_t n = row % count;
    const int64_t o = row / count;
    out[i] = in[(o * size + index[n]) * inner + k];
  }
}

template <typename T>
__global__ void Im2colKernel(const T* in, T* out, Im2colParams p, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const T pad = static_cast<T>(p.pad_pattern);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    // out is [plane, ky, kx, oy, ox]
    int64_t rest = i;
    const int64_t ox = rest % p.out_width;
    rest /= p.out_width;
    const int64_t oy = rest % p.out_height;
    rest /= p.out_height;
    const int64_t kx = rest % p.kernel[1];
    rest /= p.kernel[1];
    const int64_t ky = rest % p.kernel[0];
    const int64_t plane = rest / p.kernel[0];
    const int64_t y = oy * p.stride[0] - p.padding[0] + ky * p.dilation[0];
    const int64_t x = ox * p.stride[1] - p.padding[1] + kx * p.dilation[1];
    out[i] = y >= 0 && y < p.height && x >= 0 && x < p.width
                 ? in[(plane * p.height + y) * p.width + x]
                 : pad;
  }
}

// --- sort ----------------------------------------------------------------------------------------
// Rows are sorted as (key, position) pairs, where the key is the value mapped to an unsigned
// integer of the same order and the position breaks ties: that makes the (unstable) bitonic
// network stable, as the CPU's std::stable_sort. Padding sorts last (the largest key, positions
// past the row).

template <typename T>
__device__ __forceinline__ uint64_t OrderedKey(T value) {
  if constexpr (kIsFloating<T>) {
    double x = Cast<double>(value);   // exact for every floating type
    if (x != x) return ~uint64_t{0};  // every NaN is the largest value, and equal to the others
    if (x == 0.0) x = 0.0;            // -0.0 == 0.0, as the CPU's comparison says
    const auto bits = static_cast<uint64_t>(__double_as_longlong(x));
    // Negative numbers order backwards in their bits; flipping all of them fixes that, and
    // setting the sign bit of the others puts them above.
    return (bits >> 63) != 0 ? ~bits : bits | (uint64_t{1} << 63);
  } else if constexpr (std::is_unsigned_v<T> || std::is_same_v<T, bool>) {
    return static_cast<uint64_t>(value);
  } else {
    return static_cast<uint64_t>(static_cast<int64_t>(value)) ^ (uint64_t{1} << 63);
  }
}

constexpr uint64_t kPaddingKey = ~uint64_t{0};
constexpr int kSharedSortItems = 2048;  // 20 KiB of keys and positions per block

template <typename T>
__global__ void SortKeysKernel(const T* in, bool descending, uint64_t* keys, int32_t* positions,
                               int64_t inner, int64_t padded, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t row = i / padded;
    const int64_t column = i % padded;
    if (column < inner) {
      const uint64_t key = OrderedKey(in[row * inner + column]);
      keys[i] = descending ? ~key : key;
    } else {
      keys[i] = kPaddingKey;
    }
    positions[i] = static_cast<int32_t>(column);
  }
}

__device__ __forceinline__ bool PairLess(uint64_t key_a, int32_t position_a, uint64_t key_b,
                                         int32_t position_b) {
  return key_a < key_b || (key_a == key_b && position_a < position_b);
}

// One bitonic compare-and-swap of elements i and i ^ j within sequences of length k.
__device__ __forceinline__ void CompareSwap(uint64_t* keys, int32_t* positions, int64_t i,
                                            int64_t partner, int64_t k) {
  const bool ascending = (i & k) == 0;
  const bool out_of_order = PairLess(keys[partner], positions[partner], keys[i], positions[i]);
  if (out_of_order == ascending) {
    const uint64_t key = keys[i];
    keys[i] = keys[partner];
    keys[partner] = key;
    const int32_t position = positions[i];
    positions[i] = positions[partner];
    positions[partner] = position;
  }
}

// A whole row (padded <= kSharedSortItems) per block, in shared memory.
__global__ void SortRowsInSharedKernel(uint64_t* keys, int32_t* positions, int64_t padded) {
  __shared__ uint64_t row_keys[kSharedSortItems];
  __shared__ int32_t row_positions[kSharedSortItems];
  uint64_t* global_keys = keys + static_cast<int64_t>(blockIdx.x) * padded;
  int32_t* global_positions = positions + static_cast<int64_t>(blockIdx.x) * padded;
  for (int64_t i = threadIdx.x; i < padded; i += blockDim.x) {
    row_keys[i] = global_keys[i];
    row_positions[i] = global_positions[i];
  }
  __syncthreads();
  for (int64_t k = 2; k <= padded; k *= 2) {
    for (int64_t j = k / 2; j > 0; j /= 2) {
      for (int64_t i = threadIdx.x; i < padded; i += blockDim.x) {
        const int64_t partner = i ^ j;
        if (partner > i) CompareSwap(row_keys, row_positions, i, partner, k);
      }
      __syncthreads();
    }
  }
  for (int64_t i = threadIdx.x; i < padded; i += blockDim.x) {
    global_keys[i] = row_keys[i];
    global_positions[i] = row_positions[i];
  }
}

// One (k, j) step of the network over every row, in global memory (long rows).
__global__ void SortStepKernel(uint64_t* keys, int32_t* positions, int64_t padded, int64_t k,
                               int64_t j, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t pair = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; pair < total;
       pair += stride) {
    // pair -> the lower element i of a pair (bit j of i clear), within its row.
    const int64_t row = pair / (padded / 2);
    const int64_t q = pair % (padded / 2);
    const int64_t i = (q / j) * 2 * j + q % j;
    CompareSwap(keys + row * padded, positions + row * padded, i, i + j, k);
  }
}

template <typename T>
__global__ void SortGatherKernel(const T* in, const int32_t* positions, T* values, int64_t* indices,
                                 int64_t inner, int64_t padded, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t row = i / inner;
    const int32_t position = positions[row * padded + i % inner];
    values[i] = in[row * inner + position];
    indices[i] = position;
  }
}

// --- integer matmul ------------------------------------------------------------------------------

template <typename T>
__global__ void IntegerMatmulKernel(const T* a, const T* b, T* out, MatmulShape s, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t column = i % s.n;
    const int64_t row = (i / s.n) % s.m;
    const int64_t batch = i / (s.m * s.n);
    const T* x = a + batch * s.a_strides[0] + row * s.a_strides[1];
    const T* y = b + batch * s.b_strides[0] + column * s.b_strides[2];
    if constexpr (std::is_same_v<T, bool>) {
      bool total_value = false;
      for (int64_t inner = 0; inner < s.k && !total_value; ++inner) {
        total_value = x[inner * s.a_strides[2]] && y[inner * s.b_strides[1]];
      }
      out[i] = total_value;
    } else {
      int64_t total_value = 0;
      for (int64_t inner = 0; inner < s.k; ++inner) {
        total_value += static_cast<int64_t>(x[inner * s.a_strides[2]]) *
                       static_cast<int64_t>(y[inner * s.b_strides[1]]);
      }
      out[i] = static_cast<T>(total_value);
    }
  }
}

template <typename T>
cudaError_t LaunchSortKeysOf(const void* in, bool descending, uint64_t* keys, int32_t* positions,
                             int64_t inner, int64_t padded, int64_t total, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, bool>) {
    return cudaErrorInvalidValue;  // not registered, as on the CPU
  } else {
    OROCHI_LAUNCH(SortKeysKernel<T>, GridFor(total), kBlockSize, stream, static_cast<const T*>(in),
                  descending, keys, positions, inner, padded, total);
    return cudaGetLastError();
  }
}

template <typename T>
cudaError_t LaunchIntegerMatmulOf(const void* a, const void* b, void* out, const MatmulShape& shape,
                                  int64_t total, cudaStream_t stream) {
  if constexpr (kIsFloating<T>) {
    return cudaErrorInvalidValue;  // floating types go to cuBLAS
  } else {
    OROCHI_LAUNCH(IntegerMatmulKernel<T>, GridFor(total), kBlockSize, stream,
                  static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), shape,
                  total);
    return cudaGetLastError();
  }
}

}  // namespace

cudaError_t LaunchIndexSelect(int item_size, const void* in, const int64_t* index, void* out,
                              int64_t outer, int64_t size, int64_t inner, int64_t count,
                              cudaStream_t stream) {
  const int64_t total = outer * count * inner;
  if (total == 0) return cudaSuccess;
  OROCHI_CUDA_DISPATCH_SIZE(item_size, T,
                            OROCHI_LAUNCH(IndexSelectKernel<T>, GridFor(total), kBlockSize, stream,
                                          static_cast<const T*>(in), index, static_cast<T*>(out),
                                          size, inner, count, total));
  return cudaGetLastError();
}

cudaError_t LaunchIm2col(int item_size, const void* in, void* out, const Im2colParams& params,
                         cudaStream_t stream) {
  const int64_t total =
      params.planes * params.kernel[0] * params.kernel[1] * params.out_height * params.out_width;
  if (total == 0) return cudaSuccess;
  OROCHI_CUDA_DISPATCH_SIZE(
      item_size, T,
      OROCHI_LAUNCH(Im2colKernel<T>, GridFor(total), kBlockSize, stream, static_cast<const T*>(in),
                    static_cast<T*>(out), params, total));
  return cudaGetLastError();
}

cudaError_t LaunchSortKeys(ScalarType type, const void* in, bool descending, uint64_t* keys,
                           int32_t* positions, int64_t outer, int64_t inner, int64_t padded,
                           cudaStream_t stream) {
  const int64_t total = outer * padded;
  if (total == 0) return cudaSuccess;
  OROCHI_CUDA_DISPATCH(
      type, T,
      return LaunchSortKeysOf<T>(in, descending, keys, positions, inner, padded, total, stream));
  return cudaErrorInvalidValue;
}

cudaError_t LaunchSortRows(uint64_t* keys, int32_t* positions, int64_t outer, int64_t padded,
                           cudaStream_t stream) {
  if (outer == 0 || padded < 2) return cudaSuccess;
  if (padded <= kSharedSortItems) {
    // One block per row; the grid's x dimension takes up to 2^31 - 1 blocks.
    if (outer > INT32_MAX) return cudaErrorInvalidConfiguration;
    const int threads = padded < 1024 ? static_cast<int>(padded) : 1024;
    OROCHI_LAUNCH(SortRowsInSharedKernel, static_cast<unsigned>(outer), threads, stream, keys,
                  positions, padded);
    return cudaGetLastError();
  }
  const int64_t pairs = outer * (padded / 2);
  for (int64_t k = 2; k <= padded; k *= 2) {
    for (int64_t j = k / 2; j > 0; j /= 2) {
      OROCHI_LAUNCH(SortStepKernel, GridFor(pairs), kBlockSize, stream, keys, positions, padded, k,
                    j, pairs);
      if (cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
    }
  }
  return cudaSuccess;
}

cudaError_t LaunchSortGather(int item_size, const void* in, const int32_t* positions, void* values,
                             int64_t* indices, int64_t outer, int64_t inner, int64_t padded,
                             cudaStream_t stream) {
  const int64_t total = outer * inner;
  if (total == 0) return cudaSuccess;
  OROCHI_CUDA_DISPATCH_SIZE(item_size, T,
                            OROCHI_LAUNCH(SortGatherKernel<T>, GridFor(total), kBlockSize, stream,
                                          static_cast<const T*>(in), positions,
                                          static_cast<T*>(values), indices, inner, padded, total));
  return cudaGetLastError();
}

cudaError_t LaunchIntegerMatmul(ScalarType type, const void* a, const void* b, void* out,
                                const MatmulShape& shape, cudaStream_t stream) {
  const int64_t total = shape.batch * shape.m * shape.n;
  if (total == 0) return cudaSuccess;
  OROCHI_CUDA_DISPATCH(type, T, return LaunchIntegerMatmulOf<T>(a, b, out, shape, total, stream));
  return cudaErrorInvalidValue;
}

}  // namespace orochi::engine::cuda
