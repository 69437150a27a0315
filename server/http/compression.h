// HTTP content coding for the listeners' requests and responses (RFC 9110, 8.4 and 12.5.3):
// request bodies sent with `Content-Encoding: gzip` or `deflate` are decompressed before any
// handler reads them, and responses are compressed for clients whose `Accept-Encoding` takes
// gzip or deflate. zlib, streamed, so that a request's decompressed size is bounded as it is
// produced: a body of a few KB that inflates to gigabytes (a decompression bomb) stops at the
// limit, never inflated whole.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>

#include "http_server.h"

namespace orochi::server::http {

// Responses smaller than this are sent as they are: compressing them saves less than its cost.
constexpr size_t kMinCompressedResponseBytes = 1024;

// Replaces the body of `request` by its decoding per its Content-Encoding (identity, gzip,
// x-gzip, deflate; names case-insensitive, one coding besides identity) and removes the header.
// A refusal to send instead: 415 for another coding (naming the ones supported), 413 when the
// decoded body would pass `max_bytes` (named `limit_name` in the message), 400 for data that is
// not what its coding says.
std::optional<Response> DecodeRequestBody(Request& request, uint64_t max_bytes,
                                          const std::string& limit_name);

// The coding to answer `request` with: "gzip" or "deflate" when its Accept-Encoding takes one
// (q > 0; gzip preferred), else "".
std::string ChooseResponseEncoding(const Request& request);

// Compresses the body of `response` with `encoding` ("gzip", "deflate", or "" for none) when it
// has at least kMinCompressedResponseBytes and no Content-Encoding yet, and sets
// `Vary: Accept-Encoding` on every response that size, compressed or not, for caches.
void EncodeResponseBody(Response& response, const std::string& encoding);

}  // namespace orochi::server::http
