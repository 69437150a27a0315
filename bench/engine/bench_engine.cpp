// Engine benchmarks (Google Benchmark). After the usual table, every figure is printed as a ratio
// to a baseline measured in the same run:
//   matmul        vs a direct cblas_sgemm on the same buffers (goal >= 0.95)
//   add           vs memcpy, in bytes moved per second (goal >= 0.7)
//   softmax, layer_norm in GB/s of input read plus output written, and vs memcpy
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "orochi/engine/ops.h"

namespace {

using orochi::engine::DType;
using orochi::engine::Op;
using orochi::engine::Tensor;

Tensor Filled(const orochi::engine::Shape& shape) {
  return orochi::engine::Full(shape, 0.5, DType::kFloat32);
}

// Reports GFLOP/s of an n x n x n matrix product per iteration.
void SetFlopRate(benchmark::State& state, int64_t n) {
  const auto size = static_cast<double>(n);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * size * size * size, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void BM_EngineMatmul(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor a = Filled({n, n});
  Tensor b = Filled({n, n});
  for (auto _ : state) benchmark::DoNotOptimize(orochi::engine::Matmul(a, b));
  SetFlopRate(state, n);
}

void BM_DirectSgemm(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  Tensor a = Filled({n, n});
  Tensor b = Filled({n, n});
  Tensor c = Filled({n, n});
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0F, a.data_as<float>(), n,
                b.data_as<float>(), n, 0.0F, c.mutable_data_as<float>(), n);
    benchmark::ClobberMemory();
  }
  SetFlopRate(state, n);
}

constexpr int64_t kElements = int64_t{1} << 25;  // 128 MiB of float32: beyond the caches

void BM_EngineAdd(benchmark::State& state) {
  Tensor a = Filled({kElements});
  Tensor b = Filled({kElements});
  for (auto _ : state) benchmark::DoNotOptimize(orochi::engine::Binary(Op::add, a, b));
  state.SetBytesProcessed(state.iterations() * kElements * 4 * 3);  // read a, b; write out
}

void BM_Memcpy(benchmark::State& state) {
  std::vector<float> source(kElements, 0.5F);
  std::vector<float> destination(kElements);
  for (auto _ : state) {
    std::memcpy(destination.data(), source.data(), kElements * 4);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kElements * 4 * 2);  // read, write
}

void BM_EngineSoftmax(benchmark::State& state) {
  Tensor x = Filled({kElements / 1024, 1024});
  for (auto _ : state) benchmark::DoNotOptimize(orochi::engine::Softmax(x, -1));
  state.SetBytesProcessed(state.iterations() * kElements * 4 * 2);
}

void BM_EngineLayerNorm(benchmark::State& state) {
  Tensor x = Filled({kElements / 1024, 1024});
  Tensor weight = Filled({1024});
  Tensor bias = Filled({1024});
  for (auto _ : state) {
    benchmark::DoNotOptimize(orochi::engine::LayerNorm(x, {1024}, weight, bias));
  }
  state.SetBytesProcessed(state.iterations() * kElements * 4 * 2);
}

BENCHMARK(BM_EngineMatmul)->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DirectSgemm)->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EngineAdd)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EngineSoftmax)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EngineLayerNorm)->Unit(benchmark::kMillisecond);

// Keeps every run's time per iteration and bytes per second, by benchmark name.
class CapturingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      seconds_[run.benchmark_name()] =
          run.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(run.time_unit);
      auto bytes = run.counters.find("bytes_per_second");
      if (bytes != run.counters.end()) bytes_per_second_[run.benchmark_name()] = bytes->second;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  // 0 when `name` did not run (e.g. left out by --benchmark_filter).
  double Seconds(const std::string& name) const { return Find(seconds_, name); }
  double BytesPerSecond(const std::string& name) const { return Find(bytes_per_second_, name); }

 private:
  static double Find(const std::map<std::string, double>& values, const std::string& name) {
    auto found = values.find(name);
    return found == values.end() ? 0 : found->second;
  }

  std::map<std::string, double> seconds_;
  std::map<std::string, double> bytes_per_second_;
};

void PrintRatio(const char* label, double value, double baseline, const char* goal) {
  if (value > 0 && baseline > 0) std::printf("  %-36s %.3f  %s\n", label, value / baseline, goal);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::printf("OpenBLAS core: %s, intra-op threads: %d\n",
              std::string(orochi::engine::BlasCoreName()).c_str(),
              orochi::engine::IntraOpThreads());
  CapturingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("\nRatios against baselines measured in this run:\n");
  for (int n : {256, 512, 1024, 2048}) {
    std::string size = std::to_string(n);
    std::string label = "matmul " + size + "^3 vs direct cblas_sgemm:";
    // Throughput ratio: the direct call's time over the engine's.
    PrintRatio(label.c_str(), reporter.Seconds("BM_DirectSgemm/" + size),
               reporter.Seconds("BM_EngineMatmul/" + size), "(goal >= 0.95)");
  }
  double memcpy_rate = reporter.BytesPerSecond("BM_Memcpy");
  PrintRatio("add vs memcpy (bytes moved/s):", reporter.BytesPerSecond("BM_EngineAdd"), memcpy_rate,
             "(goal >= 0.7)");
  for (const char* name : {"BM_EngineSoftmax", "BM_EngineLayerNorm"}) {
    double rate = reporter.BytesPerSecond(name);
    if (rate > 0) std::printf("  %-36s %.2f GB/s\n", name + 9, rate / 1e9);
    std::string label = std::string(name + 9) + " vs memcpy (bytes/s):";
    PrintRatio(label.c_str(), rate, memcpy_rate, "");
  }
  benchmark::Shutdown();
  return 0;
}
