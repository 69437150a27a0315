// An OpenAI-compatible endpoint on the inference port, for streaming text generators whose
// manifest has the "openai" key: GET /v1/models (and /v1/models/{model}), POST /v1/completions
// and POST /v1/chat/completions, answered once or, with "stream": true, as Server-Sent Events
// (`data: {chunk}` ... `data: [DONE]`). A request becomes an inference request of the model:
// the prompt (a chat's messages rendered into one, see docs/API.md) as its text input, and
// max_tokens, temperature, top_p, stop and seed as request parameters. Errors have OpenAI's
// shape, {"error": {"message", "type", "param", "code"}}.
#pragma once

#include "http/router.h"
#include "kserve/inference.h"
#include "metrics/metrics.h"
#include "models/model_service.h"
#include "orochi/server/config.h"

namespace orochi::server::openai {

class OpenAiApi {
 public:
  OpenAiApi(ModelService& models, Metrics& metrics, const ServerConfig& config);
  void Register(http::Router& router);

 private:
  enum class Kind { kCompletion, kChat };
  void Models(const http::Responder& respond) const;
  void Model(const std::string& name, const http::Responder& respond) const;
  void Complete(const http::Request& request, const http::Responder& respond, Kind kind);

  ModelService& models_;
  const ServerConfig& config_;
  kserve::InferenceRunner runner_;
};

}  // namespace orochi::server::openai
