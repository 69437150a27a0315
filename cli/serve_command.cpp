// `orochi serve`: configuration from a file (config/orochi.json documents it) and flags, then
// the server until SIGTERM or SIGINT.
#include <cmath>
#include <cstdio>

#include "commands.h"
#include "orochi/server/model_directory.h"
#include "orochi/server/server.h"
#include "orochi/server/supervisor.h"

namespace orochi::cli {

int ServeCommand(const ServeOptions& options) {
  server::ServerConfig config;
  if (!options.config_path.empty()) {
    Result<server::ServerConfig> loaded = server::LoadServerConfig(options.config_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "orochi serve: %s\n", loaded.status().message().c_str());
      return 2;
    }
    config = std::move(loaded).value();
  }
  // Flags override the file: a model directory replaces the file's repository, and the other way
  // round.
  if (!options.model_repository.empty()) {
    config.models.repository = options.model_repository;
    config.models.model_dir.clear();
    config.models.model_name.clear();
  }
  if (!options.model_dir.empty()) {
    config.models.model_dir = options.model_dir;
    config.models.repository.clear();
  }
  if (!options.model_name.empty()) config.models.model_name = options.model_name;
  if (!options.load_models.empty()) config.models.load = options.load_models;
  if (options.http_port) config.http.inference_port = *options.http_port;
  if (options.metrics_port) config.http.metrics_port = *options.metrics_port;
  if (options.grpc_port) config.grpc.port = *options.grpc_port;
  if (options.management_port) config.management.port = *options.management_port;
  if (!options.bind_address.empty()) {
    // Every port that listens beyond loopback by default: HTTP, metrics and gRPC.
    config.http.bind_address = options.bind_address;
    config.grpc.bind_address = options.bind_address;
  }
  if (options.copies) config.copies = *options.copies;
  if (!options.model_control_mode.empty()) {
    config.models.model_control_mode = options.model_control_mode;
  }
  if (options.repository_poll_seconds) {
    config.models.repository_poll_ms = std::llround(*options.repository_poll_seconds * 1000);
  }
  if (!options.log_format.empty()) config.log.format = options.log_format;
  if (!options.log_level.empty()) config.log.level = options.log_level;
  if (Status valid = server::ValidateServerConfig(config); !valid.ok()) {
    std::fprintf(stderr, "orochi serve: %s\n", valid.message().c_str());
    return 2;
  }
  // Lives as long as the server: it removes the scratch repository it made.
  Result<std::unique_ptr<server::ModelDirectoryView>> model_directory =
      server::PrepareModelDirectory(config);
  if (!model_directory.ok()) {
    std::fprintf(stderr, "orochi serve: %s\n", model_directory.status().message().c_str());
    return 1;
  }

  if (config.supervisor.enabled) {
    Result<int> served = server::RunSupervised(std::move(config));
    if (!served.ok()) {
      std::fprintf(stderr, "orochi serve: %s\n", served.status().message().c_str());
      return 1;
    }
    return *served;
  }
  Result<std::unique_ptr<server::Server>> started = server::Server::Start(std::move(config));
  if (!started.ok()) {
    std::fprintf(stderr, "orochi serve: %s\n", started.status().message().c_str());
    if (!started.status().detail().empty()) {
      std::fprintf(stderr, "%s", started.status().detail().c_str());
    }
    return 1;
  }
  return (*started)->Run();
}

}  // namespace orochi::cli
