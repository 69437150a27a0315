#include "inference.h"

#include <algorithm>
#include <utility>

namespace orochi::server::kserve {
namespace {

// Whether a request read against `b`'s manifest is also one for `a`: the same inputs and
// outputs (names, datatypes, shapes) and batching.
bool SameInterface(const packaging::Manifest& a, const packaging::Manifest& b) {
  auto same = [](const std::vector<packaging::TensorSpec>& x,
                 const std::vector<packaging::TensorSpec>& y) {
    return std::equal(x.begin(), x.end(), y.begin(), y.end(),
                      [](const packaging::TensorSpec& left, const packaging::TensorSpec& right) {
                        return left.name == right.name && left.datatype == right.datatype &&
                               left.shape == right.shape;
                      });
  };
  return a.max_batch_size == b.max_batch_size && same(a.inputs, b.inputs) &&
         same(a.outputs, b.outputs);
}

}  // namespace

const char* TritonTypeName(packaging::DataType datatype) {
  using packaging::DataType;
  switch (datatype) {
    case DataType::kBool:
      return "TYPE_BOOL";
    case DataType::kUInt8:
      return "TYPE_UINT8";
    case DataType::kInt8:
      return "TYPE_INT8";
    case DataType::kInt16:
      return "TYPE_INT16";
    case DataType::kInt32:
      return "TYPE_INT32";
    case DataType::kInt64:
      return "TYPE_INT64";
    case DataType::kFp16:
      return "TYPE_FP16";
    case DataType::kBf16:
      return "TYPE_BF16";
    case DataType::kFp32:
      return "TYPE_FP32";
    case DataType::kFp64:
      return "TYPE_FP64";
    case DataType::kBytes:
      return "TYPE_STRING";
  }
  return "TYPE_INVALID";
}

std::vector<int64_t> ClientShape(const packaging::Manifest& manifest,
                                 const packaging::TensorSpec& spec) {
  std::vector<int64_t> shape = spec.shape;
  if (manifest.max_batch_size > 0) shape.insert(shape.begin(), -1);
  return shape;
}

std::string FailureReason(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return "invalid_argument";
    case StatusCode::kResourceExhausted:
      return "queue_full";
    case StatusCode::kDeadlineExceeded:
      return "timeout";
    case StatusCode::kPythonError:
      return "model_error";
    case StatusCode::kFailedPrecondition:
      return "client_gone";
    case StatusCode::kUnavailable:
      return "unavailable";
    default:
      return "internal";
  }
}

std::string ParseFailureReason(StatusCode code) {
  // The parse has no queue to find full: its kResourceExhausted is memory it could not get.
  return code == StatusCode::kResourceExhausted ? "out_of_memory" : FailureReason(code);
}

unsigned HttpStatusOf(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
      return 400;
    case StatusCode::kAlreadyExists:
      return 409;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kUnavailable:
    case StatusCode::kResourceExhausted:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
    case StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

InferenceRunner::InferenceRunner(ModelService& models, Metrics& metrics, const ServerConfig& config)
    : models_(models),
      metrics_(metrics),
      config_(config),
      memory_(config.models.max_memory_bytes) {}

Result<std::shared_ptr<const ServedModel>> InferenceRunner::Resolve(const std::string& name,
                                                                    std::string_view version,
                                                                    bool count_unknown) const {
  std::optional<int64_t> number;
  if (!version.empty()) {
    if (version.size() > 18 || version.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgument("model version must be a positive integer, got '" +
                             std::string(version) + "'");
    }
    number = std::stoll(std::string(version));
  }
  std::shared_ptr<const ServedModel> model = models_.Find(name, number);
  if (model == nullptr) {
    if (count_unknown) metrics_.UnknownModel();
    return NotFound(UnknownModelMessage(name, number));
  }
  return model;
}

std::string InferenceRunner::UnknownModelMessage(const std::string& name,
                                                 std::optional<int64_t> version) const {
  // Triton's wording first (its clients and scripts match on it), then Orochi's detail.
  std::string message = "Request for unknown model: '" + name + "'";
  if (version) message += " version " + std::to_string(*version);
  message += " is not found";
  const std::vector<int64_t> loaded = models_.Versions(name);
  // Without a version, a model loaded since Find looked is still one that was not served.
  if (loaded.empty() || !version) {
    // Why, when a load failed or a quarantine keeps it out: a client should not have to read
    // the repository index to learn that the model crashed the server.
    const std::string failed = models_.LoadFailures(name);
    return message + " (model '" + name + "' is not loaded" +
           (failed.empty() ? "" : ": " + failed) + ")";
  }
  std::string versions;
  for (int64_t each : loaded) versions += (versions.empty() ? "" : ", ") + std::to_string(each);
  return message + " (version " + std::to_string(*version) + " is not loaded; loaded: " + versions +
         ")";
}

namespace {

// Why a request of `bytes` is too large for `model` (its manifest's max_request_bytes), if it is.
std::optional<std::string> PastModelLimit(const ServedModel& model, uint64_t bytes) {
  const std::optional<int64_t>& limit = model.manifest().max_request_bytes;
  if (!limit || bytes <= static_cast<uint64_t>(*limit)) return std::nullopt;
  return "model " + model.name + " takes at most " + std::to_string(*limit) +
         " (max_request_bytes in its manifest)";
}

}  // namespace

std::optional<InferenceRunner::Refusal> InferenceRunner::Admit(const ServedModel& model,
                                                               size_t bytes,
                                                               Clock::time_point received) {
  if (std::optional<std::string> past = PastModelLimit(model, bytes)) {
    Refused(model, "too_large", received);
    return Refusal{
        ResourceExhausted("the request has " + std::to_string(bytes) + " bytes; " + *past), true};
  }
  if (Status memory = memory_.Admit(); !memory.ok()) {
    Refused(model, "out_of_memory", received);
    return Refusal{memory, false};
  }
  return std::nullopt;
}

std::optional<InferenceRunner::Refusal> InferenceRunner::AdmitSharedMemoryInputs(
    const ServedModel& model, const InferRequest& request, uint64_t carried_bytes,
    uint64_t max_bytes, Clock::time_point received) {
  if (request.shared_memory_inputs.empty()) return std::nullopt;
  uint64_t shared_bytes = 0;
  for (const auto& [name, input] : request.shared_memory_inputs) {
    shared_bytes += input.where.byte_size;  // each bounded by the region's size (< 2^63)
  }
  const uint64_t total = carried_bytes + shared_bytes;
  std::optional<std::string> bound = PastModelLimit(model, total);
  if (total > max_bytes) {
    bound = "the server takes at most " + std::to_string(max_bytes) + " in a request";
  }
  if (!bound) return std::nullopt;
  Refused(model, "too_large", received);
  return Refusal{
      ResourceExhausted("the request has " + std::to_string(total) + " bytes with " +
                        std::to_string(shared_bytes) +
                        " of inputs in shared memory, which count as its own; " + *bound),
      true};
}

void InferenceRunner::Refused(const ServedModel& model, const std::string& reason,
                              Clock::time_point received) const {
  metrics_.RequestDone(model.name, std::to_string(model.version), reason, Clock::now() - received,
                       {}, {});
}

void InferenceRunner::Run(InferenceCall call, InferenceDone done) {
  std::optional<Clock::time_point> deadline = RequestDeadline(
      *call.request, call.received, std::chrono::milliseconds(config_.models.default_timeout_ms));
  if (call.transport_deadline && (!deadline || *call.transport_deadline < *deadline)) {
    deadline = call.transport_deadline;
  }
  auto shared_done = std::make_shared<InferenceDone>(std::move(done));
  auto complete = std::make_shared<decltype(call.complete)>(std::move(call.complete));
  const Clock::time_point received = call.received;
  auto answer = [this, shared_done, complete, received](std::shared_ptr<const ServedModel> model) {
    return [this, model = std::move(model), shared_done, complete, received](
               Result<std::vector<interpreters::NamedTensor>> outputs,
               const InferTimings& timings) {
      const std::chrono::nanoseconds total = Clock::now() - received;
      const std::string version = std::to_string(model->version);
      if (!outputs.ok()) {
        metrics_.RequestDone(model->name, version, FailureReason(outputs.status().code()), total,
                             timings.queue, timings.compute);
        (*shared_done)(outputs.status());
        return;
      }
      if (*complete) {
        if (Status completed = (*complete)(*model, *outputs); !completed.ok()) {
          metrics_.RequestDone(model->name, version, FailureReason(completed.code()), total,
                               timings.queue, timings.compute);
          (*shared_done)(completed);
          return;
        }
      }
      metrics_.RequestDone(model->name, version, "success", total, timings.queue, timings.compute);
      (*shared_done)(InferenceResult{model, std::move(outputs).value()});
    };
  };
  std::vector<interpreters::NamedTensor> inputs = std::move(call.request->inputs);
  const InferRequest& request = *call.request;
  auto stream_for = [&call](const ServedModel& model) {
    return model.manifest().streaming ? call.stream : nullptr;
  };
  if (call.model->manifest().streaming && call.stream == nullptr) {
    const Status refused =
        InvalidArgument("model " + call.model->name +
                        " is a streaming model: it answers through the generate extension "
                        "(/v2/models/{m}/generate, /generate_stream) or gRPC ModelStreamInfer");
    Refused(*call.model, FailureReason(refused.code()), received);
    (*shared_done)(refused);
    return;
  }
  std::optional<interpreters::SequenceCall> sequence;
  if (request.sequence) {
    sequence = interpreters::SequenceCall{request.sequence->id, request.sequence->start,
                                          request.sequence->end};
  }
  Status submitted =
      models_.Submit(call.model, inputs, request.parameters, request.rows, deadline,
                     call.client_gone, answer(call.model), stream_for(*call.model), sequence);
  // The version resolved may have been replaced meanwhile (a deploy, a delete of the served
  // version): it is unloading, or gone. A request that named no version is for whichever
  // version serves now, as the version switch promises: it goes there, if that version takes
  // the same inputs (they were read against the old one's manifest).
  if (!submitted.ok() && !call.version_named &&
      (submitted.code() == StatusCode::kNotFound || submitted.code() == StatusCode::kUnavailable)) {
    std::shared_ptr<const ServedModel> serving = models_.Find(call.model->name, std::nullopt);
    if (serving != nullptr && serving != call.model &&
        SameInterface(serving->manifest(), call.model->manifest())) {
      Status resubmitted =
          models_.Submit(serving, inputs, request.parameters, request.rows, deadline,
                         call.client_gone, answer(serving), stream_for(*serving), sequence);
      if (resubmitted.ok()) return;
    }
  }
  if (!submitted.ok()) {
    Refused(*call.model, FailureReason(submitted.code()), received);
    (*shared_done)(submitted);
  }
}

}  // namespace orochi::server::kserve
