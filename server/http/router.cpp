#include "router.h"

#include <algorithm>

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

bool Router::IsCapture(const std::string& segment) {
  return segment.size() > 2 && segment.front() == '{' && segment.back() == '}';
}

std::string Router::PrecedenceKey(const std::vector<std::string>& segments) {
  std::string key;
  for (const std::string& segment : segments) key += IsCapture(segment) ? '1' : '0';
  return key;
}

void Router::Add(boost::beast::http::verb method, std::string_view pattern, RouteHandler handler) {
  std::vector<std::string> segments = Split(pattern);
  std::string key = PrecedenceKey(segments);
  routes_.push_back(
      {method, std::string(pattern), std::move(segments), std::move(key), std::move(handler)});
  // Kept ordered by precedence, so that Resolve's first match is the most specific route
  // whatever order the routes were added in: `/v2/models/stats` before `/v2/models/{model}`.
  // Comparing the keys as strings is a total order (a literal, '0', sorts before a capture,
  // '1', at the leftmost difference); stable, so routes of one shape keep their order.
  std::stable_sort(routes_.begin(), routes_.end(),
                   [](const Route& a, const Route& b) { return a.precedence < b.precedence; });
}

bool Router::Matches(const Route& route, const std::vector<std::string>& segments,
                     PathParams* captured) {
  if (route.segments.size() != segments.size()) return false;
  for (size_t i = 0; i < segments.size(); ++i) {
    const std::string& part = route.segments[i];
    if (IsCapture(part)) {
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
  // Each method once, though several patterns may match the path (`/v2/models/stats` and
  // `/v2/models/{model}` both have GET).
  std::vector<std::string> methods;
  auto note = [&methods](std::string_view method) {
    if (std::find(methods.begin(), methods.end(), method) == methods.end()) {
      methods.emplace_back(method);
    }
  };
  for (const Route& route : routes_) {
    if (!Matches(route, segments, nullptr)) continue;
    note(boost::beast::http::to_string(route.method));
    if (route.method == boost::beast::http::verb::get) note("HEAD");
  }
  std::string allowed;
  for (const std::string& method : methods) allowed += (allowed.empty() ? "" : ", ") + method;
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
