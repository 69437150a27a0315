// The NVIDIA libraries loaded with dlopen on first use, not linked: cuBLAS (first GPU matmul) and
// cuDNN (first GPU convolution). They are large (libcublasLt alone is half a gigabyte), and a
// process that never multiplies or convolves on a GPU should not map them.
//
// Each is looked up through this library's RUNPATH and the system's paths, else in the toolkit
// Orochi was built with. The tables are filled once per process and read-only after; every
// function here is thread-safe.
#pragma once

#include <cublas_v2.h>
#include <cudnn.h>

#include <string_view>

namespace orochi::engine::cuda {

struct CublasLibrary {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  // (C++ overloads the name with a 64-bit variant, so the C signature is spelled out.)
  cublasStatus_t (*gemm_strided_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                         int, int, const void*, const void*, cudaDataType, int,
                                         long long, const void*, cudaDataType, int, long long,
                                         const void*, void*, cudaDataType, int, long long, int,
                                         cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};
// Throws Error (kFailedPrecondition) "matmul on cuda needs cuBLAS: ..." naming the library if it
// cannot be loaded.
const CublasLibrary& Cublas();

// The legacy convolution API (cudnn_cnn.h), which cuDNN 9 still ships: one call per convolution,
// with algorithms chosen by cuDNN's heuristics as PyTorch does by default.
struct CudnnLibrary {
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnGetErrorString) error_string = nullptr;
  decltype(&cudnnCreateTensorDescriptor) create_tensor = nullptr;
  decltype(&cudnnSetTensor4dDescriptor) set_tensor_4d = nullptr;
  decltype(&cudnnDestroyTensorDescriptor) destroy_tensor = nullptr;
  decltype(&cudnnCreateFilterDescriptor) create_filter = nullptr;
  decltype(&cudnnSetFilter4dDescriptor) set_filter_4d = nullptr;
  decltype(&cudnnDestroyFilterDescriptor) destroy_filter = nullptr;
  decltype(&cudnnCreateConvolutionDescriptor) create_convolution = nullptr;
  decltype(&cudnnSetConvolution2dDescriptor) set_convolution_2d = nullptr;
  decltype(&cudnnSetConvolutionGroupCount) set_group_count = nullptr;
  decltype(&cudnnSetConvolutionMathType) set_math_type = nullptr;
  decltype(&cudnnDestroyConvolutionDescriptor) destroy_convolution = nullptr;
  decltype(&cudnnGetConvolutionForwardAlgorithm_v7) forward_algorithms = nullptr;
  decltype(&cudnnConvolutionForward) forward = nullptr;
};
// Throws Error (kFailedPrecondition) "conv2d on cuda needs cuDNN: ..." if it cannot be loaded.
const CudnnLibrary& Cudnn();

// Throw Error (kInternal) naming `what`, the device and the library's own description.
[[noreturn]] void ThrowCublasError(cublasStatus_t status, std::string_view what, int device);
inline void CheckCublas(cublasStatus_t status, std::string_view what, int device) {
  if (status != CUBLAS_STATUS_SUCCESS) [[unlikely]] {
    ThrowCublasError(status, what, device);
  }
}
[[noreturn]] void ThrowCudnnError(cudnnStatus_t status, std::string_view what, int device);
inline void CheckCudnn(cudnnStatus_t status, std::string_view what, int device) {
  if (status != CUDNN_STATUS_SUCCESS) [[unlikely]] {
    ThrowCudnnError(status, what, device);
  }
}

}  // namespace orochi::engine::cuda
