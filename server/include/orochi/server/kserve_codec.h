// KServe v2 (Open Inference Protocol) inference requests and responses, in JSON and with the
// binary tensor data extension, checked against a model's manifest. The server's handlers and
// `orochi run` share it, so both accept and print exactly the same thing.
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "orochi/base/status.h"
#include "orochi/interpreters/model.h"
#include "orochi/packaging/manifest.h"

namespace orochi::server::kserve {

struct InferRequest {
  std::string id;
  std::vector<interpreters::NamedTensor> inputs;  // in the manifest's order
  int64_t rows = 0;                               // the batch dim, for models that batch
  std::optional<std::chrono::microseconds> timeout;
  // The request's parameters other than those read here (timeout, binary_data_output), for the
  // model's predict().
  interpreters::RequestParameters parameters;
  std::vector<std::string> outputs;  // requested outputs; empty: all
  std::set<std::string> binary_outputs;
  // Outputs asked for as classes (Triton's classification extension): name -> how many.
  std::map<std::string, int64_t> classification;
  bool all_outputs_binary = false;
};

struct ParseLimits {
  int max_json_depth = 64;
};

// Parses a request body. `json_length` is the Inference-Header-Content-Length header's value
// when the binary extension is used. Errors are kInvalidArgument with a message for the client.
Result<InferRequest> ParseInferRequest(const packaging::Manifest& manifest, std::string_view body,
                                       std::optional<size_t> json_length,
                                       const ParseLimits& limits);

struct EncodedResponse {
  std::string body;
  std::optional<size_t> json_length;  // set when binary data follows the JSON
};

// Class names by output name (packaging::Package::labels()), for classification.
using OutputLabels = std::map<std::string, std::vector<std::string>>;

// Encodes outputs (in the manifest's order) as a v2 response for `request`; classes of an
// output with labels are written "score:index:label".
EncodedResponse EncodeInferResponse(const packaging::Manifest& manifest,
                                    const InferRequest& request,
                                    const std::vector<interpreters::NamedTensor>& outputs,
                                    const OutputLabels& labels = {});

}  // namespace orochi::server::kserve
