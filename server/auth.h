// Bearer-token checks for a listener: 401 without credentials, 403 with wrong ones. Tokens are
// compared in constant time and never logged.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "http/http_server.h"
#include "orochi/base/status.h"

namespace orochi::server {

// The token named by a file or an environment variable (whichever is set); nullopt if neither.
// Errors: the file cannot be read, the variable is unset, or the token is empty.
Result<std::optional<std::string>> LoadToken(const std::string& file, const std::string& env,
                                             const std::string& what);

// Whether `address` is a loopback address (127.0.0.0/8, ::1).
bool IsLoopback(const std::string& address);

// How an `Authorization` value (nullopt: none sent) compares with `token`. The scheme is
// case-insensitive ("bearer x" is "Bearer x"); the token is compared in constant time.
enum class TokenCheck { kValid, kMissing, kWrong };
TokenCheck CheckBearer(std::optional<std::string_view> authorization, const std::string& token);

// The refusal of a request whose header lacks `Authorization: Bearer <token>` (401) or carries
// another token (403); nullopt when it carries `token`. It needs only the header, so the
// transport asks it before reading a body (http::Limits::screen).
std::optional<http::Response> CheckToken(const std::string& token, const http::Request& header);

}  // namespace orochi::server
