// One route table for a listener: (method, path pattern) -> handler. Patterns are literal
// segments and {name} captures, e.g. "/v2/models/{model}/versions/{version}/infer".
//
// Precedence: when several patterns match a path, the one with a literal segment where the
// others capture, at the leftmost position where they differ, wins, whatever the order the
// routes were added in: `GET /v2/models/stats` is the all-models statistics route, not
// `/v2/models/{model}` with model "stats". Registration order decides only between patterns
// of the same shape (which a listener should not have).
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
 private:
  struct Route {
    boost::beast::http::verb method;
    std::string pattern;
    std::vector<std::string> segments;
    std::string precedence;  // PrecedenceKey(segments)
    RouteHandler handler;
  };

 public:
  // A request's route, looked up once: its pattern labels metrics and logs, Run answers it.
  struct Resolved {
    const Route* route = nullptr;
    PathParams params;
    bool path_matched = false;  // some route has this path, with another method
    // Lives as long as the router: a label that may outlive the request.
    std::string_view pattern() const {
      return route != nullptr ? std::string_view(route->pattern) : std::string_view("unmatched");
    }
  };

  void Add(boost::beast::http::verb method, std::string_view pattern, RouteHandler handler);
  Resolved Resolve(const Request& request) const;
  // Runs the resolved route; 404 when no pattern matched, 405 (with Allow) when only the
  // method differs. HEAD runs the GET route; the transport sends its answer without the body.
  void Run(const Resolved& resolved, Request&& request, Responder respond) const;
  void Dispatch(Request&& request, Responder respond) const {
    Resolved resolved = Resolve(request);
    Run(resolved, std::move(request), std::move(respond));
  }

 private:
  // The methods of the routes with this path, for a 405's Allow: only a 405 pays for it.
  std::string AllowedMethods(const std::vector<std::string>& segments) const;
  static bool IsCapture(const std::string& segment);
  // A pattern's shape, one character a segment: '0' literal, '1' capture (see Add).
  static std::string PrecedenceKey(const std::vector<std::string>& segments);
  static bool Matches(const Route& route, const std::vector<std::string>& segments,
                      PathParams* captured);

  std::vector<Route> routes_;  // most specific first (see Add)
};

}  // namespace orochi::server::http
