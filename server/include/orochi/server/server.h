// `orochi serve`: the inference server. Start() loads the configured models into interpreter
// copies and listens on the inference and metrics ports; Run() serves until SIGTERM or SIGINT
// (or RequestStop), then shuts down gracefully: it stops accepting connections, answers the
// requests in flight within the grace period, and returns.
//
// Thread-safety: RequestStop may be called from any thread.
#pragma once

#include <memory>

#include "orochi/base/status.h"
#include "orochi/server/config.h"

namespace orochi::server {

class Server {
 public:
  static Result<std::unique_ptr<Server>> Start(ServerConfig config);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int inference_port() const;
  int metrics_port() const;
  // Serves until stopped; returns the process exit status (0 after a graceful shutdown).
  int Run();
  void RequestStop();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace orochi::server
