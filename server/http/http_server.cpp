#include "http_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/version.hpp>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

namespace orochi::server::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

constexpr const char* kServerName = "orochi";

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const Limits& limits, const Handler& handler,
          std::shared_ptr<std::atomic<int64_t>> in_flight)
      : stream_(std::move(socket)),
        limits_(limits),
        handler_(handler),
        in_flight_(std::move(in_flight)) {}

  void Start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Read(); });
  }

 private:
  void Read() {
    answering_done_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(limits_.max_header_bytes));
    // The header decides which limit applies (uploads have their own): checked in OnHeader.
    parser_->body_limit(std::max(limits_.max_body_bytes, limits_.max_upload_bytes));
    stream_.expires_after(limits_.idle_timeout);
    bhttp::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code error, size_t) { self->OnHeader(error); });
  }

  void OnHeader(beast::error_code error) {
    if (error) {
      OnRead(error);
      return;
    }
    const bool upload = limits_.stream_body_to_file && limits_.stream_body_to_file(parser_->get());
    const uint64_t limit = upload ? limits_.max_upload_bytes : limits_.max_body_bytes;
    if (auto length = parser_->content_length(); length && *length > limit) {
      Fail(413, std::string(upload ? "the upload" : "the request body") +
                    " is larger than the limit of " + std::to_string(limit) + " bytes");
      return;
    }
    if (upload) {
      StartUpload();
      return;
    }
    parser_->body_limit(limits_.max_body_bytes);  // for chunked bodies, counted as they come
    bhttp::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code error, size_t) { self->OnRead(error); });
  }

  // The body goes straight to a new file; the request that reaches the handler carries the
  // file's path as its body.
  void StartUpload() {
    std::string pattern = limits_.upload_directory + "/.upload-XXXXXX";
    int fd = mkstemp(pattern.data());
    if (fd < 0) {
      Fail(500, "cannot create an upload file in " + limits_.upload_directory + ": " +
                    std::strerror(errno));
      return;
    }
    ::fchmod(fd, 0644);  // mkstemp makes it private; a deployed package is an ordinary file
    ::close(fd);
    upload_path_ = pattern;
    upload_parser_.emplace(std::move(*parser_));
    upload_parser_->body_limit(limits_.max_upload_bytes);
    beast::error_code opened;
    upload_parser_->get().body().open(upload_path_.c_str(), beast::file_mode::write, opened);
    if (opened) {
      ::unlink(upload_path_.c_str());
      Fail(500, "cannot open the upload file: " + opened.message());
      return;
    }
    // An upload may take longer than an idle gap; it still has an upper bound.
    stream_.expires_after(
        std::max<std::chrono::seconds>(limits_.idle_timeout, std::chrono::hours(1)));
    bhttp::async_read(
        stream_, buffer_, *upload_parser_,
        [self = shared_from_this()](beast::error_code error, size_t) { self->OnUploaded(error); });
  }

  void OnUploaded(beast::error_code error) {
    auto message = upload_parser_->release();
    message.body().close();
    upload_parser_.reset();
    if (error) {
      ::unlink(upload_path_.c_str());  // a broken upload leaves nothing behind
      if (error == bhttp::error::body_limit) {
        Fail(413, "the upload is larger than the limit of " +
                      std::to_string(limits_.max_upload_bytes) + " bytes");
      } else if (error == boost::system::errc::no_space_on_device ||
                 error == boost::system::errc::file_too_large) {
        Fail(507, "the server cannot store the upload: " + error.message());
      } else {
        Close();
      }
      return;
    }
    Request request{message.method(), message.target(), message.version()};
    for (const auto& field : message.base()) request.set(field.name_string(), field.value());
    request.keep_alive(message.keep_alive());
    request.body() = upload_path_;
    Dispatch(std::move(request));
  }

  // Answers a request that could not be read and closes the connection after the answer.
  void Fail(unsigned status, const std::string& message) {
    keep_alive_ = false;
    in_flight_->fetch_add(1);
    Write(ErrorResponse(status, message));
  }

  void OnRead(beast::error_code error) {
    if (error == bhttp::error::end_of_stream || error == beast::error::timeout ||
        error == asio::error::operation_aborted || error == asio::error::connection_reset ||
        error == asio::error::eof) {
      Close();
      return;
    }
    if (error) {
      // The request cannot be read to its end: answer and close, the stream is out of sync.
      unsigned status = 400;
      std::string message = "malformed HTTP request: " + error.message();
      if (error == bhttp::error::body_limit) {
        status = 413;
        message = "the request body is larger than the limit of " +
                  std::to_string(limits_.max_body_bytes) + " bytes";
      } else if (error == bhttp::error::header_limit) {
        status = 431;
        message = "the request header is larger than the limit of " +
                  std::to_string(limits_.max_header_bytes) + " bytes";
      }
      keep_alive_ = false;
      in_flight_->fetch_add(1);
      Write(ErrorResponse(status, message));
      return;
    }
    Dispatch(parser_->release());
  }

  void Dispatch(Request request) {
    keep_alive_ = request.keep_alive();
    version_ = request.version();
    in_flight_->fetch_add(1);
    stream_.expires_never();  // the handler may take as long as the model needs
    auto answered = std::make_shared<std::atomic<bool>>(false);
    client_gone_ = std::make_shared<std::atomic<bool>>(false);
    WatchForHangUp(++request_number_);
    handler_(std::move(request), Responder(
                                     [self = shared_from_this(), answered](Response response) {
                                       if (answered->exchange(true)) {
                                         return;  // a handler bug must not write twice
                                       }
                                       asio::dispatch(
                                           self->stream_.get_executor(),
                                           [self, response = std::move(response)]() mutable {
                                             self->Write(std::move(response));
                                           });
                                     },
                                     client_gone_));
  }

  // While a request is handled nothing reads the socket; wait until it is readable and peek:
  // end of stream means the client hung up (its queued work can be skipped), while bytes mean
  // a pipelined request, which the next Read takes.
  void WatchForHangUp(uint64_t request_number) {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(),
                                                         request_number](beast::error_code error) {
      if (error || request_number != self->request_number_ || self->answering_done_) return;
      char byte = 0;
      ssize_t peeked =
          ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (peeked == 0 || (peeked < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        self->client_gone_->store(true);
      }
    });
  }

  void Write(Response response) {
    answering_done_ = true;
    response.version(version_);
    response.set(bhttp::field::server, kServerName);
    response.keep_alive(keep_alive_);
    response.prepare_payload();
    auto shared = std::make_shared<Response>(std::move(response));
    stream_.expires_after(limits_.idle_timeout);
    bhttp::async_write(stream_, *shared,
                       [self = shared_from_this(), shared](beast::error_code error, size_t) {
                         self->in_flight_->fetch_sub(1);
                         if (error || !self->keep_alive_) {
                           self->Close();
                           return;
                         }
                         self->Read();
                       });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::optional<bhttp::request_parser<bhttp::file_body>> upload_parser_;
  std::string upload_path_;
  const Limits& limits_;
  const Handler& handler_;
  std::shared_ptr<std::atomic<int64_t>> in_flight_;
  bool keep_alive_ = true;
  unsigned version_ = 11;
  uint64_t request_number_ = 0;
  bool answering_done_ = false;  // the current request's response is being written
  std::shared_ptr<std::atomic<bool>> client_gone_;
};

}  // namespace

Response JsonResponse(unsigned status, std::string body) {
  Response response{static_cast<bhttp::status>(status), 11};
  response.set(bhttp::field::content_type, "application/json");
  response.body() = std::move(body);
  return response;
}

Response ErrorResponse(unsigned status, const std::string& message) {
  return JsonResponse(status, nlohmann::json{{"error", message}}.dump(
                                  -1, ' ', false, nlohmann::json::error_handler_t::replace));
}

HttpServer::HttpServer(asio::io_context& io, Limits limits, Handler handler)
    : io_(io),
      limits_(std::move(limits)),
      handler_(std::move(handler)),
      acceptor_(asio::make_strand(io)) {}

HttpServer::~HttpServer() = default;  // the owner stops the io_context first

Status HttpServer::Listen(const std::string& address, int port) {
  beast::error_code error;
  auto ip = asio::ip::make_address(address, error);
  if (error) return InvalidArgument("'" + address + "' is not an IP address");
  tcp::endpoint endpoint(ip, static_cast<unsigned short>(port));
  acceptor_.open(endpoint.protocol(), error);
  if (!error) acceptor_.set_option(asio::socket_base::reuse_address(true), error);
  if (!error) acceptor_.bind(endpoint, error);
  if (!error) acceptor_.listen(asio::socket_base::max_listen_connections, error);
  if (error) {
    return Unavailable("cannot listen on " + address + ":" + std::to_string(port) + ": " +
                       error.message());
  }
  port_ = acceptor_.local_endpoint().port();
  Accept();
  return Status::Ok();
}

void HttpServer::StopAccepting() {
  asio::dispatch(acceptor_.get_executor(), [this] {
    beast::error_code ignored;
    acceptor_.close(ignored);
  });
}

void HttpServer::Accept() {
  acceptor_.async_accept(
      asio::make_strand(io_), [this](beast::error_code error, tcp::socket socket) {
        if (error == asio::error::operation_aborted || !acceptor_.is_open()) return;
        if (!error) {
          socket.set_option(tcp::no_delay(true), error);
          std::make_shared<Session>(std::move(socket), limits_, handler_, in_flight_)->Start();
        }
        Accept();
      });
}

}  // namespace orochi::server::http
