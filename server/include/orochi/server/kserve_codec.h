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
#include <variant>
#include <vector>

#include "orochi/base/status.h"
#include "orochi/interpreters/model.h"
#include "orochi/packaging/manifest.h"

namespace orochi::server::kserve {

class SharedMemoryRegion;    // kserve/shared_memory.h
class SharedMemoryRegistry;  // kserve/shared_memory.h

// Where a tensor's bytes are in system shared memory, as a request names them with Triton's
// parameters shared_memory_region, shared_memory_offset (0 when not given) and
// shared_memory_byte_size.
struct SharedMemoryRef {
  std::string region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
  // Set by ResolveSharedMemory: the region, kept open for as long as the request holds it
  // (even when it is unregistered meanwhile).
  std::shared_ptr<const SharedMemoryRegion> mapped;
};

struct SharedMemoryInput {
  SharedMemoryRef where;
  engine::Shape shape;  // as the request gives it, checked against the model's
};

// Triton's sequence parameters of a request to a stateful model (the manifest's "sequence").
struct SequenceControl {
  // The sequence_id as the client wrote it, which names it in messages and keys it: an unsigned
  // integer in decimal (7), a string JSON-quoted ("\"user-7\""), so that 7 and "7" differ.
  std::string id;
  bool start = false;  // sequence_start: a new state (a live sequence of that id restarts)
  bool end = false;    // sequence_end: the state is freed after this request
};

struct InferRequest {
  std::string id;
  std::vector<interpreters::NamedTensor> inputs;  // in the manifest's order
  int64_t rows = 0;                               // the batch dim, for models that batch
  std::optional<std::chrono::microseconds> timeout;
  // The request's parameters other than those read here (timeout, binary_data_output), for the
  // model's predict().
  interpreters::RequestParameters parameters;
  // Set for (and only for) a stateful model: which sequence the request belongs to.
  std::optional<SequenceControl> sequence;
  std::vector<std::string> outputs;  // requested outputs; empty: all
  std::set<std::string> binary_outputs;
  // Outputs asked for as classes (Triton's classification extension): name -> how many.
  std::map<std::string, int64_t> classification;
  bool all_outputs_binary = false;
  // Inputs whose bytes are in shared memory, by name: their entry in `inputs` holds no value
  // until ResolveSharedMemory reads it from the region.
  std::map<std::string, SharedMemoryInput> shared_memory_inputs;
  // Outputs to be written into shared memory instead of the response, by name.
  std::map<std::string, SharedMemoryRef> shared_memory_outputs;
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
  // Triton's sequence parameters, which the model's predict() does not get as parameters:
  // sequence_id (an unsigned integer or a non-empty string), sequence_start and sequence_end
  // (booleans). A parameter's value as a protocol reads it; monostate for one of another type.
  using WireValue = std::variant<std::monostate, bool, int64_t, uint64_t, double, std::string>;
  static bool IsSequenceParameter(std::string_view name);
  Status SequenceParameter(const std::string& name, const WireValue& value);
  // Adds an input checked by CheckInput whose bytes are in shared memory: ResolveSharedMemory
  // reads them later.
  void AddSharedMemoryInput(const std::string& name, SharedMemoryRef where,
                            const engine::Shape& shape);
  // A requested output: declared, asked once; a classification (`classes`, a count >= 1)
  // only of a numeric output.
  Status RequestOutput(const std::string& name, bool binary, std::optional<int64_t> classes);
  // A requested output to be written into shared memory.
  Status RequestSharedMemoryOutput(const std::string& name, SharedMemoryRef where);

  InferRequest& request() { return request_; }
  // Every input present, in the manifest's order, their batch sizes agreeing; a stateful
  // model's request names its sequence, another model's names none. Call once.
  Result<InferRequest> Finish();

 private:
  const packaging::Manifest& manifest_;
  InferRequest request_;
  std::map<std::string, interpreters::NamedTensor> inputs_;
  std::map<std::string, int64_t> rows_;  // each input's batch dim, as its shape gives it
  SequenceControl sequence_;
  bool sequence_given_ = false;  // any of the sequence parameters
};

// One output of a response as a protocol writes it: selected, and classified when asked.
struct ResponseTensor {
  const std::string* name;
  packaging::DataType datatype;
  engine::Shape shape;
  const engine::Tensor* tensor = nullptr;  // contiguous; else `bytes`
  const interpreters::BytesTensor* bytes = nullptr;
  bool binary = false;  // asked for as binary data (HTTP's binary extension)
  // Written into shared memory (WriteSharedMemoryOutputs): the response names where, with no
  // data.
  const SharedMemoryRef* shared_memory = nullptr;
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
// A request that names shared memory (shared_memory_inputs or shared_memory_outputs not empty)
// must go through ResolveSharedMemory before its inputs are used, or be refused.
Result<InferRequest> ParseInferRequest(const packaging::Manifest& manifest, std::string_view body,
                                       std::optional<size_t> json_length,
                                       const ParseLimits& limits);

// The step after parsing, for every protocol that parsed a request into `request`: reads the
// inputs in shared_memory_inputs from their regions (copied into tensors, so the client may
// reuse the region as soon as the answer arrives, and a model may keep or change its inputs),
// and checks that the regions of shared_memory_outputs exist and hold their ranges. Each ref
// keeps its region open from here until the request is destroyed. Errors are
// kInvalidArgument naming the input or output, the region, the offset and the size.
Status ResolveSharedMemory(const packaging::Manifest& manifest,
                           const SharedMemoryRegistry& registry, InferRequest* request);

// Writes the outputs of `request` that go to shared memory into their regions; call before
// EncodeInferResponse, which then lists them without data. kInvalidArgument, with nothing
// written, when an output does not fit the byte size its request gave.
Status WriteSharedMemoryOutputs(const packaging::Manifest& manifest, const InferRequest& request,
                                const std::vector<interpreters::NamedTensor>& outputs);

struct EncodedResponse {
  std::string body;
  std::optional<size_t> json_length;  // set when binary data follows the JSON
};

// Encodes outputs (in the manifest's order) as a v2 response for `request`; classes of an
// output with labels are written "score:index:label". An output written to shared memory
// (WriteSharedMemoryOutputs) gets its name, datatype, shape and shared-memory parameters, with
// shared_memory_byte_size the bytes written, and no data.
EncodedResponse EncodeInferResponse(const packaging::Manifest& manifest,
                                    const InferRequest& request,
                                    const std::vector<interpreters::NamedTensor>& outputs,
                                    const OutputLabels& labels = {});

}  // namespace orochi::server::kserve
