// Convolution, pooling and batch norm (NCHW).
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "cpu/onednn.h"
#include "dispatch.h"
#include "front_end.h"
#include "orochi/engine/ops.h"

namespace orochi::engine {
namespace {

int64_t OutputSize(int64_t size, int64_t kernel, int64_t stride, int64_t padding,
                   int64_t dilation) {
  int64_t span = size + 2 * padding - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;  // (C++ division truncates negatives towards zero)
}

// The [oh, ow] of a window of `geometry` sliding over a 4-D [N, C, H, W] input, after checking
// the input's rank and the geometry (pad_value is not read).
std::array<int64_t, 2> WindowOutputSize(const Tensor& input, const Im2colGeometry& geometry,
                                        const char* op) {
  OROCHI_CHECK_ARG(input.dim() == 4,
                   op << ": expected a 4-D [N, C, H, W] input, got " << ShapeString(input.shape()));
  std::array<int64_t, 2> size{};
  for (int i = 0; i < 2; ++i) {
    OROCHI_CHECK_ARG(geometry.kernel[i] > 0 && geometry.stride[i] > 0 && geometry.dilation[i] > 0 &&
                         geometry.padding[i] >= 0,
                     op << ": kernel, stride and dilation must be positive and padding "
                           "non-negative");
    size[i] = OutputSize(input.shape()[2 + i], geometry.kernel[i], geometry.stride[i],
                         geometry.padding[i], geometry.dilation[i]);
  }
  OROCHI_CHECK_ARG(size[0] > 0 && size[1] > 0, op << ": the input " << ShapeString(input.shape())
                                                  << " is too small for the kernel");
  return size;
}

// [N, C, H, W] -> [N, C, kh, kw, oh, ow]
Tensor Unfold(const Tensor& input, const Im2colGeometry& geometry, const char* op) {
  const auto [out_h, out_w] = WindowOutputSize(input, geometry, op);
  Tensor output = Tensor::Empty(
      {input.shape()[0], input.shape()[1], geometry.kernel[0], geometry.kernel[1], out_h, out_w},
      input.dtype(), input.device());
  Kernels().Find<Op::im2col>(input.device(), input.dtype())(input.Contiguous(), geometry, output);
  return output;
}

Tensor WithBatch(const Tensor& input, int64_t rank) {
  return input.dim() == rank - 1 ? input.Unsqueeze(0) : input;
}

Tensor Pool(const Tensor& input, std::array<int64_t, 2> kernel,
            std::optional<std::array<int64_t, 2>> stride, std::array<int64_t, 2> padding,
            bool max) {
  const char* op = max ? "max_pool2d" : "avg_pool2d";
  OROCHI_CHECK_ARG(IsFloating(input.dtype()),
                   op << " needs a floating input, got " << DTypeName(input.dtype()));
  Tensor batched = WithBatch(input, 4);
  std::array<int64_t, 2> step = stride.value_or(kernel);
  for (int i = 0; i < 2; ++i) {
    OROCHI_CHECK_ARG(padding[i] * 2 <= kernel[i],
                     op << ": padding should be at most half of the kernel size");
  }
  Im2colGeometry geometry{{kernel[0], kernel[1]},
                          {step[0], step[1]},
                          {padding[0], padding[1]},
                          {1, 1},
                          max ? -std::numeric_limits<double>::infinity() : 0.0};
  Tensor columns = Unfold(batched, geometry, op);
  const Shape& shape = columns.shape();
  Tensor windows = columns.View({shape[0], shape[1], kernel[0] * kernel[1], shape[4], shape[5]});
  Tensor pooled = Reduce(max ? Op::amax : Op::mean, windows, {2});
  return input.dim() == 3 ? pooled.Squeeze(0) : pooled;
}

// Whether any of x[0, n) is NaN. In blocks of a fixed length, so the compiler vectorises the
// comparison; a pass over the input costs a few percent of a pooling.
bool AnyNan(const float* x, int64_t n) {
  constexpr int64_t kBlock = 256;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    int found = 0;
    for (int64_t j = 0; j < kBlock; ++j) found |= static_cast<int>(x[i + j] != x[i + j]);
    if (found != 0) return true;
  }
  for (; i < n; ++i) {
    if (x[i] != x[i]) return true;
  }
  return false;
}

}  // namespace

void Conv2dThroughIm2col(const Tensor& input, const Tensor& weight, const ConvGeometry& geometry,
                         Tensor& output) {
  const Device device = input.device();
  const DType dtype = input.dtype();
  const int64_t batch = input.shape()[0];
  const int64_t channels = input.shape()[1];
  const int64_t out_channels = weight.shape()[0];
  const int64_t kh = weight.shape()[2];
  const int64_t kw = weight.shape()[3];
  const int64_t out_h = output.shape()[2];
  const int64_t out_w = output.shape()[3];
  if (output.numel() == 0) return;
  const Im2colGeometry unfold{{kh, kw},
                              {geometry.stride[0], geometry.stride[1]},
                              {geometry.padding[0], geometry.padding[1]},
                              {geometry.dilation[0], geometry.dilation[1]},
                              0.0};
  Tensor columns = Tensor::Empty({batch, channels, kh, kw, out_h, out_w}, dtype, device);
  Kernels().Find<Op::im2col>(device, dtype)(input, unfold, columns);
  const auto matmul = Kernels().Find<Op::matmul>(device, dtype);
  const int64_t groups = geometry.groups;
  const int64_t depth = channels / groups * kh * kw;  // the reduced dim of one group
  const int64_t spatial = out_h * out_w;
  const int64_t filters_per_group = out_channels / groups;
  if (groups == 1) {
    // [O, K] (one matrix for every image: batch stride 0) @ [N, K, L] -> [N, O, L]
    Tensor filters = weight.View({1, out_channels, depth}).Expand({batch, -1, -1});
    Tensor result = output.View({batch, out_channels, spatial});
    matmul(filters, columns.View({batch, depth, spatial}), result);
    return;
  }
  // Per image: [g, O/g, K] @ [g, K, L] -> [g, O/g, L]
  Tensor filters = weight.View({groups, filters_per_group, depth});
  for (int64_t image = 0; image < batch; ++image) {
    Tensor result = output.Select(0, image).View({groups, filters_per_group, spatial});
    matmul(filters, columns.Select(0, image).View({groups, depth, spatial}), result);
  }
}

Tensor Conv2d(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
              const Conv2dOptions& options) {
  CommonDevice("conv2d", {&input, &weight, Optional(bias)});
  Tensor batched = WithBatch(input, 4);
  OROCHI_CHECK_ARG(weight.dim() == 4, "conv2d: the weight must be 4-D [O, C/groups, kh, kw], got "
                                          << ShapeString(weight.shape()));
  OROCHI_CHECK_ARG(batched.dim() == 4,
                   "conv2d: expected a 4-D [N, C, H, W] input, got " << ShapeString(input.shape()));
  const int64_t groups = options.groups;
  const int64_t channels = batched.shape()[1];
  const int64_t out_channels = weight.shape()[0];
  OROCHI_CHECK_ARG(groups > 0 && channels % groups == 0 && out_channels % groups == 0,
                   "conv2d: groups=" << groups << " must divide the input (" << channels
                                     << ") and output (" << out_channels << ") channels");
  OROCHI_CHECK_ARG(weight.shape()[1] * groups == channels,
                   "conv2d: the weight expects " << weight.shape()[1] * groups
                                                 << " input channels, the input has " << channels);
  OROCHI_CHECK_ARG(weight.dtype() == input.dtype(), "conv2d: input and weight dtypes differ");
  if (bias) {
    OROCHI_CHECK_ARG(bias->dim() == 1 && bias->shape()[0] == out_channels,
                     "conv2d: the bias must be [" << out_channels << "]");
    OROCHI_CHECK_ARG(bias->dtype() == input.dtype(),
                     "conv2d: the bias is " << DTypeName(bias->dtype()) << " but the input is "
                                            << DTypeName(input.dtype()));
  }
  const auto [out_h, out_w] = WindowOutputSize(batched,
                                               {{weight.shape()[2], weight.shape()[3]},
                                                {options.stride[0], options.stride[1]},
                                                {options.padding[0], options.padding[1]},
                                                {options.dilation[0], options.dilation[1]},
                                                0.0},
                                               "conv2d");
  Tensor output = Tensor::Empty({batched.shape()[0], out_channels, out_h, out_w}, input.dtype(),
                                input.device());
  const ConvGeometry geometry{{options.stride[0], options.stride[1]},
                              {options.padding[0], options.padding[1]},
                              {options.dilation[0], options.dilation[1]},
                              groups};
  std::optional<Tensor> residual;
  if (options.residual) {
    residual = WithBatch(*options.residual, 4);
    CommonDevice("conv2d", {&input, &*residual});
    OROCHI_CHECK_ARG(
        residual->shape() == output.shape() && options.residual->dim() == input.dim(),
        "conv2d: the residual must have the output's shape "
            << ShapeString(input.dim() == 3 ? output.Squeeze(0).shape() : output.shape())
            << ", got " << ShapeString(options.residual->shape()));
    OROCHI_CHECK_ARG(residual->dtype() == input.dtype(), "conv2d: the residual is "
                                                             << DTypeName(residual->dtype())
                                                             << " but the input is "
                                                             << DTypeName(input.dtype()));
  }
  const Tensor contiguous_input = batched.Contiguous();
  const Tensor contiguous_weight = weight.Contiguous();
  if (input.device().type == DeviceType::kCpu && input.dtype() == DType::kFloat32 &&
      contiguous_input.numel() > 0 && weight.numel() > 0) {
    // oneDNN adds the bias and the epilogue as it writes the output: no further passes over it.
    const Tensor contiguous_bias = bias ? bias->Contiguous() : Tensor();
    const Tensor contiguous_residual = residual ? residual->Contiguous() : Tensor();
    cpu::OnednnConv2d(contiguous_input, contiguous_weight, bias ? &contiguous_bias : nullptr,
                      geometry, {residual ? &contiguous_residual : nullptr, options.relu}, output);
  } else {
    Kernels().Find<Op::conv2d>(input.device(), input.dtype())(contiguous_input, contiguous_weight,
                                                              geometry, output);
    if (bias) output = Binary(Op::add, output, bias->View({out_channels, 1, 1}));
    if (residual) output = Binary(Op::add, output, *residual);
    if (options.relu) output = Unary(Op::relu, output);
  }
  return input.dim() == 3 ? output.Squeeze(0) : output;
}

Tensor Conv1d(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
              int64_t stride, int64_t padding, int64_t dilation, int64_t groups) {
  Tensor batched = WithBatch(input, 3);
  OROCHI_CHECK_ARG(batched.dim() == 3 && weight.dim() == 3,
                   "conv1d: expected input [N, C, L] and weight [O, C/groups, k], got "
                       << ShapeString(input.shape()) << " and " << ShapeString(weight.shape()));
  Conv2dOptions options{{1, stride}, {0, padding}, {1, dilation}, groups};
  Tensor output = Conv2d(batched.Unsqueeze(2), weight.Unsqueeze(2), bias, options).Squeeze(2);
  return input.dim() == 2 ? output.Squeeze(0) : output;
}

Tensor MaxPool2d(const Tensor& input, std::array<int64_t, 2> kernel,
                 std::optional<std::array<int64_t, 2>> stride, std::array<int64_t, 2> padding) {
  Tensor batched = WithBatch(input, 4);
  if (batched.device().type != DeviceType::kCpu || batched.dtype() != DType::kFloat32 ||
      batched.dim() != 4 || batched.numel() == 0) {
    return Pool(input, kernel, stride, padding, /*max=*/true);
  }
  // oneDNN's pooling reads the input once; the generic path unfolds every window first (kh * kw
  // copies of the output's size). But oneDNN's max passes over NaN where PyTorch's gives NaN, so
  // an input holding one takes the generic path.
  const Tensor contiguous = batched.Contiguous();
  if (AnyNan(static_cast<const float*>(contiguous.data()), contiguous.numel())) {
    return Pool(input, kernel, stride, padding, /*max=*/true);
  }
  const std::array<int64_t, 2> step = stride.value_or(kernel);
  for (int i = 0; i < 2; ++i) {
    OROCHI_CHECK_ARG(padding[i] * 2 <= kernel[i],
                     "max_pool2d: padding should be at most half of the kernel size");
  }
  const auto [out_h, out_w] = WindowOutputSize(batched,
                                               {{kernel[0], kernel[1]},
                                                {step[0], step[1]},
                                                {padding[0], padding[1]},
                                                {1, 1},
                                                -std::numeric_limits<double>::infinity()},
                                               "max_pool2d");
  Tensor output = Tensor::Empty({batched.shape()[0], batched.shape()[1], out_h, out_w},
                                batched.dtype(), batched.device());
  cpu::OnednnMaxPool2d(contiguous, kernel, step, padding, output);
  return input.dim() == 3 ? output.Squeeze(0) : output;
}

Tensor AvgPool2d(const Tensor& input, std::array<int64_t, 2> kernel,
                 std::optional<std::array<int64_t, 2>> stride, std::array<int64_t, 2> padding) {
  return Pool(input, kernel, stride, padding, /*max=*/false);
}

Tensor AdaptiveAvgPool2d(const Tensor& input, std::array<int64_t, 2> output_size) {
  Tensor batched = WithBatch(input, 4);
  OROCHI_CHECK_ARG(batched.dim() == 4 && output_size[0] > 0 && output_size[1] > 0,
                   "adaptive_avg_pool2d: expected [N, C, H, W] and a positive output size");
  const int64_t height = batched.shape()[2];
  const int64_t width = batched.shape()[3];
  Tensor output =
      Tensor::Empty({batched.shape()[0], batched.shape()[1], output_size[0], output_size[1]},
                    batched.dtype(), batched.device());
  // Window i covers [floor(i * size / out), ceil((i + 1) * size / out)), as PyTorch.
  for (int64_t oy = 0; oy < output_size[0]; ++oy) {
    int64_t y0 = oy * height / output_size[0];
    int64_t y1 = ((oy + 1) * height + output_size[0] - 1) / output_size[0];
    for (int64_t ox = 0; ox < output_size[1]; ++ox) {
      int64_t x0 = ox * width / output_size[1];
      int64_t x1 = ((ox + 1) * width + output_size[1] - 1) / output_size[1];
      Tensor window = batched.Narrow(2, y0, y1 - y0).Narrow(3, x0, x1 - x0);
      output.Narrow(2, oy, 1).Narrow(3, ox, 1).CopyFrom(Reduce(Op::mean, window, {2, 3}, true));
    }
  }
  return input.dim() == 3 ? output.Squeeze(0) : output;
}

Tensor BatchNorm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                 const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                 double eps) {
  OROCHI_CHECK_ARG(input.dim() >= 2, "batch_norm: the input needs a channel dimension (dim 1)");
  CommonDevice("batch_norm",
               {&input, &running_mean, &running_var, Optional(weight), Optional(bias)});
  const int64_t channels = input.shape()[1];
  Shape per_channel(static_cast<size_t>(input.dim() - 1), 1);
  per_channel[0] = channels;
  auto check = [&](const Tensor& parameter, const char* name) {
    OROCHI_CHECK_ARG(parameter.dim() == 1 && parameter.shape()[0] == channels,
                     "batch_norm: " << name << " must be [" << channels << "], got "
                                    << ShapeString(parameter.shape()));
    return parameter.To(input.dtype()).Reshape(per_channel);
  };
  // Per channel, y = x * scale + shift: two passes over the input, as PyTorch and cuDNN do in
  // inference (the per-channel terms are [C], computed first).
  Tensor scale = Unary(
      Op::rsqrt, Binary(Op::add, check(running_var, "running_var"), Scalar(eps, input.dtype())));
  if (weight) scale = Binary(Op::mul, scale, check(*weight, "weight"));
  Tensor shift = Unary(Op::neg, Binary(Op::mul, check(running_mean, "running_mean"), scale));
  if (bias) shift = Binary(Op::add, shift, check(*bias, "bias"));
  return Binary(Op::add, Binary(Op::mul, input, scale), shift);
}

namespace {

FoldedConv ComputeFold(const Tensor& conv_weight, const std::optional<Tensor>& conv_bias,
                       const Tensor& running_mean, const Tensor& running_var, double eps,
                       const std::optional<Tensor>& weight, const std::optional<Tensor>& bias) {
  const DType wide = DType::kFloat64;
  Tensor scale = Unary(
      Op::rsqrt, Binary(Op::add, running_var.To(wide), Scalar(eps, wide, running_var.device())));
  if (weight) scale = Binary(Op::mul, scale, weight->To(wide));
  Tensor shift = Binary(Op::mul, Unary(Op::neg, running_mean.To(wide)), scale);
  if (conv_bias) shift = Binary(Op::add, shift, Binary(Op::mul, conv_bias->To(wide), scale));
  if (bias) shift = Binary(Op::add, shift, bias->To(wide));
  Shape per_channel(static_cast<size_t>(conv_weight.dim()), 1);
  per_channel[0] = -1;
  auto read_only = [&](const Tensor& folded) {
    Tensor rounded = folded.To(conv_weight.dtype()).Clone();
    rounded.storage()->MarkReadOnly();
    return rounded;
  };
  return {read_only(Binary(Op::mul, conv_weight.To(wide), scale.Reshape(per_channel))),
          read_only(shift)};
}

// Appends what identifies `tensor`'s values to a fold's cache key: its dtype, shape and bytes.
void AppendValues(std::string& key, const std::optional<Tensor>& tensor) {
  if (!tensor) {
    key += "|none";
    return;
  }
  const Tensor host = tensor->To(Device{}).Contiguous();
  key += "|" + std::string(DTypeName(host.dtype())) + ShapeString(host.shape()) + ":";
  key.append(static_cast<const char*>(host.data()), host.numel() * ItemSize(host.dtype()));
}

}  // namespace

FoldedConv FoldBatchNorm(const Tensor& conv_weight, const std::optional<Tensor>& conv_bias,
                         const Tensor& running_mean, const Tensor& running_var, double eps,
                         const std::optional<Tensor>& weight, const std::optional<Tensor>& bias) {
  OROCHI_CHECK_ARG(conv_weight.dim() >= 2 && IsFloating(conv_weight.dtype()),
                   "fuse_conv_bn_weights: the convolution weight must be a floating-point [out, "
                   "in, ...] tensor, got "
                       << DTypeName(conv_weight.dtype()) << " "
                       << ShapeString(conv_weight.shape()));
  CommonDevice("fuse_conv_bn_weights", {&conv_weight, Optional(conv_bias), &running_mean,
                                        &running_var, Optional(weight), Optional(bias)});
  const int64_t channels = conv_weight.shape()[0];
  for (const auto& [parameter, name] :
       {std::pair{std::optional<Tensor>(running_mean), "running_mean"},
        std::pair{std::optional<Tensor>(running_var), "running_var"}, std::pair{weight, "weight"},
        std::pair{bias, "bias"}, std::pair{conv_bias, "the convolution's bias"}}) {
    OROCHI_CHECK_ARG(!parameter || (parameter->dim() == 1 && parameter->shape()[0] == channels),
                     "fuse_conv_bn_weights: " << name << " must be [" << channels
                                              << "] (the convolution's output channels), got "
                                              << ShapeString(parameter->shape()));
  }
  if (!conv_weight.read_only()) {  // its bytes may change: nothing to share
    return ComputeFold(conv_weight, conv_bias, running_mean, running_var, eps, weight, bias);
  }
  // The small per-channel arguments enter the key by value, so an entry is found again only for
  // the same numbers, whatever storage they come from and however long it lives.
  std::string key = "batch norm fold@" + std::to_string(conv_weight.storage_offset()) +
                    ShapeString(conv_weight.shape()) + ShapeString(conv_weight.strides()) +
                    std::string(DTypeName(conv_weight.dtype())) + "|eps:";
  key.append(reinterpret_cast<const char*>(&eps), sizeof(eps));
  for (const std::optional<Tensor>& part : {conv_bias, std::optional<Tensor>(running_mean),
                                            std::optional<Tensor>(running_var), weight, bias}) {
    AppendValues(key, part);
  }
  const Storage::Prepared shared = conv_weight.storage()->PreparedLayout(key, [&] {
    return std::make_shared<const FoldedConv>(
        ComputeFold(conv_weight, conv_bias, running_mean, running_var, eps, weight, bias));
  });
  return *static_cast<const FoldedConv*>(shared.get());
}

}  // namespace orochi::engine
