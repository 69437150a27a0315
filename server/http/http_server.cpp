#include "http_server.h"

#include <netinet/in.h>
#include <pthread.h>
#include <sys/file.h>
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
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>
#include <utility>

#include "exit_guard.h"
#include "listening_socket.h"
#include "log.h"

namespace orochi::server::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr const char* kServerName = "orochi";

}  // namespace

// The open connections of one listener: from which address each comes and which wait idle
// between requests, so that a full listener (or a client at its cap) makes room by closing the
// oldest idle connection instead of refusing a new client. Thread-safe: the acceptor and each
// session run on strands of their own.
// A request body that comes slower than this, over at least kSlowBodyGrace, is closed to make
// room when its listener is full (ConnectionTable::EvictSlowestBody), in bytes a second.
constexpr double kMinBodyRate = 1024;
constexpr Clock::duration kSlowBodyGrace = std::chrono::seconds(2);

// How a connection's request body is coming in: written by its session with each read, without
// the table's lock (a large body takes thousands of reads), and read by the table only when its
// listener is full.
struct BodyMeter {
  // Steady-clock nanoseconds when reading the body began; 0 while no body is being read.
  std::atomic<int64_t> since{0};
  std::atomic<uint64_t> bytes{0};  // of the body read since

  void Begin() {
    bytes.store(0, std::memory_order_relaxed);
    since.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  }
  void End() { since.store(0, std::memory_order_relaxed); }
  void Add(size_t read) { bytes.fetch_add(read, std::memory_order_relaxed); }
};

class ConnectionTable {
 public:
  enum class Admission { kAdmitted, kListenerFull, kClientFull };

  // Whether a connection from `client` may open, closing an idle one to make room if needed;
  // if so, it is counted under the returned id (see Add).
  Admission Admit(const asio::ip::address& client, size_t max_total, size_t max_per_client) {
    std::lock_guard lock(mutex_);
    auto counted = per_client_.find(client);
    if (counted != per_client_.end() && counted->second >= max_per_client &&
        !EvictOldestIdle(&client)) {
      return Admission::kClientFull;
    }
    if (entries_.size() >= max_total && !EvictOldestIdle(nullptr) && !EvictSlowestBody()) {
      return Admission::kListenerFull;
    }
    return Admission::kAdmitted;
  }
  // `evict` closes the connection if it is still idle, or cuts its slow body; callable from any
  // thread. `body` is the connection's, kept up to date by its session.
  uint64_t Add(const asio::ip::address& client, std::shared_ptr<const BodyMeter> body,
               std::function<void()> evict) {
    std::lock_guard lock(mutex_);
    const uint64_t id = next_id_++;
    entries_.emplace(id, Entry{client, std::move(body), std::move(evict)});
    per_client_[client]++;
    return id;
  }
  void Remove(uint64_t id) {
    std::lock_guard lock(mutex_);
    auto found = entries_.find(id);
    if (found == entries_.end()) return;
    auto counted = per_client_.find(found->second.client);
    if (--counted->second == 0) per_client_.erase(counted);
    entries_.erase(found);
  }
  // Idle: waiting for a request with nothing of it read yet.
  void SetIdle(uint64_t id, bool idle) {
    std::lock_guard lock(mutex_);
    auto found = entries_.find(id);
    if (found == entries_.end() || found->second.evicting) return;
    found->second.idle = idle;
    if (idle) {
      found->second.idle_since = Clock::now();
    } else {
      found->second.fresh = false;
    }
  }
  // The connections a drain waits for: reading or answering a request, or opened less than
  // `fresh_wait` ago with no request begun yet (it may be on its way: a balancer connects,
  // then writes). The others are idle keep-alive connections.
  size_t Busy(Clock::duration fresh_wait) const {
    std::lock_guard lock(mutex_);
    const Clock::time_point now = Clock::now();
    return static_cast<size_t>(
        std::count_if(entries_.begin(), entries_.end(), [&](const auto& item) {
          const Entry& entry = item.second;
          return !entry.idle || (entry.fresh && now - entry.added < fresh_wait);
        }));
  }
  size_t size() const {
    std::lock_guard lock(mutex_);
    return entries_.size();
  }
  // Once set, every answer says `Connection: close` and its connection closes after it.
  void SetClosing() { closing_ = true; }
  bool closing() const { return closing_; }

 private:
  struct Entry {
    asio::ip::address client;
    std::shared_ptr<const BodyMeter> body;
    std::function<void()> evict;
    bool idle = false;
    bool evicting = false;  // chosen to make room: counted until it has closed
    bool fresh = true;      // no request begun on it yet
    Clock::time_point added = Clock::now();
    Clock::time_point idle_since{};
  };
  // Closes the connection idle longest (of `client` only, if given); false if none is idle.
  bool EvictOldestIdle(const asio::ip::address* client);
  // With no idle connection to close, a full listener closes the one whose request body has
  // come slowest, below kMinBodyRate over at least kSlowBodyGrace (408 to it): bodies
  // trickled a byte at a time from many addresses would otherwise hold every connection for
  // http.request_timeout_s, again and again. False if none is that slow.
  bool EvictSlowestBody();

  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::map<asio::ip::address, size_t> per_client_;
  uint64_t next_id_ = 0;
  std::atomic<bool> closing_{false};
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const Limits& limits, const Handler& handler,
          std::shared_ptr<std::atomic<int64_t>> in_flight,
          std::shared_ptr<ConnectionTable> connections)
      : stream_(std::move(socket)),
        read_timer_(stream_.get_executor()),
        buffer_(limits.max_header_bytes),
        limits_(limits),
        handler_(handler),
        in_flight_(std::move(in_flight)),
        connections_(std::move(connections)) {}
  ~Session() {
    GiveBodyBudget();
    RemoveUpload();  // a session torn down mid-upload (the server stopping) leaves no file
    connections_->Remove(connection_id_);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  std::shared_ptr<const BodyMeter> body_meter() const { return body_meter_; }

  // `connection_id`: this connection in the listener's ConnectionTable.
  void Start(uint64_t connection_id) {
    connection_id_ = connection_id;
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Read(); });
  }

  // Closes the connection if it is still idle (the table chose it to make room).
  // Closes the connection if it is idle, or answers 408 if it is reading a request's body
  // (which came too slowly: see ConnectionTable::EvictSlowestBody).
  void Evict() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if (self->idle_) {
        self->Close();
      } else if (self->reading_body_) {
        // Through the read timer's path: the pending read ends, OnReadTimeout answers.
        self->evicted_slow_ = true;
        self->read_timed_out_ = true;
        beast::error_code ignored;
        self->stream_.socket().cancel(ignored);
      }
    });
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

  // The body bytes this request holds of Limits::body_budget, taken as they are known.
  bool TakeBodyBudget(uint64_t bytes) {
    if (!limits_.body_budget || bytes == 0) return true;
    if (!limits_.body_budget->Take(bytes)) return false;
    body_budget_taken_ += bytes;
    return true;
  }
  void GiveBodyBudget() {
    if (limits_.body_budget) limits_.body_budget->Give(body_budget_taken_);
    body_budget_taken_ = 0;
  }
  void RefuseForBodyBudget(uint64_t bytes) {
    Response refused =
        ErrorResponse(503, "the server holds " + std::to_string(limits_.body_budget->used()) +
                               " bytes of request bodies; " + std::to_string(bytes) +
                               " more would pass http.max_buffered_body_bytes (" +
                               std::to_string(limits_.body_budget->max_bytes()) + "); retry later");
    refused.set(bhttp::field::retry_after, "1");
    Refuse(std::move(refused));
  }

  void Read() {
    GiveBodyBudget();  // the last request's answer has gone
    budget_as_it_comes_ = false;
    answering_done_ = false;
    current_set_ = false;
    current_ = Request{};
    head_ = false;
    expects_continue_ = false;
    probed_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(limits_.max_header_bytes));
    // Pipelined bytes already buffered are a request begun, not an idle connection.
    idle_ = buffer_.size() == 0;
    connections_->SetIdle(connection_id_, idle_);
    // The header decides which limit applies (uploads have their own): checked in OnHeader.
    parser_->body_limit(std::max(limits_.max_body_bytes, limits_.max_upload_bytes));
    reading_body_ = false;
    body_meter_->End();
    // The idle timeout covers waiting for the next request and reading its header.
    ArmReadTimer(limits_.idle_timeout);
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = shared_from_this()](beast::error_code error, size_t) {
                               self->DisarmReadTimer();
                               self->OnHeader(error);
                             });
  }

  // Beast's own stream timeout closes the socket when it fires, which leaves no way to answer
  // 408: this timer cancels the pending read instead. A generation tells a stale expiry
  // (already queued when its read completed) from the current one.
  void ArmReadTimer(Clock::duration timeout) {
    stream_.expires_never();
    read_timed_out_ = false;
    const uint64_t generation = ++read_timer_generation_;
    read_timer_.expires_after(timeout);
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

  // Reads the rest of a body with the idle timeout applying to each wait for more data, and
  // the request (or upload) timeout to the whole body: a body that keeps coming may be slow,
  // but not slower than that.
  template <class Parser, class Done>
  void ReadBody(Parser& parser, Done done) {
    if (!reading_body_) {
      reading_body_ = true;
      body_meter_->Begin();
    }
    if (parser.is_done()) {
      body_meter_->End();
      done(beast::error_code{});
      return;
    }
    const Clock::duration left = body_deadline_ - Clock::now();
    ArmReadTimer(
        std::max(Clock::duration::zero(), std::min<Clock::duration>(limits_.idle_timeout, left)));
    bhttp::async_read_some(
        stream_, buffer_, parser,
        [self = shared_from_this(), &parser, done = std::move(done)](beast::error_code error,
                                                                     size_t read) mutable {
          self->DisarmReadTimer();
          self->body_meter_->Add(read);
          if (!error && self->budget_as_it_comes_ && !self->TakeBodyBudget(read)) {
            self->body_meter_->End();
            self->RefuseForBodyBudget(read);
            return;
          }
          if (error) {
            self->body_meter_->End();
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
    if (evicted_slow_) {
      Fail(408, "the request body came slower than " +
                    std::to_string(static_cast<int>(kMinBodyRate)) +
                    " bytes/s while the server had no room for new connections");
    } else if (reading_body_ && Clock::now() >= body_deadline_) {
      Fail(408, "the request body was not complete within " +
                    std::to_string(body_timeout_.count()) + " s of its header");
    } else if (reading_body_) {
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
    idle_ = false;
    connections_->SetIdle(connection_id_, false);
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
    // `OPTIONS *` asks about the server itself, not a resource (RFC 9110, 9.3.7): answered
    // here, before any route, token or log, since the supervisor asks it of every port each
    // second (liveness_probe.h).
    if (header.method() == bhttp::verb::options && header.target() == "*") {
      Response alive{bhttp::status::no_content, version_};
      alive.set(bhttp::field::allow, "OPTIONS, GET, HEAD, POST, PUT, DELETE");
      Refuse(std::move(alive), /*observed=*/false);
      return;
    }
    // Decided on the header alone, before the body is read: a refused request costs the
    // server no reading and no disk, and a client that sent `Expect: 100-continue` learns the
    // answer without sending its body.
    if (limits_.screen) {
      beast::error_code gone;
      const tcp::endpoint client = stream_.socket().remote_endpoint(gone);
      if (gone) {  // reset meanwhile: nobody to answer
        Close();
        return;
      }
      if (std::optional<Response> refused = limits_.screen(header, client)) {
        Refuse(std::move(*refused));
        return;
      }
    }
    const bool upload = limits_.stream_body_to_file && limits_.stream_body_to_file(header);
    const uint64_t limit = upload ? limits_.max_upload_bytes : limits_.max_body_bytes;
    body_timeout_ = upload ? limits_.upload_timeout : limits_.request_timeout;
    body_deadline_ = Clock::now() + body_timeout_;
    if (auto length = parser_->content_length(); length && *length > limit) {
      Fail(413, std::string(upload ? "the upload" : "the request body") +
                    " is larger than the limit of " + std::to_string(limit) + " bytes");
      return;
    }
    if (upload) {
      StartUpload();
      return;
    }
    // A body's share of Limits::body_budget is taken as its bytes come, whatever its framing:
    // taken up front from a declared length, a few connections that declared much and sent a
    // byte a second once held every other client's body off. One longer than the whole budget
    // could never fit, and is refused before it is read.
    const auto length = parser_->content_length();  // none: a chunked body
    if (length && limits_.body_budget && *length > limits_.body_budget->max_bytes()) {
      RefuseForBodyBudget(*length);
      return;
    }
    budget_as_it_comes_ = limits_.body_budget != nullptr;
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
    ::flock(fd, LOCK_EX | LOCK_NB);  // held until RemoveUpload: the file is in use
    upload_lock_ = fd;
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
    ::close(upload_lock_);
    upload_lock_ = -1;
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
      } else if (error == bhttp::error::buffer_overflow) {
        Fail(431,
             "a chunk line or the trailer fields of the chunked upload are larger than the "
             "header limit of " +
                 std::to_string(limits_.max_header_bytes) + " bytes");
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
  // Answers the request without the handler and closes the connection after it; `observed`:
  // told to Limits::observe.
  void Refuse(Response response, bool observed = true) {
    keep_alive_ = false;
    body_unread_ = true;
    in_flight_->fetch_add(1);
    if (observed && limits_.observe) limits_.observe(current_, response);
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
      } else if (error == bhttp::error::header_limit ||
                 (error == bhttp::error::buffer_overflow && !reading_body_)) {
        status = 431;
        message = "the request header is larger than the limit of " +
                  std::to_string(limits_.max_header_bytes) + " bytes";
      } else if (error == bhttp::error::buffer_overflow) {
        // The read buffer holds what the parser has not taken yet: past the body's start,
        // that is a chunk line or the trailer section, which count against the header limit.
        status = 431;
        message =
            "a chunk line or the trailer fields of the chunked body are larger than the "
            "header limit of " +
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
    Responder respond(
        [self = shared_from_this(), answered](Response response) {
          if (answered->exchange(true)) return;  // a handler bug must not write twice
          asio::dispatch(self->stream_.get_executor(),
                         [self, response = std::move(response)]() mutable {
                           self->Write(std::move(response));
                         });
        },
        client_gone_,
        [self = shared_from_this(), answered](
            Response header, std::string hang_up_probe) -> std::shared_ptr<BodyStream> {
          if (answered->exchange(true)) return nullptr;
          auto body = std::make_shared<ChunkedBody>(self);
          asio::dispatch(
              self->stream_.get_executor(),
              [self, header = std::move(header), probe = std::move(hang_up_probe)]() mutable {
                self->WriteStreamHeader(std::move(header), std::move(probe));
              });
          return body;
        });
    // A handler that throws is a bug of the server's, answered for this request alone: left to
    // unwind through the I/O thread it would end the process for every client.
    try {
      handler_(std::move(request), respond);
    } catch (const std::exception& error) {
      Log(LogLevel::kError, "a request handler threw", {{"error", error.what()}});
      respond(ErrorResponse(500, std::string("internal error: ") + error.what()));
    }
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
    if (connections_->closing()) keep_alive_ = false;
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

  // A streamed answer (Responder::Stream): the header now, the parts as ChunkedBody sends them.
  // Writes go one after another on this connection's executor, in the order they were asked.
  class ChunkedBody final : public BodyStream {
   public:
    explicit ChunkedBody(std::shared_ptr<Session> session) : session_(std::move(session)) {}
    void Send(std::string data, std::function<void(bool ok)> sent) override {
      asio::dispatch(session_->stream_.get_executor(),
                     [session = session_, data = std::make_shared<std::string>(std::move(data)),
                      sent = std::move(sent)]() mutable {
                       session->QueueStreamWrite(std::move(data), std::move(sent));
                     });
    }
    void End() override {
      asio::dispatch(session_->stream_.get_executor(),
                     [session = session_] { session->QueueStreamWrite(nullptr, nullptr); });
    }

   private:
    std::shared_ptr<Session> session_;
  };

  void WriteStreamHeader(Response header, std::string hang_up_probe) {
    answering_done_ = true;
    hang_up_probe_ = std::move(hang_up_probe);
    RemoveUpload();
    header.version(version_);
    header.set(bhttp::field::server, kServerName);
    if (connections_->closing()) keep_alive_ = false;
    header.keep_alive(keep_alive_);
    header.body().clear();
    header.chunked(true);
    stream_writing_ = true;
    auto shared = std::make_shared<Response>(std::move(header));
    auto serializer = std::make_shared<bhttp::response_serializer<bhttp::string_body>>(*shared);
    stream_.expires_after(limits_.idle_timeout);
    bhttp::async_write_header(
        stream_, *serializer,
        [self = shared_from_this(), shared, serializer](beast::error_code error, size_t) {
          self->StreamWritten(!error);
        });
  }

  // A part (or, with null `data`, the end) of the streamed answer, written after those before.
  void QueueStreamWrite(std::shared_ptr<std::string> data, std::function<void(bool ok)> sent) {
    if (data == nullptr) stream_end_queued_ = true;
    stream_parts_.push_back({std::move(data), std::move(sent)});
    if (!stream_writing_) WriteNextPart();
  }

  void WriteNextPart() {
    if (stream_parts_.empty()) return;
    if (stream_failed_) {
      StreamPart part = std::move(stream_parts_.front());
      stream_parts_.pop_front();
      if (part.sent) part.sent(false);
      if (part.data == nullptr) {
        EndStreamedAnswer(false);
        return;
      }
      WriteNextPart();
      return;
    }
    stream_writing_ = true;
    stream_.expires_after(limits_.idle_timeout);
    const StreamPart& part = stream_parts_.front();
    auto done = [self = shared_from_this(), data = part.data](beast::error_code error, size_t) {
      self->StreamWritten(!error);
    };
    if (part.data == nullptr) {
      asio::async_write(stream_, bhttp::make_chunk_last(), std::move(done));
    } else {
      asio::async_write(stream_, bhttp::make_chunk(asio::buffer(*part.data)), std::move(done));
    }
  }

  void EndStreamedAnswer(bool ok) {
    in_flight_->fetch_sub(1);
    stream_header_written_ = false;
    stream_failed_ = false;
    stream_end_queued_ = false;
    if (!ok || !keep_alive_) {
      Close();
    } else {
      Read();
    }
  }

  void StreamWritten(bool ok) {
    if (!ok) {
      stream_failed_ = true;
      client_gone_->store(true);
    }
    if (!stream_header_written_) {
      stream_header_written_ = true;
      stream_writing_ = false;
      if (ok && !hang_up_probe_.empty()) WatchStreamForHangUp(request_number_);
      WriteNextPart();
      return;
    }
    StreamPart part = std::move(stream_parts_.front());
    stream_parts_.pop_front();
    // Still writing while the callback runs: a part it sends waits for WriteNextPart below.
    if (part.sent) part.sent(ok);
    stream_writing_ = false;
    if (part.data == nullptr) {
      EndStreamedAnswer(ok);
      return;
    }
    WriteNextPart();
  }

  // WatchForHangUp for a streamed answer, whose header has gone, so that no `100 Continue` can
  // ask: end of stream is answered with the hang-up probe, a part the reader ignores, to which a
  // closed socket answers with a reset. Bytes (a pipelined request) wait for the stream's end.
  void WatchStreamForHangUp(uint64_t request_number) {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(),
                                                         request_number](beast::error_code error) {
      if (error || request_number != self->request_number_ || self->stream_end_queued_) return;
      char byte = 0;
      const ssize_t peeked =
          ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (peeked < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        self->client_gone_->store(true);
        return;
      }
      if (peeked != 0) return;
      self->QueueStreamWrite(std::make_shared<std::string>(self->hang_up_probe_), nullptr);
      auto gone = [self, request_number](beast::error_code waited) {
        if (!waited && request_number == self->request_number_) self->client_gone_->store(true);
      };
      self->stream_.socket().async_wait(tcp::socket::wait_error, std::move(gone));
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
  // The request's body must be complete by then (see Limits::request_timeout).
  Clock::time_point body_deadline_{};
  std::chrono::seconds body_timeout_{0};
  uint64_t read_timer_generation_ = 0;
  bool read_timed_out_ = false;
  bool reading_body_ = false;
  std::shared_ptr<BodyMeter> body_meter_ = std::make_shared<BodyMeter>();
  bool evicted_slow_ = false;        // closed for room: its body came too slowly
  uint64_t body_budget_taken_ = 0;   // of Limits::body_budget, by this request (TakeBodyBudget)
  bool budget_as_it_comes_ = false;  // the body's budget taken read by read
  bool expects_continue_ = false;
  bool head_ = false;    // the request is a HEAD: its answer goes without the body
  bool probed_ = false;  // see WatchForHangUp
  // A streamed answer: its parts waiting (the front one being written) and their callbacks.
  struct StreamPart {
    std::shared_ptr<std::string> data;  // null: the end
    std::function<void(bool ok)> sent;
  };
  std::deque<StreamPart> stream_parts_;
  bool stream_writing_ = false;
  bool stream_header_written_ = false;
  bool stream_failed_ = false;
  bool stream_end_queued_ = false;  // no part may follow: the end is queued
  std::string hang_up_probe_;       // see Responder::Stream
  // Bounded by the header limit: it holds only what the parser has not taken yet, which is a
  // header, a chunk line or a trailer section (bodies go straight into their parser's body), so
  // none of them can grow it without bound.
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::optional<bhttp::request_parser<bhttp::file_body>> upload_parser_;
  std::string upload_path_;  // while an upload file is this session's to remove
  ino_t upload_inode_ = 0;
  int upload_lock_ = -1;  // the upload file, open with an flock while it exists
  const Limits& limits_;
  const Handler& handler_;
  std::shared_ptr<std::atomic<int64_t>> in_flight_;
  std::shared_ptr<ConnectionTable> connections_;
  uint64_t connection_id_ = 0;
  bool idle_ = false;  // waiting for a request with nothing of it read (see ConnectionTable)
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

bool ConnectionTable::EvictOldestIdle(const asio::ip::address* client) {
  Entry* oldest = nullptr;
  for (auto& [id, entry] : entries_) {
    if (!entry.idle || (client != nullptr && entry.client != *client)) continue;
    if (oldest == nullptr || entry.idle_since < oldest->idle_since) oldest = &entry;
  }
  if (oldest == nullptr) return false;
  oldest->idle = false;
  oldest->evicting = true;
  oldest->evict();
  return true;
}

bool ConnectionTable::EvictSlowestBody() {
  const Clock::time_point now = Clock::now();
  Entry* slowest = nullptr;
  double slowest_rate = kMinBodyRate;
  for (auto& [id, entry] : entries_) {
    const int64_t since = entry.body->since.load(std::memory_order_relaxed);
    if (since == 0 || entry.evicting) continue;
    const Clock::duration reading = now - Clock::time_point(Clock::duration(since));
    if (reading < kSlowBodyGrace) continue;
    const double rate = static_cast<double>(entry.body->bytes.load(std::memory_order_relaxed)) /
                        std::chrono::duration<double>(reading).count();
    if (rate < slowest_rate) {
      slowest = &entry;
      slowest_rate = rate;
    }
  }
  if (slowest == nullptr) return false;
  slowest->evicting = true;
  slowest->evict();
  return true;
}

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
      accept_pause_(acceptor_.get_executor()),
      upkeep_(acceptor_.get_executor()),
      connections_(std::make_shared<ConnectionTable>()) {}

HttpServer::~HttpServer() {  // the owner stops the io_context first
  if (port_ != 0) UnregisterListeningPort(port_);
  CloseAcceptor();
}

void HttpServer::CloseAcceptor() {
  // Released, then closed past the exit filter, which asks about any other close of a
  // listener's number (exit_guard.h).
  beast::error_code ignored;
  if (acceptor_.is_open()) CloseListener(acceptor_.release(ignored));
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
  return StartAccepting();
}

Status HttpServer::Adopt(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return Internal("listening socket " + std::to_string(fd) +
                    " cannot be used: " + std::strerror(errno));
  }
  beast::error_code error;
  acceptor_.assign(address.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), fd, error);
  if (error) return Internal("cannot adopt listening socket: " + error.message());
  return StartAccepting();
}

Status HttpServer::StartAccepting() {
  port_ = acceptor_.local_endpoint().port();
  RegisterListeningPort(acceptor_.native_handle(), port_);
  // Accept's accept answers would_block or connection_aborted rather than waits for the next.
  beast::error_code error;
  acceptor_.non_blocking(true, error);
  if (!error) acceptor_.set_option(asio::socket_base::enable_connection_aborted(true), error);
  if (error) return Internal("cannot make the listener non-blocking: " + error.message());
  Accept();
  TendListenerEverySecond();
  return Status::Ok();
}

void HttpServer::TendListenerEverySecond() {
  upkeep_.expires_after(std::chrono::milliseconds(kListenerUpkeepMs));
  upkeep_.async_wait([this](beast::error_code error) {
    if (error || !acceptor_.is_open()) return;
    if (!TendListener(acceptor_.native_handle())) {
      ReportListenerLost(port_);
      beast::error_code ignored;
      acceptor_.cancel(ignored);  // the pending accept ends (operation_aborted): no more
      return;
    }
    TendListenerEverySecond();
  });
}

void HttpServer::CloseAfterEachAnswer() { connections_->SetClosing(); }

int64_t HttpServer::busy_connections() const {
  return static_cast<int64_t>(connections_->Busy(std::chrono::seconds(1)));
}

void HttpServer::StopAccepting() {
  asio::dispatch(acceptor_.get_executor(), [this] {
    CloseAcceptor();
    accept_pause_.cancel();
    upkeep_.cancel();
  });
}

void HttpServer::Accept() {
  // Waits for a connection, then takes it. Asio's async_accept tries an accept first, which
  // blocks this I/O thread until some client connects if model code has cleared O_NONBLOCK on
  // the listener (the file description the supervisor shares; the upkeep sets it back within
  // a second): after readiness there is a connection to take.
  acceptor_.async_wait(tcp::acceptor::wait_read, [this](beast::error_code error) {
    if (error == asio::error::operation_aborted || !acceptor_.is_open()) return;
    tcp::socket socket(asio::make_strand(io_));
    if (!error) acceptor_.accept(socket, error);
    if (error == asio::error::would_block || error == asio::error::try_again ||
        error == asio::error::connection_aborted) {
      Accept();  // gone before it was taken
      return;
    }
    // A listener shut down fails every accept at once: the server drains and exits, nothing
    // to accept meanwhile. (Shared or shrunk ones are found by the upkeep.)
    if (error && !TendListener(acceptor_.native_handle())) {
      ReportListenerLost(port_);
      return;
    }
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
    NoteServerSocket(socket.native_handle());
    if (accept_failing_) {
      Log(LogLevel::kInfo, "accepting connections again", {{"port", std::to_string(port_), false}});
      accept_failing_ = false;
    }
    beast::error_code unknown_peer;
    const asio::ip::address client = socket.remote_endpoint(unknown_peer).address();
    if (unknown_peer) {  // reset before it was accepted: nothing to answer
      socket.close(unknown_peer);
      Accept();
      return;
    }
    switch (
        connections_->Admit(client, limits_.max_connections, limits_.max_connections_per_client)) {
      case ConnectionTable::Admission::kListenerFull:
        RefuseConnection(std::move(socket), "the server has too many open connections");
        break;
      case ConnectionTable::Admission::kClientFull:
        RefuseConnection(std::move(socket),
                         "too many open connections from " + client.to_string() + " (limit " +
                             std::to_string(limits_.max_connections_per_client) + ")");
        break;
      case ConnectionTable::Admission::kAdmitted: {
        at_capacity_ = false;
        socket.set_option(tcp::no_delay(true), error);
        auto session = std::make_shared<Session>(std::move(socket), limits_, handler_, in_flight_,
                                                 connections_);
        auto evict = [weak = std::weak_ptr<Session>(session)] {
          if (std::shared_ptr<Session> alive = weak.lock()) alive->Evict();
        };
        session->Start(connections_->Add(client, session->body_meter(), std::move(evict)));
        break;
      }
    }
    Accept();
  });
}

void HttpServer::RefuseConnection(tcp::socket socket, const std::string& why) {
  if (!at_capacity_) {
    Log(LogLevel::kWarning, "too many connections and none idle; refusing new ones with 503",
        {{"port", std::to_string(port_), false},
         {"reason", why},
         {"max_connections", std::to_string(limits_.max_connections), false},
         {"max_connections_per_client", std::to_string(limits_.max_connections_per_client),
          false}});
    at_capacity_ = true;
  }
  // Best effort, without waiting: the client learns why instead of seeing a bare close.
  const std::string body = nlohmann::json{{"error", why + "; retry later"}}.dump();
  const std::string answer =
      "HTTP/1.1 503 Service Unavailable\r\nServer: orochi\r\nContent-Type: "
      "application/json\r\nConnection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  [[maybe_unused]] ssize_t sent =
      ::send(socket.native_handle(), answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  beast::error_code ignored;
  socket.shutdown(tcp::socket::shutdown_send, ignored);
  socket.close(ignored);
}

}  // namespace orochi::server::http
