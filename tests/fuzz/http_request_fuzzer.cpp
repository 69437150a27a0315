// Fuzzes the HTTP request parser as the server's transport (server/http/http_server.cpp) reads
// a connection: Boost.Beast's request_parser<string_body> with the server's header and body
// limits, over a read buffer bounded by the header limit, fed the client's bytes in pieces as
// a socket hands them over. Request after request on the one connection, as keep-alive and
// pipelining do, until the bytes end or a read fails. The reads are Beast's synchronous
// read_header and read_some, which take the same steps on the buffer and parser as the
// asynchronous ones the server calls.
//
// A refusal (an error_code, which the server answers with 4xx and a close) is fine. An
// exception is the finding this target is for: one out of the read ends the I/O thread, and so
// the server, for every client. A chunked trailer field of 65534 bytes did that: Beast's field
// table indexes a field in 16 bits and threw std::length_error (tests/fuzz/regressions/).
//
// Input: byte 0 chooses the header limit (bits 0-1: the default 16 KiB, the least and the most
// that http.max_header_bytes allows, or 4 KiB) and whether a PUT is an upload streamed to a
// file as the management port does (bit 2); byte 1 chooses the size of the pieces (0: as much
// as each read asks for). The rest is what the client sends.
#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/file_base.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/file_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_check.h"

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

// The server's own limits (server/http/http_server.h, config/orochi.json).
constexpr uint64_t kMaxBodyBytes = uint64_t{64} << 20;
constexpr uint64_t kMaxUploadBytes = uint64_t{4} << 30;  // management.max_upload_bytes

// A socket that hands out `bytes` in pieces of sizes drawn from a seed, then end of stream.
class PieceStream {
 public:
  PieceStream(std::string_view bytes, uint8_t seed) : bytes_(bytes), state_(seed) {}

  template <class MutableBuffers>
  size_t read_some(const MutableBuffers& buffers, beast::error_code& error) {
    error = {};
    if (bytes_.empty()) {
      error = asio::error::eof;
      return 0;
    }
    size_t piece = std::min(asio::buffer_size(buffers), bytes_.size());
    if (state_ != 0) {  // 1 to 64 bytes, or now and then up to 4 KiB, at once
      state_ = state_ * 1103515245 + 12345;
      const uint32_t draw = state_ >> 16;
      piece = std::min<size_t>(piece, (draw & 0x300) == 0 ? 1 + draw % 4096 : 1 + draw % 64);
    }
    const size_t copied = asio::buffer_copy(buffers, asio::buffer(bytes_.data(), piece));
    bytes_.remove_prefix(copied);
    return copied;
  }
  template <class MutableBuffers>
  size_t read_some(const MutableBuffers& buffers) {
    beast::error_code error;
    const size_t read = read_some(buffers, error);
    if (error) throw beast::system_error(error);
    return read;
  }

 private:
  std::string_view bytes_;
  uint32_t state_;
};

// Reads a body to its end as the server's ReadBody does: read_some until the parser is done.
template <class Parser>
beast::error_code ReadBody(PieceStream& stream, beast::flat_buffer& buffer, Parser& parser) {
  beast::error_code error;
  while (!parser.is_done() && !error) bhttp::read_some(stream, buffer, parser, error);
  return error;
}

// What the server keeps of each request it reads, whole or not, for its log line and answer
// (Session::Remember): the method, target and version, copied.
template <class Message>
void Remember(const Message& header) {
  bhttp::request<bhttp::string_body> current{header.method(), header.target(), header.version()};
  if (header.method() == bhttp::verb::unknown) current.method_string(header.method_string());
}

// A read that failed: the server answers 4xx, naming the request as far as it was read, and
// closes (OnRead).
bool Refused(const bhttp::request_parser<bhttp::string_body>& parser) {
  Remember(parser.get());
  return false;
}

// One request as Session::Read, OnHeader and ReadBody take it; false when the connection
// closes after it.
bool ReadRequest(PieceStream& stream, beast::flat_buffer& buffer, size_t max_header_bytes,
                 bool uploads) {
  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(static_cast<std::uint32_t>(max_header_bytes));
  parser.body_limit(std::max(kMaxBodyBytes, uploads ? kMaxUploadBytes : 0));
  beast::error_code error;
  bhttp::read_header(stream, buffer, parser, error);
  if (error == bhttp::error::end_of_stream) return false;  // the client hung up
  if (error) return Refused(parser);                       // 431 or 400

  const auto& header = parser.get();
  Remember(header);
  if (header.count(bhttp::field::transfer_encoding) != 0 && !parser.chunked()) {
    const std::string named(header[bhttp::field::transfer_encoding]);  // in the 400's message
    return false;
  }
  const bool upload = uploads && header.method() == bhttp::verb::put;
  const uint64_t limit = upload ? kMaxUploadBytes : kMaxBodyBytes;
  if (auto length = parser.content_length(); length && *length > limit) return false;  // 413
  if (upload) {
    // The management port's uploads: the same parser moved to a file body. /dev/null takes
    // the bytes; what is fuzzed is the parsing.
    bhttp::request_parser<bhttp::file_body> upload_parser(std::move(parser));
    upload_parser.body_limit(kMaxUploadBytes);
    upload_parser.get().body().open("/dev/null", beast::file_mode::write, error);
    OROCHI_FUZZ_CHECK(!error, "cannot open /dev/null");
    if (ReadBody(stream, buffer, upload_parser)) return false;
    return upload_parser.get().keep_alive();
  }
  parser.body_limit(kMaxBodyBytes);
  if (ReadBody(stream, buffer, parser)) return Refused(parser);
  return parser.release().keep_alive();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // http.max_header_bytes: its default, the least and the most the configuration takes.
  constexpr size_t kHeaderLimits[] = {16384, 1024, 65535, 4096};
  const size_t max_header_bytes = kHeaderLimits[data[0] & 3];
  const bool uploads = (data[0] & 4) != 0;
  PieceStream stream(std::string_view(reinterpret_cast<const char*>(data) + 2, size - 2), data[1]);
  // As the server's Session holds it: what the parser has not taken yet is a header, a chunk
  // line or a trailer section, none of which may grow past the header limit.
  beast::flat_buffer buffer(max_header_bytes);
  try {
    while (ReadRequest(stream, buffer, max_header_bytes, uploads)) {
    }
  } catch (const std::exception& error) {
    OROCHI_FUZZ_CHECK(false, error.what());
  }
  return 0;
}
