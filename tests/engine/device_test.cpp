// Devices: what holds on every machine (the CPU, CUDA reported unavailable with its reason), and,
// where a CUDA GPU is usable, moving tensors, device rules, the allocator and threads.
#include "orochi/engine/device.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "dispatch.h"
#include "engine_test_support.h"
#include "orochi/engine/safetensors.h"

namespace orochi::engine {
namespace {

constexpr Device kCpu{};
constexpr Device kCuda0{DeviceType::kCuda, 0};

// The message of the Error `body` throws ("" if none).
template <typename Body>
std::string ErrorOf(Body body) {
  try {
    body();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

#define SKIP_WITHOUT_GPU()                                                            \
  if (DeviceCount(DeviceType::kCuda) == 0) {                                          \
    GTEST_SKIP() << "no CUDA GPU: " << DeviceTypeStatus(DeviceType::kCuda).message(); \
  }

// --- everywhere ----------------------------------------------------------------------------------

TEST(Devices, TheCpuIsAlwaysThere) {
  EXPECT_EQ(DeviceCount(DeviceType::kCpu), 1);
  EXPECT_TRUE(DeviceTypeStatus(DeviceType::kCpu).ok());
  EXPECT_TRUE(DeviceStatus(kCpu).ok());
  EXPECT_EQ(DeviceStatus({DeviceType::kCpu, 1}).code(), StatusCode::kFailedPrecondition);
  EXPECT_NO_THROW(Synchronize(kCpu));
  EXPECT_EQ(DeviceUtilisation(kCpu), std::nullopt);
  Tensor tensor = Ones({4});
  EXPECT_EQ(tensor.To(kCpu).storage().get(), tensor.storage().get());
  EXPECT_NO_THROW(tensor.RequireCpu("reading"));
  EXPECT_NO_THROW(MemoryStats(kCpu));
}

TEST(Devices, CudaIsAvailableOrSaysWhyNot) {
  const int count = DeviceCount(DeviceType::kCuda);
  const Status status = DeviceTypeStatus(DeviceType::kCuda);
  const std::string& reason = status.message();
  EXPECT_EQ(status.ok(), count > 0) << reason;
  if (count == 0) {
    EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(reason, "");
    EXPECT_EQ(DeviceStatus(kCuda0).message(), reason);
  }
  // Past the last device: with none at all the type's reason, else how many there are.
  const Status beyond = DeviceStatus({DeviceType::kCuda, count});
  EXPECT_EQ(beyond.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(beyond.message(),
            count == 0 ? reason : "this machine has " + std::to_string(count) + " CUDA device(s)");
#if OROCHI_TEST_CUDA_BUILT
  // The library was built: whatever is missing is on this machine, not in the build.
  EXPECT_EQ(access(OROCHI_TEST_CUDA_LIBRARY, F_OK), 0) << OROCHI_TEST_CUDA_LIBRARY;
  EXPECT_EQ(reason.find("built without CUDA"), std::string::npos) << reason;
#else
  EXPECT_EQ(count, 0);
  EXPECT_THAT(reason, testing::HasSubstr("Orochi was built without CUDA"));
#endif
  std::printf("CUDA devices: %d%s%s\n", count, reason.empty() ? "" : "; ", reason.c_str());
}

TEST(Devices, AnUnavailableDeviceIsAClearError) {
  if (DeviceCount(DeviceType::kCuda) > 0) {
    const Device beyond{DeviceType::kCuda, DeviceCount(DeviceType::kCuda)};
    EXPECT_THAT(ErrorOf([&] { Zeros({2}, DType::kFloat32, beyond); }),
                testing::HasSubstr("is not available: this machine has"));
    return;
  }
  const std::string expected =
      "cuda:0 is not available: " + DeviceTypeStatus(DeviceType::kCuda).message();
  EXPECT_EQ(ErrorOf([] { Ones({2, 3}).To(kCuda0); }), expected);
  EXPECT_EQ(ErrorOf([] { Zeros({2}, DType::kFloat32, kCuda0); }), expected);
  EXPECT_EQ(ErrorOf([] { Tensor::Empty({2}, DType::kInt64, kCuda0); }), expected);
  EXPECT_EQ(ErrorOf([] { Arange(0, 4, 1, DType::kInt64, kCuda0); }), expected);
  EXPECT_EQ(ErrorOf([] { Randn({3}, 1, DType::kFloat32, kCuda0); }), expected);
  EXPECT_EQ(ErrorOf([] { Synchronize(kCuda0); }), expected);
  EXPECT_EQ(ErrorOf([] { MemoryStats(kCuda0); }), expected);
  try {
    Synchronize(kCuda0);
  } catch (const Error& error) {
    EXPECT_EQ(error.status().code(), StatusCode::kFailedPrecondition);
  }
}

TEST(Devices, ParseDeviceNames) {
  Device device;
  ASSERT_TRUE(ParseDevice("cpu", &device));
  EXPECT_EQ(device, kCpu);
  ASSERT_TRUE(ParseDevice("cuda", &device));
  EXPECT_EQ(device, kCuda0);
  ASSERT_TRUE(ParseDevice("cuda:3", &device));
  EXPECT_EQ(device, (Device{DeviceType::kCuda, 3}));
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:1x", "cpu:0", "CUDA"}) {
    EXPECT_FALSE(ParseDevice(bad, &device)) << bad;
  }
  EXPECT_EQ(DeviceName(Device{DeviceType::kCuda, 3}), "cuda:3");
}

TEST(Devices, Tf32IsOffByDefaultAndSwitches) {
  EXPECT_FALSE(AllowTf32());
  SetAllowTf32(true);
  EXPECT_TRUE(AllowTf32());
  SetAllowTf32(false);
  EXPECT_FALSE(AllowTf32());
}

TEST(Devices, CpuStatsReportTheBlockCache) {
  DeviceMemoryStats stats = MemoryStats(kCpu);
  EXPECT_EQ(stats.cached_bytes, CpuCachedBytes());
  EXPECT_EQ(stats.total_bytes, 0U);
}

// --- on a GPU ------------------------------------------------------------------------------------

TEST(CudaDevice, TensorsRoundTripExactlyInEveryDType) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : kAllDTypeList) {
    Tensor source = RandomTensor({3, 5, 7}, dtype, 0, 9);
    Tensor moved = source.To(kCuda0);
    EXPECT_EQ(moved.device(), kCuda0);
    EXPECT_EQ(moved.shape(), source.shape());
    EXPECT_EQ(Values(moved.To(kCpu)), Values(source)) << DTypeName(dtype);
    // A strided view is made contiguous on the way, on either side.
    Tensor view = source.Transpose(0, 2).Slice(1, 1, 5, 2);
    EXPECT_EQ(Values(view.To(kCuda0).To(kCpu)), Values(view)) << DTypeName(dtype);
    EXPECT_EQ(Values(moved.Transpose(0, 2).Slice(1, 1, 5, 2).To(kCpu)), Values(view));
  }
  // Larger than one staging chunk (float32 holds integers exactly up to 2^24 only, so the
  // values are compared with the source's, not with their indices), and empty.
  Tensor large = Arange(0, 20e6, 1, DType::kFloat32);
  Tensor back = large.To(kCuda0).To(kCpu);
  ASSERT_EQ(back.numel(), large.numel());
  EXPECT_EQ(std::memcmp(back.data(), large.data(), static_cast<size_t>(large.numel()) * 4), 0);
  EXPECT_EQ(back.ItemAsDouble(12345678), 12345678.0);
  EXPECT_EQ(Zeros({0, 4}).To(kCuda0).To(kCpu).numel(), 0);
}

TEST(CudaDevice, CreationOpsMakeTensorsOnTheDevice) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(Zeros({2}, DType::kFloat32, kCuda0).device(), kCuda0);
  ExpectNear(Full({2, 2}, 2.5, DType::kFloat16, kCuda0).To(kCpu), {2.5, 2.5, 2.5, 2.5}, 0, "full");
  ExpectNear(Arange(0, 1, 0.25, DType::kFloat32, kCuda0).To(kCpu), {0, 0.25, 0.5, 0.75}, 0,
             "arange");
  ExpectNear(Eye(2, 3, DType::kFloat32, kCuda0).To(kCpu), {1, 0, 0, 0, 1, 0}, 0, "eye");
  ExpectNear(Linspace(0, 1, 5, DType::kFloat64, kCuda0).To(kCpu), {0, 0.25, 0.5, 0.75, 1}, 0,
             "linspace");
  EXPECT_EQ(Values(Randn({5}, 42, DType::kFloat32, kCuda0).To(kCpu)),
            Values(Randn({5}, 42, DType::kFloat32)));
}

TEST(CudaDevice, MixedDevicesAreRefusedExceptCpuScalars) {
  SKIP_WITHOUT_GPU();
  Tensor host = Ones({3});
  Tensor device = Ones({3}, DType::kFloat32, kCuda0);
  EXPECT_EQ(ErrorOf([&] { Binary(Op::add, host, device); }),
            "add: expected all tensors on the same device, got cpu and cuda:0");
  EXPECT_EQ(ErrorOf([&] {
              Matmul(device.View({1, 3}), host.View({3, 1}));
            }),
            "matmul: expected all tensors on the same device, got cuda:0 and cpu");
  EXPECT_THAT(ErrorOf([&] { Cat({device, host}); }), testing::HasSubstr("cat: expected all"));
  EXPECT_THAT(ErrorOf([&] { IndexSelect(device, 0, Zeros({1}, DType::kInt64)); }),
              testing::HasSubstr("index_select: expected all"));
  EXPECT_THAT(ErrorOf([&] { LayerNorm(device, {3}, host); }),
              testing::HasSubstr("layer_norm: expected all"));
  // A 0-dim CPU tensor (a Python number) goes with any device.
  Tensor sum = Binary(Op::add, device, Scalar(2, DType::kFloat32));
  EXPECT_EQ(sum.device(), kCuda0);
  ExpectNear(sum.To(kCpu), {3, 3, 3}, 0, "x + 2");
  Tensor chosen = Where(Binary(Op::gt, device, Scalar(0, DType::kFloat32)), device,
                        Scalar(-1, DType::kFloat32));
  EXPECT_EQ(chosen.device(), kCuda0);
}

TEST(CudaDevice, HostReadsOfDeviceTensorsAreRefused) {
  SKIP_WITHOUT_GPU();
  Tensor device = Ones({3}, DType::kFloat32, kCuda0);
  EXPECT_EQ(ErrorOf([&] { device.ItemAsDouble(); }),
            "reading an element: the tensor is on cuda:0; move it to the CPU first");
  Status saved = SaveSafetensors(testing::TempDir() + "/device.safetensors", {{"x", device}});
  EXPECT_EQ(saved.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(saved.message(), testing::HasSubstr("on cuda:0; move it to the CPU first"));
  EXPECT_EQ(ErrorOf([&] { Unary(Op::abs, Zeros({2}, DType::kBool, kCuda0)); }),
            "abs is not implemented for dtype bool on cuda:0");
}

TEST(CudaDevice, ReadOnlyTensorsStayReadOnlyOnTheDevice) {
  SKIP_WITHOUT_GPU();
  Tensor weights = Arange(0, 6, 1, DType::kFloat32);
  weights.storage()->MarkReadOnly();
  Tensor uploaded = weights.To(kCuda0);
  EXPECT_TRUE(uploaded.read_only());
  EXPECT_THROW(uploaded.CopyFrom(Zeros({6})), Error);
  EXPECT_EQ(Values(uploaded.To(kCpu)), Values(weights));
  EXPECT_TRUE(uploaded.To(kCpu).read_only());
  // Uploaded once per byte range: every copy moving the same weights shares the device copy.
  EXPECT_EQ(weights.To(kCuda0).storage().get(), uploaded.storage().get());
  Tensor half = weights.Narrow(0, 3, 3);
  EXPECT_EQ(Values(half.To(kCuda0).To(kCpu)), Values(half));
  EXPECT_EQ(half.To(kCuda0).storage().get(), half.To(kCuda0).storage().get());
  Tensor writable = Arange(0, 6, 1, DType::kFloat32);
  EXPECT_NE(writable.To(kCuda0).storage().get(), writable.To(kCuda0).storage().get());
}

// OROCHI_CUDA_NO_CACHING (a run under a memory checker) gives blocks back to the driver instead.
bool CachingIsOff() {
  const char* setting = std::getenv("OROCHI_CUDA_NO_CACHING");
  return setting != nullptr && std::strcmp(setting, "1") == 0;
}

TEST(CudaDevice, FreedBlocksAreReusedFromTheCache) {
  SKIP_WITHOUT_GPU();
  Synchronize(kCuda0);
  const DeviceMemoryStats before = MemoryStats(kCuda0);
  EXPECT_GT(before.total_bytes, 0U);
  { Tensor first = Zeros({1 << 20}, DType::kFloat32, kCuda0); }
  const DeviceMemoryStats middle = MemoryStats(kCuda0);
  { Tensor second = Zeros({1 << 20}, DType::kFloat32, kCuda0); }
  const DeviceMemoryStats after = MemoryStats(kCuda0);
  EXPECT_EQ(after.allocations, middle.allocations + 1);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(after.peak_allocated_bytes, size_t{4} << 20);
  if (CachingIsOff()) {
    EXPECT_EQ(after.cache_hits, middle.cache_hits);
    EXPECT_EQ(after.cached_bytes, 0U);
  } else {
    EXPECT_EQ(after.cache_hits, middle.cache_hits + 1);
    EXPECT_GE(after.cached_bytes, size_t{4} << 20);
  }
  EmptyCache(kCuda0);
  EXPECT_EQ(MemoryStats(kCuda0).cached_bytes, 0U);
  std::optional<double> utilisation = DeviceUtilisation(kCuda0);
  if (utilisation) {
    EXPECT_GE(*utilisation, 0);
    EXPECT_LE(*utilisation, 100);
  }
}

TEST(CudaDevice, ThreadsShareUploadedWeightsAndHandTensorsOver) {
  SKIP_WITHOUT_GPU();
  Tensor weight_cpu = RandomTensor({64, 48}, DType::kFloat32, -1, 1, 3);
  weight_cpu.storage()->MarkReadOnly();
  const Tensor weight = weight_cpu.To(kCuda0);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        Tensor input = RandomTensor({16, 64}, DType::kFloat32, -1, 1, 100 * t + round);
        Tensor expected = Softmax(Matmul(input, weight_cpu), -1);
        Tensor actual = Softmax(Matmul(input.To(kCuda0), weight), -1).To(kCpu);
        std::vector<double> a = Values(actual);
        std::vector<double> e = Values(expected);
        for (size_t i = 0; i < a.size(); ++i) {
          if (std::abs(a[i] - e[i]) > 1e-5) {
            ++failures;
            break;
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);

  // A tensor made on one thread's stream and used on another's: the second waits for the first.
  // The producer lives on until the consumer is done: a thread that exits hands its stream to
  // the next new thread, which would then order the two by being the same stream. A missing
  // wait shows as a wrong sum only if the producer's work is long; ThreadSanitizer, on the
  // emulated GPU, reports it whatever the length.
#if defined(__SANITIZE_THREAD__)
  constexpr int64_t kElements = int64_t{1} << 14;
#else
  constexpr int64_t kElements = int64_t{1} << 20;
#endif
  for (int round = 0; round < 10; ++round) {
    Tensor produced;
    std::promise<void> made;
    std::promise<void> used;
    std::thread producer([&] {
      Tensor big = Full({kElements}, 1, DType::kFloat32, kCuda0);
      for (int i = 0; i < 20; ++i) big = Binary(Op::add, big, Scalar(1, DType::kFloat32));
      produced = big;  // no Synchronize: the work may still be queued
      made.set_value();
      used.get_future().wait();
    });
    made.get_future().wait();
    std::thread consumer([&] {
      Tensor total = Reduce(Op::sum, produced).To(kCpu);
      EXPECT_EQ(total.ItemAsDouble(), 21.0 * static_cast<double>(kElements));
      produced = Tensor();  // freed on this thread, after use on two streams
      used.set_value();
    });
    consumer.join();
    producer.join();
  }
}

// Two GPUs: each computes, tensors move between them directly, threads switch between them, and
// neither's work lands on the other's stream (the emulated GPU refuses such a launch).
TEST(CudaDevice, EveryDeviceComputesAndHandsTensorsToTheOthers) {
  if (DeviceCount(DeviceType::kCuda) < 2) {
    GTEST_SKIP() << "needs 2 CUDA GPUs, this machine has " << DeviceCount(DeviceType::kCuda);
  }
  constexpr Device kCuda1{DeviceType::kCuda, 1};
  Tensor a = RandomTensor({64, 32}, DType::kFloat32, -1, 1, 11);
  Tensor b = RandomTensor({32, 16}, DType::kFloat32, -1, 1, 12);
  const std::vector<double> expected = Values(Softmax(Matmul(a, b), -1));
  auto close = [&](const Tensor& actual) {
    std::vector<double> got = Values(actual.To(kCpu));
    if (got.size() != expected.size()) return false;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::abs(got[i] - expected[i]) > 1e-5) return false;
    }
    return true;
  };
  Tensor on_one = Softmax(Matmul(a.To(kCuda1), b.To(kCuda1)), -1);
  EXPECT_EQ(on_one.device(), kCuda1);
  EXPECT_TRUE(close(on_one));
  Tensor on_zero = on_one.To(kCuda0);  // device to device, without the host
  EXPECT_EQ(on_zero.device(), kCuda0);
  EXPECT_TRUE(close(on_zero));
  EXPECT_TRUE(close(Binary(Op::add, on_zero, Scalar(0, DType::kFloat32)).To(kCuda1)));
  EXPECT_NE(ErrorOf([&] {
              Binary(Op::add, on_zero, on_one);
            }).find("expected all tensors on the same device, got cuda:0 and cuda:1"),
            std::string::npos);
  EXPECT_GT(MemoryStats(kCuda1).allocated_bytes, 0U);

  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 6; ++round) {
        const Device device{DeviceType::kCuda, (t + round) % 2};
        Tensor result = Softmax(Matmul(a.To(device), b.To(device)), -1);
        if (result.device() != device || !close(result)) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace orochi::engine
