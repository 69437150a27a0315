// The engine's CUDA kernels on cuda:0, timed with the device synchronised around each trial:
//   matmul 4096^3 in float32 (TF32 off and on), bfloat16 and float16 (goal: >= 0.95x the
//   throughput of torch.matmul in the same run, which bench_cuda.py measures);
//   conv2d of a ResNet stage-2 layer ([32, 128, 28, 28] * [128, 128, 3, 3], padding 1);
//   add (GB/s moved), softmax and layer_norm.
// Prints one line per case; with --json, one JSON object per line (for bench_cuda.py).
//
//   bench_cuda [--json] [--seconds S] [--only NAME]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "orochi/engine/device.h"
#include "orochi/engine/ops.h"

namespace {

using orochi::engine::Device;
using orochi::engine::DeviceType;
using orochi::engine::DType;
using orochi::engine::Op;
using orochi::engine::Tensor;
using Clock = std::chrono::steady_clock;

constexpr Device kGpu{DeviceType::kCuda, 0};
constexpr int kTrials = 5;

struct Case {
  std::string name;
  double work;       // floating-point operations, or bytes moved for memory-bound cases
  const char* unit;  // "TFLOP/s" or "GB/s"
  bool tf32;
  std::function<void()> setup;  // makes the inputs (not timed)
  std::function<void()> run;    // one iteration
};

// The median over trials of the seconds per iteration, each trial long enough to time.
double SecondsPerIteration(const Case& bench, double seconds) {
  orochi::engine::SetAllowTf32(bench.tf32);
  for (int i = 0; i < 3; ++i) bench.run();  // warm up: cuBLAS handles, allocator cache, clocks
  orochi::engine::Synchronize(kGpu);
  auto timed = [&](int iterations) {
    auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) bench.run();
    orochi::engine::Synchronize(kGpu);
    return std::chrono::duration<double>(Clock::now() - start).count() / iterations;
  };
  const double estimate = timed(3);
  const int iterations =
      std::max(3, static_cast<int>(seconds / kTrials / std::max(estimate, 1e-7)));
  std::vector<double> trials(kTrials);
  for (double& trial : trials) trial = timed(iterations);
  std::sort(trials.begin(), trials.end());
  orochi::engine::SetAllowTf32(false);
  return trials[trials.size() / 2];
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  // Inputs live here, made by each case's setup; outputs are dropped every iteration, so the
  // allocator's cache is part of what is measured, as it would be in a model.
  static Tensor a;
  static Tensor b;
  static Tensor c;
  constexpr int64_t kSize = 4096;
  const double matmul_flops = 2.0 * kSize * kSize * kSize;
  struct Variant {
    const char* name;
    DType dtype;
    bool tf32;
  };
  for (const Variant& type : {Variant{"matmul_fp32_4096", DType::kFloat32, false},
                              Variant{"matmul_tf32_4096", DType::kFloat32, true},
                              Variant{"matmul_bf16_4096", DType::kBFloat16, false},
                              Variant{"matmul_fp16_4096", DType::kFloat16, false}}) {
    const DType dtype = type.dtype;
    cases.push_back({type.name, matmul_flops, "TFLOP/s", type.tf32,
                     [dtype] {
                       a = orochi::engine::Randn({kSize, kSize}, 1, dtype, kGpu);
                       b = orochi::engine::Randn({kSize, kSize}, 2, dtype, kGpu);
                     },
                     [] { orochi::engine::Matmul(a, b); }});
  }
  // ResNet-18's stage 2 at batch 32: 3x3, 128 -> 128 channels, 28x28.
  const double conv_flops = 2.0 * 32 * 128 * 28 * 28 * 128 * 3 * 3;
  for (const Variant& type : {Variant{"conv2d_fp32_resnet", DType::kFloat32, false},
                              Variant{"conv2d_tf32_resnet", DType::kFloat32, true},
                              Variant{"conv2d_bf16_resnet", DType::kBFloat16, false}}) {
    const DType dtype = type.dtype;
    cases.push_back({type.name, conv_flops, "TFLOP/s", type.tf32,
                     [dtype] {
                       a = orochi::engine::Randn({32, 128, 28, 28}, 3, dtype, kGpu);
                       b = orochi::engine::Randn({128, 128, 3, 3}, 4, dtype, kGpu);
                     },
                     [] {
                       orochi::engine::Conv2d(a, b, std::nullopt, {{1, 1}, {1, 1}, {1, 1}, 1});
                     }});
  }
  constexpr int64_t kElements = int64_t{1} << 26;
  cases.push_back({"add_fp32_64M", 3.0 * 4 * kElements, "GB/s", false,
                   [] {
                     a = orochi::engine::Randn({kElements}, 5, DType::kFloat32, kGpu);
                     b = orochi::engine::Randn({kElements}, 6, DType::kFloat32, kGpu);
                   },
                   [] { orochi::engine::Binary(Op::add, a, b); }});
  cases.push_back({"softmax_fp32_4096x4096", 2.0 * 4 * 4096 * 4096, "GB/s", false,
                   [] {
                     a = orochi::engine::Randn({4096, 4096}, 7, DType::kFloat32, kGpu);
                   },
                   [] { orochi::engine::Softmax(a, -1); }});
  cases.push_back({"layer_norm_fp32_8192x1024", 2.0 * 4 * 8192 * 1024, "GB/s", false,
                   [] {
                     a = orochi::engine::Randn({8192, 1024}, 8, DType::kFloat32, kGpu);
                     b = orochi::engine::Randn({1024}, 9, DType::kFloat32, kGpu);
                     c = orochi::engine::Randn({1024}, 10, DType::kFloat32, kGpu);
                   },
                   [] { orochi::engine::LayerNorm(a, {1024}, b, c); }});
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  double seconds = 2.0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: bench_cuda [--json] [--seconds S] [--only NAME]\n");
      return 2;
    }
  }
  if (orochi::engine::DeviceCount(DeviceType::kCuda) == 0) {
    std::fprintf(stderr, "bench_cuda: no CUDA GPU: %s\n",
                 orochi::engine::DeviceTypeStatus(DeviceType::kCuda).message().c_str());
    return 3;
  }
  try {
    for (const Case& bench : Cases()) {
      if (!only.empty() && bench.name.find(only) == std::string::npos) continue;
      bench.setup();
      const double per_iteration = SecondsPerIteration(bench, seconds);
      const double rate = bench.work / per_iteration / (bench.unit[0] == 'T' ? 1e12 : 1e9);
      if (json) {
        std::printf("{\"name\": \"%s\", \"ms\": %.6f, \"rate\": %.3f, \"unit\": \"%s\"}\n",
                    bench.name.c_str(), per_iteration * 1e3, rate, bench.unit);
      } else {
        std::printf("%-28s %10.3f ms %10.2f %s\n", bench.name.c_str(), per_iteration * 1e3, rate,
                    bench.unit);
      }
      std::fflush(stdout);
    }
    const orochi::engine::DeviceMemoryStats stats = orochi::engine::MemoryStats(kGpu);
    std::fprintf(stderr,
                 "cuda:0 allocator: peak %.1f MiB, %llu blocks handed out, %llu from cache\n",
                 static_cast<double>(stats.peak_allocated_bytes) / (1 << 20),
                 static_cast<unsigned long long>(stats.allocations),
                 static_cast<unsigned long long>(stats.cache_hits));
  } catch (const orochi::engine::Error& error) {
    std::fprintf(stderr, "bench_cuda: %s\n", error.what());
    return 1;
  }
  return 0;
}
