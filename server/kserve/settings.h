// Triton's logging and trace extensions on the inference port, answered with what Orochi
// supports:
//   GET /v2/logging: Triton's log settings object (log_file, log_info, log_warning, log_error,
//     log_verbose_level, log_format), read from the log (log.h);
//   POST /v2/logging: changes the level and format at run time; what Orochi cannot do (a log
//     file, a level that logs warnings but not info, errors off, Triton's format names) is
//     refused with 400 naming it, and nothing changes;
//   GET /v2/trace/setting: tracing is off, and the settings say so;
//   POST /v2/trace/setting: Orochi does not trace requests: only settings that keep it off
//     are accepted, anything else is 400.
#pragma once

#include <string>

#include "http/router.h"
#include "orochi/base/status.h"

namespace orochi::server::kserve {

void RegisterSettings(http::Router& router);

// The answers, apart from HTTP, for tests: a JSON text, or kInvalidArgument.
std::string LogSettingsJson();
Result<std::string> UpdateLogSettings(const std::string& body);
std::string TraceSettingsJson();
Result<std::string> UpdateTraceSettings(const std::string& body);

}  // namespace orochi::server::kserve
