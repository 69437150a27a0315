// ProcessStatusKiB and ResidentBytes: /proc/self/status's fields, and resident memory that
// follows what the process touches.
#include "orochi/base/process_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

namespace orochi {
namespace {

TEST(ProcessMemory, ReadsTheFieldsOfProcSelfStatus) {
  const int64_t resident = ProcessStatusKiB("VmRSS");
  EXPECT_GT(resident, 0);
  EXPECT_GE(ProcessStatusKiB("VmHWM"), resident);  // the peak is at least the current figure
  EXPECT_GE(ProcessStatusKiB("VmPeak"), ProcessStatusKiB("VmSize"));
  EXPECT_EQ(ProcessStatusKiB("NoSuchField"), -1);
  EXPECT_EQ(ProcessStatusKiB("VmRS"), -1);  // a prefix of a name is not the name
  EXPECT_EQ(ProcessStatusKiB("Name"), -1);  // not a number
}

TEST(ProcessMemory, ResidentBytesGrowWithTouchedPages) {
  constexpr size_t kBytes = size_t{64} << 20;
  const int64_t before = ResidentBytes();
  ASSERT_GT(before, 0);
  auto block = std::make_unique<char[]>(kBytes);
  std::memset(block.get(), 1, kBytes);
  const int64_t after = ResidentBytes();
  EXPECT_GE(after - before, static_cast<int64_t>(kBytes * 9 / 10));
  EXPECT_EQ(block[kBytes - 1], 1);
}

}  // namespace
}  // namespace orochi
