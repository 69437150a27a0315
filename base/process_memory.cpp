#include "orochi/base/process_memory.h"

#include <fstream>
#include <string>

namespace orochi {

int64_t ProcessStatusKiB(std::string_view field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    // "VmRSS:\t    1234 kB": the name, a colon, then the number.
    if (line.size() > field.size() && line.starts_with(field) && line[field.size()] == ':') {
      try {
        return std::stoll(line.substr(field.size() + 1));
      } catch (const std::exception&) {
        return -1;
      }
    }
  }
  return -1;
}

}  // namespace orochi
