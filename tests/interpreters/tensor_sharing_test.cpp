// Tensors crossing between the host and interpreter copies: the same engine storage everywhere,
// never a copy, and weights that no copy can modify.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "orochi/engine/ops.h"
#include "orochi/engine/safetensors.h"
#include "test_support.h"

namespace orochi::interpreters {
namespace {

using engine::Tensor;
using ::testing::HasSubstr;

constexpr const char* kHelpers = R"(
import orochi

def pointer(tensor):
    return tensor.data_ptr()

def total(tensor):
    return tensor.sum().item()

def try_to_modify(tensor):
    failures = []
    for name, attempt in [("+=", lambda: tensor.__iadd__(1)),
                          ("add_", lambda: tensor.add_(1)),
                          ("setitem", lambda: tensor.__setitem__(0, 5.0)),
                          ("copy_", lambda: tensor.copy_(orochi.zeros(tensor.shape))),
                          ("memoryview", lambda: memoryview(tensor).cast("B").__setitem__(0, 1))]:
        try:
            attempt()
            failures.append(name + ": no error")
        except (RuntimeError, ValueError, TypeError) as error:
            if "read-only" not in str(error):
                failures.append(name + ": " + str(error))
    return "; ".join(failures)
)";

Tensor AsTensor(const Result<Value>& value) {
  EXPECT_TRUE(value.ok()) << value.status().ToString();
  if (!value.ok() || !std::holds_alternative<Tensor>(*value)) {
    ADD_FAILURE() << "not a tensor";
    return {};
  }
  return std::get<Tensor>(*value);
}

int64_t CallInt(Interpreter& copy, std::string_view target, const Tensor& tensor) {
  Value argument = tensor;
  Result<Value> result = copy.Call(target, std::span<const Value>(&argument, 1));
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  if (!result.ok() || !std::holds_alternative<int64_t>(*result)) return -1;
  return std::get<int64_t>(*result);
}

TEST(TensorSharing, ATensorMadeInOneCopyIsTheSameStorageInAnother) {
  auto maker = NewCopy();
  auto user = NewCopy();
  ASSERT_TRUE(maker && user);
  ASSERT_OK(user->Exec(kHelpers));

  Tensor made = AsTensor(maker->Eval("__import__('orochi').arange(1, 7).view(2, 3)"));
  ASSERT_TRUE(made.defined());
  EXPECT_EQ(made.shape(), (engine::Shape{2, 3}));
  auto address = reinterpret_cast<int64_t>(made.data());
  EXPECT_EQ(CallInt(*user, "__main__:pointer", made), address);
  EXPECT_EQ(CallInt(*user, "__main__:total", made), 21);

  // The storage belongs to the engine, so it outlives the copy that made it.
  ASSERT_OK(maker->Unload());
  EXPECT_EQ(made.data_as<int64_t>()[5], 6);
  EXPECT_EQ(CallInt(*user, "__main__:total", made), 21);
}

TEST(TensorSharing, WeightsAreSharedByEveryCopyAndReadOnlyInEach) {
  std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("orochi-weights-" + std::to_string(getpid()));
  ASSERT_OK(engine::SaveSafetensors(
      file.string(), {{"weight", engine::Arange(0, 8).To(engine::DType::kFloat32)}}));
  Result<engine::SafetensorsContents> loaded = engine::LoadSafetensors(file.string());
  std::filesystem::remove(file);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Tensor& weight = loaded->tensors.at("weight");
  ASSERT_TRUE(weight.read_only());

  std::vector<std::unique_ptr<Interpreter>> copies;
  for (int i = 0; i < 3; ++i) {
    copies.push_back(NewCopy());
    ASSERT_TRUE(copies.back());
    ASSERT_OK(copies.back()->Exec(kHelpers));
  }
  for (auto& copy : copies) {
    EXPECT_EQ(CallInt(*copy, "__main__:pointer", weight), reinterpret_cast<int64_t>(weight.data()));
    Value argument = weight;
    Result<Value> failures =
        copy->Call("__main__:try_to_modify", std::span<const Value>(&argument, 1));
    ASSERT_TRUE(failures.ok()) << failures.status().ToString();
    EXPECT_EQ(std::get<std::string>(*failures), "");
  }
  EXPECT_EQ(weight.data_as<float>()[0], 0.0F);
  EXPECT_EQ(weight.data_as<float>()[7], 7.0F);
}

constexpr const char* kFold = R"(
import orochi
import orochi.nn as nn

def fold(conv_weight, bn_weight, bn_bias, mean, var):
    """A model's load-time fold: conv and batch norm bound to the loaded weights, then fused.
    Returns the fused weight after checking the fused convolution against the two ops."""
    out_channels, in_channels, size, _ = conv_weight.shape
    conv = nn.Conv2d(in_channels, out_channels, size, bias=False)
    conv.load_state_dict({"weight": conv_weight})
    bn = nn.BatchNorm2d(out_channels)
    bn.load_state_dict({"weight": bn_weight, "bias": bn_bias, "running_mean": mean,
                        "running_var": var}, strict=False)
    fused = nn.utils.fusion.fuse_conv_bn_eval(conv, bn)
    x = orochi.arange(2 * in_channels * 25, dtype=orochi.float32).reshape(2, in_channels, 5, 5)
    x = (x * 0.37).sin()
    reference = bn(conv(x))
    difference = (fused(x) - reference).abs().max().item()
    if difference > 1e-5 * (1 + reference.abs().max().item()):
        raise AssertionError(f"the fused convolution differs by {difference}")
    return fused.weight
)";

TEST(TensorSharing, BatchNormsFoldedIntoLoadedWeightsAreHeldOnceForEveryCopy) {
  std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("orochi-fold-" + std::to_string(getpid()));
  auto channel_values = [](double start) {
    return engine::Binary(engine::Op::add, engine::Arange(0, 4).To(engine::DType::kFloat32),
                          engine::Scalar(start, engine::DType::kFloat32));
  };
  ASSERT_OK(engine::SaveSafetensors(
      file.string(),
      {{"conv", engine::Arange(0, 4 * 3 * 3 * 3).To(engine::DType::kFloat32).View({4, 3, 3, 3})},
       {"bn_weight", channel_values(0.5)},
       {"bn_bias", channel_values(-1)},
       {"mean", channel_values(0.25)},
       {"var", channel_values(1)}}));
  Result<engine::SafetensorsContents> loaded = engine::LoadSafetensors(file.string());
  std::filesystem::remove(file);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  std::vector<Value> arguments;
  for (const char* name : {"conv", "bn_weight", "bn_bias", "mean", "var"}) {
    arguments.emplace_back(loaded->tensors.at(name));
  }

  std::vector<Tensor> folded;
  for (int i = 0; i < 3; ++i) {
    auto copy = NewCopy();
    ASSERT_TRUE(copy);
    ASSERT_OK(copy->Exec(kFold));
    folded.push_back(AsTensor(copy->Call("__main__:fold", std::span<const Value>(arguments))));
    ASSERT_TRUE(folded.back().defined());
    ASSERT_OK(copy->Unload());  // the fold outlives the copy that made it
  }
  const Tensor& conv = loaded->tensors.at("conv");
  EXPECT_NE(folded[0].data(), conv.data());
  EXPECT_TRUE(folded[0].read_only());
  for (const Tensor& other : folded) {
    EXPECT_EQ(other.data(), folded[0].data()) << "one folded weight for every copy";
  }
  // conv * weight / sqrt(var + eps), per output channel: channel 1, first element.
  EXPECT_NEAR(folded[0].data_as<float>()[27], 27 * 1.5 / std::sqrt(2 + 1e-5), 1e-4);

  // A writable weight may change between folds: each fold is its own.
  arguments[0] = conv.Clone();
  auto copy = NewCopy();
  ASSERT_TRUE(copy);
  ASSERT_OK(copy->Exec(kFold));
  Tensor own = AsTensor(copy->Call("__main__:fold", std::span<const Value>(arguments)));
  EXPECT_NE(own.data(), folded[0].data());
  EXPECT_EQ(own.data_as<float>()[27], folded[0].data_as<float>()[27]);
}

TEST(TensorSharing, MemoryLentByPythonIsCopiedOutWhenItLeavesTheCopy) {
  auto copy = NewCopy();
  ASSERT_TRUE(copy);
  ASSERT_OK(
      copy->Exec("import orochi\n"
                 "data = bytearray(b'\\x00\\x00\\x80\\x3f' * 2)\n"
                 "lent = orochi.frombuffer(data, dtype=orochi.float32)\n"));
  EXPECT_EQ(EvalInt(*copy, "int(lent.is_read_only)"), 0);
  Tensor out = AsTensor(copy->Eval("lent"));
  ASSERT_TRUE(out.defined());
  EXPECT_FALSE(out.storage()->borrowed());
  ASSERT_OK(copy->Unload());
  EXPECT_EQ(out.data_as<float>()[1], 1.0F);
}

TEST(TensorSharing, ViewsAndDTypesSurviveTheCrossing) {
  auto copy = NewCopy();
  ASSERT_TRUE(copy);
  Tensor view =
      AsTensor(copy->Eval("__import__('orochi').arange(12, dtype=__import__('orochi').int16)"
                          ".view(3, 4).t()[1:]"));
  ASSERT_TRUE(view.defined());
  EXPECT_EQ(view.dtype(), engine::DType::kInt16);
  EXPECT_EQ(view.shape(), (engine::Shape{3, 3}));
  EXPECT_EQ(view.strides(), (engine::Shape{1, 4}));
  EXPECT_EQ(view.ItemAsDouble(0), 1);
}

TEST(TensorSharing, ErrorsFromTheEngineReachTheHostAsPythonErrors) {
  auto copy = NewCopy();
  ASSERT_TRUE(copy);
  Result<Value> result = copy->Eval("__import__('orochi').ones(2) + __import__('orochi').ones(3)");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kPythonError);
  EXPECT_THAT(result.status().message(), HasSubstr("cannot be broadcast"));
}

}  // namespace
}  // namespace orochi::interpreters
