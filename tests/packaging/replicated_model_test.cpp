// Packages loaded into interpreter copies through ReplicatedModel: import isolation, threads,
// errors, unloading and memory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "orochi/base/process_memory.h"
#include "orochi/engine/ops.h"
#include "orochi/interpreters/interpreter_manager.h"
#include "orochi/interpreters/model.h"
#include "orochi/server/model_source.h"
#include "package_test_support.h"

namespace orochi::packaging {
namespace {

using interpreters::InterpreterManager;
using interpreters::NamedTensor;
using interpreters::ReplicatedModel;
using ::testing::HasSubstr;

constexpr const char* kScaleIo = R"([{"name": "x", "datatype": "FP32", "shape": [-1]}])";
constexpr const char* kScaleOutputs =
    R"([{"name": "y", "datatype": "FP32", "shape": [-1]},
        {"name": "who", "datatype": "BYTES", "shape": [1]},
        {"name": "copy", "datatype": "INT64", "shape": [1]},
        {"name": "leaked", "datatype": "BOOL", "shape": [1]}])";

// A model whose `utils` package says who it is; two of these clash on every module name. Each
// call takes at least `delay_seconds`.
std::string ScalePackage(const TempDir& directory, const std::string& name, int factor,
                         double delay_seconds = 0) {
  const std::string model = R"(
import sys
import time
import orochi
from utils import NAME
import utils.helpers as helpers

class Model:
    def __init__(self, context):
        self.scale = context.weights["scale"]

    def predict(self, inputs):
        x = inputs["x"]
        if float(x.sum()) < 0:
            raise ValueError("negative input for " + NAME)
        leaked = any(m in sys.modules for m in ("model", "utils", "utils.helpers"))
        time.sleep(helpers.DELAY)
        return {"y": x * self.scale * helpers.FACTOR, "who": [NAME], "copy": [orochi.copy_id()],
                "leaked": [leaked]}
)";
  return WritePackage(
      directory, name + ".orochi",
      {{"manifest.json", ManifestJson(name, kScaleIo, kScaleOutputs)},
       {"code/model.py", model},
       {"code/utils/__init__.py", "NAME = '" + name + "'\n"},
       {"code/utils/helpers.py",
        "FACTOR = " + std::to_string(factor) + "\nDELAY = " + std::to_string(delay_seconds) + "\n"},
       {"weights/w.safetensors",
        SafetensorsBytes({{"scale", engine::Scalar(1, engine::DType::kFloat32)}}, directory)}});
}

std::shared_ptr<Package> OpenPackage(const std::string& path) {
  Result<std::unique_ptr<Package>> package = Package::Open(path);
  EXPECT_TRUE(package.ok()) << package.status().ToString();
  return package.ok() ? std::shared_ptr<Package>(std::move(package).value()) : nullptr;
}

std::unique_ptr<InterpreterManager> Manager(size_t copies) {
  interpreters::ManagerOptions options;
  options.copies = copies;
  auto manager = InterpreterManager::Create(std::move(options));
  EXPECT_TRUE(manager.ok()) << manager.status().ToString();
  return manager.ok() ? std::move(manager).value() : nullptr;
}

std::vector<NamedTensor> Input(std::vector<float> values) {
  engine::Tensor x =
      engine::Tensor::Empty({static_cast<int64_t>(values.size())}, engine::DType::kFloat32);
  std::copy(values.begin(), values.end(), x.mutable_data_as<float>());
  return {{"x", x}};
}

const engine::Tensor& Output(const std::vector<NamedTensor>& outputs, size_t i) {
  return std::get<engine::Tensor>(outputs[i].value);
}

TEST(ReplicatedModel, PackagesWithClashingModuleNamesShareACopy) {
  TempDir directory;
  auto manager = Manager(1);
  auto alpha = ReplicatedModel::Load(
      *manager, server::ModelSourceFrom(OpenPackage(ScalePackage(directory, "alpha", 2))));
  auto beta = ReplicatedModel::Load(
      *manager, server::ModelSourceFrom(OpenPackage(ScalePackage(directory, "beta", 3))));
  ASSERT_TRUE(alpha.ok()) << alpha.status().ToString() << alpha.status().detail();
  ASSERT_TRUE(beta.ok()) << beta.status().ToString() << beta.status().detail();
  for (int round = 0; round < 3; ++round) {
    auto a = (*alpha)->Predict(Input({1, 2}));
    auto b = (*beta)->Predict(Input({1, 2}));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(Output(*a, 0).data_as<float>()[1], 4.0F);
    EXPECT_EQ(Output(*b, 0).data_as<float>()[1], 6.0F);
    EXPECT_EQ(std::get<interpreters::BytesTensor>((*a)[1].value).items[0], "alpha");
    EXPECT_EQ(std::get<interpreters::BytesTensor>((*b)[1].value).items[0], "beta");
    EXPECT_EQ(Output(*a, 3).ItemAsDouble(), 0) << "package modules leaked into sys.modules";
  }
}

TEST(ReplicatedModel, EightThreadsOverFourCopiesAllGetTheirOwnAnswers) {
  TempDir directory;
  auto manager = Manager(4);
  // Calls of 2 ms from 8 threads overlap however loaded the machine is, so more than one copy
  // must serve them.
  auto model = ReplicatedModel::Load(*manager, server::ModelSourceFrom(OpenPackage(ScalePackage(
                                                   directory, "m", 2, /*delay_seconds=*/0.002))));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model)->slots().size(), 4U);
  std::atomic<int> wrong{0};
  std::mutex copies_mutex;
  std::set<int64_t> copies_used;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        float value = static_cast<float>(t * 100 + i);
        auto outputs = (*model)->Predict(Input({value}));
        if (!outputs.ok() || Output(*outputs, 0).data_as<float>()[0] != 2 * value) ++wrong;
        if (outputs.ok()) {
          std::lock_guard lock(copies_mutex);
          copies_used.insert(static_cast<int64_t>(Output(*outputs, 2).ItemAsDouble()));
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(copies_used.size(), 1U) << "calls were spread over the copies";
}

TEST(ReplicatedModel, AnExceptionInPredictComesBackWithItsTracebackAndTheCopyKeepsServing) {
  TempDir directory;
  auto manager = Manager(1);
  auto model = ReplicatedModel::Load(
      *manager, server::ModelSourceFrom(OpenPackage(ScalePackage(directory, "m", 2))));
  ASSERT_TRUE(model.ok());
  auto failed = (*model)->Predict(Input({-1}));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kPythonError);
  EXPECT_THAT(failed.status().message(), HasSubstr("ValueError: negative input for m"));
  EXPECT_THAT(failed.status().detail(),
              HasSubstr("<package m:1>/code/model.py\", line 15, in predict"));
  EXPECT_THAT(failed.status().detail(),
              HasSubstr("raise ValueError(\"negative input for \" + NAME)"));
  auto served = (*model)->Predict(Input({5}));
  ASSERT_TRUE(served.ok());
  EXPECT_EQ(Output(*served, 0).data_as<float>()[0], 10.0F);
}

TEST(ReplicatedModel, InputsAndOutputsAreCheckedAgainstTheManifest) {
  TempDir directory;
  auto manager = Manager(1);
  auto model = ReplicatedModel::Load(
      *manager, server::ModelSourceFrom(OpenPackage(ScalePackage(directory, "m", 2))));
  ASSERT_TRUE(model.ok());
  auto wrong_dtype = (*model)->Predict({{"x", engine::Ones({2}, engine::DType::kInt64)}});
  EXPECT_EQ(wrong_dtype.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_dtype.status().message(),
              HasSubstr("input 'x' is orochi.int64, but the model expects FP32"));
  auto wrong_rank = (*model)->Predict({{"x", engine::Ones({2, 2})}});
  EXPECT_THAT(wrong_rank.status().message(),
              HasSubstr("input 'x' has shape [2, 2], but the manifest declares [-1]"));
  auto unknown = (*model)->Predict({{"z", engine::Ones({2})}});
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown input 'z'"));
}

TEST(ReplicatedModel, LoadErrorsCarryTheTracebackAndLeaveNothingLoaded) {
  TempDir directory;
  auto manager = Manager(2);
  std::string path = WritePackage(directory, "bad.orochi",
                                  {{"manifest.json", ManifestJson("bad", kScaleIo, kScaleIo)},
                                   {"code/model.py", "import no_such_module\n"}});
  auto model = ReplicatedModel::Load(*manager, server::ModelSourceFrom(OpenPackage(path)));
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("loading model bad:1 in interpreter copy"));
  EXPECT_THAT(model.status().message(), HasSubstr("No module named 'no_such_module'"));
  auto lease = manager->Acquire();
  EXPECT_EQ(std::get<interpreters::ValueList>(
                *lease->Eval("__import__('orochi.serving').serving._loaded_keys()"))
                .items.size(),
            0U);
}

TEST(ReplicatedModel, UnloadFreesThePythonObjectsAndTheWeightsWithTheLastUser) {
  TempDir directory;
  auto manager = Manager(2);
  std::shared_ptr<Package> package = OpenPackage(ScalePackage(directory, "m", 2));
  auto model = ReplicatedModel::Load(*manager, server::ModelSourceFrom(package));
  ASSERT_TRUE(model.ok());
  const engine::StoragePtr& mapping = package->archive().file();
  const int64_t references_while_loaded = mapping.use_count();
  ASSERT_TRUE((*model)->Unload().ok());
  EXPECT_LT(mapping.use_count(), references_while_loaded) << "copies still hold the weights";
  EXPECT_EQ((*model)->Predict(Input({1})).status().code(), StatusCode::kUnavailable);
  for (size_t slot = 0; slot < manager->size(); ++slot) {
    auto lease = manager->AcquireSlot(slot);
    auto keys = lease->Eval("__import__('orochi.serving').serving._loaded_keys()");
    EXPECT_TRUE(std::get<interpreters::ValueList>(*keys).items.empty());
  }
  // Loading the same key again works once the old one is gone.
  EXPECT_TRUE(ReplicatedModel::Load(*manager, server::ModelSourceFrom(package)).ok());
}

TEST(ReplicatedModel, TwoHundredMegabytesOfWeightsInEightCopiesAreResidentOnce) {
  constexpr int64_t kFloats = 50'000'000;        // 200 MB of float32
  constexpr long kPerCopyAllowance = 40L << 20;  // a copy with orochi and the model imported
  TempDir directory;
  auto manager = Manager(8);
  const long before = ResidentBytes();
  {
    engine::Tensor big = engine::Full({kFloats}, 0.5);
    std::string manifest =
        ManifestJson("big", kScaleIo, R"([{"name": "y", "datatype": "FP64", "shape": [1]}])");
    std::string path =
        WritePackage(directory, "big.orochi",
                     {{"manifest.json", manifest},
                      {"code/model.py",
                       "class Model:\n"
                       "    def __init__(self, context):\n"
                       "        self.w = context.weights['w']\n"
                       "    def predict(self, inputs):\n"
                       "        return {'y': [float(self.w.double().sum())]}\n"},
                      {"weights/w.safetensors", SafetensorsBytes({{"w", big}}, directory)}});
  }
  const long after_writing = ResidentBytes();
  std::shared_ptr<Package> package = OpenPackage(directory / "big.orochi");
  auto model = ReplicatedModel::Load(*manager, server::ModelSourceFrom(package));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  std::vector<std::thread> callers;
  for (int i = 0; i < 8; ++i) {
    callers.emplace_back([&] {
      auto outputs = (*model)->Predict(Input({1}));
      ASSERT_TRUE(outputs.ok()) << outputs.status().ToString();
      EXPECT_EQ(Output(*outputs, 0).ItemAsDouble(), 0.5 * kFloats);
    });
  }
  for (std::thread& caller : callers) caller.join();
  const long growth = ResidentBytes() - std::max(before, after_writing);
  const long weights = kFloats * 4;
  std::printf(
      "RSS growth with 200 MB of weights in 8 copies: %ld MB (weights %ld MB, 8x would "
      "be %ld MB)\n",
      growth >> 20, weights >> 20, (8 * weights) >> 20);
  EXPECT_LT(growth, weights + 8 * kPerCopyAllowance);
  EXPECT_LT(growth, 3 * weights);
}

}  // namespace
}  // namespace orochi::packaging
