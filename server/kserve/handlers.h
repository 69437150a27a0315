// The KServe v2 (Open Inference Protocol) endpoints, with Triton's extensions for model
// configuration and statistics. Handlers turn parsed requests into responses through the
// ModelService; they never touch the engine or the interpreters directly.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "http/router.h"
#include "inference.h"
#include "kserve/shared_memory.h"
#include "metrics/metrics.h"
#include "models/model_service.h"
#include "orochi/server/config.h"

namespace orochi::server::kserve {

// An inference error's message for its client (a Python error with its traceback), and its
// answer: Triton's status, or nginx's 499 for a client that left.
std::string ErrorMessage(const Status& error);
http::Response InferErrorResponse(const Status& error);

class KServeApi {
 public:
  // `shared_memory` is the server's registry, shared with the other protocols.
  KServeApi(ModelService& models, Metrics& metrics, const ServerConfig& config,
            SharedMemoryRegistry& shared_memory, std::function<bool()> ready);
  void Register(http::Router& router);

 private:
  void Infer(http::Request&& request, const http::PathParams& params, http::Responder respond);
  // Triton's generate extension: /generate answers once (the responses of a streaming model
  // combined), /generate_stream as Server-Sent Events, one event per response.
  void Generate(http::Request&& request, const http::PathParams& params,
                const http::Responder& respond, bool stream);
  // Triton's system shared-memory extension (status, register, unregister) and the CUDA one's
  // endpoints, which answer that this server has no CUDA shared memory.
  void RegisterSharedMemory(http::Router& router);
  // The model the path names, or null once `respond` has been given the 400/404.
  std::shared_ptr<const ServedModel> Resolve(const http::PathParams& params,
                                             const http::Responder& respond,
                                             bool count_unknown = false) const;
  // The inference model the path names, admitted for a request of `bytes` received at
  // `received` (its queue, memory and size limits); null once `respond` has the refusal.
  std::shared_ptr<const ServedModel> ResolveAndAdmit(const http::PathParams& params,
                                                     const http::Responder& respond, size_t bytes,
                                                     Clock::time_point received);

  ModelService& models_;
  const ServerConfig& config_;
  SharedMemoryRegistry& shared_memory_;
  std::function<bool()> ready_;
  InferenceRunner runner_;
};

}  // namespace orochi::server::kserve
