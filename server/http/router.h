// One route table for a listener: (method, path pattern) -> handler. Patterns are literal
// segments and {name} captures, e.g. "/v2/models/{model}/versions/{version}/infer".
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "http_server.h"

namespace orochi::server::http {

using PathParams = std::map<std::string, std::string, std::less<>>;
using RouteHandler = std::function<void(Request&&, const PathParams&, Responder)>;

class Router {
 public:
  void Add(boost::beast::http::verb method, std::string_view pattern, RouteHandler handler);
  // Runs the matching route; 404 when no pattern matches, 405 when only the method differs.
  void Dispatch(Request&& request, Responder respond) const;
  // The pattern that matches (for metrics labels), or "unmatched".
  std::string_view PatternOf(const Request& request) const;

 private:
  struct Route {
    boost::beast::http::verb method;
    std::string pattern;
    std::vector<std::string> segments;
    RouteHandler handler;
  };
  const Route* Match(const Request& request, PathParams* params, bool* path_matched) const;
  std::vector<Route> routes_;
};

}  // namespace orochi::server::http
