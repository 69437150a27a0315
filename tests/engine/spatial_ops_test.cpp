// Convolution, pooling, batch norm, sorting, masked selection and random tensors against
// references computed here, and (where a reference would repeat the op's own formula: output
// sizes, window bounds, padding that counts, batch norm) against values PyTorch computed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine_test_support.h"
#include "orochi/engine/error.h"

namespace orochi::engine {
namespace {

// Direct convolution in double: the definition, no unfolding.
std::vector<double> ReferenceConv2d(const Tensor& input, const Tensor& weight, const Tensor* bias,
                                    const Conv2dOptions& o, Shape* shape) {
  const int64_t n = input.shape()[0], c = input.shape()[1], h = input.shape()[2],
                w = input.shape()[3];
  const int64_t out_c = weight.shape()[0], kh = weight.shape()[2], kw = weight.shape()[3];
  const int64_t oh = (h + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
  const int64_t ow = (w + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
  const int64_t per_group = c / o.groups;
  *shape = {n, out_c, oh, ow};
  std::vector<double> out;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t f = 0; f < out_c; ++f) {
      int64_t group = f / (out_c / o.groups);
      for (int64_t y = 0; y < oh; ++y) {
        for (int64_t x = 0; x < ow; ++x) {
          double total = bias != nullptr ? bias->ItemAsDouble(f) : 0;
          for (int64_t ic = 0; ic < per_group; ++ic) {
            for (int64_t ky = 0; ky < kh; ++ky) {
              for (int64_t kx = 0; kx < kw; ++kx) {
                int64_t iy = y * o.stride[0] - o.padding[0] + ky * o.dilation[0];
                int64_t ix = x * o.stride[1] - o.padding[1] + kx * o.dilation[1];
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                total += ElementAt(input, {b, group * per_group + ic, iy, ix}) *
                         ElementAt(weight, {f, ic, ky, kx});
              }
            }
          }
          out.push_back(total);
        }
      }
    }
  }
  return out;
}

TEST(Convolution, Conv2dMatchesTheDefinition) {
  struct Case {
    Shape input;
    Shape weight;
    Conv2dOptions options;
  };
  const Case kCases[] = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {}},
      {{1, 4, 9, 9}, {6, 2, 3, 2}, {{2, 1}, {1, 2}, {1, 1}, 2}},
      {{2, 2, 8, 8}, {2, 1, 3, 3}, {{1, 1}, {2, 2}, {2, 2}, 2}},  // depthwise, dilated
      {{1, 3, 5, 5}, {2, 3, 1, 1}, {{2, 2}, {0, 0}, {1, 1}, 1}},
  };
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (const Case& c : kCases) {
      Tensor input = RandomTensor(c.input, dtype, -1, 1, 1);
      Tensor weight = RandomTensor(c.weight, dtype, -1, 1, 2);
      Tensor bias = RandomTensor({c.weight[0]}, dtype, -1, 1, 3);
      Tensor output = Conv2d(input, weight, bias, c.options);
      Shape shape;
      std::vector<double> expected = ReferenceConv2d(input, weight, &bias, c.options, &shape);
      ASSERT_EQ(output.shape(), shape);
      ExpectNear(output, expected, Tolerance(dtype) * 16, "conv2d " + ShapeString(c.input));
    }
  }
  Tensor unbatched =
      Conv2d(RandomTensor({3, 5, 5}, DType::kFloat32), RandomTensor({2, 3, 3, 3}, DType::kFloat32));
  EXPECT_EQ(unbatched.shape(), (Shape{2, 3, 3}));
  EXPECT_THROW(Conv2d(Zeros({1, 3, 5, 5}), Zeros({2, 2, 3, 3})), Error);  // channel mismatch
  EXPECT_THROW(Conv2d(Zeros({1, 3, 2, 2}), Zeros({2, 3, 3, 3})), Error);  // input too small
  EXPECT_THROW(Conv2d(Zeros({1, 3, 5, 5}), Zeros({2, 3, 0, 3})), Error);  // empty kernel
  EXPECT_THROW(Conv2d(Zeros({1, 3, 5, 5}, DType::kFloat16), Zeros({2, 3, 3, 3}, DType::kFloat16),
                      Zeros({2})),  // a float32 bias
               Error);
  // No input channels: a valid, empty sum, as in PyTorch.
  Tensor empty_sum = Conv2d(Zeros({2, 0, 4, 4}), Zeros({3, 0, 3, 3}), Ones({3}));
  EXPECT_EQ(empty_sum.shape(), (Shape{2, 3, 2, 2}));
  for (double value : Values(empty_sum)) EXPECT_EQ(value, 1.0);
}

// Reference values: Debian's PyTorch 1.13, torch.nn.functional.conv2d in float64 with stride
// (2, 1), padding (1, 0), dilation (1, 2) and 2 groups, written out here.
TEST(Convolution, Conv2dMatchesPyTorchAtFixedPoints) {
  std::vector<double> ramp;  // torch.arange(1, 33).reshape(1, 2, 4, 4) / 8
  for (int i = 1; i <= 32; ++i) ramp.push_back(i / 8.0);
  const Tensor weight =
      TensorOf({4, 1, 2, 2}, {1, -1, 0.5, 2, 0, 1, -2, 0.25, 1, 1, 1, -1, 3, 0, 0, -0.5});
  const Tensor bias = TensorOf({4}, {0.5, -1, 0, 2});
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    const Tensor output = Conv2d(TensorOf({1, 2, 4, 4}, ramp, dtype), weight.To(dtype),
                                 bias.To(dtype), {{2, 1}, {1, 0}, {1, 2}, 2});
    ASSERT_EQ(output.shape(), (Shape{1, 4, 3, 2}));
    ExpectNear(output, {1.3125,   1.625,  3.5625, 3.875, 0.25,   0.25,  -1.15625, -1.375,
                        -2.03125, -2.125, 0.875,  1.0,   -0.25,  -0.25, 5.25,     5.5,
                        7.5,      7.75,   0.8125, 0.75,  8.1875, 8.5,   12.875,   13.25},
               Tolerance(dtype) * 4, "conv2d " + std::string(DTypeName(dtype)));
  }
}

TEST(Convolution, ReadOnlyWeightsGiveTheSameResultsAsWritableOnes) {
  // A read-only weight's oneDNN layout is prepared once and reused; a writable one's every call.
  Tensor input = RandomTensor({2, 8, 9, 9}, DType::kFloat32, -1, 1, 1);
  Tensor writable = RandomTensor({16, 8, 3, 3}, DType::kFloat32, -1, 1, 2);
  Tensor bias = RandomTensor({16}, DType::kFloat32, -1, 1, 3);
  Tensor read_only = writable.Clone();
  read_only.storage()->MarkReadOnly();
  Tensor expected = Conv2d(input, writable, bias);
  for (int call = 0; call < 2; ++call) {
    Tensor result = Conv2d(input, read_only, bias);
    for (int64_t i = 0; i < expected.numel(); ++i) {
      ASSERT_EQ(result.ItemAsDouble(i), expected.ItemAsDouble(i)) << "call " << call;
    }
  }
  // A weight rewritten between calls is read anew.
  writable.CopyFrom(Binary(Op::mul, writable, Scalar(2.0, DType::kFloat32)));
  Tensor doubled = Conv2d(input, writable);
  Tensor single = Conv2d(input, read_only);
  for (int64_t i = 0; i < single.numel(); ++i) {
    ASSERT_FLOAT_EQ(doubled.ItemAsDouble(i), 2 * single.ItemAsDouble(i));
  }
}

TEST(Convolution, TheEpilogueEqualsTheOpsItFuses) {
  // relu(conv2d(x) + bias + residual) in one op: oneDNN's post-ops for float32, separate ops for
  // float64; both against the unfused ops. Batch 1 and 3, 1x1 and 3x3 kernels (oneDNN writes some
  // shapes through a blocked layout and others directly).
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (int64_t batch : {1, 3}) {
      for (int64_t kernel : {1, 3}) {
        Tensor input = RandomTensor({batch, 16, 7, 7}, dtype, -1, 1, 20);
        Tensor weight = RandomTensor({32, 16, kernel, kernel}, dtype, -1, 1, 21);
        weight.storage()->MarkReadOnly();
        Tensor bias = RandomTensor({32}, dtype, -1, 1, 22);
        Conv2dOptions options;
        options.padding = {kernel / 2, kernel / 2};
        Tensor plain = Conv2d(input, weight, bias, options);
        Tensor residual = RandomTensor(plain.shape(), dtype, -1, 1, 23);
        options.residual = residual;
        ExpectNear(Conv2d(input, weight, bias, options), Values(Binary(Op::add, plain, residual)),
                   1e-5, "conv2d + residual");
        options.relu = true;
        ExpectNear(Conv2d(input, weight, bias, options),
                   Values(Unary(Op::relu, Binary(Op::add, plain, residual))), 1e-5,
                   "relu(conv2d + residual)");
        options.residual.reset();
        ExpectNear(Conv2d(input, weight, bias, options), Values(Unary(Op::relu, plain)), 1e-5,
                   "relu(conv2d)");
      }
    }
  }
  Conv2dOptions wrong;
  wrong.residual = Zeros({1, 2, 3, 4});
  EXPECT_THROW(Conv2d(Zeros({1, 3, 5, 5}), Zeros({2, 3, 3, 3}), std::nullopt, wrong), Error);
  wrong.residual = Zeros({1, 2, 3, 3}, DType::kFloat64);
  EXPECT_THROW(Conv2d(Zeros({1, 3, 5, 5}), Zeros({2, 3, 3, 3}), std::nullopt, wrong), Error);
}

TEST(Convolution, Conv1dIsConv2dOverOneRow) {
  Tensor input = RandomTensor({2, 4, 11}, DType::kFloat64, -1, 1, 4);
  Tensor weight = RandomTensor({6, 2, 3}, DType::kFloat64, -1, 1, 5);
  Tensor output = Conv1d(input, weight, std::nullopt, 2, 1, 2, 2);
  Shape shape;
  std::vector<double> expected = ReferenceConv2d(input.Unsqueeze(2), weight.Unsqueeze(2), nullptr,
                                                 {{1, 2}, {0, 1}, {1, 2}, 2}, &shape);
  EXPECT_EQ(output.shape(), (Shape{2, 6, shape[3]}));
  ExpectNear(output, expected, 1e-12, "conv1d");
}

TEST(Pooling, MaxAvgAndAdaptiveMatchTheReference) {
  Tensor input = RandomTensor({2, 3, 7, 6}, DType::kFloat32, -2, 2, 6);
  for (bool max : {true, false}) {
    std::array<int64_t, 2> kernel{3, 2};
    std::array<int64_t, 2> stride{2, 2};
    std::array<int64_t, 2> padding{1, 1};
    Tensor output =
        max ? MaxPool2d(input, kernel, stride, padding) : AvgPool2d(input, kernel, stride, padding);
    int64_t oh = (7 + 2 - 3) / 2 + 1;
    int64_t ow = (6 + 2 - 2) / 2 + 1;
    ASSERT_EQ(output.shape(), (Shape{2, 3, oh, ow}));
    std::vector<double> expected;
    for (int64_t p = 0; p < 6; ++p) {
      for (int64_t y = 0; y < oh; ++y) {
        for (int64_t x = 0; x < ow; ++x) {
          double best = -std::numeric_limits<double>::infinity();
          double total = 0;
          for (int64_t ky = 0; ky < 3; ++ky) {
            for (int64_t kx = 0; kx < 2; ++kx) {
              int64_t iy = y * 2 - 1 + ky;
              int64_t ix = x * 2 - 1 + kx;
              if (iy < 0 || iy >= 7 || ix < 0 || ix >= 6) continue;
              double v = ElementAt(input, {p / 3, p % 3, iy, ix});
              best = std::max(best, v);
              total += v;
            }
          }
          expected.push_back(max ? best : total / 6);  // padding counts, as PyTorch
        }
      }
    }
    ExpectNear(output, expected, 1e-6, max ? "max_pool2d" : "avg_pool2d");
  }
  EXPECT_EQ(MaxPool2d(input, {2, 2}).shape(), (Shape{2, 3, 3, 3}));
  // A NaN in a window gives NaN, as in PyTorch (oneDNN's pooling alone would pass over it).
  Tensor with_nan = input.Clone();
  with_nan.Narrow(2, 0, 1).Narrow(3, 0, 1).CopyFrom(
      Scalar(std::numeric_limits<double>::quiet_NaN(), DType::kFloat32));
  Tensor pooled = MaxPool2d(with_nan, {2, 2});
  EXPECT_TRUE(std::isnan(pooled.ItemAsDouble(0)));
  EXPECT_FALSE(std::isnan(pooled.ItemAsDouble(1)));
  EXPECT_THROW(MaxPool2d(Zeros({1, 1, 4, 4}, DType::kInt32), {2, 2}), Error);

  Tensor adaptive = AdaptiveAvgPool2d(input, {3, 4});
  ASSERT_EQ(adaptive.shape(), (Shape{2, 3, 3, 4}));
  std::vector<double> expected;
  for (int64_t p = 0; p < 6; ++p) {
    for (int64_t oy = 0; oy < 3; ++oy) {
      for (int64_t ox = 0; ox < 4; ++ox) {
        int64_t y0 = oy * 7 / 3, y1 = ((oy + 1) * 7 + 2) / 3;
        int64_t x0 = ox * 6 / 4, x1 = ((ox + 1) * 6 + 3) / 4;
        double total = 0;
        for (int64_t y = y0; y < y1; ++y) {
          for (int64_t x = x0; x < x1; ++x) total += ElementAt(input, {p / 3, p % 3, y, x});
        }
        expected.push_back(total / static_cast<double>((y1 - y0) * (x1 - x0)));
      }
    }
  }
  ExpectNear(adaptive, expected, 1e-6, "adaptive_avg_pool2d");
  ExpectNear(AdaptiveAvgPool2d(input, {1, 1}), Values(Reduce(Op::mean, input, {2, 3})), 1e-6,
             "global average");
}

// Reference values: Debian's PyTorch 1.13 in float64 (torch.nn.functional.max_pool2d and
// avg_pool2d with kernel (3, 2), stride 2, padding 1, whose padding counts in the average;
// adaptive_avg_pool2d to (3, 2) and (3, 4), whose windows overlap), written out here.
TEST(Pooling, MatchPyTorchAtFixedPoints) {
  const std::vector<double> values{3, -1, 4, 1, -5, 9, 2, -6, 5, 3, 5, -8, 9, 7, -9, 3, 2, 3, 8, 4};
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    const std::string name(DTypeName(dtype));
    const Tensor input = TensorOf({1, 1, 4, 5}, values, dtype);
    const Tensor maximum = MaxPool2d(input, {3, 2}, {{2, 2}}, {1, 1});
    ASSERT_EQ(maximum.shape(), (Shape{1, 1, 2, 3}));
    ExpectNear(maximum, {9, 4, 5, 9, 9, 8}, 0, "max_pool2d " + name);
    ExpectNear(AvgPool2d(input, {3, 2}, {{2, 2}}, {1, 1}),
               {2.0, -0.16666666666666666, 0.6666666666666666, 2.8333333333333335,
                0.3333333333333333, 3.0},
               Tolerance(dtype), "avg_pool2d " + name);
    const Tensor adaptive = AdaptiveAvgPool2d(input, {3, 2});
    ASSERT_EQ(adaptive.shape(), (Shape{1, 1, 3, 2}));
    ExpectNear(adaptive,
               {1.8333333333333333, 0.3333333333333333, 1.8333333333333333, 1.5, 2.3333333333333335,
                3.6666666666666665},
               Tolerance(dtype), "adaptive_avg_pool2d (3, 2) " + name);
    ExpectNear(AdaptiveAvgPool2d(input, {3, 4}),
               {3.25, -0.25, 1.0, 1.0, 2.0, -0.75, 3.75, 1.5, 0.5, 1.5, 6.75, 2.5},
               Tolerance(dtype), "adaptive_avg_pool2d (3, 4) " + name);
  }
}

// Reference values: Debian's PyTorch 1.13, torch.nn.functional.batch_norm(x, mean, var, weight,
// bias, training=False, eps=1e-5) in float64, x = torch.arange(24).reshape(2, 3, 4) / 4 - 2.5.
TEST(BatchNorm, MatchesPyTorchAtFixedPoints) {
  std::vector<double> ramp;
  for (int i = 0; i < 24; ++i) ramp.push_back(i / 4.0 - 2.5);
  const Tensor output = BatchNorm(TensorOf({2, 3, 4}, ramp), TensorOf({3}, {0.5, -1, 0.25}),
                                  TensorOf({3}, {4, 0.25, 1.5}), TensorOf({3}, {2, -1, 0.5}),
                                  TensorOf({3}, {0.1, 0, -3}), 1e-5);
  ExpectNear(output,
             {-2.8999962500070313,
              -2.649996562506445,
              -2.3999968750058596,
              -2.1499971875052735,
              0.9999800005999799,
              0.49999000029998997,
              0.0,
              -0.49999000029998997,
              -3.306185197232274,
              -3.2041234648215164,
              -3.102061732410758,
              -3.0,
              0.09999999999999998,
              0.3499996875005859,
              0.5999993750011718,
              0.8499990625017577,
              -4.999900002999899,
              -5.49989000329989,
              -5.99988000359988,
              -6.499870003899869,
              -2.081444408303178,
              -1.9793826758924196,
              -1.8773209434816616,
              -1.7752592110709036},
             1e-14, "batch_norm");
}

TEST(BatchNorm, NormalisesEachChannel) {
  Tensor input = RandomTensor({2, 3, 4}, DType::kFloat64, -2, 2, 7);
  Tensor mean = RandomTensor({3}, DType::kFloat64, -1, 1, 8);
  Tensor var = RandomTensor({3}, DType::kFloat64, 0.5, 2, 9);
  Tensor weight = RandomTensor({3}, DType::kFloat64, 0.5, 1.5, 10);
  Tensor bias = RandomTensor({3}, DType::kFloat64, -1, 1, 11);
  Tensor output = BatchNorm(input, mean, var, weight, bias, 1e-5);
  std::vector<double> expected;
  for (int64_t i = 0; i < input.numel(); ++i) {
    std::vector<int64_t> index = UnflattenIndex(i, input.shape());
    int64_t c = index[1];
    expected.push_back((ElementAt(input, index) - mean.ItemAsDouble(c)) /
                           std::sqrt(var.ItemAsDouble(c) + 1e-5) * weight.ItemAsDouble(c) +
                       bias.ItemAsDouble(c));
  }
  ExpectNear(output, expected, 1e-12, "batch_norm");
  EXPECT_THROW(BatchNorm(input, Zeros({4}, DType::kFloat64), var, {}, {}), Error);
}

// Rows sort as (key, position): a 32-bit key and the position in one word for the narrow types,
// pairs for the 64-bit ones; either way the order of a stable sort, NaN the largest, -0.0 equal
// to 0.0, in both directions.
TEST(Sorting, TiesNanAndSignedZerosSortStablyInEveryKeyWidth) {
  auto tensor_of = [](const std::vector<double>& values, DType dtype) {
    return TensorOf({static_cast<int64_t>(values.size())}, values, dtype);
  };
  const double nan = std::nan("");
  const double infinity = HUGE_VAL;
  const std::vector<double> floats{2, nan, -0.0, 0.0, -1, 2, nan, -infinity};
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    const Tensor input = tensor_of(floats, dtype);
    ExpectNear(Sort(input).indices, {7, 4, 2, 3, 0, 5, 1, 6}, 0, "ascending");
    ExpectNear(Sort(input, -1, true).indices, {1, 6, 0, 5, 2, 3, 4, 7}, 0, "descending");
  }
  const std::vector<double> integers{3, -2, 3, 0, -2, 7, -2147483648.0, 2147483647.0};
  for (DType dtype : {DType::kInt32, DType::kInt64}) {
    const Tensor input = tensor_of(integers, dtype);
    ExpectNear(Sort(input).indices, {6, 1, 4, 3, 0, 2, 5, 7}, 0, "ascending");
    ExpectNear(Sort(input, -1, true).indices, {7, 5, 0, 2, 3, 1, 4, 6}, 0, "descending");
  }
  // 2 rows of 300 (several rounds of std::sort's partitioning), each checked against a stable
  // order of its values.
  const Tensor rows = RandomTensor({2, 300}, DType::kInt32, -4, 4, 21).To(DType::kFloat32);
  const SortResult sorted = Sort(rows, -1, true);
  const std::vector<double> values = Values(rows);
  const std::vector<double> order = Values(sorted.indices);
  for (int64_t row = 0; row < 2; ++row) {
    std::vector<int64_t> expected(300);
    std::iota(expected.begin(), expected.end(), 0);
    std::stable_sort(expected.begin(), expected.end(), [&](int64_t a, int64_t b) {
      return values[row * 300 + a] > values[row * 300 + b];
    });
    for (int64_t i = 0; i < 300; ++i) {
      EXPECT_EQ(order[row * 300 + i], static_cast<double>(expected[i])) << row << ", " << i;
    }
  }
}

TEST(Sorting, SortTopKAndMaskedSelect) {
  Tensor input = RandomTensor({4, 6}, DType::kFloat32, -3, 3, 12).Transpose(0, 1);  // [6, 4]
  for (bool descending : {false, true}) {
    for (int64_t dim : {0, 1}) {
      SortResult sorted = Sort(input, dim, descending);
      ASSERT_EQ(sorted.values.shape(), input.shape());
      EXPECT_EQ(sorted.indices.dtype(), DType::kInt64);
      for (int64_t i = 0; i < input.numel(); ++i) {
        std::vector<int64_t> index = UnflattenIndex(i, input.shape());
        std::vector<int64_t> source = index;
        source[dim] = static_cast<int64_t>(ElementAt(sorted.indices, index));
        EXPECT_EQ(ElementAt(sorted.values, index), ElementAt(input, source));  // consistent
        if (index[dim] > 0) {
          std::vector<int64_t> before = index;
          --before[dim];
          double a = ElementAt(sorted.values, before);
          double b = ElementAt(sorted.values, index);
          EXPECT_TRUE(descending ? a >= b : a <= b);
        }
      }
    }
  }
  Tensor ties = Tensor(Full({4}, 1));
  ExpectNear(Sort(ties).indices, {0, 1, 2, 3}, 0, "stable");
  SortResult top = TopK(Arange(0, 10, 1, DType::kFloat32), 3);
  ExpectNear(top.values, {9, 8, 7}, 0, "topk values");
  ExpectNear(top.indices, {9, 8, 7}, 0, "topk indices");
  ExpectNear(TopK(Arange(0, 10, 1, DType::kFloat32), 2, -1, false).values, {0, 1}, 0, "bottomk");
  EXPECT_THROW(TopK(Zeros({3}), 4), Error);

  Tensor values = Arange(0, 6, 1, DType::kFloat32).View({2, 3});
  Tensor mask = Binary(Op::gt, values, Scalar(2.5, DType::kFloat32));
  ExpectNear(MaskedSelect(values, mask), {3, 4, 5}, 0, "masked_select");
  Tensor column = Binary(Op::eq, Arange(0, 3).View({1, 3}), Scalar(1, DType::kInt64));
  ExpectNear(MaskedSelect(values, column), {1, 4}, 0, "masked_select broadcast");
}

TEST(Random, IsSeededAndHasTheRightDistribution) {
  Tensor a = Rand({10000}, 42);
  Tensor b = Rand({10000}, 42);
  Tensor c = Rand({10000}, 43);
  EXPECT_EQ(Values(a), Values(b));
  EXPECT_NE(Values(a), Values(c));
  EXPECT_GE(Reduce(Op::amin, a).ItemAsDouble(), 0);
  EXPECT_LT(Reduce(Op::amax, a).ItemAsDouble(), 1);
  EXPECT_NEAR(Reduce(Op::mean, a).ItemAsDouble(), 0.5, 0.02);
  Tensor normal = Randn({20000}, 7, DType::kFloat64);
  EXPECT_NEAR(Reduce(Op::mean, normal).ItemAsDouble(), 0, 0.03);
  EXPECT_NEAR(Std(normal).ItemAsDouble(), 1, 0.03);
  EXPECT_THROW(Rand({2}, 1, DType::kInt32), Error);
}

}  // namespace
}  // namespace orochi::engine
