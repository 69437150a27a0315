// Every op against a reference computed here in double precision, over several dtypes,
// broadcast shapes and non-contiguous inputs. Those references are the ops' formulas written
// again, which a kernel with the same wrong formula would pass: so each op is also checked at
// fixed inputs against values PyTorch computed (written out below as literals), and the
// formulas here against the same values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include "engine_test_support.h"
#include "orochi/engine/cpu_math.h"
#include "orochi/engine/error.h"

namespace orochi::engine {
namespace {

const DType kFloatTypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64};

// A non-contiguous [3, 5] float tensor: the transpose of a [5, 3] one.
Tensor NonContiguous(DType dtype, double low, double high, unsigned seed = 11) {
  Tensor tensor = RandomTensor({5, 3}, dtype, low, high, seed).Transpose(0, 1);
  EXPECT_FALSE(tensor.is_contiguous());
  return tensor;
}

double Reference(Op op, double x) {
  switch (op) {
    case Op::neg:
      return -x;
    case Op::abs:
      return std::abs(x);
    case Op::exp:
      return std::exp(x);
    case Op::log:
      return std::log(x);
    case Op::sqrt:
      return std::sqrt(x);
    case Op::rsqrt:
      return 1 / std::sqrt(x);
    case Op::sin:
      return std::sin(x);
    case Op::cos:
      return std::cos(x);
    case Op::tanh:
      return std::tanh(x);
    case Op::sigmoid:
      return 1 / (1 + std::exp(-x));
    case Op::relu:
      return std::max(x, 0.0);
    case Op::silu:
      return x / (1 + std::exp(-x));
    case Op::gelu:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Op::gelu_tanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case Op::erf:
      return std::erf(x);
    case Op::floor:
      return std::floor(x);
    case Op::ceil:
      return std::ceil(x);
    case Op::round:
      return std::nearbyint(x);
    default:
      ADD_FAILURE() << "no reference for " << OpName(op);
      return 0;
  }
}

TEST(UnaryOps, MatchTheReferenceOnEveryFloatingDType) {
  const Op kOps[] = {Op::neg,  Op::abs,       Op::exp,  Op::log,     Op::sqrt, Op::rsqrt,
                     Op::sin,  Op::cos,       Op::tanh, Op::sigmoid, Op::relu, Op::silu,
                     Op::gelu, Op::gelu_tanh, Op::erf,  Op::floor,   Op::ceil, Op::round};
  for (DType dtype : kFloatTypes) {
    for (Op op : kOps) {
      bool positive_only = op == Op::log || op == Op::sqrt || op == Op::rsqrt;
      Tensor input = NonContiguous(dtype, positive_only ? 0.1 : -3, 3);
      Tensor output = Unary(op, input);
      ASSERT_EQ(output.dtype(), dtype);
      ASSERT_EQ(output.shape(), input.shape());
      std::vector<double> expected;
      for (int64_t i = 0; i < input.numel(); ++i) {
        expected.push_back(Reference(op, input.ItemAsDouble(i)));
      }
      // The output is rounded to its dtype once: allow one rounding of the result.
      ExpectNear(output, expected, Tolerance(dtype) * 2,
                 std::string(OpName(op)) + " " + std::string(DTypeName(dtype)));
    }
  }
}

// Reference values: Debian's PyTorch 1.13 in float64 (torch.exp(x), torch.sigmoid(x),
// torch.nn.functional.silu(x), torch.nn.functional.gelu(x), gelu(x, approximate="tanh"), ...),
// printed with repr() and written out here; round() is checked at halves, which go to even.
struct FixedPoints {
  Op op;
  std::vector<double> inputs;
  std::vector<double> expected;
};

const std::vector<double> kSignedInputs{-6, -2.5, -1, -0.25, 0, 0.5, 1.5, 3};
const std::vector<double> kPositiveInputs{0.125, 0.5, 1, 2.5, 7};

const std::vector<FixedPoints>& UnaryFixedPoints() {
  static const std::vector<FixedPoints> kPoints{
      {Op::neg, kSignedInputs, {6, 2.5, 1, 0.25, -0.0, -0.5, -1.5, -3}},
      {Op::abs, kSignedInputs, {6, 2.5, 1, 0.25, 0, 0.5, 1.5, 3}},
      {Op::exp,
       kSignedInputs,
       {0.0024787521766663585, 0.0820849986238988, 0.36787944117144233, 0.7788007830714049, 1.0,
        1.6487212707001282, 4.4816890703380645, 20.085536923187668}},
      {Op::sin,
       kSignedInputs,
       {0.27941549819892586, -0.5984721441039564, -0.8414709848078965, -0.24740395925452294, 0.0,
        0.479425538604203, 0.9974949866040544, 0.1411200080598672}},
      {Op::cos,
       kSignedInputs,
       {0.960170286650366, -0.8011436155469337, 0.5403023058681398, 0.9689124217106447, 1.0,
        0.8775825618903728, 0.0707372016677029, -0.9899924966004454}},
      {Op::tanh,
       kSignedInputs,
       {-0.9999877116507956, -0.9866142981514303, -0.7615941559557649, -0.24491866240370913, 0.0,
        0.46211715726000974, 0.9051482536448664, 0.9950547536867305}},
      {Op::sigmoid,
       kSignedInputs,
       {0.0024726231566347743, 0.07585818002124355, 0.2689414213699951, 0.43782349911420193, 0.5,
        0.6224593312018546, 0.8175744761936437, 0.9525741268224334}},
      {Op::relu, kSignedInputs, {0, 0, 0, 0, 0, 0.5, 1.5, 3}},
      {Op::silu,
       kSignedInputs,
       {-0.014835738939808647, -0.18964545005310887, -0.2689414213699951, -0.10945587477855048, 0.0,
        0.3112296656009273, 1.2263617142904655, 2.8577223804672998}},
      {Op::gelu,
       kSignedInputs,
       {-5.919525869479969e-09, -0.015524163314440398, -0.15865525393145702, -0.10032341857926907,
        0.0, 0.34573123063700656, 1.399789198096713, 2.99595030590511}},
      {Op::gelu_tanh,
       kSignedInputs,
       {-8.43964897967453e-11, -0.015084266089998577, -0.1588080093917233, -0.100324649298315, 0.0,
        0.34571400982514394, 1.3995715769802328, 2.996362607918227}},
      {Op::erf,
       kSignedInputs,
       {-1.0, -0.999593047982555, -0.8427007929497149, -0.27632639016823696, 0.0,
        0.5204998778130465, 0.9661051464753108, 0.9999779095030014}},
      {Op::floor, kSignedInputs, {-6, -3, -1, -1, 0, 0, 1, 3}},
      {Op::ceil, kSignedInputs, {-6, -2, -1, -0.0, 0, 1, 2, 3}},
      {Op::round, {-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -1.75, 1.25}, {-2, -2, -0.0, 0, 2, 2, -2, 1}},
      {Op::log,
       kPositiveInputs,
       {-2.0794415416798357, -0.6931471805599453, 0.0, 0.9162907318741551, 1.9459101490553132}},
      {Op::sqrt,
       kPositiveInputs,
       {0.3535533905932738, 0.7071067811865476, 1.0, 1.5811388300841898, 2.6457513110645907}},
      {Op::rsqrt,
       kPositiveInputs,
       {2.82842712474619, 1.414213562373095, 1.0, 0.6324555320336759, 0.3779644730092272}},
  };
  return kPoints;
}

TEST(UnaryOps, MatchPyTorchAtFixedPointsOnEveryFloatingDType) {
  for (const FixedPoints& points : UnaryFixedPoints()) {
    const int64_t count = static_cast<int64_t>(points.inputs.size());
    for (DType dtype : kFloatTypes) {
      // The inputs are exact in every floating dtype; the output is rounded to it once.
      ExpectNear(Unary(points.op, TensorOf({count}, points.inputs, dtype)), points.expected,
                 dtype == DType::kFloat64 ? 1e-15 : Tolerance(dtype),
                 std::string(OpName(points.op)) + " " + std::string(DTypeName(dtype)));
    }
  }
}

// The formulas that the other tests here compare the kernels with give PyTorch's values too.
TEST(UnaryOps, TheReferenceFormulasGivePyTorchsValues) {
  for (const FixedPoints& points : UnaryFixedPoints()) {
    std::vector<double> formula;
    for (double x : points.inputs) formula.push_back(Reference(points.op, x));
    const int64_t count = static_cast<int64_t>(formula.size());
    ExpectNear(TensorOf({count}, formula), points.expected, 1e-15, std::string(OpName(points.op)));
  }
}

TEST(UnaryOps, IntegralInputsKeepOrBecomeFloat32LikePyTorch) {
  Tensor integers = RandomTensor({4, 3}, DType::kInt32, -5, 5).Transpose(0, 1);
  EXPECT_EQ(Unary(Op::neg, integers).dtype(), DType::kInt32);
  EXPECT_EQ(Unary(Op::abs, integers).dtype(), DType::kInt32);
  Tensor exponent = Unary(Op::exp, integers);
  EXPECT_EQ(exponent.dtype(), DType::kFloat32);
  std::vector<double> expected;
  std::vector<double> negated;
  for (int64_t i = 0; i < integers.numel(); ++i) {
    expected.push_back(std::exp(integers.ItemAsDouble(i)));
    negated.push_back(-integers.ItemAsDouble(i));
  }
  ExpectNear(exponent, expected, 2e-6, "exp int32");
  ExpectNear(Unary(Op::neg, integers), negated, 0, "neg int32");
}

double ReferenceBinary(Op op, double a, double b, bool integral) {
  switch (op) {
    case Op::add:
      return a + b;
    case Op::sub:
      return a - b;
    case Op::mul:
      return a * b;
    case Op::div:
      return a / b;
    case Op::pow:
      return integral && b < 0 ? 0 : std::pow(a, b);
    case Op::floor_divide:
      return std::floor(a / b);
    case Op::remainder:
      return a - std::floor(a / b) * b;
    case Op::maximum:
      return std::max(a, b);
    case Op::minimum:
      return std::min(a, b);
    case Op::eq:
      return a == b;
    case Op::ne:
      return a != b;
    case Op::lt:
      return a < b;
    case Op::le:
      return a <= b;
    case Op::gt:
      return a > b;
    case Op::ge:
      return a >= b;
    default:
      ADD_FAILURE() << "no reference for " << OpName(op);
      return 0;
  }
}

TEST(BinaryOps, BroadcastPromoteAndMatchTheReference) {
  const Op kOps[] = {Op::add,          Op::sub,       Op::mul,     Op::div,     Op::pow,
                     Op::floor_divide, Op::remainder, Op::maximum, Op::minimum, Op::eq,
                     Op::ne,           Op::lt,        Op::le,      Op::gt,      Op::ge};
  struct Case {
    DType a;
    DType b;
  };
  const Case kCases[] = {{DType::kFloat32, DType::kFloat32},  {DType::kFloat16, DType::kFloat32},
                         {DType::kBFloat16, DType::kFloat64}, {DType::kInt32, DType::kFloat32},
                         {DType::kInt64, DType::kInt8},       {DType::kUInt8, DType::kInt8},
                         {DType::kFloat16, DType::kBFloat16}};
  for (const Case& types : kCases) {
    // [3, 1, 4] (non-contiguous) with [5, 1] -> [3, 5, 4]
    Tensor a = RandomTensor({4, 1, 3}, types.a, 0.5, 3, 21).Permute({2, 1, 0});
    Tensor b = RandomTensor({5, 1}, types.b, 0.5, 3, 22);
    DType promoted = PromoteTypes(types.a, types.b);
    for (Op op : kOps) {
      Tensor output = Binary(op, a, b);
      bool comparison = op >= Op::eq && op <= Op::ge;
      DType expected_dtype = comparison                               ? DType::kBool
                             : op == Op::div && !IsFloating(promoted) ? DType::kFloat32
                                                                      : promoted;
      ASSERT_EQ(output.dtype(), expected_dtype) << OpName(op);
      ASSERT_EQ(output.shape(), (Shape{3, 5, 4}));
      std::vector<double> expected;
      for (int64_t i = 0; i < output.numel(); ++i) {
        std::vector<int64_t> index = UnflattenIndex(i, output.shape());
        double value = ReferenceBinary(op, ElementAt(a, index), ElementAt(b, index),
                                       !IsFloating(expected_dtype) && !comparison);
        if (!IsFloating(expected_dtype) && !comparison) value = std::trunc(value);
        expected.push_back(value);
      }
      double tolerance = comparison ? 0 : Tolerance(expected_dtype) * 2;
      ExpectNear(output, expected, tolerance,
                 std::string(OpName(op)) + " " + std::string(DTypeName(types.a)) + "," +
                     std::string(DTypeName(types.b)));
    }
  }
}

// Reference values: Debian's PyTorch 1.13 (torch.floor_divide, torch.remainder, a / b and
// torch.pow on float64 and int64 tensors), written out here. Floor division and the remainder
// take the sign of the divisor, as Python's // and %; integer division gives float32.
TEST(BinaryOps, DivisionRemainderAndPowerMatchPyTorchAtFixedPoints) {
  const Tensor a = TensorOf({8}, {-7, -7, 7, 7, -5.5, 5.5, -0.75, 3});
  const Tensor b = TensorOf({8}, {2, -2, 2, -2, 2, -2, 0.5, -4});
  ExpectNear(Binary(Op::floor_divide, a, b), {-4, 3, 3, -4, -3, -3, -2, -1}, 0, "floor_divide");
  ExpectNear(Binary(Op::remainder, a, b), {1, -1, 1, -1, 0.5, -0.5, 0.25, -1}, 0, "remainder");
  ExpectNear(Binary(Op::div, a, b), {-3.5, 3.5, 3.5, -3.5, -2.75, -2.75, -1.5, -0.75}, 0, "div");

  const Tensor ai = TensorOf({8}, {-7, -7, 7, 7, -8, 9, 0, 5}, DType::kInt64);
  const Tensor bi = TensorOf({8}, {2, -2, 2, -2, 3, -4, 3, 5}, DType::kInt64);
  ExpectNear(Binary(Op::floor_divide, ai, bi), {-4, 3, 3, -4, -3, -3, 0, 1}, 0,
             "floor_divide int64");
  ExpectNear(Binary(Op::remainder, ai, bi), {1, -1, 1, -1, 1, -3, 0, 0}, 0, "remainder int64");
  const Tensor quotient = Binary(Op::div, ai, bi);
  EXPECT_EQ(quotient.dtype(), DType::kFloat32);
  ExpectNear(quotient, {-3.5, 3.5, 3.5, -3.5, -2.6666667461395264, -2.25, 0, 1}, 0, "div int64");

  ExpectNear(Binary(Op::pow, TensorOf({4}, {2, 0.5, 9, 1.5}), TensorOf({4}, {-1, 3, 0.5, 2.5})),
             {0.5, 0.125, 3.0, 2.7556759606310752}, 1e-15, "pow");
  ExpectNear(Binary(Op::pow, TensorOf({6}, {2, -3, 5, 1, -1, 0}, DType::kInt64),
                    TensorOf({6}, {10, 3, 0, -2, -3, 0}, DType::kInt64)),
             {1024, -27, 1, 1, -1, 1}, 0, "pow int64");
  ExpectNear(Binary(Op::pow, TensorOf({3}, {2, 3, -2}, DType::kInt64),
                    TensorOf({3}, {-1, -2, -1}, DType::kInt64)),
             {0, 0, 0}, 0, "pow int64, negative exponents");
}

TEST(BinaryOps, MaximumAndMinimumPropagateNaN) {
  Tensor a = Full({2}, std::nan(""), DType::kFloat32);
  Tensor b = Ones({2});
  EXPECT_TRUE(std::isnan(Binary(Op::maximum, a, b).ItemAsDouble(0)));
  EXPECT_TRUE(std::isnan(Binary(Op::minimum, b, a).ItemAsDouble(1)));
}

TEST(BinaryOps, RejectMismatchedShapes) {
  EXPECT_THROW(Binary(Op::add, Zeros({2, 3}), Zeros({4})), Error);
}

// PyTorch refuses to subtract or negate bools, and says what was likely meant (~ or ^); so does
// the engine, on every device, so that a model that runs here runs under PyTorch.
TEST(BinaryOps, SubtractionAndNegationOfBoolsAreRefusedLikePyTorch) {
  const Tensor mask = Ones({3}, DType::kBool);
  const auto message = [](const std::function<void()>& call) {
    try {
      call();
    } catch (const Error& error) {
      EXPECT_EQ(error.status().code(), StatusCode::kInvalidArgument);
      return std::string(error.what());
    }
    return std::string("no error");
  };
  const std::string two_bools = "Subtraction, the `-` operator, with two bool tensors";
  const std::string one_bool = "Subtraction, the `-` operator, with a bool tensor is not supported";
  EXPECT_THAT(message([&] { Binary(Op::sub, mask, mask); }), testing::HasSubstr(two_bools));
  EXPECT_THAT(message([&] { Binary(Op::sub, mask, Scalar(1, DType::kBool)); }),
              testing::HasSubstr(two_bools));
  EXPECT_THAT(message([&] { Binary(Op::sub, mask, Ones({3}, DType::kInt32)); }),
              testing::HasSubstr(one_bool));
  EXPECT_THAT(message([&] { Binary(Op::sub, Scalar(1.5, DType::kFloat32), mask); }),
              testing::HasSubstr(one_bool));
  EXPECT_THAT(message([&] { Unary(Op::neg, mask); }),
              testing::HasSubstr("Negation, the `-` operator, on a bool tensor is not supported"));
  // What PyTorch allows stays allowed.
  EXPECT_EQ(Binary(Op::add, mask, mask).dtype(), DType::kBool);
  EXPECT_EQ(Binary(Op::logical_xor, mask, mask).dtype(), DType::kBool);
  EXPECT_EQ(Binary(Op::sub, Ones({3}, DType::kUInt8), Ones({3}, DType::kUInt8)).ItemAsDouble(), 0);
}

std::vector<double> ReferenceReduce(Op op, const Tensor& input, const std::vector<int64_t>& dims,
                                    Shape* kept_shape) {
  std::vector<bool> reduced(static_cast<size_t>(input.dim()), dims.empty());
  for (int64_t d : dims) reduced[WrapDim(d, input.dim())] = true;
  kept_shape->clear();
  for (int64_t d = 0; d < input.dim(); ++d) {
    if (!reduced[d]) kept_shape->push_back(input.shape()[d]);
  }
  std::map<std::vector<int64_t>, std::vector<double>> groups;
  for (int64_t i = 0; i < input.numel(); ++i) {
    std::vector<int64_t> index = UnflattenIndex(i, input.shape());
    std::vector<int64_t> key;
    for (int64_t d = 0; d < input.dim(); ++d) {
      if (!reduced[d]) key.push_back(index[d]);
    }
    groups[key].push_back(ElementAt(input, index));
  }
  std::vector<double> result;
  for (const auto& [key, values] : groups) {  // std::map orders keys row-major
    double value = values[0];
    if (op == Op::sum || op == Op::mean) {
      value = 0;
      for (double x : values) value += x;
      if (op == Op::mean) value /= static_cast<double>(values.size());
    } else {
      for (double x : values) value = op == Op::amax ? std::max(value, x) : std::min(value, x);
    }
    result.push_back(value);
  }
  return result;
}

TEST(Reductions, OverDimsWithAndWithoutKeepdim) {
  const std::vector<std::vector<int64_t>> kDimSets = {{}, {0}, {-1}, {0, 2}, {1}};
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kInt32}) {
    Tensor input = RandomTensor({4, 3, 5}, dtype, -3, 3, 5).Permute({1, 0, 2});  // [3, 4, 5]
    for (Op op : {Op::sum, Op::mean, Op::amax, Op::amin}) {
      if (op == Op::mean && !IsFloating(dtype)) continue;
      for (const auto& dims : kDimSets) {
        for (bool keepdim : {false, true}) {
          Tensor output = Reduce(op, input, dims, keepdim);
          Shape kept;
          std::vector<double> expected = ReferenceReduce(op, input, dims, &kept);
          if (keepdim) {
            EXPECT_EQ(output.dim(), input.dim());
          } else {
            EXPECT_EQ(output.shape(), kept);
          }
          DType expected_dtype = op == Op::sum && !IsFloating(dtype) ? DType::kInt64 : dtype;
          EXPECT_EQ(output.dtype(), expected_dtype);
          ExpectNear(output, expected, Tolerance(dtype) * 4,
                     std::string(OpName(op)) + " " + std::string(DTypeName(dtype)));
        }
      }
    }
  }
  EXPECT_EQ(Reduce(Op::sum, Ones({3}, DType::kBool)).ItemAsDouble(), 3);
  EXPECT_THROW(Reduce(Op::sum, Zeros({2, 3}), {0, 0}), Error);
  EXPECT_THROW(Reduce(Op::amax, Zeros({0, 3}), {0}), Error);
}

TEST(Softmax, MatchesTheReferenceOverAnyDim) {
  for (DType dtype : kFloatTypes) {
    Tensor input = RandomTensor({4, 6}, dtype, -5, 5, 9).Transpose(0, 1);  // [6, 4]
    for (int64_t dim : {0, 1, -1}) {
      Tensor soft = Softmax(input, dim);
      Tensor log_soft = LogSoftmax(input, dim);
      std::vector<double> expected_soft(static_cast<size_t>(input.numel()));
      std::vector<double> expected_log(static_cast<size_t>(input.numel()));
      int64_t d = WrapDim(dim, 2);
      for (int64_t i = 0; i < input.numel(); ++i) {
        std::vector<int64_t> index = UnflattenIndex(i, input.shape());
        double maximum = -std::numeric_limits<double>::infinity();
        std::vector<int64_t> probe = index;
        for (probe[d] = 0; probe[d] < input.shape()[d]; ++probe[d]) {
          maximum = std::max(maximum, ElementAt(input, probe));
        }
        double total = 0;
        for (probe[d] = 0; probe[d] < input.shape()[d]; ++probe[d]) {
          total += std::exp(ElementAt(input, probe) - maximum);
        }
        double x = ElementAt(input, index);
        expected_soft[static_cast<size_t>(i)] = std::exp(x - maximum) / total;
        expected_log[static_cast<size_t>(i)] = x - maximum - std::log(total);
      }
      ExpectNear(soft, expected_soft, Tolerance(dtype) * 2, "softmax");
      ExpectNear(log_soft, expected_log, Tolerance(dtype) * 4, "log_softmax");
    }
  }
  EXPECT_THROW(Softmax(Zeros({3}, DType::kInt64), 0), Error);
}

// Reference values: Debian's PyTorch 1.13, torch.softmax and torch.log_softmax in float64,
// written out here; a -inf logit has probability 0 and log-probability -inf.
TEST(Softmax, MatchesPyTorchAtFixedPoints) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : kFloatTypes) {
    const Tensor logits = TensorOf({2, 4}, {1, 2, 3, 4, -1, 0, 0.5, -inf}, dtype);
    const std::string name(DTypeName(dtype));
    const double tolerance = dtype == DType::kFloat64 ? 1e-15 : Tolerance(dtype) * 2;
    ExpectNear(Softmax(logits, 1),
               {0.03205860328008499, 0.08714431874203257, 0.23688281808991016, 0.6439142598879724,
                0.12195165230972885, 0.3314989604240915, 0.5465493872661796, 0.0},
               tolerance, "softmax dim 1 " + name);
    ExpectNear(LogSoftmax(logits, 1),
               {-3.4401896985611953, -2.4401896985611953, -1.4401896985611953, -0.44018969856119533,
                -2.1041306053367284, -1.1041306053367284, -0.6041306053367282, -inf},
               tolerance * 2, "log_softmax dim 1 " + name);
    ExpectNear(Softmax(logits, 0),
               {0.8807970779778823, 0.8807970779778823, 0.9241418199787566, 1.0,
                0.11920292202211755, 0.11920292202211755, 0.07585818002124356, 0.0},
               tolerance, "softmax dim 0 " + name);
    ExpectNear(LogSoftmax(logits, 0),
               {-0.1269280110429726, -0.1269280110429726, -0.07888973429254957, 0.0,
                -2.1269280110429727, -2.1269280110429727, -2.5788897342925496, -inf},
               tolerance * 2, "log_softmax dim 0 " + name);
  }
}

TEST(Cumsum, MatchesRunningSumsOverAnyDimAndPromotesIntegersToInt64) {
  for (DType dtype : kFloatTypes) {
    Tensor input = RandomTensor({5, 7}, dtype, -3, 3, 31).Transpose(0, 1);  // [7, 5], strided
    for (int64_t dim : {0, 1, -1}) {
      Tensor sums = Cumsum(input, dim);
      EXPECT_EQ(sums.dtype(), dtype);
      EXPECT_EQ(sums.shape(), input.shape());
      std::vector<double> expected(static_cast<size_t>(input.numel()));
      const int64_t d = WrapDim(dim, 2);
      for (int64_t i = 0; i < input.numel(); ++i) {
        std::vector<int64_t> index = UnflattenIndex(i, input.shape());
        std::vector<int64_t> probe = index;
        double total = 0;
        for (probe[d] = 0; probe[d] <= index[d]; ++probe[d]) total += ElementAt(input, probe);
        expected[static_cast<size_t>(i)] = total;
      }
      ExpectNear(sums, expected, Tolerance(dtype) * 8, "cumsum");
    }
  }
  for (DType dtype : {DType::kBool, DType::kUInt8, DType::kInt32, DType::kInt64}) {
    Tensor sums = Cumsum(Ones({2, 3}, dtype), 1);
    EXPECT_EQ(sums.dtype(), DType::kInt64);
    ExpectNear(sums, {1, 2, 3, 1, 2, 3}, 0, "cumsum of ones");
  }
  // Rows enough for the intra-op pool to split them: every row still adds in its own order.
  Tensor rows = RandomTensor({512, 257}, DType::kFloat32, 0, 1, 32);
  Tensor whole = Cumsum(rows, 1);
  for (int64_t row : {0, 255, 511}) {
    double total = 0;
    for (int64_t column = 0; column < 257; ++column) {
      total += ElementAt(rows, {row, column});
      EXPECT_NEAR(ElementAt(whole, {row, column}), total, 1e-4) << row << ", " << column;
    }
  }
  EXPECT_EQ(Cumsum(Scalar(2.5, DType::kFloat32), 0).ItemAsDouble(), 2.5);
  EXPECT_THROW(Cumsum(Zeros({2, 3}), 2), Error);
  // Reference values: Debian's PyTorch 1.13, torch.cumsum in float64, written out here.
  const Tensor fixed =
      TensorOf({2, 4}, {0.5, -1.25, 3.0, 0.1, 2.0, 1e-3, -7.5, 4.25}, DType::kFloat64);
  ExpectNear(Cumsum(fixed, 1),
             {0.5, -0.75, 2.25, 2.35, 2.0, 2.001, -5.4990000000000006, -1.2490000000000006}, 1e-15,
             "cumsum dim 1");
  ExpectNear(Cumsum(fixed, 0), {0.5, -1.25, 3.0, 0.1, 2.5, -1.249, -4.5, 4.35}, 1e-15,
             "cumsum dim 0");
  ExpectNear(Cumsum(TensorOf({3}, {3, -2, 7}, DType::kInt32), 0), {3, 1, 8}, 0, "cumsum int32");
}

std::vector<double> ReferenceMatmul(const Tensor& a, const Tensor& b, const Shape& out_shape) {
  // Reference on the batched 3-D forms; out_shape is the torch.matmul result shape.
  Tensor left = a.dim() == 1 ? a.Unsqueeze(0) : a;
  Tensor right = b.dim() == 1 ? b.Unsqueeze(1) : b;
  int64_t m = left.size(-2);
  int64_t k = left.size(-1);
  int64_t n = right.size(-1);
  Shape batch = BroadcastShapes(Shape(left.shape().begin(), left.shape().end() - 2),
                                Shape(right.shape().begin(), right.shape().end() - 2));
  std::vector<double> result;
  for (int64_t bi = 0; bi < NumElements(batch); ++bi) {
    std::vector<int64_t> batch_index = UnflattenIndex(bi, batch);
    for (int64_t row = 0; row < m; ++row) {
      for (int64_t column = 0; column < n; ++column) {
        double total = 0;
        for (int64_t inner = 0; inner < k; ++inner) {
          std::vector<int64_t> li = batch_index;
          li.push_back(row);
          li.push_back(inner);
          std::vector<int64_t> ri = batch_index;
          ri.push_back(inner);
          ri.push_back(column);
          total += ElementAt(left, li) * ElementAt(right, ri);
        }
        result.push_back(total);
      }
    }
  }
  EXPECT_EQ(static_cast<int64_t>(result.size()), NumElements(out_shape));
  return result;
}

TEST(Matmul, CoversVectorMatrixAndBroadcastBatchCases) {
  struct Case {
    Shape a;
    Shape b;
    Shape out;
  };
  const Case kCases[] = {
      {{4}, {4}, {}},
      {{3, 4}, {4}, {3}},
      {{4}, {4, 5}, {5}},
      {{3, 4}, {4, 5}, {3, 5}},
      {{2, 3, 4}, {4, 5}, {2, 3, 5}},
      {{2, 1, 3, 4}, {3, 4, 5}, {2, 3, 3, 5}},
      {{4}, {2, 4, 5}, {2, 5}},
  };
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kInt64}) {
    for (const Case& shapes : kCases) {
      Tensor a = RandomTensor(shapes.a, dtype, -2, 2, 3);
      Tensor b = RandomTensor(shapes.b, dtype, -2, 2, 4);
      if (b.dim() >= 2) b = b.Transpose(-1, -2).Contiguous().Transpose(-1, -2);  // strided
      Tensor output = Matmul(a, b);
      ASSERT_EQ(output.shape(), shapes.out)
          << ShapeString(shapes.a) << " @ " << ShapeString(shapes.b);
      ExpectNear(output, ReferenceMatmul(a, b, shapes.out), Tolerance(dtype) * 8,
                 "matmul " + std::string(DTypeName(dtype)) + " " + ShapeString(shapes.a) + " @ " +
                     ShapeString(shapes.b));
    }
  }
  EXPECT_THROW(Matmul(Zeros({2, 3}), Zeros({4, 2})), Error);
  EXPECT_THROW(Matmul(Zeros({2, 3}), Zeros({3, 2}, DType::kFloat64)), Error);
}

// Transposed, sliced and broadcast operands are handed to the kernels as strided views (row- or
// column-major matrices, one batch stride); the results must not depend on the layout.
TEST(Matmul, ReadsTransposedSlicedAndBroadcastOperands) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kInt64}) {
    const std::string name(DTypeName(dtype));
    Tensor query = RandomTensor({2, 3, 5, 8}, dtype, -2, 2, 5);
    Tensor key = RandomTensor({2, 3, 7, 8}, dtype, -2, 2, 6);
    Tensor key_t = key.Transpose(-2, -1);  // [2, 3, 8, 7], column-major matrices
    ExpectNear(Matmul(query, key_t), ReferenceMatmul(query, key_t, {2, 3, 5, 7}),
               Tolerance(dtype) * 8, "q @ k^T " + name);
    Tensor weight = RandomTensor({6, 8}, dtype, -2, 2, 7);
    Tensor weight_t = weight.Transpose(0, 1);  // linear's weight.T: one matrix for every batch
    ExpectNear(Matmul(query, weight_t), ReferenceMatmul(query, weight_t, {2, 3, 5, 6}),
               Tolerance(dtype) * 8, "x @ w^T " + name);
    Tensor query_t = query.Transpose(-2, -1).Contiguous().Transpose(-2, -1);
    ExpectNear(Matmul(query_t, weight_t), ReferenceMatmul(query_t, weight_t, {2, 3, 5, 6}),
               Tolerance(dtype) * 8, "column-major x @ w^T " + name);
    Tensor filters = RandomTensor({4, 5}, dtype, -2, 2, 8);  // conv2d: [O, K] @ [N, K, L]
    ExpectNear(Matmul(filters, key.Narrow(2, 0, 5)),
               ReferenceMatmul(filters, key.Narrow(2, 0, 5), {2, 3, 4, 8}), Tolerance(dtype) * 8,
               "w @ sliced batch " + name);
    Tensor sliced = query.Slice(3, 1, 8, 2);  // a row stride that is not the width
    ExpectNear(Matmul(sliced, weight_t.Narrow(0, 0, 4)),
               ReferenceMatmul(sliced, weight_t.Narrow(0, 0, 4), {2, 3, 5, 6}),
               Tolerance(dtype) * 8, "strided rows " + name);
    Tensor column = RandomTensor({8, 1}, dtype, -2, 2, 9);
    ExpectNear(Matmul(query, column.Expand({8, 3})),
               ReferenceMatmul(query, column.Expand({8, 3}), {2, 3, 5, 3}), Tolerance(dtype) * 8,
               "broadcast columns " + name);
  }
  ExpectNear(Matmul(Zeros({2, 3, 0}), Zeros({0, 4})), std::vector<double>(24, 0.0), 0,
             "empty inner dimension");
}

TEST(Matmul, ReadOnlyWeightsReadTransposedMatchWhicheverPartIsRead) {
  // A loaded (read-only) weight read as w.T goes through a row-major copy kept with its storage:
  // each view of the storage (offset, shape, stride) must get the copy of its own elements.
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const std::string name(DTypeName(dtype));
    Tensor weight = RandomTensor({6, 8}, dtype, -2, 2, 11);
    weight.storage()->MarkReadOnly();
    Tensor rows = RandomTensor({9, 8}, dtype, -2, 2, 12);
    for (int repeat = 0; repeat < 2; ++repeat) {  // the second time from the kept copies
      ExpectNear(Matmul(rows, weight.Transpose(0, 1)),
                 ReferenceMatmul(rows, weight.Transpose(0, 1), {9, 6}), Tolerance(dtype) * 8,
                 "x @ w.T " + name);
      Tensor lower = weight.Narrow(0, 3, 3).Transpose(0, 1);
      ExpectNear(Matmul(rows, lower), ReferenceMatmul(rows, lower, {9, 3}), Tolerance(dtype) * 8,
                 "x @ w[3:].T " + name);
      Tensor inner = weight.Narrow(1, 2, 4).Transpose(0, 1);
      ExpectNear(Matmul(rows.Narrow(1, 0, 4), inner),
                 ReferenceMatmul(rows.Narrow(1, 0, 4), inner, {9, 6}), Tolerance(dtype) * 8,
                 "x @ w[:, 2:6].T " + name);
      ExpectNear(Linear(rows, weight, std::nullopt),
                 ReferenceMatmul(rows, weight.Transpose(0, 1), {9, 6}), Tolerance(dtype) * 8,
                 "linear " + name);
      ExpectNear(Matmul(rows.View({3, 3, 8}), weight.Transpose(0, 1)),
                 ReferenceMatmul(rows.View({3, 3, 8}), weight.Transpose(0, 1), {3, 3, 6}),
                 Tolerance(dtype) * 8, "batched x @ w.T " + name);
    }
  }
}

TEST(Matmul, LargeFloat32GoesThroughBlasCorrectly) {
  Tensor a = RandomTensor({64, 96}, DType::kFloat32, -1, 1, 1);
  Tensor b = RandomTensor({96, 80}, DType::kFloat32, -1, 1, 2);
  Tensor output = Matmul(a, b);
  ExpectNear(output, ReferenceMatmul(a, b, {64, 80}), 1e-5, "matmul 64x96x80");
  EXPECT_FALSE(BlasCoreName().empty());
}

TEST(Matmul, AvxFiveTwelveAmdCpusGetSkylakeXKernels) {
  __builtin_cpu_init();
  bool avx512_amd = __builtin_cpu_is("amd") && __builtin_cpu_supports("avx512f") &&
                    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512dq");
  std::string choice(BlasCoreChoice());
  std::printf("OpenBLAS core %s: %s\n", std::string(BlasCoreName()).c_str(), choice.c_str());
  if (choice.find("from the environment") != std::string::npos) {
    GTEST_SKIP() << "OPENBLAS_CORETYPE is set by the environment: " << choice;
  }
  if (avx512_amd) {
    EXPECT_EQ(BlasCoreName(), "SkylakeX") << "OpenBLAS 0.3.21 would run Haswell kernels here";
  } else {
    EXPECT_EQ(choice, "OpenBLAS's own CPU detection");
  }
}

}  // namespace
}  // namespace orochi::engine
