#include "router.h"

namespace orochi::server::http {
namespace {

std::vector<std::string> Split(std::string_view path) {
  std::vector<std::string> segments;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    if (slash > start) segments.emplace_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return segments;
}

std::string_view PathOf(const Request& request) {
  std::string_view target = request.target();
  return target.substr(0, target.find('?'));
}

}  // namespace

void Router::Add(boost::beast::http::verb method, std::string_view pattern, RouteHandler handler) {
  routes_.push_back({method, std::string(pattern), Split(pattern), std::move(handler)});
}

const Router::Route* Router::Match(const Request& request, PathParams* params,
                                   bool* path_matched) const {
  std::vector<std::string> segments = Split(PathOf(request));
  *path_matched = false;
  for (const Route& route : routes_) {
    if (route.segments.size() != segments.size()) continue;
    PathParams captured;
    bool matches = true;
    for (size_t i = 0; i < segments.size() && matches; ++i) {
      const std::string& part = route.segments[i];
      if (part.size() > 2 && part.front() == '{' && part.back() == '}') {
        captured[part.substr(1, part.size() - 2)] = segments[i];
      } else {
        matches = part == segments[i];
      }
    }
    if (!matches) continue;
    *path_matched = true;
    if (route.method != request.method()) continue;
    *params = std::move(captured);
    return &route;
  }
  return nullptr;
}

void Router::Dispatch(Request&& request, Responder respond) const {
  PathParams params;
  bool path_matched = false;
  const Route* route = Match(request, &params, &path_matched);
  if (route == nullptr) {
    std::string what = std::string(request.method_string()) + " " + std::string(PathOf(request));
    respond(path_matched ? ErrorResponse(405, "method not allowed: " + what)
                         : ErrorResponse(404, "no such endpoint: " + what));
    return;
  }
  route->handler(std::move(request), params, std::move(respond));
}

std::string_view Router::PatternOf(const Request& request) const {
  PathParams params;
  bool path_matched = false;
  const Route* route = Match(request, &params, &path_matched);
  return route != nullptr ? std::string_view(route->pattern) : std::string_view("unmatched");
}

}  // namespace orochi::server::http
