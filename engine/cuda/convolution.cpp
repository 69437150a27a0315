// conv2d on CUDA. The floating dtypes go to cuDNN, with the algorithm chosen once per shape by
// cuDNN's heuristics (as PyTorch does unless torch.backends.cudnn.benchmark is set); the integer
// dtypes, and any case for which cuDNN offers no algorithm, go through the im2col and matmul
// kernels, as on the CPU.
#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "dispatch.h"
#include "orochi/base/check.h"
#include "orochi/engine/device.h"
#include "runtime.h"

namespace orochi::engine::cuda {
namespace {

// The most workspace an algorithm may ask for: faster algorithms that need more are passed over
// rather than risk running a model out of memory.
constexpr size_t kMaxWorkspaceBytes = size_t{1} << 30;

cudnnDataType_t CudnnDataType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return CUDNN_DATA_HALF;
    case DType::kBFloat16:
      return CUDNN_DATA_BFLOAT16;
    case DType::kFloat64:
      return CUDNN_DATA_DOUBLE;
    default:
      return CUDNN_DATA_FLOAT;
  }
}

// float32 uses TF32 tensor cores only where allowed (AllowTf32, one switch with matmul); the
// half types always use tensor cores, accumulating in float32.
cudnnMathType_t RequestedMath(DType dtype, bool allow_tf32) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return CUDNN_TENSOR_OP_MATH;
    case DType::kFloat32:
      return allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    default:
      return CUDNN_DEFAULT_MATH;
  }
}

// Host-side descriptions of one convolution, destroyed with the object.
class ConvolutionDescriptors {
 public:
  ConvolutionDescriptors(const Tensor& input, const Tensor& weight, const ConvGeometry& geometry,
                         const Tensor& output, cudnnMathType_t math, int device)
      : cudnn_(Cudnn()) {
    try {
      Describe(input, weight, geometry, output, math, device);
    } catch (...) {
      Destroy();  // the destructor does not run for a constructor that throws
      throw;
    }
  }
  ~ConvolutionDescriptors() { Destroy(); }
  ConvolutionDescriptors(const ConvolutionDescriptors&) = delete;
  ConvolutionDescriptors& operator=(const ConvolutionDescriptors&) = delete;

  cudnnTensorDescriptor_t input() const { return input_; }
  cudnnTensorDescriptor_t output() const { return output_; }
  cudnnFilterDescriptor_t filter() const { return filter_; }
  cudnnConvolutionDescriptor_t convolution() const { return convolution_; }

 private:
  void Describe(const Tensor& input, const Tensor& weight, const ConvGeometry& geometry,
                const Tensor& output, cudnnMathType_t math, int device) {
    const cudnnDataType_t data = CudnnDataType(input.dtype());
    const cudnnDataType_t compute =
        input.dtype() == DType::kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    auto dim = [](const Tensor& tensor, int i) { return static_cast<int>(tensor.shape()[i]); };
    auto at = [](int64_t value) { return static_cast<int>(value); };
    CheckCudnn(cudnn_.create_tensor(&input_), "creating a cuDNN descriptor", device);
    CheckCudnn(cudnn_.create_tensor(&output_), "creating a cuDNN descriptor", device);
    CheckCudnn(cudnn_.create_filter(&filter_), "creating a cuDNN descriptor", device);
    CheckCudnn(cudnn_.create_convolution(&convolution_), "creating a cuDNN descriptor", device);
    CheckCudnn(cudnn_.set_tensor_4d(input_, CUDNN_TENSOR_NCHW, data, dim(input, 0), dim(input, 1),
                                    dim(input, 2), dim(input, 3)),
               "describing the conv2d input to cuDNN", device);
    CheckCudnn(cudnn_.set_tensor_4d(output_, CUDNN_TENSOR_NCHW, data, dim(output, 0),
                                    dim(output, 1), dim(output, 2), dim(output, 3)),
               "describing the conv2d output to cuDNN", device);
    CheckCudnn(cudnn_.set_filter_4d(filter_, data, CUDNN_TENSOR_NCHW, dim(weight, 0),
                                    dim(weight, 1), dim(weight, 2), dim(weight, 3)),
               "describing the conv2d weight to cuDNN", device);
    CheckCudnn(cudnn_.set_convolution_2d(
                   convolution_, at(geometry.padding[0]), at(geometry.padding[1]),
                   at(geometry.stride[0]), at(geometry.stride[1]), at(geometry.dilation[0]),
                   at(geometry.dilation[1]), CUDNN_CROSS_CORRELATION, compute),
               "describing the convolution to cuDNN", device);
    CheckCudnn(cudnn_.set_group_count(convolution_, at(geometry.groups)),
               "describing the convolution to cuDNN", device);
    CheckCudnn(cudnn_.set_math_type(convolution_, math), "describing the convolution to cuDNN",
               device);
  }
  void Destroy() noexcept {
    if (convolution_ != nullptr) cudnn_.destroy_convolution(convolution_);
    if (filter_ != nullptr) cudnn_.destroy_filter(filter_);
    if (output_ != nullptr) cudnn_.destroy_tensor(output_);
    if (input_ != nullptr) cudnn_.destroy_tensor(input_);
  }

  const CudnnLibrary& cudnn_;
  cudnnTensorDescriptor_t input_ = nullptr;
  cudnnTensorDescriptor_t output_ = nullptr;
  cudnnFilterDescriptor_t filter_ = nullptr;
  cudnnConvolutionDescriptor_t convolution_ = nullptr;
};

// An algorithm cuDNN's heuristics offered for one shape, with what it needs.
struct Candidate {
  cudnnConvolutionFwdAlgo_t algorithm;
  cudnnMathType_t math;
  size_t workspace_bytes;
};
// The usable candidates, best first; empty when cuDNN offered nothing that runs.
using ConvolutionPlan = std::vector<Candidate>;

using PlanKey = std::tuple<int, DType, bool, Shape, Shape, std::array<int64_t, 7>>;

ConvolutionPlan ChoosePlan(const ConvolutionDescriptors& descriptors, DType dtype, bool allow_tf32,
                           int device) {
  constexpr int kRequested = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  cudnnConvolutionFwdAlgoPerf_t offered[kRequested] = {};
  int returned = 0;
  CheckCudnn(Cudnn().forward_algorithms(CurrentCudnn(device), descriptors.input(),
                                        descriptors.filter(), descriptors.convolution(),
                                        descriptors.output(), kRequested, &returned, offered),
             "choosing a cuDNN convolution algorithm", device);
  const bool float32 = dtype == DType::kFloat32;
  ConvolutionPlan plan;
  for (int i = 0; i < returned; ++i) {
    const cudnnConvolutionFwdAlgoPerf_t& candidate = offered[i];
    // float32 never down-converts to float16, and uses tensor cores (TF32) only when allowed.
    const bool converts = candidate.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    const bool tensor_cores = candidate.mathType == CUDNN_TENSOR_OP_MATH || converts;
    if (candidate.status != CUDNN_STATUS_SUCCESS || candidate.memory > kMaxWorkspaceBytes ||
        (float32 && converts) || (float32 && tensor_cores && !allow_tf32)) {
      continue;
    }
    const cudnnMathType_t math = float32 && !allow_tf32 ? CUDNN_FMA_MATH : candidate.mathType;
    plan.push_back({candidate.algo, math, candidate.memory});
  }
  return plan;
}

bool IsOutOfMemory(cudnnStatus_t status) {
  return status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
         status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;
}
// CUDNN_STATUS_NOT_SUPPORTED and its refinements (3000-3999): this algorithm cannot run this
// call (an operand's alignment, say); another one may.
bool IsNotSupported(cudnnStatus_t status) {
  return status >= CUDNN_STATUS_NOT_SUPPORTED && status < CUDNN_STATUS_NOT_SUPPORTED + 1000;
}

// Plans by shape, shared by every thread: choosing costs a heuristics query, running does not.
class PlanCache {
 public:
  static PlanCache& Instance() {
    static auto* cache = new PlanCache;  // never destroyed: used until the process exits
    return *cache;
  }

  ConvolutionPlan Find(const PlanKey& key, const ConvolutionDescriptors& descriptors, DType dtype,
                       bool allow_tf32, int device) {
    {
      std::lock_guard lock(mutex_);
      auto found = plans_.find(key);
      if (found != plans_.end()) return found->second;
    }
    // Chosen outside the lock; two threads that race choose the same plan.
    ConvolutionPlan plan = ChoosePlan(descriptors, dtype, allow_tf32, device);
    std::lock_guard lock(mutex_);
    plans_.emplace(key, plan);
    return plan;
  }

 private:
  std::mutex mutex_;
  std::map<PlanKey, ConvolutionPlan> plans_;
};

void CheckSizes(const Tensor& input, const Tensor& weight, const Tensor& output) {
  for (const Tensor* tensor : {&input, &weight, &output}) {
    OROCHI_CHECK(tensor->numel() <= INT_MAX, StatusCode::kUnimplemented,
                 "conv2d on cuda: cuDNN takes tensors of up to 2^31 - 1 elements, got "
                     << ShapeString(tensor->shape()) << " (split the batch)");
  }
}

}  // namespace

// The CUDA conv2d kernel (registered in kernels.cpp).
void CudaConv2d(const Tensor& input, const Tensor& weight, const ConvGeometry& geometry,
                Tensor& output) {
  if (output.numel() == 0) return;
  const DType dtype = input.dtype();
  // cuDNN refuses empty operands (no input channels, an empty padded image), which are valid.
  if (!IsFloating(dtype) || input.numel() == 0 || weight.numel() == 0) {
    Conv2dThroughIm2col(input, weight, geometry, output);
    return;
  }
  CheckSizes(input, weight, output);
  StreamScope scope(output, {&input, &weight});
  const int device = scope.device();
  const bool allow_tf32 = AllowTf32();
  ConvolutionDescriptors descriptors(input, weight, geometry, output,
                                     RequestedMath(dtype, allow_tf32), device);
  const PlanKey key{
      device,
      dtype,
      allow_tf32 && dtype == DType::kFloat32,
      input.shape(),
      weight.shape(),
      {geometry.stride[0], geometry.stride[1], geometry.padding[0], geometry.padding[1],
       geometry.dilation[0], geometry.dilation[1], geometry.groups}};
  const ConvolutionPlan plan =
      PlanCache::Instance().Find(key, descriptors, dtype, allow_tf32, device);
  const CudnnLibrary& cudnn = Cudnn();
  // cuDNN scales by float, except for double data.
  const float one = 1.0F;
  const float zero = 0.0F;
  const double one_double = 1.0;
  const double zero_double = 0.0;
  const bool double_scalars = dtype == DType::kFloat64;
  // Best first; an algorithm whose workspace does not fit, or that refuses this call, gives way
  // to the next, and im2col + matmul runs when none does (as PyTorch tries its next algorithm).
  for (const Candidate& candidate : plan) {
    Tensor workspace;
    if (candidate.workspace_bytes > 0) {
      try {
        workspace = Tensor::Empty({static_cast<int64_t>(candidate.workspace_bytes)}, DType::kUInt8,
                                  input.device());
      } catch (const Error& error) {
        if (error.status().code() != StatusCode::kResourceExhausted) throw;
        continue;
      }
    }
    CheckCudnn(cudnn.set_math_type(descriptors.convolution(), candidate.math),
               "describing the convolution to cuDNN", device);
    const cudnnStatus_t status = cudnn.forward(
        CurrentCudnn(device), double_scalars ? static_cast<const void*>(&one_double) : &one,
        descriptors.input(), input.data(), descriptors.filter(), weight.data(),
        descriptors.convolution(), candidate.algorithm,
        workspace.defined() ? workspace.mutable_data() : nullptr, candidate.workspace_bytes,
        double_scalars ? static_cast<const void*>(&zero_double) : &zero, descriptors.output(),
        output.mutable_data());
    if (status == CUDNN_STATUS_SUCCESS) return;
    if (!IsOutOfMemory(status) && !IsNotSupported(status)) {
      ThrowCudnnError(status,
                      "conv2d (cudnnConvolutionForward, " + std::string(DTypeName(dtype)) + ")",
                      device);
    }
  }
  Conv2dThroughIm2col(input, weight, geometry, output);
}

}  // namespace orochi::engine::cuda
