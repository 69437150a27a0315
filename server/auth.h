// Bearer-token checks for a listener: 401 without credentials, 403 with wrong ones. Tokens are
// compared in constant time and never logged.
#pragma once

#include <optional>
#include <string>

#include "http/http_server.h"
#include "orochi/base/status.h"

namespace orochi::server {

// The token named by a file or an environment variable (whichever is set); nullopt if neither.
// Errors: the file cannot be read, the variable is unset, or the token is empty.
Result<std::optional<std::string>> LoadToken(const std::string& file, const std::string& env,
                                             const std::string& what);

// Whether `address` is a loopback address (127.0.0.0/8, ::1).
bool IsLoopback(const std::string& address);

// A handler that requires `Authorization: Bearer <token>` before calling `next`.
http::Handler RequireToken(std::string token, http::Handler next);

}  // namespace orochi::server
