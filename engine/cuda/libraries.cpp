#include "libraries.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

#include "orochi/base/check.h"
#include "orochi/engine/error.h"

namespace orochi::engine::cuda {
namespace {

// Opens one library and resolves its symbols; the first failure is kept in error().
class LibraryLoader {
 public:
  explicit LibraryLoader(std::string name) : name_(std::move(name)) {
    handle_ = dlopen(name_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      handle_ = dlopen((OROCHI_CUDA_LIBRARY_DIR "/" + name_).c_str(), RTLD_NOW | RTLD_LOCAL);
    }
    if (handle_ == nullptr) {
      const char* error = dlerror();
      error_ = "cannot load " + name_ + ": " + (error != nullptr ? error : "unknown error");
    }
  }

  template <typename Function>
  void Resolve(Function& function, const char* symbol) {
    if (handle_ == nullptr) return;
    function = reinterpret_cast<std::remove_reference_t<Function>>(dlsym(handle_, symbol));
    if (function == nullptr && error_.empty()) error_ = name_ + " has no " + symbol;
  }

  const std::string& error() const { return error_; }

 private:
  std::string name_;
  void* handle_ = nullptr;
  std::string error_;
};

// The table of `library_name`, filled by `resolve` on the first call; later calls throw the
// first call's error, prefixed by `needed_for`.
template <typename Table>
const Table& LoadOnce(const std::string& library_name, const char* needed_for,
                      void (*resolve)(LibraryLoader& library, Table& table)) {
  struct Loaded {
    Table table;
    std::string error;
  };
  static const Loaded loaded = [&] {
    Loaded result;
    LibraryLoader library(library_name);
    resolve(library, result.table);
    result.error = library.error();
    return result;
  }();
  OROCHI_CHECK(loaded.error.empty(), StatusCode::kFailedPrecondition,
               needed_for << ": " << loaded.error);
  return loaded.table;
}

}  // namespace

const CublasLibrary& Cublas() {
  return LoadOnce<CublasLibrary>(
      "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR), "matmul on cuda needs cuBLAS",
      [](LibraryLoader& library, CublasLibrary& table) {
        library.Resolve(table.create, "cublasCreate_v2");
        library.Resolve(table.set_stream, "cublasSetStream_v2");
        library.Resolve(table.gemm_strided_batched, "cublasGemmStridedBatchedEx");
        library.Resolve(table.status_name, "cublasGetStatusName");
        library.Resolve(table.status_string, "cublasGetStatusString");
      });
}

const CudnnLibrary& Cudnn() {
  // libcudnn.so.9 is a thin front that loads cudnn_ops and cudnn_cnn itself, on first use.
  return LoadOnce<CudnnLibrary>(
      "libcudnn.so." + std::to_string(CUDNN_MAJOR), "conv2d on cuda needs cuDNN",
      [](LibraryLoader& library, CudnnLibrary& table) {
        library.Resolve(table.create, "cudnnCreate");
        library.Resolve(table.set_stream, "cudnnSetStream");
        library.Resolve(table.error_string, "cudnnGetErrorString");
        library.Resolve(table.create_tensor, "cudnnCreateTensorDescriptor");
        library.Resolve(table.set_tensor_4d, "cudnnSetTensor4dDescriptor");
        library.Resolve(table.destroy_tensor, "cudnnDestroyTensorDescriptor");
        library.Resolve(table.create_filter, "cudnnCreateFilterDescriptor");
        library.Resolve(table.set_filter_4d, "cudnnSetFilter4dDescriptor");
        library.Resolve(table.destroy_filter, "cudnnDestroyFilterDescriptor");
        library.Resolve(table.create_convolution, "cudnnCreateConvolutionDescriptor");
        library.Resolve(table.set_convolution_2d, "cudnnSetConvolution2dDescriptor");
        library.Resolve(table.set_group_count, "cudnnSetConvolutionGroupCount");
        library.Resolve(table.set_math_type, "cudnnSetConvolutionMathType");
        library.Resolve(table.destroy_convolution, "cudnnDestroyConvolutionDescriptor");
        library.Resolve(table.forward_algorithms, "cudnnGetConvolutionForwardAlgorithm_v7");
        library.Resolve(table.forward, "cudnnConvolutionForward");
      });
}

void ThrowCublasError(cublasStatus_t status, std::string_view what, int device) {
  const StatusCode code =
      status == CUBLAS_STATUS_ALLOC_FAILED ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  detail::Throw(code, std::string(what) + " failed on cuda:" + std::to_string(device) + ": " +
                          Cublas().status_name(status) + ": " + Cublas().status_string(status));
}

void ThrowCudnnError(cudnnStatus_t status, std::string_view what, int device) {
  const bool out_of_memory = status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                             status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;
  const StatusCode code = out_of_memory ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  detail::Throw(code, std::string(what) + " failed on cuda:" + std::to_string(device) + ": " +
                          Cudnn().error_string(status));
}

}  // namespace orochi::engine::cuda
