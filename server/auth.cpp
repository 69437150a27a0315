#include "auth.h"

#include <boost/beast/core/string.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

namespace orochi::server {
namespace {

// Compares without stopping at the first difference, so the time taken says nothing about
// how much of a guess was right.
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    difference |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  }
  return difference == 0 && !b.empty();
}

std::string Trim(std::string text) {
  const char* space = " \t\r\n";
  text.erase(0, text.find_first_not_of(space));
  text.erase(text.find_last_not_of(space) + 1);
  return text;
}

}  // namespace

Result<std::optional<std::string>> LoadToken(const std::string& file, const std::string& env,
                                             const std::string& what) {
  std::string token;
  if (!file.empty()) {
    std::ifstream input(file);
    if (!input) return InvalidArgument("cannot read the " + what + " token file " + file);
    std::ostringstream text;
    text << input.rdbuf();
    token = Trim(text.str());
  } else if (!env.empty()) {
    const char* value = std::getenv(env.c_str());
    if (value == nullptr) {
      return InvalidArgument("the " + what + " token variable " + env + " is not set");
    }
    token = Trim(value);
  } else {
    return std::optional<std::string>();
  }
  if (token.empty()) return InvalidArgument("the " + what + " token is empty");
  return std::optional<std::string>(std::move(token));
}

bool IsLoopback(const std::string& address) {
  return address.starts_with("127.") || address == "::1" || address == "localhost";
}

TokenCheck CheckBearer(std::optional<std::string_view> authorization, const std::string& token) {
  if (!authorization) return TokenCheck::kMissing;
  // The scheme is case-insensitive (RFC 9110, 11.1), and spaces may follow it: "bearer x" and
  // "BEARER  x" are the same credentials as "Bearer x".
  const std::string_view value = *authorization;
  constexpr std::string_view kScheme = "bearer";
  const size_t credentials = value.find_first_not_of(' ', kScheme.size());
  if (value.size() <= kScheme.size() || value[kScheme.size()] != ' ' ||
      !boost::beast::iequals(value.substr(0, kScheme.size()), kScheme) ||
      credentials == std::string_view::npos ||
      !ConstantTimeEquals(std::string(value.substr(credentials)), token)) {
    return TokenCheck::kWrong;
  }
  return TokenCheck::kValid;
}

std::optional<http::Response> CheckToken(const std::string& token, const http::Request& header) {
  auto authorization = header.find(boost::beast::http::field::authorization);
  switch (CheckBearer(authorization == header.end()
                          ? std::nullopt
                          : std::optional<std::string_view>(authorization->value()),
                      token)) {
    case TokenCheck::kValid:
      return std::nullopt;
    case TokenCheck::kMissing: {
      http::Response response = http::ErrorResponse(401,
                                                    "authentication required: send "
                                                    "'Authorization: Bearer <token>'");
      response.set(boost::beast::http::field::www_authenticate, "Bearer");
      return response;
    }
    case TokenCheck::kWrong:
      break;
  }
  return http::ErrorResponse(403, "the bearer token is not valid");
}

}  // namespace orochi::server
