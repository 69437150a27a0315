// The CUDA runtime functions the backend calls, over emulated devices (see emulator.h).
#include <fcntl.h>
#include <sanitizer/asan_interface.h>  // its macros do nothing without AddressSanitizer
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "emulator_internal.h"

using orochi::cuda_emulator::SetLastError;

// The runtime's handle types are opaque structs declared by its headers; the emulator defines them.
struct CUstream_st {
  int device = 0;
  // Work runs in order on the worker thread; positions count operations queued so far.
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::function<void()>> queue;
  uint64_t queued = 0;
  uint64_t completed = 0;
  uint64_t random_state = 0;
};

struct CUevent_st {
  int device = 0;
  cudaStream_t stream = nullptr;  // null: never recorded, complete
  uint64_t position = 0;
};

namespace orochi::cuda_emulator {
namespace {

constexpr size_t kDeviceMemoryBytes = size_t{16} << 30;
constexpr int kMaxDevices = 8;

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

// Two by default, so that the multi-device paths (current device per thread, peer copies, one
// device's stream never used for another's work) are exercised too.
int DeviceCount() {
  static const int count = [] {
    const char* text = std::getenv("OROCHI_CUDA_EMULATOR_DEVICES");
    const int asked = text != nullptr ? std::atoi(text) : 2;
    return std::clamp(asked, 0, kMaxDevices);
  }();
  return count;
}

// --- streams ----------------------------------------------------------------------------------

// Sleeps now and then before an operation, so that unordered work on two streams interleaves
// differently from run to run instead of happening to finish in the order it was queued.
void MaybePause(uint64_t& state) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  if (state % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(state % 200));
}

void RunStream(cudaStream_t stream) {
  // A faulting kernel reports itself from this thread's alternate signal stack.
  static constexpr size_t kSignalStackBytes = size_t{64} << 10;
  stack_t signal_stack{};
  signal_stack.ss_sp = std::malloc(kSignalStackBytes);
  signal_stack.ss_size = kSignalStackBytes;
  sigaltstack(&signal_stack, nullptr);
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock lock(stream->mutex);
      stream->changed.wait(lock, [stream] { return !stream->queue.empty(); });
      work = std::move(stream->queue.front());
      stream->queue.pop_front();
    }
    MaybePause(stream->random_state);
    work();
    {
      std::lock_guard lock(stream->mutex);
      ++stream->completed;
    }
    stream->changed.notify_all();
  }
}

void InstallFaultHandler();  // faults (below)

class Streams {
 public:
  static Streams& Instance() {
    static auto* streams = new Streams;  // worker threads use it until the process exits
    return *streams;
  }

  cudaStream_t Create(int device) {
    auto* stream = new CUstream_st;  // never destroyed: the backend never destroys streams
    stream->device = device;
    std::lock_guard lock(mutex_);
    stream->random_state = 0x9e3779b97f4a7c15ULL * (all_.size() + 1);
    all_.push_back(stream);
    InstallFaultHandler();  // before the first worker can run a kernel
    std::thread(RunStream, stream).detach();
    return stream;
  }

  std::vector<cudaStream_t> OfDevice(int device) {
    std::lock_guard lock(mutex_);
    std::vector<cudaStream_t> streams;
    for (cudaStream_t stream : all_) {
      if (stream->device == device) streams.push_back(stream);
    }
    return streams;
  }

 private:
  std::mutex mutex_;
  std::vector<cudaStream_t> all_;
};

uint64_t Queue(cudaStream_t stream, std::function<void()> work) {
  uint64_t position = 0;
  {
    std::lock_guard lock(stream->mutex);
    stream->queue.push_back(std::move(work));
    position = ++stream->queued;
  }
  stream->changed.notify_all();
  return position;
}

void WaitFor(cudaStream_t stream, uint64_t position) {
  std::unique_lock lock(stream->mutex);
  stream->changed.wait(lock, [&] { return stream->completed >= position; });
}

bool Reached(cudaStream_t stream, uint64_t position) {
  std::lock_guard lock(stream->mutex);
  return stream->completed >= position;
}

void SynchronizeStream(cudaStream_t stream) {
  uint64_t position = 0;
  {
    std::lock_guard lock(stream->mutex);
    position = stream->queued;
  }
  WaitFor(stream, position);
}

void SynchronizeDevice(int device) {
  for (cudaStream_t stream : Streams::Instance().OfDevice(device)) SynchronizeStream(stream);
}

// --- memory -------------------------------------------------------------------------------------

struct Allocation {
  void* mapping = nullptr;
  size_t mapping_bytes = 0;
  size_t bytes = 0;
  int device = 0;
  // CUDA IPC. An exported allocation's pages are moved into a memfd (`memfd`, closed with the
  // mapping), which another process maps through /proc/<pid>/fd; an imported one is such a
  // mapping of another process's allocation, given back by cudaIpcCloseMemHandle, not cudaFree.
  int memfd = -1;
  bool imported = false;
};

// What the emulator writes into a cudaIpcMemHandle_t (64 opaque bytes on real GPUs).
struct IpcHandle {
  static constexpr uint64_t kMagic = 0x4f524f4348494950;  // "OROCHIIP"
  uint64_t magic;
  int64_t pid;
  int64_t fd;
  uint64_t pages;        // the memfd's size: the allocation's whole pages
  uint64_t data_offset;  // where its data starts within them (allocations end on a page end)
  uint64_t bytes;        // its size, rounded as cudaMalloc rounds
};
static_assert(sizeof(IpcHandle) <= sizeof(cudaIpcMemHandle_t));

class Memory {
 public:
  static Memory& Instance() {
    static auto* memory = new Memory;
    return *memory;
  }

  // Ends the allocation on a page boundary followed by an inaccessible page, with another before
  // it, so that reading or writing past either end faults. Under AddressSanitizer the bytes
  // between the requested size and that boundary are poisoned too, which makes the check exact
  // (to the byte) for code built with it: the emulated kernels and copies.
  cudaError_t Allocate(void** pointer, size_t bytes, int device) {
    if (bytes == 0) {
      *pointer = nullptr;
      return cudaSuccess;
    }
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t rounded = (bytes + 255) / 256 * 256;  // cudaMalloc's alignment
    const size_t pages = (rounded + page - 1) / page * page;
    {
      std::lock_guard lock(mutex_);
      if (used_[device] + rounded > kDeviceMemoryBytes) return cudaErrorMemoryAllocation;
      used_[device] += rounded;
    }
    const size_t mapping_bytes = pages + 2 * page;
    void* mapping =
        mmap(nullptr, mapping_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapping == MAP_FAILED) {
      std::lock_guard lock(mutex_);
      used_[device] -= rounded;
      return cudaErrorMemoryAllocation;
    }
    char* usable = static_cast<char*>(mapping) + page;
    mprotect(usable, pages, PROT_READ | PROT_WRITE);
    char* data = usable + (pages - rounded);
    std::memset(data, 0xff, rounded);  // uninitialised memory reads as NaN or -1, not as zero
    ASAN_POISON_MEMORY_REGION(data + bytes, rounded - bytes);
    std::lock_guard lock(mutex_);
    device_[reinterpret_cast<uintptr_t>(data)] = {mapping, mapping_bytes, rounded, device};
    *pointer = data;
    return cudaSuccess;
  }

  cudaError_t Free(void* pointer) {
    if (pointer == nullptr) return cudaSuccess;
    Allocation allocation{};
    {
      std::lock_guard lock(mutex_);
      auto found = device_.find(reinterpret_cast<uintptr_t>(pointer));
      if (found == device_.end() || found->second.imported) return cudaErrorInvalidValue;
      allocation = found->second;
      device_.erase(found);
      used_[allocation.device] -= allocation.bytes;
    }
    SynchronizeDevice(allocation.device);  // cudaFree waits for the device, as the real one does
    // Kept mapped but inaccessible for a while (its pages given back), so that a late use faults,
    // or under AddressSanitizer is reported as a use after free, rather than landing in whatever
    // is mapped there next.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    char* usable = static_cast<char*>(allocation.mapping) + page;
    const size_t usable_bytes = allocation.mapping_bytes - 2 * page;
    mprotect(usable, usable_bytes, PROT_NONE);
    madvise(usable, usable_bytes, MADV_DONTNEED);
    ASAN_POISON_MEMORY_REGION(pointer, allocation.bytes);
    std::lock_guard lock(mutex_);
    quarantine_.push_back(allocation);
    if (quarantine_.size() > kQuarantined) {
      Unmap(quarantine_.front());
      quarantine_.pop_front();
    }
    return cudaSuccess;
  }

  // cudaIpcGetMemHandle: `pointer` must be an allocation's start. The first export moves the
  // allocation's pages, contents and all, into a memfd mapped at the same address.
  cudaError_t Export(cudaIpcMemHandle_t* handle, void* pointer) {
    Allocation allocation{};
    {
      std::lock_guard lock(mutex_);
      auto found = device_.find(reinterpret_cast<uintptr_t>(pointer));
      if (found == device_.end() || found->second.imported) return cudaErrorInvalidValue;
      allocation = found->second;
    }
    SynchronizeDevice(allocation.device);  // no queued work may write the pages while they move
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    char* usable = static_cast<char*>(allocation.mapping) + page;
    const size_t pages = allocation.mapping_bytes - 2 * page;
    std::lock_guard lock(mutex_);
    auto found = device_.find(reinterpret_cast<uintptr_t>(pointer));
    if (found == device_.end()) return cudaErrorInvalidValue;  // freed meanwhile
    Allocation& live = found->second;
    if (live.memfd < 0) {
      const int fd = memfd_create("orochi-emulated-device-memory", MFD_CLOEXEC);
      if (fd < 0) return cudaErrorMemoryAllocation;
      ASAN_UNPOISON_MEMORY_REGION(usable, pages);  // the copy reads the rounding's bytes too
      const bool copied =
          ftruncate(fd, static_cast<off_t>(pages)) == 0 &&
          pwrite(fd, usable, pages, 0) == static_cast<ssize_t>(pages) &&
          mmap(usable, pages, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == usable;
      ASAN_POISON_MEMORY_REGION(static_cast<char*>(pointer) + allocation.bytes,
                                usable + pages - static_cast<char*>(pointer) - allocation.bytes);
      if (!copied) {
        close(fd);
        return cudaErrorMemoryAllocation;
      }
      live.memfd = fd;
    }
    IpcHandle written{IpcHandle::kMagic,
                      getpid(),
                      live.memfd,
                      pages,
                      static_cast<uint64_t>(static_cast<char*>(pointer) - usable),
                      live.bytes};
    std::memset(handle, 0, sizeof(*handle));
    std::memcpy(handle, &written, sizeof(written));
    return cudaSuccess;
  }

  // cudaIpcOpenMemHandle: maps another process's exported allocation, with guard pages around it
  // as every allocation has, as an allocation of `device`.
  cudaError_t Import(void** pointer, const cudaIpcMemHandle_t& handle, int device) {
    IpcHandle read{};
    std::memcpy(&read, &handle, sizeof(read));
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    if (read.magic != IpcHandle::kMagic || read.pages == 0 || read.pages % page != 0 ||
        read.data_offset + read.bytes > read.pages) {
      return cudaErrorInvalidResourceHandle;
    }
    if (read.pid == getpid()) return cudaErrorDeviceUninitialized;  // as the runtime refuses it too
    const std::string path = "/proc/" + std::to_string(read.pid) + "/fd/" + std::to_string(read.fd);
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return cudaErrorInvalidResourceHandle;  // the exporting process has gone
    const size_t mapping_bytes = read.pages + 2 * page;
    void* mapping =
        mmap(nullptr, mapping_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    char* usable = static_cast<char*>(mapping) + page;
    const bool mapped = mapping != MAP_FAILED && mmap(usable, read.pages, PROT_READ | PROT_WRITE,
                                                      MAP_SHARED | MAP_FIXED, fd, 0) == usable;
    close(fd);
    if (!mapped) {
      if (mapping != MAP_FAILED) munmap(mapping, mapping_bytes);
      return cudaErrorMemoryAllocation;
    }
    char* data = usable + read.data_offset;
    std::lock_guard lock(mutex_);
    device_[reinterpret_cast<uintptr_t>(data)] = {mapping, mapping_bytes, read.bytes, device,
                                                  -1,      true};
    *pointer = data;
    return cudaSuccess;
  }

  // cudaIpcCloseMemHandle: unmaps an imported allocation once its device's work is done.
  cudaError_t CloseImported(void* pointer) {
    Allocation allocation{};
    {
      std::lock_guard lock(mutex_);
      auto found = device_.find(reinterpret_cast<uintptr_t>(pointer));
      if (found == device_.end() || !found->second.imported) return cudaErrorInvalidValue;
      allocation = found->second;
      device_.erase(found);
    }
    SynchronizeDevice(allocation.device);
    Unmap(allocation);
    return cudaSuccess;
  }

  void* AllocatePinned(size_t bytes) {
    void* data = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
    if (data == nullptr) return nullptr;
    std::lock_guard lock(mutex_);
    pinned_[reinterpret_cast<uintptr_t>(data)] = bytes;
    return data;
  }

  // The device of the live allocation that holds [pointer, pointer + bytes), or -1.
  int DeviceOf(const void* pointer, size_t bytes) {
    std::lock_guard lock(mutex_);
    const Allocation* allocation =
        Holding(device_, pointer, bytes, [](const Allocation& a) { return a.bytes; });
    return allocation != nullptr ? allocation->device : -1;
  }
  bool IsDevice(const void* pointer, size_t bytes) { return DeviceOf(pointer, bytes) >= 0; }
  bool IsPinned(const void* pointer, size_t bytes) {
    std::lock_guard lock(mutex_);
    return Holding(pinned_, pointer, bytes, [](size_t size) { return size; }) != nullptr;
  }

 private:
  // The entry of `map` (keyed by start address) whose range holds the given one, or null.
  template <typename Map, typename SizeOf>
  static const typename Map::mapped_type* Holding(const Map& map, const void* pointer, size_t bytes,
                                                  SizeOf size_of) {
    const auto address = reinterpret_cast<uintptr_t>(pointer);
    auto found = map.upper_bound(address);
    if (found == map.begin()) return nullptr;
    --found;
    return address + bytes <= found->first + size_of(found->second) ? &found->second : nullptr;
  }

  // Shadow memory outlives the mapping: what is mapped here next must not start out poisoned.
  static void Unmap(const Allocation& allocation) {
    ASAN_UNPOISON_MEMORY_REGION(allocation.mapping, allocation.mapping_bytes);
    munmap(allocation.mapping, allocation.mapping_bytes);
    if (allocation.memfd >= 0) close(allocation.memfd);
  }

  // Each is a mapping of its own, and a process may have only about 65000.
  static constexpr size_t kQuarantined = 4096;

  std::mutex mutex_;
  std::map<uintptr_t, Allocation> device_;
  std::deque<Allocation> quarantine_;  // freed, inaccessible, still mapped
  std::map<uintptr_t, size_t> pinned_;
  std::array<size_t, kMaxDevices> used_{};
};

// --- faults -------------------------------------------------------------------------------------

thread_local const char* running_kernel = nullptr;
thread_local unsigned running_block = 0;

void WriteText(const char* text) {
  ssize_t ignored = write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

struct sigaction previous_segv_action {};
struct sigaction previous_bus_action {};

// Async-signal-safe: formats by hand.
void OnFault(int signal, siginfo_t* info, void* /*context*/) {
  char address[32] = "0x";
  auto value = reinterpret_cast<uintptr_t>(info->si_addr);
  char digits[20];
  int count = 0;
  do {
    digits[count++] = "0123456789abcdef"[value % 16];
    value /= 16;
  } while (value != 0);
  for (int i = 0; i < count; ++i) address[2 + i] = digits[count - 1 - i];
  address[2 + count] = '\0';
  char block[16];
  count = 0;
  unsigned number = running_block;
  do {
    digits[count++] = static_cast<char>('0' + number % 10);
    number /= 10;
  } while (number != 0);
  for (int i = 0; i < count; ++i) block[i] = digits[count - 1 - i];
  block[count] = '\0';
  if (running_kernel != nullptr) {
    WriteText("cuda emulator: invalid memory access at ");
    WriteText(address);
    WriteText(" by kernel ");
    WriteText(running_kernel);
    WriteText(", block ");
    WriteText(block);
    WriteText(" (outside every live device allocation, or a fiber's stack overflowed)\n");
  }
  // The fault repeats on return, for the handler that was there before (AddressSanitizer's, or
  // the default that ends the process).
  sigaction(signal, signal == SIGBUS ? &previous_bus_action : &previous_segv_action, nullptr);
}

void InstallFaultHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = OnFault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &previous_segv_action);
    sigaction(SIGBUS, &action, &previous_bus_action);
  });
}

bool ValidDevice(int device) { return device >= 0 && device < DeviceCount(); }

// The errors the emulator returns, named and described as the runtime does.
CodeDescription<cudaError_t> DescribeError(cudaError_t error) {
  static constexpr CodeDescription<cudaError_t> kKnown[] = {
      {cudaSuccess, "cudaSuccess", "no error"},
      {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
      {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
      {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
       "invalid configuration argument"},
      {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
      {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
      {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
      {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
      {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
  };
  return Describe(kKnown, error, {error, "cudaErrorUnknown", "unknown error"});
}

}  // namespace

cudaError_t SetLastError(cudaError_t error) {
  if (error != cudaSuccess) last_error = error;
  return error;
}

cudaError_t CheckKernelStream(cudaStream_t stream) {
  if (stream != nullptr && stream->device != current_device) return cudaErrorInvalidResourceHandle;
  return cudaSuccess;
}

int DeviceOfPointer(const void* pointer) { return Memory::Instance().DeviceOf(pointer, 1); }

int DeviceOfStream(cudaStream_t stream) {
  return stream != nullptr ? stream->device : current_device;
}

void SetRunningKernel(const char* name, unsigned block) {
  running_kernel = name;
  running_block = block;
}

void Enqueue(cudaStream_t stream, std::function<void()> work) {
  if (stream == nullptr) {
    SynchronizeDevice(current_device);
    work();
    return;
  }
  Queue(stream, std::move(work));
}

bool IsDeviceRange(const void* pointer, size_t bytes) {
  return Memory::Instance().IsDevice(pointer, bytes);
}

bool IsDeviceRangeOf(cudaStream_t stream, const void* pointer, size_t bytes) {
  return Memory::Instance().DeviceOf(pointer, bytes) == DeviceOfStream(stream);
}

}  // namespace orochi::cuda_emulator

namespace emulator = orochi::cuda_emulator;

// --- the runtime API
// ------------------------------------------------------------------------------

cudaError_t cudaGetLastError() {
  const cudaError_t error = emulator::last_error;
  emulator::last_error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError() { return emulator::last_error; }

const char* cudaGetErrorName(cudaError_t error) { return emulator::DescribeError(error).name; }

const char* cudaGetErrorString(cudaError_t error) { return emulator::DescribeError(error).text; }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = emulator::DeviceCount();
  return *count == 0 ? SetLastError(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = emulator::current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!emulator::ValidDevice(device)) return SetLastError(cudaErrorInvalidDevice);
  emulator::current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device) {
  if (!emulator::ValidDevice(device)) return SetLastError(cudaErrorInvalidDevice);
  *properties = cudaDeviceProp{};
  std::snprintf(properties->name, sizeof(properties->name), "Orochi CUDA emulator");
  properties->major = 9;
  properties->minor = 0;
  properties->totalGlobalMem = emulator::kDeviceMemoryBytes;
  properties->multiProcessorCount = 4;
  properties->warpSize = 32;
  properties->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int length, int device) {
  if (!emulator::ValidDevice(device)) return SetLastError(cudaErrorInvalidDevice);
  std::snprintf(bus_id, static_cast<size_t>(length), "0000:%02x:00.0", device);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  emulator::SynchronizeDevice(emulator::current_device);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  return SetLastError(
      emulator::Memory::Instance().Allocate(pointer, bytes, emulator::current_device));
}

cudaError_t cudaFree(void* pointer) {
  return SetLastError(emulator::Memory::Instance().Free(pointer));
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* pointer) {
  if (handle == nullptr) return SetLastError(cudaErrorInvalidValue);
  return SetLastError(emulator::Memory::Instance().Export(handle, pointer));
}

cudaError_t cudaIpcOpenMemHandle(void** pointer, cudaIpcMemHandle_t handle,
                                 unsigned int /*flags*/) {
  return SetLastError(
      emulator::Memory::Instance().Import(pointer, handle, emulator::current_device));
}

cudaError_t cudaIpcCloseMemHandle(void* pointer) {
  return SetLastError(emulator::Memory::Instance().CloseImported(pointer));
}

cudaError_t cudaHostAlloc(void** pointer, size_t bytes, unsigned int /*flags*/) {
  *pointer = emulator::Memory::Instance().AllocatePinned(bytes);
  return *pointer != nullptr ? cudaSuccess : SetLastError(cudaErrorMemoryAllocation);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int /*flags*/) {
  *stream = emulator::Streams::Instance().Create(emulator::current_device);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (stream == nullptr) return cudaDeviceSynchronize();
  emulator::SynchronizeStream(stream);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int /*flags*/) {
  *event = new CUevent_st;
  (*event)->device = emulator::current_device;
  return cudaSuccess;
}

// Like the runtime's, safe while work that the event marks is still queued: the event holds a
// position, not a reference from the stream.
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (stream == nullptr) return SetLastError(cudaErrorInvalidResourceHandle);  // not used
  // Recording an event into another device's stream fails, as on the GPU.
  if (event->device != stream->device) return SetLastError(cudaErrorInvalidResourceHandle);
  event->stream = stream;
  event->position = emulator::Queue(stream, [] {});
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event->stream == nullptr || emulator::Reached(event->stream, event->position)) {
    return cudaSuccess;
  }
  return cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event->stream != nullptr) emulator::WaitFor(event->stream, event->position);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int /*flags*/) {
  if (stream == nullptr) return SetLastError(cudaErrorInvalidResourceHandle);  // not used
  if (event->stream == nullptr) return cudaSuccess;
  // The event's position is taken now: recording the event again later does not change this wait.
  emulator::Queue(stream, [waited = event->stream, position = event->position] {
    emulator::WaitFor(waited, position);
  });
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* destination, const void* source, size_t bytes,
                            cudaMemcpyKind kind, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  emulator::Memory& memory = emulator::Memory::Instance();
  const bool to_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool from_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyHostToHost || kind == cudaMemcpyDefault ||
      (to_device && !memory.IsDevice(destination, bytes)) ||
      (from_device && !memory.IsDevice(source, bytes))) {
    return SetLastError(cudaErrorInvalidValue);
  }
  if (kind == cudaMemcpyHostToDevice && !memory.IsPinned(source, bytes)) {
    // Pageable memory is staged before the call returns; the caller may reuse it at once.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(source),
                                                      static_cast<const char*>(source) + bytes);
    emulator::Enqueue(stream, [destination, staged] {
      std::memcpy(destination, staged->data(), staged->size());
    });
    return cudaSuccess;
  }
  emulator::Enqueue(stream,
                    [destination, source, bytes] { std::memcpy(destination, source, bytes); });
  if (kind == cudaMemcpyDeviceToHost && !memory.IsPinned(destination, bytes) && stream != nullptr) {
    emulator::SynchronizeStream(stream);  // into pageable memory: returns once the copy is done
  }
  return cudaSuccess;
}

// For clients (a test's ctypes, say) that copy synchronously on the null stream.
cudaError_t cudaMemcpy(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(destination, source, bytes, kind, nullptr);
}

cudaError_t cudaMemcpyPeerAsync(void* destination, int destination_device, const void* source,
                                int source_device, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  emulator::Memory& memory = emulator::Memory::Instance();
  if (!emulator::ValidDevice(destination_device) || !emulator::ValidDevice(source_device) ||
      !memory.IsDevice(destination, bytes) || !memory.IsDevice(source, bytes)) {
    return SetLastError(cudaErrorInvalidValue);
  }
  emulator::Enqueue(stream,
                    [destination, source, bytes] { std::memcpy(destination, source, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* destination, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!emulator::Memory::Instance().IsDevice(destination, bytes)) {
    return SetLastError(cudaErrorInvalidValue);
  }
  emulator::Enqueue(stream,
                    [destination, value, bytes] { std::memset(destination, value, bytes); });
  return cudaSuccess;
}
