// Tensors crossing between the host and interpreter copies: the same engine storage everywhere,
// never a copy, and weights that no copy can modify.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
