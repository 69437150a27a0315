#include "log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>

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

// The log's own descriptor for the process's stderr, taken on first use (at server start, before
// any model code runs). Descriptor 2 itself is not the log's to rely on: a model's os.close(2)
// frees the number, the kernel gives the lowest free number to the next accepted connection,
// and records written to 2 would go to that client, mixed into its response. A duplicate made
// here keeps pointing at the original stderr whatever happens to 2 later (os.dup2 over it
// included). It is close-on-exec, so programs a model starts do not inherit it.
// SetLogDescriptor replaces it.
std::atomic<int> g_descriptor{-1};
int g_duplicate = -1;  // the duplicate LogDescriptor took, while it is open

int LogDescriptor() {
  static std::once_flag taken;
  std::call_once(taken, [] {
    int duplicate = ::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
    // stderr closed at start: nothing better.
    int unset = -1;
    if (g_descriptor.compare_exchange_strong(unset, duplicate >= 0 ? duplicate : STDERR_FILENO)) {
      g_duplicate = duplicate;
    } else if (duplicate >= 0) {
      ::close(duplicate);  // SetLogDescriptor came first
    }
  });
  return g_descriptor.load();
}

void WriteAll(int descriptor, std::string_view text) {
  while (!text.empty()) {
    ssize_t written = ::write(descriptor, text.data(), text.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;  // a log that cannot be written is dropped, not retried forever
    text.remove_prefix(static_cast<size_t>(written));
  }
}

bool IsControl(char c) {
  const auto byte = static_cast<unsigned char>(c);
  return byte < 0x20 || byte == 0x7f;
}

// '=' needs none: an unquoted value ends at the next space, so it cannot start another field,
// and a request's target (`?a=b`) stays readable.
bool NeedsQuotes(std::string_view value) {
  if (value.empty()) return true;
  return std::any_of(value.begin(), value.end(),
                     [](char c) { return c == ' ' || c == '"' || c == '\\' || IsControl(c); });
}

// `text` with '"', '\\' and control characters escaped, onto `out`.
void AppendEscaped(std::string_view text, std::string& out) {
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (IsControl(c)) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned char>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
}

}  // namespace

void ConfigureLog(const std::string& level, const std::string& format) {
  LogLevel parsed = level == "debug"     ? LogLevel::kDebug
                    : level == "warning" ? LogLevel::kWarning
                    : level == "error"   ? LogLevel::kError
                                         : LogLevel::kInfo;
  g_level = static_cast<int>(parsed);
  g_json = format == "json";
  (void)LogDescriptor();
}

std::string CurrentLogLevel() { return LevelName(static_cast<LogLevel>(g_level.load())); }

std::string CurrentLogFormat() { return g_json.load() ? "json" : "text"; }

std::string FormatLogRecord(LogLevel level, const std::string& time, const std::string& message,
                            const std::vector<LogField>& fields, bool json) {
  if (json) {
    nlohmann::json entry{{"time", time}, {"level", LevelName(level)}, {"message", message}};
    for (const LogField& field : fields) {
      nlohmann::json value = field.quoted ? nlohmann::json(field.value)
                                          : nlohmann::json::parse(field.value, nullptr, false);
      // A bare value must be one JSON scalar; anything else (a parse failure would dump as
      // "<discarded>", which is not JSON) goes in as the string it is.
      if (!value.is_primitive() || value.is_discarded() || value.is_null()) value = field.value;
      entry[field.key] = std::move(value);
    }
    return entry.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string line = time + " " + LevelName(level) + " ";
  AppendEscaped(message, line);
  for (const LogField& field : fields) {
    line += ' ';
    line += field.key;
    line += '=';
    if (NeedsQuotes(field.value)) {
      line += '"';
      AppendEscaped(field.value, line);
      line += '"';
    } else {
      line += field.value;
    }
  }
  return line;
}

void SetLogDescriptor(int descriptor) {
  LogDescriptor();  // its duplicate taken, if it was not yet, so that it is closed below
  std::lock_guard lock(g_write_mutex);
  g_descriptor = descriptor;
  // The duplicate of stderr is closed: in a serving process it is the supervisor's own stderr,
  // which model code would otherwise write to past every bound (it was descriptor 3).
  if (g_duplicate >= 0 && g_duplicate != descriptor) ::close(g_duplicate);
  g_duplicate = -1;
}

void WriteLogLines(std::string_view lines) {
  std::lock_guard lock(g_write_mutex);
  WriteAll(LogDescriptor(), lines);
}

void Log(LogLevel level, const std::string& message, const std::vector<LogField>& fields) {
  if (static_cast<int>(level) < g_level.load()) return;
  std::string line = FormatLogRecord(level, Timestamp(), message, fields, g_json.load());
  line += "\n";
  std::lock_guard lock(g_write_mutex);
  WriteAll(LogDescriptor(), line);
}

}  // namespace orochi::server
