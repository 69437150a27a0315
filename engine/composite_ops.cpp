// Ops with their own kernels that need more than a generic front-end (where, arg reductions,
// norms, index_select, sort), and ops composed from other ops (linear, attention, cat, topk, ...).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "cpu/onednn.h"
#include "dispatch.h"
#include "front_end.h"
#include "orochi/engine/ops.h"

namespace orochi::engine {
namespace {

Tensor Bool(const Tensor& tensor) {
  return tensor.dtype() == DType::kBool ? tensor
                                        : Binary(Op::ne, tensor, Scalar(0, tensor.dtype()));
}

// The trailing `normalized_shape` of `input` as contiguous [outer, inner].
Tensor AsRows(const Tensor& input, const Shape& normalized_shape, const char* op) {
  OROCHI_CHECK_ARG(static_cast<int64_t>(normalized_shape.size()) <= input.dim() &&
                       Shape(input.shape().end() - static_cast<int64_t>(normalized_shape.size()),
                             input.shape().end()) == normalized_shape,
                   op << ": normalized_shape " << ShapeString(normalized_shape)
                      << " does not match the end of the input shape "
                      << ShapeString(input.shape()));
  int64_t inner = NumElements(normalized_shape);
  return input.Contiguous().View({inner == 0 ? 0 : input.numel() / inner, inner});
}

const Tensor* Parameter(const std::optional<Tensor>& parameter, const Shape& normalized_shape,
                        DType dtype, const char* what, Tensor* storage) {
  if (!parameter) return nullptr;
  OROCHI_CHECK_ARG(parameter->shape() == normalized_shape,
                   what << " has shape " << ShapeString(parameter->shape()) << ", expected "
                        << ShapeString(normalized_shape));
  *storage = parameter->To(dtype).Contiguous();
  return storage;
}

Tensor Normalize(Op op, const Tensor& input, const Shape& normalized_shape,
                 const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                 double eps) {
  const char* name = op == Op::layer_norm ? "layer_norm" : "rms_norm";
  CommonDevice(name, {&input, Optional(weight), Optional(bias)});
  Tensor rows = AsRows(input, normalized_shape, name);
  auto kernel = Kernels().FindAs<NormKernel>(op, input.device(), input.dtype());
  Tensor weight_storage;
  Tensor bias_storage;
  const Tensor* gamma =
      Parameter(weight, normalized_shape, input.dtype(), "weight", &weight_storage);
  const Tensor* beta = Parameter(bias, normalized_shape, input.dtype(), "bias", &bias_storage);
  Tensor output = Tensor::Empty(rows.shape(), input.dtype(), input.device());
  kernel(op, rows, gamma, beta, eps, output);
  return output.View(input.shape());
}

}  // namespace

Tensor ArgReduce(Op op, const Tensor& input, std::optional<int64_t> dim, bool keepdim) {
  OROCHI_CHECK_ARG(op == Op::argmax || op == Op::argmin, OpName(op) << " is not argmax/argmin");
  auto kernel = Kernels().FindAs<ReduceKernel>(op, input.device(), input.dtype());
  if (!dim) {
    // IndexError in PyTorch, as for an empty dim.
    OROCHI_CHECK_RANGE(input.numel() > 0, OpName(op) << ": cannot reduce an empty tensor "
                                                     << ShapeString(input.shape())
                                                     << " without a dim to reduce over");
    Tensor output = Tensor::Empty(keepdim ? Shape(input.shape().size(), 1) : Shape{}, DType::kInt64,
                                  input.device());
    kernel(op, input.Contiguous().View({1, input.numel()}), output);
    return output;
  }
  int64_t d = WrapScalarDim(*dim, input.dim());
  OROCHI_CHECK_RANGE(
      input.dim() == 0 || input.shape()[d] > 0,
      OpName(op) << ": cannot reduce over an empty dimension of " << ShapeString(input.shape()));
  if (input.dim() == 0) {
    Tensor output = Tensor::Empty({}, DType::kInt64, input.device());
    kernel(op, input.Contiguous().View({1, 1}), output);
    return output;
  }
  // Move `d` to the end, keeping the other dims in order: they are the output's dims.
  std::vector<int64_t> order;
  for (int64_t i = 0; i < input.dim(); ++i) {
    if (i != d) order.push_back(i);
  }
  order.push_back(d);
  Tensor moved = input.Permute(order).Contiguous();
  Shape kept(moved.shape().begin(), moved.shape().end() - 1);
  Tensor output = Tensor::Empty(kept, DType::kInt64, input.device());
  // An empty batch (rows of a 0-row tensor) has an empty answer, and nothing to launch.
  if (output.numel() > 0) kernel(op, moved.View({NumElements(kept), input.shape()[d]}), output);
  return keepdim ? output.Unsqueeze(d) : output;
}

Tensor Var(const Tensor& input, const std::vector<int64_t>& dims, double correction, bool keepdim) {
  OROCHI_CHECK_ARG(IsFloating(input.dtype()),
                   "var needs a floating tensor, got " << DTypeName(input.dtype()));
  Tensor mean = Reduce(Op::mean, input, dims, /*keepdim=*/true);
  Tensor deviation = Binary(Op::sub, input, mean);
  Tensor squares = Binary(Op::mul, deviation, deviation);
  Tensor total = Reduce(Op::sum, squares, dims, keepdim);
  int64_t count = input.numel() / std::max<int64_t>(mean.numel(), 1);
  double denominator = std::max(0.0, static_cast<double>(count) - correction);
  return Binary(Op::div, total, Scalar(denominator, input.dtype()));
}

Tensor Std(const Tensor& input, const std::vector<int64_t>& dims, double correction, bool keepdim) {
  return Unary(Op::sqrt, Var(input, dims, correction, keepdim));
}

namespace {

// any/all of a uint8 tensor is uint8 in PyTorch (a rule kept from before bool existed).
Tensor TruthResult(const Tensor& truth, DType input_dtype) {
  return input_dtype == DType::kUInt8 ? truth.To(DType::kUInt8) : truth;
}

}  // namespace

Tensor Any(const Tensor& input, const std::vector<int64_t>& dims, bool keepdim) {
  if (input.numel() == 0) {
    return TruthResult(
        Full(Reduce(Op::sum, input, dims, keepdim).shape(), 0, DType::kBool, input.device()),
        input.dtype());
  }
  return TruthResult(Reduce(Op::amax, Bool(input), dims, keepdim), input.dtype());
}

Tensor All(const Tensor& input, const std::vector<int64_t>& dims, bool keepdim) {
  if (input.numel() == 0) {
    return TruthResult(
        Full(Reduce(Op::sum, input, dims, keepdim).shape(), 1, DType::kBool, input.device()),
        input.dtype());
  }
  return TruthResult(Reduce(Op::amin, Bool(input), dims, keepdim), input.dtype());
}

Tensor Where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  OROCHI_CHECK_ARG(condition.dtype() == DType::kBool,
                   "where: the condition must be bool, got " << DTypeName(condition.dtype()));
  const Device device = CommonDevice("where", {&condition, &a, &b}, CpuScalars::kFollow);
  Shape shape = BroadcastShapes(condition.shape(), BroadcastShapes(a.shape(), b.shape()));
  DType dtype = ResultType(a, b);
  auto kernel = Kernels().Find<Op::where>(device, dtype);
  Tensor output = Tensor::Empty(shape, dtype, device);
  kernel(OnDevice(condition, device).Expand(shape), OnDevice(a, device).To(dtype).Expand(shape),
         OnDevice(b, device).To(dtype).Expand(shape), output);
  return output;
}

Tensor Clamp(const Tensor& input, const std::optional<Tensor>& min,
             const std::optional<Tensor>& max) {
  OROCHI_CHECK_ARG(min || max, "clamp: at least one of min and max is needed");
  Tensor result = input;
  if (min) result = Binary(Op::maximum, result, *min);
  if (max) result = Binary(Op::minimum, result, *max);
  return result;
}

Tensor LogicalNot(const Tensor& input) { return Binary(Op::eq, input, Scalar(0, input.dtype())); }

Tensor MaskedFill(const Tensor& input, const Tensor& mask, const Tensor& value) {
  OROCHI_CHECK_ARG(value.dim() == 0, "masked_fill: the value must be a 0-dim tensor");
  OROCHI_CHECK_ARG(mask.dtype() == DType::kBool, "masked_fill: the mask must be bool");
  CommonDevice("masked_fill", {&input, &mask, &value}, CpuScalars::kFollow);
  Shape shape = BroadcastShapes(input.shape(), mask.shape());
  OROCHI_CHECK_ARG(shape == input.shape(), "masked_fill: mask " << ShapeString(mask.shape())
                                                                << " does not broadcast to "
                                                                << ShapeString(input.shape()));
  return Where(mask, value.To(input.dtype()), input);
}

Tensor Cat(const std::vector<Tensor>& tensors, int64_t dim) {
  OROCHI_CHECK_ARG(!tensors.empty(), "cat: needs at least one tensor");
  for (size_t i = 0; i < tensors.size(); ++i) {
    OROCHI_CHECK_ARG(tensors[i].dim() > 0,
                     "cat: the 0-d tensor at position " << i << " cannot be concatenated");
  }
  // PyTorch skips 1-d empty tensors of any other shape (the legacy way to start a list to
  // concatenate onto, torch.tensor([])); they still take part in the result's dtype.
  auto skipped = [](const Tensor& tensor) { return tensor.shape() == Shape{0}; };
  auto kept = std::find_if(tensors.begin(), tensors.end(),
                           [&](const Tensor& tensor) { return !skipped(tensor); });
  const Tensor& first = kept != tensors.end() ? *kept : tensors.front();
  DType dtype = first.dtype();
  for (const Tensor& tensor : tensors) {
    CommonDevice("cat", {&first, &tensor});
    dtype = PromoteTypes(dtype, tensor.dtype());
  }
  if (kept == tensors.end()) return Tensor::Empty({0}, dtype, first.device());
  int64_t d = WrapDim(dim, first.dim());
  Shape shape = first.shape();
  shape[d] = 0;
  for (const Tensor& tensor : tensors) {
    if (skipped(tensor)) continue;
    OROCHI_CHECK_ARG(tensor.dim() == first.dim(),
                     "cat: tensors must have the same number of dimensions, got "
                         << ShapeString(first.shape()) << " and " << ShapeString(tensor.shape()));
    for (int64_t i = 0; i < first.dim(); ++i) {
      OROCHI_CHECK_ARG(i == d || tensor.shape()[i] == first.shape()[i],
                       "cat: sizes must match except in dimension "
                           << dim << ", got " << ShapeString(first.shape()) << " and "
                           << ShapeString(tensor.shape()));
    }
    shape[d] += tensor.shape()[d];
  }
  Tensor output = Tensor::Empty(shape, dtype, first.device());
  int64_t offset = 0;
  for (const Tensor& tensor : tensors) {
    if (skipped(tensor)) continue;
    Tensor slot = output.Narrow(d, offset, tensor.shape()[d]);
    slot.CopyFrom(tensor);
    offset += tensor.shape()[d];
  }
  return output;
}

Tensor Stack(const std::vector<Tensor>& tensors, int64_t dim) {
  OROCHI_CHECK_ARG(!tensors.empty(), "stack: needs at least one tensor");
  std::vector<Tensor> expanded;
  int64_t d = WrapDim(dim, tensors.front().dim() + 1);
  for (const Tensor& tensor : tensors) {
    OROCHI_CHECK_ARG(tensor.shape() == tensors.front().shape(),
                     "stack: every tensor must have the same shape");
    expanded.push_back(tensor.Unsqueeze(d));
  }
  return Cat(expanded, d);
}

std::vector<Tensor> Split(const Tensor& input, int64_t size, int64_t dim) {
  OROCHI_CHECK_ARG(size > 0, "split: the split size must be positive");
  OROCHI_CHECK_ARG(input.dim() > 0, "split expects a tensor of at least 1 dimension");
  int64_t d = WrapDim(dim, input.dim());
  std::vector<Tensor> parts;
  for (int64_t start = 0; start < input.shape()[d] || (start == 0 && input.shape()[d] == 0);
       start += size) {
    parts.push_back(input.Narrow(d, start, std::min(size, input.shape()[d] - start)));
    if (input.shape()[d] == 0) break;
  }
  return parts;
}

std::vector<Tensor> Chunk(const Tensor& input, int64_t chunks, int64_t dim) {
  OROCHI_CHECK_ARG(chunks > 0, "chunk: the number of chunks must be positive");
  OROCHI_CHECK_ARG(input.dim() > 0, "chunk expects a tensor of at least 1 dimension");
  int64_t size = input.shape()[WrapDim(dim, input.dim())];
  return Split(input, std::max<int64_t>((size + chunks - 1) / chunks, 1), dim);
}

std::vector<Tensor> SplitWithSizes(const Tensor& input, const std::vector<int64_t>& sizes,
                                   int64_t dim) {
  OROCHI_CHECK_ARG(input.dim() > 0, "split expects a tensor of at least 1 dimension");
  const int64_t d = WrapDim(dim, input.dim());
  int64_t total = 0;
  for (int64_t size : sizes) {
    OROCHI_CHECK_ARG(size >= 0, "split: section sizes must be non-negative, got " << size);
    total += size;
  }
  OROCHI_CHECK_ARG(total == input.shape()[d], "split: the section sizes add up to "
                                                  << total << ", but dimension " << d
                                                  << " has size " << input.shape()[d]);
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t size : sizes) {
    pieces.push_back(input.Narrow(d, start, size));
    start += size;
  }
  return pieces;
}

// A view [1, d0, 1, d1, ...] expanded to [r0, d0, r1, d1, ...] and copied once (one copy kernel
// on any device) into [r0 * d0, r1 * d1, ...].
Tensor Repeat(const Tensor& input, const std::vector<int64_t>& repeats) {
  OROCHI_CHECK_ARG(repeats.size() >= static_cast<size_t>(input.dim()),
                   "repeat: Number of dimensions of repeat dims can not be smaller than number "
                   "of dimensions of tensor ("
                       << repeats.size() << " repeats for a tensor of shape "
                       << ShapeString(input.shape()) << ")");
  const size_t added = repeats.size() - static_cast<size_t>(input.dim());
  Shape tiles;
  Shape expanded;
  Shape result;
  for (size_t i = 0; i < repeats.size(); ++i) {
    OROCHI_CHECK_ARG(repeats[i] >= 0, "repeat: the repeats must be non-negative, got "
                                          << repeats[i] << " for dimension " << i);
    const int64_t size = i < added ? 1 : input.shape()[i - added];
    tiles.insert(tiles.end(), {1, size});
    expanded.insert(expanded.end(), {repeats[i], size});
    result.push_back(repeats[i] * size);
  }
  return input.Reshape(tiles).Expand(expanded).Contiguous().Reshape(result);
}

// One index_select along each flipped dim, by descending positions made on the input's device.
Tensor Flip(const Tensor& input, const std::vector<int64_t>& dims) {
  std::vector<int64_t> flipped;
  for (int64_t dim : dims) {
    // A 0-dim tensor takes dims 0 and -1, as in PyTorch.
    const int64_t wrapped = WrapDim(dim, std::max<int64_t>(input.dim(), 1));
    OROCHI_CHECK_ARG(std::find(flipped.begin(), flipped.end(), wrapped) == flipped.end(),
                     "flip: dim " << wrapped << " appears multiple times in the list of dims");
    flipped.push_back(wrapped);
  }
  Tensor result = input;
  bool copied = false;
  for (int64_t dim : flipped) {
    if (input.dim() == 0 || input.shape()[dim] <= 1) continue;
    const int64_t size = input.shape()[dim];
    result = IndexSelect(
        result, dim, Arange(static_cast<double>(size - 1), -1, -1, DType::kInt64, input.device()));
    copied = true;
  }
  return copied ? result : input.Clone();
}

Tensor Pad(const Tensor& input, const std::vector<int64_t>& pad, double value) {
  OROCHI_CHECK_ARG(pad.size() % 2 == 0 && static_cast<int64_t>(pad.size()) <= 2 * input.dim(),
                   "pad: expected an even number of sizes, at most two per dimension of the "
                   "input, got "
                       << pad.size() << " for an input of shape " << ShapeString(input.shape()));
  // Negative padding crops: the part of the input kept and where it lands in the output.
  Shape shape = input.shape();
  Tensor kept = input;
  std::vector<std::pair<int64_t, int64_t>> placed;  // (dim, offset in the output)
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    const int64_t d = input.dim() - 1 - static_cast<int64_t>(i);
    const int64_t before = pad[2 * i];
    const int64_t after = pad[2 * i + 1];
    shape[d] += before + after;
    OROCHI_CHECK_ARG(shape[d] >= 0, "pad: padding " << before << " and " << after
                                                    << " leave dimension " << d << " of size "
                                                    << input.shape()[d] << " with size "
                                                    << shape[d]);
    const int64_t skipped = std::max<int64_t>(-before, 0);
    const int64_t length =
        std::max<int64_t>(input.shape()[d] - skipped - std::max<int64_t>(-after, 0), 0);
    kept = kept.Narrow(d, std::min(skipped, input.shape()[d]), length);
    placed.emplace_back(d, std::max<int64_t>(before, 0));
  }
  Tensor output = Full(shape, value, input.dtype(), input.device());
  if (kept.numel() == 0) return output;
  Tensor inner = output;
  for (const auto& [d, offset] : placed) inner = inner.Narrow(d, offset, kept.shape()[d]);
  inner.CopyFrom(kept);
  return output;
}

namespace {

// The smallest and largest of int64 `picks` (non-empty), read on the host: a CPU tensor is
// scanned in place; a device tensor is reduced there and only the two values come back (one
// wait for the work before). Bad indices are refused before a kernel could fault on them.
std::pair<int64_t, int64_t> IndexBounds(const Tensor& picks) {
  if (picks.device().type == DeviceType::kCpu) {
    const Tensor flat = picks.Contiguous();
    const int64_t* values = flat.data_as<int64_t>();
    auto [low, high] = std::minmax_element(values, values + flat.numel());
    return {*low, *high};
  }
  const Tensor bounds =
      Stack({Reduce(Op::amin, picks), Reduce(Op::amax, picks)}).To(Device{}).Contiguous();
  return {bounds.data_as<int64_t>()[0], bounds.data_as<int64_t>()[1]};
}

}  // namespace

Tensor IndexSelect(const Tensor& input, int64_t dim, const Tensor& index) {
  OROCHI_CHECK_ARG(index.dim() <= 1 && IsIntegral(index.dtype()),
                   "index_select: the index must be a 1-D integer tensor");
  const Device device = CommonDevice("index_select", {&input, &index});
  const int64_t d = WrapScalarDim(dim, input.dim());
  Tensor picks = index.To(DType::kInt64).Contiguous();
  int64_t size = input.dim() == 0 ? 1 : input.shape()[d];
  if (picks.numel() > 0) {
    auto [low, high] = IndexBounds(picks);
    if (low < 0 || high >= size) {
      // The error path only: name the first bad index.
      const Tensor host_picks = picks.To(Device{});
      const int64_t* values = host_picks.data_as<int64_t>();
      const int64_t* bad = std::find_if(values, values + host_picks.numel(),
                                        [size](int64_t pick) { return pick < 0 || pick >= size; });
      OROCHI_CHECK_RANGE(false, "index_select: index " << *bad << " is out of range for dimension "
                                                       << dim << " of size " << size);
    }
  }
  Shape shape = input.shape();
  const bool scalar = shape.empty();  // one element: one row of one
  int64_t outer = scalar ? 1 : NumElements(Shape(shape.begin(), shape.begin() + d));
  int64_t inner = scalar ? 1 : NumElements(Shape(shape.begin() + d + 1, shape.end()));
  if (!shape.empty()) shape[d] = picks.numel();
  const auto kernel = Kernels().Find<Op::index_select>(device, input.dtype());
  if (!input.is_contiguous() && device.type == DeviceType::kCpu && picks.numel() < size) {
    // A view on the CPU, fewer picks than slices: the kernel reads the picked slices through its
    // strides, `dim` moved first ([1, size, rest...]), so nothing unpicked is copied.
    std::vector<int64_t> order{d};
    for (int64_t i = 0; i < input.dim(); ++i) {
      if (i != d) order.push_back(i);
    }
    const Tensor moved = input.Permute(order).Unsqueeze(0);
    Shape picked = moved.shape();
    picked[1] = picks.numel();
    Tensor output = Tensor::Empty(picked, input.dtype(), device);
    kernel(moved, picks.View({picks.numel()}), output);
    if (d == 0) return output.View(shape);
    std::vector<int64_t> back(static_cast<size_t>(input.dim()));
    for (int64_t i = 0; i < input.dim(); ++i) back[order[i]] = i;
    return output.Squeeze(0).Permute(back).Contiguous();
  }
  Tensor rows = input.Contiguous().View({outer, size, inner});
  Tensor output = Tensor::Empty(shape, input.dtype(), device);
  kernel(rows, picks.View({picks.numel()}), output);
  return output;
}

Tensor Gather(const Tensor& input, int64_t dim, const Tensor& index) {
  OROCHI_CHECK_ARG(IsIntegral(index.dtype()), "gather: the index must be an integer tensor");
  OROCHI_CHECK_ARG(index.dim() == input.dim(), "gather: index and input need the same rank, got "
                                                   << index.dim() << " and " << input.dim());
  const Device device = CommonDevice("gather", {&input, &index});
  const int64_t d = WrapScalarDim(dim, input.dim());
  for (int64_t i = 0; i < input.dim(); ++i) {
    OROCHI_CHECK_ARG(i == d || index.shape()[i] <= input.shape()[i],
                     "gather: index " << ShapeString(index.shape()) << " is larger than input "
                                      << ShapeString(input.shape()) << " in dimension " << i);
  }
  Tensor picks = index.To(DType::kInt64);
  if (picks.numel() > 0 && input.dim() > 0) {
    auto [low, high] = IndexBounds(picks);
    OROCHI_CHECK_ARG(low >= 0 && high < input.shape()[d], "gather: index values must be in [0, "
                                                              << input.shape()[d] << "), got ["
                                                              << low << ", " << high << "]");
  }
  // The flat offset of every output element in the contiguous input: its coordinates, with the
  // index in place of the coordinate along `dim`.
  const Shape strides = ContiguousStrides(input.shape());
  Tensor offsets = Zeros(index.shape(), DType::kInt64, device);
  for (int64_t i = 0; i < input.dim(); ++i) {
    Tensor coordinate;
    if (i == d) {
      coordinate = picks;
    } else {
      Shape position(static_cast<size_t>(input.dim()), 1);
      position[i] = index.shape()[i];
      coordinate =
          Arange(0, static_cast<double>(index.shape()[i]), 1, DType::kInt64, device).View(position);
    }
    offsets =
        Binary(Op::add, offsets,
               Binary(Op::mul, coordinate, Scalar(static_cast<double>(strides[i]), DType::kInt64)));
  }
  Tensor flat = input.Contiguous().Reshape({input.numel()});
  return IndexSelect(flat, 0, offsets.Reshape({offsets.numel()})).View(index.shape());
}

Tensor Embedding(const Tensor& indices, const Tensor& weight) {
  OROCHI_CHECK_ARG(weight.dim() == 2,
                   "embedding: the weight must be 2-D, got " << ShapeString(weight.shape()));
  OROCHI_CHECK_ARG(IsIntegral(indices.dtype()), "embedding: indices must be an integer tensor, got "
                                                    << DTypeName(indices.dtype()));
  CommonDevice("embedding", {&indices, &weight});
  Tensor rows = IndexSelect(weight, 0, indices.Reshape({indices.numel()}));
  Shape shape = indices.shape();
  shape.push_back(weight.shape()[1]);
  return rows.View(shape);
}

Tensor Eye(int64_t rows, std::optional<int64_t> columns, DType dtype, Device device) {
  int64_t width = columns.value_or(rows);
  OROCHI_CHECK_ARG(rows >= 0 && width >= 0, "eye: sizes must be non-negative");
  Tensor output = Zeros({rows, width}, dtype, device);
  Tensor diagonal(output.storage(), {std::min(rows, width)}, {width + 1}, 0, dtype);
  diagonal.CopyFrom(Scalar(1, dtype, device));
  return output;
}

Tensor Linspace(double start, double end, int64_t steps, DType dtype, Device device) {
  OROCHI_CHECK_ARG(steps >= 0, "linspace: steps must be non-negative");
  Tensor output = Tensor::Empty({steps}, dtype, device);
  double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0;
  Kernels().Find<Op::arange>(device, dtype)(output, start, step);
  return output;
}

Tensor LayerNorm(const Tensor& input, const Shape& normalized_shape,
                 const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                 double eps) {
  return Normalize(Op::layer_norm, input, normalized_shape, weight, bias, eps);
}

Tensor RmsNorm(const Tensor& input, const Shape& normalized_shape,
               const std::optional<Tensor>& weight, double eps) {
  return Normalize(Op::rms_norm, input, normalized_shape, weight, std::nullopt, eps);
}

Tensor Bmm(const Tensor& a, const Tensor& b) {
  OROCHI_CHECK_ARG(a.dim() == 3 && b.dim() == 3 && a.shape()[0] == b.shape()[0],
                   "bmm: needs [b, n, m] and [b, m, p], got " << ShapeString(a.shape()) << " and "
                                                              << ShapeString(b.shape()));
  return Matmul(a, b);
}

Tensor Linear(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias) {
  OROCHI_CHECK_ARG(weight.dim() == 2,
                   "linear: the weight must be 2-D [out, in], got " << ShapeString(weight.shape()));
  CommonDevice("linear", {&input, &weight, Optional(bias)});
  OROCHI_CHECK_ARG(input.dim() >= 1 && input.size(-1) == weight.shape()[1],
                   "linear: the input's last dim must be in_features = "
                       << weight.shape()[1] << " (weight " << ShapeString(weight.shape())
                       << "), got input " << ShapeString(input.shape()));
  OROCHI_CHECK_ARG(!bias || (bias->dim() <= 1 && bias->numel() == weight.shape()[0]),
                   "linear: the bias must have out_features = "
                       << weight.shape()[0] << " elements, got " << ShapeString(bias->shape()));
  if (cpu::PrefersOnednnLinear(input, weight) && (!bias || bias->dtype() == DType::kFloat32)) {
    // Loaded weights on the CPU: oneDNN's matmul on the weight's prepared layout, bias fused.
    const int64_t in = weight.shape()[1];
    const Tensor rows = input.Contiguous().View({input.numel() / in, in});
    const Tensor contiguous_bias = bias ? bias->Contiguous() : Tensor();
    Tensor output = Tensor::Empty({rows.shape()[0], weight.shape()[0]}, DType::kFloat32);
    cpu::OnednnLinear(rows, weight, bias ? &contiguous_bias : nullptr, output);
    Shape shape = input.shape();
    shape.back() = weight.shape()[0];
    return output.View(shape);
  }
  Tensor output = Matmul(input, weight.Transpose(0, 1));
  return bias ? Binary(Op::add, output, *bias) : output;
}

Tensor ScaledDotProductAttention(const Tensor& query, const Tensor& key, const Tensor& value,
                                 const std::optional<Tensor>& mask, bool causal,
                                 std::optional<double> scale) {
  OROCHI_CHECK_ARG(query.dim() >= 2 && key.dim() >= 2 && value.dim() >= 2,
                   "scaled_dot_product_attention: query, key and value need at least 2 dims");
  OROCHI_CHECK_ARG(!(mask && causal),
                   "scaled_dot_product_attention: give either a mask or causal, not both");
  const Tensor no_mask;
  const Device device = CommonDevice("scaled_dot_product_attention",
                                     {&query, &key, &value, mask ? &*mask : &no_mask});
  OROCHI_CHECK_ARG(query.size(-1) == key.size(-1) && key.size(-2) == value.size(-2),
                   "scaled_dot_product_attention: query [..., L, E], key [..., S, E] and value "
                   "[..., S, Ev] disagree: query "
                       << ShapeString(query.shape()) << ", key " << ShapeString(key.shape())
                       << ", value " << ShapeString(value.shape()));
  double factor = scale.value_or(1.0 / std::sqrt(static_cast<double>(query.size(-1))));
  Tensor scores =
      Binary(Op::mul, Matmul(query, key.Transpose(-2, -1)), Scalar(factor, query.dtype()));
  const int64_t queries = query.size(-2);
  const int64_t keys = key.size(-2);
  std::optional<Tensor> allowed;
  if (causal) {  // query i sees keys 0..i
    allowed =
        Binary(Op::ge,
               Arange(0, static_cast<double>(queries), 1, DType::kInt64, device).View({queries, 1}),
               Arange(0, static_cast<double>(keys), 1, DType::kInt64, device).View({1, keys}));
  } else if (mask && mask->dtype() == DType::kBool) {
    allowed = *mask;
  } else if (mask) {
    scores = Binary(Op::add, scores, *mask);
  }
  if (allowed) {
    scores =
        Where(*allowed, scores, Scalar(-std::numeric_limits<double>::infinity(), scores.dtype()));
  }
  return Matmul(Softmax(scores, -1), value);
}

SortResult Sort(const Tensor& input, int64_t dim, bool descending) {
  const int64_t d = WrapScalarDim(dim, input.dim());
  if (input.dim() == 0) return {input.Clone(), Zeros({}, DType::kInt64, input.device())};
  if (input.dtype() == DType::kBool) {  // as bytes: false before true
    SortResult bytes = Sort(input.To(DType::kUInt8), dim, descending);
    return {bytes.values.To(DType::kBool), bytes.indices};
  }
  Tensor moved = input.Transpose(d, -1).Contiguous();
  Tensor values = Tensor::Empty(moved.shape(), input.dtype(), input.device());
  Tensor indices = Tensor::Empty(moved.shape(), DType::kInt64, input.device());
  Kernels().Find<Op::sort>(input.device(), input.dtype())(moved, descending, values, indices);
  return {values.Transpose(d, -1).Contiguous(), indices.Transpose(d, -1).Contiguous()};
}

SortResult TopK(const Tensor& input, int64_t k, int64_t dim, bool largest) {
  int64_t d = WrapScalarDim(dim, input.dim());
  int64_t size = input.dim() == 0 ? 1 : input.shape()[d];
  OROCHI_CHECK_ARG(k >= 0 && k <= size, "topk: k=" << k << " is out of range for dimension " << dim
                                                   << " of size " << size);
  SortResult sorted = Sort(input, dim, /*descending=*/largest);
  if (input.dim() == 0) return sorted;
  return {sorted.values.Narrow(d, 0, k).Contiguous(), sorted.indices.Narrow(d, 0, k).Contiguous()};
}

Tensor MaskedSelect(const Tensor& input, const Tensor& mask) {
  OROCHI_CHECK_ARG(mask.dtype() == DType::kBool, "masked_select: the mask must be bool");
  const Device device = CommonDevice("masked_select", {&input, &mask});
  Shape shape = BroadcastShapes(input.shape(), mask.shape());
  // The result's size depends on the mask, so it is read on the host (as PyTorch does).
  Tensor flat_mask = mask.Expand(shape).Contiguous().To(Device{});
  std::vector<int64_t> positions;
  const bool* flags = flat_mask.data_as<bool>();
  for (int64_t i = 0, n = flat_mask.numel(); i < n; ++i) {
    if (flags[i]) positions.push_back(i);
  }
  Tensor index = Tensor::Empty({static_cast<int64_t>(positions.size())}, DType::kInt64);
  std::copy(positions.begin(), positions.end(), index.mutable_data_as<int64_t>());
  return IndexSelect(input.Expand(shape).Reshape({NumElements(shape)}), 0, index.To(device));
}

}  // namespace orochi::engine
