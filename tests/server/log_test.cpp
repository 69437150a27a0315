// Log records as text and JSON: one record a line whatever its values hold, and read back the
// same, so that a value cannot break a line-oriented parser or pass for another record.
#include "log.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace orochi::server {
namespace {

constexpr std::string_view kTime = "2026-01-02T03:04:05.678Z";

std::string Text(const std::string& message, const std::vector<LogField>& fields) {
  return FormatLogRecord(LogLevel::kWarning, std::string(kTime), message, fields, false);
}

// A logfmt reader: key=value pairs after the time, level and message (which holds no '='),
// values in double quotes with JSON's escapes.
std::map<std::string, std::string> ReadFields(std::string_view line) {
  std::map<std::string, std::string> fields;
  size_t at = line.find('=');
  if (at == std::string_view::npos) return fields;
  at = line.rfind(' ', at) + 1;
  while (at < line.size()) {
    const size_t equals = line.find('=', at);
    std::string key(line.substr(at, equals - at));
    at = equals + 1;
    std::string value;
    if (line[at] == '"') {
      size_t end = at + 1;
      while (line[end] != '"') end += line[end] == '\\' ? 2 : 1;
      value = nlohmann::json::parse(line.substr(at, end - at + 1)).get<std::string>();
      at = end + 1;
    } else {
      const size_t end = std::min(line.find(' ', at), line.size());
      value = std::string(line.substr(at, end - at));
      at = end;
    }
    fields[key] = value;
    if (at < line.size()) at++;  // the space before the next field
  }
  return fields;
}

TEST(Log, TextValuesThatNeedItAreQuotedAndEscaped) {
  EXPECT_EQ(Text("model loaded", {{"model", "digits"}, {"version", "1", false}}),
            "2026-01-02T03:04:05.678Z warning model loaded model=digits version=1");
  EXPECT_EQ(Text("m", {{"error", "no such file"}, {"empty", ""}}),
            "2026-01-02T03:04:05.678Z warning m error=\"no such file\" empty=\"\"");
  EXPECT_EQ(Text("m", {{"line", R"(say "hi" \o/)"}}),
            R"(2026-01-02T03:04:05.678Z warning m line="say \"hi\" \\o/")");
  EXPECT_EQ(Text("m", {{"line", std::string("bell\x07tab\t", 9)}}),
            R"(2026-01-02T03:04:05.678Z warning m line="bell\u0007tab\t")");
  // An unquoted value ends at a space, so '=' in it cannot start a field.
  EXPECT_EQ(Text("request", {{"target", "/v2/health/live?probe=1"}}),
            "2026-01-02T03:04:05.678Z warning request target=/v2/health/live?probe=1");
}

TEST(Log, AValueCannotStartAnotherRecordOrForgeAField) {
  const std::string traceback =
      "Traceback (most recent call last):\n  File \"model.py\", line 3\nValueError: bad\r\n";
  const std::string forged =
      "x\n2026-01-02T03:04:05.678Z error model unloaded model=victim status=\"ok\"";
  const std::string line =
      Text("model output", {{"model", "m"}, {"line", forged}, {"traceback", traceback}});
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_EQ(line.find('\r'), std::string::npos) << line;
  EXPECT_EQ(ReadFields(line), (std::map<std::string, std::string>{
                                  {"model", "m"}, {"line", forged}, {"traceback", traceback}}));
  // A message cannot either.
  EXPECT_EQ(Text("two\nlines", {}), R"(2026-01-02T03:04:05.678Z warning two\nlines)");
}

TEST(Log, JsonRecordsKeepEveryValueAndStayJson) {
  const std::string forged = "x\"}\n{\"level\":\"error\"";
  const std::string line = FormatLogRecord(LogLevel::kError, std::string(kTime), "model output",
                                           {{"copy", "3", false},
                                            {"line", forged},
                                            {"not_a_number", "12 ms", false},
                                            {"cut", "true", false}},
                                           true);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  const nlohmann::json record = nlohmann::json::parse(line);
  EXPECT_EQ(record["time"], kTime);
  EXPECT_EQ(record["level"], "error");
  EXPECT_EQ(record["message"], "model output");
  EXPECT_EQ(record["copy"], 3);
  EXPECT_EQ(record["line"], forged);
  EXPECT_EQ(record["not_a_number"], "12 ms") << "a bare value that is not JSON was lost";
  EXPECT_EQ(record["cut"], true);
}

}  // namespace
}  // namespace orochi::server
