// Engine benchmarks (Google Benchmark). After the usual table, every figure is printed as a ratio
// to a baseline measured in the same run:
//   matmul        vs a direct cblas_sgemm on the same buffers (goal >= 0.95)
//   linear        oneDNN's matmul against OpenBLAS's sgemm at the example networks' shapes
//   linear few rows  the engine's linear on a loaded [out, in] weight, and its matmul with that
//                 weight's transposed view, vs its matmul with a contiguous [in, out] copy of
//                 the weight, at textgen's decode shapes (goal >= 0.95: both layouts at GEMM speed)
//   conv2d        vs oneDNN called directly on the same buffers, its weights prepared once
//                 (goal >= 0.95), and vs the im2col + sgemm lower bound
//   add           vs memcpy, in bytes moved per second (goal >= 0.7)
//   softmax, layer_norm in GB/s of input read plus output written, and vs memcpy (goal >= 0.5),
//                 with the vectorised kernels and with the scalar ones (OROCHI_CPU_ISA=scalar)
// The engine runs single-threaded, as its baselines do; OROCHI_INTRA_OP_THREADS=N gives it an
// intra-op pool of N threads instead (0: every core).
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <vector>

#include "orochi/engine/cpu_math.h"
#include "orochi/engine/ops.h"
#include "orochi/engine/threads.h"

namespace {

using orochi::engine::DType;
using orochi::engine::Op;
using orochi::engine::Tensor;

// cblas_sgemm of the OpenBLAS instance the engine loaded (same kernels, same threads).
decltype(&cblas_sgemm) EngineSgemm() {
  static decltype(&cblas_sgemm) sgemm = [] {
    orochi::engine::BlasCoreName();  // makes the engine load OpenBLAS
    void* library = dlopen(OROCHI_OPENBLAS_SONAME, RTLD_NOW | RTLD_NOLOAD);
    return library == nullptr
               ? nullptr
               : reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(library, "cblas_sgemm"));
  }();
  return sgemm;
}

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
    EngineSgemm()(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0F, a.data_as<float>(), n,
                  b.data_as<float>(), n, 0.0F, c.mutable_data_as<float>(), n);
    benchmark::ClobberMemory();
  }
  SetFlopRate(state, n);
}

// Linear layers of the example networks, x [m, k] times weight.T ([n, k] stored): OpenBLAS's
// sgemm against oneDNN's matmul with its weight layout prepared once, to choose per shape.
// Args: m, k, n.
void BM_LinearSgemm(benchmark::State& state) {
  const int m = static_cast<int>(state.range(0));
  const int k = static_cast<int>(state.range(1));
  const int n = static_cast<int>(state.range(2));
  Tensor x = Filled({m, k});
  Tensor weight = Filled({n, k});
  Tensor y = Filled({m, n});
  for (auto _ : state) {
    EngineSgemm()(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0F, x.data_as<float>(), k,
                  weight.data_as<float>(), k, 0.0F, y.mutable_data_as<float>(), n);
    benchmark::ClobberMemory();
  }
}

void BM_LinearOnednn(benchmark::State& state) {
  using dnnl::memory;
  const int64_t m = state.range(0);
  const int64_t k = state.range(1);
  const int64_t n = state.range(2);
  omp_set_num_threads(orochi::engine::IntraOpThreads());
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const auto f32 = memory::data_type::f32;
  const memory::desc x_desc({m, k}, f32, memory::format_tag::ab);
  const memory::desc weight_plain({k, n}, f32, memory::format_tag::ba);  // [n, k] row-major
  const memory::desc y_desc({m, n}, f32, memory::format_tag::ab);
  const dnnl::matmul::primitive_desc descriptor(
      {x_desc, memory::desc({k, n}, f32, memory::format_tag::any), y_desc}, engine);
  const dnnl::matmul matmul(descriptor);
  std::vector<float> x(static_cast<size_t>(m * k), 0.5F);
  std::vector<float> weight(static_cast<size_t>(n * k), 0.5F);
  std::vector<float> y(static_cast<size_t>(m * n));
  memory x_memory(x_desc, engine, x.data());
  memory y_memory(y_desc, engine, y.data());
  memory plain(weight_plain, engine, weight.data());
  memory prepared(descriptor.weights_desc(), engine);
  dnnl::reorder(plain, prepared).execute(stream, plain, prepared);
  stream.wait();
  for (auto _ : state) {
    matmul.execute(
        stream, {{DNNL_ARG_SRC, x_memory}, {DNNL_ARG_WEIGHTS, prepared}, {DNNL_ARG_DST, y_memory}});
    stream.wait();
    benchmark::ClobberMemory();
  }
}

// resnet's classifier at batch 1 and 8; encoder's projections and feed-forward layers at 1 and 8
// sequences of 128 tokens.
void LinearShapes(benchmark::internal::Benchmark* benchmark) {
  for (int64_t m : {1, 8}) benchmark->Args({m, 256, 1000});
  for (int64_t m : {128, 1024}) {
    benchmark->Args({m, 256, 256});
    benchmark->Args({m, 256, 1024});
    benchmark->Args({m, 1024, 256});
  }
}

// textgen's decode step: a few rows through its [out, in] layers and its tied output projection.
// The weight is loaded (read-only) as a model's is. Args: m, k, n; which: 0 linear(x, w),
// 1 x @ w.T (a transposed view), 2 x @ w_t with w_t a contiguous [in, out] copy (the baseline).
void BM_EngineFewRows(benchmark::State& state) {
  const int64_t m = state.range(0);
  const int64_t k = state.range(1);
  const int64_t n = state.range(2);
  Tensor x = Filled({m, k});
  Tensor weight = Filled({n, k});
  weight.storage()->MarkReadOnly();
  Tensor transposed = weight.Transpose(0, 1);
  Tensor copied = transposed.Contiguous();
  for (auto _ : state) {
    switch (state.range(3)) {
      case 0:
        benchmark::DoNotOptimize(orochi::engine::Linear(x, weight, std::nullopt));
        break;
      case 1:
        benchmark::DoNotOptimize(orochi::engine::Matmul(x, transposed));
        break;
      default:
        benchmark::DoNotOptimize(orochi::engine::Matmul(x, copied));
    }
  }
}

constexpr std::array<std::array<int64_t, 3>, 8> kFewRowShapes{{{8, 64, 192},
                                                               {8, 64, 256},
                                                               {8, 256, 64},
                                                               {8, 64, 257},
                                                               {16, 64, 192},
                                                               {16, 64, 256},
                                                               {16, 256, 64},
                                                               {16, 64, 257}}};

void FewRowShapes(benchmark::internal::Benchmark* benchmark) {
  for (const auto& [m, k, n] : kFewRowShapes) {
    for (int64_t which : {0, 1, 2}) benchmark->Args({m, k, n, which});
  }
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

// Runs a benchmark with the CPU kernels of one instruction set (the benchmark's argument is a
// CpuVectorIsa: 0 scalar, 1 AVX2, 2 AVX-512), and restores the one in use afterwards.
class IsaForBenchmark {
 public:
  explicit IsaForBenchmark(benchmark::State& state)
      : previous_(orochi::engine::CpuVectorIsaInUse()),
        isa_(static_cast<orochi::engine::CpuVectorIsa>(state.range(0))) {
    if (isa_ > orochi::engine::CpuVectorIsaSupported()) {
      state.SkipWithError("this CPU does not have the instruction set");
      return;
    }
    orochi::engine::SetCpuVectorIsa(isa_);
  }
  ~IsaForBenchmark() { orochi::engine::SetCpuVectorIsa(previous_); }
  IsaForBenchmark(const IsaForBenchmark&) = delete;
  IsaForBenchmark& operator=(const IsaForBenchmark&) = delete;

 private:
  orochi::engine::CpuVectorIsa previous_;
  orochi::engine::CpuVectorIsa isa_;
};

void BM_EngineSoftmax(benchmark::State& state) {
  IsaForBenchmark isa(state);
  Tensor x = Filled({kElements / 1024, 1024});
  for (auto _ : state) benchmark::DoNotOptimize(orochi::engine::Softmax(x, -1));
  state.SetBytesProcessed(state.iterations() * kElements * 4 * 2);
}

void BM_EngineLayerNorm(benchmark::State& state) {
  IsaForBenchmark isa(state);
  Tensor x = Filled({kElements / 1024, 1024});
  Tensor weight = Filled({1024});
  Tensor bias = Filled({1024});
  for (auto _ : state) {
    benchmark::DoNotOptimize(orochi::engine::LayerNorm(x, {1024}, weight, bias));
  }
  state.SetBytesProcessed(state.iterations() * kElements * 4 * 2);
}

// A ResNet-style layer: 64 -> 64 channels, 3x3, padding 1, on 56x56.
constexpr int kConvBatch = 1, kConvChannels = 64, kConvSize = 56, kConvKernel = 3;

// The weight is read-only, as loaded weights are, so the engine prepares its layout once.
void BM_EngineConv2d(benchmark::State& state) {
  const int64_t batch = state.range(0);
  Tensor input = Filled({batch, kConvChannels, kConvSize, kConvSize});
  Tensor weight = Filled({kConvChannels, kConvChannels, kConvKernel, kConvKernel});
  weight.storage()->MarkReadOnly();
  orochi::engine::Conv2dOptions options;
  options.padding = {1, 1};
  for (auto _ : state) {
    benchmark::DoNotOptimize(orochi::engine::Conv2d(input, weight, std::nullopt, options));
  }
}

// oneDNN as an application would call it on NCHW buffers: the primitive made and the weights
// reordered into its layout once, outside the loop; per call only what the call needs. With
// `blocked`, oneDNN picks the activations' layout and the input and output are reordered around
// each call; without, it works on NCHW as it is. The better of the two is the baseline.
void DirectOnednnConv2d(benchmark::State& state, bool blocked) {
  using dnnl::memory;
  const int64_t batch = state.range(0);
  const int64_t c = kConvChannels, size = kConvSize, k = kConvKernel;
  omp_set_num_threads(orochi::engine::IntraOpThreads());  // the engine's thread count
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const auto f32 = memory::data_type::f32;
  const memory::desc src_plain({batch, c, size, size}, f32, memory::format_tag::nchw);
  const memory::desc weights_plain({c, c, k, k}, f32, memory::format_tag::oihw);
  const memory::desc dst_plain({batch, c, size, size}, f32, memory::format_tag::nchw);
  const auto layout = [&](const memory::desc& plain, bool choose) {
    return choose ? memory::desc(plain.dims(), f32, memory::format_tag::any) : plain;
  };
  const dnnl::convolution_forward::primitive_desc descriptor({dnnl::prop_kind::forward_inference,
                                                              dnnl::algorithm::convolution_direct,
                                                              layout(src_plain, blocked),
                                                              layout(weights_plain, true),
                                                              memory::desc(),
                                                              layout(dst_plain, blocked),
                                                              {1, 1},
                                                              {0, 0},
                                                              {1, 1},
                                                              {1, 1}},
                                                             engine);
  const dnnl::convolution_forward conv(descriptor);
  std::vector<float> input(static_cast<size_t>(batch * c * size * size), 0.5F);
  std::vector<float> weight(static_cast<size_t>(c * c * k * k), 0.5F);
  std::vector<float> output(input.size());
  memory src(src_plain, engine, input.data());
  memory dst(dst_plain, engine, output.data());
  memory weights(descriptor.weights_desc(), engine);
  memory plain_weights(weights_plain, engine, weight.data());
  dnnl::reorder(plain_weights, weights).execute(stream, plain_weights, weights);
  std::optional<memory> src_blocked;
  std::optional<memory> dst_blocked;
  if (descriptor.src_desc() != src_plain) src_blocked.emplace(descriptor.src_desc(), engine);
  if (descriptor.dst_desc() != dst_plain) dst_blocked.emplace(descriptor.dst_desc(), engine);
  std::optional<dnnl::reorder> src_in;
  std::optional<dnnl::reorder> dst_out;
  if (src_blocked) src_in.emplace(src, *src_blocked);
  if (dst_blocked) dst_out.emplace(*dst_blocked, dst);
  stream.wait();
  for (auto _ : state) {
    if (src_in) src_in->execute(stream, src, *src_blocked);
    conv.execute(stream, {{DNNL_ARG_SRC, src_blocked ? *src_blocked : src},
                          {DNNL_ARG_WEIGHTS, weights},
                          {DNNL_ARG_DST, dst_blocked ? *dst_blocked : dst}});
    if (dst_out) dst_out->execute(stream, *dst_blocked, dst);
    stream.wait();
    benchmark::ClobberMemory();
  }
}

void BM_DirectOnednnConv2dBlocked(benchmark::State& state) { DirectOnednnConv2d(state, true); }
void BM_DirectOnednnConv2dNchw(benchmark::State& state) { DirectOnednnConv2d(state, false); }

// The lower bound of im2col + GEMM: the same unfolding and one sgemm, on buffers allocated once.
void BM_Im2colSgemmLowerBound(benchmark::State& state) {
  const int c = kConvChannels, size = kConvSize, k = kConvKernel;
  const int columns = size * size;
  const int depth = c * k * k;
  std::vector<float> input(static_cast<size_t>(c) * size * size, 0.5F);
  std::vector<float> weight(static_cast<size_t>(c) * depth, 0.5F);
  std::vector<float> unfolded(static_cast<size_t>(depth) * columns);
  std::vector<float> output(static_cast<size_t>(c) * columns);
  for (auto _ : state) {
    float* out = unfolded.data();
    for (int channel = 0; channel < c; ++channel) {
      for (int ky = 0; ky < k; ++ky) {
        for (int kx = 0; kx < k; ++kx) {
          for (int y = 0; y < size; ++y) {
            for (int x = 0; x < size; ++x) {
              int iy = y - 1 + ky;
              int ix = x - 1 + kx;
              *out++ = iy >= 0 && iy < size && ix >= 0 && ix < size
                           ? input[(static_cast<size_t>(channel) * size + iy) * size + ix]
                           : 0.0F;
            }
          }
        }
      }
    }
    EngineSgemm()(CblasRowMajor, CblasNoTrans, CblasNoTrans, c, columns, depth, 1.0F, weight.data(),
                  depth, unfolded.data(), columns, 0.0F, output.data(), columns);
    benchmark::ClobberMemory();
  }
}

BENCHMARK(BM_Im2colSgemmLowerBound)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EngineConv2d)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DirectOnednnConv2dBlocked)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DirectOnednnConv2dNchw)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EngineMatmul)->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DirectSgemm)->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LinearSgemm)->Apply(LinearShapes)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LinearOnednn)->Apply(LinearShapes)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EngineFewRows)->Apply(FewRowShapes)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EngineAdd)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EngineSoftmax)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EngineLayerNorm)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

// Keeps every run's time per iteration and bytes per second, by benchmark name.
class CapturingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      seconds_[run.benchmark_name()] =
          run.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(run.time_unit);
      cpu_seconds_[run.benchmark_name()] =
          run.GetAdjustedCPUTime() / benchmark::GetTimeUnitMultiplier(run.time_unit);
      auto bytes = run.counters.find("bytes_per_second");
      if (bytes != run.counters.end()) bytes_per_second_[run.benchmark_name()] = bytes->second;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  // 0 when `name` did not run (e.g. left out by --benchmark_filter).
  double Seconds(const std::string& name) const { return Find(seconds_, name); }
  // CPU time: for single-threaded calls of a few microseconds, which a busy machine's wall clock
  // drowns.
  double CpuSeconds(const std::string& name) const { return Find(cpu_seconds_, name); }
  double BytesPerSecond(const std::string& name) const { return Find(bytes_per_second_, name); }

 private:
  static double Find(const std::map<std::string, double>& values, const std::string& name) {
    auto found = values.find(name);
    return found == values.end() ? 0 : found->second;
  }

  std::map<std::string, double> seconds_;
  std::map<std::string, double> cpu_seconds_;
  std::map<std::string, double> bytes_per_second_;
};

void PrintRatio(const char* label, double value, double baseline, const char* goal) {
  if (value > 0 && baseline > 0) std::printf("  %-40s %.3f  %s\n", label, value / baseline, goal);
}

}  // namespace

int main(int argc, char** argv) {
  // One thread unless OROCHI_INTRA_OP_THREADS says otherwise: the baselines (a direct sgemm, a
  // single thread's memcpy) are single-threaded, and the ratios compare like with like.
  const char* threads = std::getenv("OROCHI_INTRA_OP_THREADS");
  orochi::engine::SetIntraOpThreads(threads != nullptr ? std::atoi(threads) : 1);
  benchmark::Initialize(&argc, argv);
  std::printf("OpenBLAS core: %s (%s), intra-op threads: %d\n",
              std::string(orochi::engine::BlasCoreName()).c_str(),
              std::string(orochi::engine::BlasCoreChoice()).c_str(),
              orochi::engine::IntraOpThreads());
  if (EngineSgemm() == nullptr) {
    std::fprintf(stderr, "bench_engine: cannot find the engine's OpenBLAS\n");
    return 1;
  }
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
  PrintRatio("conv2d 64x56x56 3x3 vs im2col+sgemm:", reporter.Seconds("BM_Im2colSgemmLowerBound"),
             reporter.Seconds("BM_EngineConv2d/1"), "(1.0 = the lower bound)");
  for (const char* batch : {"1", "8"}) {
    const std::string engine = std::string("BM_EngineConv2d/") + batch;
    double blocked = reporter.Seconds(std::string("BM_DirectOnednnConv2dBlocked/") + batch);
    double nchw = reporter.Seconds(std::string("BM_DirectOnednnConv2dNchw/") + batch);
    double direct = blocked > 0 && nchw > 0 ? std::min(blocked, nchw) : std::max(blocked, nchw);
    std::string label = std::string("conv2d batch ") + batch + " vs direct oneDNN:";
    PrintRatio(label.c_str(), direct, reporter.Seconds(engine), "(goal >= 0.95)");
  }
  for (const char* shape : {"1/256/1000", "8/256/1000", "128/256/256", "128/256/1024",
                            "128/1024/256", "1024/256/256", "1024/256/1024", "1024/1024/256"}) {
    std::string label = std::string("linear ") + shape + " oneDNN vs OpenBLAS:";
    PrintRatio(label.c_str(), reporter.Seconds(std::string("BM_LinearSgemm/") + shape),
               reporter.Seconds(std::string("BM_LinearOnednn/") + shape), "(> 1: oneDNN faster)");
  }
  for (const auto& [m, k, n] : kFewRowShapes) {
    const std::string shape = std::to_string(m) + "/" + std::to_string(k) + "/" + std::to_string(n);
    const std::string name = "BM_EngineFewRows/" + shape + "/";
    const double baseline = reporter.CpuSeconds(name + "2");
    PrintRatio(("linear(x, w) " + shape + " vs x @ w_t (CPU):").c_str(), baseline,
               reporter.CpuSeconds(name + "0"), "(goal >= 0.95)");
    PrintRatio(("x @ w.T " + shape + " vs x @ w_t (CPU):").c_str(), baseline,
               reporter.CpuSeconds(name + "1"), "(goal >= 0.95)");
  }
  double memcpy_rate = reporter.BytesPerSecond("BM_Memcpy");
  PrintRatio("add vs memcpy (bytes moved/s):", reporter.BytesPerSecond("BM_EngineAdd"), memcpy_rate,
             "(goal >= 0.7)");
  for (const char* name : {"Softmax", "LayerNorm"}) {
    for (auto isa : {orochi::engine::CpuVectorIsa::kAvx512, orochi::engine::CpuVectorIsa::kAvx2,
                     orochi::engine::CpuVectorIsa::kScalar}) {
      const std::string which(orochi::engine::CpuVectorIsaName(isa));
      const double rate = reporter.BytesPerSecond("BM_Engine" + std::string(name) + "/" +
                                                  std::to_string(static_cast<int>(isa)));
      if (rate > 0) std::printf("  %-40s %.2f GB/s\n", (name + (" " + which)).c_str(), rate / 1e9);
      const std::string label = std::string(name) + " " + which + " vs memcpy (bytes/s):";
      PrintRatio(label.c_str(), rate, memcpy_rate,
                 isa == orochi::engine::CpuVectorIsaSupported() ? "(goal >= 0.5)" : "");
    }
  }
  benchmark::Shutdown();
  return 0;
}
