// The HTTP transport: accepts connections and turns bytes into requests and responses
// (Boost.Beast on Asio). It knows nothing of what the requests mean; a Handler does.
//
// HTTP/1.1 with keep-alive; requests on one connection are answered in order (pipelined
// requests wait in the read buffer). `Expect: 100-continue` is answered with 100 once the
// header has passed the limits and Limits::screen, or with the final status right away.
// Header and body sizes over their limits get 431 and 413 (a chunked body's chunk lines and
// trailer fields count against the header limit: nothing a client sends is buffered without a
// bound); a request whose header is not complete within the idle timeout, whose body stops
// arriving for that long, or whose body is not complete within the request timeout gets 408; a
// Transfer-Encoding not ending in chunked gets 400. Each with a JSON error body, then the
// connection closes. HEAD requests are answered without the body. A handler that throws is
// answered 500; no client input ends the process.
//
// Connections: at most max_connections per listener and max_connections_per_client from one
// address. When either is reached, the oldest idle connection (waiting for its next request)
// of that scope is closed to make room, as nginx does with keep-alive connections; only when
// none is idle is the new connection refused with 503. Held connections therefore lock out
// neither new clients nor health checks unless every connection is busy with a request.
//
// Thread-safety: the server runs on the io_context's threads; a Responder may be called from
// any thread, once.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "buffer_budget.h"
#include "orochi/base/status.h"

namespace orochi::server::http {

using Request = boost::beast::http::request<boost::beast::http::string_body>;
using Response = boost::beast::http::response<boost::beast::http::string_body>;
// A response whose body goes out in parts as they come (chunked transfer coding), e.g. Server-Sent
// Events. One part at a time: the next Send only once the previous one's `sent` was called.
class BodyStream {
 public:
  virtual ~BodyStream() = default;
  // Writes `data` as the next part; `sent` is called (on the connection's thread) once it is
  // written (true) or the connection failed (false: the client is gone, the stream is over).
  virtual void Send(std::string data, std::function<void(bool ok)> sent) = 0;
  // Ends the body; the connection then goes on to its next request (or closes).
  virtual void End() = 0;
};
using StartStream =
    std::function<std::shared_ptr<BodyStream>(Response header, std::string hang_up_probe)>;

// Answers one request; callable from any thread, once (later calls are ignored). It also tells
// whether the client has gone away meanwhile, so that work for it can be skipped.
class Responder {
 public:
  Responder() = default;
  Responder(std::function<void(Response)> send, std::shared_ptr<const std::atomic<bool>> gone,
            StartStream start_stream = nullptr)
      : send_(std::move(send)), gone_(std::move(gone)), start_stream_(std::move(start_stream)) {}
  void operator()(Response response) const { send_(std::move(response)); }
  // Answers with `header` (its body is ignored) and a body sent in parts through the result;
  // null when the request was answered already. Counts as the answer.
  //
  // `hang_up_probe`, when not empty, is a part every reader of this body ignores (an SSE
  // comment): while the stream is open, a client that stops sending (end of stream, which is
  // also what a half-closed but listening client sends) is sent it, and a closed one answers
  // with a reset, so that client_gone turns true between parts, not only at the next write.
  std::shared_ptr<BodyStream> Stream(Response header, std::string hang_up_probe = {}) const {
    return start_stream_ ? start_stream_(std::move(header), std::move(hang_up_probe)) : nullptr;
  }
  // True once the connection was closed by the client while its request was being handled.
  bool client_gone() const { return gone_ != nullptr && gone_->load(); }
  // The same client, another way to send (e.g. adding a log line); `on_stream` sees the header
  // of a streamed answer before it goes.
  Responder Wrap(std::function<void(Response)> send,
                 std::function<void(const Response&)> on_stream = nullptr) const {
    StartStream start = start_stream_;
    if (on_stream && start) {
      start = [start, on_stream = std::move(on_stream)](Response header, std::string probe) {
        on_stream(header);
        return start(std::move(header), std::move(probe));
      };
    }
    return {std::move(send), gone_, std::move(start)};
  }

 private:
  std::function<void(Response)> send_;
  std::shared_ptr<const std::atomic<bool>> gone_;
  StartStream start_stream_;
};
using Handler = std::function<void(Request&& request, Responder respond)>;

class ConnectionTable;  // the open connections of one listener (http_server.cpp)

struct Limits {
  size_t max_header_bytes = size_t{16} << 10;
  uint64_t max_body_bytes = uint64_t{64} << 20;
  // Waiting for a request and its header; while a body is read, the longest wait for more.
  std::chrono::seconds idle_timeout{60};
  // From the end of a request's header to the end of its body, however steadily the body
  // trickles in (a byte a second never trips the idle timeout). Uploads have their own.
  std::chrono::seconds request_timeout{60};
  std::chrono::seconds upload_timeout{3600};
  // Open connections per listener, and from one client address; see the header comment.
  size_t max_connections = 4096;
  size_t max_connections_per_client = 1024;
  // Request bodies held in memory (uploads to a file excepted); null: no bound.
  std::shared_ptr<BufferBudget> body_budget;
  // Requests this selects (from their header) have their body streamed to a new file in
  // upload_directory, up to max_upload_bytes, instead of kept in memory: the handler then gets
  // the file's path as request.body(). The transport created the file and alone removes it:
  // when the answer goes out (or the upload breaks off, or the connection goes), unless the
  // handler has renamed it away to keep it. A handler never removes it itself. Until then the
  // transport holds an flock(2) on it: servers sharing the directory tell a live upload from
  // one a dead server left.
  std::function<bool(const Request& header)> stream_body_to_file;
  std::string upload_directory;
  uint64_t max_upload_bytes = 0;
  // Looks at each request's header before its body is read: a response refuses the request
  // there, before a byte of the body is read or stored, and the connection closes after it
  // (e.g. a missing token, so that an unauthenticated upload never reaches the disk). `client`
  // is the connection's other end.
  std::function<std::optional<Response>(const Request& header,
                                        const boost::asio::ip::tcp::endpoint& client)>
      screen;
  // Told of each answer the transport gives by itself (a request it cannot read, a limit, a
  // refusal by screen), with the request's method and target as far as they were read: the
  // handler never sees these requests, yet they belong in the logs and metrics.
  std::function<void(const Request& header, const Response& response)> observe;
};

// A response with a JSON body `{"error": message}`, as KServe v2 clients expect.
Response ErrorResponse(unsigned status, const std::string& message);
Response JsonResponse(unsigned status, std::string body);

class HttpServer {
 public:
  HttpServer(boost::asio::io_context& io, Limits limits, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts accepting. Port 0 picks a free port (see port()).
  Status Listen(const std::string& address, int port);
  // Starts accepting on `fd`, a socket already bound and listening (from a supervisor that
  // keeps the port across restarts); takes ownership.
  Status Adopt(int fd);
  int port() const { return port_; }
  // Stops accepting new connections; requests in flight are still answered.
  void StopAccepting();
  // From now on every answer closes its connection (`Connection: close`), so that keep-alive
  // clients reconnect, through a load balancer that routes them elsewhere once this server is
  // out of its endpoints. Accepting goes on.
  void CloseAfterEachAnswer();
  // Requests read and not yet answered.
  int64_t in_flight() const { return in_flight_->load(); }
  // Connections reading or answering a request, or accepted within the last second without
  // one yet: after StopAccepting, their requests are still to come (in_flight() counts only
  // requests read), so a drain waits for them too.
  int64_t busy_connections() const;

 private:
  // Listen's and Adopt's end, the listener open: registers it, makes it non-blocking, and
  // starts accepting and tending it.
  Status StartAccepting();
  void Accept();
  // Stops accepting for good if the listener was shut down or shared (listening_socket.h).
  void TendListenerEverySecond();
  void RefuseConnection(boost::asio::ip::tcp::socket socket, const std::string& why);
  void CloseAcceptor();

  boost::asio::io_context& io_;
  Limits limits_;
  Handler handler_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer accept_pause_;  // after a failed accept (out of descriptors)
  boost::asio::steady_timer upkeep_;        // TendListener, every kListenerUpkeepMs
  bool accept_failing_ = false;             // logged once per episode; on the acceptor's strand
  bool at_capacity_ = false;
  std::shared_ptr<ConnectionTable> connections_;
  int port_ = 0;
  std::shared_ptr<std::atomic<int64_t>> in_flight_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace orochi::server::http
