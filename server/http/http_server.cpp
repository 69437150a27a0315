#include "http_server.h"

#include <netinet/in.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/version.hpp>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "log.h"

namespace orochi::server::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

constexpr const char* kServerName = "orochi";

// The ports this process listens on (0: a free entry), and the highest descriptor a listener or
// connection has had, for CloseServerSocketsInChild. Plain atomics: the fork handler may take
// no lock.
constexpr size_t kMaxListeners = 64;
std::array<std::atomic<int>, kMaxListeners> listening_ports{};
std::atomic<int> highest_socket{-1};

void NoteSocket(int fd) {
  int seen = highest_socket.load(std::memory_order_relaxed);
  while (fd > seen && !highest_socket.compare_exchange_weak(seen, fd)) {
  }
}

// Runs in the child of any fork() of the server (a model calling os.fork(), say): the child
// is a copy of the whole process, with every listener and client connection. Left open there,
// a listening port stays taken after the server dies (a restart fails with "Address already
// in use") and a client's connection is not closed when the server closes it. The child gets
// none of them: every TCP socket whose local port is one the server listens on (its listeners
// and the connections they accepted). Only getsockname, getsockopt and close, which are
// async-signal-safe, as the child of a threaded process requires.
void CloseServerSocketsInChild() {
  const int highest = highest_socket.load(std::memory_order_relaxed);
  for (int fd = 0; fd <= highest; ++fd) {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) continue;
    int port = 0;
    if (address.ss_family == AF_INET) {
      port = ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
    } else if (address.ss_family == AF_INET6) {
      port = ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
    } else {
      continue;
    }
    int type = 0;
    socklen_t type_length = sizeof(type);
    if (port == 0 || ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_length) != 0 ||
        type != SOCK_STREAM) {
      continue;
    }
    for (const std::atomic<int>& listening : listening_ports) {
      if (listening.load(std::memory_order_relaxed) == port) {
        ::close(fd);
        break;
      }
    }
  }
}

void RegisterListeningPort(int fd, int port) {
  static std::once_flag registered;
  std::call_once(registered, [] { ::pthread_atfork(nullptr, nullptr, CloseServerSocketsInChild); });
  NoteSocket(fd);
  for (std::atomic<int>& entry : listening_ports) {
    int free = 0;
    if (entry.compare_exchange_strong(free, port)) return;
  }
}

void UnregisterListeningPort(int port) {
  for (std::atomic<int>& entry : listening_ports) {
    int expected = port;
    if (entry.compare_exchange_strong(expected, 0)) return;
  }
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const Limits& limits, const Handler& handler,
          std::shared_ptr<std::atomic<int64_t>> in_flight,
          std::shared_ptr<std::atomic<int64_t>> connections)
      : stream_(std::move(socket)),
        read_timer_(stream_.get_executor()),
        limits_(limits),
        handler_(handler),
        in_flight_(std::move(in_flight)),
        connections_(std::move(connections)) {}
  ~Session() {
    RemoveUpload();  // a session torn down mid-upload (the server stopping) leaves no file
    connections_->fetch_sub(1);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void Start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Read(); });
  }

 private:
  // The method and target of the request being read, for Limits::observe.
  void Remember(const Request& header) {
    current_ = Request{header.method(), header.target(), header.version()};
    if (header.method() == bhttp::verb::unknown) current_.method_string(header.method_string());
    current_set_ = true;
    head_ = header.method() == bhttp::verb::head;
    auto expect = header.find(bhttp::field::expect);
    expects_continue_ = header.version() >= 11 && expect != header.end() &&
                        beast::iequals(expect->value(), "100-continue");
  }

  void Read() {
    answering_done_ = false;
    current_set_ = false;
    current_ = Request{};
    head_ = false;
    expects_continue_ = false;
    probed_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(limits_.max_header_bytes));
    // The header decides which limit applies (uploads have their own): checked in OnHeader.
    parser_->body_limit(std::max(limits_.max_body_bytes, limits_.max_upload_bytes));
    reading_body_ = false;
    // The idle timeout covers waiting for the next request and reading its header.
    ArmReadTimer();
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = shared_from_this()](beast::error_code error, size_t) {
                               self->DisarmReadTimer();
                               self->OnHeader(error);
                             });
  }

  // Beast's own stream timeout closes the socket when it fires, which leaves no way to answer
  // 408: this timer cancels the pending read instead. A generation tells a stale expiry
  // (already queued when its read completed) from the current one.
  void ArmReadTimer() {
    stream_.expires_never();
    read_timed_out_ = false;
    const uint64_t generation = ++read_timer_generation_;
    read_timer_.expires_after(limits_.idle_timeout);
    read_timer_.async_wait([self = shared_from_this(), generation](beast::error_code error) {
      if (error || generation != self->read_timer_generation_) return;
      self->read_timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
  }

  void DisarmReadTimer() {
    ++read_timer_generation_;
    read_timer_.cancel();
  }

  // Reads the rest of a body with the idle timeout applying to each wait for more data, not
  // to the whole body: a slow upload is fine as long as its data keeps coming.
  template <class Parser, class Done>
  void ReadBody(Parser& parser, Done done) {
    reading_body_ = true;
    if (parser.is_done()) {
      done(beast::error_code{});
      return;
    }
    ArmReadTimer();
    bhttp::async_read_some(stream_, buffer_, parser,
                           [self = shared_from_this(), &parser, done = std::move(done)](
                               beast::error_code error, size_t) mutable {
                             self->DisarmReadTimer();
                             if (error) {
                               done(error);
                               return;
                             }
                             self->ReadBody(parser, std::move(done));
                           });
  }

  // The answer when the idle timeout cut a read: 408 once something of a request has come,
  // a quiet close for a keep-alive connection that simply stayed idle. False if no timeout.
  bool OnReadTimeout(beast::error_code error) {
    if (error != asio::error::operation_aborted || !read_timed_out_) return false;
    const std::string seconds = std::to_string(limits_.idle_timeout.count());
    if (reading_body_) {
      Fail(408, "no data of the request body arrived for " + seconds + " s");
    } else if (buffer_.size() > 0 || (parser_ && parser_->got_some())) {
      if (!current_set_ && parser_) Remember(parser_->get());
      Fail(408, "the request header was not complete within " + seconds + " s");
    } else {
      Close();
    }
    return true;
  }

  void OnHeader(beast::error_code error) {
    if (error) {
      OnRead(error);
      return;
    }
    const Request& header = parser_->get();
    version_ = header.version();
    Remember(header);
    if (header.count(bhttp::field::transfer_encoding) != 0 && !parser_->chunked()) {
      // Without chunked last the body's length is unknowable (RFC 9112, 6.3): reading none
      // would take the body for the next request on the connection.
      Fail(400, "Transfer-Encoding '" + std::string(header[bhttp::field::transfer_encoding]) +
                    "' is not supported: only a body ending in chunked, or Content-Length");
      return;
    }
    // Decided on the header alone, before the body is read: a refused request costs the
    // server no reading and no disk, and a client that sent `Expect: 100-continue` learns the
    // answer without sending its body.
    if (limits_.screen) {
      if (std::optional<Response> refused = limits_.screen(header)) {
        Refuse(std::move(*refused));
        return;
      }
    }
    const bool upload = limits_.stream_body_to_file && limits_.stream_body_to_file(header);
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
    ContinueThen([self = shared_from_this()] {
      self->ReadBody(*self->parser_, [self](beast::error_code error) { self->OnRead(error); });
    });
  }

  // Sends `100 Continue` first when the client waits for it (curl does for bodies over 1 KB,
  // for a second), then reads on.
  void ContinueThen(std::function<void()> read_body) {
    if (!expects_continue_) {
      read_body();
      return;
    }
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    stream_.expires_after(limits_.idle_timeout);
    asio::async_write(stream_, asio::buffer(kContinue.data(), kContinue.size()),
                      [self = shared_from_this(), read_body = std::move(read_body)](
                          beast::error_code error, size_t) {
                        if (error) {
                          self->RemoveUpload();
                          self->Close();
                          return;
                        }
                        read_body();
                      });
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
    struct stat created {};
    ::fstat(fd, &created);
    ::close(fd);
    upload_path_ = pattern;
    upload_inode_ = created.st_ino;
    upload_parser_.emplace(std::move(*parser_));
    upload_parser_->body_limit(limits_.max_upload_bytes);
    beast::error_code opened;
    upload_parser_->get().body().open(upload_path_.c_str(), beast::file_mode::write, opened);
    if (opened) {
      RemoveUpload();
      Fail(500, "cannot open the upload file: " + opened.message());
      return;
    }
    ContinueThen([self = shared_from_this()] {
      self->ReadBody(*self->upload_parser_,
                     [self](beast::error_code error) { self->OnUploaded(error); });
    });
  }

  // The upload file, unless the handler has renamed it away: a handler that refuses a
  // request without looking at its body leaves nothing behind either.
  void RemoveUpload() {
    if (upload_path_.empty()) return;
    struct stat now {};
    if (::stat(upload_path_.c_str(), &now) == 0 && now.st_ino == upload_inode_) {
      ::unlink(upload_path_.c_str());
    }
    upload_path_.clear();
  }

  void OnUploaded(beast::error_code error) {
    auto message = upload_parser_->release();
    message.body().close();
    upload_parser_.reset();
    if (error) {
      RemoveUpload();  // a broken upload leaves nothing behind
      if (OnReadTimeout(error)) return;
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
  void Fail(unsigned status, const std::string& message) { Refuse(ErrorResponse(status, message)); }

  // Answers a request whose body stays unread; the connection closes after the answer, since
  // the unread body stands between it and the next request.
  void Refuse(Response response) {
    keep_alive_ = false;
    body_unread_ = true;
    in_flight_->fetch_add(1);
    if (limits_.observe) limits_.observe(current_, response);
    Write(std::move(response));
  }

  void OnRead(beast::error_code error) {
    if (OnReadTimeout(error)) return;
    if (error == bhttp::error::end_of_stream || error == beast::error::timeout ||
        error == asio::error::operation_aborted || error == asio::error::connection_reset ||
        error == asio::error::eof) {
      Close();
      return;
    }
    if (error) {
      // The request cannot be read to its end: answer and close, the stream is out of sync.
      if (!current_set_) Remember(parser_->get());
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
      Fail(status, message);
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

  // While a request is handled nothing reads the socket; wait until it is readable and peek.
  // Bytes are a pipelined request, which the next Read takes. An error (a reset) means the
  // client is gone, and its queued work can be skipped. End of stream is ambiguous: a client
  // that closed, or one that only shut down its sending side after a complete request
  // (shutdown(SHUT_WR)), which is legitimate and still waits for the answer. To tell them
  // apart, an HTTP/1.1 client gets an interim `100 Continue`, which every HTTP/1.1 client must
  // accept before the final answer: a closed socket answers it with a reset, seen by the wait
  // for an error that follows. An HTTP/1.0 client cannot be asked, so its request runs.
  void WatchForHangUp(uint64_t request_number) {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(),
                                                         request_number](beast::error_code error) {
      if (error || request_number != self->request_number_ || self->answering_done_) return;
      const int fd = self->stream_.socket().native_handle();
      char byte = 0;
      ssize_t peeked = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (peeked < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        self->client_gone_->store(true);
        return;
      }
      if (peeked != 0 || self->version_ < 11 || self->probed_) return;
      // Only into an empty send queue, where the probe's few bytes go out whole: a part of it
      // in front of the answer would corrupt the response stream.
      int unsent = 0;
      if (::ioctl(fd, TIOCOUTQ, &unsent) != 0 || unsent != 0) return;
      self->probed_ = true;
      static constexpr std::string_view kProbe = "HTTP/1.1 100 Continue\r\n\r\n";
      if (::send(fd, kProbe.data(), kProbe.size(), MSG_DONTWAIT | MSG_NOSIGNAL) < 0 &&
          errno != EAGAIN && errno != EWOULDBLOCK) {
        self->client_gone_->store(true);
        return;
      }
      self->stream_.socket().async_wait(
          tcp::socket::wait_error, [self, request_number](beast::error_code waited) {
            if (waited || request_number != self->request_number_ || self->answering_done_) {
              return;
            }
            self->client_gone_->store(true);
          });
    });
  }

  void Write(Response response) {
    answering_done_ = true;
    RemoveUpload();
    response.version(version_);
    response.set(bhttp::field::server, kServerName);
    response.keep_alive(keep_alive_);
    response.prepare_payload();
    if (head_) response.body().clear();  // Content-Length stays that of the GET
    auto shared = std::make_shared<Response>(std::move(response));
    stream_.expires_after(limits_.idle_timeout);
    bhttp::async_write(stream_, *shared,
                       [self = shared_from_this(), shared](beast::error_code error, size_t) {
                         self->in_flight_->fetch_sub(1);
                         if (!error && self->body_unread_) {
                           self->LingerThenClose();
                           return;
                         }
                         if (error || !self->keep_alive_) {
                           self->Close();
                           return;
                         }
                         self->Read();
                       });
  }

  // Closing with the client's body still arriving would reset the connection, and the reset
  // can destroy the answer before the client reads it: stop sending, then read and drop what
  // comes for a moment (as nginx's lingering close does) before closing.
  void LingerThenClose() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(std::chrono::seconds(2));
    Discard();
  }

  void Discard() {
    stream_.async_read_some(asio::buffer(discarded_),
                            [self = shared_from_this()](beast::error_code error, size_t) {
                              if (error) {
                                self->stream_.close();
                                return;
                              }
                              self->Discard();
                            });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  asio::steady_timer read_timer_;  // see ArmReadTimer
  uint64_t read_timer_generation_ = 0;
  bool read_timed_out_ = false;
  bool reading_body_ = false;
  bool expects_continue_ = false;
  bool head_ = false;    // the request is a HEAD: its answer goes without the body
  bool probed_ = false;  // see WatchForHangUp
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::optional<bhttp::request_parser<bhttp::file_body>> upload_parser_;
  std::string upload_path_;  // while an upload file is this session's to remove
  ino_t upload_inode_ = 0;
  const Limits& limits_;
  const Handler& handler_;
  std::shared_ptr<std::atomic<int64_t>> in_flight_;
  std::shared_ptr<std::atomic<int64_t>> connections_;  // counted by the acceptor, one is ours
  bool keep_alive_ = true;
  bool body_unread_ = false;
  Request current_;
  bool current_set_ = false;  // the answer went out before the request's body was read
  std::array<char, 16384> discarded_{};
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
      acceptor_(asio::make_strand(io)),
      accept_pause_(acceptor_.get_executor()) {}

HttpServer::~HttpServer() {  // the owner stops the io_context first
  if (port_ != 0) UnregisterListeningPort(port_);
}

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
  RegisterListeningPort(acceptor_.native_handle(), port_);
  Accept();
  return Status::Ok();
}

void HttpServer::StopAccepting() {
  asio::dispatch(acceptor_.get_executor(), [this] {
    beast::error_code ignored;
    acceptor_.close(ignored);
    accept_pause_.cancel();
  });
}

void HttpServer::Accept() {
  acceptor_.async_accept(asio::make_strand(io_), [this](beast::error_code error,
                                                        tcp::socket socket) {
    if (error == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (error) {
      // Out of descriptors (EMFILE, ENFILE) or memory: the connection stays in the
      // backlog, so accepting again at once fails again at once, at full CPU, and starves
      // every other listener. Pause; connections that close meanwhile free descriptors.
      if (!accept_failing_) {
        Log(LogLevel::kWarning, "cannot accept connections; retrying every 100 ms",
            {{"port", std::to_string(port_), false}, {"error", error.message()}});
      }
      accept_failing_ = true;
      accept_pause_.expires_after(std::chrono::milliseconds(100));
      accept_pause_.async_wait([this](beast::error_code waited) {
        if (!waited && acceptor_.is_open()) Accept();
      });
      return;
    }
    NoteSocket(socket.native_handle());
    if (accept_failing_) {
      Log(LogLevel::kInfo, "accepting connections again", {{"port", std::to_string(port_), false}});
      accept_failing_ = false;
    }
    if (connections_->load() >= static_cast<int64_t>(limits_.max_connections)) {
      RefuseConnection(std::move(socket));
    } else {
      at_capacity_ = false;
      connections_->fetch_add(1);
      socket.set_option(tcp::no_delay(true), error);
      std::make_shared<Session>(std::move(socket), limits_, handler_, in_flight_, connections_)
          ->Start();
    }
    Accept();
  });
}

void HttpServer::RefuseConnection(tcp::socket socket) {
  if (!at_capacity_) {
    Log(LogLevel::kWarning, "too many connections; refusing new ones with 503",
        {{"port", std::to_string(port_), false},
         {"max_connections", std::to_string(limits_.max_connections), false}});
    at_capacity_ = true;
  }
  // Best effort, without waiting: the client learns why instead of seeing a bare close.
  static const std::string kAnswer = [] {
    const std::string body = R"({"error":"the server has too many open connections; retry later"})";
    return "HTTP/1.1 503 Service Unavailable\r\nServer: orochi\r\nContent-Type: "
           "application/json\r\nConnection: close\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  [[maybe_unused]] ssize_t sent =
      ::send(socket.native_handle(), kAnswer.data(), kAnswer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  beast::error_code ignored;
  socket.shutdown(tcp::socket::shutdown_send, ignored);
  socket.close(ignored);
}

}  // namespace orochi::server::http
