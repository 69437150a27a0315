// What served models print (print(), sys.stdout and sys.stderr in their copies) as log records:
// each line one record, tagged with its copy and model, instead of raw text interleaved with
// the server's own records.
//
// Thread-safety: Write may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "log.h"
#include "orochi/interpreters/interpreter.h"
#include "orochi/interpreters/interpreter_manager.h"

namespace orochi::server {

// How much output a copy may log. A model printing in a tight loop would otherwise flood the
// log and, through its lock,
// slow every request's log line: each copy may log `lines_per_second` lines, `burst` at
// once. The lines past it are counted; a line let through is preceded by one record saying
// how many were dropped since the last such record, at most one per `report_every`.
struct ModelOutputLimits {
  double lines_per_second = 200;
  double burst = 200;
  std::chrono::milliseconds report_every{1000};
};

class ModelOutputLog {
 public:
  using Clock = std::chrono::steady_clock;
  using Emit = std::function<void(LogLevel, const std::string& message,
                                  const std::vector<LogField>& fields)>;

  explicit ModelOutputLog(size_t copies, ModelOutputLimits limits = {}, Emit emit = Log,
                          std::function<Clock::time_point()> now = Clock::now);

  // One line of a copy: a record at info (stdout) or warning (stderr) with the stream, the
  // copy's slot, the model and version of its caller, the line, and `cut` when it was cut. A
  // line of an abandoned copy (its stuck call returning at last) also says `abandoned` and the
  // copy's id: the slot's `copy` number belongs to its replacement by then. The caller is the
  // abandoned copy's own, so the line is credited to the model it was stuck in. Abandoned
  // copies share one budget of their own, so that they cannot use up their slot's.
  void Write(const interpreters::OutputSource& source, const interpreters::OutputLine& line);

 private:
  struct Copy {
    std::mutex mutex;
    double tokens = 0;
    Clock::time_point refilled;
    int64_t dropped = 0;
    std::optional<Clock::time_point> reported;
  };

  ModelOutputLimits limits_;
  Emit emit_;
  std::function<Clock::time_point()> now_;
  std::vector<std::unique_ptr<Copy>> copies_;  // by slot, then one for every abandoned copy
};

}  // namespace orochi::server
