// The RPCs of inference.GRPCInferenceService (inference.proto) over the ModelService: health,
// metadata, configuration, statistics, inference (one call per request, or a stream of them)
// and the repository calls. Requests go through the same InferenceRunner as HTTP's, so
// scheduling, batching, deadlines, cancellation, limits and metrics are the same; only the
// wire format and the status codes are gRPC's (Triton's mapping, see GrpcCodeOf).
//
// The transport (listening, message limits, shutdown) is grpc_server.h's.
//
// Thread-safety: gRPC calls the methods from its own threads, any number at once.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "buffer_budget.h"
#include "inference.grpc.pb.h"
#include "kserve/inference.h"
#include "kserve/shared_memory.h"
#include "metrics/metrics.h"
#include "models/model_service.h"
#include "orochi/server/config.h"

namespace orochi::server::grpc_api {

// The gRPC status for a library error, as Triton maps its errors; `client_gone` for an
// inference answered kFailedPrecondition because its caller left (CANCELLED).
grpc::StatusCode GrpcCodeOf(StatusCode code);
// "OK", "INVALID_ARGUMENT", ...: the code label of orochi_grpc_requests_total.
const char* GrpcCodeName(grpc::StatusCode code);

struct ServiceOptions {
  std::function<bool()> ready;
  std::optional<std::string> inference_token;   // required of every call when set
  std::optional<std::string> management_token;  // required of repository calls when set
  bool repository = false;                      // there is a repository to manage
  // Why a repository call from the peer at `address`:`port` is refused whatever its token
  // (model code: peer_process.h); nullopt lets it on to the token check.
  std::function<std::optional<std::string>(const std::string& address, uint16_t port)>
      screen_repository_caller;
  // Runs a repository operation (loads take seconds) off gRPC's threads, one at a time with
  // the management API's.
  std::function<void(std::function<void()>)> run_repository_operation;
  // Counts calls in progress (the transport waits for them at shutdown).
  std::atomic<int64_t>* in_flight = nullptr;
  // The server's system shared-memory regions, shared with HTTP.
  kserve::SharedMemoryRegistry* shared_memory = nullptr;
  // Where ModelStreamInfer's answers waiting for their client to read them are counted, with
  // HTTP's bodies; null: no bound.
  std::shared_ptr<BufferBudget> answer_budget;
};

class StreamCall;  // grpc_service.cpp: one ModelStreamInfer stream

// The ModelStreamInfer streams open now, to be closed at shutdown.
class OpenStreams {
 public:
  void Add(StreamCall* stream);
  void Remove(StreamCall* stream);
  // Every stream open and every one opened from now on reads no more requests and ends once
  // those it read are answered.
  void CloseAll();

 private:
  std::mutex mutex_;
  std::set<StreamCall*> streams_;
  bool closed_ = false;
};

class InferenceService final : public inference::GRPCInferenceService::CallbackService {
 public:
  InferenceService(ModelService& models, Metrics& metrics, const ServerConfig& config,
                   ServiceOptions options);

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const inference::ServerLiveRequest* request,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const inference::ServerReadyRequest* request,
                                        inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest* request,
                                           inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* context,
                                        const inference::ModelConfigRequest* request,
                                        inference::ModelConfigResponse* response) override;
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* context,
                                            const inference::ModelStatisticsRequest* request,
                                            inference::ModelStatisticsResponse* response) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override;
  grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
  ModelStreamInfer(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* context,
                                            const inference::RepositoryIndexRequest* request,
                                            inference::RepositoryIndexResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelLoad(
      grpc::CallbackServerContext* context, const inference::RepositoryModelLoadRequest* request,
      inference::RepositoryModelLoadResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelUnload(
      grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
      inference::RepositoryModelUnloadResponse* response) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(
      grpc::CallbackServerContext* context,
      const inference::SystemSharedMemoryStatusRequest* request,
      inference::SystemSharedMemoryStatusResponse* response) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(
      grpc::CallbackServerContext* context,
      const inference::SystemSharedMemoryRegisterRequest* request,
      inference::SystemSharedMemoryRegisterResponse* response) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(
      grpc::CallbackServerContext* context,
      const inference::SystemSharedMemoryUnregisterRequest* request,
      inference::SystemSharedMemoryUnregisterResponse* response) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryStatus(
      grpc::CallbackServerContext* context, const inference::CudaSharedMemoryStatusRequest* request,
      inference::CudaSharedMemoryStatusResponse* response) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryRegister(
      grpc::CallbackServerContext* context,
      const inference::CudaSharedMemoryRegisterRequest* request,
      inference::CudaSharedMemoryRegisterResponse* response) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryUnregister(
      grpc::CallbackServerContext* context,
      const inference::CudaSharedMemoryUnregisterRequest* request,
      inference::CudaSharedMemoryUnregisterResponse* response) override;
  grpc::ServerUnaryReactor* LogSettings(grpc::CallbackServerContext* context,
                                        const inference::LogSettingsRequest* request,
                                        inference::LogSettingsResponse* response) override;
  grpc::ServerUnaryReactor* TraceSetting(grpc::CallbackServerContext* context,
                                         const inference::TraceSettingRequest* request,
                                         inference::TraceSettingResponse* response) override;

  // What one inference came to, for a unary answer or a stream's.
  struct InferOutcome {
    grpc::Status status;
    std::shared_ptr<const ServedModel> model;
    std::shared_ptr<const kserve::InferRequest> request;
    std::vector<interpreters::NamedTensor> outputs;
    bool streamed = false;  // its responses went to the stream open_stream gave
    Status error;           // for a streamed one, `status` as the server's status
  };
  // For a streaming model, once the request is read: where its responses go.
  using OpenStream = std::function<std::shared_ptr<ResponseStream>(
      std::shared_ptr<const ServedModel> model, std::shared_ptr<const kserve::InferRequest>)>;
  // Reads, checks and submits one request; `done` is called once, from any thread. A request
  // for a streaming model is refused unless `open_stream` is given.
  void Infer(const inference::ModelInferRequest& message,
             std::optional<Clock::time_point> transport_deadline, std::function<bool()> client_gone,
             std::function<void(InferOutcome)> done, const OpenStream& open_stream = nullptr);
  static void WriteOutcome(const InferOutcome& outcome, inference::ModelInferResponse* response);

  Metrics& metrics() { return metrics_; }
  const ServerConfig& config() const { return config_; }
  std::atomic<int64_t>& in_flight() { return *options_.in_flight; }
  OpenStreams& streams() { return streams_; }

 private:
  enum class Access { kInference, kRepository };
  // A unary call answered at once: the access check, then `body`, which fills the response and
  // returns the call's status.
  template <typename Body>
  grpc::ServerUnaryReactor* AnswerNow(grpc::CallbackServerContext* context, const char* method,
                                      Access access, Body&& body);
  // Why a call may not proceed (a missing or wrong token, a repository call from afar), or
  // nullopt.
  std::optional<grpc::Status> Refusal(const grpc::CallbackServerContext& context,
                                      Access access) const;
  Result<std::shared_ptr<const ServedModel>> Resolve(const std::string& name,
                                                     const std::string& version) const;

  ModelService& models_;
  Metrics& metrics_;
  const ServerConfig& config_;
  ServiceOptions options_;

 public:
  // Where unread stream answers are counted (ServiceOptions::answer_budget); null: nowhere.
  BufferBudget* answer_budget() const { return options_.answer_budget.get(); }
  kserve::InferenceRunner runner_;
  OpenStreams streams_;
};

}  // namespace orochi::server::grpc_api
