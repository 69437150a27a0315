// This process's memory as the kernel counts it, read from /proc/self/status: for the server's
// metrics and for the tests and benchmarks that measure what an operation costs in memory.
#pragma once

#include <cstdint>
#include <string_view>

namespace orochi {

// The value of one "kB" field of /proc/self/status ("VmRSS", "VmHWM", "VmPeak", "RssShmem"...),
// in KiB; -1 when the file cannot be read or has no such field.
int64_t ProcessStatusKiB(std::string_view field);

// Resident memory (VmRSS) in bytes; -1 when it cannot be read.
inline int64_t ResidentBytes() {
  const int64_t kib = ProcessStatusKiB("VmRSS");
  return kib < 0 ? -1 : kib * 1024;
}

}  // namespace orochi
