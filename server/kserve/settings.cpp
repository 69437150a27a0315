#include "settings.h"

#include <nlohmann/json.hpp>

#include "log.h"

namespace orochi::server::kserve {
namespace {

namespace bhttp = boost::beast::http;
using Json = nlohmann::json;

std::string Named(const std::string& text) {
  return Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
}

Result<Json> ReadObject(const std::string& body, const char* what) {
  Json json = Json::parse(body, nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    return InvalidArgument(std::string("the ") + what + " must be a JSON object");
  }
  return json;
}

Json LogSettings() {
  const std::string level = CurrentLogLevel();
  return {{"log_file", ""},  // stderr
          {"log_info", level == "debug" || level == "info"},
          {"log_warning", level != "error"},
          {"log_error", true},
          {"log_verbose_level", level == "debug" ? 1 : 0},
          {"log_format", CurrentLogFormat()}};
}

// Tracing is off; these are the values Triton reports for it, as strings, as Triton writes
// them.
Json TraceSettings() {
  return {{"trace_level", Json::array({"OFF"})},
          {"trace_rate", "1000"},
          {"trace_count", "-1"},
          {"log_frequency", "0"},
          {"trace_file", ""},
          {"trace_mode", "triton"}};
}

http::Response Answer(const Result<std::string>& outcome) {
  if (!outcome.ok()) return http::ErrorResponse(400, outcome.status().message());
  return http::JsonResponse(200, *outcome);
}

}  // namespace

std::string LogSettingsJson() { return LogSettings().dump(); }

Result<std::string> UpdateLogSettings(const std::string& body) {
  OROCHI_ASSIGN_OR_RETURN(Json update, ReadObject(body, "log settings"));
  Json settings = LogSettings();
  for (const auto& [key, value] : update.items()) {
    if (key == "log_file") {
      if (!value.is_string() || !value.get<std::string>().empty()) {
        return InvalidArgument(
            "log_file " + value.dump() +
            " is not supported: Orochi logs to stderr only (log_file \"\"); redirect it, or let "
            "the service manager or container runtime collect it");
      }
    } else if (key == "log_info" || key == "log_warning" || key == "log_error") {
      if (!value.is_boolean()) return InvalidArgument(key + " must be true or false");
      settings[key] = value;
    } else if (key == "log_verbose_level") {
      if (!value.is_number_integer() || value.get<int64_t>() < 0) {
        return InvalidArgument("log_verbose_level must be an integer >= 0");
      }
      settings[key] = value;
    } else if (key == "log_format") {
      if (!value.is_string() || (value != "text" && value != "json")) {
        return InvalidArgument("log_format " + value.dump() +
                               " is not supported: Orochi writes \"text\" (logfmt) or \"json\" "
                               "lines (Triton's \"default\" and \"ISO8601\" are not available)");
      }
      settings[key] = value;
    } else {
      return InvalidArgument("the log setting " + Named(key) +
                             " is not supported (log_file, log_info, log_warning, log_error, "
                             "log_verbose_level, log_format)");
    }
  }
  // Orochi's log has one threshold: each level on means the more severe ones are on too.
  const bool info = settings["log_info"].get<bool>();
  const bool warning = settings["log_warning"].get<bool>();
  const bool error = settings["log_error"].get<bool>();
  const bool verbose = settings["log_verbose_level"].get<int64_t>() > 0;
  if (!error) {
    return InvalidArgument("log_error false is not supported: Orochi always logs errors");
  }
  if ((info && !warning) || (verbose && !info)) {
    return InvalidArgument(
        "this combination is not supported: Orochi logs everything from one level up (verbose, "
        "info, warning, error), so a level on needs every more severe one on");
  }
  const std::string level = verbose ? "debug" : info ? "info" : warning ? "warning" : "error";
  ConfigureLog(level, settings["log_format"].get<std::string>());
  Log(LogLevel::kWarning, "log settings changed",
      {{"level", level}, {"format", CurrentLogFormat()}});
  return LogSettingsJson();
}

std::string TraceSettingsJson() { return TraceSettings().dump(); }

Result<std::string> UpdateTraceSettings(const std::string& body) {
  OROCHI_ASSIGN_OR_RETURN(Json update, ReadObject(body, "trace settings"));
  const Json current = TraceSettings();
  for (const auto& [key, value] : update.items()) {
    auto found = current.find(key);
    if (found == current.end()) {
      return InvalidArgument("the trace setting " + Named(key) +
                             " is not supported: Orochi does not trace requests");
    }
    // Triton clears a setting with null: the same as leaving it as it is here.
    const bool unchanged =
        value.is_null() || value == *found || (key == "trace_level" && value == Json("OFF"));
    if (!unchanged) {
      return InvalidArgument("Orochi does not trace requests: " + key + " " + value.dump() +
                             " cannot be set; only trace_level [\"OFF\"] and the values GET "
                             "/v2/trace/setting reports are accepted");
    }
  }
  return TraceSettingsJson();
}

void RegisterSettings(http::Router& router) {
  router.Add(bhttp::verb::get, "/v2/logging",
             [](http::Request&&, const http::PathParams&, const http::Responder& respond) {
               respond(http::JsonResponse(200, LogSettingsJson()));
             });
  router.Add(bhttp::verb::post, "/v2/logging",
             [](http::Request&& request, const http::PathParams&, const http::Responder& respond) {
               respond(Answer(UpdateLogSettings(request.body())));
             });
  router.Add(bhttp::verb::get, "/v2/trace/setting",
             [](http::Request&&, const http::PathParams&, const http::Responder& respond) {
               respond(http::JsonResponse(200, TraceSettingsJson()));
             });
  router.Add(bhttp::verb::post, "/v2/trace/setting",
             [](http::Request&& request, const http::PathParams&, const http::Responder& respond) {
               respond(Answer(UpdateTraceSettings(request.body())));
             });
}

}  // namespace orochi::server::kserve
