// Storage: a refcounted block of memory that tensors view.
//
// Ownership: a Storage is owned by the StoragePtrs that refer to it and freed by the engine when
// the last one goes. All allocation, refcounting and freeing happen in the engine library
// itself (never in inline code), so a tensor made inside one interpreter copy stays valid after
// that copy is unloaded.
//
// Thread-safety: StoragePtr copies and destruction are thread-safe (atomic refcount). The bytes
// are not synchronised: concurrent writers must coordinate. Read-only storages (memory-mapped
// files) are safe to read from any number of threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "orochi/base/status.h"
#include "orochi/engine/device.h"
#include "orochi/engine/export.h"

namespace orochi::engine {

class StoragePtr;

// Releases memory lent to a borrowed Storage; called exactly once, with the context given.
using BorrowRelease = void (*)(void* context);

// Freed CPU blocks of 1 MiB and more are kept for reuse, up to this many bytes in all (512 MiB
// by default); 0 turns the cache off. Thread-safe.
OROCHI_ENGINE_API void SetCpuCacheLimit(size_t bytes);
OROCHI_ENGINE_API size_t CpuCacheLimit();
OROCHI_ENGINE_API size_t CpuCachedBytes();
// Frees every cached block (the limit stays).
OROCHI_ENGINE_API void EmptyCpuCache();

class OROCHI_ENGINE_API Storage {
 public:
  // Uninitialised memory for `bytes` bytes: 64-byte aligned on the CPU; on a CUDA device from
  // the device's caching allocator, ordered on the calling thread's stream (see device.h).
  // Throws Error if the device is unavailable or out of memory.
  static StoragePtr Allocate(size_t bytes, Device device = {});
  // A read-only map of the whole file at `path`: nothing is read
  // until it is touched, and all views of the same region share the page cache.
  static Result<StoragePtr> MapFile(const std::string& path);

  // Views `size` bytes at `data` that the engine does not own (a Python buffer, a request body).
  // When the last reference goes, the engine calls `release(context)` on whichever thread drops
  // it. Borrowed storage belongs to its lender: code that hands tensors across interpreter
  // copies copies it first (see borrowed()), because its release function may live in a copy.
  static StoragePtr Borrow(std::byte* data, size_t size, bool read_only, BorrowRelease release,
                           void* context);

  // Makes this storage read-only for good (e.g. weights copied out of a misaligned file).
  void MarkReadOnly() { read_only_ = true; }

  // For Tensor::To: the read-only copy of bytes [begin, end) of this read-only storage on
  // `device`. The first call makes it with `upload(bytes, size, device)`; later calls, from any
  // thread, share it, and it lives as long as this storage. So weights that every interpreter
  // copy moves to a GPU are uploaded once.
  using Upload = StoragePtr (*)(const std::byte* bytes, size_t size, Device device);
  StoragePtr DeviceReplica(Device device, size_t begin, size_t end, Upload upload);

  // For kernels that read read-only bytes in a layout of their own (oneDNN's blocked conv
  // weights): the object `prepare()` made for `key` on the first call, shared by every later
  // call with that key from any thread and freed with this storage. Weights are prepared once
  // per storage, so every interpreter copy uses the one prepared layout. `prepare` runs without
  // the lock held: two first calls racing may both prepare, and the first to finish is kept.
  using Prepared = std::shared_ptr<const void>;
  Prepared PreparedLayout(const std::string& key, const std::function<Prepared()>& prepare);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  const std::byte* data() const { return data_; }
  std::byte* mutable_data() { return data_; }  // precondition: !read_only()
  size_t size() const { return size_; }
  bool read_only() const { return read_only_; }
  bool borrowed() const { return kind_ == Kind::kBorrowed; }
  // Where the bytes are. On a CUDA device data() is a device address: only kernels of that
  // device may dereference it (Tensor::RequireCpu guards host reads).
  Device device() const { return device_; }
  // The device allocator's handle of this block (null on the CPU), for device libraries only.
  void* device_block() const { return kind_ == Kind::kDevice ? release_context_ : nullptr; }

 private:
  friend class StoragePtr;

  // kDevice memory is returned with release_(release_context_), like kBorrowed memory. kInline
  // bytes follow the Storage object in one heap block (small CPU tensors: one malloc).
  enum class Kind : uint8_t { kOwned, kInline, kMapped, kBorrowed, kDevice };
  Storage(Kind kind, std::byte* data, size_t size, bool read_only, Device device = {});
  ~Storage();
  void Retain();
  void Release();

  struct DeviceReplicas;                // storage.cpp
  DeviceReplicas* replicas_ = nullptr;  // made by DeviceReplica
  std::atomic<int64_t> references_{1};
  Kind kind_;
  BorrowRelease release_ = nullptr;  // kBorrowed and kDevice only
  void* release_context_ = nullptr;
  std::byte* data_;
  size_t size_;
  bool read_only_;
  Device device_;
};

// A counted reference to a Storage. Copying is cheap and thread-safe.
class OROCHI_ENGINE_API StoragePtr {
 public:
  StoragePtr() = default;
  StoragePtr(const StoragePtr& other);
  StoragePtr(StoragePtr&& other) noexcept : storage_(std::exchange(other.storage_, nullptr)) {}
  StoragePtr& operator=(StoragePtr other) noexcept {
    std::swap(storage_, other.storage_);
    return *this;
  }
  ~StoragePtr();

  Storage* get() const { return storage_; }
  Storage* operator->() const { return storage_; }
  explicit operator bool() const { return storage_ != nullptr; }
  // How many StoragePtrs share this storage (for tests and diagnostics).
  int64_t use_count() const;

 private:
  friend class Storage;
  explicit StoragePtr(Storage* adopted) : storage_(adopted) {}
  Storage* storage_ = nullptr;
};

}  // namespace orochi::engine
