// The route table: one lookup per request gives the handler and the metrics label; a 405
// answer names the methods the path has.
#include "http/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <vector>

namespace orochi::server::http {
namespace {

namespace bhttp = boost::beast::http;

Router TwoMethodsOnOnePath(int* ran) {
  Router router;
  auto note = [ran](Request&&, const PathParams& params, const Responder& respond) {
    *ran += 1;
    respond(JsonResponse(200, "\"" + params.at("model") + "\""));
  };
  router.Add(bhttp::verb::get, "/v2/models/{model}", note);
  router.Add(bhttp::verb::post, "/v2/models/{model}", note);
  router.Add(bhttp::verb::post, "/v2/models/{model}/infer", note);
  return router;
}

std::optional<Response> Answer(const Router& router, bhttp::verb method,
                               const std::string& target) {
  std::optional<Response> answer;
  Router::Resolved resolved = router.Resolve(Request{method, target, 11});
  router.Run(resolved, Request{method, target, 11},
             Responder([&answer](Response response) { answer = std::move(response); }, nullptr));
  return answer;
}

TEST(Router, OneLookupGivesTheHandlerItsCapturesAndThePatternForTheLabel) {
  int ran = 0;
  const Router router = TwoMethodsOnOnePath(&ran);
  Router::Resolved resolved =
      router.Resolve(Request{bhttp::verb::post, "/v2/models/m/infer?x", 11});
  EXPECT_EQ(resolved.pattern(), "/v2/models/{model}/infer");
  EXPECT_EQ(resolved.params.at("model"), "m");
  EXPECT_EQ(router.Resolve(Request{bhttp::verb::head, "/v2/models/m", 11}).pattern(),
            "/v2/models/{model}");
  EXPECT_EQ(router.Resolve(Request{bhttp::verb::get, "/v2/nothing", 11}).pattern(), "unmatched");
  EXPECT_EQ(router.Resolve(Request{bhttp::verb::put, "/v2/models/m", 11}).pattern(), "unmatched");

  std::optional<Response> answer = Answer(router, bhttp::verb::get, "/v2/models/m");
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->result_int(), 200);
  EXPECT_EQ(answer->body(), "\"m\"");
  EXPECT_EQ(answer->count(bhttp::field::allow), 0);
  EXPECT_EQ(ran, 1);
}

TEST(Router, OnlyAMethodMismatchIsA405AndItsAllowListsThePathsMethods) {
  int ran = 0;
  const Router router = TwoMethodsOnOnePath(&ran);
  std::optional<Response> wrong_method = Answer(router, bhttp::verb::delete_, "/v2/models/m");
  ASSERT_TRUE(wrong_method);
  EXPECT_EQ(wrong_method->result_int(), 405);
  EXPECT_EQ((*wrong_method)[bhttp::field::allow], "GET, HEAD, POST");
  std::optional<Response> wrong_path = Answer(router, bhttp::verb::get, "/v2/models/m/x/y");
  ASSERT_TRUE(wrong_path);
  EXPECT_EQ(wrong_path->result_int(), 404);
  EXPECT_EQ(wrong_path->count(bhttp::field::allow), 0);
  EXPECT_EQ(ran, 0);
}

// The inference listener's routes (kserve/handlers.cpp, server.cpp), each with a path that must
// reach it. Added in the order given and in reverse: precedence, not order, decides.
struct RouteCase {
  bhttp::verb method;
  const char* pattern;
  const char* path;
};
const RouteCase kInferenceRoutes[] = {
    {bhttp::verb::get, "/v2/health/live", "/v2/health/live"},
    {bhttp::verb::get, "/v2/health/ready", "/v2/health/ready"},
    {bhttp::verb::get, "/v2", "/v2"},
    {bhttp::verb::get, "/v2/logging", "/v2/logging"},
    {bhttp::verb::post, "/v2/logging", "/v2/logging"},
    {bhttp::verb::get, "/v2/trace/setting", "/v2/trace/setting"},
    {bhttp::verb::post, "/v2/trace/setting", "/v2/trace/setting"},
    {bhttp::verb::get, "/v2/models/{model}", "/v2/models/m"},
    {bhttp::verb::get, "/v2/models/{model}/versions/{version}", "/v2/models/m/versions/1"},
    {bhttp::verb::get, "/v2/models/{model}/ready", "/v2/models/m/ready"},
    {bhttp::verb::get, "/v2/models/{model}/versions/{version}/ready",
     "/v2/models/m/versions/1/ready"},
    {bhttp::verb::get, "/v2/models/{model}/config", "/v2/models/m/config"},
    {bhttp::verb::get, "/v2/models/{model}/versions/{version}/config",
     "/v2/models/m/versions/1/config"},
    {bhttp::verb::get, "/v2/models/stats", "/v2/models/stats"},
    {bhttp::verb::get, "/v2/models/{model}/stats", "/v2/models/m/stats"},
    {bhttp::verb::get, "/v2/models/{model}/versions/{version}/stats",
     "/v2/models/m/versions/1/stats"},
    {bhttp::verb::post, "/v2/models/{model}/infer", "/v2/models/m/infer"},
    {bhttp::verb::post, "/v2/models/{model}/versions/{version}/infer",
     "/v2/models/m/versions/1/infer"},
    {bhttp::verb::post, "/v2/repository/index", "/v2/repository/index"},
    {bhttp::verb::post, "/v2/repository/models/{model}/load", "/v2/repository/models/m/load"},
    {bhttp::verb::post, "/v2/repository/models/{model}/unload", "/v2/repository/models/m/unload"},
};

Router InferenceRoutes(bool reversed) {
  Router router;
  std::vector<RouteCase> cases(std::begin(kInferenceRoutes), std::end(kInferenceRoutes));
  if (reversed) std::reverse(cases.begin(), cases.end());
  for (const RouteCase& each : cases) {
    router.Add(each.method, each.pattern, [](Request&&, const PathParams&, const Responder&) {});
  }
  return router;
}

TEST(Router, EveryInferenceRouteIsReachedWhateverTheRegistrationOrder) {
  for (bool reversed : {false, true}) {
    const Router router = InferenceRoutes(reversed);
    for (const RouteCase& each : kInferenceRoutes) {
      EXPECT_EQ(router.Resolve(Request{each.method, each.path, 11}).pattern(), each.pattern)
          << bhttp::to_string(each.method) << " " << each.path << (reversed ? " (reversed)" : "");
    }
  }
}

TEST(Router, ALiteralSegmentBeatsACaptureAtTheLeftmostDifference) {
  for (bool literal_first : {false, true}) {
    Router router;
    auto none = [](Request&&, const PathParams&, const Responder&) {};
    const char* patterns[] = {"/a/{x}/c", "/a/b/{y}", "/a/{x}/{y}"};
    if (literal_first) std::swap(patterns[0], patterns[1]);
    for (const char* pattern : patterns) router.Add(bhttp::verb::get, pattern, none);
    EXPECT_EQ(router.Resolve(Request{bhttp::verb::get, "/a/b/c", 11}).pattern(), "/a/b/{y}");
    EXPECT_EQ(router.Resolve(Request{bhttp::verb::get, "/a/z/c", 11}).pattern(), "/a/{x}/c");
    EXPECT_EQ(router.Resolve(Request{bhttp::verb::get, "/a/z/z", 11}).pattern(), "/a/{x}/{y}");
  }
}

TEST(Router, AMethodOnlyTheCaptureHasIsServedThereAndAllowNamesEachMethodOnce) {
  Router router;
  auto none = [](Request&&, const PathParams&, const Responder&) {};
  router.Add(bhttp::verb::get, "/v2/models/{model}", none);
  router.Add(bhttp::verb::delete_, "/v2/models/{model}", none);
  router.Add(bhttp::verb::get, "/v2/models/stats", none);
  EXPECT_EQ(router.Resolve(Request{bhttp::verb::delete_, "/v2/models/stats", 11}).pattern(),
            "/v2/models/{model}");
  std::optional<Response> wrong = Answer(router, bhttp::verb::post, "/v2/models/stats");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->result_int(), 405);
  EXPECT_EQ((*wrong)[bhttp::field::allow], "GET, HEAD, DELETE");
}

}  // namespace
}  // namespace orochi::server::http
