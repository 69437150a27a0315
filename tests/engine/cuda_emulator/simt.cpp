// Runs kernels: a grid's blocks one after another, each CUDA thread of a block a fiber on the
// stream's worker thread. A fiber runs until it finishes or waits at a
// barrier; the scheduler lets waiting fibers go once every thread the barrier waits for is
// there, and stops the process when none can run while some wait (a divergent barrier).
#include <sys/mman.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(OROCHI_EMULATOR_THREAD_SANITIZER)
#include <sanitizer/tsan_interface.h>
#include <sched.h>

#include <atomic>
// ThreadSanitizer's (legacy, still exported) annotation that a range is new memory.
extern "C" void AnnotateNewMemory(const char* file, int line, const volatile void* memory,
                                  size_t bytes);
#endif
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "emulator_internal.h"

namespace orochi::cuda_emulator {
namespace {

constexpr unsigned kWarpSize = 32;
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr size_t kStackBytes = size_t{128} << 10;

// --- switching between fibers -------------------------------------------------------------------
// glibc's swapcontext saves and restores the signal mask with a system call on every switch,
// which made kernels several times slower to emulate; on x86-64 a switch keeps only what the ABI
// says a call preserves.

#if defined(__x86_64__)

extern "C" void orochi_emulator_switch(void** save_stack, void* load_stack);
asm(R"(
  .text
  .globl orochi_emulator_switch
  .hidden orochi_emulator_switch
  .type orochi_emulator_switch, @function
orochi_emulator_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size orochi_emulator_switch, .-orochi_emulator_switch
)");

struct Context {
  void* stack_pointer = nullptr;
};

void Switch(Context& from, Context& to) {
  orochi_emulator_switch(&from.stack_pointer, to.stack_pointer);
}

// Lays out `stack` as orochi_emulator_switch leaves a suspended one, so that switching to it
// "returns" into `entry` with the stack aligned as after a call. `entry` must never return.
void Prepare(Context& context, void* stack, size_t bytes, void (*entry)()) {
  char* end = static_cast<char*>(stack) + bytes;
  end -= reinterpret_cast<uintptr_t>(end) % 16;
  auto* top = reinterpret_cast<uint64_t*>(end);
  top[-1] = 0;                                           // entry's return address: none
  top[-2] = reinterpret_cast<uint64_t>(entry);           // where the switch's ret goes
  for (int slot = 3; slot <= 8; ++slot) top[-slot] = 0;  // rbp, rbx, r12-r15
  top[-9] = 0x037fULL << 32 | 0x1f80;                    // x87 control word, MXCSR: defaults
  context.stack_pointer = top - 9;
}

#else

struct Context {
  ucontext_t context{};
};

void Switch(Context& from, Context& to) { swapcontext(&from.context, &to.context); }

void Prepare(Context& context, void* stack, size_t bytes, void (*entry)()) {
  getcontext(&context.context);
  context.context.uc_stack.ss_sp = stack;
  context.context.uc_stack.ss_size = bytes;
  context.context.uc_link = nullptr;
  makecontext(&context.context, entry, 0);
}

#endif

// AddressSanitizer tracks which stack code runs on (for its stack checks and for frames it must
// forget when a function does not return); it is told of every switch between stacks.
#if defined(__SANITIZE_ADDRESS__)
void StartSwitch(void** saved_fake_stack, const void* stack_bottom, size_t stack_bytes) {
  __sanitizer_start_switch_fiber(saved_fake_stack, stack_bottom, stack_bytes);
}
void FinishSwitch(void* fake_stack, const void** from_bottom, size_t* from_bytes) {
  __sanitizer_finish_switch_fiber(fake_stack, from_bottom, from_bytes);
}
#else
void StartSwitch(void** /*saved_fake_stack*/, const void* /*stack_bottom*/,
                 size_t /*stack_bytes*/) {}
void FinishSwitch(void* /*fake_stack*/, const void** /*from_bottom*/, size_t* /*from_bytes*/) {}
#endif

// --- blocks
// ---------------------------------------------------------------------------------------

enum class FiberState { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

const char* StateName(FiberState state) {
  switch (state) {
    case FiberState::kRunnable:
      return "running";
    case FiberState::kAtBlockBarrier:
      return "at __syncthreads";
    case FiberState::kAtWarpBarrier:
      return "at a warp shuffle";
    case FiberState::kDone:
      return "finished";
  }
  return "?";
}

struct Fiber {
  Context context;
  FiberState state = FiberState::kRunnable;
  ThreadPosition position{};
  unsigned block_barriers_passed = 0;
  unsigned warp_barriers_passed = 0;
};

// What the fibers of the kernel running on this thread share: one per worker thread (a
// stream's), so kernels on different streams run at the same time, as on a GPU.
struct Scheduler {
  Scheduler() = default;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;
  ~Scheduler();

  Context scheduler_context;
  // The stack the scheduler runs on: the worker thread's (for AddressSanitizer).
  const void* scheduler_stack = nullptr;
  size_t scheduler_stack_bytes = 0;
  std::vector<void*> stacks;  // kept for later kernels: mapping them is the slow part
  std::vector<Fiber> fibers;  // of the running block; fibers[i] is thread i
  Fiber* current = nullptr;
  const std::function<void()>* body = nullptr;
  std::vector<std::array<unsigned char, 16>> lanes;  // shuffle deposits, one per thread
  const char* kernel_name = nullptr;
  SharedArrays shared;  // of the running kernel's module, where known
#if defined(OROCHI_EMULATOR_THREAD_SANITIZER)
  void* scheduler_fiber = nullptr;  // ThreadSanitizer's state of the worker thread itself
  std::vector<void*> warp_fibers;   // ThreadSanitizer's state of each warp
  // The scheduler releases block_start and the fibers acquire it as they start; the fibers
  // release block_end as they finish and the scheduler acquires it once all have.
  char block_start = 0;
  char block_end = 0;
  // Per block, so that blocks do not order each other through them: two for __syncthreads, two
  // for each warp's shuffles, used by turns, so that a thread already past a barrier does not
  // order a thread still leaving the one before.
  std::unique_ptr<char[]> barriers;
#endif
};

Scheduler& TheScheduler() {
  // Asked on every threadIdx and blockIdx: the initial-exec model reads a fixed offset from the
  // thread pointer, where the general one calls __tls_get_addr (which ThreadSanitizer intercepts).
  static thread_local Scheduler* known __attribute__((tls_model("initial-exec"))) = nullptr;
  if (known == nullptr) {
    thread_local Scheduler scheduler;
    known = &scheduler;
  }
  return *known;
}

// --- ThreadSanitizer as racecheck ---------------------------------------------------------------
// Built with OROCHI_SANITIZER=thread, the kernels are instrumented (this file is not, so that the
// scheduler's bookkeeping is not taken for theirs), every warp is a ThreadSanitizer fiber, a
// thread to it, and switching between fibers orders nothing. The only happens-before edges are
// the ones CUDA guarantees, so warps of a kernel touching the same memory without a barrier
// between them, or kernels on two streams without an event between them, are reported as data
// races:
//  - a block's threads start after the work before the kernel on its stream, and the work after
//    it on the stream starts after every thread has finished;
//  - a barrier orders what each of its threads did before it against what all of them do after
//    (release on arrival, acquire on leaving);
//  - blocks run one after another, ordered like the start and end of a kernel: stronger than
//    CUDA, whose blocks are unordered, so races between blocks go unseen;
//  - a block's __shared__ arrays start without a history (simt.h), and kernels take turns with
//    a lock ThreadSanitizer does not see, which orders nothing.
// Races between the lanes of one warp go unseen too: a fiber per CUDA thread would find them, but
// this ThreadSanitizer's cost grows with the number of threads it has ever seen, and lanes mostly
// exchange values through shuffles.
#if defined(OROCHI_EMULATOR_THREAD_SANITIZER)
// A stream's kernels run in order, so warp w of each can be the same fiber: fibers are made once
// per worker thread and kept.
void RaceLaunchStarts(Scheduler& scheduler, unsigned threads) {
  scheduler.scheduler_fiber = __tsan_get_current_fiber();
  while (scheduler.warp_fibers.size() < (threads + kWarpSize - 1) / kWarpSize) {
    scheduler.warp_fibers.push_back(__tsan_create_fiber(0));
  }
}
void RaceForget(Scheduler& scheduler) {
  for (void* fiber : scheduler.warp_fibers) __tsan_destroy_fiber(fiber);
}
void RaceBlockStarts(Scheduler& scheduler, unsigned threads) {
  if (scheduler.shared.bytes > 0) {
    AnnotateNewMemory(__FILE__, __LINE__, scheduler.shared.begin, scheduler.shared.bytes);
  }
  scheduler.barriers = std::make_unique<char[]>(2 * (1 + (threads + kWarpSize - 1) / kWarpSize));
  __tsan_release(&scheduler.block_start);
}
void RaceBlockEnds(Scheduler& scheduler) { __tsan_acquire(&scheduler.block_end); }
void RaceFiberStarts(Scheduler& scheduler) { __tsan_acquire(&scheduler.block_start); }
void* RaceTokenOf(Scheduler& scheduler, FiberState waiting) {
  const Fiber& fiber = *scheduler.current;
  if (waiting == FiberState::kDone) return &scheduler.block_end;
  if (waiting == FiberState::kAtBlockBarrier) {
    return &scheduler.barriers[fiber.block_barriers_passed % 2];
  }
  const unsigned warp = fiber.position.thread.x / kWarpSize;
  return &scheduler.barriers[2 * (1 + warp) + fiber.warp_barriers_passed % 2];
}
void RaceArrives(Scheduler& scheduler, FiberState waiting) {
  __tsan_release(RaceTokenOf(scheduler, waiting));
}
void RaceLeaves(Scheduler& scheduler, FiberState waited) {
  __tsan_acquire(RaceTokenOf(scheduler, waited));
}
void RaceSwitchesToFiber(Scheduler& scheduler, size_t thread) {
  __tsan_switch_to_fiber(scheduler.warp_fibers[thread / kWarpSize], __tsan_switch_to_fiber_no_sync);
}
void RaceSwitchesToScheduler(Scheduler& scheduler) {
  __tsan_switch_to_fiber(scheduler.scheduler_fiber, __tsan_switch_to_fiber_no_sync);
}
#else
void RaceLaunchStarts(Scheduler& /*scheduler*/, unsigned /*threads*/) {}
void RaceForget(Scheduler& /*scheduler*/) {}
void RaceBlockStarts(Scheduler& /*scheduler*/, unsigned /*threads*/) {}
void RaceBlockEnds(Scheduler& /*scheduler*/) {}
void RaceFiberStarts(Scheduler& /*scheduler*/) {}
void RaceArrives(Scheduler& /*scheduler*/, FiberState /*waiting*/) {}
void RaceLeaves(Scheduler& /*scheduler*/, FiberState /*waited*/) {}
void RaceSwitchesToFiber(Scheduler& /*scheduler*/, size_t /*thread*/) {}
void RaceSwitchesToScheduler(Scheduler& /*scheduler*/) {}
#endif

// Under the sanitizers __shared__ arrays are statics of the process (simt.h): one kernel runs at
// a time. Otherwise they are per worker thread, and kernels on different streams run at once.
#if defined(__SANITIZE_ADDRESS__)
std::unique_lock<std::mutex> SharedMemoryTurn() {
  static std::mutex turn;
  return std::unique_lock(turn);
}
#elif defined(OROCHI_EMULATOR_THREAD_SANITIZER)
// A mutex would order every kernel after the one before it, whatever their streams: a spin lock
// in this uninstrumented file orders nothing that ThreadSanitizer sees.
class InvisibleLock {
 public:
  void lock() {
    while (held_.test_and_set(std::memory_order_acquire)) sched_yield();
  }
  void unlock() { held_.clear(std::memory_order_release); }

 private:
  std::atomic_flag held_ = ATOMIC_FLAG_INIT;
};
std::unique_lock<InvisibleLock> SharedMemoryTurn() {
  static InvisibleLock turn;
  return std::unique_lock(turn);
}
#else
std::unique_lock<std::mutex> SharedMemoryTurn() { return {}; }
#endif

[[noreturn]] void KernelFault(const std::string& problem) {
  Scheduler& scheduler = TheScheduler();
  const ThreadPosition& position =
      scheduler.current != nullptr ? scheduler.current->position : ThreadPosition{};
  std::fprintf(stderr, "cuda emulator: kernel %s, block %u, thread %u: %s\n",
               scheduler.kernel_name != nullptr ? scheduler.kernel_name : "?", position.block.x,
               position.thread.x, problem.c_str());
  std::abort();
}

// kStackBytes above an inaccessible guard page.
void* NewStack() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* mapping = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapping == MAP_FAILED) KernelFault("cannot map a fiber stack");
  mprotect(mapping, page, PROT_NONE);  // an overflowing fiber faults instead of corrupting
  return static_cast<char*>(mapping) + page;
}

Scheduler::~Scheduler() {
  RaceForget(*this);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (void* stack : stacks) munmap(static_cast<char*>(stack) - page, kStackBytes + page);
}

// From the running fiber to the scheduler; a finished fiber is never resumed.
void SwitchToScheduler(FiberState state) {
  Scheduler& scheduler = TheScheduler();
  Fiber* fiber = scheduler.current;
  fiber->state = state;
  RaceArrives(scheduler, state);
  void* fake_stack = nullptr;
  StartSwitch(state == FiberState::kDone ? nullptr : &fake_stack, scheduler.scheduler_stack,
              scheduler.scheduler_stack_bytes);
  RaceSwitchesToScheduler(scheduler);
  Switch(fiber->context, scheduler.scheduler_context);
  FinishSwitch(fake_stack, &scheduler.scheduler_stack, &scheduler.scheduler_stack_bytes);
  RaceLeaves(scheduler, state);
  if (state == FiberState::kAtBlockBarrier) ++fiber->block_barriers_passed;
  if (state == FiberState::kAtWarpBarrier) ++fiber->warp_barriers_passed;
}

[[noreturn]] void FiberEntry() {
  Scheduler& scheduler = TheScheduler();
  FinishSwitch(nullptr, &scheduler.scheduler_stack, &scheduler.scheduler_stack_bytes);
  RaceFiberStarts(scheduler);
  (*scheduler.body)();
  SwitchToScheduler(FiberState::kDone);
  __builtin_unreachable();
}

std::string DescribeWaits(const std::vector<Fiber>& fibers) {
  std::string text;
  for (size_t i = 0; i < fibers.size(); ++i) {
    if (i > 0 && fibers[i].state == fibers[i - 1].state) continue;
    size_t last = i;
    while (last + 1 < fibers.size() && fibers[last + 1].state == fibers[i].state) ++last;
    text += "\n  threads " + std::to_string(i) + "-" + std::to_string(last) + " " +
            StateName(fibers[i].state);
  }
  return text;
}

// Lets waiting fibers go where every thread their barrier waits for has arrived; false if none.
bool ReleaseBarriers(std::vector<Fiber>& fibers) {
  bool released = false;
  for (size_t first = 0; first < fibers.size(); first += kWarpSize) {
    const size_t end = std::min(fibers.size(), first + kWarpSize);
    bool all_waiting = true;
    for (size_t i = first; i < end; ++i) {
      all_waiting = all_waiting && fibers[i].state == FiberState::kAtWarpBarrier;
    }
    if (!all_waiting) continue;
    for (size_t i = first; i < end; ++i) fibers[i].state = FiberState::kRunnable;
    released = true;
  }
  if (released) return true;
  for (const Fiber& fiber : fibers) {
    if (fiber.state != FiberState::kAtBlockBarrier) return false;
  }
  for (Fiber& fiber : fibers) fiber.state = FiberState::kRunnable;
  return true;
}

void RunBlock(Scheduler& scheduler, dim3 grid, dim3 block, unsigned block_index) {
  const unsigned threads = block.x;
  while (scheduler.stacks.size() < threads) scheduler.stacks.push_back(NewStack());
  if (scheduler.lanes.size() < threads) scheduler.lanes.resize(threads);
  scheduler.fibers.assign(threads, Fiber{});
  RaceBlockStarts(scheduler, threads);
  for (unsigned i = 0; i < threads; ++i) {
    Fiber& fiber = scheduler.fibers[i];
    fiber.position = {{i, 0, 0}, {block_index, 0, 0}, block, grid};
    Prepare(fiber.context, scheduler.stacks[i], kStackBytes, FiberEntry);
  }
  std::vector<Fiber>& fibers = scheduler.fibers;
  for (;;) {
    bool ran = false;
    for (size_t i = 0; i < fibers.size(); ++i) {
      Fiber& fiber = fibers[i];
      if (fiber.state != FiberState::kRunnable) continue;
      scheduler.current = &fiber;
      void* fake_stack = nullptr;
      StartSwitch(&fake_stack, scheduler.stacks[i], kStackBytes);
      RaceSwitchesToFiber(scheduler, i);
      Switch(scheduler.scheduler_context, fiber.context);
      FinishSwitch(fake_stack, nullptr, nullptr);
      ran = true;
    }
    scheduler.current = nullptr;
    bool all_done = true;
    for (const Fiber& fiber : fibers) all_done = all_done && fiber.state == FiberState::kDone;
    if (all_done) {
      RaceBlockEnds(scheduler);
      return;
    }
    if (!ReleaseBarriers(fibers) && !ran) {
      KernelFault("a barrier that not every thread it waits for reaches (the GPU would hang):" +
                  DescribeWaits(fibers));
    }
  }
}

}  // namespace

const ThreadPosition& Position() {
  Scheduler& scheduler = TheScheduler();
  if (scheduler.current == nullptr) {
    std::fprintf(stderr, "cuda emulator: a thread position was read outside a kernel\n");
    std::abort();
  }
  return scheduler.current->position;
}

void SyncThreads() { SwitchToScheduler(FiberState::kAtBlockBarrier); }

void ShuffleXor(const void* mine, void* result, size_t bytes, int lane_mask, int width) {
  Scheduler& scheduler = TheScheduler();
  const ThreadPosition& position = Position();
  const unsigned thread = position.thread.x;
  const unsigned warp_first = thread / kWarpSize * kWarpSize;
  if (warp_first + kWarpSize > position.block_dim.x) {
    KernelFault("a full-warp shuffle in a warp of fewer than 32 threads");
  }
  if (width < 1 || width > static_cast<int>(kWarpSize) || (width & (width - 1)) != 0) {
    KernelFault("a shuffle width that is not a power of two up to 32");
  }
  std::memcpy(scheduler.lanes[thread].data(), mine, bytes);
  SwitchToScheduler(FiberState::kAtWarpBarrier);  // every lane has deposited
  const unsigned lane = thread - warp_first;
  unsigned source = lane ^ static_cast<unsigned>(lane_mask);
  // A lane of a later group of `width` is out of reach: the caller keeps its own value.
  if (source >= kWarpSize || source / width > lane / width) source = lane;
  std::memcpy(result, scheduler.lanes[warp_first + source].data(), bytes);
  SwitchToScheduler(FiberState::kAtWarpBarrier);  // every lane has read before the next deposit
}

cudaError_t LaunchKernel(const char* name, dim3 grid, dim3 block, cudaStream_t stream,
                         const std::vector<const void*>& pointers, SharedArrays shared,
                         std::function<void()> body) {
  const bool valid = grid.x >= 1 && grid.x <= 0x7fffffffU && grid.y == 1 && grid.z == 1 &&
                     block.x >= 1 && block.x <= kMaxThreadsPerBlock && block.y == 1 && block.z == 1;
  if (!valid) return SetLastError(cudaErrorInvalidConfiguration);
  if (cudaError_t error = CheckKernelStream(stream); error != cudaSuccess) {
    return SetLastError(error);
  }
  const int device = DeviceOfStream(stream);
  for (const void* pointer : pointers) {
    if (pointer == nullptr) continue;
    const int owner = DeviceOfPointer(pointer);
    if (owner == device) continue;
    std::fprintf(stderr, "cuda emulator: kernel %s on cuda:%d is given %p, %s\n", name, device,
                 pointer,
                 owner < 0 ? "which is not device memory"
                           : ("memory of cuda:" + std::to_string(owner)).c_str());
    std::abort();
  }
  Enqueue(stream, [name, grid, block, shared, body = std::move(body)] {
    auto turn = SharedMemoryTurn();
    Scheduler& scheduler = TheScheduler();
    scheduler.kernel_name = name;
    scheduler.shared = shared;
    scheduler.body = &body;
    RaceLaunchStarts(scheduler, block.x);
    for (unsigned b = 0; b < grid.x; ++b) {
      SetRunningKernel(name, b);
      RunBlock(scheduler, grid, block, b);
    }
    SetRunningKernel(nullptr, 0);
    scheduler.kernel_name = nullptr;
    scheduler.body = nullptr;
  });
  return cudaSuccess;
}

}  // namespace orochi::cuda_emulator
