#include "log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>

namespace orochi::server {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<bool> g_json{false};
std::mutex g_write_mutex;

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

std::string Timestamp() {
  auto now = std::chrono::system_clock::now();
  std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[64];
  std::snprintf(text, sizeof(text), "%04d-%02d-%02dT%02d:%02d:%02d.%03lldZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<long long>(millis));
  return text;
}

}  // namespace

void ConfigureLog(const std::string& level, const std::string& format) {
  LogLevel parsed = level == "debug"     ? LogLevel::kDebug
                    : level == "warning" ? LogLevel::kWarning
                    : level == "error"   ? LogLevel::kError
                                         : LogLevel::kInfo;
  g_level = static_cast<int>(parsed);
  g_json = format == "json";
}

void Log(LogLevel level, const std::string& message, const std::vector<LogField>& fields) {
  if (static_cast<int>(level) < g_level.load()) return;
  std::string line;
  if (g_json.load()) {
    nlohmann::json entry{{"time", Timestamp()}, {"level", LevelName(level)}, {"message", message}};
    for (const LogField& field : fields) {
      if (field.quoted) {
        entry[field.key] = field.value;
      } else {
        entry[field.key] = nlohmann::json::parse(field.value, nullptr, false);
      }
    }
    line = entry.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } else {
    line = Timestamp() + " " + LevelName(level) + " " + message;
    for (const LogField& field : fields) line += " " + field.key + "=" + field.value;
  }
  line += "\n";
  std::lock_guard lock(g_write_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace orochi::server
