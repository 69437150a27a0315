#include "grpc_server.h"

#include <grpcpp/grpcpp.h>

#include <utility>

namespace orochi::server::grpc_api {

Result<std::unique_ptr<GrpcServer>> GrpcServer::Start(ModelService& models, Metrics& metrics,
                                                      const ServerConfig& config,
                                                      ServiceOptions options) {
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  options.in_flight = &server->in_flight_;
  server->service_ =
      std::make_unique<InferenceService>(models, metrics, config, std::move(options));
  const GrpcConfig& grpc_config = config.grpc;
  // An IPv6 literal needs its brackets in a gRPC address.
  const std::string host = grpc_config.bind_address.find(':') != std::string::npos
                               ? "[" + grpc_config.bind_address + "]"
                               : grpc_config.bind_address;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(host + ":" + std::to_string(grpc_config.port),
                           grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(grpc_config.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(grpc_config.max_response_bytes));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(grpc_config.max_concurrent_streams));
  // A second server on the same port would split the calls between two processes without a
  // word; taking the port alone makes that an error at startup, as for the HTTP ports.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return Unavailable("cannot listen for gRPC on " + host + ":" +
                       std::to_string(grpc_config.port) +
                       " (the address is in use or not this machine's)");
  }
  return server;
}

GrpcServer::~GrpcServer() {
  if (!shut_down_) Shutdown(std::chrono::system_clock::now());
}

void GrpcServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  // Idle streams would otherwise stay open until the deadline; busy ones finish their requests.
  service_->streams().CloseAll();
  server_->Shutdown(deadline);
  server_->Wait();
}

}  // namespace orochi::server::grpc_api
