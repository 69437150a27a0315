// The route table: one lookup per request gives the handler and the metrics label; a 405
// answer names the methods the path has.
#include "http/router.h"

#include <gtest/gtest.h>

#include <optional>

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

}  // namespace
}  // namespace orochi::server::http
