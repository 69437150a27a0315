// Many threads run mixed ops on shared read-only tensors (memory-mapped weights), checking every
// result against one computed up front. Built and run under ThreadSanitizer by scripts/test.sh
// (OROCHI_SANITIZER=thread); OROCHI_CONCURRENCY_SECONDS sets how long (default 2).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "engine_test_support.h"
#include "orochi/engine/safetensors.h"

namespace orochi::engine {
namespace {

// One round of the mixed workload: linear, broadcasting arithmetic, a reduction, softmax,
// views, a dtype cast and a convolution (oneDNN, its weight layout prepared once for all
// threads), all reading `weights`, `filters` and `input`.
Tensor Workload(const Tensor& weights, const Tensor& bias, const Tensor& filters,
                const Tensor& input) {
  Tensor hidden = Linear(input, weights, bias);  // oneDNN's matmul, its weight prepared once
  Tensor activated = Unary(Op::gelu, hidden);
  Tensor normalized = Softmax(activated.Slice(1, 0, 16, 2), -1);
  Tensor half = normalized.To(DType::kFloat16).To(DType::kFloat32);
  Conv2dOptions same;
  same.padding = {1, 1};
  Tensor convolved = Conv2d(input.View({2, 2, 6, 8}), filters, bias.Slice(0, 0, 4, 1), same);
  return Binary(Op::add, Reduce(Op::sum, Binary(Op::mul, half, half), {1}, /*keepdim=*/true),
                Reduce(Op::sum, convolved.View({8, 48}), {1}, /*keepdim=*/true));
}

TEST(Concurrency, ThreadsShareReadOnlyTensorsWithoutRaces) {
  const char* seconds_text = std::getenv("OROCHI_CONCURRENCY_SECONDS");
  const double seconds = seconds_text != nullptr ? std::atof(seconds_text) : 2.0;
  constexpr int kThreads = 8;

  std::string path = (std::filesystem::temp_directory_path() /
                      ("orochi-concurrency-" + std::to_string(getpid()) + ".safetensors"))
                         .string();
  ASSERT_TRUE(
      SaveSafetensors(path, {{"weight", RandomTensor({32, 24}, DType::kFloat32, -1, 1, 1)},
                             {"bias", RandomTensor({32}, DType::kFloat32, -1, 1, 2)},
                             {"filters", RandomTensor({4, 2, 3, 3}, DType::kFloat32, -1, 1, 4)}})
          .ok());
  Result<SafetensorsContents> loaded = LoadSafetensors(path);
  std::filesystem::remove(path);  // the mapping keeps the data alive
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Tensor weights = loaded->tensors.at("weight");
  const Tensor bias = loaded->tensors.at("bias");
  const Tensor filters = loaded->tensors.at("filters");
  ASSERT_TRUE(weights.read_only());
  const Tensor input = RandomTensor({8, 24}, DType::kFloat32, -1, 1, 3);
  const Tensor expected = Workload(weights, bias, filters, input);

  std::atomic<int64_t> rounds{0};
  std::atomic<int64_t> mismatches{0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        while (std::chrono::steady_clock::now() < deadline) {
          Tensor result = Workload(weights, bias, filters, input);
          for (int64_t i = 0; i < result.numel(); ++i) {
            if (result.ItemAsDouble(i) != expected.ItemAsDouble(i)) ++mismatches;
          }
          ++rounds;
        }
      });
    }
  }
  std::printf("%d threads, %.1f s: %lld rounds\n", kThreads, seconds,
              static_cast<long long>(rounds.load()));
  EXPECT_GT(rounds.load(), kThreads);
  EXPECT_EQ(mismatches.load(), 0);
  // weights, bias, filters and the three tensors in `loaded` share the one mapping (the prepared
  // filter layout lives with it and does not hold it)
  EXPECT_EQ(weights.storage().use_count(), 6);
}

}  // namespace
}  // namespace orochi::engine
