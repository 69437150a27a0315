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

bool Router::Matches(const Route& route, const std::vector<std::string>& segments,
                     PathParams* captured) {
  if (route.segments.size() != segments.size()) return false;
  for (size_t i = 0; i < segments.size(); ++i) {
    const std::string& part = route.segments[i];
    if (part.size() > 2 && part.front() == '{' && part.back() == '}') {
      if (captured != nullptr) (*captured)[part.substr(1, part.size() - 2)] = segments[i];
    } else if (part != segments[i]) {
      return false;
    }
  }
  return true;
}

Router::Resolved Router::Resolve(const Request& request) const {
  std::vector<std::string> segments = Split(PathOf(request));
  Resolved resolved;
  for (const Route& route : routes_) {
    PathParams captured;
    if (!Matches(route, segments, &captured)) continue;
    resolved.path_matched = true;
    const bool head_of_get = request.method() == boost::beast::http::verb::head &&
                             route.method == boost::beast::http::verb::get;
    if (route.method != request.method() && !head_of_get) continue;
    resolved.route = &route;
    resolved.params = std::move(captured);
    return resolved;
  }
  return resolved;
}

std::string Router::AllowedMethods(const std::vector<std::string>& segments) const {
  std::string allowed;
  for (const Route& route : routes_) {
    if (!Matches(route, segments, nullptr)) continue;
    allowed +=
        (allowed.empty() ? "" : ", ") + std::string(boost::beast::http::to_string(route.method));
    if (route.method == boost::beast::http::verb::get) allowed += ", HEAD";
  }
  return allowed;
}

void Router::Run(const Resolved& resolved, Request&& request, Responder respond) const {
  if (resolved.route == nullptr) {
    std::string what = std::string(request.method_string()) + " " + std::string(PathOf(request));
    if (!resolved.path_matched) {
      respond(ErrorResponse(404, "no such endpoint: " + what));
      return;
    }
    Response response = ErrorResponse(405, "method not allowed: " + what);
    response.set(boost::beast::http::field::allow, AllowedMethods(Split(PathOf(request))));
    respond(std::move(response));
    return;
  }
  resolved.route->handler(std::move(request), resolved.params, std::move(respond));
}

}  // namespace orochi::server::http
