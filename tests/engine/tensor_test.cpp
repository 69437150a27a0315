// Dtypes, promotion, broadcasting, views and the kernel registry.
#include <gtest/gtest.h>

#include <limits>
#include <memory>

#include "dispatch.h"
#include "engine_test_support.h"
#include "orochi/engine/error.h"

namespace orochi::engine {
namespace {

using testing::HasSubstr;

TEST(DTypes, NamesSizesAndCategoriesComeFromOneList) {
  EXPECT_EQ(kDTypeCount, 10);
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(SafetensorsCode(DType::kBFloat16), "BF16");
  EXPECT_EQ(ItemSize(DType::kFloat16), 2U);
  EXPECT_EQ(ItemSize(DType::kInt64), 8U);
  EXPECT_EQ(ItemSize(DType::kBool), 1U);
  for (int i = 0; i < kDTypeCount; ++i) {
    auto dtype = static_cast<DType>(i);
    DType parsed{};
    ASSERT_TRUE(ParseDType(DTypeName(dtype), &parsed));
    EXPECT_EQ(parsed, dtype);
    ASSERT_TRUE(ParseDType(SafetensorsCode(dtype), &parsed));
    EXPECT_EQ(parsed, dtype);
  }
  DType unused{};
  EXPECT_FALSE(ParseDType("complex64", &unused));
}

TEST(DTypes, HalfAndBFloat16ConvertWithRoundToNearestEven) {
  for (float value : {0.0F, -0.0F, 1.0F, -2.5F, 65504.0F, 6.1035156e-05F, 5.9604645e-08F, 0.1F}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(value)), Convert<float>(FloatToHalf(value)));
  }
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0F)), 1.0F);
  EXPECT_EQ(HalfToFloat(FloatToHalf(65504.0F)), 65504.0F);  // largest half
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(70000.0F))));
  EXPECT_EQ(HalfToFloat(FloatToHalf(5.9604645e-08F)), 5.9604645e-08F);  // smallest subnormal
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0009765625F)), 1.0009765625F);    // 1 + 2^-10
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.00048828125F)), 1.0F);            // tie -> even
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0F)), 1.0F);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(3.140625F)), 3.140625F);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.00390625F)), 1.0F);  // tie -> even
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
}

// torch.promote_types for every pair, as PyTorch documents it (b u8 i8 i16 i32 i64 f16 bf16
// f32 f64).
// C++ leaves these undefined and the devices differ (x86 wraps, CUDA saturates); the engine's
// rule is x86's, which PyTorch's CPU gives.
TEST(DTypes, FloatingToIntegerIsDefinedForEveryValue) {
  EXPECT_EQ(Convert<uint8_t>(-1.5F), 255);
  EXPECT_EQ(Convert<uint8_t>(300.0), 44);
  EXPECT_EQ(Convert<int8_t>(-129.9), 127);
  EXPECT_EQ(Convert<int32_t>(-2.9F), -2);
  EXPECT_EQ(Convert<uint8_t>(FloatToHalf(-2.0F)), 254);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(Convert<int64_t>(nan), INT64_MIN);
  EXPECT_EQ(Convert<int32_t>(static_cast<float>(nan)), INT32_MIN);
  EXPECT_EQ(Convert<uint8_t>(nan), 0);
  EXPECT_EQ(Convert<int32_t>(3e9), INT32_MIN);
  EXPECT_EQ(Convert<int16_t>(inf), 0);
  EXPECT_EQ(Convert<int64_t>(inf), INT64_MIN);
  EXPECT_EQ(Convert<int64_t>(-inf), INT64_MIN);
  EXPECT_EQ(Convert<int64_t>(1e30), INT64_MIN);
  EXPECT_EQ(Convert<int64_t>(-9223372036854775808.0), INT64_MIN);
  EXPECT_EQ(Convert<int64_t>(4611686018427387904.0), int64_t{1} << 62);
  EXPECT_EQ(Convert<int32_t>(-2147483648.0), INT32_MIN);
  EXPECT_EQ(Convert<int32_t>(2147483647.0), INT32_MAX);
}

TEST(DTypes, PromotionMatchesPyTorch) {
  const char* const kNames[] = {"b", "u8", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"};
  const char* const kTable[10][10] = {
      {"b", "u8", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"},
      {"u8", "u8", "i16", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"},
      {"i8", "i16", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"},
      {"i16", "i16", "i16", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"},
      {"i32", "i32", "i32", "i32", "i32", "i64", "f16", "bf16", "f32", "f64"},
      {"i64", "i64", "i64", "i64", "i64", "i64", "f16", "bf16", "f32", "f64"},
      {"f16", "f16", "f16", "f16", "f16", "f16", "f16", "f32", "f32", "f64"},
      {"bf16", "bf16", "bf16", "bf16", "bf16", "bf16", "f32", "bf16", "f32", "f64"},
      {"f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f64"},
      {"f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64"},
  };
  auto name_of = [&](DType dtype) { return std::string(kNames[static_cast<int>(dtype)]); };
  for (int a = 0; a < kDTypeCount; ++a) {
    for (int b = 0; b < kDTypeCount; ++b) {
      EXPECT_EQ(name_of(PromoteTypes(static_cast<DType>(a), static_cast<DType>(b))), kTable[a][b])
          << kNames[a] << " with " << kNames[b];
    }
  }
}

TEST(DTypes, ZeroDimTensorsPromoteOnlyAcrossCategories) {
  // torch.result_type: a 0-dim tensor does not widen dimensioned ones of its category...
  EXPECT_EQ(ResultType(Zeros({3}, DType::kInt32), Scalar(1, DType::kInt64)), DType::kInt32);
  EXPECT_EQ(ResultType(Zeros({3}, DType::kFloat16), Scalar(1, DType::kFloat64)), DType::kFloat16);
  // ...but a higher category wins with its own type.
  EXPECT_EQ(ResultType(Zeros({3}, DType::kInt32), Scalar(1, DType::kFloat64)), DType::kFloat64);
  EXPECT_EQ(ResultType(Zeros({3}, DType::kBool), Scalar(1, DType::kInt64)), DType::kInt64);
  EXPECT_EQ(ResultType(Scalar(1, DType::kInt64), Scalar(1, DType::kInt8)), DType::kInt64);
  EXPECT_EQ(Binary(Op::add, Zeros({2}, DType::kUInt8), Scalar(300, DType::kInt64)).dtype(),
            DType::kUInt8);
}

TEST(Broadcasting, FollowsNumPyRules) {
  EXPECT_EQ(BroadcastShapes({2, 1, 4}, {3, 1}), (Shape{2, 3, 4}));
  EXPECT_EQ(BroadcastShapes({}, {5}), (Shape{5}));
  EXPECT_EQ(BroadcastShapes({0, 1}, {1, 3}), (Shape{0, 3}));
  try {
    BroadcastShapes({2, 3}, {4});
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(error.what(), HasSubstr("[2, 3] and [4] cannot be broadcast"));
  }
}

TEST(Creation, EmptyShapesNeedStridesThatFit) {
  // A 0 counts as 1 in strides, as in PyTorch: [2, 0, 5] has the strides of [2, 1, 5].
  EXPECT_EQ(ContiguousStrides({2, 0, 5}), (Shape{5, 5, 1}));
  constexpr int64_t kHuge = 8643020009459241319;  // from the codec's fuzzer
  const Tensor empty = Tensor::Empty({2, 0, kHuge}, DType::kInt32);
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.strides(), (Shape{kHuge, kHuge, 1}));
  // No elements, but a first stride of 2^64: refused, as PyTorch refuses it, not wrapped.
  try {
    Tensor::Empty({0, int64_t{1} << 62, 4}, DType::kFloat32);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(error.what(), HasSubstr("[0, 4611686018427387904, 4] has strides that do not fit"));
  }
}

TEST(Views, ShareStorageAndFollowStrides) {
  Tensor base = Arange(0, 24, 1, DType::kFloat32).View({2, 3, 4});
  EXPECT_TRUE(base.is_contiguous());
  Tensor transposed = base.Transpose(0, 2);
  EXPECT_EQ(transposed.shape(), (Shape{4, 3, 2}));
  EXPECT_FALSE(transposed.is_contiguous());
  EXPECT_EQ(transposed.storage().get(), base.storage().get());
  EXPECT_EQ(ElementAt(transposed, {3, 2, 1}), 1 * 12 + 2 * 4 + 3);

  Tensor stepped = base.Slice(2, 1, 4, 2);  // [..., 1::2]
  EXPECT_EQ(stepped.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(ElementAt(stepped, {1, 2, 1}), 12 + 8 + 3);
  EXPECT_EQ(base.Slice(1, -2, 100).shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(base.Select(0, -1).ItemAsDouble(0), 12);
  EXPECT_EQ(base.Narrow(2, 1, 2).shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(base.Unsqueeze(1).shape(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(base.Unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(base.Unsqueeze(1).Squeeze().shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(base.Flatten(1).shape(), (Shape{2, 12}));
  EXPECT_EQ(base.View({-1, 4}).shape(), (Shape{6, 4}));

  Tensor expanded = Arange(0, 3, 1, DType::kFloat32).View({3, 1}).Expand({2, 3, 4});
  EXPECT_EQ(expanded.strides(), (Shape{0, 1, 0}));
  EXPECT_EQ(ElementAt(expanded, {1, 2, 3}), 2);

  // A transposed tensor cannot be viewed flat; Reshape copies instead.
  EXPECT_THROW(transposed.View({24}), Error);
  Tensor flat = transposed.Reshape({24});
  EXPECT_NE(flat.storage().get(), base.storage().get());
  EXPECT_EQ(flat.ItemAsDouble(1), 12);
  EXPECT_EQ(transposed.Contiguous().ItemAsDouble(1), 12);
  // Merging contiguous dims of a non-contiguous tensor is still a view.
  Tensor split = base.View({2, 3, 2, 2});
  EXPECT_EQ(split.storage().get(), base.storage().get());
  EXPECT_EQ(base.Slice(0, 0, 2).View({6, 4}).storage().get(), base.storage().get());
}

// The code of the Error that `call` throws; kOk when it throws none.
template <typename Call>
StatusCode ErrorCode(Call call) {
  try {
    call();
  } catch (const Error& error) {
    return error.status().code();
  }
  return StatusCode::kOk;
}

TEST(Views, DimsAndIndicesOutsideTheirRangeAreOutOfRange) {
  EXPECT_EQ(StatusCodeName(StatusCode::kOutOfRange), "OUT_OF_RANGE");
  const Tensor base = Arange(0, 6, 1, DType::kFloat32).View({2, 3});
  const Tensor scalar = Scalar(1, DType::kFloat32);
  const auto out_of_range = [](auto call) { return ErrorCode(call) == StatusCode::kOutOfRange; };
  EXPECT_TRUE(out_of_range([&] { WrapDim(2, 2); }));
  EXPECT_TRUE(out_of_range([&] { WrapDim(-3, 2); }));
  EXPECT_TRUE(out_of_range([&] { WrapScalarDim(1, 0); }));
  EXPECT_TRUE(out_of_range([&] { (void)base.size(5); }));
  EXPECT_TRUE(out_of_range([&] { base.Transpose(0, 7); }));
  EXPECT_TRUE(out_of_range([&] { base.Unsqueeze(4); }));
  EXPECT_TRUE(out_of_range([&] { base.Select(0, 2); }));
  EXPECT_TRUE(out_of_range([&] { base.Select(1, -4); }));
  EXPECT_TRUE(out_of_range([&] { base.Narrow(0, 3, 0); }));
  EXPECT_TRUE(out_of_range([&] { base.ItemAsDouble(6); }));
  EXPECT_TRUE(out_of_range([&] { Reduce(Op::sum, base, {5}); }));
  EXPECT_TRUE(out_of_range([&] { Reduce(Op::sum, scalar, {1}); }));
  EXPECT_TRUE(out_of_range([&] { Softmax(base, 2); }));
  EXPECT_TRUE(out_of_range([&] { Cat({base, base}, 2); }));
  EXPECT_TRUE(out_of_range([&] { IndexSelect(base, 0, Full({1}, 2, DType::kInt64)); }));
  EXPECT_TRUE(out_of_range([&] { IndexSelect(base, 0, Full({1}, -1, DType::kInt64)); }));
  // PyTorch's RuntimeErrors stay argument errors: a length past the end, a 0-d tensor where
  // one with dims is needed, a bad value in a gather index.
  EXPECT_EQ(ErrorCode([&] { base.Narrow(0, 1, 2); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorCode([&] { scalar.Narrow(0, 0, 1); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorCode([&] { Cat({scalar, scalar}, 0); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorCode([&] { Split(scalar, 1, 0); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorCode([&] {
              Gather(base, 1, Full({1, 1}, 3, DType::kInt64));
            }),
            StatusCode::kInvalidArgument);
  // A start at the very end selects nothing; a transposed 0-d tensor is itself.
  EXPECT_EQ(base.Narrow(1, 3, 0).shape(), (Shape{2, 0}));
  EXPECT_EQ(scalar.Transpose(0, -1).shape(), Shape{});
}

TEST(Storage, PreparedLayoutsAreMadeOncePerKeyAndFreedWithTheStorage) {
  Tensor weight = Ones({4});
  weight.storage()->MarkReadOnly();
  int prepared = 0;
  auto prepare = [&]() -> Storage::Prepared {
    ++prepared;
    return std::make_shared<int>(prepared);
  };
  Storage::Prepared first = weight.storage()->PreparedLayout("layout a", prepare);
  Storage::Prepared again = weight.View({2, 2}).storage()->PreparedLayout("layout a", prepare);
  Storage::Prepared other = weight.storage()->PreparedLayout("layout b", prepare);
  EXPECT_EQ(prepared, 2);
  EXPECT_EQ(first, again);  // one object for every caller
  EXPECT_EQ(*static_cast<const int*>(other.get()), 2);
  std::weak_ptr<const void> kept = first;
  first.reset();
  again.reset();
  other.reset();
  EXPECT_FALSE(kept.expired());  // the storage keeps it
  weight = Tensor();
  EXPECT_TRUE(kept.expired());  // and frees it with itself
}

TEST(Views, ReadOnlyTensorsRefuseWrites) {
  Tensor tensor = Ones({4});
  StoragePtr storage = tensor.storage();
  storage->MarkReadOnly();
  try {
    tensor.mutable_data();
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(error.what(), HasSubstr("read-only"));
  }
  EXPECT_THROW(tensor.CopyFrom(Zeros({4})), Error);
  Tensor writable = tensor.Clone();  // a copy is writable
  writable.CopyFrom(Zeros({4}));
  EXPECT_EQ(writable.ItemAsDouble(3), 0);
  EXPECT_EQ(tensor.ItemAsDouble(3), 1);
}

TEST(Storage, IsRefcountedAcrossViews) {
  Tensor tensor = Zeros({8});
  EXPECT_EQ(tensor.storage().use_count(), 1);
  {
    Tensor view = tensor.View({2, 4});
    EXPECT_EQ(tensor.storage().use_count(), 2);
  }
  EXPECT_EQ(tensor.storage().use_count(), 1);
}

TEST(Registry, EveryOpHasACpuKernel) {
  EXPECT_THAT(Kernels().Missing(DeviceType::kCpu), testing::IsEmpty());
}

// CUDA kernels register without a GPU, so a build with CUDA lists them all on any machine.
TEST(Registry, EveryOpHasACudaKernelExactlyWhenCudaIsBuilt) {
#if OROCHI_TEST_CUDA_BUILT
  EXPECT_THAT(Kernels().Missing(DeviceType::kCuda), testing::IsEmpty());
#else
  EXPECT_EQ(Kernels().Missing(DeviceType::kCuda).size(), static_cast<size_t>(kOpCount));
#endif
}

TEST(Registry, UnsupportedCombinationsNameOpDeviceAndDType) {
  try {
    Reduce(Op::mean, Zeros({3}, DType::kInt64));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), "mean is not implemented for dtype int64 on cpu");
  }
  try {
    Unary(Op::abs, Zeros({3}, DType::kBool));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), "abs is not implemented for dtype bool on cpu");
  }
  try {
    Kernels().Find<Op::neg>(Device{DeviceType::kCuda, 0}, DType::kBool);
    FAIL() << "expected an error";
  } catch (const Error& error) {
#if OROCHI_TEST_CUDA_BUILT
    EXPECT_EQ(std::string(error.what()), "neg is not implemented for dtype bool on cuda:0");
#else
    EXPECT_EQ(error.status().code(), StatusCode::kUnimplemented);
    EXPECT_EQ(std::string(error.what()), "neg has no kernel for cuda:0");
#endif
  }
}

TEST(Creation, MatchesPyTorch) {
  Tensor range = Arange(0, 1, 0.25, DType::kFloat32);
  ExpectNear(range, {0, 0.25, 0.5, 0.75}, 0, "arange");
  EXPECT_EQ(Arange(5, 0, -2).numel(), 3);  // 5, 3, 1
  EXPECT_EQ(Arange(5, 0, -2).dtype(), DType::kInt64);
  EXPECT_THROW(Arange(0, 5, -1), Error);
  EXPECT_THROW(Arange(0, 5, 0), Error);
  ExpectNear(Full({2, 2}, 2.5, DType::kFloat16), {2.5, 2.5, 2.5, 2.5}, 0, "full");
  EXPECT_EQ(Ones({2}, DType::kBool).ItemAsDouble(1), 1);
  EXPECT_THROW(Tensor::Empty({2, -1}, DType::kFloat32), Error);
}

}  // namespace
}  // namespace orochi::engine

namespace orochi::engine {
namespace {

TEST(Storage, LargeFreedBlocksAreReusedWithinTheCacheLimit) {
  const size_t limit = CpuCacheLimit();
  SetCpuCacheLimit(size_t{64} << 20);
  const void* first = nullptr;
  {
    Tensor big = Zeros({int64_t{1} << 20});  // 4 MiB
    first = big.data();
  }
  EXPECT_GE(CpuCachedBytes(), size_t{4} << 20);
  Tensor again = Ones({int64_t{1} << 20});
  EXPECT_EQ(again.data(), first) << "a freed block of the same size is reused";
  EXPECT_EQ(again.ItemAsDouble(12345), 1);  // and fully rewritten
  SetCpuCacheLimit(0);
  EXPECT_EQ(CpuCachedBytes(), 0U);
  SetCpuCacheLimit(limit);
}

}  // namespace
}  // namespace orochi::engine
