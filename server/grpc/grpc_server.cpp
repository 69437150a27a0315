#include "grpc_server.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <utility>

#include "exit_guard.h"
#include "handed_off_connections.h"
#include "listening_socket.h"
#include "log.h"

namespace orochi::server::grpc_api {
namespace {

// The peer's address without its port, as text ("" when it has none, e.g. reset already).
std::string ClientAddress(const sockaddr_storage& peer) {
  char text[INET6_ADDRSTRLEN] = {};
  if (peer.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(peer);
    if (::inet_ntop(AF_INET, &v4.sin_addr, text, sizeof(text)) != nullptr) return text;
  } else if (peer.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(peer);
    if (::inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof(text)) != nullptr) return text;
  }
  return "";
}

}  // namespace
Result<std::unique_ptr<GrpcServer>> GrpcServer::Start(ModelService& models, Metrics& metrics,
                                                      const ServerConfig& config,
                                                      ServiceOptions options,
                                                      uint64_t max_buffered_bytes,
                                                      int listener_fd) {
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  server->listener_fd_ = listener_fd;
  options.in_flight = &server->in_flight_;
  server->service_ =
      std::make_unique<InferenceService>(models, metrics, config, std::move(options));
  const GrpcConfig& grpc_config = config.grpc;
  // An IPv6 literal needs its brackets in a gRPC address.
  const std::string host = grpc_config.bind_address.find(':') != std::string::npos
                               ? "[" + grpc_config.bind_address + "]"
                               : grpc_config.bind_address;
  grpc::ServerBuilder builder;
  if (listener_fd < 0) {
    builder.AddListeningPort(host + ":" + std::to_string(grpc_config.port),
                             grpc::InsecureServerCredentials(), &server->port_);
  } else {
    server->acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        grpc::InsecureServerCredentials());
    server->port_ = BoundPort(listener_fd);
    RegisterListeningPort(listener_fd, server->port_);
  }
  builder.RegisterService(server->service_.get());
  // Without a total, unfinished messages (all but their last byte sent, on many streams and
  // connections) were held without bound: 1.15 GB from one client in 1.4 s. Never under one
  // message of the largest size allowed, which must always fit.
  grpc::ResourceQuota quota("orochi-grpc");
  const uint64_t quota_bytes =
      std::max<uint64_t>(max_buffered_bytes, static_cast<uint64_t>(grpc_config.max_message_bytes));
  quota.Resize(
      static_cast<size_t>(std::min<uint64_t>(quota_bytes, std::numeric_limits<size_t>::max() / 2)));
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(static_cast<int>(grpc_config.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(grpc_config.max_response_bytes));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(grpc_config.max_concurrent_streams));
  // A second server on the same port would split the calls between two processes without a
  // word; taking the port alone makes that an error at startup, as for the HTTP ports.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A connection without a call (one that sent its preface and settings, then nothing) is told
  // GOAWAY and closed after the idle timeout, as HTTP's keep-alive connections are; one that
  // never completes its preface and settings is closed after it too (gRPC's default: 120 s).
  const int idle_ms = config.http.idle_timeout_s * 1000;
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, idle_ms);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, idle_ms);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return Unavailable("cannot listen for gRPC on " + host + ":" +
                       std::to_string(grpc_config.port) +
                       " (the address is in use or not this machine's)");
  }
  if (listener_fd >= 0) {
    server->wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
    if (server->wake_fd_ < 0) {
      return Unavailable(std::string("cannot create an eventfd: ") + std::strerror(errno));
    }
    server->accepting_ = std::thread(
        [raw = server.get(), max_connections = static_cast<size_t>(grpc_config.max_connections),
         max_per_client = static_cast<size_t>(grpc_config.max_connections_per_client)] {
          raw->AcceptConnections(HandedOffConnections(max_connections, max_per_client));
        });
  }
  return server;
}

void GrpcServer::AcceptConnections(HandedOffConnections handed_off) {
  bool descriptors_logged = false;
  bool at_capacity = false;  // refusing connections, logged once until one is admitted again
  auto tended = std::chrono::steady_clock::now();
  while (true) {
    pollfd watched[] = {{listener_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (::poll(watched, 2, kListenerUpkeepMs) < 0 && errno != EINTR) return;
    if (watched[1].revents != 0) return;
    // Shut down from model code, no accept will succeed again (and poll says so at once);
    // shared through SO_REUSEPORT, part of the connections go elsewhere; listen(fd, 0) shrank
    // its backlog.
    const auto now = std::chrono::steady_clock::now();
    if (now - tended >= std::chrono::milliseconds(kListenerUpkeepMs)) {
      tended = now;
      if (!TendListener(listener_fd_)) {
        ReportListenerLost(port_);
        return;
      }
    }
    if (watched[0].revents == 0) continue;
    // Non-blocking, as gRPC's own listener makes the connections it accepts.
    sockaddr_storage peer{};
    socklen_t peer_size = sizeof(peer);
    const int fd = ::accept4(listener_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_size,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0 && !TendListener(listener_fd_)) {
      ReportListenerLost(port_);
      return;
    }
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The connection stays in the backlog, and retrying at once would spin: as HTTP does.
        if (!descriptors_logged) {
          Log(LogLevel::kError, "gRPC cannot accept a connection; retrying every 100 ms",
              {{"error", std::strerror(errno)}});
          descriptors_logged = true;
        }
        pollfd wake{wake_fd_, POLLIN, 0};
        if (::poll(&wake, 1, 100) > 0) return;
      }
      continue;
    }
    descriptors_logged = false;
    NoteServerSocket(fd);
    const std::string client = ClientAddress(peer);
    const HandedOffConnections::Admission admission = handed_off.Admit(client, fd);
    if (admission != HandedOffConnections::Admission::kAdmitted) {
      // gRPC has no way to close a connection it was handed without a call on it, so none is
      // evicted: the newcomer is closed before any byte, and the client retries elsewhere or
      // later.
      if (!at_capacity) {
        Log(LogLevel::kWarning, "too many gRPC connections; closing new ones at once",
            {{"port", std::to_string(port_), false},
             {"reason", admission == HandedOffConnections::Admission::kClientFull
                            ? "too many open connections from " + client
                            : std::string("the listener has too many open connections")},
             {"open", std::to_string(handed_off.open()), false},
             {"max_connections", std::to_string(handed_off.max_connections()), false},
             {"max_connections_per_client", std::to_string(handed_off.max_connections_per_client()),
              false}});
        at_capacity = true;
      }
      ::close(fd);
      continue;
    }
    at_capacity = false;
    const int on = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters connection;
    connection.listener_fd = listener_fd_;
    connection.fd = fd;  // gRPC's from here, closed by it
    acceptor_->HandleNewConnection(&connection);
  }
}

GrpcServer::~GrpcServer() {
  if (!shut_down_) Shutdown(std::chrono::system_clock::now());
  if (acceptor_ != nullptr && port_ != 0) UnregisterListeningPort(port_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (listener_fd_ >= 0) CloseListener(listener_fd_);  // past the exit filter (exit_guard.h)
}

void GrpcServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  if (accepting_.joinable()) {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = ::write(wake_fd_, &one, sizeof(one));
    accepting_.join();
  }
  // Idle streams would otherwise stay open until the deadline; busy ones finish their requests.
  service_->streams().CloseAll();
  server_->Shutdown(deadline);
  server_->Wait();
}

}  // namespace orochi::server::grpc_api
