// `orochi serve`: the inference server. Start() loads the configured models into interpreter
// copies and listens on the inference and metrics ports; Run() serves until SIGTERM or SIGINT
// (or RequestStop), then shuts down gracefully: after SIGTERM or RequestStop it first reports
// not-ready while still serving for http.shutdown_delay_s (SIGINT, or a second request, skips
// that), then stops accepting connections, answers the requests in flight within the grace
// period, and returns.
//
// Thread-safety: RequestStop may be called from any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "orochi/base/status.h"
#include "orochi/server/config.h"

namespace orochi::server {

// What a supervisor (supervisor.h) hands the serving process it starts. The defaults are a
// server on its own: it binds its ports, and has no history.
struct Inheritance {
  // Listening sockets already bound to the configured ports (-1: bind them here). The server
  // takes ownership.
  int inference_fd = -1;
  int metrics_fd = -1;
  int management_fd = -1;
  int grpc_fd = -1;  // with grpc.enabled
  // For the metrics: serving processes the supervisor restarted before this one, and native
  // crashes by model name.
  int64_t restarts = 0;
  std::map<std::string, int64_t> model_crashes;
  // Model versions ("name:version") not loaded at startup, with why: they crashed the server
  // too often. Loading one explicitly, or deploying another version, still works.
  std::map<std::string, std::string> quarantined;
  // Where the serving process tells its supervisor of each model version whose load it begins
  // at startup ("loading model=name:version": a death there with no crash record, an OOM kill
  // say, is put on it) and of one whose load ran past models.load_timeout_s ("stuck_load
  // model=name:version"), so that the next serving process quarantines it instead of waiting
  // as long again; -1 without a supervisor. (Those two lines go through the exit filter's
  // listener where there is one, which model code cannot forge; the pipe is their fallback.)
  int report_fd = -1;
  // The supervisor's pid; 0 without one. Every process under it is the server's or model code's
  // (peer_process.h): the management API refuses requests from them.
  pid_t supervisor = 0;
};

class Server {
 public:
  static Result<std::unique_ptr<Server>> Start(ServerConfig config,
                                               const Inheritance& inherited = {});
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
