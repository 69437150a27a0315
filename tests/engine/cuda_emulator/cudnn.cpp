// A stand-in for the part of cuDNN's legacy convolution API the backend uses (libcudnn.so.N next
// to the emulated backend): descriptors with cuDNN's checks, NCHW cross-correlation with
// padding, stride, dilation and groups computed on the host, and heuristics that offer what the
// backend must sort through:
//
//   1. an algorithm that wants more workspace than the backend allows (it must be passed over),
//   2. for float32, one that down-converts to float16 (it must be refused: results would be off
//      by float16's rounding, which the float32 tolerance catches),
//   3. one that refuses the call when run (CUDNN_STATUS_NOT_SUPPORTED: the next must be tried),
//   4. one that needs a small workspace and computes the convolution.
//
// Math types are honoured as cuDNN does for float data: CUDNN_FMA_MATH computes in float32,
// CUDNN_DEFAULT_MATH and CUDNN_TENSOR_OP_MATH may round inputs to TF32, and ALLOW_CONVERSION to
// float16.
#include <cudnn.h>

#include <cstdint>

#include "elements.h"
#include "emulator.h"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};

// A tensor or filter description: NCHW sizes (for a filter, n is the output channel count,
// cuDNN's k).
struct Described4d {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
};
struct cudnnTensorStruct : Described4d {};
struct cudnnFilterStruct : Described4d {};

struct cudnnConvolutionStruct {
  bool set = false;
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  int groups = 1;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace {

constexpr size_t kOversizedWorkspace = size_t{8} << 30;
constexpr size_t kWorkingWorkspace = size_t{4} << 10;
constexpr cudnnConvolutionFwdAlgo_t kOversized = CUDNN_CONVOLUTION_FWD_ALGO_FFT;
constexpr cudnnConvolutionFwdAlgo_t kConverting = CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
constexpr cudnnConvolutionFwdAlgo_t kRefusing = CUDNN_CONVOLUTION_FWD_ALGO_GEMM;
constexpr cudnnConvolutionFwdAlgo_t kWorking = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;

namespace emulator = orochi::cuda_emulator;
using emulator::Element;

bool SupportedData(cudnnDataType_t type) {
  return type == CUDNN_DATA_HALF || type == CUDNN_DATA_BFLOAT16 || type == CUDNN_DATA_FLOAT ||
         type == CUDNN_DATA_DOUBLE;
}

Element ElementOf(cudnnDataType_t type) {
  switch (type) {
    case CUDNN_DATA_HALF:
      return Element::kHalf;
    case CUDNN_DATA_BFLOAT16:
      return Element::kBFloat16;
    case CUDNN_DATA_FLOAT:
      return Element::kFloat;
    default:
      return Element::kDouble;
  }
}

// How float data is rounded before it is multiplied, under `math`.
double RoundInput(double value, cudnnDataType_t type, cudnnMathType_t math) {
  if (type != CUDNN_DATA_FLOAT) return value;
  switch (math) {
    case CUDNN_FMA_MATH:
      return value;
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      return emulator::RoundToHalf(value);
    default:
      return emulator::RoundToTf32(value);
  }
}

cudnnStatus_t Describe4d(Described4d& description, cudnnTensorFormat_t format, cudnnDataType_t type,
                         int n, int c, int h, int w) {
  if (format != CUDNN_TENSOR_NCHW || !SupportedData(type)) return CUDNN_STATUS_NOT_SUPPORTED;
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
  description = {true, type, n, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

int OutputSize(int input, int pad, int filter, int dilation, int stride) {
  return (input + 2 * pad - dilation * (filter - 1) - 1) / stride + 1;
}

// CUDNN_STATUS_BAD_PARAM unless the four descriptions fit together.
cudnnStatus_t CheckShapes(const cudnnTensorStruct& x, const cudnnFilterStruct& w,
                          const cudnnConvolutionStruct& conv, const cudnnTensorStruct& y) {
  if (!x.set || !w.set || !conv.set || !y.set) return CUDNN_STATUS_BAD_PARAM;
  if (x.type != w.type || x.type != y.type) return CUDNN_STATUS_BAD_PARAM;
  if ((x.type == CUDNN_DATA_DOUBLE) != (conv.compute == CUDNN_DATA_DOUBLE)) {
    return CUDNN_STATUS_NOT_SUPPORTED;
  }
  if (x.c != w.c * conv.groups || w.n % conv.groups != 0) return CUDNN_STATUS_BAD_PARAM;
  const int out_h = OutputSize(x.h, conv.pad_h, w.h, conv.dilation_h, conv.stride_h);
  const int out_w = OutputSize(x.w, conv.pad_w, w.w, conv.dilation_w, conv.stride_w);
  if (out_h <= 0 || out_w <= 0) return CUDNN_STATUS_BAD_PARAM;
  if (y.n != x.n || y.c != w.n || y.h != out_h || y.w != out_w) return CUDNN_STATUS_BAD_PARAM;
  return CUDNN_STATUS_SUCCESS;
}

size_t Bytes(const cudnnTensorStruct& t) {
  return static_cast<size_t>(t.n) * t.c * t.h * t.w * emulator::ElementSize(ElementOf(t.type));
}

}  // namespace

extern "C" {

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  *handle = new cudnnContext;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED";
    default:
      return "CUDNN_STATUS_INTERNAL_ERROR";
  }
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* descriptor) {
  *descriptor = new cudnnTensorStruct;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t descriptor,
                                         cudnnTensorFormat_t format, cudnnDataType_t type, int n,
                                         int c, int h, int w) {
  return Describe4d(*descriptor, format, type, n, c, h, w);
}

cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t descriptor) {
  delete descriptor;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* descriptor) {
  *descriptor = new cudnnFilterStruct;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t descriptor, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  return Describe4d(*descriptor, format, type, k, c, h, w);
}

cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t descriptor) {
  delete descriptor;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* descriptor) {
  *descriptor = new cudnnConvolutionStruct;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t descriptor, int pad_h,
                                              int pad_w, int stride_h, int stride_w, int dilation_h,
                                              int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute) {
  if (pad_h < 0 || pad_w < 0 || stride_h <= 0 || stride_w <= 0 || dilation_h <= 0 ||
      dilation_w <= 0) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  if (mode != CUDNN_CROSS_CORRELATION) return CUDNN_STATUS_NOT_SUPPORTED;  // not emulated
  descriptor->set = true;
  descriptor->pad_h = pad_h;
  descriptor->pad_w = pad_w;
  descriptor->stride_h = stride_h;
  descriptor->stride_w = stride_w;
  descriptor->dilation_h = dilation_h;
  descriptor->dilation_w = dilation_w;
  descriptor->compute = compute;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t descriptor, int groups) {
  if (groups < 1) return CUDNN_STATUS_BAD_PARAM;
  descriptor->groups = groups;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t descriptor,
                                          cudnnMathType_t math) {
  descriptor->math = math;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t descriptor) {
  delete descriptor;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t /*handle*/, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
    cudnnConvolutionDescriptor_t convolution, cudnnTensorDescriptor_t y, int requested,
    int* returned, cudnnConvolutionFwdAlgoPerf_t* results) {
  if (requested < 1) return CUDNN_STATUS_BAD_PARAM;
  if (cudnnStatus_t status = CheckShapes(*x, *w, *convolution, *y);
      status != CUDNN_STATUS_SUCCESS) {
    return status;
  }
  const cudnnMathType_t math = convolution->math;
  cudnnConvolutionFwdAlgoPerf_t offered[4] = {};
  int count = 0;
  offered[count++] = {
      kOversized, CUDNN_STATUS_SUCCESS, 0.1F, kOversizedWorkspace, CUDNN_DETERMINISTIC, math, {}};
  if (x->type == CUDNN_DATA_FLOAT) {
    offered[count++] = {kConverting,
                        CUDNN_STATUS_SUCCESS,
                        0.2F,
                        kWorkingWorkspace,
                        CUDNN_DETERMINISTIC,
                        CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
                        {}};
  }
  offered[count++] = {kRefusing, CUDNN_STATUS_SUCCESS, 0.3F, 0, CUDNN_DETERMINISTIC, math, {}};
  offered[count++] = {
      kWorking, CUDNN_STATUS_SUCCESS, 0.4F, kWorkingWorkspace, CUDNN_DETERMINISTIC, math, {}};
  *returned = count < requested ? count : requested;
  for (int i = 0; i < *returned; ++i) results[i] = offered[i];
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                      cudnnTensorDescriptor_t x_description, const void* x,
                                      cudnnFilterDescriptor_t w_description, const void* w,
                                      cudnnConvolutionDescriptor_t convolution,
                                      cudnnConvolutionFwdAlgo_t algorithm, void* workspace,
                                      size_t workspace_bytes, const void* beta,
                                      cudnnTensorDescriptor_t y_description, void* y) {
  namespace emulator = orochi::cuda_emulator;
  if (cudnnStatus_t status =
          CheckShapes(*x_description, *w_description, *convolution, *y_description);
      status != CUDNN_STATUS_SUCCESS) {
    return status;
  }
  if (algorithm == kRefusing) return CUDNN_STATUS_NOT_SUPPORTED;
  const size_t needed = algorithm == kOversized ? kOversizedWorkspace : kWorkingWorkspace;
  if (workspace_bytes < needed ||
      (workspace_bytes > 0 &&
       !emulator::IsDeviceRangeOf(handle->stream, workspace, workspace_bytes))) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  const cudnnTensorStruct xd = *x_description;
  const cudnnFilterStruct wd = *w_description;
  const cudnnConvolutionStruct cd = *convolution;
  const cudnnTensorStruct yd = *y_description;
  const Element element = ElementOf(xd.type);  // of the filter and output too
  const size_t filter_bytes =
      static_cast<size_t>(wd.n) * wd.c * wd.h * wd.w * emulator::ElementSize(element);
  if (!emulator::IsDeviceRangeOf(handle->stream, x, Bytes(xd)) ||
      !emulator::IsDeviceRangeOf(handle->stream, w, filter_bytes) ||
      !emulator::IsDeviceRangeOf(handle->stream, y, Bytes(yd))) {
    return CUDNN_STATUS_BAD_PARAM;  // the GPU would fault: not memory of the handle's GPU
  }
  // Host scalars, read now: double for double data, float otherwise.
  const bool double_scalars = xd.type == CUDNN_DATA_DOUBLE;
  const double alpha_value =
      double_scalars ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double beta_value =
      double_scalars ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  // The converting algorithm converts whatever math type the call asks for.
  const cudnnMathType_t math =
      algorithm == kConverting ? CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION : cd.math;
  emulator::Enqueue(handle->stream, [=] {
    const int group_in = wd.c;
    const int group_out = wd.n / cd.groups;
    for (int n = 0; n < yd.n; ++n) {
      for (int k = 0; k < yd.c; ++k) {
        const int group = k / group_out;
        for (int oh = 0; oh < yd.h; ++oh) {
          for (int ow = 0; ow < yd.w; ++ow) {
            double sum = 0;
            for (int c = 0; c < group_in; ++c) {
              for (int r = 0; r < wd.h; ++r) {
                const int ih = oh * cd.stride_h - cd.pad_h + r * cd.dilation_h;
                if (ih < 0 || ih >= xd.h) continue;
                for (int s = 0; s < wd.w; ++s) {
                  const int iw = ow * cd.stride_w - cd.pad_w + s * cd.dilation_w;
                  if (iw < 0 || iw >= xd.w) continue;
                  const int64_t x_index = ((static_cast<int64_t>(n) * xd.c +
                                            static_cast<int64_t>(group) * group_in + c) *
                                               xd.h +
                                           ih) *
                                              xd.w +
                                          iw;
                  const int64_t w_index =
                      ((static_cast<int64_t>(k) * wd.c + c) * wd.h + r) * wd.w + s;
                  sum += RoundInput(emulator::LoadElement(x, element, x_index), xd.type, math) *
                         RoundInput(emulator::LoadElement(w, element, w_index), xd.type, math);
                }
              }
            }
            const int64_t y_index = ((static_cast<int64_t>(n) * yd.c + k) * yd.h + oh) * yd.w + ow;
            const double previous =
                beta_value == 0 ? 0 : beta_value * emulator::LoadElement(y, element, y_index);
            emulator::StoreElement(y, element, y_index, alpha_value * sum + previous);
          }
        }
      }
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
