#include "orochi/engine/storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "orochi/base/check.h"
#include "orochi/engine/error.h"

namespace orochi::engine {

std::string DeviceName(Device device) {
  if (device.type == DeviceType::kCpu) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

Storage::Storage(Kind kind, std::byte* data, size_t size, bool read_only)
    : kind_(kind), data_(data), size_(size), read_only_(read_only) {}

Storage::~Storage() {
  if (kind_ == Kind::kOwned) {
    std::free(data_);
  } else if (size_ > 0) {
    munmap(data_, size_);
  }
}

void Storage::Retain() { references_.fetch_add(1, std::memory_order_relaxed); }

void Storage::Release() {
  if (references_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

StoragePtr Storage::Allocate(size_t bytes) {
  constexpr size_t kAlignment = 64;
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  auto* data =
      static_cast<std::byte*>(std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded));
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
