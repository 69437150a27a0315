// The copy's private heap bookkeeping.
//
// CPython's finalization does not free everything it allocated (interned strings, static type
// caches, module state of built-in modules, ...). In a normal process that is harmless: the
// process exits. A copy is unloaded and replaced while the process lives on, so every block and
// arena the copy allocates is tracked here and released when the copy is unloaded.
//
// The interpreter library is linked with --wrap=malloc,calloc,realloc,free,strdup, so every call
// from CPython (and from this library) lands here; obmalloc's arenas come through the arena
// allocator installed below. A block handed to free() that libc allocated (realpath(), ...)
// has no header tag and goes straight to libc.
#include "copy_heap.h"

#include <Python.h>
#include <pthread.h>
#include <sanitizer/asan_interface.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <mutex>

extern "C" {
void* __real_malloc(size_t size);
void* __real_calloc(size_t count, size_t size);
void* __real_realloc(void* pointer, size_t size);
void __real_free(void* pointer);
}

namespace orochi::copy {
namespace {

constexpr uint64_t kBlockTag = 0x4f524f4348494845ULL;  // "OROCHIHE"

// Precedes every block; 32 bytes keep the caller's memory 16-byte aligned like malloc's.
struct alignas(16) BlockHeader {
  BlockHeader* previous;
  BlockHeader* next;
  size_t size;
  uint64_t tag;
};
static_assert(sizeof(BlockHeader) == 32);

struct Arena {
  Arena* next;
  void* address;
  size_t size;
};

struct Heap {
  std::mutex mutex;
  BlockHeader* blocks = nullptr;
  Arena* arenas = nullptr;
  size_t live_bytes = 0;
};

Heap& TheHeap() {
  static Heap heap;
  return heap;
}

void Link(Heap& heap, BlockHeader* header, size_t size) {
  header->size = size;
  header->tag = kBlockTag;
  header->previous = nullptr;
  header->next = heap.blocks;
  if (heap.blocks != nullptr) heap.blocks->previous = header;
  heap.blocks = header;
  heap.live_bytes += size;
}

void Unlink(Heap& heap, BlockHeader* header) {
  if (header->previous != nullptr) {
    header->previous->next = header->next;
  } else {
    heap.blocks = header->next;
  }
  if (header->next != nullptr) header->next->previous = header->previous;
  heap.live_bytes -= header->size;
  header->tag = 0;
}

// Reads the 8 bytes before `pointer`: for a block of libc's, the end of its chunk header, which
// never holds the tag. AddressSanitizer's malloc keeps a guard zone there instead, which the
// check asks about rather than read.
BlockHeader* HeaderOf(void* pointer) {
  auto* header = reinterpret_cast<BlockHeader*>(static_cast<char*>(pointer) - sizeof(BlockHeader));
#if defined(__SANITIZE_ADDRESS__)
  if (__asan_region_is_poisoned(&header->tag, sizeof(header->tag)) != nullptr) return nullptr;
#endif
  return header->tag == kBlockTag ? header : nullptr;
}

void* Track(void* raw, size_t size) {
  if (raw == nullptr) return nullptr;
  auto* header = static_cast<BlockHeader*>(raw);
  Heap& heap = TheHeap();
  std::lock_guard lock(heap.mutex);
  Link(heap, header, size);
  return header + 1;
}

void* AllocateArena(void* /*context*/, size_t size) {
  void* address = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (address == MAP_FAILED) return nullptr;
  auto* arena = static_cast<Arena*>(__real_malloc(sizeof(Arena)));
  if (arena == nullptr) {
    munmap(address, size);
    return nullptr;
  }
  Heap& heap = TheHeap();
  std::lock_guard lock(heap.mutex);
  *arena = {heap.arenas, address, size};
  heap.arenas = arena;
  return address;
}

void FreeArena(void* /*context*/, void* address, size_t size) {
  Heap& heap = TheHeap();
  {
    std::lock_guard lock(heap.mutex);
    for (Arena** link = &heap.arenas; *link != nullptr; link = &(*link)->next) {
      if ((*link)->address == address) {
        Arena* found = *link;
        *link = found->next;
        __real_free(found);
        break;
      }
    }
  }
  munmap(address, size);
}

void LockHeapForFork() { TheHeap().mutex.lock(); }
void UnlockHeapAfterFork() { TheHeap().mutex.unlock(); }

}  // namespace

void InstallHeapTracking() {
  // A fork while another thread holds the heap lock would leave the child's lock held forever;
  // the fork waits for the lock instead. (dlclose unregisters these handlers.)
  pthread_atfork(LockHeapForFork, UnlockHeapAfterFork, UnlockHeapAfterFork);
  PyObjectArenaAllocator allocator{nullptr, AllocateArena, FreeArena};
  PyObject_SetArenaAllocator(&allocator);
}

size_t ReleaseHeap() {
  Heap& heap = TheHeap();
  std::lock_guard lock(heap.mutex);
  size_t released = heap.live_bytes;
  while (heap.blocks != nullptr) {
    BlockHeader* header = heap.blocks;
    heap.blocks = header->next;
    header->tag = 0;
    __real_free(header);
  }
  while (heap.arenas != nullptr) {
    Arena* arena = heap.arenas;
    heap.arenas = arena->next;
    released += arena->size;
    munmap(arena->address, arena->size);
    __real_free(arena);
  }
  heap.live_bytes = 0;
  return released;
}

}  // namespace orochi::copy

using orochi::copy::BlockHeader;
using orochi::copy::HeaderOf;
using orochi::copy::TheHeap;
using orochi::copy::Track;

extern "C" {

void* __wrap_malloc(size_t size) {
  if (size > SIZE_MAX - sizeof(BlockHeader)) return nullptr;
  return Track(__real_malloc(sizeof(BlockHeader) + size), size);
}

void* __wrap_calloc(size_t count, size_t size) {
  if (size != 0 && count > (SIZE_MAX - sizeof(BlockHeader)) / size) return nullptr;
  size_t bytes = count * size;
  return Track(__real_calloc(1, sizeof(BlockHeader) + bytes), bytes);
}

void __wrap_free(void* pointer) {
  if (pointer == nullptr) return;
  BlockHeader* header = HeaderOf(pointer);
  if (header == nullptr) {
    __real_free(pointer);  // allocated by libc on the copy's behalf
    return;
  }
  {
    auto& heap = TheHeap();
    std::lock_guard lock(heap.mutex);
    orochi::copy::Unlink(heap, header);
  }
  __real_free(header);
}

// pybind11 names and documents each bound function with strdup() and frees the strings with
// free(); the records of methods of its classes outlive finalization, so their strings must be
// the copy's.
char* __wrap_strdup(const char* text) {
  size_t bytes = strlen(text) + 1;
  auto* copy = static_cast<char*>(__wrap_malloc(bytes));
  if (copy != nullptr) memcpy(copy, text, bytes);
  return copy;
}

void* __wrap_realloc(void* pointer, size_t size) {
  if (pointer == nullptr) return __wrap_malloc(size);
  BlockHeader* header = HeaderOf(pointer);
  if (header == nullptr) return __real_realloc(pointer, size);
  if (size > SIZE_MAX - sizeof(BlockHeader)) return nullptr;
  auto& heap = TheHeap();
  std::lock_guard lock(heap.mutex);
  size_t old_size = header->size;
  orochi::copy::Unlink(heap, header);
  auto* moved = static_cast<BlockHeader*>(__real_realloc(header, sizeof(BlockHeader) + size));
  if (moved == nullptr) {  // the old block is intact and still ours
    orochi::copy::Link(heap, header, old_size);
    return nullptr;
  }
  orochi::copy::Link(heap, moved, size);
  return moved + 1;
}

}  // extern "C"
