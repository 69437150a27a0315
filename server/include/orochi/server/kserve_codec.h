// KServe v2 (Open Inference Protocol) inference requests and responses, in JSON and with the
// binary tensor data extension, checked against a model's manifest. The server's handlers and
// `orochi run` share it, so both accept and print exactly the same thing; the gRPC front end
// reads its messages through the same InferRequestBuilder and writes the same
// ResponseTensors, so that both protocols check a request alike and word its errors alike.
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <map>
#include <memory>
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

// Class names by output name (packaging::Package::labels()), for classification.
using OutputLabels = std::map<std::string, std::vector<std::string>>;

// Builds an InferRequest from a request's parts as a protocol reads them, checking each against
// the manifest: the one place that says what a valid request is. Errors are kInvalidArgument
// with a message for the client.
class InferRequestBuilder {
 public:
  explicit InferRequestBuilder(const packaging::Manifest& manifest) : manifest_(manifest) {}

  // An input's name (declared, not given twice), datatype and shape: its spec, for reading
  // its values.
  Result<const packaging::TensorSpec*> CheckInput(const std::string& name,
                                                  std::string_view datatype,
                                                  const engine::Shape& shape) const;
  // Its values from little-endian bytes (BYTES: each element prefixed by a 4-byte length), as
  // the binary extension and gRPC's raw contents carry them. `source` names where they came
  // from, for errors ("binary_data_size", "raw_input_contents").
  Result<interpreters::NamedTensor> FromRaw(const packaging::TensorSpec& spec,
                                            const engine::Shape& shape, std::string_view bytes,
                                            std::string_view source) const;
  // Adds an input checked by CheckInput.
  void AddInput(interpreters::NamedTensor input);
  // A requested output: declared, asked once; a classification (`classes`, a count >= 1)
  // only of a numeric output.
  Status RequestOutput(const std::string& name, bool binary, std::optional<int64_t> classes);

  InferRequest& request() { return request_; }
  // Every input present, in the manifest's order, their batch sizes agreeing. Call once.
  Result<InferRequest> Finish();

 private:
  const packaging::Manifest& manifest_;
  InferRequest request_;
  std::map<std::string, interpreters::NamedTensor> inputs_;
};

// One output of a response as a protocol writes it: selected, and classified when asked.
struct ResponseTensor {
  const std::string* name;
  packaging::DataType datatype;
  engine::Shape shape;
  const engine::Tensor* tensor = nullptr;  // contiguous; else `bytes`
  const interpreters::BytesTensor* bytes = nullptr;
  bool binary = false;  // asked for as binary data (HTTP's binary extension)
};
struct ResponseTensors {
  std::vector<ResponseTensor> tensors;
  // What the pointers above point into: contiguous copies and classifications.
  std::vector<std::unique_ptr<engine::Tensor>> contiguous;
  std::vector<std::unique_ptr<interpreters::BytesTensor>> classes;
};
// The outputs (in the manifest's order) that `request` asked for, each as it is to be sent;
// they point into `outputs`, which must outlive the result.
ResponseTensors SelectResponseTensors(const packaging::Manifest& manifest,
                                      const InferRequest& request,
                                      const std::vector<interpreters::NamedTensor>& outputs,
                                      const OutputLabels& labels);

// The `timeout` parameter (microseconds) as a deadline from `received`, or else the server's
// default (`default_timeout`; zero: none). A timeout too long to represent is no deadline.
std::optional<std::chrono::steady_clock::time_point> RequestDeadline(
    const InferRequest& request, std::chrono::steady_clock::time_point received,
    std::chrono::milliseconds default_timeout);

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

// Encodes outputs (in the manifest's order) as a v2 response for `request`; classes of an
// output with labels are written "score:index:label".
EncodedResponse EncodeInferResponse(const packaging::Manifest& manifest,
                                    const InferRequest& request,
                                    const std::vector<interpreters::NamedTensor>& outputs,
                                    const OutputLabels& labels = {});

}  // namespace orochi::server::kserve
