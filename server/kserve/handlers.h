// The KServe v2 (Open Inference Protocol) endpoints, with Triton's extensions for model
// configuration and statistics. Handlers turn parsed requests into responses through the
// ModelService; they never touch the engine or the interpreters directly.
#pragma once

#include <functional>
#include <string>

#include "http/router.h"
#include "inference.h"
#include "metrics/metrics.h"
#include "models/model_service.h"
#include "orochi/server/config.h"

namespace orochi::server::kserve {

class KServeApi {
 public:
  KServeApi(ModelService& models, Metrics& metrics, const ServerConfig& config,
            std::function<bool()> ready);
  void Register(http::Router& router);

 private:
  void Infer(http::Request&& request, const http::PathParams& params, http::Responder respond);
  // The model the path names, or null once `respond` has been given the 400/404.
  std::shared_ptr<const ServedModel> Resolve(const http::PathParams& params,
                                             const http::Responder& respond,
                                             bool count_unknown = false) const;

  ModelService& models_;
  const ServerConfig& config_;
  std::function<bool()> ready_;
  InferenceRunner runner_;
};

}  // namespace orochi::server::kserve
