// Shared memory (Triton's shared-memory extensions): clients on the same host register memory
// under a name, then name it in inference requests instead of sending tensor bytes through the
// socket. Two kinds, one namespace of names (as in Triton):
//  - system: a POSIX shared-memory object (shm_open's key), which the server opens itself and
//    reads and writes through its descriptor (pread, pwrite), never through a mapping: the
//    client may truncate the object at any time, and a mapping's pages past the object's end
//    would kill the whole process (SIGBUS) when touched, where pread and pwrite only come up
//    short (the request gets an error that says so);
//  - CUDA: device memory of the client's, named by a CUDA IPC handle, which the server opens
//    (engine::SharedDeviceMemory) and copies tensors out of and into.
// The server's descriptor (or device mapping) is owned by the registry until the region is
// unregistered and by every request still using it until that request has answered, so a region
// is never closed under a running request. The client keeps owning the memory (the server never
// unlinks or frees it).
//
// Protocol-neutral: HTTP and gRPC share one registry (a region registered through either is
// usable from both, as in Triton) and map its Status codes to their own.
//
// Thread-safety: SharedMemoryRegistry is thread-safe. A SharedMemoryRegion is immutable once
// made; its bytes are shared with the client, which must not change them while a request that
// names them runs (as with Triton).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "orochi/base/status.h"

namespace orochi::engine {
class SharedDeviceMemory;
}  // namespace orochi::engine

namespace orochi::server::kserve {

enum class SharedMemoryKind { kSystem, kCuda };

// One registered region: a system region is bytes [offset, offset + byte_size) of the object
// `key`, opened read-write; a CUDA region the first byte_size bytes of a client's device
// allocation on device `device_id`. Closed when the last reference goes.
class SharedMemoryRegion {
 public:
  ~SharedMemoryRegion();
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  SharedMemoryKind kind() const { return kind_; }
  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }   // system
  uint64_t offset() const { return offset_; }       // system: within the object
  int64_t device_id() const { return device_id_; }  // CUDA
  uint64_t byte_size() const { return byte_size_; }

  // An InvalidArgument naming the region, `what` (e.g. "input 'x'"), the offset and the size
  // when [offset, offset + size) does not lie in the region.
  Status CheckRange(uint64_t offset, uint64_t size, std::string_view what) const;
  // CheckRange, and for a system region also that its object still holds those bytes now: an
  // InvalidArgument naming the region, how many bytes it holds now and what `what` needs, when
  // the client truncated the object since it registered the region.
  Status CheckHeld(uint64_t offset, uint64_t size, std::string_view what) const;
  // Copies the `size` bytes at `offset` into `to` (host memory): read from a system region's
  // object, copied from a CUDA region's device memory. CheckRange's error; CheckHeld's when the
  // object ends before them (it was truncated, however recently); the device's.
  Status ReadInto(uint64_t offset, uint64_t size, std::string_view what, std::byte* to) const;
  // Writes `bytes` at `offset`, after CheckHeld. A system region's object truncated between
  // that check and the write grows back to hold what is written (pwrite extends a file; it
  // never grows past the region's registered end).
  Status Write(uint64_t offset, std::span<const std::byte> bytes, std::string_view what) const;

 private:
  friend class SharedMemoryRegistry;
  SharedMemoryRegion(std::string name, std::string key, uint64_t offset, uint64_t byte_size,
                     int fd);
  SharedMemoryRegion(std::string name, int64_t device_id, uint64_t byte_size,
                     std::unique_ptr<engine::SharedDeviceMemory> device_memory);

  SharedMemoryKind kind_;
  std::string name_;
  std::string key_;
  uint64_t offset_ = 0;
  int64_t device_id_ = -1;
  uint64_t byte_size_;
  // The object's size now (fstat's error for `what`).
  Result<uint64_t> ObjectSize(std::string_view what) const;
  // The error for `what`, which needs `size` bytes at `offset`, when the region's object has
  // only `object_size` bytes.
  Status NotHeld(uint64_t object_size, uint64_t offset, uint64_t size, std::string_view what) const;

  int fd_ = -1;  // system: the object, open read-write
  std::unique_ptr<engine::SharedDeviceMemory> device_memory_;  // CUDA
};

struct SharedMemoryRegionStatus {
  std::string name;
  std::string key;         // system
  uint64_t offset = 0;     // system
  int64_t device_id = -1;  // CUDA
  uint64_t byte_size = 0;
};

class SharedMemoryRegistry {
 public:
  // `enabled` false refuses every registration (kFailedPrecondition, saying how to enable
  // it): reading and writing any object the server's user can open, or another process's
  // device memory, is a power to give only clients that the operator trusts with it.
  explicit SharedMemoryRegistry(bool enabled) : enabled_(enabled) {}
  // Closes every region that no request is using; the others go when their requests answer.
  ~SharedMemoryRegistry() = default;
  SharedMemoryRegistry(const SharedMemoryRegistry&) = delete;
  SharedMemoryRegistry& operator=(const SharedMemoryRegistry&) = delete;

  bool enabled() const { return enabled_; }

  // Opens the object `key` and registers its bytes [offset, offset + byte_size) as `name`. Errors:
  // kAlreadyExists for a name already registered; kInvalidArgument for an empty name or key,
  // a zero byte_size, a key that does not name an object the server can open read-write, or
  // a region that runs past the object's end; kFailedPrecondition when disabled;
  // kResourceExhausted when a quarter of the process's descriptor limit (RLIMIT_NOFILE) is
  // open for system regions already (each keeps one).
  Status Register(const std::string& name, const std::string& key, uint64_t offset,
                  uint64_t byte_size);
  // Opens the device allocation `raw_handle` (a cudaIpcMemHandle_t's bytes) names on CUDA device
  // `device_id` as the region `name` of `byte_size` bytes. Errors: as Register's for the name
  // and size; kInvalidArgument for a device this server does not have, a handle of the wrong
  // size or one the driver refuses.
  Status RegisterCuda(const std::string& name, std::string_view raw_handle, int64_t device_id,
                      uint64_t byte_size);
  // Forgets `name` if it is a region of `kind`; requests already using it keep it open
  // until they answer. A name that is not registered is no error (as in Triton: the region is
  // not registered after either way), so clients may unregister as cleanup.
  void Unregister(const std::string& name, SharedMemoryKind kind);
  void UnregisterAll(SharedMemoryKind kind);

  // Every region of `kind` (sorted by name), or the one named: kNotFound when it is not
  // registered as that kind.
  Result<std::vector<SharedMemoryRegionStatus>> Describe(const std::optional<std::string>& name,
                                                         SharedMemoryKind kind) const;

  // The region `name` of either kind, held for as long as the caller keeps it: kNotFound
  // ("unable to find shared memory region: 'x'", Triton's wording) when it is not registered.
  Result<std::shared_ptr<const SharedMemoryRegion>> Find(const std::string& name) const;

 private:
  // Adds `region` unless its name is taken (kAlreadyExists).
  Status Add(std::shared_ptr<const SharedMemoryRegion> region);
  Status CheckNewRegion(const std::string& name, uint64_t byte_size, std::string_view kind) const;
  // kResourceExhausted when the system regions hold as many descriptors as they may.
  Status CheckDescriptorsLeft(const std::string& what) const;

  const bool enabled_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const SharedMemoryRegion>> regions_;
};

}  // namespace orochi::server::kserve
