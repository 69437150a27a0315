#include "shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace orochi::server::kserve {
namespace {

std::string Quote(std::string_view text) { return "'" + std::string(text) + "'"; }

// Closes a descriptor on every way out of Register: the mapping outlives it.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

SharedMemoryRegion::SharedMemoryRegion(std::string name, std::string key, uint64_t offset,
                                       uint64_t byte_size, void* mapping, size_t mapping_size,
                                       std::byte* data)
    : name_(std::move(name)),
      key_(std::move(key)),
      offset_(offset),
      byte_size_(byte_size),
      mapping_(mapping),
      mapping_size_(mapping_size),
      data_(data) {}

SharedMemoryRegion::~SharedMemoryRegion() { munmap(mapping_, mapping_size_); }

Result<std::byte*> SharedMemoryRegion::Slice(uint64_t offset, uint64_t size,
                                             std::string_view what) const {
  // Written so that no sum can wrap: offset and size each come from the client.
  if (offset > byte_size_ || size > byte_size_ - offset) {
    return InvalidArgument(std::string(what) + ": shared_memory_offset " + std::to_string(offset) +
                           " and shared_memory_byte_size " + std::to_string(size) +
                           " run past the end of shared memory region " + Quote(name_) + " (" +
                           std::to_string(byte_size_) + " bytes)");
  }
  return data_ + offset;
}

Status SharedMemoryRegistry::Register(const std::string& name, const std::string& key,
                                      uint64_t offset, uint64_t byte_size) {
  if (!enabled_) {
    return FailedPrecondition(
        "system shared memory is disabled on this server: the operator enables it with "
        "http.allow_shared_memory in the server's config");
  }
  const std::string what = "cannot register shared memory region " + Quote(name);
  if (name.empty()) return InvalidArgument("a shared memory region needs a name");
  if (key.empty()) return InvalidArgument(what + ": 'key' is empty");
  if (byte_size == 0) return InvalidArgument(what + ": 'byte_size' is 0");
  {
    // Checked before the object is opened, and again before the region is added below.
    std::lock_guard lock(mutex_);
    if (regions_.count(name) != 0) {
      return AlreadyExists("shared memory region " + Quote(name) + " is already registered");
    }
  }
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
  const auto object_size = static_cast<uint64_t>(info.st_size);
  if (offset > object_size || byte_size > object_size - offset) {
    return InvalidArgument(what + ": offset " + std::to_string(offset) + " and byte_size " +
                           std::to_string(byte_size) +
                           " run past the end of shared memory object " + Quote(key) + " (" +
                           std::to_string(object_size) + " bytes)");
  }
  // mmap wants a page-aligned offset: map from the page holding the region's first byte.
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t map_from = offset - offset % page;
  const uint64_t map_size = byte_size + (offset - map_from);
  if (map_size > SIZE_MAX) return InvalidArgument(what + ": the region is too large to map");
  void* mapping = mmap(nullptr, static_cast<size_t>(map_size), PROT_READ | PROT_WRITE, MAP_SHARED,
                       fd.get(), static_cast<off_t>(map_from));
  if (mapping == MAP_FAILED) {
    return InvalidArgument(what + ": cannot map shared memory object " + Quote(key) + ": " +
                           std::strerror(errno));
  }
  // From here the region owns the mapping, whatever happens next.
  std::shared_ptr<const SharedMemoryRegion> region(
      new SharedMemoryRegion(name, key, offset, byte_size, mapping, static_cast<size_t>(map_size),
                             static_cast<std::byte*>(mapping) + (offset - map_from)));
  std::lock_guard lock(mutex_);
  // Another registration of the same name may have won while the object was opened.
  if (!regions_.emplace(name, std::move(region)).second) {
    return AlreadyExists("shared memory region " + Quote(name) + " is already registered");
  }
  return Status::Ok();
}

void SharedMemoryRegistry::Unregister(const std::string& name) {
  std::shared_ptr<const SharedMemoryRegion> removed;  // unmapped (if unused) after the unlock
  std::lock_guard lock(mutex_);
  auto found = regions_.find(name);
  if (found == regions_.end()) return;
  removed = std::move(found->second);
  regions_.erase(found);
}

void SharedMemoryRegistry::UnregisterAll() {
  std::map<std::string, std::shared_ptr<const SharedMemoryRegion>> removed;
  std::lock_guard lock(mutex_);
  removed.swap(regions_);
}

Result<std::vector<SharedMemoryRegionStatus>> SharedMemoryRegistry::Describe(
    const std::optional<std::string>& name) const {
  std::lock_guard lock(mutex_);
  std::vector<SharedMemoryRegionStatus> described;
  auto describe = [&](const SharedMemoryRegion& region) {
    described.push_back({region.name(), region.key(), region.offset(), region.byte_size()});
  };
  if (name) {
    auto found = regions_.find(*name);
    if (found == regions_.end()) {
      return NotFound("unable to find system shared memory region: " + Quote(*name));
    }
    describe(*found->second);
  } else {
    for (const auto& [unused, region] : regions_) describe(*region);
  }
  return described;
}

Result<std::shared_ptr<const SharedMemoryRegion>> SharedMemoryRegistry::Find(
    const std::string& name) const {
  std::lock_guard lock(mutex_);
  auto found = regions_.find(name);
  if (found == regions_.end()) {
    return NotFound("unable to find system shared memory region: " + Quote(name) +
                    (enabled_ ? "" : " (system shared memory is disabled on this server)"));
  }
  return found->second;
}

}  // namespace orochi::server::kserve
