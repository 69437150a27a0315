// The protocol-neutral half of an inference call, shared by the HTTP and gRPC front ends: which
// model a request names, admission, the deadline, submission to the scheduler (and the
// re-route to the version that replaced the one resolved, for requests that named none), and
// the request metrics. A front end reads its wire format into an InferRequest (kserve_codec.h),
// hands it here, and writes what comes back in its own format.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memory_guard.h"
#include "metrics/metrics.h"
#include "models/model_service.h"
#include "orochi/server/config.h"
#include "orochi/server/kserve_codec.h"

namespace orochi::server::kserve {

// The HTTP status for a library error, with Triton's mapping.
unsigned HttpStatusOf(StatusCode code);

// The `reason` label of orochi_inference_requests_total for a request answered with `code`.
std::string FailureReason(StatusCode code);
// The same for a request whose body could not be parsed, where kResourceExhausted means that
// its tensors could not be allocated (`out_of_memory`), not a full queue; still a 503.
std::string ParseFailureReason(StatusCode code);

// A datatype as Triton's model configuration names it ("TYPE_FP32"; BYTES is "TYPE_STRING").
const char* TritonTypeName(packaging::DataType datatype);
// A tensor's shape as clients see it: with the batch dim (-1) first for models that batch.
std::vector<int64_t> ClientShape(const packaging::Manifest& manifest,
                                 const packaging::TensorSpec& spec);

struct InferenceResult {
  std::shared_ptr<const ServedModel> model;  // the version that answered
  std::vector<interpreters::NamedTensor> outputs;
};

// Called once with the outputs or with why the call failed (its FailureReason says which
// metric it was counted under). Runs on a scheduler worker or on the submitting thread.
using InferenceDone = std::function<void(Result<InferenceResult>)>;

struct InferenceCall {
  std::shared_ptr<const ServedModel> model;  // as Resolve found it
  bool version_named = false;                // the client asked for this version
  std::shared_ptr<InferRequest> request;
  Clock::time_point received;
  // A deadline of the transport's own (gRPC's); the earlier of it and the request's applies.
  std::optional<Clock::time_point> transport_deadline;
  std::function<bool()> client_gone;  // polled while the request waits and runs
  // Where a streaming model's responses go as they come (its InferenceResult then has no
  // outputs). A model that does not stream answers through `done` as usual.
  std::shared_ptr<ResponseStream> stream;
  // Optional: the last step of a success before it is counted and answered (writing outputs
  // into shared memory, say); its error fails the request instead.
  std::function<Status(const ServedModel& answered_by,
                       const std::vector<interpreters::NamedTensor>& outputs)>
      complete;
};

class InferenceRunner {
 public:
  InferenceRunner(ModelService& models, Metrics& metrics, const ServerConfig& config);

  // The model a request names; `version` empty for the version the server chooses. NotFound
  // (counted as a request for an unknown model when `count_unknown`) or InvalidArgument for a
  // version that is not a positive integer.
  Result<std::shared_ptr<const ServedModel>> Resolve(const std::string& name,
                                                     std::string_view version,
                                                     bool count_unknown) const;

  // Checks a request that is `bytes` long before it is read: the model's max_request_bytes
  // (kResourceExhausted, reason "too_large") and the server's memory (kResourceExhausted,
  // reason "out_of_memory"). A refusal is counted.
  struct Refusal {
    Status status;
    bool too_large = false;
  };
  std::optional<Refusal> Admit(const ServedModel& model, size_t bytes, Clock::time_point received);

  // Checks a parsed request `carried_bytes` long whose inputs in shared memory are yet to be
  // read: they count as if they came in it, against `max_bytes` (the protocol's bound on a
  // request: http.max_body_bytes, grpc.max_message_bytes) and the model's max_request_bytes
  // (kResourceExhausted, reason "too_large"), so that a request of 2 KB cannot have 1 GiB read
  // into the server's memory. A refusal is counted.
  std::optional<Refusal> AdmitSharedMemoryInputs(const ServedModel& model,
                                                 const InferRequest& request,
                                                 uint64_t carried_bytes, uint64_t max_bytes,
                                                 Clock::time_point received);

  // Counts a request that failed before it was submitted (it could not be read, say).
  void Refused(const ServedModel& model, const std::string& reason,
               Clock::time_point received) const;

  // Submits the call; `done` is called exactly once, and every outcome is counted.
  void Run(InferenceCall call, InferenceDone done);

 private:
  // The NotFound message for a model or version that is not served, in Triton's words.
  std::string UnknownModelMessage(const std::string& name, std::optional<int64_t> version) const;

  ModelService& models_;
  Metrics& metrics_;
  const ServerConfig& config_;
  MemoryGuard memory_;
};

}  // namespace orochi::server::kserve
