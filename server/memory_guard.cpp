#include "memory_guard.h"

#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>

namespace orochi::server {
namespace {

// Resident memory changes with each request; reading it for every one would cost a file read
// per request for no better answer.
constexpr int64_t kMeasureEveryNs = 5'000'000;
// malloc_trim walks the heap: at most once a second, and only when a refusal is at stake.
constexpr int64_t kTrimEveryNs = 1'000'000'000;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The first number in `path`, or 0 ("max" and missing files included).
int64_t ReadNumber(const char* path) {
  std::ifstream file(path);
  int64_t value = 0;
  if (!(file >> value)) return 0;
  return value;
}

int64_t MachineBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<int64_t>(pages) * page_size : 0;
}

std::string Mebibytes(int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

MemoryGuard::MemoryGuard(int64_t limit_bytes)
    : limit_bytes_(limit_bytes > 0 ? limit_bytes : AvailableBytes() / 10 * 9) {}

int64_t MemoryGuard::ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0;
  int64_t resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  return resident_pages * ::sysconf(_SC_PAGE_SIZE);
}

int64_t MemoryGuard::AvailableBytes() {
  const int64_t machine = MachineBytes();
  int64_t cgroup = ReadNumber("/sys/fs/cgroup/memory.max");  // v2; "max" reads as 0
  if (cgroup <= 0) cgroup = ReadNumber("/sys/fs/cgroup/memory/memory.limit_in_bytes");  // v1
  // v1 says "no limit" with a number near 2^63.
  if (cgroup > 0 && (machine == 0 || cgroup < machine)) return cgroup;
  return machine;
}

int64_t MemoryGuard::Resident() {
  const int64_t now = NowNs();
  if (now - measured_at_ns_.load(std::memory_order_relaxed) < kMeasureEveryNs) {
    return resident_.load(std::memory_order_relaxed);
  }
  const int64_t resident = ResidentBytes();
  resident_.store(resident, std::memory_order_relaxed);
  measured_at_ns_.store(now, std::memory_order_relaxed);
  return resident;
}

Status MemoryGuard::Admit() {
  if (limit_bytes_ <= 0) return Status::Ok();  // nothing known to guard
  int64_t resident = Resident();
  if (resident < limit_bytes_) return Status::Ok();
  // Often the memory is free but kept by the allocator after a large request: give it back
  // and look again before refusing anyone.
  const int64_t now = NowNs();
  int64_t trimmed_at = trimmed_at_ns_.load(std::memory_order_relaxed);
  if (now - trimmed_at >= kTrimEveryNs &&
      trimmed_at_ns_.compare_exchange_strong(trimmed_at, now, std::memory_order_relaxed)) {
    ::malloc_trim(0);
    resident = ResidentBytes();
    resident_.store(resident, std::memory_order_relaxed);
    measured_at_ns_.store(NowNs(), std::memory_order_relaxed);
    if (resident < limit_bytes_) return Status::Ok();
  }
  return ResourceExhausted(
      "the server is short of memory: it uses " + Mebibytes(resident) + " of its " +
      Mebibytes(limit_bytes_) +
      " limit (models.max_memory_bytes), so new requests wait for running ones to "
      "finish; retry later");
}

}  // namespace orochi::server
