// System shared memory (Triton's shared-memory extension): clients on the same host register a
// POSIX shared-memory object (shm_open's key) under a name, then name it in inference requests
// instead of sending tensor bytes through the socket. The server maps each region itself: the
// mapping is the server's, owned by the registry until the region is unregistered and by every
// request still using it until that request has answered, so a region is never unmapped under a
// running request. The client keeps owning the object (the server never unlinks it).
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
#include <string>
#include <string_view>
#include <vector>

#include "orochi/base/status.h"

namespace orochi::server::kserve {

// One registered region: bytes [offset, offset + byte_size) of the object `key`, mapped
// read-write. Unmapped when the last reference goes.
class SharedMemoryRegion {
 public:
  ~SharedMemoryRegion();
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  uint64_t offset() const { return offset_; }  // within the object
  uint64_t byte_size() const { return byte_size_; }

  // The `size` bytes at `offset` within the region, for `what` (e.g. "input 'x'"): an
  // InvalidArgument naming the region, the offset and the size when they do not lie in it.
  Result<std::byte*> Slice(uint64_t offset, uint64_t size, std::string_view what) const;

 private:
  friend class SharedMemoryRegistry;
  SharedMemoryRegion(std::string name, std::string key, uint64_t offset, uint64_t byte_size,
                     void* mapping, size_t mapping_size, std::byte* data);

  std::string name_;
  std::string key_;
  uint64_t offset_;
  uint64_t byte_size_;
  void* mapping_;  // from mmap: page-aligned, so it may start before `offset`
  size_t mapping_size_;
  std::byte* data_;  // the region's first byte, within the mapping
};

struct SharedMemoryRegionStatus {
  std::string name;
  std::string key;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

class SharedMemoryRegistry {
 public:
  // `enabled` false refuses every registration (kFailedPrecondition, saying how to enable
  // it): mapping any object the server's user can open is a power to give only clients that
  // the operator trusts with it.
  explicit SharedMemoryRegistry(bool enabled) : enabled_(enabled) {}
  // Unmaps every region that no request is using; the others go when their requests answer.
  ~SharedMemoryRegistry() = default;
  SharedMemoryRegistry(const SharedMemoryRegistry&) = delete;
  SharedMemoryRegistry& operator=(const SharedMemoryRegistry&) = delete;

  bool enabled() const { return enabled_; }

  // Maps bytes [offset, offset + byte_size) of the object `key` under `name`. Errors:
  // kAlreadyExists for a name already registered; kInvalidArgument for an empty name or key,
  // a zero byte_size, a key that does not name an object the server can open read-write, or
  // a region that runs past the object's end; kFailedPrecondition when disabled.
  Status Register(const std::string& name, const std::string& key, uint64_t offset,
                  uint64_t byte_size);
  // Forgets `name`; requests already using it keep their mapping until they answer. A name
  // that is not registered is no error (as in Triton: the region is not registered after
  // either way), so clients may unregister as cleanup.
  void Unregister(const std::string& name);
  void UnregisterAll();

  // Every region (sorted by name), or the one named: kNotFound when it is not registered.
  Result<std::vector<SharedMemoryRegionStatus>> Describe(
      const std::optional<std::string>& name) const;

  // The region `name`, held for as long as the caller keeps it: kNotFound ("unable to find
  // system shared memory region: 'x'", Triton's wording) when it is not registered.
  Result<std::shared_ptr<const SharedMemoryRegion>> Find(const std::string& name) const;

 private:
  const bool enabled_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const SharedMemoryRegion>> regions_;
};

}  // namespace orochi::server::kserve
