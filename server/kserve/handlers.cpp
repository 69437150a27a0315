#include "handlers.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "orochi/server/kserve_codec.h"

namespace orochi::server::kserve {
namespace {

namespace bhttp = boost::beast::http;
using Json = nlohmann::json;
using packaging::DataType;
using packaging::Manifest;
using packaging::TensorSpec;

http::Response Ok(const Json& body) { return http::JsonResponse(200, body.dump()); }

const char* TritonType(DataType datatype) {
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

// Shapes as clients see them: with the batch dim (-1) first for models that batch.
Json TensorsMetadata(const Manifest& manifest, const std::vector<TensorSpec>& specs) {
  Json list = Json::array();
  for (const TensorSpec& spec : specs) {
    std::vector<int64_t> shape = spec.shape;
    if (manifest.max_batch_size > 0) shape.insert(shape.begin(), -1);
    list.push_back({{"name", spec.name},
                    {"datatype", std::string(packaging::DataTypeName(spec.datatype))},
                    {"shape", shape}});
  }
  return list;
}

Json StatJson(const DurationStat& stat) { return {{"count", stat.count}, {"ns", stat.ns}}; }

Json ModelStatsJson(const ServedModel& model) {
  std::lock_guard lock(model.stats_mutex);
  const ModelStats& stats = model.stats;
  Json batches = Json::array();
  for (const auto& [size, stat] : stats.batches) {
    batches.push_back({{"batch_size", size},
                       {"compute_input", StatJson({})},
                       {"compute_infer", StatJson(stat)},
                       {"compute_output", StatJson({})}});
  }
  return {{"name", model.name},
          {"version", std::to_string(model.version)},
          {"last_inference", stats.last_inference_ms},
          {"inference_count", stats.inference_count},
          {"execution_count", stats.execution_count},
          {"inference_stats",
           {{"success", StatJson(stats.success)},
            {"fail", StatJson(stats.fail)},
            {"queue", StatJson(stats.queue)},
            {"compute_input", StatJson({})},
            {"compute_infer", StatJson(stats.compute_infer)},
            {"compute_output", StatJson({})},
            {"cache_hit", StatJson({})},
            {"cache_miss", StatJson({})}}},
          {"batch_stats", batches}};
}

std::optional<size_t> HeaderLength(const http::Request& request, bool* malformed) {
  auto found = request.find("Inference-Header-Content-Length");
  *malformed = false;
  if (found == request.end()) return std::nullopt;
  std::string text(found->value());
  if (text.empty() || text.size() > 18 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    *malformed = true;
    return std::nullopt;
  }
  return static_cast<size_t>(std::stoull(text));
}

}  // namespace

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

KServeApi::KServeApi(ModelService& models, Metrics& metrics, const ServerConfig& config,
                     std::function<bool()> ready)
    : models_(models),
      metrics_(metrics),
      config_(config),
      ready_(std::move(ready)),
      memory_(config.models.max_memory_bytes) {}

std::string KServeApi::UnknownModelMessage(const std::string& name,
                                           std::optional<int64_t> version) const {
  // Triton's wording first (its clients and scripts match on it), then Orochi's detail.
  std::string message = "Request for unknown model: '" + name + "'";
  if (version) message += " version " + std::to_string(*version);
  message += " is not found";
  const std::vector<int64_t> loaded = models_.Versions(name);
  // Without a version, a model loaded since Find looked is still one that was not served.
  if (loaded.empty() || !version) return message + " (model '" + name + "' is not loaded)";
  std::string versions;
  for (int64_t each : loaded) versions += (versions.empty() ? "" : ", ") + std::to_string(each);
  return message + " (version " + std::to_string(*version) + " is not loaded; loaded: " + versions +
         ")";
}

std::shared_ptr<const ServedModel> KServeApi::Resolve(const http::PathParams& params,
                                                      const http::Responder& respond) const {
  const std::string& name = params.at("model");
  std::optional<int64_t> version;
  if (auto found = params.find("version"); found != params.end()) {
    const std::string& text = found->second;
    if (text.empty() || text.size() > 18 ||
        text.find_first_not_of("0123456789") != std::string::npos) {
      respond(
          http::ErrorResponse(400, "model version must be a positive integer, got '" + text + "'"));
      return nullptr;
    }
    version = std::stoll(text);
  }
  std::shared_ptr<const ServedModel> model = models_.Find(name, version);
  if (model == nullptr) respond(http::ErrorResponse(404, UnknownModelMessage(name, version)));
  return model;
}

void KServeApi::Register(http::Router& router) {
  router.Add(bhttp::verb::get, "/v2/health/live",
             [](http::Request&&, const http::PathParams&, const http::Responder& respond) {
               respond(Ok({{"live", true}}));
             });
  router.Add(bhttp::verb::get, "/v2/health/ready",
             [this](http::Request&&, const http::PathParams&, const http::Responder& respond) {
               bool ready = ready_();
               respond(ready ? Ok({{"ready", true}})
                             : http::ErrorResponse(503, "the server is not ready"));
             });
  // Triton's names for the extensions this port serves (logging and trace: settings.h).
  Json extensions = {"binary_tensor_data",  "classification", "statistics",
                     "model_configuration", "logging",        "trace"};
  if (config_.http.repository_on_inference_port) extensions.push_back("model_repository");
  router.Add(
      bhttp::verb::get, "/v2",
      [extensions](http::Request&&, const http::PathParams&, const http::Responder& respond) {
        respond(Ok(
            {{"name", "orochi"}, {"version", OROCHI_SERVER_VERSION}, {"extensions", extensions}}));
      });

  auto metadata = [this](http::Request&&, const http::PathParams& params,
                         const http::Responder& respond) {
    std::shared_ptr<const ServedModel> model = Resolve(params, respond);
    if (model == nullptr) return;
    const Manifest& manifest = model->manifest();
    Json versions = Json::array();
    for (int64_t version : models_.Versions(model->name)) {
      versions.push_back(std::to_string(version));
    }
    respond(Ok({{"name", model->name},
                {"versions", versions},
                {"platform", "orochi_python"},
                {"inputs", TensorsMetadata(manifest, manifest.inputs)},
                {"outputs", TensorsMetadata(manifest, manifest.outputs)}}));
  };
  router.Add(bhttp::verb::get, "/v2/models/{model}", metadata);
  router.Add(bhttp::verb::get, "/v2/models/{model}/versions/{version}", metadata);

  auto ready = [this](http::Request&&, const http::PathParams& params,
                      const http::Responder& respond) {
    std::shared_ptr<const ServedModel> model = Resolve(params, respond);
    if (model == nullptr) return;
    if (std::string reason = models_.UnavailableReason(model->key); !reason.empty()) {
      respond(http::ErrorResponse(503, reason));
      return;
    }
    respond(
        Ok({{"name", model->name}, {"version", std::to_string(model->version)}, {"ready", true}}));
  };
  router.Add(bhttp::verb::get, "/v2/models/{model}/ready", ready);
  router.Add(bhttp::verb::get, "/v2/models/{model}/versions/{version}/ready", ready);

  auto configuration = [this](http::Request&&, const http::PathParams& params,
                              const http::Responder& respond) {
    std::shared_ptr<const ServedModel> model = Resolve(params, respond);
    if (model == nullptr) return;
    const Manifest& manifest = model->manifest();
    auto tensors = [](const std::vector<TensorSpec>& specs) {
      Json list = Json::array();
      for (const TensorSpec& spec : specs) {
        list.push_back(
            {{"name", spec.name}, {"data_type", TritonType(spec.datatype)}, {"dims", spec.shape}});
      }
      return list;
    };
    Json config{{"name", model->name},
                {"platform", "orochi_python"},
                {"backend", "orochi"},
                {"version_policy", {{"latest", {{"num_versions", 1}}}}},
                {"max_batch_size", manifest.max_batch_size},
                {"input", tensors(manifest.inputs)},
                {"output", tensors(manifest.outputs)},
                {"instance_group",
                 {{{"name", model->name},
                   {"kind", "KIND_CPU"},
                   {"count", model->replicas->slots().size()}}}},
                {"parameters", Json::parse(manifest.parameters_json)}};
    if (manifest.max_batch_size > 0) {
      config["dynamic_batching"] = {
          {"preferred_batch_size", model->batching.preferred_batch_sizes},
          {"max_queue_delay_microseconds", model->batching.max_queue_delay.count()}};
    }
    respond(Ok(config));
  };
  router.Add(bhttp::verb::get, "/v2/models/{model}/config", configuration);
  router.Add(bhttp::verb::get, "/v2/models/{model}/versions/{version}/config", configuration);

  router.Add(bhttp::verb::get, "/v2/models/stats",
             [this](http::Request&&, const http::PathParams&, const http::Responder& respond) {
               Json stats = Json::array();
               for (const auto& model : models_.List()) stats.push_back(ModelStatsJson(*model));
               respond(Ok({{"model_stats", stats}}));
             });
  auto model_stats = [this](http::Request&&, const http::PathParams& params,
                            const http::Responder& respond) {
    std::shared_ptr<const ServedModel> model = Resolve(params, respond);
    if (model == nullptr) return;
    respond(Ok({{"model_stats", Json::array({ModelStatsJson(*model)})}}));
  };
  router.Add(bhttp::verb::get, "/v2/models/{model}/stats", model_stats);
  router.Add(bhttp::verb::get, "/v2/models/{model}/versions/{version}/stats", model_stats);

  auto infer = [this](http::Request&& request, const http::PathParams& params,
                      http::Responder respond) {
    Infer(std::move(request), params, std::move(respond));
  };
  router.Add(bhttp::verb::post, "/v2/models/{model}/infer", infer);
  router.Add(bhttp::verb::post, "/v2/models/{model}/versions/{version}/infer", infer);
}

void KServeApi::Infer(http::Request&& request, const http::PathParams& params,
                      http::Responder respond) {
  const Clock::time_point received = Clock::now();
  std::shared_ptr<const ServedModel> model = Resolve(params, respond);
  if (model == nullptr) {
    metrics_.UnknownModel();
    return;
  }
  const std::string version = std::to_string(model->version);
  auto fail = [&](const Status& status, const std::string& reason) {
    metrics_.RequestDone(model->name, version, reason, Clock::now() - received, {}, {});
    respond(http::ErrorResponse(HttpStatusOf(status.code()), status.message()));
  };
  if (const std::optional<int64_t>& limit = model->manifest().max_request_bytes;
      limit && request.body().size() > static_cast<uint64_t>(*limit)) {
    metrics_.RequestDone(model->name, version, "too_large", Clock::now() - received, {}, {});
    respond(http::ErrorResponse(413, "the request body has " +
                                         std::to_string(request.body().size()) + " bytes; model " +
                                         model->name + " takes at most " + std::to_string(*limit) +
                                         " (max_request_bytes in its manifest)"));
    return;
  }
  if (Status memory = memory_.Admit(); !memory.ok()) {
    fail(memory, "out_of_memory");
    return;
  }
  bool malformed = false;
  std::optional<size_t> json_length = HeaderLength(request, &malformed);
  if (malformed) {
    fail(InvalidArgument("Inference-Header-Content-Length must be a byte count"),
         FailureReason(StatusCode::kInvalidArgument));
    return;
  }
  ParseLimits limits{config_.http.max_json_depth};
  Result<InferRequest> parsed =
      ParseInferRequest(model->manifest(), request.body(), json_length, limits);
  if (!parsed.ok()) {
    fail(parsed.status(), ParseFailureReason(parsed.status().code()));
    return;
  }
  auto infer = std::make_shared<InferRequest>(std::move(parsed).value());
  std::optional<Clock::time_point> deadline;
  // Longer than this is no deadline at all: INT64_MAX microseconds would overflow the
  // nanosecond clock (and the watchdog adds its grace on top), wrapping into a deadline that
  // has already passed.
  constexpr std::chrono::microseconds kNoDeadlineFrom = std::chrono::hours(24 * 365 * 100);
  if (infer->timeout) {
    if (*infer->timeout < kNoDeadlineFrom) deadline = received + *infer->timeout;
  } else if (config_.models.default_timeout_ms > 0) {
    deadline = received + std::chrono::milliseconds(config_.models.default_timeout_ms);
  }
  std::vector<interpreters::NamedTensor> inputs = std::move(infer->inputs);
  auto answer = [this, infer, received, respond](std::shared_ptr<const ServedModel> model) {
    return [this, model = std::move(model), infer, received, respond](
               Result<std::vector<interpreters::NamedTensor>> outputs,
               const InferTimings& timings) {
      const std::string version = std::to_string(model->version);
      const std::chrono::nanoseconds total = Clock::now() - received;
      if (!outputs.ok()) {
        const Status& error = outputs.status();
        metrics_.RequestDone(model->name, version, FailureReason(error.code()), total,
                             timings.queue, timings.compute);
        std::string message = error.message();
        if (error.code() == StatusCode::kPythonError && !error.detail().empty()) {
          message += "\n" + error.detail();
        }
        if (FailureReason(error.code()) == "client_gone") {
          // Not a client error: nginx's 499, so that a vanished client is not counted as a
          // 400 (the answer itself reaches no one).
          http::Response response = http::ErrorResponse(499, message);
          response.reason("Client Closed Request");
          respond(std::move(response));
          return;
        }
        respond(http::ErrorResponse(HttpStatusOf(error.code()), message));
        return;
      }
      EncodedResponse encoded =
          EncodeInferResponse(model->manifest(), *infer, *outputs, model->package->labels());
      http::Response response = http::JsonResponse(200, std::move(encoded.body));
      if (encoded.json_length) {
        response.set(bhttp::field::content_type, "application/octet-stream");
        response.set("Inference-Header-Content-Length", std::to_string(*encoded.json_length));
      }
      metrics_.RequestDone(model->name, version, "success", total, timings.queue, timings.compute);
      respond(std::move(response));
    };
  };
  auto client_gone = [respond] { return respond.client_gone(); };
  Status submitted = models_.Submit(model, inputs, infer->parameters, infer->rows, deadline,
                                    client_gone, answer(model));
  // The version resolved above may have been replaced meanwhile (a deploy, a delete of the
  // served version): it is unloading, or gone. A request that named no version is for
  // whichever version serves now, as the version switch promises: it goes there, if that
  // version takes the same inputs (they were read against the old one's manifest).
  if (!submitted.ok() && params.count("version") == 0 &&
      (submitted.code() == StatusCode::kNotFound || submitted.code() == StatusCode::kUnavailable)) {
    std::shared_ptr<const ServedModel> serving = models_.Find(model->name, std::nullopt);
    if (serving != nullptr && serving != model &&
        SameInterface(serving->manifest(), model->manifest())) {
      Status resubmitted = models_.Submit(serving, inputs, infer->parameters, infer->rows, deadline,
                                          client_gone, answer(serving));
      if (resubmitted.ok()) return;
    }
  }
  if (!submitted.ok()) fail(submitted, FailureReason(submitted.code()));
}

}  // namespace orochi::server::kserve
