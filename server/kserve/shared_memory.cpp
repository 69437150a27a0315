#include "shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "orochi/base/check.h"
#include "orochi/engine/error.h"
#include "orochi/engine/shared_device_memory.h"

namespace orochi::server::kserve {
namespace {

std::string Quote(std::string_view text) { return "'" + std::string(text) + "'"; }

const char* KindName(SharedMemoryKind kind) {
  return kind == SharedMemoryKind::kSystem ? "system" : "cuda";
}

// Closes a descriptor on every way out of Register unless a region takes it (release).
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

SharedMemoryRegion::SharedMemoryRegion(std::string name, std::string key, uint64_t offset,
                                       uint64_t byte_size, int fd)
    : kind_(SharedMemoryKind::kSystem),
      name_(std::move(name)),
      key_(std::move(key)),
      offset_(offset),
      byte_size_(byte_size),
      fd_(fd) {}

SharedMemoryRegion::SharedMemoryRegion(std::string name, int64_t device_id, uint64_t byte_size,
                                       std::unique_ptr<engine::SharedDeviceMemory> device_memory)
    : kind_(SharedMemoryKind::kCuda),
      name_(std::move(name)),
      device_id_(device_id),
      byte_size_(byte_size),
      device_memory_(std::move(device_memory)) {}

SharedMemoryRegion::~SharedMemoryRegion() {
  if (fd_ >= 0) close(fd_);
}

Status SharedMemoryRegion::CheckRange(uint64_t offset, uint64_t size, std::string_view what) const {
  // Written so that no sum can wrap: offset and size each come from the client.
  if (offset > byte_size_ || size > byte_size_ - offset) {
    return InvalidArgument(std::string(what) + ": shared_memory_offset " + std::to_string(offset) +
                           " and shared_memory_byte_size " + std::to_string(size) +
                           " run past the end of shared memory region " + Quote(name_) + " (" +
                           std::to_string(byte_size_) + " bytes)");
  }
  return Status::Ok();
}

Status SharedMemoryRegion::NotHeld(uint64_t object_size, uint64_t offset, uint64_t size,
                                   std::string_view what) const {
  const uint64_t held = object_size > offset_ ? std::min(object_size - offset_, byte_size_) : 0;
  // What `what` is, for the sentence: "input 'x'" needs its bytes as "the input".
  const std::string_view noun = what.substr(0, what.find(' '));
  return InvalidArgument(std::string(what) + ": shared memory region " + Quote(name_) + " holds " +
                         std::to_string(held) + " bytes now (its object was truncated to " +
                         std::to_string(object_size) + " bytes); the " + std::string(noun) +
                         " needs " + std::to_string(size) + " bytes at offset " +
                         std::to_string(offset));
}

Result<uint64_t> SharedMemoryRegion::ObjectSize(std::string_view what) const {
  struct stat info {};
  if (fstat(fd_, &info) != 0) {
    return InvalidArgument(std::string(what) + ": cannot stat shared memory region " +
                           Quote(name_) + ": " + std::strerror(errno));
  }
  return static_cast<uint64_t>(info.st_size);
}

Status SharedMemoryRegion::CheckHeld(uint64_t offset, uint64_t size, std::string_view what) const {
  OROCHI_RETURN_IF_ERROR(CheckRange(offset, size, what));
  if (kind_ != SharedMemoryKind::kSystem || size == 0) return Status::Ok();
  OROCHI_ASSIGN_OR_RETURN(const uint64_t object_size, ObjectSize(what));
  if (object_size < offset_ + offset + size) return NotHeld(object_size, offset, size, what);
  return Status::Ok();
}

namespace {

// A device's refusal (a range past the client's allocation, a device that failed) as the
// request's error, naming the region.
Status DeviceError(const engine::Error& error, std::string_view what, const std::string& name) {
  return Status(error.status().code(), std::string(what) + ": CUDA shared memory region " +
                                           Quote(name) + ": " + error.status().message());
}

}  // namespace

Status SharedMemoryRegion::ReadInto(uint64_t offset, uint64_t size, std::string_view what,
                                    std::byte* to) const {
  OROCHI_RETURN_IF_ERROR(CheckRange(offset, size, what));
  if (kind_ == SharedMemoryKind::kCuda) {
    try {
      device_memory_->CopyToHost(offset, to, size);
    } catch (const engine::Error& error) {
      return DeviceError(error, what, name_);
    }
    return Status::Ok();
  }
  // pread stops at the object's end, however recently it moved: no check ahead of the read
  // can race with a truncation. Registration checked that offsets fit off_t.
  uint64_t done = 0;
  while (done < size) {
    const ssize_t got =
        pread(fd_, to + done, size - done, static_cast<off_t>(offset_ + offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return InvalidArgument(std::string(what) + ": cannot read shared memory region " +
                             Quote(name_) + ": " + std::strerror(errno));
    }
    if (got == 0) {
      // The object ended there when it was read (it may have grown again since).
      OROCHI_ASSIGN_OR_RETURN(const uint64_t object_size, ObjectSize(what));
      return NotHeld(std::min(object_size, offset_ + offset + done), offset, size, what);
    }
    done += static_cast<uint64_t>(got);
  }
  return Status::Ok();
}

Status SharedMemoryRegion::Write(uint64_t offset, std::span<const std::byte> bytes,
                                 std::string_view what) const {
  OROCHI_RETURN_IF_ERROR(CheckHeld(offset, bytes.size(), what));
  if (kind_ == SharedMemoryKind::kCuda) {
    try {
      device_memory_->CopyFromHost(offset, bytes.data(), bytes.size());
    } catch (const engine::Error& error) {
      return DeviceError(error, what, name_);
    }
    return Status::Ok();
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t put = pwrite(fd_, bytes.data() + done, bytes.size() - done,
                               static_cast<off_t>(offset_ + offset + done));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      return InvalidArgument(std::string(what) + ": cannot write shared memory region " +
                             Quote(name_) + ": " +
                             (put < 0 ? std::strerror(errno) : "nothing was written"));
    }
    done += static_cast<size_t>(put);
  }
  return Status::Ok();
}

Status SharedMemoryRegistry::CheckNewRegion(const std::string& name, uint64_t byte_size,
                                            std::string_view kind) const {
  if (!enabled_) {
    return FailedPrecondition(std::string(kind) +
                              " shared memory is disabled on this server: the operator enables "
                              "it with http.allow_shared_memory in the server's config");
  }
  if (name.empty()) return InvalidArgument("a shared memory region needs a name");
  if (byte_size == 0) {
    return InvalidArgument("cannot register shared memory region " + Quote(name) +
                           ": 'byte_size' is 0");
  }
  // Checked before anything is opened, and again when the region is added.
  std::lock_guard lock(mutex_);
  if (regions_.count(name) != 0) {
    return AlreadyExists("shared memory region " + Quote(name) + " is already registered");
  }
  return Status::Ok();
}

Status SharedMemoryRegistry::Add(std::shared_ptr<const SharedMemoryRegion> region) {
  std::lock_guard lock(mutex_);
  const std::string name = region->name();
  // Another registration of the same name may have won while the memory was opened; the
  // loser's region is closed as it goes.
  if (!regions_.emplace(name, std::move(region)).second) {
    return AlreadyExists("shared memory region " + Quote(name) + " is already registered");
  }
  return Status::Ok();
}

Status SharedMemoryRegistry::CheckDescriptorsLeft(const std::string& what) const {
  // Each system region keeps a descriptor open while it is registered: regions registered
  // without end would take every descriptor the process may open, and with them every
  // connection it accepts. They may take a quarter of the limit.
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return Status::Ok();
  }
  const size_t most = static_cast<size_t>(limit.rlim_cur) / 4;
  std::lock_guard lock(mutex_);
  const auto system =
      static_cast<size_t>(std::count_if(regions_.begin(), regions_.end(), [](const auto& entry) {
        return entry.second->kind() == SharedMemoryKind::kSystem;
      }));
  if (system >= most) {
    return ResourceExhausted(what + ": " + std::to_string(system) +
                             " system shared memory regions are registered, the most this server "
                             "keeps open (a quarter of its descriptor limit, RLIMIT_NOFILE " +
                             std::to_string(limit.rlim_cur) +
                             "); unregister regions that are no longer used");
  }
  return Status::Ok();
}

Status SharedMemoryRegistry::RegisterCuda(const std::string& name, std::string_view raw_handle,
                                          int64_t device_id, uint64_t byte_size) {
  OROCHI_RETURN_IF_ERROR(CheckNewRegion(name, byte_size, "CUDA"));
  const std::string what = "cannot register CUDA shared memory region " + Quote(name);
  const int devices = engine::DeviceCount(engine::DeviceType::kCuda);
  if (device_id < 0 || device_id >= devices) {
    return InvalidArgument(
        what + ": 'device_id' " + std::to_string(device_id) +
        (devices == 0
             ? " names no device: this server has no CUDA device (" +
                   engine::DeviceTypeStatus(engine::DeviceType::kCuda).message() + ")"
             : " names no device: this server has " + std::to_string(devices) + " CUDA device(s)"));
  }
  if (raw_handle.size() != engine::kSharedDeviceMemoryHandleBytes) {
    return InvalidArgument(what + ": 'raw_handle' has " + std::to_string(raw_handle.size()) +
                           " bytes; a CUDA IPC handle (cudaIpcMemHandle_t) has " +
                           std::to_string(engine::kSharedDeviceMemoryHandleBytes));
  }
  std::unique_ptr<engine::SharedDeviceMemory> memory;
  try {
    memory = engine::SharedDeviceMemory::Open(
        engine::Device{engine::DeviceType::kCuda, static_cast<int>(device_id)}, raw_handle);
  } catch (const engine::Error& error) {
    return Status(error.status().code(), what + ": " + error.status().message());
  }
  return Add(std::shared_ptr<const SharedMemoryRegion>(
      new SharedMemoryRegion(name, device_id, byte_size, std::move(memory))));
}

Status SharedMemoryRegistry::Register(const std::string& name, const std::string& key,
                                      uint64_t offset, uint64_t byte_size) {
  OROCHI_RETURN_IF_ERROR(CheckNewRegion(name, byte_size, "system"));
  const std::string what = "cannot register shared memory region " + Quote(name);
  if (key.empty()) return InvalidArgument(what + ": 'key' is empty");
  OROCHI_RETURN_IF_ERROR(CheckDescriptorsLeft(what));
  // O_RDWR: outputs are written into the region. The server never creates the object (no
  // O_CREAT): a key that names nothing is the client's mistake, not an empty region.
  Descriptor fd(shm_open(key.c_str(), O_RDWR, 0));
  if (fd.get() < 0) {
    const int error = errno;
    return InvalidArgument(
        what + ": cannot open shared memory object " + Quote(key) + ": " + std::strerror(error) +
        (error == ENOENT ? " (create it with shm_open before registering)" : ""));
  }
  struct stat info {};
  if (fstat(fd.get(), &info) != 0) {
    return InvalidArgument(what + ": cannot stat shared memory object " + Quote(key) + ": " +
                           std::strerror(errno));
  }
  // Read and written by offset: a FIFO, say, has no bytes at offsets (and no size to check).
  if (!S_ISREG(info.st_mode)) {
    return InvalidArgument(what + ": shared memory object " + Quote(key) +
                           " is not a regular file");
  }
  const auto object_size = static_cast<uint64_t>(info.st_size);
  if (offset > object_size || byte_size > object_size - offset) {
    return InvalidArgument(what + ": offset " + std::to_string(offset) + " and byte_size " +
                           std::to_string(byte_size) +
                           " run past the end of shared memory object " + Quote(key) + " (" +
                           std::to_string(object_size) + " bytes)");
  }
  // From here the region owns the descriptor, whatever happens next.
  return Add(std::shared_ptr<const SharedMemoryRegion>(
      new SharedMemoryRegion(name, key, offset, byte_size, fd.release())));
}

void SharedMemoryRegistry::Unregister(const std::string& name, SharedMemoryKind kind) {
  std::shared_ptr<const SharedMemoryRegion> removed;  // closed (if unused) after the unlock
  std::lock_guard lock(mutex_);
  auto found = regions_.find(name);
  if (found == regions_.end() || found->second->kind() != kind) return;
  removed = std::move(found->second);
  regions_.erase(found);
}

void SharedMemoryRegistry::UnregisterAll(SharedMemoryKind kind) {
  std::vector<std::shared_ptr<const SharedMemoryRegion>> removed;
  std::lock_guard lock(mutex_);
  for (auto region = regions_.begin(); region != regions_.end();) {
    if (region->second->kind() == kind) {
      removed.push_back(std::move(region->second));
      region = regions_.erase(region);
    } else {
      ++region;
    }
  }
}

Result<std::vector<SharedMemoryRegionStatus>> SharedMemoryRegistry::Describe(
    const std::optional<std::string>& name, SharedMemoryKind kind) const {
  std::lock_guard lock(mutex_);
  std::vector<SharedMemoryRegionStatus> described;
  auto describe = [&](const SharedMemoryRegion& region) {
    described.push_back(
        {region.name(), region.key(), region.offset(), region.device_id(), region.byte_size()});
  };
  if (name) {
    auto found = regions_.find(*name);
    if (found == regions_.end() || found->second->kind() != kind) {
      return NotFound(std::string("unable to find ") + KindName(kind) +
                      " shared memory region: " + Quote(*name));
    }
    describe(*found->second);
  } else {
    for (const auto& [unused, region] : regions_) {
      if (region->kind() == kind) describe(*region);
    }
  }
  return described;
}

Result<std::shared_ptr<const SharedMemoryRegion>> SharedMemoryRegistry::Find(
    const std::string& name) const {
  std::lock_guard lock(mutex_);
  auto found = regions_.find(name);
  if (found == regions_.end()) {
    return NotFound("unable to find shared memory region: " + Quote(name) +
                    (enabled_ ? "" : " (shared memory is disabled on this server)"));
  }
  return found->second;
}

}  // namespace orochi::server::kserve
