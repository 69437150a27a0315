#include "handlers.h"

#include <algorithm>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <utility>

#include "orochi/engine/device.h"
#include "orochi/server/kserve_codec.h"

namespace orochi::server::kserve {
namespace {

namespace bhttp = boost::beast::http;
using Json = nlohmann::json;
using packaging::Manifest;
using packaging::TensorSpec;

http::Response Ok(const Json& body) { return http::JsonResponse(200, body.dump()); }

// Shapes as clients see them: with the batch dim (-1) first for models that batch.
Json TensorsMetadata(const Manifest& manifest, const std::vector<TensorSpec>& specs) {
  Json list = Json::array();
  for (const TensorSpec& spec : specs) {
    list.push_back({{"name", spec.name},
                    {"datatype", std::string(packaging::DataTypeName(spec.datatype))},
                    {"shape", ClientShape(manifest, spec)}});
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
                       {"compute_input", StatJson(stat.compute_input)},
                       {"compute_infer", StatJson(stat.compute_infer)},
                       {"compute_output", StatJson(stat.compute_output)}});
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
            {"compute_input", StatJson(stats.compute.compute_input)},
            {"compute_infer", StatJson(stats.compute.compute_infer)},
            {"compute_output", StatJson(stats.compute.compute_output)},
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

KServeApi::KServeApi(ModelService& models, Metrics& metrics, const ServerConfig& config,
                     SharedMemoryRegistry& shared_memory, std::function<bool()> ready)
    : models_(models),
      config_(config),
      shared_memory_(shared_memory),
      ready_(std::move(ready)),
      runner_(models, metrics, config) {}

std::shared_ptr<const ServedModel> KServeApi::Resolve(const http::PathParams& params,
                                                      const http::Responder& respond,
                                                      bool count_unknown) const {
  auto version = params.find("version");
  Result<std::shared_ptr<const ServedModel>> model = runner_.Resolve(
      params.at("model"), version == params.end() ? "" : version->second, count_unknown);
  if (!model.ok()) {
    respond(http::ErrorResponse(HttpStatusOf(model.status().code()), model.status().message()));
    return nullptr;
  }
  return *model;
}

std::shared_ptr<const ServedModel> KServeApi::ResolveAndAdmit(const http::PathParams& params,
                                                              const http::Responder& respond,
                                                              size_t bytes,
                                                              Clock::time_point received) {
  std::shared_ptr<const ServedModel> model = Resolve(params, respond, /*count_unknown=*/true);
  if (model == nullptr) return nullptr;
  if (std::optional<InferenceRunner::Refusal> refused = runner_.Admit(*model, bytes, received)) {
    const Status& status = refused->status;
    respond(http::ErrorResponse(refused->too_large ? 413 : HttpStatusOf(status.code()),
                                status.message()));
    return nullptr;
  }
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
  Json extensions = {"binary_tensor_data",   "classification", "statistics", "model_configuration",
                     "system_shared_memory", "logging",        "trace"};
  if (config_.http.repository_on_inference_port) extensions.push_back("model_repository");
  // CUDA shared memory needs a device to open the clients' handles on.
  if (engine::DeviceCount(engine::DeviceType::kCuda) > 0) {
    extensions.push_back("cuda_shared_memory");
  }
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
    if (Status available = models_.Availability(model->key); !available.ok()) {
      respond(http::ErrorResponse(503, available.message()));
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
        list.push_back({{"name", spec.name},
                        {"data_type", TritonTypeName(spec.datatype)},
                        {"dims", spec.shape}});
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
  for (const bool stream : {false, true}) {
    auto generate = [this, stream](http::Request&& request, const http::PathParams& params,
                                   const http::Responder& respond) {
      Generate(std::move(request), params, respond, stream);
    };
    const std::string path = stream ? "/generate_stream" : "/generate";
    router.Add(bhttp::verb::post, "/v2/models/{model}" + path, generate);
    router.Add(bhttp::verb::post, "/v2/models/{model}/versions/{version}" + path, generate);
  }
  RegisterSharedMemory(router);
}

namespace {

// Standard base64 (RFC 4648, padding optional), as Triton's clients send a CUDA IPC handle;
// nullopt for anything else.
std::optional<std::string> DecodeBase64(std::string_view text) {
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  std::string decoded;
  uint32_t bits = 0;
  int pending = 0;
  for (const char c : text) {
    int value = -1;
    if (c >= 'A' && c <= 'Z') value = c - 'A';
    if (c >= 'a' && c <= 'z') value = c - 'a' + 26;
    if (c >= '0' && c <= '9') value = c - '0' + 52;
    if (c == '+') value = 62;
    if (c == '/') value = 63;
    if (value < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(value);
    pending += 6;
    if (pending >= 8) {
      pending -= 8;
      decoded.push_back(static_cast<char>((bits >> pending) & 0xff));
    }
  }
  if (pending >= 6) return std::nullopt;  // one character left over: no whole byte
  return decoded;
}

// A registration's body: a JSON object with no field but `fields` (an unknown one is refused,
// not ignored); InvalidArgument saying what is wrong otherwise.
Result<Json> ReadRegistrationBody(std::string_view text,
                                  std::initializer_list<std::string_view> fields) {
  Json body = Json::parse(text, nullptr, false);
  if (body.is_discarded() || !body.is_object()) {
    return InvalidArgument("the body is not a JSON object");
  }
  for (const auto& [field, unused] : body.items()) {
    if (std::find(fields.begin(), fields.end(), field) == fields.end()) {
      return InvalidArgument("unexpected field '" + field + "'");
    }
  }
  return body;
}

}  // namespace

void KServeApi::RegisterSharedMemory(http::Router& router) {
  for (const SharedMemoryKind kind : {SharedMemoryKind::kSystem, SharedMemoryKind::kCuda}) {
    const std::string prefix =
        kind == SharedMemoryKind::kSystem ? "/v2/systemsharedmemory" : "/v2/cudasharedmemory";
    auto status = [this, kind](http::Request&&, const http::PathParams& params,
                               const http::Responder& respond) {
      std::optional<std::string> name;
      if (auto found = params.find("name"); found != params.end()) name = found->second;
      Result<std::vector<SharedMemoryRegionStatus>> regions = shared_memory_.Describe(name, kind);
      if (!regions.ok()) {
        respond(
            http::ErrorResponse(HttpStatusOf(regions.status().code()), regions.status().message()));
        return;
      }
      Json list = Json::array();
      for (const SharedMemoryRegionStatus& region : *regions) {
        if (kind == SharedMemoryKind::kSystem) {
          list.push_back({{"name", region.name},
                          {"key", region.key},
                          {"offset", region.offset},
                          {"byte_size", region.byte_size}});
        } else {
          list.push_back({{"name", region.name},
                          {"device_id", region.device_id},
                          {"byte_size", region.byte_size}});
        }
      }
      respond(Ok(list));
    };
    router.Add(bhttp::verb::get, prefix + "/status", status);
    router.Add(bhttp::verb::get, prefix + "/region/{name}/status", status);

    auto unregister = [this, kind](http::Request&& request, const http::PathParams& params,
                                   const http::Responder& respond) {
      // Triton's protocol has no body here; one that says something would be silently unread.
      const Json body = Json::parse(request.body(), nullptr, false);
      const bool empty = request.body().find_first_not_of(" \t\r\n") == std::string::npos ||
                         (body.is_object() && body.empty());
      if (!empty) {
        respond(http::ErrorResponse(400,
                                    "an unregister request has no body (the region is named "
                                    "in the path, or all are unregistered)"));
        return;
      }
      if (auto found = params.find("name"); found != params.end()) {
        shared_memory_.Unregister(found->second, kind);
      } else {
        shared_memory_.UnregisterAll(kind);
      }
      respond(Ok(Json::object()));
    };
    router.Add(bhttp::verb::post, prefix + "/unregister", unregister);
    router.Add(bhttp::verb::post, prefix + "/region/{name}/unregister", unregister);
  }

  router.Add(
      bhttp::verb::post, "/v2/systemsharedmemory/region/{name}/register",
      [this](http::Request&& request, const http::PathParams& params,
             const http::Responder& respond) {
        const std::string& name = params.at("name");
        auto refuse = [&](const std::string& why) {
          respond(http::ErrorResponse(
              400, "cannot register shared memory region '" + name + "': " + why +
                       " (the body is {\"key\": string, \"offset\": integer, "
                       "\"byte_size\": integer})"));
        };
        Result<Json> read = ReadRegistrationBody(request.body(), {"key", "offset", "byte_size"});
        if (!read.ok()) {
          refuse(read.status().message());
          return;
        }
        const Json& body = *read;
        auto key = body.find("key");
        auto offset = body.find("offset");
        auto byte_size = body.find("byte_size");
        if (key == body.end() || !key->is_string()) {
          refuse("'key' must be a string (the shared memory object's name, as for shm_open)");
          return;
        }
        // Optional, as shared_memory_offset is in an inference request.
        if (offset != body.end() && !offset->is_number_unsigned()) {
          refuse("'offset' must be a non-negative integer");
          return;
        }
        if (byte_size == body.end() || !byte_size->is_number_unsigned()) {
          refuse("'byte_size' must be a non-negative integer");
          return;
        }
        Status registered = shared_memory_.Register(
            name, key->get<std::string>(), offset == body.end() ? 0 : offset->get<uint64_t>(),
            byte_size->get<uint64_t>());
        respond(registered.ok()
                    ? Ok(Json::object())
                    : http::ErrorResponse(HttpStatusOf(registered.code()), registered.message()));
      });

  router.Add(bhttp::verb::post, "/v2/cudasharedmemory/region/{name}/register",
             [this](http::Request&& request, const http::PathParams& params,
                    const http::Responder& respond) {
               const std::string& name = params.at("name");
               auto refuse = [&](const std::string& why) {
                 respond(http::ErrorResponse(
                     400, "cannot register CUDA shared memory region '" + name + "': " + why +
                              " (the body is {\"raw_handle\": {\"b64\": string}, \"device_id\": "
                              "integer, \"byte_size\": integer})"));
               };
               Result<Json> read =
                   ReadRegistrationBody(request.body(), {"raw_handle", "device_id", "byte_size"});
               if (!read.ok()) {
                 refuse(read.status().message());
                 return;
               }
               const Json& body = *read;
               auto raw_handle = body.find("raw_handle");
               auto device_id = body.find("device_id");
               auto byte_size = body.find("byte_size");
               std::optional<std::string> handle;
               if (raw_handle != body.end() && raw_handle->is_object() && raw_handle->size() == 1 &&
                   raw_handle->contains("b64") && (*raw_handle)["b64"].is_string()) {
                 handle = DecodeBase64((*raw_handle)["b64"].get<std::string>());
               }
               if (!handle) {
                 refuse("'raw_handle' must be {\"b64\": the CUDA IPC handle's bytes in base64}");
                 return;
               }
               if (device_id == body.end() || !device_id->is_number_integer()) {
                 refuse("'device_id' must be an integer (the CUDA device the memory is on)");
                 return;
               }
               if (byte_size == body.end() || !byte_size->is_number_unsigned()) {
                 refuse("'byte_size' must be a non-negative integer");
                 return;
               }
               Status registered = shared_memory_.RegisterCuda(
                   name, *handle, device_id->get<int64_t>(), byte_size->get<uint64_t>());
               respond(registered.ok() ? Ok(Json::object())
                                       : http::ErrorResponse(HttpStatusOf(registered.code()),
                                                             registered.message()));
             });
}

std::string ErrorMessage(const Status& error) {
  std::string message = error.message();
  if (error.code() == StatusCode::kPythonError && !error.detail().empty()) {
    message += "\n" + error.detail();
  }
  return message;
}

http::Response InferErrorResponse(const Status& error) {
  if (FailureReason(error.code()) == "client_gone") {
    // Not a client error: nginx's 499, so that a vanished client is not counted as a 400 (the
    // answer itself reaches no one).
    http::Response response = http::ErrorResponse(499, ErrorMessage(error));
    response.reason("Client Closed Request");
    return response;
  }
  return http::ErrorResponse(HttpStatusOf(error.code()), ErrorMessage(error));
}

void KServeApi::Infer(http::Request&& request, const http::PathParams& params,
                      http::Responder respond) {
  const Clock::time_point received = Clock::now();
  std::shared_ptr<const ServedModel> model =
      ResolveAndAdmit(params, respond, request.body().size(), received);
  if (model == nullptr) return;
  auto fail = [&](const Status& status, const std::string& reason) {
    runner_.Refused(*model, reason, received);
    respond(http::ErrorResponse(HttpStatusOf(status.code()), status.message()));
  };
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
  auto infer_request = std::make_shared<InferRequest>(std::move(parsed).value());
  if (std::optional<InferenceRunner::Refusal> refused = runner_.AdmitSharedMemoryInputs(
          *model, *infer_request, request.body().size(),
          static_cast<uint64_t>(config_.http.max_body_bytes), received)) {
    respond(http::ErrorResponse(413, refused->status.message()));
    return;
  }
  // Inputs in shared memory are read here, and outputs' regions checked; the request then
  // keeps the regions mapped until the answer is written.
  if (Status shared = ResolveSharedMemory(model->manifest(), shared_memory_, infer_request.get());
      !shared.ok()) {
    fail(shared, ParseFailureReason(shared.code()));
    return;
  }
  InferenceCall call;
  call.model = model;
  call.version_named = params.count("version") != 0;
  call.request = std::move(infer_request);
  call.received = received;
  call.client_gone = [respond] { return respond.client_gone(); };
  std::shared_ptr<const InferRequest> infer = call.request;
  if (!infer->shared_memory_outputs.empty()) {
    call.complete = [infer](const ServedModel& answered_by, const auto& outputs) {
      return WriteSharedMemoryOutputs(answered_by.manifest(), *infer, outputs);
    };
  }
  runner_.Run(std::move(call), [infer, respond](Result<InferenceResult> result) {
    if (!result.ok()) {
      respond(InferErrorResponse(result.status()));
      return;
    }
    const ServedModel& served = *result->model;
    EncodedResponse encoded =
        EncodeInferResponse(served.manifest(), *infer, result->outputs, served.package->labels());
    http::Response response = http::JsonResponse(200, std::move(encoded.body));
    if (encoded.json_length) {
      response.set(bhttp::field::content_type, "application/octet-stream");
      response.set("Inference-Header-Content-Length", std::to_string(*encoded.json_length));
    }
    respond(std::move(response));
  });
}

}  // namespace orochi::server::kserve
