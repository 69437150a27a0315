// The ops built from kernels and other ops, against references computed here. Where such a
// reference is the op's formula written again (variance, the norms, attention), the op is also
// checked on values worked out by hand or by PyTorch, written out as literals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine_test_support.h"
#include "orochi/engine/error.h"

namespace orochi::engine {
namespace {

using testing::HasSubstr;

TEST(ArgReduce, FindsTheFirstExtremeAlongAnyDim) {
  Tensor input = RandomTensor({3, 5, 4}, DType::kFloat32, -3, 3, 2).Permute({1, 0, 2});  // [5,3,4]
  for (Op op : {Op::argmax, Op::argmin}) {
    for (int64_t dim : {0, 1, 2, -1}) {
      for (bool keepdim : {false, true}) {
        Tensor indices = ArgReduce(op, input, dim, keepdim);
        EXPECT_EQ(indices.dtype(), DType::kInt64);
        int64_t d = WrapDim(dim, 3);
        Shape kept = input.shape();
        kept.erase(kept.begin() + d);
        std::vector<double> expected;
        for (int64_t i = 0; i < NumElements(kept); ++i) {
          std::vector<int64_t> index = UnflattenIndex(i, kept);
          index.insert(index.begin() + d, 0);
          int64_t best = 0;
          double best_value = ElementAt(input, index);
          for (index[d] = 1; index[d] < input.shape()[d]; ++index[d]) {
            double value = ElementAt(input, index);
            if (op == Op::argmax ? value > best_value : value < best_value) {
              best = index[d];
              best_value = value;
            }
          }
          expected.push_back(static_cast<double>(best));
        }
        if (keepdim) kept.insert(kept.begin() + d, 1);
        EXPECT_EQ(indices.shape(), kept);
        ExpectNear(indices, expected, 0, std::string(OpName(op)) + " dim " + std::to_string(dim));
      }
    }
  }
  Tensor flat = Arange(0, 6, 1, DType::kFloat32);
  EXPECT_EQ(ArgReduce(Op::argmax, flat).ItemAsDouble(), 5);
  EXPECT_EQ(ArgReduce(Op::argmax, Tensor(Full({3}, 2))).ItemAsDouble(), 0);  // first of ties
}

TEST(Statistics, VarStdProdAnyAll) {
  Tensor input = RandomTensor({4, 6}, DType::kFloat64, -2, 2, 5);
  for (double correction : {0.0, 1.0}) {
    Tensor variance = Var(input, {1}, correction);
    std::vector<double> expected;
    for (int64_t row = 0; row < 4; ++row) {
      double mean = 0;
      for (int64_t c = 0; c < 6; ++c) mean += ElementAt(input, {row, c}) / 6;
      double total = 0;
      for (int64_t c = 0; c < 6; ++c) total += std::pow(ElementAt(input, {row, c}) - mean, 2);
      expected.push_back(total / (6 - correction));
    }
    ExpectNear(variance, expected, 1e-12, "var");
    std::vector<double> deviations;
    for (double value : expected) deviations.push_back(std::sqrt(value));
    ExpectNear(Std(input, {1}, correction), deviations, 1e-12, "std");
  }
  ExpectNear(Reduce(Op::prod, Arange(1, 6, 1, DType::kInt32)), {120}, 0, "prod");
  EXPECT_EQ(Reduce(Op::prod, Arange(1, 6, 1, DType::kInt32)).dtype(), DType::kInt64);
  Tensor flags = Binary(Op::gt, Arange(0, 6).View({2, 3}), Scalar(3, DType::kInt64));
  ExpectNear(Any(flags, {1}), {0, 1}, 0, "any");
  ExpectNear(All(flags, {1}), {0, 0}, 0, "all");
  EXPECT_EQ(Any(flags).dtype(), DType::kBool);
  EXPECT_EQ(All(Zeros({0})).ItemAsDouble(), 1);
  EXPECT_EQ(Any(Zeros({0})).ItemAsDouble(), 0);
  EXPECT_EQ(Any(Arange(0, 3, 1, DType::kUInt8)).dtype(), DType::kUInt8);
  EXPECT_EQ(All(Zeros({0}, DType::kUInt8), {0}).dtype(), DType::kUInt8);
}

// Worked by hand: {2, 4, 4, 4, 5, 5, 7, 9} has mean 5 and squared deviations summing to 32.
TEST(Statistics, VarAndStdOfHandWorkedValues) {
  const Tensor x = TensorOf({2, 8}, {2, 4, 4, 4, 5, 5, 7, 9, 9, 7, 5, 5, 4, 4, 4, 2});
  ExpectNear(Var(x, {1}, 0), {4, 4}, 1e-15, "population variance");
  ExpectNear(Std(x, {1}, 0), {2, 2}, 1e-15, "population deviation");
  ExpectNear(Var(x, {1}, 1), {32.0 / 7, 32.0 / 7}, 1e-15, "sample variance");
  ExpectNear(Std(x, {1}, 1), {std::sqrt(32.0 / 7), std::sqrt(32.0 / 7)}, 1e-15, "sample deviation");
  ExpectNear(Var(x.To(DType::kFloat32), {}, 0), {4}, 2e-6, "over both rows, float32");
}

TEST(Selection, WhereClampLogicalMaskedFill) {
  Tensor x = Arange(-3, 3, 1, DType::kFloat32).View({2, 3});
  Tensor positive = Binary(Op::gt, x, Scalar(0, DType::kFloat32));
  ExpectNear(Where(positive, x, Scalar(0, DType::kFloat32)), {0, 0, 0, 0, 1, 2}, 0, "where");
  EXPECT_EQ(Where(positive, Zeros({1}, DType::kInt32), Ones({3}, DType::kFloat64)).dtype(),
            DType::kFloat64);
  EXPECT_THROW(Where(x, x, x), Error);
  ExpectNear(Clamp(x, Scalar(-1, DType::kFloat32), Scalar(1, DType::kFloat32)),
             {-1, -1, -1, 0, 1, 1}, 0, "clamp");
  ExpectNear(Clamp(x, std::nullopt, Scalar(0, DType::kFloat32)), {-3, -2, -1, 0, 0, 0}, 0,
             "clamp max");
  Tensor a = Binary(Op::gt, x, Scalar(-2, DType::kFloat32));
  Tensor b = Binary(Op::lt, x, Scalar(1, DType::kFloat32));
  ExpectNear(Binary(Op::logical_and, a, b), {0, 0, 1, 1, 0, 0}, 0, "and");
  ExpectNear(Binary(Op::logical_or, a, b), {1, 1, 1, 1, 1, 1}, 0, "or");
  ExpectNear(Binary(Op::logical_xor, a, b), {1, 1, 0, 0, 1, 1}, 0, "xor");
  ExpectNear(LogicalNot(x), {0, 0, 0, 1, 0, 0}, 0, "not");
  Tensor row_mask = Binary(Op::eq, Arange(0, 3).View({1, 3}), Scalar(1, DType::kInt64));
  ExpectNear(MaskedFill(x, row_mask, Scalar(9, DType::kFloat64)), {-3, 9, -1, 0, 9, 2}, 0,
             "masked_fill");
  EXPECT_EQ(MaskedFill(x, row_mask, Scalar(9, DType::kFloat64)).dtype(), DType::kFloat32);
}

TEST(Joining, CatStackSplitChunk) {
  Tensor a = Arange(0, 6, 1, DType::kFloat32).View({2, 3});
  Tensor b = Arange(6, 8, 1, DType::kInt64).View({2, 1});
  Tensor joined = Cat({a, b}, 1);
  EXPECT_EQ(joined.shape(), (Shape{2, 4}));
  EXPECT_EQ(joined.dtype(), DType::kFloat32);
  ExpectNear(joined, {0, 1, 2, 6, 3, 4, 5, 7}, 0, "cat");
  ExpectNear(Cat({a.Transpose(0, 1), a.Transpose(0, 1)}, 0).Slice(0, 3, 6), {0, 3, 1, 4, 2, 5}, 0,
             "cat of views");
  EXPECT_THROW(Cat({a, Zeros({3, 3})}, 1), Error);
  Tensor stacked = Stack({a, a}, 1);
  EXPECT_EQ(stacked.shape(), (Shape{2, 2, 3}));
  ExpectNear(stacked.Select(1, 1), Values(a), 0, "stack");
  std::vector<Tensor> parts = Split(Arange(0, 7), 3);
  ASSERT_EQ(parts.size(), 3U);
  EXPECT_EQ(parts[2].shape(), (Shape{1}));
  EXPECT_EQ(parts[1].storage().get(), parts[0].storage().get());  // views
  ExpectNear(parts[1], {3, 4, 5}, 0, "split");
  std::vector<Tensor> chunks = Chunk(Arange(0, 10), 4);
  ASSERT_EQ(chunks.size(), 4U);  // sizes 3, 3, 3, 1, as torch.chunk
  EXPECT_EQ(chunks[3].numel(), 1);
}

// The code an op refuses an argument with (kInvalidArgument: a bad argument; kOutOfRange: a dim).
template <typename Call>
StatusCode CodeOf(Call call) {
  try {
    call();
  } catch (const Error& error) {
    return error.status().code();
  }
  return StatusCode::kOk;
}

TEST(Joining, SplitWithSizesGivesViewsOfTheSizes) {
  Tensor x = Arange(0, 12).View({2, 6});
  std::vector<Tensor> pieces = SplitWithSizes(x, {1, 0, 5}, -1);
  ASSERT_EQ(pieces.size(), 3U);
  ExpectNear(pieces[0], {0, 6}, 0, "first piece");
  EXPECT_EQ(pieces[1].shape(), (Shape{2, 0}));
  ExpectNear(pieces[2], {1, 2, 3, 4, 5, 7, 8, 9, 10, 11}, 0, "last piece");
  EXPECT_EQ(pieces[2].storage().get(), x.storage().get());
  EXPECT_EQ(CodeOf([&] { SplitWithSizes(x, {2, 3}, 1); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf([&] { SplitWithSizes(x, {-1, 7}, 1); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf([&] { SplitWithSizes(x, {6}, 2); }), StatusCode::kOutOfRange);
  EXPECT_EQ(CodeOf([&] { SplitWithSizes(Scalar(1, DType::kInt64), {1}); }),
            StatusCode::kInvalidArgument);
}

TEST(Shaping, RepeatTilesAndAddsLeadingDims) {
  Tensor x = Arange(0, 4).View({2, 2});
  ExpectNear(Repeat(x, {1, 2}), {0, 1, 0, 1, 2, 3, 2, 3}, 0, "repeat columns");
  Tensor tiled = Repeat(x.Transpose(0, 1), {2, 1, 1});
  EXPECT_EQ(tiled.shape(), (Shape{2, 2, 2}));
  ExpectNear(tiled, {0, 2, 1, 3, 0, 2, 1, 3}, 0, "repeat of a view, with a leading dim");
  EXPECT_EQ(Repeat(x, {0, 3}).shape(), (Shape{0, 6}));
  ExpectNear(Repeat(Scalar(5, DType::kInt64), {3}), {5, 5, 5}, 0, "repeat of a 0-dim tensor");
  EXPECT_EQ(CodeOf([&] { Repeat(x, {2}); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf([&] { Repeat(x, {-1, 1}); }), StatusCode::kInvalidArgument);
}

TEST(Shaping, FlipReversesTheGivenDimsIntoACopy) {
  Tensor x = Arange(0, 6).View({2, 3});
  ExpectNear(Flip(x, {0}), {3, 4, 5, 0, 1, 2}, 0, "flip rows");
  ExpectNear(Flip(x, {-1, 0}), {5, 4, 3, 2, 1, 0}, 0, "flip both");
  ExpectNear(Flip(x.Transpose(0, 1), {1}), {3, 0, 4, 1, 5, 2}, 0, "flip a view");
  Tensor same = Flip(x, {});
  EXPECT_NE(same.storage().get(), x.storage().get());  // a copy, as PyTorch's
  ExpectNear(same, {0, 1, 2, 3, 4, 5}, 0, "flip of no dims");
  ExpectNear(Flip(Scalar(7, DType::kInt64), {0}), {7}, 0, "flip of a 0-dim tensor");
  EXPECT_EQ(CodeOf([&] { Flip(x, {0, -2}); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf([&] { Flip(x, {2}); }), StatusCode::kOutOfRange);
}

TEST(Shaping, PadFillsAndNegativePaddingCrops) {
  Tensor x = Arange(1, 5, 1, DType::kFloat32).View({2, 2});
  Tensor padded = Pad(x, {1, 0, 0, 1}, 9);
  EXPECT_EQ(padded.shape(), (Shape{3, 3}));
  ExpectNear(padded, {9, 1, 2, 9, 3, 4, 9, 9, 9}, 0, "pad");
  ExpectNear(Pad(x, {-1, 1}), {2, 0, 4, 0}, 0, "crop the first column, pad the end");
  EXPECT_EQ(Pad(x, {-2, 0}).shape(), (Shape{2, 0}));
  EXPECT_EQ(Pad(x, {}).shape(), (Shape{2, 2}));
  EXPECT_EQ(Pad(Zeros({2}, DType::kInt32), {1, 1}, 3).dtype(), DType::kInt32);
  EXPECT_EQ(CodeOf([&] { Pad(x, {1}); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf([&] { Pad(x, {1, 1, 1, 1, 1, 1}); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf([&] { Pad(x, {-3, 0}); }), StatusCode::kInvalidArgument);
}

TEST(Creation, IntegerArangeIsExactOverInt64) {
  ExpectNear(IntegerArange(5, 0, -2), {5, 3, 1}, 0, "descending");
  EXPECT_EQ(IntegerArange(3, 3).numel(), 0);
  EXPECT_EQ(IntegerArange(0, 4, 1, DType::kInt16).dtype(), DType::kInt16);
  // Past 2^53 a double-valued arange would round 2^60 + 1 to 2^60.
  constexpr int64_t kLarge = int64_t{1} << 60;
  Tensor large = IntegerArange(kLarge, kLarge + 3);
  ASSERT_EQ(large.numel(), 3);
  EXPECT_EQ(large.data_as<int64_t>()[1], kLarge + 1);
  EXPECT_EQ(large.data_as<int64_t>()[2], kLarge + 2);
  Tensor span = IntegerArange(std::numeric_limits<int64_t>::min(),
                              std::numeric_limits<int64_t>::max(), kLarge * 4);
  ASSERT_EQ(span.numel(), 4);  // the range is 2^64 - 1 wide: four steps of 2^62
  EXPECT_EQ(span.data_as<int64_t>()[1], -(kLarge * 4));
  EXPECT_EQ(span.data_as<int64_t>()[2], 0);
  EXPECT_EQ(span.data_as<int64_t>()[3], kLarge * 4);
  EXPECT_EQ(CodeOf([] { IntegerArange(0, 5, 0); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf([] { IntegerArange(0, 5, -1); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf([] { IntegerArange(0, 5, 1, DType::kFloat32); }), StatusCode::kInvalidArgument);
}

// The values of `tensor` in logical (row-major) order, read through its strides.
std::vector<double> ValuesOf(const Tensor& tensor) {
  const Tensor dense = tensor.Contiguous();
  std::vector<double> values;
  for (int64_t i = 0; i < dense.numel(); ++i) values.push_back(dense.ItemAsDouble(i));
  return values;
}

TEST(Indexing, IndexSelectOnAViewReadsThePickedSlicesThroughItsStrides) {
  // A narrowed cache, as a decoder reads its keys: non-contiguous in two dims.
  const Tensor cache = RandomTensor({5, 4, 8, 3}, DType::kFloat32, -2, 2, 21);
  const Tensor view = cache.Narrow(0, 0, 4).Narrow(2, 0, 6);
  ASSERT_FALSE(view.is_contiguous());
  const Tensor copy = view.Contiguous();
  Tensor picks = Tensor::Empty({3}, DType::kInt64);
  const int64_t values[] = {2, 0, 2};  // repeated, out of order, fewer than every dim's size
  std::copy(std::begin(values), std::end(values), picks.mutable_data_as<int64_t>());
  for (int64_t dim = 0; dim < 4; ++dim) {
    const Tensor picked = IndexSelect(view, dim, picks);
    Shape expected_shape = view.shape();
    expected_shape[dim] = 3;
    EXPECT_EQ(picked.shape(), expected_shape) << "dim " << dim;
    EXPECT_TRUE(picked.is_contiguous()) << "dim " << dim;
    ExpectNear(picked, ValuesOf(IndexSelect(copy, dim, picks)), 0, "dim " + std::to_string(dim));
  }
  // An embedding table read through a transposed view.
  const Tensor table = RandomTensor({6, 10}, DType::kFloat32, -2, 2, 22).Transpose(0, 1);
  const Tensor embedded = Embedding(picks, table);
  EXPECT_EQ(embedded.shape(), (Shape{3, 6}));
  ExpectNear(embedded, ValuesOf(Embedding(picks, table.Contiguous())), 0, "embedding of a view");
}

TEST(Indexing, IndexSelectAndEmbedding) {
  Tensor table = Arange(0, 12, 1, DType::kFloat32).View({4, 3});
  Tensor index = Arange(0, 3).View({3});
  Tensor picks = Binary(Op::sub, Scalar(3, DType::kInt64), index);  // 3, 2, 1
  ExpectNear(IndexSelect(table, 0, picks), {9, 10, 11, 6, 7, 8, 3, 4, 5}, 0, "rows");
  ExpectNear(IndexSelect(table.Transpose(0, 1), 1, picks.Slice(0, 0, 2)), {9, 6, 10, 7, 11, 8}, 0,
             "columns of a view");
  try {
    IndexSelect(table, 0, Full({1}, 4, DType::kInt64));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("index 4 is out of range for dimension 0 of size 4"));
  }
  try {  // the first bad index is named, not the smallest or largest
    Tensor bad = Tensor::Empty({4}, DType::kInt64);
    const int64_t values[] = {1, 6, -1, 9};
    std::copy(std::begin(values), std::end(values), bad.mutable_data_as<int64_t>());
    IndexSelect(table, 0, bad);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("index 6 is out of range for dimension 0 of size 4"));
  }
  Tensor tokens = Arange(0, 4).View({2, 2});
  Tensor embedded = Embedding(tokens, table);
  EXPECT_EQ(embedded.shape(), (Shape{2, 2, 3}));
  ExpectNear(embedded.Select(0, 1).Select(0, 1), {9, 10, 11}, 0, "embedding");
}

TEST(Indexing, GatherPicksAlongADim) {
  Tensor input = Arange(0, 12, 1, DType::kFloat32).View({3, 4});
  Tensor index = Arange(0, 6).View({2, 3});
  Tensor rows =
      Binary(Op::sub, Scalar(2, DType::kInt64),
             Binary(Op::mul, Binary(Op::div, index, Scalar(3, DType::kInt64)).To(DType::kInt64),
                    Scalar(1, DType::kInt64)));  // [[2, 2, 2], [1, 1, 1]]
  // dim 0: out[i][j] = input[rows[i][j]][j]
  ExpectNear(Gather(input, 0, rows), {8, 9, 10, 4, 5, 6}, 0, "gather dim 0");
  Tensor columns = Binary(Op::sub, Scalar(3, DType::kInt64), Arange(0, 3).View({1, 3}))
                       .Expand({3, 3})
                       .Contiguous();  // [[3, 2, 1]] * 3
  // dim 1: out[i][j] = input[i][columns[i][j]]
  ExpectNear(Gather(input, 1, columns), {3, 2, 1, 7, 6, 5, 11, 10, 9}, 0, "gather dim 1");
  try {
    Gather(input, 1, Full({3, 1}, 4, DType::kInt64));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("gather: index values must be in [0, 4), got [4, 4]"));
  }
  EXPECT_THROW(Gather(input, 1, Zeros({3}, DType::kInt64)), Error);
}

TEST(Creation, EyeAndLinspace) {
  ExpectNear(Eye(2, 3), {1, 0, 0, 0, 1, 0}, 0, "eye");
  ExpectNear(Eye(3, std::nullopt, DType::kInt32), {1, 0, 0, 0, 1, 0, 0, 0, 1}, 0, "eye square");
  ExpectNear(Linspace(0, 1, 5), {0, 0.25, 0.5, 0.75, 1}, 0, "linspace");
  EXPECT_EQ(Linspace(2, 3, 1).ItemAsDouble(), 2);
}

TEST(Normalization, LayerNormAndRmsNormMatchTheReference) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16}) {
    Tensor input = RandomTensor({3, 2, 8}, dtype, -3, 3, 4).Transpose(0, 1);  // [2, 3, 8]
    Tensor weight = RandomTensor({8}, dtype, 0.5, 1.5, 5);
    Tensor bias = RandomTensor({8}, dtype, -1, 1, 6);
    Tensor layer = LayerNorm(input, {8}, weight, bias, 1e-5);
    Tensor rms = RmsNorm(input, {8}, weight, 1e-6);
    std::vector<double> expected_layer;
    std::vector<double> expected_rms;
    for (int64_t row = 0; row < 6; ++row) {
      std::vector<int64_t> index = UnflattenIndex(row * 8, input.shape());
      std::vector<double> x;
      for (index[2] = 0; index[2] < 8; ++index[2]) x.push_back(ElementAt(input, index));
      double mean = 0;
      for (double v : x) mean += v / 8;
      double var = 0;
      double square = 0;
      for (double v : x) {
        var += (v - mean) * (v - mean) / 8;
        square += v * v / 8;
      }
      for (int64_t i = 0; i < 8; ++i) {
        double w = weight.ItemAsDouble(i);
        expected_layer.push_back((x[i] - mean) / std::sqrt(var + 1e-5) * w + bias.ItemAsDouble(i));
        expected_rms.push_back(x[i] / std::sqrt(square + 1e-6) * w);
      }
    }
    ExpectNear(layer, expected_layer, Tolerance(dtype) * 4, "layer_norm");
    ExpectNear(rms, expected_rms, Tolerance(dtype) * 4, "rms_norm");
  }
  EXPECT_THROW(LayerNorm(Zeros({2, 3}), {4}), Error);
  EXPECT_THROW(LayerNorm(Zeros({2, 3}), {3}, Zeros({4})), Error);
}

// Worked by hand: the row {2, 4, 4, 4, 5, 5, 7, 9} has mean 5 and (biased) variance 4, so with
// eps = 5 layer norm divides its deviations by sqrt(4 + 5) = 3; the row {1, 2, 2, 4} has mean
// square 25 / 4, so with eps = 11 / 4 RMS norm divides it by sqrt(9) = 3. An eps added outside
// the square root, or an unbiased variance, gives other numbers.
TEST(Normalization, LayerNormAndRmsNormOfHandWorkedValues) {
  for (DType dtype : {DType::kFloat64, DType::kFloat32, DType::kBFloat16}) {
    const std::string name(DTypeName(dtype));
    const double tolerance = dtype == DType::kFloat64 ? 1e-15 : Tolerance(dtype) * 2;
    const Tensor row = TensorOf({1, 8}, {2, 4, 4, 4, 5, 5, 7, 9}, dtype);
    ExpectNear(LayerNorm(row, {8}, std::nullopt, std::nullopt, 5),
               {-1, -1.0 / 3, -1.0 / 3, -1.0 / 3, 0, 0, 2.0 / 3, 4.0 / 3}, tolerance,
               "layer_norm " + name);
    const Tensor weight = TensorOf({8}, {1, 2, 3, -1, 1, 1, 0.5, 3}, dtype);
    const Tensor bias = TensorOf({8}, {0, 1, 0, 0, -2, 0, 0, 0.5}, dtype);
    ExpectNear(LayerNorm(row, {8}, weight, bias, 5),
               {-1, 1 - 2.0 / 3, -1, 1.0 / 3, -2, 0, 1.0 / 3, 4.5}, tolerance,
               "layer_norm with weight and bias " + name);
    const Tensor short_row = TensorOf({2, 4}, {1, 2, 2, 4, -1, -2, -2, -4}, dtype);
    ExpectNear(RmsNorm(short_row, {4}, std::nullopt, 11.0 / 4),
               {1.0 / 3, 2.0 / 3, 2.0 / 3, 4.0 / 3, -1.0 / 3, -2.0 / 3, -2.0 / 3, -4.0 / 3},
               tolerance, "rms_norm " + name);
    ExpectNear(RmsNorm(short_row, {4}, TensorOf({4}, {3, -3, 1.5, 0}, dtype), 11.0 / 4),
               {1, -2, 1, 0, -1, 2, -1, 0}, tolerance, "rms_norm with weight " + name);
  }
}

// Reference values: Debian's PyTorch 1.13 in float64, torch.softmax(q @ k.T / 2, -1) @ v (its
// scaled_dot_product_attention came later), the causal row masked with -inf before the softmax.
// Two limits need no reference: one key gives its value, and equal keys average the values.
TEST(LinearAlgebra, AttentionMatchesPyTorchAndItsLimits) {
  const Tensor q = TensorOf({2, 4}, {0.5, -1, 0.25, 2, 1, 0, -0.5, 0.75});
  const Tensor k = TensorOf({3, 4}, {1, 0.5, -1, 0, 0, 2, 0.5, -0.25, -1.5, 0, 1, 1});
  const Tensor v = TensorOf({3, 2}, {1, -2, 0.5, 3, -1, 0.25});
  ExpectNear(ScaledDotProductAttention(q, k, v),
             {-0.32743785160242334, -0.0970789731456638, 0.5739652316625613, -0.4889243499670432},
             1e-15, "attention");
  ExpectNear(ScaledDotProductAttention(q, k, v, std::nullopt, true),
             {1.0, -2.0, 0.8624351380884123, -0.6243513808841239}, 1e-15, "causal attention");
  ExpectNear(ScaledDotProductAttention(q, k.Narrow(0, 2, 1), v.Narrow(0, 2, 1)),
             {-1, 0.25, -1, 0.25}, 1e-15, "one key");
  const Tensor same_keys = k.Narrow(0, 1, 1).Expand({3, 4});
  ExpectNear(ScaledDotProductAttention(q, same_keys, v), {0.5 / 3, 1.25 / 3, 0.5 / 3, 1.25 / 3},
             1e-15, "equal keys");
}

TEST(LinearAlgebra, LinearBmmAndAttention) {
  Tensor input = RandomTensor({2, 5, 4}, DType::kFloat32, -1, 1, 1);
  Tensor weight = RandomTensor({3, 4}, DType::kFloat32, -1, 1, 2);
  Tensor bias = RandomTensor({3}, DType::kFloat32, -1, 1, 3);
  // A read-only (loaded) weight and 10 rows take oneDNN's matmul on the prepared weight; a
  // writable one OpenBLAS's sgemm. Both with and without the bias, which oneDNN fuses.
  Tensor loaded = weight.Clone();
  loaded.storage()->MarkReadOnly();
  for (const Tensor* w : {&weight, &loaded}) {
    for (bool with_bias : {true, false}) {
      Tensor output = Linear(input, *w, with_bias ? std::optional<Tensor>(bias) : std::nullopt);
      EXPECT_EQ(output.shape(), (Shape{2, 5, 3}));
      std::vector<double> expected;
      for (int64_t i = 0; i < output.numel(); ++i) {
        std::vector<int64_t> index = UnflattenIndex(i, output.shape());
        double total = with_bias ? bias.ItemAsDouble(index[2]) : 0.0;
        for (int64_t k = 0; k < 4; ++k) {
          total += ElementAt(input, {index[0], index[1], k}) * ElementAt(*w, {index[2], k});
        }
        expected.push_back(total);
      }
      ExpectNear(output, expected, 1e-5, w->read_only() ? "linear, loaded weight" : "linear");
    }
  }
  EXPECT_EQ(Bmm(Zeros({2, 3, 4}), Zeros({2, 4, 5})).shape(), (Shape{2, 3, 5}));
  EXPECT_THROW(Bmm(Zeros({2, 3, 4}), Zeros({4, 5})), Error);

  // Attention against the textbook formula, with and without a causal mask.
  Tensor q = RandomTensor({2, 4, 8}, DType::kFloat64, -1, 1, 7);
  Tensor k = RandomTensor({2, 6, 8}, DType::kFloat64, -1, 1, 8);
  Tensor v = RandomTensor({2, 6, 3}, DType::kFloat64, -1, 1, 9);
  for (bool causal : {false, true}) {
    Tensor attended = ScaledDotProductAttention(q, k, v, std::nullopt, causal);
    EXPECT_EQ(attended.shape(), (Shape{2, 4, 3}));
    std::vector<double> reference;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < 4; ++i) {
        std::vector<double> scores;
        for (int64_t j = 0; j < 6; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < 8; ++e) dot += ElementAt(q, {b, i, e}) * ElementAt(k, {b, j, e});
          scores.push_back(causal && j > i ? -std::numeric_limits<double>::infinity()
                                           : dot / std::sqrt(8.0));
        }
        double maximum = *std::max_element(scores.begin(), scores.end());
        double total = 0;
        for (double s : scores) total += std::exp(s - maximum);
        for (int64_t c = 0; c < 3; ++c) {
          double sum = 0;
          for (int64_t j = 0; j < 6; ++j) {
            sum += std::exp(scores[j] - maximum) / total * ElementAt(v, {b, j, c});
          }
          reference.push_back(sum);
        }
      }
    }
    ExpectNear(attended, reference, 1e-12, causal ? "causal attention" : "attention");
  }
  // A bool mask equal to the causal pattern gives the causal result.
  Tensor pattern = Binary(Op::ge, Arange(0, 4).View({4, 1}), Arange(0, 6).View({1, 6}));
  ExpectNear(ScaledDotProductAttention(q, k, v, pattern),
             Values(ScaledDotProductAttention(q, k, v, std::nullopt, true)), 1e-12, "bool mask");
}

}  // namespace
}  // namespace orochi::engine
