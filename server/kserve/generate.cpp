// Triton's generate extension: POST /v2/models/{m}[/versions/{v}]/generate and
// /generate_stream. A request is a JSON object whose keys name the model's inputs or, otherwise,
// request parameters (also accepted under "parameters"); a response is a JSON object with
// model_name, model_version and each output by name (its value alone when it has one element).
// /generate_stream sends each response of a streaming model as it comes, as a Server-Sent Event
// (`data: {...}` and a blank line), and an error after the first response as an event
// `data: {"error": "..."}`; /generate answers once, with the responses combined.
#include <nlohmann/json.hpp>
#include <utility>

#include "handlers.h"
#include "orochi/server/kserve_codec.h"
#include "stream_writer.h"

namespace orochi::server::kserve {
namespace {

namespace bhttp = boost::beast::http;
using Json = nlohmann::json;
using packaging::TensorSpec;

// A value's shape as nested JSON arrays give it, and its elements in row-major order.
Status Flatten(const Json& value, size_t depth, std::vector<int64_t>* shape, Json* flat) {
  if (!value.is_array()) {
    flat->push_back(value);
    return Status::Ok();
  }
  if (shape->size() <= depth) {
    shape->push_back(static_cast<int64_t>(value.size()));
  } else if ((*shape)[depth] != static_cast<int64_t>(value.size())) {
    return InvalidArgument("the nested arrays are ragged");
  }
  for (const Json& item : value) OROCHI_RETURN_IF_ERROR(Flatten(item, depth + 1, shape, flat));
  return Status::Ok();
}

// The generate request as a KServe v2 inference request body, which the one request parser
// then reads (and checks against the manifest).
Result<std::string> AsInferRequest(const packaging::Manifest& manifest, std::string_view body) {
  Json request = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    return InvalidArgument("the generate request must be a JSON object");
  }
  Json inputs = Json::array();
  Json parameters = Json::object();
  for (auto& [key, value] : request.items()) {
    if (key == "parameters") {
      if (!value.is_object()) return InvalidArgument("'parameters' must be a JSON object");
      for (auto& [name, parameter] : value.items()) parameters[name] = parameter;
      continue;
    }
    const TensorSpec* spec = nullptr;
    for (const TensorSpec& input : manifest.inputs) {
      if (input.name == key) spec = &input;
    }
    if (spec == nullptr) {
      if (!value.is_string() && !value.is_number() && !value.is_boolean()) {
        return InvalidArgument("'" + key +
                               "' is neither an input of the model nor a parameter (a string, "
                               "number or boolean)");
      }
      parameters[key] = value;
      continue;
    }
    std::vector<int64_t> shape;
    Json flat = Json::array();
    if (Status flattened = Flatten(value, 0, &shape, &flat); !flattened.ok()) {
      return InvalidArgument("input '" + key + "': " + flattened.message());
    }
    // A single value for an input of one element ([1] or [-1]) is that element.
    if (!value.is_array() && spec->shape.size() == 1) shape = {1};
    inputs.push_back({{"name", key},
                      {"datatype", std::string(packaging::DataTypeName(spec->datatype))},
                      {"shape", shape},
                      {"data", flat}});
  }
  Json infer = {{"inputs", inputs}};
  if (!parameters.empty()) infer["parameters"] = parameters;
  return infer.dump();
}

// One response's outputs as the generate extension writes them.
Json GenerateResponse(const ServedModel& model, const InferRequest& request,
                      const std::vector<interpreters::NamedTensor>& outputs) {
  EncodedResponse encoded = EncodeInferResponse(model.manifest(), request, outputs);
  const Json v2 = Json::parse(encoded.body, nullptr, /*allow_exceptions=*/false);
  Json response = {{"model_name", model.name}, {"model_version", std::to_string(model.version)}};
  if (v2.is_discarded() || !v2.contains("outputs")) return response;
  for (const Json& output : v2["outputs"]) {
    const Json& data = output.value("data", Json::array());
    response[output.value("name", "")] = data.size() == 1 ? data[0] : data;
  }
  return response;
}

// The responses of a stream as one, for /generate: text outputs (strings) concatenated in
// order, other outputs as the last response gave them.
void Combine(Json* combined, const Json& response) {
  if (combined->is_null()) {
    *combined = response;
    return;
  }
  for (auto& [key, value] : response.items()) {
    Json& held = (*combined)[key];
    if (key != "model_name" && key != "model_version" && held.is_string() && value.is_string()) {
      held = held.get<std::string>() + value.get<std::string>();
    } else {
      held = value;
    }
  }
}

std::string Event(const Json& data) { return "data: " + data.dump() + "\n\n"; }

// The generate extension's answers: a JSON object per response, combined for /generate.
class GenerateWriter : public StreamWriter {
 public:
  GenerateWriter(http::Responder respond, std::shared_ptr<const InferRequest> request, bool events)
      : StreamWriter(std::move(respond), events), request_(std::move(request)) {}

 protected:
  std::string Event(const ServedModel& model, const Response& response) override {
    return kserve::Event(GenerateResponse(model, *request_, response));
  }
  std::string Closing(const Status& end) override {
    return end.ok() ? std::string() : kserve::Event({{"error", ErrorMessage(end)}});
  }
  void Collect(const ServedModel& model, const Response& response) override {
    Combine(&combined_, GenerateResponse(model, *request_, response));
  }
  http::Response Answer() override {
    return http::JsonResponse(200, combined_.is_null() ? "{}" : combined_.dump());
  }
  http::Response Failure(const Status& error) override { return InferErrorResponse(error); }

 private:
  std::shared_ptr<const InferRequest> request_;
  Json combined_;
};

}  // namespace

void KServeApi::Generate(http::Request&& request, const http::PathParams& params,
                         const http::Responder& respond, bool stream) {
  const Clock::time_point received = Clock::now();
  std::shared_ptr<const ServedModel> model =
      ResolveAndAdmit(params, respond, request.body().size(), received);
  if (model == nullptr) return;
  Result<std::string> body = AsInferRequest(model->manifest(), request.body());
  Result<InferRequest> parsed = body.status();
  if (body.ok()) {
    parsed = ParseInferRequest(model->manifest(), *body, std::nullopt,
                               ParseLimits{config_.http.max_json_depth});
  }
  if (!parsed.ok()) {
    runner_.Refused(*model, ParseFailureReason(parsed.status().code()), received);
    respond(http::ErrorResponse(HttpStatusOf(parsed.status().code()), parsed.status().message()));
    return;
  }
  auto infer_request = std::make_shared<InferRequest>(std::move(parsed).value());
  InferenceCall call;
  call.model = model;
  call.version_named = params.count("version") != 0;
  call.request = infer_request;
  call.received = received;
  std::make_shared<GenerateWriter>(respond, infer_request, stream)
      ->Run(runner_, std::move(call), static_cast<size_t>(config_.models.stream_buffer_responses));
}

}  // namespace orochi::server::kserve
