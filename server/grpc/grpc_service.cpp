#include "grpc_service.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>

#include "auth.h"
#include "infer_codec.h"
#include "kserve/settings.h"
#include "log.h"
#include "repository/load_request.h"

namespace orochi::server::grpc_api {
namespace {

using inference::ModelInferRequest;
using inference::ModelStreamInferResponse;
using packaging::Manifest;
using packaging::TensorSpec;

grpc::Status ToGrpc(const Status& status) {
  std::string message = status.message();
  if (status.code() == StatusCode::kPythonError && !status.detail().empty()) {
    message += "\n" + status.detail();
  }
  return {GrpcCodeOf(status.code()), message};
}

// A time point of the system clock (gRPC's deadlines) on the steady clock (the scheduler's);
// nullopt for "no deadline".
std::optional<Clock::time_point> SteadyDeadline(std::chrono::system_clock::time_point deadline) {
  if (deadline == std::chrono::system_clock::time_point::max()) return std::nullopt;
  const auto left = deadline - std::chrono::system_clock::now();
  // Beyond a century is none: it would overflow the steady clock's nanoseconds.
  if (left > std::chrono::hours(24 * 365 * 100)) return std::nullopt;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

// Whether a peer ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000") is on this machine's loopback.
bool LoopbackPeer(const std::string& peer) {
  return peer.starts_with("ipv4:127.") || peer.starts_with("ipv6:[::1]") ||
         peer.starts_with("ipv6:[::ffff:127.") || peer.starts_with("unix:");
}

// A TCP peer ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000") as its address and port.
std::optional<std::pair<std::string, uint16_t>> TcpPeer(const std::string& peer) {
  const size_t scheme = peer.find(':');
  const size_t port_at = peer.rfind(':');
  if (scheme == std::string::npos || port_at == scheme ||
      (!peer.starts_with("ipv4:") && !peer.starts_with("ipv6:"))) {
    return std::nullopt;
  }
  char* end = nullptr;
  const unsigned long port = std::strtoul(peer.c_str() + port_at + 1, &end, 10);
  if (*end != '\0' || port > 65535) return std::nullopt;
  return std::pair{peer.substr(scheme + 1, port_at - scheme - 1), static_cast<uint16_t>(port)};
}

// A unary call in progress: answered once, counted, and flagged when its client cancels or
// leaves (read by the scheduler through client_gone, which must not touch the context).
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  UnaryCall(InferenceService& service, const char* method)
      : service_(service), method_(method), cancelled_(std::make_shared<std::atomic<bool>>()) {
    service_.in_flight().fetch_add(1);
  }
  void Answer(const grpc::Status& status) {
    service_.metrics().GrpcRequest(method_, GrpcCodeName(status.error_code()));
    Finish(status);
  }
  std::function<bool()> client_gone() const {
    return [cancelled = cancelled_] { return cancelled->load(); };
  }
  void OnCancel() override { cancelled_->store(true); }
  void OnDone() override {
    service_.in_flight().fetch_sub(1);
    delete this;
  }

 private:
  InferenceService& service_;
  const char* method_;
  std::shared_ptr<std::atomic<bool>> cancelled_;
};

}  // namespace

// One ModelStreamInfer stream: requests are read one at a time and submitted as they come, each
// answer written as it is ready (in completion order; clients match them by id). At most
// grpc.max_stream_in_flight requests are read and not yet answered: past that the stream is
// not read until an answer has been written, so HTTP/2 flow control holds a fast sender back,
// and a slow reader holds back the reading of its own requests. The stream ends (OK) when the
// client has finished sending and every answer is written; it outlives every callback it
// handed out, since it finishes only when none is left outstanding.
class StreamCall final
    : public grpc::ServerBidiReactor<ModelInferRequest, ModelStreamInferResponse> {
 public:
  StreamCall(InferenceService& service, grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        limit_(static_cast<size_t>(service.config().grpc.max_stream_in_flight)),
        cancelled_(std::make_shared<std::atomic<bool>>()) {
    service_.in_flight().fetch_add(1);
    service_.streams().Add(this);
    reading_ = true;
    StartRead(&incoming_);
  }

  // At shutdown: the stream reads no more requests, and ends once those it read are answered
  // (at once when there are none), so that a client holding an idle stream open does not hold
  // the shutdown for its whole grace.
  void Close() {
    std::lock_guard lock(mutex_);
    closing_ = true;
    if (outstanding_ == 0) context_->TryCancel();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client finished sending, or left
      Next next;
      {
        std::lock_guard lock(mutex_);
        reading_ = false;
        reads_done_ = true;
        next = DecideLocked();
      }
      Act(next);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      ++outstanding_;
    }
    ModelInferRequest request = std::move(incoming_);
    incoming_.Clear();
    auto stream = std::make_shared<std::shared_ptr<ResponseStream>>();
    service_.Infer(
        request, SteadyDeadline(context_->deadline()),
        [cancelled = cancelled_, stream] {
          return cancelled->load() || (*stream != nullptr && (*stream)->cancelled());
        },
        [this, id = request.id(), stream](const InferenceService::InferOutcome& outcome) {
          if (outcome.streamed) {
            (*stream)->End(outcome.error);
            return;
          }
          Answered(outcome, id);
        },
        [this, id = request.id(), stream](std::shared_ptr<const ServedModel> model,
                                          std::shared_ptr<const kserve::InferRequest> read) {
          *stream = OpenStream(std::move(model), std::move(read), id);
          return *stream;
        });
    Next next;
    {
      std::lock_guard lock(mutex_);
      reading_ = false;
      next = DecideLocked();
    }
    Act(next);
  }

  void OnWriteDone(bool ok) override {
    Next next;
    {
      std::lock_guard lock(mutex_);
      if (writes_.front().last) --outstanding_;
      GiveBudget(writes_.front().budgeted);
      writes_.pop_front();
      writing_ = false;
      if (!ok) {
        // The client is gone: drop what is left to write; running requests see client_gone,
        // and running streams are cancelled (each still ends, see TakeStreamResponse).
        cancelled_->store(true);
        for (const Write& write : writes_) {
          if (write.last) --outstanding_;
          GiveBudget(write.budgeted);
        }
        writes_.clear();
      }
      if (cancelled_->load()) CancelStreamsLocked();
      next = DecideLocked();
    }
    Act(next);
  }

  void OnCancel() override {
    cancelled_->store(true);
    Next next;
    {
      std::lock_guard lock(mutex_);
      CancelStreamsLocked();
      next = DecideLocked();
    }
    Act(next);
  }

  void OnDone() override {
    for (const Write& write : writes_) GiveBudget(write.budgeted);
    service_.streams().Remove(this);
    service_.in_flight().fetch_sub(1);
    delete this;
  }

 private:
  // What to start once the lock is released: gRPC may run a reaction on the thread that starts
  // an operation, and the reaction takes the lock.
  struct Next {
    const ModelStreamInferResponse* write = nullptr;
    bool read = false;
    bool finish = false;
  };

  struct Write {
    std::unique_ptr<ModelStreamInferResponse> response;
    bool last = true;       // its request's last response: answered once it is written
    uint64_t budgeted = 0;  // its bytes taken from the service's answer_budget (Budget)
  };

  // A streaming request's responses: written as they come, one at a time, each taken from its
  // stream only when nothing else waits to be written (so a slow reader leaves them in the
  // stream's bounded buffer, and its model waits).
  struct OpenedStream {
    std::shared_ptr<ResponseStream> responses;
    std::shared_ptr<const ServedModel> model;
    std::shared_ptr<const kserve::InferRequest> request;
    std::string id;
  };

  std::shared_ptr<ResponseStream> OpenStream(std::shared_ptr<const ServedModel> model,
                                             std::shared_ptr<const kserve::InferRequest> request,
                                             const std::string& id) {
    auto responses = std::make_shared<ResponseStream>(
        static_cast<size_t>(service_.config().models.stream_buffer_responses));
    // Called by the stream's producer; the call outlives the stream, which ends before its
    // request stops counting as outstanding.
    responses->SetListener([this] {
      Next next;
      {
        std::lock_guard lock(mutex_);
        next = DecideLocked();
      }
      Act(next);
    });
    std::lock_guard lock(mutex_);
    streams_.push_back({responses, std::move(model), std::move(request), id});
    return responses;
  }

  void CancelStreamsLocked() {
    for (const OpenedStream& stream : streams_) stream.responses->Cancel();
  }

  // The next response of the open streams, into writes_; ended streams leave.
  void TakeStreamResponseLocked() {
    for (auto it = streams_.begin(); it != streams_.end(); ++it) {
      std::optional<ResponseStream::Item> item = it->responses->Pop();
      if (!item) continue;
      const bool last = !item->response.has_value();
      if (cancelled_->load()) {  // nobody to write to: only the end matters
        if (last) {
          --outstanding_;
          streams_.erase(it);
        }
        return;
      }
      auto response = std::make_unique<ModelStreamInferResponse>();
      auto* infer = response->mutable_infer_response();
      if (item->response) {
        WriteInferResponse(it->model->manifest(), *it->request, *item->response,
                           it->model->package->labels(), infer);
      } else {
        infer->set_model_name(it->model->name);
        infer->set_model_version(std::to_string(it->model->version));
        if (!item->end.ok()) {
          response->set_error_message(ToGrpc(item->end).error_message());
        }
        service_.metrics().GrpcRequest(
            "ModelStreamInfer",
            GrpcCodeName(item->end.ok() ? grpc::StatusCode::OK : GrpcCodeOf(item->end.code())));
      }
      infer->set_id(it->id);
      (*infer->mutable_parameters())["triton_final_response"].set_bool_param(last);
      writes_.push_back({std::move(response), last});
      if (last) streams_.erase(it);
      return;
    }
  }

  Next DecideLocked() {
    Next next;
    if (!writing_ && writes_.empty()) TakeStreamResponseLocked();
    while (cancelled_->load() && !streams_.empty()) {
      // Drain the ended streams of a cancelled call; those still running end later.
      const size_t before = streams_.size();
      TakeStreamResponseLocked();
      if (streams_.size() == before) break;
    }
    const bool cancelled = cancelled_->load();
    if (!writing_ && !writes_.empty()) {
      writing_ = true;
      next.write = writes_.front().response.get();
    }
    if (!reading_ && !reads_done_ && !cancelled && !closing_ && outstanding_ < limit_) {
      reading_ = true;
      next.read = true;
    }
    if (!finished_ && outstanding_ == 0 && !reading_ && (reads_done_ || cancelled)) {
      finished_ = true;
      next.finish = true;
    }
    // Shutting down with nothing left to answer, but the client may still send: ended here
    // (its pending read completes, and the stream finishes as cancelled).
    if (closing_ && outstanding_ == 0 && !finished_) context_->TryCancel();
    return next;
  }

  // Finish comes last: the stream may be deleted as soon as it is called.
  void Act(const Next& next) {
    if (next.write != nullptr) StartWrite(next.write);
    if (next.read) StartRead(&incoming_);
    if (next.finish) Finish(cancelled_->load() ? grpc::Status::CANCELLED : grpc::Status::OK);
  }

  void Answered(const InferenceService::InferOutcome& outcome, const std::string& id) {
    service_.metrics().GrpcRequest("ModelStreamInfer", GrpcCodeName(outcome.status.error_code()));
    auto response = std::make_unique<ModelStreamInferResponse>();
    if (outcome.status.ok()) {
      InferenceService::WriteOutcome(outcome, response->mutable_infer_response());
    } else {
      // The stream stays open: the error is this request's, named by its id.
      response->set_error_message(outcome.status.error_message());
      response->mutable_infer_response()->set_id(id);
    }
    const uint64_t budgeted = Budget(response, id);
    Next next;
    {
      std::lock_guard lock(mutex_);
      if (cancelled_->load()) {
        --outstanding_;
        GiveBudget(budgeted);
      } else {
        writes_.push_back({std::move(response), true, budgeted});
      }
      next = DecideLocked();
    }
    Act(next);
  }

  // Takes an answer's bytes from the server's buffer budget until it is written; one that does
  // not fit is replaced by an error that says why (its request's id kept), so that a client
  // that never reads its answers holds at most the budget, not every answer of every request it
  // sent (1.1 GB from one connection). Returns the bytes taken.
  uint64_t Budget(std::unique_ptr<ModelStreamInferResponse>& response, const std::string& id) {
    BufferBudget* budget = service_.answer_budget();
    if (budget == nullptr) return 0;
    const uint64_t bytes = response->ByteSizeLong();
    if (budget->Take(bytes)) return bytes;
    static std::atomic<uint64_t> dropped{0};
    const uint64_t dropped_so_far = dropped.fetch_add(1) + 1;
    const std::string why =
        "the answer (" + std::to_string(bytes) + " bytes) was dropped: the server holds " +
        std::to_string(budget->used()) +
        " bytes of request bodies and unread stream answers, and more would pass "
        "http.max_buffered_body_bytes (" +
        std::to_string(budget->max_bytes()) + "); read the stream's answers as they come";
    // Logged at the 1st, 2nd, 4th, 8th... drop: a client that never reads cannot flood the log.
    if ((dropped_so_far & (dropped_so_far - 1)) == 0) {
      Log(LogLevel::kWarning, "a stream's answer was dropped: the buffer budget is spent",
          {{"bytes", std::to_string(bytes), false},
           {"budget_bytes", std::to_string(budget->max_bytes()), false},
           {"dropped_so_far", std::to_string(dropped_so_far), false}});
    }
    response = std::make_unique<ModelStreamInferResponse>();
    response->set_error_message(why);
    response->mutable_infer_response()->set_id(id);
    return 0;
  }

  // Gives back what Budget took.
  void GiveBudget(uint64_t budgeted) {
    if (BufferBudget* budget = service_.answer_budget(); budget != nullptr && budgeted > 0) {
      budget->Give(budgeted);
    }
  }

  InferenceService& service_;
  grpc::CallbackServerContext* context_;
  const size_t limit_;
  std::shared_ptr<std::atomic<bool>> cancelled_;
  ModelInferRequest incoming_;  // the read in progress fills it
  std::mutex mutex_;
  size_t outstanding_ = 0;             // read and not yet written (or dropped)
  std::deque<Write> writes_;           // front: being written
  std::vector<OpenedStream> streams_;  // streaming requests still running
  bool writing_ = false;
  bool reading_ = false;
  bool reads_done_ = false;
  bool finished_ = false;
  bool closing_ = false;  // the server is shutting down
};

namespace {

void SetDuration(const DurationStat& stat, inference::StatisticDuration* duration) {
  duration->set_count(static_cast<uint64_t>(stat.count));
  duration->set_ns(static_cast<uint64_t>(stat.ns));
}

void WriteStatistics(const ServedModel& model, inference::ModelStatistics* written) {
  std::lock_guard lock(model.stats_mutex);
  const ModelStats& stats = model.stats;
  written->set_name(model.name);
  written->set_version(std::to_string(model.version));
  written->set_last_inference(static_cast<uint64_t>(stats.last_inference_ms));
  written->set_inference_count(static_cast<uint64_t>(stats.inference_count));
  written->set_execution_count(static_cast<uint64_t>(stats.execution_count));
  auto* inference_stats = written->mutable_inference_stats();
  SetDuration(stats.success, inference_stats->mutable_success());
  SetDuration(stats.fail, inference_stats->mutable_fail());
  SetDuration(stats.queue, inference_stats->mutable_queue());
  SetDuration(stats.compute.compute_input, inference_stats->mutable_compute_input());
  SetDuration(stats.compute.compute_infer, inference_stats->mutable_compute_infer());
  SetDuration(stats.compute.compute_output, inference_stats->mutable_compute_output());
  for (const auto& [size, stat] : stats.batches) {
    auto* batch = written->add_batch_stats();
    batch->set_batch_size(static_cast<uint64_t>(size));
    SetDuration(stat.compute_input, batch->mutable_compute_input());
    SetDuration(stat.compute_infer, batch->mutable_compute_infer());
    SetDuration(stat.compute_output, batch->mutable_compute_output());
  }
}

void WriteTensorsMetadata(
    const Manifest& manifest, const std::vector<TensorSpec>& specs,
    google::protobuf::RepeatedPtrField<inference::ModelMetadataResponse::TensorMetadata>* list) {
  for (const TensorSpec& spec : specs) {
    auto* tensor = list->Add();
    tensor->set_name(spec.name);
    tensor->set_datatype(std::string(packaging::DataTypeName(spec.datatype)));
    for (int64_t size : kserve::ClientShape(manifest, spec)) tensor->add_shape(size);
  }
}

inference::DataType ConfigType(packaging::DataType datatype) {
  inference::DataType value = inference::TYPE_INVALID;
  inference::DataType_Parse(kserve::TritonTypeName(datatype), &value);
  return value;
}

}  // namespace

grpc::StatusCode GrpcCodeOf(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return grpc::StatusCode::OK;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case StatusCode::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
    case StatusCode::kAlreadyExists:
      return grpc::StatusCode::ALREADY_EXISTS;
    case StatusCode::kFailedPrecondition:
      // Inference answers it when the client left: CANCELLED, as gRPC names that.
      return grpc::StatusCode::CANCELLED;
    case StatusCode::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case StatusCode::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case StatusCode::kUnimplemented:
      return grpc::StatusCode::UNIMPLEMENTED;
    case StatusCode::kPythonError:
    case StatusCode::kInternal:
      return grpc::StatusCode::INTERNAL;
  }
  return grpc::StatusCode::UNKNOWN;
}

const char* GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    default:
      return "OTHER";
  }
}

void OpenStreams::Add(StreamCall* stream) {
  std::lock_guard lock(mutex_);
  if (closed_) {
    stream->Close();
    return;
  }
  streams_.insert(stream);
}

void OpenStreams::Remove(StreamCall* stream) {
  std::lock_guard lock(mutex_);
  streams_.erase(stream);
}

void OpenStreams::CloseAll() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  // Each stream leaves the set in its OnDone, under this lock: none is deleted while closed.
  for (StreamCall* stream : streams_) stream->Close();
}

InferenceService::InferenceService(ModelService& models, Metrics& metrics,
                                   const ServerConfig& config, ServiceOptions options)
    : models_(models),
      metrics_(metrics),
      config_(config),
      options_(std::move(options)),
      runner_(models, metrics, config) {}

std::optional<grpc::Status> InferenceService::Refusal(const grpc::CallbackServerContext& context,
                                                      Access access) const {
  const std::optional<std::string>& token =
      access == Access::kRepository ? options_.management_token : options_.inference_token;
  if (access == Access::kRepository) {
    if (!options_.repository) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "the server has no model repository (models.repository)");
    }
    if (options_.screen_repository_caller) {
      const std::optional<std::pair<std::string, uint16_t>> peer = TcpPeer(context.peer());
      std::optional<std::string> refused =
          peer ? options_.screen_repository_caller(peer->first, peer->second)
               : std::optional<std::string>("cannot tell where the call comes from (peer '" +
                                            context.peer() + "')");
      if (refused) {
        return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                            "repository call refused: " + *refused);
      }
    }
    // The management API's rule: without its token, only callers on this machine.
    if (!token && !LoopbackPeer(context.peer())) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "repository calls from other machines need the management token "
                          "(management.token_file or management.token_env), sent as "
                          "'authorization: Bearer <token>' metadata");
    }
  }
  if (!token) return std::nullopt;
  const auto& metadata = context.client_metadata();
  auto found = metadata.find("authorization");
  std::optional<std::string_view> authorization;
  if (found != metadata.end()) {
    authorization = std::string_view(found->second.data(), found->second.size());
  }
  switch (CheckBearer(authorization, *token)) {
    case TokenCheck::kValid:
      return std::nullopt;
    case TokenCheck::kMissing:
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "authentication required: send 'authorization: Bearer <token>' metadata");
    case TokenCheck::kWrong:
      break;
  }
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "the bearer token is not valid");
}

Result<std::shared_ptr<const ServedModel>> InferenceService::Resolve(
    const std::string& name, const std::string& version) const {
  return runner_.Resolve(name, version, /*count_unknown=*/false);
}

template <typename Body>
grpc::ServerUnaryReactor* InferenceService::AnswerNow(grpc::CallbackServerContext* context,
                                                      const char* method, Access access,
                                                      Body&& body) {
  auto* call = new UnaryCall(*this, method);
  if (std::optional<grpc::Status> refused = Refusal(*context, access)) {
    call->Answer(*refused);
  } else {
    call->Answer(body());
  }
  return call;
}

grpc::ServerUnaryReactor* InferenceService::ServerLive(grpc::CallbackServerContext* context,
                                                       const inference::ServerLiveRequest*,
                                                       inference::ServerLiveResponse* response) {
  return AnswerNow(context, "ServerLive", Access::kInference, [&] {
    response->set_live(true);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* InferenceService::ServerReady(grpc::CallbackServerContext* context,
                                                        const inference::ServerReadyRequest*,
                                                        inference::ServerReadyResponse* response) {
  return AnswerNow(context, "ServerReady", Access::kInference, [&] {
    response->set_ready(options_.ready());
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* InferenceService::ModelReady(grpc::CallbackServerContext* context,
                                                       const inference::ModelReadyRequest* request,
                                                       inference::ModelReadyResponse* response) {
  return AnswerNow(context, "ModelReady", Access::kInference, [&] {
    Result<std::shared_ptr<const ServedModel>> model = Resolve(request->name(), request->version());
    // Not loaded is an answer here, as Triton gives it: ready=false. A malformed version is
    // the caller's error.
    if (!model.ok() && model.status().code() != StatusCode::kNotFound) {
      return ToGrpc(model.status());
    }
    response->set_ready(model.ok() && models_.Availability((*model)->key).ok());
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* InferenceService::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  return AnswerNow(context, "ServerMetadata", Access::kInference, [&] {
    response->set_name("orochi");
    response->set_version(OROCHI_SERVER_VERSION);
    for (const char* extension : {"classification", "statistics", "model_configuration",
                                  "model_repository", "system_shared_memory", "logging", "trace"}) {
      response->add_extensions(extension);
    }
    if (engine::DeviceCount(engine::DeviceType::kCuda) > 0) {
      response->add_extensions("cuda_shared_memory");
    }
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  return AnswerNow(context, "ModelMetadata", Access::kInference, [&] {
    Result<std::shared_ptr<const ServedModel>> model = Resolve(request->name(), request->version());
    if (!model.ok()) return ToGrpc(model.status());
    const Manifest& manifest = (*model)->manifest();
    response->set_name((*model)->name);
    for (int64_t version : models_.Versions((*model)->name)) {
      response->add_versions(std::to_string(version));
    }
    response->set_platform("orochi_python");
    WriteTensorsMetadata(manifest, manifest.inputs, response->mutable_inputs());
    WriteTensorsMetadata(manifest, manifest.outputs, response->mutable_outputs());
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* InferenceService::ModelConfig(
    grpc::CallbackServerContext* context, const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  return AnswerNow(context, "ModelConfig", Access::kInference, [&] {
    Result<std::shared_ptr<const ServedModel>> model = Resolve(request->name(), request->version());
    if (!model.ok()) return ToGrpc(model.status());
    const ServedModel& served = **model;
    const Manifest& manifest = served.manifest();
    inference::ModelConfig* config = response->mutable_config();
    config->set_name(served.name);
    config->set_platform("orochi_python");
    config->set_backend("orochi");
    config->mutable_version_policy()->mutable_latest()->set_num_versions(1);
    config->set_max_batch_size(static_cast<int32_t>(manifest.max_batch_size));
    for (const TensorSpec& spec : manifest.inputs) {
      auto* input = config->add_input();
      input->set_name(spec.name);
      input->set_data_type(ConfigType(spec.datatype));
      for (int64_t size : spec.shape) input->add_dims(size);
    }
    for (const TensorSpec& spec : manifest.outputs) {
      auto* output = config->add_output();
      output->set_name(spec.name);
      output->set_data_type(ConfigType(spec.datatype));
      for (int64_t size : spec.shape) output->add_dims(size);
    }
    auto* group = config->add_instance_group();
    group->set_name(served.name);
    group->set_kind(inference::ModelInstanceGroup::KIND_CPU);
    group->set_count(static_cast<int32_t>(served.replicas->slots().size()));
    if (manifest.max_batch_size > 0) {
      auto* batching = config->mutable_dynamic_batching();
      for (int64_t size : served.batching.preferred_batch_sizes) {
        batching->add_preferred_batch_size(static_cast<int32_t>(size));
      }
      batching->set_max_queue_delay_microseconds(
          static_cast<uint64_t>(served.batching.max_queue_delay.count()));
    }
    // The manifest's parameters, each as its JSON text (Triton's parameters are strings).
    const nlohmann::json parameters = nlohmann::json::parse(manifest.parameters_json);
    for (const auto& [name, value] : parameters.items()) {
      (*config->mutable_parameters())[name].set_string_value(
          value.is_string() ? value.get<std::string>() : value.dump());
    }
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* InferenceService::ModelStatistics(
    grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  return AnswerNow(context, "ModelStatistics", Access::kInference, [&] {
    if (request->name().empty()) {
      if (!request->version().empty()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a version needs a model name");
      }
      for (const auto& model : models_.List()) WriteStatistics(*model, response->add_model_stats());
      return grpc::Status::OK;
    }
    Result<std::shared_ptr<const ServedModel>> model = Resolve(request->name(), request->version());
    if (!model.ok()) return ToGrpc(model.status());
    WriteStatistics(**model, response->add_model_stats());
    return grpc::Status::OK;
  });
}

void InferenceService::Infer(const ModelInferRequest& message,
                             std::optional<Clock::time_point> transport_deadline,
                             std::function<bool()> client_gone,
                             std::function<void(InferOutcome)> done,
                             const OpenStream& open_stream) {
  const Clock::time_point received = Clock::now();
  auto fail = [&](const grpc::Status& status) { done(InferOutcome{status, nullptr, nullptr, {}}); };
  if (std::string unknown = UnknownFieldPath(message); !unknown.empty()) {
    fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      "the request sets field " + unknown +
                          ", which this server's ModelInferRequest does not have"));
    return;
  }
  Result<std::shared_ptr<const ServedModel>> resolved =
      runner_.Resolve(message.model_name(), message.model_version(), /*count_unknown=*/true);
  if (!resolved.ok()) {
    fail(ToGrpc(resolved.status()));
    return;
  }
  std::shared_ptr<const ServedModel> model = *resolved;
  if (std::optional<kserve::InferenceRunner::Refusal> refused =
          runner_.Admit(*model, message.ByteSizeLong(), received)) {
    fail(ToGrpc(refused->status));
    return;
  }
  Result<kserve::InferRequest> parsed = ReadInferRequest(model->manifest(), message);
  if (!parsed.ok()) {
    runner_.Refused(*model, kserve::ParseFailureReason(parsed.status().code()), received);
    fail(ToGrpc(parsed.status()));
    return;
  }
  auto request_read = std::make_shared<kserve::InferRequest>(std::move(parsed).value());
  if (std::optional<kserve::InferenceRunner::Refusal> refused = runner_.AdmitSharedMemoryInputs(
          *model, *request_read, message.ByteSizeLong(),
          static_cast<uint64_t>(config_.grpc.max_message_bytes), received)) {
    fail(ToGrpc(refused->status));
    return;
  }
  // Inputs in shared memory are read now, outputs' regions checked; the request keeps the
  // regions mapped until it is answered.
  if (Status shared =
          ResolveSharedMemory(model->manifest(), *options_.shared_memory, request_read.get());
      !shared.ok()) {
    runner_.Refused(*model, kserve::ParseFailureReason(shared.code()), received);
    fail(ToGrpc(shared));
    return;
  }
  kserve::InferenceCall call;
  call.model = model;
  call.version_named = !message.model_version().empty();
  call.request = std::move(request_read);
  if (!call.request->shared_memory_outputs.empty()) {
    call.complete = [request = call.request](const ServedModel& answered_by, const auto& outputs) {
      return kserve::WriteSharedMemoryOutputs(answered_by.manifest(), *request, outputs);
    };
  }
  call.received = received;
  call.transport_deadline = transport_deadline;
  call.client_gone = std::move(client_gone);
  std::shared_ptr<const kserve::InferRequest> request = call.request;
  if (model->manifest().streaming && open_stream) call.stream = open_stream(model, request);
  const bool streamed = call.stream != nullptr;
  runner_.Run(std::move(call), [request, streamed,
                                done = std::move(done)](Result<kserve::InferenceResult> result) {
    if (!result.ok()) {
      done(InferOutcome{ToGrpc(result.status()), nullptr, request, {}, streamed, result.status()});
      return;
    }
    done(InferOutcome{grpc::Status::OK, result->model, request, std::move(result->outputs),
                      streamed});
  });
}

void InferenceService::WriteOutcome(const InferOutcome& outcome,
                                    inference::ModelInferResponse* response) {
  const ServedModel& model = *outcome.model;
  WriteInferResponse(model.manifest(), *outcome.request, outcome.outputs, model.package->labels(),
                     response);
}

grpc::ServerUnaryReactor* InferenceService::ModelInfer(grpc::CallbackServerContext* context,
                                                       const ModelInferRequest* request,
                                                       inference::ModelInferResponse* response) {
  auto* call = new UnaryCall(*this, "ModelInfer");
  if (std::optional<grpc::Status> refused = Refusal(*context, Access::kInference)) {
    call->Answer(*refused);
    return call;
  }
  Infer(*request, SteadyDeadline(context->deadline()), call->client_gone(),
        [call, response](const InferOutcome& outcome) {
          if (outcome.status.ok()) WriteOutcome(outcome, response);
          call->Answer(outcome.status);
        });
  return call;
}

grpc::ServerBidiReactor<ModelInferRequest, ModelStreamInferResponse>*
InferenceService::ModelStreamInfer(grpc::CallbackServerContext* context) {
  if (std::optional<grpc::Status> refused = Refusal(*context, Access::kInference)) {
    // Refused before anything is read: a reactor that only finishes.
    class Refused final
        : public grpc::ServerBidiReactor<ModelInferRequest, ModelStreamInferResponse> {
     public:
      Refused(InferenceService& service, const grpc::Status& status) : service_(service) {
        service_.in_flight().fetch_add(1);
        service_.metrics().GrpcRequest("ModelStreamInfer", GrpcCodeName(status.error_code()));
        Finish(status);
      }
      void OnDone() override {
        service_.in_flight().fetch_sub(1);
        delete this;
      }

     private:
      InferenceService& service_;
    };
    return new Refused(*this, *refused);
  }
  return new StreamCall(*this, context);
}

grpc::ServerUnaryReactor* InferenceService::RepositoryIndex(
    grpc::CallbackServerContext* context, const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  return AnswerNow(context, "RepositoryIndex", Access::kRepository, [&] {
    if (!request->repository_name().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "this server has one repository: leave repository_name empty");
    }
    Result<std::vector<ModelService::IndexEntry>> entries = models_.Index();
    if (!entries.ok()) return ToGrpc(entries.status());
    for (const ModelService::IndexEntry& entry : *entries) {
      if (request->ready() && entry.state != "READY") continue;
      auto* model = response->add_models();
      model->set_name(entry.name);
      model->set_version(std::to_string(entry.version));
      model->set_state(entry.state);
      model->set_reason(entry.reason);
    }
    return grpc::Status::OK;
  });
}

namespace {

// Load and unload read their parameters as HTTP's repository API reads its bodies
// (repository/load_request.h): the same config override applied, the same refusals.
template <typename Request>
Result<std::string> RepositoryRequestBody(const Request& request) {
  if (!request.repository_name().empty()) {
    return InvalidArgument("this server has one repository: leave repository_name empty");
  }
  nlohmann::json parameters = nlohmann::json::object();
  for (const auto& [name, value] : request.parameters()) {
    using Value = inference::ModelRepositoryParameter;
    switch (value.parameter_choice_case()) {
      case Value::kBoolParam:
        parameters[name] = value.bool_param();
        break;
      case Value::kInt64Param:
        parameters[name] = value.int64_param();
        break;
      case Value::kStringParam:
        parameters[name] = value.string_param();
        break;
      case Value::kBytesParam:
        parameters[name] = value.bytes_param();  // refused by name, as a `file:` or unknown one
        break;
      case Value::PARAMETER_CHOICE_NOT_SET:
        return InvalidArgument("parameter '" + name + "' has no value");
    }
  }
  if (parameters.empty()) return std::string();
  return nlohmann::json{{"parameters", parameters}}.dump(-1, ' ', false,
                                                         nlohmann::json::error_handler_t::replace);
}

}  // namespace

grpc::ServerUnaryReactor* InferenceService::RepositoryModelLoad(
    grpc::CallbackServerContext* context, const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  auto* call = new UnaryCall(*this, "RepositoryModelLoad");
  if (std::optional<grpc::Status> refused = Refusal(*context, Access::kRepository)) {
    call->Answer(*refused);
    return call;
  }
  Result<std::string> body = RepositoryRequestBody(*request);
  Result<LoadOverrides> overrides = body.ok()
                                        ? repository::ParseLoadRequest(*body, request->model_name())
                                        : Result<LoadOverrides>(body.status());
  if (!overrides.ok()) {
    call->Answer(ToGrpc(overrides.status()));
    return call;
  }
  options_.run_repository_operation(
      [this, call, name = request->model_name(), overrides = *std::move(overrides)] {
        Result<std::string> loaded = models_.LoadModel(name, overrides);
        call->Answer(loaded.ok() ? grpc::Status::OK : ToGrpc(loaded.status()));
      });
  return call;
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelUnload(
    grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  auto* call = new UnaryCall(*this, "RepositoryModelUnload");
  if (std::optional<grpc::Status> refused = Refusal(*context, Access::kRepository)) {
    call->Answer(*refused);
    return call;
  }
  Result<std::string> body = RepositoryRequestBody(*request);
  Status checked = body.ok() ? repository::CheckUnloadRequest(*body) : body.status();
  if (!checked.ok()) {
    call->Answer(ToGrpc(checked));
    return call;
  }
  options_.run_repository_operation([this, call, name = request->model_name()] {
    Result<std::string> unloaded = models_.UnloadModel(name);
    call->Answer(unloaded.ok() ? grpc::Status::OK : ToGrpc(unloaded.status()));
  });
  return call;
}

namespace {

// A shared-memory registration's answer. Disabled by the operator (kFailedPrecondition) is a
// call this server refuses, not a transient state.
grpc::Status RegistrationAnswer(const Status& registered) {
  if (registered.code() == StatusCode::kFailedPrecondition) {
    return {grpc::StatusCode::PERMISSION_DENIED, registered.message()};
  }
  return registered.ok() ? grpc::Status::OK : ToGrpc(registered);
}

}  // namespace

grpc::ServerUnaryReactor* InferenceService::SystemSharedMemoryStatus(
    grpc::CallbackServerContext* context, const inference::SystemSharedMemoryStatusRequest* request,
    inference::SystemSharedMemoryStatusResponse* response) {
  return AnswerNow(context, "SystemSharedMemoryStatus", Access::kInference, [&] {
    Result<std::vector<kserve::SharedMemoryRegionStatus>> regions =
        options_.shared_memory->Describe(
            request->name().empty() ? std::nullopt : std::optional<std::string>(request->name()),
            kserve::SharedMemoryKind::kSystem);
    if (!regions.ok()) return ToGrpc(regions.status());
    for (const kserve::SharedMemoryRegionStatus& region : *regions) {
      auto& written = (*response->mutable_regions())[region.name];
      written.set_name(region.name);
      written.set_key(region.key);
      written.set_offset(region.offset);
      written.set_byte_size(region.byte_size);
    }
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* InferenceService::SystemSharedMemoryRegister(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryRegisterRequest* request,
    inference::SystemSharedMemoryRegisterResponse*) {
  return AnswerNow(context, "SystemSharedMemoryRegister", Access::kInference, [&] {
    return RegistrationAnswer(options_.shared_memory->Register(
        request->name(), request->key(), request->offset(), request->byte_size()));
  });
}

grpc::ServerUnaryReactor* InferenceService::SystemSharedMemoryUnregister(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryUnregisterRequest* request,
    inference::SystemSharedMemoryUnregisterResponse*) {
  return AnswerNow(context, "SystemSharedMemoryUnregister", Access::kInference, [&] {
    if (request->name().empty()) {
      options_.shared_memory->UnregisterAll(kserve::SharedMemoryKind::kSystem);
    } else {
      options_.shared_memory->Unregister(request->name(), kserve::SharedMemoryKind::kSystem);
    }
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* InferenceService::CudaSharedMemoryStatus(
    grpc::CallbackServerContext* context, const inference::CudaSharedMemoryStatusRequest* request,
    inference::CudaSharedMemoryStatusResponse* response) {
  return AnswerNow(context, "CudaSharedMemoryStatus", Access::kInference, [&] {
    Result<std::vector<kserve::SharedMemoryRegionStatus>> regions =
        options_.shared_memory->Describe(
            request->name().empty() ? std::nullopt : std::optional<std::string>(request->name()),
            kserve::SharedMemoryKind::kCuda);
    if (!regions.ok()) return ToGrpc(regions.status());
    for (const kserve::SharedMemoryRegionStatus& region : *regions) {
      auto& written = (*response->mutable_regions())[region.name];
      written.set_name(region.name);
      written.set_device_id(static_cast<uint64_t>(region.device_id));
      written.set_byte_size(region.byte_size);
    }
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* InferenceService::CudaSharedMemoryRegister(
    grpc::CallbackServerContext* context, const inference::CudaSharedMemoryRegisterRequest* request,
    inference::CudaSharedMemoryRegisterResponse*) {
  return AnswerNow(context, "CudaSharedMemoryRegister", Access::kInference, [&] {
    return RegistrationAnswer(options_.shared_memory->RegisterCuda(
        request->name(), request->raw_handle(), request->device_id(), request->byte_size()));
  });
}

grpc::ServerUnaryReactor* InferenceService::CudaSharedMemoryUnregister(
    grpc::CallbackServerContext* context,
    const inference::CudaSharedMemoryUnregisterRequest* request,
    inference::CudaSharedMemoryUnregisterResponse*) {
  return AnswerNow(context, "CudaSharedMemoryUnregister", Access::kInference, [&] {
    if (request->name().empty()) {
      options_.shared_memory->UnregisterAll(kserve::SharedMemoryKind::kCuda);
    } else {
      options_.shared_memory->Unregister(request->name(), kserve::SharedMemoryKind::kCuda);
    }
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* InferenceService::LogSettings(
    grpc::CallbackServerContext* context, const inference::LogSettingsRequest* request,
    inference::LogSettingsResponse* response) {
  return AnswerNow(context, "LogSettings", Access::kInference, [&] {
    // Through HTTP's /v2/logging logic, so both protocols accept and refuse the same settings.
    nlohmann::json update = nlohmann::json::object();
    for (const auto& [name, value] : request->settings()) {
      using Value = inference::LogSettingsRequest::SettingValue;
      switch (value.parameter_choice_case()) {
        case Value::kBoolParam:
          update[name] = value.bool_param();
          break;
        case Value::kUint32Param:
          update[name] = value.uint32_param();
          break;
        case Value::kStringParam:
          update[name] = value.string_param();
          break;
        case Value::PARAMETER_CHOICE_NOT_SET:
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "log setting '" + name + "' has no value");
      }
    }
    Result<std::string> settings = request->settings().empty()
                                       ? Result<std::string>(kserve::LogSettingsJson())
                                       : kserve::UpdateLogSettings(update.dump());
    if (!settings.ok()) return ToGrpc(settings.status());
    // Named: a range over items() of a temporary would outlive the document.
    const nlohmann::json current = nlohmann::json::parse(*settings);
    for (const auto& [name, value] : current.items()) {
      auto& written = (*response->mutable_settings())[name];
      if (value.is_boolean()) {
        written.set_bool_param(value.get<bool>());
      } else if (value.is_number_unsigned()) {
        written.set_uint32_param(value.get<uint32_t>());
      } else {
        written.set_string_param(value.is_string() ? value.get<std::string>() : value.dump());
      }
    }
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* InferenceService::TraceSetting(
    grpc::CallbackServerContext* context, const inference::TraceSettingRequest* request,
    inference::TraceSettingResponse* response) {
  return AnswerNow(context, "TraceSetting", Access::kInference, [&] {
    if (!request->model_name().empty()) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "per-model trace settings are not supported: Orochi does not trace "
                          "requests");
    }
    // Through HTTP's /v2/trace/setting logic: trace_level is a list, the others one value.
    nlohmann::json update = nlohmann::json::object();
    for (const auto& [name, value] : request->settings()) {
      if (name == "trace_level") {
        update[name] = std::vector<std::string>(value.value().begin(), value.value().end());
      } else if (value.value_size() == 0) {
        update[name] = nullptr;  // Triton's way of clearing a setting
      } else if (value.value_size() == 1) {
        update[name] = value.value(0);
      } else {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "trace setting '" + name + "' takes one value");
      }
    }
    Result<std::string> settings = request->settings().empty()
                                       ? Result<std::string>(kserve::TraceSettingsJson())
                                       : kserve::UpdateTraceSettings(update.dump());
    if (!settings.ok()) return ToGrpc(settings.status());
    // Named: a range over items() of a temporary would outlive the document.
    const nlohmann::json current = nlohmann::json::parse(*settings);
    for (const auto& [name, value] : current.items()) {
      auto* values = (*response->mutable_settings())[name].mutable_value();
      if (value.is_array()) {
        for (const auto& item : value) {
          values->Add(item.is_string() ? item.get<std::string>() : item.dump());
        }
      } else {
        values->Add(value.is_string() ? value.get<std::string>() : value.dump());
      }
    }
    return grpc::Status::OK;
  });
}

}  // namespace orochi::server::grpc_api
