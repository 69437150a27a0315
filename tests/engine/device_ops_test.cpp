// The all-ops consistency test: every engine op, in every dtype its CUDA kernel registers, run on
// the CPU and on cuda:0 from the same inputs, compared with tolerances per dtype (in the manner
// of ggml's test-backend-ops). The case table must cover every op of OROCHI_ENGINE_OPS; that
// check runs everywhere, the comparisons only where a CUDA GPU is usable.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "dispatch.h"
#include "engine_test_support.h"
#include "orochi/engine/cpu_math.h"
#include "orochi/engine/device.h"

namespace orochi::engine {
namespace {

constexpr Device kCpu{};
constexpr Device kCuda0{DeviceType::kCuda, 0};

using Tensors = std::vector<Tensor>;

struct OpCase {
  std::string name;
  // The registry ops the case runs; it is run in every dtype the CUDA kernel of ops[0] takes.
  std::vector<Op> ops;
  // Inputs on the CPU for `dtype` (moved to the device under test by the harness).
  std::function<Tensors(DType)> inputs;
  // The ops under test, on inputs that are on `device`; creation ops take `device` too.
  std::function<Tensors(const Tensors&, Device, DType)> run;
  // Multiplies the dtype's tolerance (long accumulations, tensor-core GEMMs).
  double tolerance_scale = 1;
};

// Values in [low, high) as `dtype`: integers rounded, unsigned types and bool kept non-negative.
Tensor Input(const Shape& shape, DType dtype, double low, double high, unsigned seed) {
  if (dtype == DType::kBool) return RandomTensor(shape, DType::kFloat32, 0, 1, seed).To(dtype);
  if (dtype == DType::kUInt8) {
    low = std::max(low, 0.0);
    high = std::max(high, low + 3);
  }
  return RandomTensor(shape, dtype, low, high, seed);
}

double DeviceTolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 2e-3;  // a rounding step of float16 (2^-10) and a little
    case DType::kBFloat16:
      return 1.6e-2;  // two rounding steps of bfloat16 (2^-8 each)
    case DType::kFloat32:
      return 1e-5;
    case DType::kFloat64:
      return 1e-10;
    default:
      return 0;  // integers and bool are exact
  }
}

bool IsUnsigned(DType dtype) { return dtype == DType::kUInt8 || dtype == DType::kBool; }

// --- the table -------------------------------------------------------------------------------

std::vector<OpCase> Cases() {
  std::vector<OpCase> cases;
  const Shape shape{4, 5, 6};

  cases.push_back({"copy: contiguous, strided and converting copies",
                   {Op::copy},
                   [=](DType dtype) { return Tensors{Input(shape, dtype, 0, 4, 1)}; },
                   [](const Tensors& in, Device, DType) {
                     Tensors out{in[0].Transpose(0, 2).Contiguous(), in[0].Clone(),
                                 in[0].Slice(1, 0, 5, 2).Contiguous()};
                     for (DType to : kAllDTypeList) out.push_back(in[0].To(to));
                     // A copy into a strided destination (cat writes through views).
                     out.push_back(Cat({in[0], in[0].Narrow(0, 1, 2)}, 0));
                     return out;
                   }});
  cases.push_back(
      {"copy: floating values outside the integers' range, NaN and infinities to integers",
       {Op::copy},
       [](DType dtype) {
         if (!IsFloating(dtype)) return Tensors{};
         const double inf = std::numeric_limits<double>::infinity();
         const std::vector<double> values{
             -1.5,    -200.75, 300.25,
             70000.5, -3e9,    5e9,
             1e30,    -1e30,   std::numeric_limits<double>::quiet_NaN(),
             inf,     -inf};
         Tensor tensor = Tensor::Empty({static_cast<int64_t>(values.size())}, dtype);
         for (size_t i = 0; i < values.size(); ++i) {
           tensor.Narrow(0, static_cast<int64_t>(i), 1).CopyFrom(Scalar(values[i], dtype));
         }
         return Tensors{tensor};
       },
       [](const Tensors& in, Device, DType) {
         Tensors out;
         if (in.empty()) return out;
         for (DType to : kAllDTypeList) {
           if (!IsFloating(to)) out.push_back(in[0].To(to));
         }
         return out;
       }});
  cases.push_back({"fill",
                   {Op::fill},
                   [](DType) { return Tensors{}; },
                   [=](const Tensors&, Device device, DType dtype) {
                     return Tensors{Full(shape, 2.5, dtype, device), Zeros({7}, dtype, device),
                                    Ones({3, 3}, dtype, device), Full({}, 1.75, dtype, device)};
                   }});
  cases.push_back({"arange and linspace",
                   {Op::arange},
                   [](DType) { return Tensors{}; },
                   [](const Tensors&, Device device, DType dtype) {
                     Tensors out{Arange(1, 100, 3, dtype, device)};
                     if (IsFloating(dtype)) {
                       out.push_back(Arange(-2, 2, 0.25, dtype, device));
                       out.push_back(Linspace(-1, 1, 17, dtype, device));
                     }
                     if (IsIntegral(dtype)) {
                       out.push_back(IntegerArange(2, 40, 3, dtype, device));
                       out.push_back(IntegerArange(40, 2, -7, dtype, device));
                     }
                     if (dtype == DType::kInt64) {  // past 2^53, where doubles are not exact
                       constexpr int64_t kLarge = int64_t{1} << 62;
                       out.push_back(IntegerArange(kLarge, kLarge + 50, 7, dtype, device));
                       out.push_back(
                           IntegerArange(kLarge, -kLarge, -(kLarge / 3) - 1, dtype, device));
                     }
                     return out;
                   }});

  const std::vector<Op> unary_ops{Op::neg,   Op::abs,  Op::exp,  Op::log,       Op::sqrt,
                                  Op::rsqrt, Op::sin,  Op::cos,  Op::tanh,      Op::sigmoid,
                                  Op::relu,  Op::silu, Op::gelu, Op::gelu_tanh, Op::erf,
                                  Op::floor, Op::ceil, Op::round};
  for (Op op : unary_ops) {
    const bool positive = op == Op::log || op == Op::sqrt || op == Op::rsqrt;
    cases.push_back(
        {std::string(OpName(op)),
         {op},
         [=](DType dtype) { return Tensors{Input(shape, dtype, positive ? 0.1 : -3, 3, 2)}; },
         [op](const Tensors& in, Device, DType) {
           return Tensors{Unary(op, in[0]), Unary(op, in[0].Transpose(0, 2))};
         }});
  }

  const std::vector<Op> binary_ops{
      Op::add,       Op::sub,     Op::mul,     Op::div,         Op::pow,        Op::floor_divide,
      Op::remainder, Op::maximum, Op::minimum, Op::eq,          Op::ne,         Op::lt,
      Op::le,        Op::gt,      Op::ge,      Op::logical_and, Op::logical_or, Op::logical_xor};
  for (Op op : binary_ops) {
    cases.push_back(
        {std::string(OpName(op)),
         {op},
         [op](DType dtype) {
           const bool power = op == Op::pow;
           // Integer powers stay small; floating bases stay positive (no NaN from fractions).
           Tensor base = Input({4, 1, 6}, dtype, power && IsFloating(dtype) ? 0.1 : -4, 4, 3);
           Tensor exponent = Input({5, 1}, dtype, power ? 0 : -4, power ? 3 : 4, 4);
           Tensor same = Input({4, 5, 6}, dtype, power ? 0.1 : -4, power ? 2 : 4, 5);
           // Contiguous operands run in 16-byte packs: a length that leaves a tail in every dtype.
           Tensor long_left = Input({1001}, dtype, power ? 0.1 : -4, power ? 2 : 4, 47);
           Tensor long_right = Input({1001}, dtype, power ? 0 : -4, power ? 3 : 4, 48);
           if ((op == Op::div || op == Op::floor_divide || op == Op::remainder) &&
               !IsUnsigned(dtype)) {  // no x / 0
             exponent = Binary(Op::add, Binary(Op::mul, exponent, exponent), Scalar(1, dtype));
             long_right =
                 Binary(Op::add, Binary(Op::mul, long_right, long_right), Scalar(1, dtype));
           }
           return Tensors{base, exponent, same, long_left, long_right};
         },
         [op](const Tensors& in, Device, DType dtype) {
           return Tensors{Binary(op, in[0], in[1]),  // broadcast to [4, 5, 6]
                          Binary(op, in[2], in[2].Transpose(1, 2).Transpose(1, 2)),
                          Binary(op, in[2], Scalar(2, dtype)),  // a CPU scalar follows
                          Binary(op, in[3], in[4]),
                          // one operand off the packs' alignment: item by item
                          Binary(op, in[3].Narrow(0, 1, 1000), in[4].Narrow(0, 0, 1000))};
         }});
  }

  cases.push_back({"where",
                   {Op::where},
                   [=](DType dtype) {
                     return Tensors{Input({4, 1, 6}, DType::kBool, 0, 1, 6),
                                    Input({5, 1}, dtype, -4, 4, 7), Input(shape, dtype, -4, 4, 8)};
                   },
                   [](const Tensors& in, Device, DType dtype) {
                     return Tensors{Where(in[0], in[1], in[2]),
                                    Where(in[0], in[2], Scalar(1, dtype)),
                                    MaskedFill(in[2], in[0], Scalar(3, dtype))};
                   }});

  for (Op op : {Op::sum, Op::mean, Op::amax, Op::amin, Op::prod}) {
    cases.push_back(
        {std::string(OpName(op)),
         {op},
         [op](DType dtype) {
           const bool product = op == Op::prod;
           // Products of values near 1 neither overflow nor vanish.
           return Tensors{Input({4, 5, 6}, dtype, product ? 0.5 : -4, product ? 1.5 : 4, 9),
                          Input({3, 5000}, dtype, product ? 0.999 : -4, product ? 1.001 : 4, 10),
                          // Few long rows, which the CUDA kernel splits across blocks.
                          Input({2, 150000}, dtype, product ? 0.999 : -4, product ? 1.001 : 4, 46)};
         },
         [op](const Tensors& in, Device, DType) {
           return Tensors{Reduce(op, in[0]),         Reduce(op, in[0], {1}),
                          Reduce(op, in[0], {0, 2}), Reduce(op, in[0], {2}, true),
                          Reduce(op, in[1], {1}),    Reduce(op, in[1], {0}),
                          Reduce(op, in[2], {1}),    Reduce(op, in[2])};
         },
         /*tolerance_scale=*/op == Op::prod ? 10.0 : 1.0});
  }
  for (Op op : {Op::argmax, Op::argmin}) {
    cases.push_back({std::string(OpName(op)),
                     {op},
                     [](DType dtype) {
                       // Integers repeat values: the first extreme must win on both devices.
                       return Tensors{Input({4, 5, 6}, dtype, -3, 3, 11),
                                      Input({2, 3000}, dtype, -3, 3, 12),
                                      Input({200000}, dtype, -3, 3, 47)};
                     },
                     [op](const Tensors& in, Device, DType) {
                       return Tensors{ArgReduce(op, in[0]), ArgReduce(op, in[0], 1),
                                      ArgReduce(op, in[0], 2, true), ArgReduce(op, in[1], 1),
                                      ArgReduce(op, in[2], 0)};
                     }});
  }

  for (Op op : {Op::layer_norm, Op::rms_norm}) {
    cases.push_back(
        {std::string(OpName(op)),
         {op},
         [](DType dtype) {
           return Tensors{Input({4, 5, 6}, dtype, -3, 3, 13), Input({6}, dtype, 0.5, 1.5, 14),
                          Input({6}, dtype, -1, 1, 15), Input({3, 700}, dtype, -3, 3, 16),
                          Input({700}, dtype, 0.5, 1.5, 17),
                          // past 2048: a block per row rather than a warp
                          Input({2, 3000}, dtype, -3, 3, 49)};
         },
         [op](const Tensors& in, Device, DType) {
           if (op == Op::layer_norm) {
             return Tensors{LayerNorm(in[0], {6}, in[1], in[2]), LayerNorm(in[0], {5, 6}),
                            LayerNorm(in[3], {700}, in[4]), LayerNorm(in[5], {3000})};
           }
           return Tensors{RmsNorm(in[0], {6}, in[1]), RmsNorm(in[3], {700}, in[4]),
                          RmsNorm(in[5], {3000})};
         },
         /*tolerance_scale=*/4});
  }

  for (Op op : {Op::softmax, Op::log_softmax}) {
    cases.push_back(
        {std::string(OpName(op)),
         {op},
         [](DType dtype) {
           Tensor with_infinity = Input({3, 9}, dtype, -3, 3, 19);
           with_infinity.Narrow(1, 2, 1).CopyFrom(
               Scalar(-std::numeric_limits<double>::infinity(), dtype));
           return Tensors{Input({4, 5, 6}, dtype, -5, 5, 18), with_infinity,
                          Input({2, 1000}, dtype, -5, 5, 20)};
         },
         [op](const Tensors& in, Device, DType) {
           auto apply = [op](const Tensor& x, int64_t dim) {
             return op == Op::softmax ? Softmax(x, dim) : LogSoftmax(x, dim);
           };
           return Tensors{apply(in[0], -1), apply(in[0], 0), apply(in[1], 1), apply(in[2], 1)};
         },
         /*tolerance_scale=*/4});
  }

  cases.push_back(
      {"cumsum",
       {Op::cumsum},
       [](DType dtype) {
         return Tensors{Input({4, 5, 6}, dtype, -5, 5, 24), Input({3, 300}, dtype, 0, 1, 25)};
       },
       [](const Tensors& in, Device, DType) {
         return Tensors{Cumsum(in[0], -1), Cumsum(in[0], 0), Cumsum(in[1], 1)};
       },
       /*tolerance_scale=*/8});

  cases.push_back(
      {"index_select, embedding and gather",
       {Op::index_select},
       [](DType dtype) {
         return Tensors{Input({5, 4, 3}, dtype, -4, 4, 21), Arange(0, 5, 1, DType::kInt64),
                        RandomTensor({7}, DType::kInt64, 0, 3.4, 22),
                        RandomTensor({2, 4, 3}, DType::kInt64, 0, 3.4, 23)};
       },
       [](const Tensors& in, Device, DType) {
         return Tensors{IndexSelect(in[0], 0, in[2]), IndexSelect(in[0], 1, in[2]),
                        IndexSelect(in[0], 2, in[1].Narrow(0, 0, 2)),
                        Embedding(in[3], in[0].Reshape({5, 12})), Gather(in[0], 1, in[3])};
       }});

  cases.push_back({"repeat, split with sizes and pad",
                   {Op::copy, Op::fill},
                   [](DType dtype) {
                     return Tensors{Input({3, 4, 5}, dtype, -4, 4, 24)};
                   },
                   [](const Tensors& in, Device, DType) {
                     Tensors out{Repeat(in[0], {2, 1, 3}),
                                 Repeat(in[0].Transpose(0, 2), {2, 1, 1, 2}),
                                 Repeat(in[0], {1, 0, 1}),
                                 Pad(in[0], {1, 2, 0, 1}, 3),
                                 Pad(in[0].Transpose(1, 2), {2, 0, 1, 1, 1, 0}),
                                 Pad(in[0], {-1, 2, 1, -2}, 1)};  // negative sizes crop
                     for (const Tensor& piece : SplitWithSizes(in[0], {1, 3, 0, 1}, -1)) {
                       out.push_back(piece.Contiguous());
                     }
                     return out;
                   }});

  cases.push_back({"flip",
                   {Op::index_select},
                   [](DType dtype) {
                     return Tensors{Input({3, 4, 5}, dtype, -4, 4, 25)};
                   },
                   [](const Tensors& in, Device, DType) {
                     return Tensors{Flip(in[0], {0}), Flip(in[0], {0, 2}),
                                    Flip(in[0].Transpose(0, 1), {-1}), Flip(in[0], {})};
                   }});

  cases.push_back(
      {"conv2d: strides, padding, dilation, groups, depthwise, 1x1 and the epilogue",
       {Op::conv2d},
       [](DType dtype) {
         return Tensors{Input({2, 4, 9, 8}, dtype, -2, 2, 24),
                        Input({6, 4, 3, 3}, dtype, -1, 1, 25),
                        Input({6}, dtype, -1, 1, 26),
                        Input({4, 2, 3, 3}, dtype, -1, 1, 27),
                        Input({4, 1, 3, 3}, dtype, -1, 1, 38),
                        Input({16, 4, 1, 1}, dtype, -1, 1, 39),
                        Input({1, 32, 14, 14}, dtype, -1, 1, 42),
                        Input({64, 32, 3, 3}, dtype, -1, 1, 43),
                        Input({2, 6, 9, 8}, dtype, -2, 2, 44)};
       },
       [](const Tensors& in, Device, DType) {
         Conv2dOptions epilogue{{1, 1}, {1, 1}, {1, 1}, 1};
         epilogue.residual = in[8];  // relu(conv2d + bias + residual): fused on the CPU
         epilogue.relu = true;
         return Tensors{
             Conv2d(in[0], in[1], in[2]), Conv2d(in[0], in[1], in[2], epilogue),
             Conv2d(in[0], in[1], std::nullopt, {{2, 1}, {1, 2}, {1, 1}, 1}),
             Conv2d(in[0], in[3], std::nullopt, {{1, 1}, {1, 1}, {2, 2}, 2}),
             Conv2d(in[0], in[4], std::nullopt, {{1, 1}, {1, 1}, {1, 1}, 4}),  // depthwise
             Conv2d(in[0], in[5]),                                             // 1x1
             Conv2d(in[0].Select(0, 1), in[1], in[2], {{1, 1}, {1, 1}, {1, 1}, 1}),
             // Wide enough for cuDNN's tensor-core algorithms; a ResNet layer's shape.
             Conv2d(in[6], in[7], std::nullopt, {{1, 1}, {1, 1}, {1, 1}, 1}),
             Conv1d(in[0].Select(2, 0), in[1].Select(2, 1), in[2], 1, 1, 1, 1),
             // No input channels: the bias alone (cuDNN refuses empty operands).
             Conv2d(in[0].Narrow(1, 0, 0), in[1].Narrow(1, 0, 0), in[2])};
       },
       /*tolerance_scale=*/8});
  cases.push_back(
      {"im2col: pooling",
       {Op::im2col, Op::amax, Op::mean},
       [](DType dtype) {
         return Tensors{Input({2, 4, 9, 8}, dtype, -2, 2, 24), Input({4}, dtype, -1, 1, 26)};
       },
       [](const Tensors& in, Device, DType dtype) {
         Tensors out;
         if (IsFloating(dtype)) {
           out.push_back(MaxPool2d(in[0], {3, 3}, {{2, 2}}, {1, 1}));
           out.push_back(AvgPool2d(in[0], {2, 2}));
           out.push_back(AdaptiveAvgPool2d(in[0], {1, 1}));
           out.push_back(BatchNorm(in[0], in[1], Unary(Op::abs, in[1]), {}, {}));
         }
         return out;
       },
       /*tolerance_scale=*/4});

  cases.push_back(
      {"sort and topk",
       {Op::sort},
       [](DType dtype) {
         Tensor values = Input({3, 50}, dtype, -5, 5, 28);
         if (IsFloating(dtype)) {  // NaN sorts as the largest value; -0.0 == 0.0
           values.Narrow(1, 3, 2).CopyFrom(Scalar(std::numeric_limits<double>::quiet_NaN(), dtype));
           values.Narrow(1, 7, 1).CopyFrom(Scalar(-0.0, dtype));
           values.Narrow(1, 9, 1).CopyFrom(Scalar(0.0, dtype));
         }
         return Tensors{values, Input({2, 5000}, dtype, -100, 100, 29),
                        Input({6, 5, 4}, dtype, -3, 3, 30)};
       },
       [](const Tensors& in, Device, DType) {
         Tensors out;
         for (bool descending : {false, true}) {
           for (const SortResult& sorted : {Sort(in[0], 1, descending), Sort(in[1], -1, descending),
                                            Sort(in[2], 0, descending)}) {
             out.push_back(sorted.values);
             out.push_back(sorted.indices);
           }
         }
         SortResult top = TopK(in[1], 7);
         out.push_back(top.values);
         out.push_back(top.indices);
         return out;
       }});

  cases.push_back({"matmul, bmm and linear",
                   {Op::matmul},
                   [](DType dtype) {
                     return Tensors{Input({5, 64}, dtype, -2, 2, 31),
                                    Input({64, 3}, dtype, -2, 2, 32),
                                    Input({2, 3, 4, 16}, dtype, -2, 2, 33),
                                    Input({16, 6}, dtype, -2, 2, 34),
                                    Input({2, 1, 16, 5}, dtype, -2, 2, 35),
                                    Input({64}, dtype, -2, 2, 36),
                                    Input({3}, dtype, -2, 2, 37),
                                    Input({2, 3, 1, 21}, dtype, -2, 2, 38),
                                    Input({2, 3, 21, 19}, dtype, -2, 2, 39),
                                    Input({2, 3, 19, 21}, dtype, -2, 2, 40)};
                   },
                   [](const Tensors& in, Device, DType) {
                     return Tensors{Matmul(in[0], in[1]),
                                    Matmul(in[2], in[3]),
                                    Matmul(in[2], in[4]),  // broadcast batch dims
                                    Matmul(in[5], in[1]),  // 1-D operands
                                    Matmul(in[0], in[5]),
                                    Bmm(in[2].Reshape({6, 4, 16}), in[2].Reshape({6, 16, 4})),
                                    Linear(in[0], in[1].Transpose(0, 1), in[6]),
                                    Matmul(in[2], in[2].Transpose(-2, -1)),  // q @ k^T
                                    Matmul(in[0].Transpose(0, 1).Contiguous().Transpose(0, 1),
                                           in[1]),  // column-major left operand
                                    Matmul(in[0].Narrow(1, 0, 0), in[1].Narrow(0, 0, 0)),
                                    Matmul(in[7], in[8]),  // attention's weights @ values
                                    Matmul(in[7], in[9].Transpose(-2, -1))};  // q @ k^T, k = 21
                   },
                   /*tolerance_scale=*/8});

  return cases;
}

// --- the harness -------------------------------------------------------------------------------

std::vector<DType> RegisteredDTypes(Op op, Device device) {
  std::vector<DType> dtypes;
  for (DType dtype : kAllDTypeList) {
    try {
      Kernels().FindErased(op, device, dtype);
      dtypes.push_back(dtype);
    } catch (const Error&) {
    }
  }
  return dtypes;
}

Tensors OnDevice(const Tensors& tensors, Device device) {
  Tensors moved;
  for (const Tensor& tensor : tensors) moved.push_back(tensor.To(device));
  return moved;
}

// Compares the values of two CPU tensors of one shape; `dtypes` says whether their dtypes must
// match too. Returns the failures.
int CompareValues(const Tensor& actual, const Tensor& expected, double tolerance,
                  const std::string& what, const std::string& actual_name,
                  const std::string& expected_name, bool dtypes = true) {
  if (actual.shape() != expected.shape() || (dtypes && actual.dtype() != expected.dtype())) {
    ADD_FAILURE() << what << ": got " << ShapeString(actual.shape()) << " "
                  << DTypeName(actual.dtype()) << ", expected " << ShapeString(expected.shape())
                  << " " << DTypeName(expected.dtype());
    return 1;
  }
  int failures = 0;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const double got = actual.ItemAsDouble(i);
    const double want = expected.ItemAsDouble(i);
    const bool same = (std::isnan(got) && std::isnan(want)) || got == want ||
                      std::abs(got - want) <= tolerance * (1 + std::abs(want));
    if (!same && failures++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << got << " on " << actual_name
                    << " and " << want << " on " << expected_name;
    }
  }
  return failures;
}

// Compares `actual` (from the device) with `expected` (from the CPU); returns the failures.
int Compare(const Tensor& actual_on_device, const Tensor& expected, double tolerance,
            const std::string& what) {
  if (actual_on_device.device() != kCuda0) {
    ADD_FAILURE() << what << ": the result is on " << DeviceName(actual_on_device.device())
                  << ", not cuda:0";
    return 1;
  }
  return CompareValues(actual_on_device.To(kCpu), expected, tolerance, what, "cuda:0", "the cpu");
}

TEST(DeviceOps, TheCaseTableCoversEveryOp) {
  std::set<Op> covered;
  for (const OpCase& op_case : Cases()) covered.insert(op_case.ops.begin(), op_case.ops.end());
  for (Op op : kAllOps) {
    EXPECT_TRUE(covered.count(op) == 1) << OpName(op) << " has no case in device_ops_test.cpp";
  }
}

// The table itself, checked without a GPU: every case runs on the CPU, in every dtype of the CPU
// kernel, twice with the same result.
TEST(DeviceOps, TheCaseTableRunsOnTheCpu) {
  for (const OpCase& op_case : Cases()) {
    for (DType dtype : RegisteredDTypes(op_case.ops.front(), kCpu)) {
      const std::string what = op_case.name + " (" + std::string(DTypeName(dtype)) + ")";
      try {
        const Tensors inputs = op_case.inputs(dtype);
        const Tensors first = op_case.run(inputs, kCpu, dtype);
        const Tensors second = op_case.run(inputs, kCpu, dtype);
        ASSERT_EQ(first.size(), second.size()) << what;
        for (size_t i = 0; i < first.size(); ++i) {
          EXPECT_EQ(first[i].device(), kCpu) << what;
          std::vector<double> a = Values(first[i]);
          std::vector<double> b = Values(second[i]);
          ASSERT_EQ(a.size(), b.size()) << what;
          for (size_t j = 0; j < a.size(); ++j) {
            EXPECT_TRUE(a[j] == b[j] || (std::isnan(a[j]) && std::isnan(b[j])))
                << what << " output " << i << " element " << j;
          }
        }
      } catch (const Error& error) {
        ADD_FAILURE() << what << " threw: " << error.what();
      }
    }
  }
}

// Switches the CPU's vectorised kernels to `isa` for one scope (cpu_math.h).
class CpuIsaScope {
 public:
  explicit CpuIsaScope(CpuVectorIsa isa) : previous_(CpuVectorIsaInUse()) { SetCpuVectorIsa(isa); }
  ~CpuIsaScope() { SetCpuVectorIsa(previous_); }
  CpuIsaScope(const CpuIsaScope&) = delete;
  CpuIsaScope& operator=(const CpuIsaScope&) = delete;

 private:
  CpuVectorIsa previous_;
};

// The instruction sets of the vectorised CPU kernels that this CPU runs (none: scalar only).
std::vector<CpuVectorIsa> VectorIsas() {
  std::vector<CpuVectorIsa> isas;
  for (CpuVectorIsa isa : {CpuVectorIsa::kAvx2, CpuVectorIsa::kAvx512}) {
    if (isa <= CpuVectorIsaSupported()) isas.push_back(isa);
  }
  return isas;
}

// OROCHI_CPU_ISA caps the instruction set chosen at start-up (ctest runs this file once more
// with OROCHI_CPU_ISA=scalar); without it the engine uses the widest the CPU has.
TEST(CpuMath, TheEnvironmentChoosesTheInstructionSet) {
  const char* wanted = std::getenv("OROCHI_CPU_ISA");
  if (wanted == nullptr || *wanted == '\0') {
    EXPECT_EQ(CpuVectorIsaInUse(), CpuVectorIsaSupported());
  } else {
    EXPECT_EQ(CpuVectorIsaName(CpuVectorIsaInUse()), wanted);
  }
}

// Every case, in every dtype of the CPU kernel, gives the same results (within the dtype's
// tolerance) with the scalar kernels and with each vectorised instruction set.
TEST(DeviceOps, TheCpuVectorKernelsMatchTheScalarOnes) {
  if (VectorIsas().empty()) GTEST_SKIP() << "this CPU has no AVX2: only the scalar kernels run";
  for (const OpCase& op_case : Cases()) {
    for (DType dtype : RegisteredDTypes(op_case.ops.front(), kCpu)) {
      const Tensors inputs = op_case.inputs(dtype);
      Tensors scalar;
      {
        CpuIsaScope scope(CpuVectorIsa::kScalar);
        scalar = op_case.run(inputs, kCpu, dtype);
      }
      for (CpuVectorIsa isa : VectorIsas()) {
        const std::string what = op_case.name + " (" + std::string(DTypeName(dtype)) + ", " +
                                 std::string(CpuVectorIsaName(isa)) + ")";
        CpuIsaScope scope(isa);
        const Tensors vector = op_case.run(inputs, kCpu, dtype);
        ASSERT_EQ(vector.size(), scalar.size()) << what;
        for (size_t i = 0; i < vector.size(); ++i) {
          CompareValues(
              vector[i], scalar[i], DeviceTolerance(scalar[i].dtype()) * op_case.tolerance_scale,
              what + " output " + std::to_string(i), CpuVectorIsaName(isa).data(), "scalar");
        }
      }
    }
  }
}

// The ops with vectorised kernels, in float32 and the 16-bit floats, against the same inputs
// computed in float64 (whose kernels are scalar): an error the scalar and vector kernels shared
// would show here.
TEST(DeviceOps, TheCpuVectorKernelsMatchAFloat64Reference) {
  const std::set<Op> vectorised{Op::exp,     Op::log,         Op::tanh,       Op::sigmoid, Op::silu,
                                Op::gelu,    Op::gelu_tanh,   Op::erf,        Op::sin,     Op::cos,
                                Op::softmax, Op::log_softmax, Op::layer_norm, Op::rms_norm};
  std::vector<CpuVectorIsa> isas = VectorIsas();
  isas.push_back(CpuVectorIsa::kScalar);
  int checked = 0;
  for (const OpCase& op_case : Cases()) {
    if (vectorised.count(op_case.ops.front()) == 0) continue;
    ++checked;
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      const Tensors inputs = op_case.inputs(dtype);
      Tensors wide_inputs;
      for (const Tensor& input : inputs) wide_inputs.push_back(input.To(DType::kFloat64));
      const Tensors reference = op_case.run(wide_inputs, kCpu, DType::kFloat64);
      for (CpuVectorIsa isa : isas) {
        const std::string what = op_case.name + " (" + std::string(DTypeName(dtype)) + ", " +
                                 std::string(CpuVectorIsaName(isa)) + ")";
        CpuIsaScope scope(isa);
        const Tensors actual = op_case.run(inputs, kCpu, dtype);
        ASSERT_EQ(actual.size(), reference.size()) << what;
        for (size_t i = 0; i < actual.size(); ++i) {
          CompareValues(actual[i], reference[i],
                        DeviceTolerance(actual[i].dtype()) * op_case.tolerance_scale,
                        what + " output " + std::to_string(i), CpuVectorIsaName(isa).data(),
                        "float64", /*dtypes=*/false);
        }
      }
    }
  }
  EXPECT_EQ(checked, static_cast<int>(vectorised.size()));
}

// GELU keeps its relative precision where its value is small: for x < 0, 1 + erf(x / sqrt 2)
// cancels (at x = -5 it is 6e-7, below float32's rounding of 1), so every kernel computes it as
// erfc(-x / sqrt 2). Checked relative to the float64 value on [-8, 8], in every instruction set.
TEST(DeviceOps, GeluIsRelativelyPreciseForNegativeInputs) {
  std::vector<CpuVectorIsa> isas = VectorIsas();
  isas.push_back(CpuVectorIsa::kScalar);
  const Tensor input = Linspace(-8, 8, 1601, DType::kFloat32, kCpu);
  for (CpuVectorIsa isa : isas) {
    CpuIsaScope scope(isa);
    const Tensor output = Unary(Op::gelu, input);
    for (int64_t i = 0; i < input.numel(); ++i) {
      const double x = input.ItemAsDouble(i);
      const double want = 0.5 * x * std::erfc(-x / std::sqrt(2.0));
      // Float32's rounding is 6e-8; the vector kernels' erfc fit and the rounding of x * x in
      // its exp keep within 2e-5 here (the cancelling form was off by 100% from x = -5).
      EXPECT_NEAR(output.ItemAsDouble(i), want, 2e-5 * std::abs(want))
          << "gelu(" << x << ") with " << CpuVectorIsaName(isa);
    }
    // The same bound against values that do not come from the formula above: x * Phi(x) to 40
    // digits by mpmath (Debian's python3-mpmath), written out here. PyTorch's float64 gelu is no
    // reference here: it computes 1 + erf(x / sqrt 2), which cancels (2% off at -8).
    const std::vector<double> inputs{-8, -7, -6, -5, -4, -3};
    const std::vector<double> exact{-4.9767684594174272988e-15, -8.9586878072008450307e-12,
                                    -5.9195258702261888442e-9,  -1.4332578593959695584e-6,
                                    -0.00012668496733247968502, -0.00404969409489028358};
    const Tensor fixed = Unary(Op::gelu, TensorOf({6}, inputs, DType::kFloat32));
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_NEAR(fixed.ItemAsDouble(static_cast<int64_t>(i)), exact[i], 2e-5 * std::abs(exact[i]))
          << "gelu(" << inputs[i] << ") with " << CpuVectorIsaName(isa) << " against mpmath";
    }
  }
}

TEST(DeviceOps, EveryOpAndDTypeMatchesTheCpuOnCuda) {
  if (DeviceCount(DeviceType::kCuda) == 0) {
    GTEST_SKIP() << "no CUDA GPU: " << DeviceTypeStatus(DeviceType::kCuda).message();
  }
  int runs = 0;
  for (const OpCase& op_case : Cases()) {
    for (DType dtype : RegisteredDTypes(op_case.ops.front(), kCuda0)) {
      const std::string what = op_case.name + " (" + std::string(DTypeName(dtype)) + ")";
      SCOPED_TRACE(what);
      try {
        const Tensors inputs = op_case.inputs(dtype);
        const Tensors expected = op_case.run(inputs, kCpu, dtype);
        const Tensors actual = op_case.run(OnDevice(inputs, kCuda0), kCuda0, dtype);
        ASSERT_EQ(actual.size(), expected.size());
        for (size_t i = 0; i < actual.size(); ++i) {
          // Outputs of a floating op may be of another dtype (comparisons give bool).
          const double tolerance = DeviceTolerance(expected[i].dtype()) * op_case.tolerance_scale;
          Compare(actual[i], expected[i], tolerance, what + " output " + std::to_string(i));
        }
        ++runs;
      } catch (const Error& error) {
        ADD_FAILURE() << what << " threw: " << error.what();
      }
    }
  }
  Synchronize(kCuda0);  // any failed asynchronous work surfaces here
  std::printf("ran %d (case, dtype) pairs on cuda:0\n", runs);
}

// float32 matmul with TF32 tensor cores: close to the CPU, not equal.
TEST(DeviceOps, Tf32MatmulIsCloseToTheCpu) {
  if (DeviceCount(DeviceType::kCuda) == 0) {
    GTEST_SKIP() << "no CUDA GPU: " << DeviceTypeStatus(DeviceType::kCuda).message();
  }
  Tensor a = RandomTensor({96, 256}, DType::kFloat32, -1, 1, 40);
  Tensor b = RandomTensor({256, 80}, DType::kFloat32, -1, 1, 41);
  Tensor expected = Matmul(a, b);
  SetAllowTf32(true);
  Tensor actual = Matmul(a.To(kCuda0), b.To(kCuda0));
  SetAllowTf32(false);
  // TF32 keeps 10 mantissa bits of each input: errors of about 2^-11 per product.
  EXPECT_EQ(Compare(actual, expected, 5e-3, "tf32 matmul"), 0);
}

// float32 convolution with TF32 allowed (cuDNN may then pick tensor-core algorithms): close to
// the CPU, and the switch is honoured per call (plans are kept per setting).
TEST(DeviceOps, Tf32ConvolutionIsCloseToTheCpu) {
  if (DeviceCount(DeviceType::kCuda) == 0) {
    GTEST_SKIP() << "no CUDA GPU: " << DeviceTypeStatus(DeviceType::kCuda).message();
  }
  Tensor input = RandomTensor({4, 64, 28, 28}, DType::kFloat32, -1, 1, 44);
  Tensor weight = RandomTensor({128, 64, 3, 3}, DType::kFloat32, -0.1, 0.1, 45);
  const Conv2dOptions options{{1, 1}, {1, 1}, {1, 1}, 1};
  Tensor expected = Conv2d(input, weight, std::nullopt, options);
  SetAllowTf32(true);
  Tensor fast = Conv2d(input.To(kCuda0), weight.To(kCuda0), std::nullopt, options);
  SetAllowTf32(false);
  Tensor exact = Conv2d(input.To(kCuda0), weight.To(kCuda0), std::nullopt, options);
  EXPECT_EQ(Compare(fast, expected, 5e-3, "tf32 conv2d"), 0);
  EXPECT_EQ(Compare(exact, expected, 1e-4, "fp32 conv2d"), 0);

  // TF32 keeps float32's range: values far beyond float16's (65504) must not overflow, which
  // they would under an algorithm that converts float32 to float16.
  // Scaled back, the result is the first one's, within the same tolerance.
  Tensor large = Binary(Op::mul, input, Scalar(1e6, DType::kFloat32));
  SetAllowTf32(true);
  Tensor large_fast = Conv2d(large.To(kCuda0), weight.To(kCuda0), std::nullopt, options);
  SetAllowTf32(false);
  Tensor scaled_back = Binary(Op::mul, large_fast, Scalar(1e-6, DType::kFloat32));
  EXPECT_EQ(Compare(scaled_back, expected, 5e-3, "tf32 conv2d of large values"), 0);
}

}  // namespace
}  // namespace orochi::engine
