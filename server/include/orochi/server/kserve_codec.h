// KServe v2 (Open Inference Protocol) inference requests and responses, in JSON and with the
// binary tensor data extension, checked against a model's manifest. The server's handlers and
// `orochi run` share it, so both accept and print exactly the same thing.
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

class SharedMemoryRegion;    // kserve/shared_memory.h
class SharedMemoryRegistry;  // kserve/shared_memory.h

// Where a tensor's bytes are in system shared memory, as a request names them with Triton's
// parameters shared_memory_region, shared_memory_offset (0 when not given) and
// shared_memory_byte_size.
struct SharedMemoryRef {
  std::string region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
  // Set by ResolveSharedMemory: the region, kept mapped for as long as the request holds it
  // (even when it is unregistered meanwhile).
  std::shared_ptr<const SharedMemoryRegion> mapped;
};

struct SharedMemoryInput {
  SharedMemoryRef where;
  engine::Shape shape;  // as the request gives it, checked against the model's
};

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
  // Inputs whose bytes are in shared memory, by name: their entry in `inputs` holds no value
  // until ResolveSharedMemory reads it from the region.
  std::map<std::string, SharedMemoryInput> shared_memory_inputs;
  // Outputs to be written into shared memory instead of the response, by name.
  std::map<std::string, SharedMemoryRef> shared_memory_outputs;
};

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
// keeps its region mapped from here until the request is destroyed. Errors are
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

// Class names by output name (packaging::Package::labels()), for classification.
using OutputLabels = std::map<std::string, std::vector<std::string>>;

// Encodes outputs (in the manifest's order) as a v2 response for `request`; classes of an
// output with labels are written "score:index:label". An output written to shared memory
// (WriteSharedMemoryOutputs) gets its name, datatype, shape and shared-memory parameters, with
// shared_memory_byte_size the bytes written, and no data.
EncodedResponse EncodeInferResponse(const packaging::Manifest& manifest,
                                    const InferRequest& request,
                                    const std::vector<interpreters::NamedTensor>& outputs,
                                    const OutputLabels& labels = {});

}  // namespace orochi::server::kserve
