// The emulated GPU catches what it says it catches (emulator.h): each test runs a kernel with one
// deliberate fault, in a child process, and expects the process to stop naming the kernel and the
// fault. Compiled like the backend's .cu files, through simt.h.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif

__global__ void CopyElements(const float* source, float* destination, int count) {
  const int index = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (index < count) destination[index] = source[index];
}

// Forgets the bound check: the threads past `count` read past the end of `source`.
__global__ void CopyElementsUnchecked(const float* source, float* destination, int /*count*/) {
  const int index = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  destination[0] = source[index];
}

// A pointer inside a struct escapes the launch's check of pointer arguments, as a pointer stored
// in device memory would.
struct Source {
  const float* data;
};
__global__ void CopyFromSource(Source source, float* destination) {
  destination[threadIdx.x] = source.data[threadIdx.x];
}

__global__ void WriteOneBytePast(unsigned char* data, int count) {
  if (threadIdx.x == 0) data[count] = 1;
}

// The first half of the block waits at a barrier that the second half never reaches.
__global__ void DivergentBarrier(float* data) {
  if (threadIdx.x < blockDim.x / 2) {
    __syncthreads();
    data[threadIdx.x] = 0;
  }
}

__global__ void SharedMemoryOverrun(float* data) {
  __shared__ float partial[32];
  partial[threadIdx.x] = data[threadIdx.x];  // launched with 64 threads
  __syncthreads();
  data[threadIdx.x] = partial[0];
}

// Each thread reads its neighbour's element of shared memory: correct with the barrier, a race
// without it.
template <bool kWithBarrier>
__global__ void RotateThroughSharedMemory(const float* in, float* out) {
  __shared__ float staged[64];
  staged[threadIdx.x] = in[threadIdx.x];
  if (kWithBarrier) __syncthreads();
  out[threadIdx.x] = staged[(threadIdx.x + 1) % blockDim.x];
}

__global__ void Fill(float* data, float value) { data[threadIdx.x] = value; }

class Emulator : public ::testing::Test {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    for (void* pointer : allocations_) EXPECT_EQ(cudaFree(pointer), cudaSuccess);
  }

  template <typename T>
  T* DeviceArray(size_t count) {
    void* pointer = nullptr;
    EXPECT_EQ(cudaMalloc(&pointer, count * sizeof(T)), cudaSuccess);
    allocations_.push_back(pointer);
    return static_cast<T*>(pointer);
  }

  // An address that was device memory, freed since.
  static float* FreedAllocation() {
    void* freed = nullptr;
    EXPECT_EQ(cudaMalloc(&freed, 4096), cudaSuccess);
    EXPECT_EQ(cudaFree(freed), cudaSuccess);
    return static_cast<float*>(freed);
  }

  void Synchronize() { ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }

  std::vector<float> Read(const float* data, size_t count) {
    std::vector<float> values(count);
    EXPECT_EQ(cudaMemcpyAsync(values.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost,
                              stream_),
              cudaSuccess);
    Synchronize();
    return values;
  }

  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
};

TEST_F(Emulator, RunsACorrectKernel) {
  constexpr int kCount = 1000;
  std::vector<float> host(kCount);
  for (int i = 0; i < kCount; ++i) host[i] = static_cast<float>(i) * 0.5F;
  float* source = DeviceArray<float>(kCount);
  float* destination = DeviceArray<float>(kCount);
  ASSERT_EQ(
      cudaMemcpyAsync(source, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice, stream_),
      cudaSuccess);
  OROCHI_LAUNCH(CopyElements, dim3(4), dim3(256), stream_, source, destination, kCount);
  std::vector<float> back(kCount);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), destination, kCount * sizeof(float),
                            cudaMemcpyDeviceToHost, stream_),
            cudaSuccess);
  Synchronize();
  EXPECT_EQ(back, host);
}

TEST_F(Emulator, FreshMemoryReadsAsNaN) {
  float* data = DeviceArray<float>(16);
  float value = 0;
  ASSERT_EQ(cudaMemcpyAsync(&value, data, sizeof(value), cudaMemcpyDeviceToHost, stream_),
            cudaSuccess);
  Synchronize();
  EXPECT_TRUE(std::isnan(value));
}

TEST_F(Emulator, ReadingPastAnAllocationStopsNamingTheKernel) {
  // 1024 floats fill whole pages: the next element is on the guard page.
  float* source = DeviceArray<float>(1024);
  float* destination = DeviceArray<float>(1);
  EXPECT_DEATH(
      {
        OROCHI_LAUNCH(CopyElementsUnchecked, dim3(5), dim3(256), stream_, source, destination,
                      1024);
        Synchronize();
      },
      "CopyElementsUnchecked");
}

TEST_F(Emulator, AnOverrunWithinTheAllocationsRoundingNeedsAddressSanitizer) {
  unsigned char* data = DeviceArray<unsigned char>(100);  // cudaMalloc rounds to 256 bytes
  if (!kAddressSanitizer) {
    GTEST_SKIP() << "without AddressSanitizer a write into an allocation's rounding goes unseen; "
                    "the OROCHI_SANITIZER=address build catches it";
  }
  EXPECT_DEATH(
      {
        OROCHI_LAUNCH(WriteOneBytePast, dim3(1), dim3(32), stream_, data, 100);
        Synchronize();
      },
      "WriteOneBytePast");
}

TEST_F(Emulator, AKernelGivenFreedMemoryStops) {
  float* freed = FreedAllocation();
  float* destination = DeviceArray<float>(1);
  EXPECT_DEATH(
      {
        OROCHI_LAUNCH(CopyElements, dim3(1), dim3(32), stream_, freed, destination, 1);
        Synchronize();
      },
      "kernel CopyElements on cuda:0 is given 0x[0-9a-f]+, which is not device memory");
}

TEST_F(Emulator, AKernelReadingFreedMemoryStopsNamingTheKernel) {
  const float* freed = FreedAllocation();
  float* destination = DeviceArray<float>(32);
  EXPECT_DEATH(
      {
        OROCHI_LAUNCH(CopyFromSource, dim3(1), dim3(32), stream_, Source{freed}, destination);
        Synchronize();
      },
      "CopyFromSource");
}

TEST_F(Emulator, AKernelGivenHostMemoryStops) {
  std::vector<float> host(32);
  float* destination = DeviceArray<float>(32);
  EXPECT_DEATH(
      {
        OROCHI_LAUNCH(CopyElements, dim3(1), dim3(32), stream_, host.data(), destination, 32);
        Synchronize();
      },
      "which is not device memory");
}

TEST_F(Emulator, ADivergentBarrierStopsNamingTheKernel) {
  float* data = DeviceArray<float>(64);
  EXPECT_DEATH(
      {
        OROCHI_LAUNCH(DivergentBarrier, dim3(1), dim3(64), stream_, data);
        Synchronize();
      },
      "kernel DivergentBarrier, block 0.*a barrier that not every thread it waits for reaches");
}

TEST_F(Emulator, AnInvalidLaunchConfigurationFailsTheLaunch) {
  float* data = DeviceArray<float>(64);
  OROCHI_LAUNCH(DivergentBarrier, dim3(1), dim3(2048), stream_, data);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(Emulator, ASharedMemoryOverrunNeedsAddressSanitizer) {
  float* data = DeviceArray<float>(64);
  if (!kAddressSanitizer) {
    GTEST_SKIP() << "without AddressSanitizer an overrun of a __shared__ array goes unseen; the "
                    "OROCHI_SANITIZER=address build catches it";
  }
  EXPECT_DEATH(
      {
        OROCHI_LAUNCH(SharedMemoryOverrun, dim3(1), dim3(64), stream_, data);
        Synchronize();
      },
      "global-buffer-overflow(.|\n)*SharedMemoryOverrun");
}

}  // namespace

namespace {

TEST_F(Emulator, ABarrierOrdersSharedMemory) {
  std::vector<float> host(64);
  for (int i = 0; i < 64; ++i) host[i] = static_cast<float>(i);
  float* in = DeviceArray<float>(64);
  float* out = DeviceArray<float>(64);
  ASSERT_EQ(cudaMemcpyAsync(in, host.data(), 64 * sizeof(float), cudaMemcpyHostToDevice, stream_),
            cudaSuccess);
  OROCHI_LAUNCH(RotateThroughSharedMemory<true>, dim3(3), dim3(64), stream_, in, out);
  std::vector<float> values = Read(out, 64);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(values[i], static_cast<float>((i + 1) % 64));
}

TEST_F(Emulator, AMissingBarrierIsARaceUnderThreadSanitizer) {
  float* in = DeviceArray<float>(64);
  float* out = DeviceArray<float>(64);
  if (!kThreadSanitizer) {
    GTEST_SKIP() << "without ThreadSanitizer a missing barrier goes unseen; the "
                    "OROCHI_SANITIZER=thread build catches it";
  }
  EXPECT_DEATH(
      {
        OROCHI_LAUNCH(RotateThroughSharedMemory<false>, dim3(1), dim3(64), stream_, in, out);
        Synchronize();
      },
      "data race(.|\n)*RotateThroughSharedMemory");
}

TEST_F(Emulator, AnEventOrdersKernelsOnTwoStreams) {
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t written = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
  float* data = DeviceArray<float>(64);
  float* copy = DeviceArray<float>(64);
  OROCHI_LAUNCH(Fill, dim3(1), dim3(64), other, data, 2.0F);
  ASSERT_EQ(cudaEventRecord(written, other), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(stream_, written, 0), cudaSuccess);
  OROCHI_LAUNCH(CopyElements, dim3(1), dim3(64), stream_, data, copy, 64);
  EXPECT_EQ(Read(copy, 64), std::vector<float>(64, 2.0F));
  ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(written), cudaSuccess);
}

TEST_F(Emulator, KernelsOnTwoStreamsWithoutAnEventRaceUnderThreadSanitizer) {
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  float* data = DeviceArray<float>(64);
  float* copy = DeviceArray<float>(64);
  if (!kThreadSanitizer) {
    GTEST_SKIP() << "without ThreadSanitizer unordered streams only sometimes give wrong answers; "
                    "the OROCHI_SANITIZER=thread build reports every such race";
  }
  EXPECT_DEATH(
      {
        OROCHI_LAUNCH(Fill, dim3(1), dim3(64), other, data, 2.0F);
        OROCHI_LAUNCH(CopyElements, dim3(1), dim3(64), stream_, data, copy, 64);
        Synchronize();
        ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
      },
      "data race(.|\n)*(Fill|CopyElements)");
}

}  // namespace

#if defined(__SANITIZE_THREAD__)
// A race ends the process at once, as the death tests above expect.
extern "C" const char* __tsan_default_options() { return "halt_on_error=1"; }
#endif
