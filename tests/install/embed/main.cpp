// Loads a model package into several interpreter copies and predicts from several threads at
// once, as a program embedding Orochi (torch::deploy's use) would.
//   embed PACKAGE COPIES
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "orochi/engine/tensor.h"
#include "orochi/interpreters/interpreter_manager.h"
#include "orochi/interpreters/model.h"
#include "orochi/packaging/model_key.h"
#include "orochi/packaging/package.h"

namespace {

int Fail(const orochi::Status& status) {
  std::fprintf(stderr, "embed: %s\n%s", status.message().c_str(), status.detail().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: embed PACKAGE COPIES\n");
    return 2;
  }
  using orochi::interpreters::InterpreterManager;
  using orochi::interpreters::ModelSource;
  using orochi::interpreters::NamedTensor;
  using orochi::interpreters::ReplicatedModel;
  const size_t copies = std::strtoul(argv[2], nullptr, 10);

  orochi::Result<std::unique_ptr<orochi::packaging::Package>> opened =
      orochi::packaging::Package::Open(argv[1]);
  if (!opened.ok()) return Fail(opened.status());
  std::shared_ptr<const orochi::packaging::Package> package = std::move(opened).value();
  orochi::interpreters::ManagerOptions options;
  options.copies = copies;
  auto manager = InterpreterManager::Create(std::move(options));
  if (!manager.ok()) return Fail(manager.status());

  ModelSource source;
  source.key =
      orochi::packaging::ModelKey{package->manifest().name, package->manifest().version}.ToString();
  source.manifest_json = package->manifest().json;
  source.code = package->code();
  source.weights = package->weights();
  source.read_resource = [package](std::string_view path) { return package->ReadResource(path); };
  auto model = ReplicatedModel::Load(**manager, std::move(source));
  if (!model.ok()) return Fail(model.status());

  constexpr int kThreads = 8;
  constexpr int kCalls = 50;
  std::atomic<int> wrong{0};
  std::mutex seen_mutex;
  std::set<int64_t> copies_seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int call = 0; call < kCalls; ++call) {
        orochi::engine::Tensor x =
            orochi::engine::Tensor::Empty({4}, orochi::engine::DType::kFloat32);
        auto* values = x.mutable_data_as<float>();
        for (int i = 0; i < 4; ++i) values[i] = static_cast<float>(t * 1000 + call * 4 + i);
        auto outputs = (*model)->Predict({NamedTensor{"x", x}});
        if (!outputs.ok() || outputs->size() != 2) {
          wrong++;
          continue;
        }
        const auto& y = std::get<orochi::engine::Tensor>((*outputs)[0].value);
        const auto& copy = std::get<orochi::engine::Tensor>((*outputs)[1].value);
        for (int i = 0; i < 4; ++i) {
          if (y.data_as<float>()[i] != 2 * values[i]) wrong++;
        }
        std::lock_guard lock(seen_mutex);
        copies_seen.insert(copy.data_as<int64_t>()[0]);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::printf("%d predictions from %d threads in %zu copies, %d wrong\n", kThreads * kCalls,
              kThreads, copies_seen.size(), wrong.load());
  return wrong.load() == 0 && copies_seen.size() == copies ? 0 : 1;
}
