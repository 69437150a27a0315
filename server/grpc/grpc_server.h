// The gRPC transport: a grpc::Server listening for inference.GRPCInferenceService, with the
// message and stream limits of the configuration, and a shutdown that lets the calls in flight
// finish within the grace. What the calls do is InferenceService's (grpc_service.h).
//
// gRPC cannot adopt a listening socket, so one inherited from the supervisor (which keeps it
// bound across restarts of the serving process) is accepted on by a thread of this server's,
// which hands each connection to gRPC as an external connection, unless grpc.max_connections or
// grpc.max_connections_per_client are reached (handed_off_connections.h).
//
// Thread-safety: Start, then any thread may call port() and in_flight(); Shutdown once.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "grpc_service.h"
#include "orochi/base/status.h"
#include "orochi/server/config.h"

namespace grpc {
class Server;
namespace experimental {
class ExternalConnectionAcceptor;
}  // namespace experimental
}  // namespace grpc

namespace orochi::server::grpc_api {

class HandedOffConnections;

class GrpcServer {
 public:
  // Listens on config.grpc's address and port, or accepts on `listener_fd` when it is not -1
  // (a listening socket bound to them; the server takes ownership). The service's in_flight
  // counter is this server's. The transport's buffers across every connection (messages
  // still arriving among them) are bounded by `max_buffered_bytes`, or by one message of
  // config.grpc.max_message_bytes if that is more (gRPC's resource quota): past it, gRPC
  // shrinks its windows and then cancels calls to free memory.
  static Result<std::unique_ptr<GrpcServer>> Start(ModelService& models, Metrics& metrics,
                                                   const ServerConfig& config,
                                                   ServiceOptions options,
                                                   uint64_t max_buffered_bytes,
                                                   int listener_fd = -1);
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  int port() const { return port_; }
  // Calls (a stream counts once) not yet finished.
  int64_t in_flight() const { return in_flight_.load(); }
  // Refuses new calls at once (an inherited listener's new connections stay in its backlog,
  // for the next serving process); the calls in flight may finish until `deadline`, then are
  // cancelled. Returns when the server has stopped.
  void Shutdown(std::chrono::system_clock::time_point deadline);

 private:
  GrpcServer() = default;
  // The inherited listener's accepting thread, until wake_fd_ is written. A connection past
  // `handed_off`'s limits is closed at once instead of handed to gRPC.
  void AcceptConnections(HandedOffConnections handed_off);

  std::atomic<int64_t> in_flight_{0};
  std::unique_ptr<InferenceService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
  int listener_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that stops the accepting thread
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::thread accepting_;
};

}  // namespace orochi::server::grpc_api
