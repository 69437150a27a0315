// One line per event on stderr, as text or JSON (config log.format), filtered by level. Written
// through a duplicate of descriptor 2 taken at the first call, so that a model closing or
// redirecting descriptor 2 later changes nothing for the log. Thread-safe: lines never interleave.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace orochi::server {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

struct LogField {
  std::string key;
  std::string value;
  bool quoted = true;  // false for numbers
};

void ConfigureLog(const std::string& level, const std::string& format);
void Log(LogLevel level, const std::string& message, const std::vector<LogField>& fields = {});

}  // namespace orochi::server
