#include "orochi/engine/storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "device_backend.h"
#include "orochi/base/check.h"
#include "orochi/engine/device.h"
#include "orochi/engine/error.h"

namespace orochi::engine {
namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kLargeBlock = size_t{1} << 20;  // blocks from here up are cached
constexpr size_t kLargeGranule = size_t{2} << 20;
constexpr size_t kInlineBlock = 4096;  // blocks up to here share the Storage's allocation

// Freed large blocks, kept for reuse by size. A fresh large block comes from mmap, and every
// page of it faults on first touch; inference allocates the same sizes again and again, so
// reusing blocks removes most of that cost. Thread-safe; bounded by CpuCacheLimit().
class LargeBlockCache {
 public:
  static LargeBlockCache& Instance() {
    // In the engine library: one per process. Never destroyed, because storages may die during
    // the process's exit, after static destructors have run.
    static auto* cache = new LargeBlockCache;
    return *cache;
  }

  std::byte* Take(size_t bytes) {
    std::lock_guard lock(mutex_);
    auto found = blocks_.find(bytes);
    if (found == blocks_.end()) return nullptr;
    std::byte* block = found->second;
    blocks_.erase(found);
    cached_bytes_ -= bytes;
    return block;
  }

  // Keeps `block` unless that would pass the limit; false means the caller frees it.
  bool Give(std::byte* block, size_t bytes) {
    std::lock_guard lock(mutex_);
    if (cached_bytes_ + bytes > limit_) return false;
    blocks_.emplace(bytes, block);
    cached_bytes_ += bytes;
    return true;
  }

  void SetLimit(size_t bytes) {
    std::lock_guard lock(mutex_);
    limit_ = bytes;
    FreeAbove(limit_);
  }

  void Empty() {
    std::lock_guard lock(mutex_);
    FreeAbove(0);
  }

  size_t limit() {
    std::lock_guard lock(mutex_);
    return limit_;
  }

  size_t cached_bytes() {
    std::lock_guard lock(mutex_);
    return cached_bytes_;
  }

 private:
  // Frees the largest blocks until at most `bytes` are cached. Needs mutex_.
  void FreeAbove(size_t bytes) {
    while (cached_bytes_ > bytes && !blocks_.empty()) {
      auto largest = std::prev(blocks_.end());
      cached_bytes_ -= largest->first;
      std::free(largest->second);
      blocks_.erase(largest);
    }
  }

  std::mutex mutex_;
  std::multimap<size_t, std::byte*> blocks_;
  size_t cached_bytes_ = 0;
  size_t limit_ = size_t{512} << 20;
};

size_t RoundedSize(size_t bytes) {
  if (bytes >= kLargeBlock) return (bytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  return rounded == 0 ? kAlignment : rounded;
}

}  // namespace

void SetCpuCacheLimit(size_t bytes) { LargeBlockCache::Instance().SetLimit(bytes); }
size_t CpuCacheLimit() { return LargeBlockCache::Instance().limit(); }
size_t CpuCachedBytes() { return LargeBlockCache::Instance().cached_bytes(); }
void EmptyCpuCache() { LargeBlockCache::Instance().Empty(); }

Storage::Storage(Kind kind, std::byte* data, size_t size, bool read_only, Device device)
    : kind_(kind), data_(data), size_(size), read_only_(read_only), device_(device) {}

struct Storage::DeviceReplicas {
  struct Entry {
    Device device;
    size_t begin;
    size_t end;
    StoragePtr replica;
  };
  std::vector<Entry> entries;
  std::vector<std::pair<std::string, Prepared>> prepared;  // by PreparedLayout's key
};

namespace {
// Uploads of read-only storages are rare (model loading): one lock for all of them.
std::mutex& ReplicaMutex() {
  static std::mutex mutex;
  return mutex;
}
}  // namespace

StoragePtr Storage::DeviceReplica(Device device, size_t begin, size_t end, Upload upload) {
  OROCHI_INTERNAL_ASSERT(read_only_ && begin <= end && end <= size_,
                         "device replicas are of read-only bytes within the storage");
  std::lock_guard lock(ReplicaMutex());
  if (replicas_ == nullptr) replicas_ = new DeviceReplicas;
  for (const DeviceReplicas::Entry& entry : replicas_->entries) {
    if (entry.device == device && entry.begin == begin && entry.end == end) return entry.replica;
  }
  StoragePtr replica = upload(data_ + begin, end - begin, device);  // nothing kept if it throws
  replicas_->entries.push_back({device, begin, end, replica});
  return replica;
}

Storage::Prepared Storage::PreparedLayout(const std::string& key,
                                          const std::function<Prepared()>& prepare) {
  OROCHI_INTERNAL_ASSERT(read_only_, "prepared layouts are of read-only bytes only");
  {
    std::lock_guard lock(ReplicaMutex());
    if (replicas_ != nullptr) {
      for (const auto& [existing, layout] : replicas_->prepared) {
        if (existing == key) return layout;
      }
    }
  }
  Prepared made = prepare();  // outside the lock: preparing one weight never waits on another's
  std::lock_guard lock(ReplicaMutex());
  if (replicas_ == nullptr) replicas_ = new DeviceReplicas;
  for (const auto& [existing, layout] : replicas_->prepared) {
    if (existing == key) return layout;  // another thread finished first
  }
  replicas_->prepared.emplace_back(key, made);
  return made;
}

Storage::~Storage() {
  delete replicas_;
  if (kind_ == Kind::kOwned) {
    size_t rounded = RoundedSize(size_);
    if (rounded < kLargeBlock || !LargeBlockCache::Instance().Give(data_, rounded)) {
      std::free(data_);
    }
  } else if (kind_ == Kind::kMapped) {
    if (size_ > 0) munmap(data_, size_);
  } else if (release_ != nullptr) {
    release_(release_context_);
  }
}

void Storage::Retain() { references_.fetch_add(1, std::memory_order_relaxed); }

void Storage::Release() {
  if (references_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (kind_ == Kind::kInline) {
    this->~Storage();
    std::free(this);  // the block Allocate made, bytes included
    return;
  }
  delete this;
}

StoragePtr Storage::Allocate(size_t bytes, Device device) {
  RequireDevice(device);
  if (device.type != DeviceType::kCpu) {
    const DeviceBackend* backend = CudaBackend();
    void* block = nullptr;
    auto* data = static_cast<std::byte*>(backend->allocate(device.index, bytes, &block));
    auto* storage = new Storage(Kind::kDevice, data, bytes, /*read_only=*/false, device);
    storage->release_ = backend->release;
    storage->release_context_ = block;
    return StoragePtr(storage);
  }
  size_t rounded = RoundedSize(bytes);
  if (rounded <= kInlineBlock) {
    // The Storage and its bytes in one plain malloc, aligned by hand: aligned_alloc's splitting
    // and the second allocation were most of a tiny op's cost.
    void* block = std::malloc(sizeof(Storage) + kAlignment - 1 + rounded);
    OROCHI_CHECK(block != nullptr, StatusCode::kResourceExhausted,
                 "cannot allocate " << bytes << " bytes");
    std::byte* data = static_cast<std::byte*>(block) + sizeof(Storage);
    data += (kAlignment - reinterpret_cast<uintptr_t>(data) % kAlignment) % kAlignment;
    return StoragePtr(new (block) Storage(Kind::kInline, data, bytes, /*read_only=*/false));
  }
  std::byte* data = rounded >= kLargeBlock ? LargeBlockCache::Instance().Take(rounded) : nullptr;
  if (data == nullptr) data = static_cast<std::byte*>(std::aligned_alloc(kAlignment, rounded));
  OROCHI_CHECK(data != nullptr, StatusCode::kResourceExhausted,
               "cannot allocate " << bytes << " bytes");
  return StoragePtr(new Storage(Kind::kOwned, data, bytes, /*read_only=*/false));
}

Result<StoragePtr> Storage::MapFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot open " + path + ": " + std::strerror(errno));
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    Status error = Internal("cannot stat " + path + ": " + std::strerror(errno));
    close(fd);
    return error;
  }
  auto size = static_cast<size_t>(info.st_size);
  void* data = nullptr;
  if (size > 0) {
    data = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      Status error = Internal("cannot map " + path + ": " + std::strerror(errno));
      close(fd);
      return error;
    }
  }
  close(fd);  // the mapping keeps the file
  return StoragePtr(new Storage(Kind::kMapped, static_cast<std::byte*>(data), size, true));
}

StoragePtr Storage::Borrow(std::byte* data, size_t size, bool read_only, BorrowRelease release,
                           void* context) {
  auto* storage = new Storage(Kind::kBorrowed, data, size, read_only);
  storage->release_ = release;
  storage->release_context_ = context;
  return StoragePtr(storage);
}

StoragePtr::StoragePtr(const StoragePtr& other) : storage_(other.storage_) {
  if (storage_ != nullptr) storage_->Retain();
}

StoragePtr::~StoragePtr() {
  if (storage_ != nullptr) storage_->Release();
}

int64_t StoragePtr::use_count() const {
  return storage_ == nullptr ? 0 : storage_->references_.load(std::memory_order_relaxed);
}

}  // namespace orochi::engine
