// The KServe v2 (Open Inference Protocol) endpoints, with Triton's extensions for model
// configuration and statistics. Handlers turn parsed requests into responses through the
// ModelService; they never touch the engine or the interpreters directly.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "http/router.h"
#include "memory_guard.h"
#include "metrics/metrics.h"
#include "models/model_service.h"
#include "orochi/server/config.h"

namespace orochi::server::kserve {

// The HTTP status for a library error, with Triton's mapping.
unsigned HttpStatusOf(StatusCode code);

// The `reason` label of orochi_inference_requests_total for a request answered with `code`.
std::string FailureReason(StatusCode code);
// The same for a request whose body could not be parsed, where kResourceExhausted means that
// its tensors could not be allocated (`out_of_memory`), not a full queue; still a 503.
std::string ParseFailureReason(StatusCode code);

class KServeApi {
 public:
  KServeApi(ModelService& models, Metrics& metrics, const ServerConfig& config,
            std::function<bool()> ready);
  void Register(http::Router& router);

 private:
  void Infer(http::Request&& request, const http::PathParams& params, http::Responder respond);
  // The 404 for a model or version that is not served, in Triton's words.
  std::string UnknownModelMessage(const std::string& name, std::optional<int64_t> version) const;
  std::shared_ptr<const ServedModel> Resolve(const http::PathParams& params,
                                             const http::Responder& respond) const;

  ModelService& models_;
  Metrics& metrics_;
  const ServerConfig& config_;
  std::function<bool()> ready_;
  MemoryGuard memory_;
};

}  // namespace orochi::server::kserve
