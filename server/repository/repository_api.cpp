#include "repository_api.h"

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

#include "kserve/handlers.h"
#include "load_request.h"

namespace orochi::server::repository {
namespace {

namespace bhttp = boost::beast::http;
using Json = nlohmann::json;

// A repository operation's answer; what a success has to add (that copies were abandoned
// while unloading) goes in "message".
http::Response Answer(const Result<std::string>& outcome, Json body = Json::object()) {
  if (!outcome.ok()) {
    const Status& status = outcome.status();
    std::string message = status.message();
    if (!status.detail().empty()) message += "\n" + status.detail();
    return http::ErrorResponse(kserve::HttpStatusOf(status.code()), message);
  }
  if (!outcome->empty()) body["message"] = *outcome;
  return http::JsonResponse(200, body.dump(-1, ' ', false, Json::error_handler_t::replace));
}

std::optional<int64_t> ParseVersion(const std::string& text) {
  if (text.empty() || text.size() > 18 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  int64_t version = std::stoll(text);
  return version >= 1 ? std::optional<int64_t>(version) : std::nullopt;
}

// ?load=false in the target.
bool LoadRequested(const http::Request& request) {
  std::string_view target = request.target();
  size_t query = target.find('?');
  if (query == std::string_view::npos) return true;
  std::string_view parameters = target.substr(query + 1);
  return parameters.find("load=false") == std::string_view::npos &&
         parameters.find("load=0") == std::string_view::npos;
}

std::vector<std::string> PathSegments(std::string_view target) {
  target = target.substr(0, target.find('?'));
  std::vector<std::string> segments;
  size_t start = 0;
  while (start < target.size()) {
    size_t slash = target.find('/', start);
    if (slash == std::string_view::npos) slash = target.size();
    if (slash > start) segments.emplace_back(target.substr(start, slash - start));
    start = slash + 1;
  }
  return segments;
}

}  // namespace

bool IsUpload(const http::Request& header) {
  if (header.method() != bhttp::verb::put) return false;
  std::vector<std::string> segments = PathSegments(header.target());
  return segments.size() == 6 && segments[0] == "v2" && segments[1] == "repository" &&
         segments[2] == "models" && segments[4] == "versions";
}

RepositoryApi::RepositoryApi(ModelService& models) : models_(models) {}

void RepositoryApi::Register(http::Router& router) {
  router.Add(
      bhttp::verb::put, "/v2/repository/models/{model}/versions/{version}",
      [this](http::Request&& request, const http::PathParams& params,
             const http::Responder& respond) {
        const std::string uploaded = request.body();  // the file the body was streamed to
        const std::string& name = params.at("model");
        std::optional<int64_t> version = ParseVersion(params.at("version"));
        if (!version) {  // the transport removes the unused upload file
          respond(http::ErrorResponse(400,
                                      "deploy to /v2/repository/models/<name>/versions/<integer "
                                      "version >= 1>: the version must be an integer >= 1"));
          return;
        }
        const bool load = LoadRequested(request);
        Result<std::string> deployed = models_.Deploy(name, *version, uploaded, load);
        Json loaded = Json::array();
        for (int64_t each : models_.Versions(name)) loaded.push_back(std::to_string(each));
        respond(Answer(deployed, {{"name", name},
                                  {"version", std::to_string(*version)},
                                  {"deployed", true},
                                  {"loaded_versions", loaded}}));
      });
  router.Add(
      bhttp::verb::delete_, "/v2/repository/models/{model}/versions/{version}",
      // ModelService refuses a bad {model} (it would leave the repository's directory): 400.
      [this](http::Request&&, const http::PathParams& params, const http::Responder& respond) {
        std::optional<int64_t> version = ParseVersion(params.at("version"));
        if (!version) {
          respond(http::ErrorResponse(400, "the version must be an integer >= 1"));
          return;
        }
        respond(Answer(models_.Delete(params.at("model"), version)));
      });
  router.Add(
      bhttp::verb::delete_, "/v2/repository/models/{model}",
      [this](http::Request&&, const http::PathParams& params, const http::Responder& respond) {
        respond(Answer(models_.Delete(params.at("model"), std::nullopt)));
      });
  router.Add(bhttp::verb::post, "/v2/repository/index",
             [this](http::Request&&, const http::PathParams&, const http::Responder& respond) {
               Result<std::vector<ModelService::IndexEntry>> entries = models_.Index();
               if (!entries.ok()) {
                 respond(Answer(entries.status()));
                 return;
               }
               Json index = Json::array();
               for (const ModelService::IndexEntry& entry : *entries) {
                 Json item{{"name", entry.name},
                           {"version", std::to_string(entry.version)},
                           {"state", entry.state}};
                 if (!entry.reason.empty()) item["reason"] = entry.reason;
                 index.push_back(item);
               }
               respond(http::JsonResponse(200, index.dump()));
             });
  router.Add(bhttp::verb::post, "/v2/repository/models/{model}/load",
             [this](http::Request&& request, const http::PathParams& params,
                    const http::Responder& respond) {
               Result<LoadOverrides> overrides =
                   ParseLoadRequest(request.body(), params.at("model"));
               if (!overrides.ok()) {
                 respond(Answer(overrides.status()));
                 return;
               }
               respond(Answer(models_.LoadModel(params.at("model"), *overrides)));
             });
  router.Add(bhttp::verb::post, "/v2/repository/models/{model}/unload",
             [this](http::Request&& request, const http::PathParams& params,
                    const http::Responder& respond) {
               if (Status checked = CheckUnloadRequest(request.body()); !checked.ok()) {
                 respond(Answer(checked));
                 return;
               }
               respond(Answer(models_.UnloadModel(params.at("model"))));
             });
}

}  // namespace orochi::server::repository
