#include "compression.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <boost/beast/core/string.hpp>
#include <cctype>
#include <string_view>
#include <vector>

namespace orochi::server::http {
namespace {

namespace bhttp = boost::beast::http;

std::string_view Trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

std::vector<std::string_view> SplitList(std::string_view text) {
  std::vector<std::string_view> items;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = Trim(text.substr(start, comma - start));
    if (!item.empty()) items.push_back(item);
    start = comma + 1;
  }
  return items;
}

enum class Coding { kGzip, kZlib, kRawDeflate };

// Inflates `input` into `output`, stopping with false once the output would pass `max_bytes`
// (`*over` set) or at corrupt data (`*error` set). Concatenated gzip members are all read.
bool Inflate(std::string_view input, Coding coding, uint64_t max_bytes, std::string* output,
             bool* over, std::string* error) {
  z_stream stream{};
  const int window = coding == Coding::kGzip   ? 16 + MAX_WBITS
                     : coding == Coding::kZlib ? MAX_WBITS
                                               : -MAX_WBITS;
  if (inflateInit2(&stream, window) != Z_OK) {
    *error = "cannot start decompressing";
    return false;
  }
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(input.data()));
  stream.avail_in = static_cast<uInt>(std::min<size_t>(input.size(), UINT32_MAX));
  size_t input_left = input.size() - stream.avail_in;
  std::array<char, size_t{64} * 1024> chunk{};
  bool ok = true;
  while (true) {
    stream.next_out = reinterpret_cast<Bytef*>(chunk.data());
    stream.avail_out = static_cast<uInt>(chunk.size());
    const int result = inflate(&stream, Z_NO_FLUSH);
    const size_t produced = chunk.size() - stream.avail_out;
    if (output->size() + produced > max_bytes) {
      *over = true;
      ok = false;
      break;
    }
    output->append(chunk.data(), produced);
    if (stream.avail_in == 0 && input_left > 0) {  // a body past 4 GB, fed a part at a time
      const size_t next = std::min<size_t>(input_left, UINT32_MAX);
      stream.avail_in = static_cast<uInt>(next);
      input_left -= next;
    }
    if (result == Z_STREAM_END) {
      if (stream.avail_in == 0 && input_left == 0) break;
      if (coding == Coding::kGzip) {  // another gzip member follows
        inflateReset(&stream);
        continue;
      }
      *error = "data follows the end of the compressed stream";
      ok = false;
      break;
    }
    if (result == Z_BUF_ERROR && stream.avail_in == 0 && input_left == 0) {
      *error = "the compressed data is truncated";
      ok = false;
      break;
    }
    if (result != Z_OK && result != Z_BUF_ERROR) {
      *error = stream.msg != nullptr ? stream.msg : "corrupt compressed data";
      ok = false;
      break;
    }
  }
  inflateEnd(&stream);
  return ok;
}

bool Compress(const std::string& input, const std::string& encoding, std::string* output) {
  z_stream stream{};
  // Fastest level: most of the saving for a fraction of the time, on an I/O thread.
  if (deflateInit2(&stream, Z_BEST_SPEED, Z_DEFLATED,
                   encoding == "gzip" ? 16 + MAX_WBITS : MAX_WBITS, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    return false;
  }
  output->resize(deflateBound(&stream, input.size()));
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(input.data()));
  stream.avail_in = static_cast<uInt>(input.size());
  stream.next_out = reinterpret_cast<Bytef*>(output->data());
  stream.avail_out = static_cast<uInt>(output->size());
  const int result = deflate(&stream, Z_FINISH);
  output->resize(stream.total_out);
  deflateEnd(&stream);
  return result == Z_STREAM_END;
}

std::string Lower(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower;
}

}  // namespace

std::optional<Response> DecodeRequestBody(Request& request, uint64_t max_bytes,
                                          const std::string& limit_name) {
  auto header = request.find(bhttp::field::content_encoding);
  if (header == request.end()) return std::nullopt;
  std::string coding;
  for (std::string_view item : SplitList(header->value())) {
    std::string name = Lower(item);
    if (name == "identity") continue;
    if (name != "gzip" && name != "x-gzip" && name != "deflate") {
      Response refused = ErrorResponse(
          415, "Content-Encoding '" + std::string(item) +
                   "' is not supported: send the body as is, or with gzip or deflate");
      refused.set(bhttp::field::accept_encoding, "gzip, deflate");
      return refused;
    }
    if (!coding.empty()) {
      return ErrorResponse(415, "Content-Encoding '" + std::string(header->value()) +
                                    "' applies more than one coding: only one of gzip or deflate "
                                    "is supported");
    }
    coding = name == "deflate" ? "deflate" : "gzip";
  }
  if (coding.empty()) {
    request.erase(bhttp::field::content_encoding);
    return std::nullopt;
  }
  std::string decoded;
  bool over = false;
  std::string error;
  bool ok = false;
  if (coding == "gzip") {
    ok = Inflate(request.body(), Coding::kGzip, max_bytes, &decoded, &over, &error);
  } else {
    // "deflate" is the zlib format (RFC 9110, 8.4.1.2), but some clients send raw deflate data:
    // that is tried when the zlib header is not there.
    ok = Inflate(request.body(), Coding::kZlib, max_bytes, &decoded, &over, &error);
    if (!ok && !over && decoded.empty()) {
      error.clear();
      ok = Inflate(request.body(), Coding::kRawDeflate, max_bytes, &decoded, &over, &error);
    }
  }
  if (over) {
    return ErrorResponse(413, "the request body decompresses (" + coding +
                                  ") to more than the limit of " + std::to_string(max_bytes) +
                                  " bytes (" + limit_name + ")");
  }
  if (!ok) {
    return ErrorResponse(400, "the request body is not valid " + coding +
                                  " data (Content-Encoding: " + std::string(header->value()) +
                                  "): " + error);
  }
  request.body() = std::move(decoded);
  request.erase(bhttp::field::content_encoding);
  request.content_length(request.body().size());
  return std::nullopt;
}

std::string ChooseResponseEncoding(const Request& request) {
  auto header = request.find(bhttp::field::accept_encoding);
  if (header == request.end()) return "";
  double gzip = 0;
  double deflate = 0;
  double any = -1;  // "*": any coding not named
  bool gzip_named = false;
  bool deflate_named = false;
  for (std::string_view item : SplitList(header->value())) {
    std::string_view name = Trim(item.substr(0, item.find(';')));
    double quality = 1;
    if (size_t semicolon = item.find(';'); semicolon != std::string_view::npos) {
      std::string parameter = Lower(Trim(item.substr(semicolon + 1)));
      if (parameter.starts_with("q=")) {
        try {
          quality = std::stod(parameter.substr(2));
        } catch (...) {
          quality = 0;  // unreadable: not acceptable
        }
      }
    }
    const std::string lower = Lower(name);
    if (lower == "gzip" || lower == "x-gzip") {
      gzip = quality;
      gzip_named = true;
    } else if (lower == "deflate") {
      deflate = quality;
      deflate_named = true;
    } else if (lower == "*") {
      any = quality;
    }
  }
  if (!gzip_named && any >= 0) gzip = any;
  if (!deflate_named && any >= 0) deflate = any;
  if (gzip > 0 && gzip >= deflate) return "gzip";
  if (deflate > 0) return "deflate";
  return "";
}

void EncodeResponseBody(Response& response, const std::string& encoding) {
  if (response.body().size() < kMinCompressedResponseBytes) return;
  response.set(bhttp::field::vary, "Accept-Encoding");
  if (encoding.empty() || response.count(bhttp::field::content_encoding) != 0) return;
  std::string compressed;
  if (!Compress(response.body(), encoding, &compressed)) return;  // sent as it is
  response.body() = std::move(compressed);
  response.set(bhttp::field::content_encoding, encoding);
}

}  // namespace orochi::server::http
