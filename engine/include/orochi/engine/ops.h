// The engine's operations, with PyTorch's names and semantics.
//
// Every op works on any device for which a kernel is registered (the engine's kernel registry) and
// throws Error (kInvalidArgument) for bad arguments, naming the op, device and dtype when a kernel
// is missing, and Error (kOutOfRange) for a dim or an index outside its range. Ops never modify
// their inputs; results are new contiguous tensors unless documented as views, on the inputs'
// device. Inputs must share one device ("expected all tensors on the same device"), except that
// elementwise ops (Binary, Where, Clamp, MaskedFill, ...) accept 0-dim CPU tensors beside
// tensors of any device, as PyTorch does for Python numbers. Nothing falls back to the CPU. All
// functions are thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string_view>
#include <vector>

#include "orochi/engine/export.h"
#include "orochi/engine/op.h"
#include "orochi/engine/tensor.h"

namespace orochi::engine {

// --- creation ----------------------------------------------------------------------------------
// Creation ops take the device to create on (the CPU by default).
OROCHI_ENGINE_API Tensor Zeros(const Shape& shape, DType dtype = DType::kFloat32,
                               Device device = {});
OROCHI_ENGINE_API Tensor Ones(const Shape& shape, DType dtype = DType::kFloat32,
                              Device device = {});
OROCHI_ENGINE_API Tensor Full(const Shape& shape, double value, DType dtype = DType::kFloat32,
                              Device device = {});
// [start, end) in steps of `step`, like torch.arange.
OROCHI_ENGINE_API Tensor Arange(double start, double end, double step = 1,
                                DType dtype = DType::kInt64, Device device = {});
// torch.arange over integer bounds, into an integral dtype: exact over all of int64, where the
// double-valued Arange is exact only up to 2^53.
OROCHI_ENGINE_API Tensor IntegerArange(int64_t start, int64_t end, int64_t step = 1,
                                       DType dtype = DType::kInt64, Device device = {});
// A 0-dim tensor holding `value`.
OROCHI_ENGINE_API Tensor Scalar(double value, DType dtype, Device device = {});

// --- elementwise -------------------------------------------------------------------------------
// Unary ops keep a floating dtype and compute integral inputs in float32 (exp, log, ...), except
// neg, abs, relu, floor, ceil and round, which keep integral dtypes.
OROCHI_ENGINE_API Tensor Unary(Op op, const Tensor& input);
// Binary ops broadcast and promote as PyTorch does (comparisons return bool; div of integers
// returns float32, true division).
OROCHI_ENGINE_API Tensor Binary(Op op, const Tensor& a, const Tensor& b);
// The dtype Binary(op, a, b) computes in: torch.result_type rules, where 0-dim tensors do not
// raise the category's width of dimensioned ones.
OROCHI_ENGINE_API DType ResultType(const Tensor& a, const Tensor& b);
OROCHI_ENGINE_API Shape BroadcastShapes(const Shape& a, const Shape& b);

// --- reductions --------------------------------------------------------------------------------
// Over `dims` (all dims when empty). sum of bool/integral gives int64; mean needs floating input.
OROCHI_ENGINE_API Tensor Reduce(Op op, const Tensor& input, const std::vector<int64_t>& dims = {},
                                bool keepdim = false);
OROCHI_ENGINE_API Tensor Softmax(const Tensor& input, int64_t dim);
OROCHI_ENGINE_API Tensor LogSoftmax(const Tensor& input, int64_t dim);
// Running sums along `dim`, as torch.cumsum: floating input keeps its dtype (16-bit floats add
// in float32), bool and integers give int64.
OROCHI_ENGINE_API Tensor Cumsum(const Tensor& input, int64_t dim);

// argmax/argmin over one dim (or the flattened tensor): int64 indices of the first extreme.
OROCHI_ENGINE_API Tensor ArgReduce(Op op, const Tensor& input, std::optional<int64_t> dim = {},
                                   bool keepdim = false);
// torch.var / torch.std with Bessel's `correction` (1 by default, like PyTorch).
OROCHI_ENGINE_API Tensor Var(const Tensor& input, const std::vector<int64_t>& dims = {},
                             double correction = 1, bool keepdim = false);
OROCHI_ENGINE_API Tensor Std(const Tensor& input, const std::vector<int64_t>& dims = {},
                             double correction = 1, bool keepdim = false);
// torch.any / torch.all: bool results, uint8 for a uint8 input (as in PyTorch).
OROCHI_ENGINE_API Tensor Any(const Tensor& input, const std::vector<int64_t>& dims = {},
                             bool keepdim = false);
OROCHI_ENGINE_API Tensor All(const Tensor& input, const std::vector<int64_t>& dims = {},
                             bool keepdim = false);

// --- selection and logic -----------------------------------------------------------------------
// torch.where(condition, a, b): condition is bool; a and b broadcast and promote.
OROCHI_ENGINE_API Tensor Where(const Tensor& condition, const Tensor& a, const Tensor& b);
// torch.clamp with optional bounds (0-dim or broadcastable tensors).
OROCHI_ENGINE_API Tensor Clamp(const Tensor& input, const std::optional<Tensor>& min,
                               const std::optional<Tensor>& max);
OROCHI_ENGINE_API Tensor LogicalNot(const Tensor& input);
// masked_fill: `value` (0-dim) where `mask` (bool, broadcast) is true; keeps input's dtype.
OROCHI_ENGINE_API Tensor MaskedFill(const Tensor& input, const Tensor& mask, const Tensor& value);

// --- joining, splitting and indexing ------------------------------------------------------------
// torch.cat: promotes dtypes; skips 1-d empty tensors (shape [0]) whatever the others' shapes.
OROCHI_ENGINE_API Tensor Cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
OROCHI_ENGINE_API Tensor Stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Views of `input` along `dim`, each `size` long (the last may be shorter).
OROCHI_ENGINE_API std::vector<Tensor> Split(const Tensor& input, int64_t size, int64_t dim = 0);
OROCHI_ENGINE_API std::vector<Tensor> Chunk(const Tensor& input, int64_t chunks, int64_t dim = 0);
// torch.split with section sizes: views of `input` along `dim`, of the given sizes, which must
// add up to the dim's size.
OROCHI_ENGINE_API std::vector<Tensor> SplitWithSizes(const Tensor& input,
                                                     const std::vector<int64_t>& sizes,
                                                     int64_t dim = 0);
// torch.Tensor.repeat: `input` tiled repeats[i] times along each dim; repeats past the input's
// dims add leading dims.
OROCHI_ENGINE_API Tensor Repeat(const Tensor& input, const std::vector<int64_t>& repeats);
// torch.flip: a copy with the order along each of `dims` reversed.
OROCHI_ENGINE_API Tensor Flip(const Tensor& input, const std::vector<int64_t>& dims);
// torch.nn.functional.pad, constant mode: `pad` holds (before, after) pairs for the last dim,
// then the one before it, ...; padding reads `value`, and negative sizes crop.
OROCHI_ENGINE_API Tensor Pad(const Tensor& input, const std::vector<int64_t>& pad,
                             double value = 0);
// torch.index_select: slices of `input` along `dim` picked by a 1-D integer `index`.
OROCHI_ENGINE_API Tensor IndexSelect(const Tensor& input, int64_t dim, const Tensor& index);
// torch.gather: out[i][j][k] = input[index[i][j][k]][j][k] for dim 0, and so on; `index` has
// input's rank and is no larger than input in the other dims.
OROCHI_ENGINE_API Tensor Gather(const Tensor& input, int64_t dim, const Tensor& index);
// torch.nn.functional.embedding: weight[indices] for integer indices of any shape.
OROCHI_ENGINE_API Tensor Embedding(const Tensor& indices, const Tensor& weight);

// --- creation, continued -----------------------------------------------------------------------
OROCHI_ENGINE_API Tensor Eye(int64_t rows, std::optional<int64_t> columns = {},
                             DType dtype = DType::kFloat32, Device device = {});
OROCHI_ENGINE_API Tensor Linspace(double start, double end, int64_t steps,
                                  DType dtype = DType::kFloat32, Device device = {});

// --- normalisation -----------------------------------------------------------------------------
// Over the trailing dims given by `normalized_shape`; weight and bias (that shape) optional.
OROCHI_ENGINE_API Tensor LayerNorm(const Tensor& input, const Shape& normalized_shape,
                                   const std::optional<Tensor>& weight = {},
                                   const std::optional<Tensor>& bias = {}, double eps = 1e-5);
OROCHI_ENGINE_API Tensor RmsNorm(const Tensor& input, const Shape& normalized_shape,
                                 const std::optional<Tensor>& weight = {}, double eps = 1e-6);

// --- linear algebra ----------------------------------------------------------------------------
// torch.matmul: 1-D and 2-D operands, and batched operands with broadcast batch dims.
OROCHI_ENGINE_API Tensor Matmul(const Tensor& a, const Tensor& b);
// torch.bmm: [b, n, m] x [b, m, p], no broadcasting.
OROCHI_ENGINE_API Tensor Bmm(const Tensor& a, const Tensor& b);
// torch.nn.functional.linear: input @ weight.T + bias.
OROCHI_ENGINE_API Tensor Linear(const Tensor& input, const Tensor& weight,
                                const std::optional<Tensor>& bias = {});
// torch.nn.functional.scaled_dot_product_attention over [..., L, E] queries and [..., S, E]
// keys and values, with an optional bool mask (true = attend) or additive float mask, or causal.
OROCHI_ENGINE_API Tensor ScaledDotProductAttention(const Tensor& query, const Tensor& key,
                                                   const Tensor& value,
                                                   const std::optional<Tensor>& mask = {},
                                                   bool causal = false,
                                                   std::optional<double> scale = {});

// --- convolution and pooling (NCHW) ------------------------------------------------------------
struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
  // An epilogue, applied after the bias in this order: relu?(conv(x) + bias + residual?). On the
  // CPU oneDNN applies it as it writes the output (post-ops), saving a pass over it per step.
  std::optional<Tensor> residual;  // the output's shape, dtype and device
  bool relu = false;
};
// torch.nn.functional.conv2d: input [N, C, H, W] (or [C, H, W]), weight [O, C/groups, kh, kw].
OROCHI_ENGINE_API Tensor Conv2d(const Tensor& input, const Tensor& weight,
                                const std::optional<Tensor>& bias = {},
                                const Conv2dOptions& options = {});
// torch.nn.functional.conv1d: input [N, C, L] (or [C, L]), weight [O, C/groups, k].
OROCHI_ENGINE_API Tensor Conv1d(const Tensor& input, const Tensor& weight,
                                const std::optional<Tensor>& bias = {}, int64_t stride = 1,
                                int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1);
// max_pool2d / avg_pool2d (avg counts padding, as PyTorch's default); stride defaults to kernel.
OROCHI_ENGINE_API Tensor MaxPool2d(const Tensor& input, std::array<int64_t, 2> kernel,
                                   std::optional<std::array<int64_t, 2>> stride = {},
                                   std::array<int64_t, 2> padding = {0, 0});
OROCHI_ENGINE_API Tensor AvgPool2d(const Tensor& input, std::array<int64_t, 2> kernel,
                                   std::optional<std::array<int64_t, 2>> stride = {},
                                   std::array<int64_t, 2> padding = {0, 0});
OROCHI_ENGINE_API Tensor AdaptiveAvgPool2d(const Tensor& input, std::array<int64_t, 2> output_size);
// Inference batch norm over dim 1: (x - mean) / sqrt(var + eps) * weight + bias.
OROCHI_ENGINE_API Tensor BatchNorm(const Tensor& input, const Tensor& running_mean,
                                   const Tensor& running_var, const std::optional<Tensor>& weight,
                                   const std::optional<Tensor>& bias, double eps = 1e-5);

// torch.nn.utils.fusion.fuse_conv_bn_weights: the weight and bias of the convolution equal to
// `conv_weight` [O, ...] (and `conv_bias`) followed by an eval-mode batch norm over its O
// channels. Computed in float64 and rounded once to the weight's dtype; both results are
// read-only. When the conv weight is read-only (loaded weights), the result is made once and
// kept with the weight's storage (Storage::PreparedLayout, keyed by the weight's view and the
// values of every other argument): each interpreter copy that folds the same batch norm into
// the same weight gets the same tensors, so the folded weights are held once, not per copy.
struct FoldedConv {
  Tensor weight;
  Tensor bias;
};
OROCHI_ENGINE_API FoldedConv FoldBatchNorm(const Tensor& conv_weight,
                                           const std::optional<Tensor>& conv_bias,
                                           const Tensor& running_mean, const Tensor& running_var,
                                           double eps, const std::optional<Tensor>& weight,
                                           const std::optional<Tensor>& bias);

// --- sorting and selection ----------------------------------------------------------------------
struct SortResult {
  Tensor values;
  Tensor indices;  // int64
};
// torch.sort along `dim` (stable; NaN sorts as the largest value).
OROCHI_ENGINE_API SortResult Sort(const Tensor& input, int64_t dim = -1, bool descending = false);
// torch.topk: the k largest (or smallest) along `dim`, in sorted order.
OROCHI_ENGINE_API SortResult TopK(const Tensor& input, int64_t k, int64_t dim = -1,
                                  bool largest = true);
// torch.masked_select: the elements where `mask` (bool, broadcast) is true, as a 1-D tensor.
OROCHI_ENGINE_API Tensor MaskedSelect(const Tensor& input, const Tensor& mask);

// --- random numbers (seeded, reproducible; not PyTorch's streams) ------------------------------
// Drawn on the CPU and copied to `device`: the same seed gives the same values everywhere.
OROCHI_ENGINE_API Tensor Rand(const Shape& shape, uint64_t seed, DType dtype = DType::kFloat32,
                              Device device = {});
OROCHI_ENGINE_API Tensor Randn(const Shape& shape, uint64_t seed, DType dtype = DType::kFloat32,
                               Device device = {});

}  // namespace orochi::engine
