// Admission by memory: new inference requests are refused (503, reason out_of_memory) while the
// process's resident memory is at its limit, so that a burst of costly requests is answered
// "retry later" instead of the kernel's OOM killer ending the process and every request in it.
//
// The limit is configured (models.max_memory_bytes) or, when 0, 90% of what the process may use:
// its cgroup's memory limit (v2 memory.max, v1 memory.limit_in_bytes) where one is set, else
// the machine's memory. Resident memory is read from /proc/self/statm, at most once every few
// milliseconds; memory the allocator keeps after large requests is handed back (malloc_trim)
// before a request is refused for it.
//
// Thread-safety: Admit may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>

#include "orochi/base/status.h"

namespace orochi::server {

class MemoryGuard {
 public:
  // `limit_bytes`: resident memory at which requests are refused; 0 detects it (see above).
  explicit MemoryGuard(int64_t limit_bytes);

  // OK, or kResourceExhausted naming the use and the limit.
  Status Admit();
  int64_t limit_bytes() const { return limit_bytes_; }

  // Resident memory of this process now, in bytes (0 when /proc cannot be read).
  static int64_t ResidentBytes();
  // What the process may use: its cgroup's limit, else the machine's memory.
  static int64_t AvailableBytes();

 private:
  int64_t Resident();  // ResidentBytes, cached for a few milliseconds

  const int64_t limit_bytes_;
  std::atomic<int64_t> resident_{0};
  std::atomic<int64_t> measured_at_ns_{0};
  std::atomic<int64_t> trimmed_at_ns_{0};
};

}  // namespace orochi::server
