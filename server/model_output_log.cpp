#include "model_output_log.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "orochi/packaging/model_key.h"

namespace orochi::server {
namespace {

// A model's key into the fields of a record; nothing before any model's call.
void AddModelFields(std::string_view caller, std::vector<LogField>& fields) {
  if (caller.empty()) return;
  Result<packaging::ModelKey> key = packaging::ModelKey::Parse(caller);
  if (!key.ok()) {
    fields.push_back({"model", std::string(caller)});
    return;
  }
  fields.push_back({"model", key->name});
  fields.push_back({"version", std::to_string(key->version), false});
}

}  // namespace

ModelOutputLog::ModelOutputLog(size_t copies, ModelOutputLimits limits, Emit emit,
                               std::function<Clock::time_point()> now)
    : limits_(limits), emit_(std::move(emit)), now_(std::move(now)) {
  const Clock::time_point start = now_();
  for (size_t i = 0; i <= copies; ++i) {
    auto copy = std::make_unique<Copy>();
    copy->tokens = limits_.burst;
    copy->refilled = start;
    copies_.push_back(std::move(copy));
  }
}

void ModelOutputLog::Write(const interpreters::OutputSource& source,
                           const interpreters::OutputLine& line) {
  const size_t slots = copies_.size() - 1;
  if (source.slot >= slots) return;
  Copy& copy = *copies_[source.abandoned ? slots : source.slot];
  // Where the line comes from, the same in its record and in a report of dropped lines.
  std::vector<LogField> origin{{"copy", std::to_string(source.slot), false}};
  if (source.abandoned) {
    origin.push_back({"abandoned", "true", false});
    origin.push_back({"copy_id", std::to_string(source.copy_id), false});
  }
  AddModelFields(line.caller, origin);
  int64_t dropped = 0;
  {
    std::lock_guard lock(copy.mutex);
    const Clock::time_point now = now_();
    const double elapsed = std::chrono::duration<double>(now - copy.refilled).count();
    copy.tokens = std::min(limits_.burst, copy.tokens + elapsed * limits_.lines_per_second);
    copy.refilled = now;
    if (copy.tokens < 1) {
      copy.dropped++;
      return;
    }
    copy.tokens -= 1;
    if (copy.dropped > 0 && (!copy.reported || now - *copy.reported >= limits_.report_every)) {
      dropped = std::exchange(copy.dropped, 0);
      copy.reported = now;
    }
  }
  if (dropped > 0) {
    std::vector<LogField> fields = origin;
    fields.push_back({"dropped_lines", std::to_string(dropped), false});
    fields.push_back({"lines_per_second",
                      std::to_string(static_cast<int64_t>(limits_.lines_per_second)), false});
    emit_(LogLevel::kWarning, "model output dropped: the copy printed faster than its limit",
          fields);
  }
  const bool stderr_line = line.stream == interpreters::OutputLine::Stream::kStderr;
  std::vector<LogField> fields{{"stream", stderr_line ? "stderr" : "stdout"}};
  fields.insert(fields.end(), origin.begin(), origin.end());
  fields.push_back({"line", std::string(line.text)});
  if (line.cut) fields.push_back({"cut", "true", false});
  emit_(stderr_line ? LogLevel::kWarning : LogLevel::kInfo, "model output", fields);
}

}  // namespace orochi::server
