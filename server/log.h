// One line per event on stderr, as text or JSON (config log.format), filtered by level. Written
// through a duplicate of descriptor 2 taken at the first call, so that a model closing or
// redirecting descriptor 2 later changes nothing for the log; a serving process writes to its
// supervisor's pipe instead (SetLogDescriptor). Thread-safe: lines never interleave.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace orochi::server {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

struct LogField {
  std::string key;
  std::string value;
  bool quoted = true;  // false for numbers
};

// Sets the level (debug, info, warning, error) and format (text, json); may be called at any
// time (`POST /v2/logging` changes them while the server runs), from any thread.
void ConfigureLog(const std::string& level, const std::string& format);
// The level and format in effect, as ConfigureLog takes them.
std::string CurrentLogLevel();
std::string CurrentLogFormat();
void Log(LogLevel level, const std::string& message, const std::vector<LogField>& fields = {});

// From now on records go to `descriptor` (the process keeps it open), not to stderr; the log's
// duplicate of stderr is closed.
void SetLogDescriptor(int descriptor);
// Writes records formatted elsewhere (whole lines, each with its newline) where Log writes, in
// one piece with respect to Log's own records.
void WriteLogLines(std::string_view lines);

// One record as Log writes it, without the newline. Whatever the message and values hold
// (spaces, quotes, newlines of a traceback or a model's output), a record is one line and
// reads back the same. Text: `TIME LEVEL message key=value ...`, a value in double quotes
// when it is empty or holds a space, '"', '\\' or a control character, with '"', '\\'
// and control characters escaped as in JSON strings (logfmt's rules); control characters in
// the message are escaped the same way. JSON: one object, a value that is not `quoted` and
// not a JSON number (or true, false) written as a string.
std::string FormatLogRecord(LogLevel level, const std::string& time, const std::string& message,
                            const std::vector<LogField>& fields, bool json);

}  // namespace orochi::server
