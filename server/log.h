// One line per event on stderr, as text or JSON (config log.format), filtered by level.
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
