#include "openai_api.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>

#include "kserve/handlers.h"
#include "kserve/stream_writer.h"
#include "orochi/server/kserve_codec.h"

namespace orochi::server::openai {
namespace {

namespace bhttp = boost::beast::http;
using Json = nlohmann::json;
using packaging::Manifest;

// Text a model wrote need not be valid UTF-8 (a byte-level model may stop inside a character):
// written with U+FFFD in place of what is not.
std::string Dump(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// OpenAI's error object. `param` names the request field at fault, when one is.
http::Response Error(unsigned status, const std::string& message, const std::string& param = "",
                     const std::string& code = "") {
  const char* type = status == 429   ? "rate_limit_error"
                     : status >= 500 ? "server_error"
                     : status == 401 ? "authentication_error"
                                     : "invalid_request_error";
  Json error = {{"message", message},
                {"type", type},
                {"param", param.empty() ? Json() : Json(param)},
                {"code", code.empty() ? Json() : Json(code)}};
  return http::JsonResponse(status, Dump({{"error", error}}));
}

http::Response Error(const Status& status) {
  return Error(kserve::HttpStatusOf(status.code()), kserve::ErrorMessage(status));
}

std::string RandomId(const char* prefix) {
  thread_local std::mt19937_64 random{std::random_device{}()};
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kDigits[random() % 16];
  return id;
}

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A request field that failed its check: the message and the field.
struct Invalid {
  std::string message;
  std::string param;
};

// What a completion request asks for, checked.
struct Completion {
  std::string model;
  std::string prompt;
  bool stream = false;
  bool include_usage = false;
  Json parameters = Json::object();  // for the model
  std::optional<int64_t> max_tokens;
};

// Fields a request may carry besides those of its kind; a null value is the same as none.
const std::set<std::string> kCommonFields = {
    "model", "stream", "stream_options", "n", "max_tokens", "temperature", "top_p", "stop", "seed"};

std::optional<Invalid> ReadSampling(const Json& request, const char* max_tokens_field,
                                    Completion* completion) {
  auto field = [&](const char* name) -> const Json* {
    auto found = request.find(name);
    return found == request.end() || found->is_null() ? nullptr : &*found;
  };
  if (const Json* max_tokens = field(max_tokens_field)) {
    if (!max_tokens->is_number_integer() || max_tokens->get<int64_t>() < 1) {
      return Invalid{std::string("'") + max_tokens_field + "' must be an integer >= 1",
                     max_tokens_field};
    }
    completion->max_tokens = max_tokens->get<int64_t>();
    completion->parameters["max_tokens"] = *completion->max_tokens;
  }
  for (const char* name : {"temperature", "top_p"}) {
    const Json* value = field(name);
    if (value == nullptr) continue;
    const double high = std::string_view(name) == "temperature" ? 2.0 : 1.0;
    if (!value->is_number() || value->get<double>() < 0 || value->get<double>() > high) {
      return Invalid{
          std::string("'") + name + "' must be a number from 0 to " + (high == 2.0 ? "2" : "1"),
          name};
    }
    completion->parameters[name] = value->get<double>();
  }
  if (const Json* stop = field("stop")) {
    // Request parameters are scalars: one stop string reaches the model.
    const Json* only = stop->is_array() && stop->size() == 1 ? &(*stop)[0] : stop;
    if (stop->is_array() && stop->empty()) {
      // no stop strings: nothing to pass
    } else if (!only->is_string() || only->get<std::string>().empty()) {
      return Invalid{
          "'stop' must be a non-empty string or an array of one (this server passes "
          "one stop string to a model)",
          "stop"};
    } else {
      completion->parameters["stop"] = *only;
    }
  }
  if (const Json* seed = field("seed")) {
    if (!seed->is_number_integer()) return Invalid{"'seed' must be an integer", "seed"};
    completion->parameters["seed"] = *seed;
  }
  if (const Json* n = field("n")) {
    if (!n->is_number_integer() || n->get<int64_t>() != 1) {
      return Invalid{"'n' must be 1: this server generates one choice per request", "n"};
    }
  }
  if (const Json* stream = field("stream")) {
    if (!stream->is_boolean()) return Invalid{"'stream' must be true or false", "stream"};
    completion->stream = stream->get<bool>();
  }
  if (const Json* options = field("stream_options")) {
    if (!completion->stream) {
      return Invalid{"'stream_options' is allowed only with \"stream\": true", "stream_options"};
    }
    if (!options->is_object()) {
      return Invalid{"'stream_options' must be an object", "stream_options"};
    }
    for (const auto& [key, value] : options->items()) {
      if (key != "include_usage") {
        return Invalid{"unsupported field 'stream_options." + key + "'", "stream_options"};
      }
      if (!value.is_boolean()) {
        return Invalid{"'stream_options.include_usage' must be true or false", "stream_options"};
      }
      completion->include_usage = value.get<bool>();
    }
  }
  return std::nullopt;
}

// A chat rendered as one prompt: each message on its own line as "<role>: <content>", then
// "assistant: " for the model to continue.
std::optional<Invalid> RenderChat(const Json& messages, std::string* prompt) {
  if (!messages.is_array() || messages.empty()) {
    return Invalid{"'messages' must be a non-empty array", "messages"};
  }
  static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant"};
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& message = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!message.is_object()) return Invalid{"'" + at + "' must be an object", at};
    for (const auto& [key, value] : message.items()) {
      if (key != "role" && key != "content") {
        std::string field = at;
        field.append(".").append(key);
        return Invalid{"unsupported field '" + field + "'", field};
      }
    }
    auto role = message.find("role");
    if (role == message.end() || !role->is_string() ||
        kRoles.count(role->get<std::string>()) == 0) {
      return Invalid{"'" + at + ".role' must be one of system, developer, user, assistant",
                     at + ".role"};
    }
    std::string content;
    auto found = message.find("content");
    if (found != message.end() && found->is_string()) {
      content = found->get<std::string>();
    } else if (found != message.end() && found->is_array()) {
      for (const Json& part : *found) {  // content parts: text only
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string() || part.size() != 2) {
          return Invalid{"'" + at +
                             ".content' parts must be {\"type\": \"text\", \"text\": ...}: "
                             "this server takes text only",
                         at + ".content"};
        }
        content += part["text"].get<std::string>();
      }
    } else {
      return Invalid{"'" + at + ".content' must be a string or an array of text parts",
                     at + ".content"};
    }
    prompt->append(role->get<std::string>()).append(": ").append(content).append("\n");
  }
  prompt->append("assistant: ");
  return std::nullopt;
}

std::optional<Invalid> ReadRequest(std::string_view body, bool chat, Completion* completion) {
  Json request = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    return Invalid{"the request body must be a JSON object", ""};
  }
  const char* prompt_field = chat ? "messages" : "prompt";
  for (const auto& [key, value] : request.items()) {
    if (kCommonFields.count(key) == 0 && key != prompt_field &&
        !(chat && key == "max_completion_tokens")) {
      return Invalid{"unsupported field '" + key + "': this server takes " + prompt_field +
                         ", model, max_tokens" + (chat ? ", max_completion_tokens" : "") +
                         ", temperature, top_p, stop, seed, n (1), stream and stream_options",
                     key};
    }
  }
  auto model = request.find("model");
  if (model == request.end() || !model->is_string()) {
    return Invalid{"'model' must be given, the name of a model", "model"};
  }
  completion->model = model->get<std::string>();
  const char* max_tokens_field = "max_tokens";
  if (chat && request.contains("max_completion_tokens") &&
      !request["max_completion_tokens"].is_null()) {
    if (request.contains("max_tokens") && !request["max_tokens"].is_null()) {
      return Invalid{"give 'max_tokens' or 'max_completion_tokens', not both", "max_tokens"};
    }
    max_tokens_field = "max_completion_tokens";
  }
  if (std::optional<Invalid> invalid = ReadSampling(request, max_tokens_field, completion)) {
    return invalid;
  }
  auto prompt = request.find(prompt_field);
  if (prompt == request.end()) {
    return Invalid{std::string("'") + prompt_field + "' must be given", prompt_field};
  }
  if (chat) return RenderChat(*prompt, &completion->prompt);
  const Json* text = prompt->is_array() && prompt->size() == 1 ? &(*prompt)[0] : &*prompt;
  if (!text->is_string()) {
    return Invalid{"'prompt' must be a string or an array of one string (one prompt per request)",
                   "prompt"};
  }
  completion->prompt = text->get<std::string>();
  return std::nullopt;
}

// The model's text in one response, if it has its text output.
std::optional<std::string> TextOf(const Manifest::OpenAi& mapping,
                                  const ResponseStream::Response& response) {
  for (const interpreters::NamedTensor& output : response) {
    if (output.name != mapping.text_output) continue;
    const auto* bytes = std::get_if<interpreters::BytesTensor>(&output.value);
    if (bytes == nullptr || bytes->items.size() != 1) return std::nullopt;
    return bytes->items[0];
  }
  return std::nullopt;
}

// Writes a completion in OpenAI's shapes: text_completion or chat.completion, or their chunks.
class CompletionWriter : public kserve::StreamWriter {
 public:
  CompletionWriter(http::Responder respond, Completion completion, bool chat,
                   const ServedModel& model)
      : StreamWriter(std::move(respond), completion.stream),
        completion_(std::move(completion)),
        chat_(chat),
        mapping_(*model.manifest().openai),
        id_(RandomId(chat ? "chatcmpl-" : "cmpl-")),
        created_(UnixNow()) {
    max_tokens_ = completion_.max_tokens;
    if (!max_tokens_) {  // the model's default, when its manifest gives one
      Json defaults = Json::parse(model.manifest().parameters_json, nullptr, false);
      if (defaults.is_object() && defaults.contains("max_tokens") &&
          defaults["max_tokens"].is_number_integer()) {
        max_tokens_ = defaults["max_tokens"].get<int64_t>();
      }
    }
  }

 protected:
  std::string Event(const ServedModel& /*model*/, const Response& response) override {
    std::optional<std::string> text = TextOf(mapping_, response);
    if (!text || text->empty()) return "";
    text_ += *text;
    std::string events = RoleChunk();
    return events + Chunk(chat_ ? Json{{"content", *text}} : Json(*text), Json());
  }
  std::string Closing(const Status& end) override {
    if (!end.ok()) {
      Json error = Json::parse(Error(end).body(), nullptr, false);
      return "data: " + Dump(error) + "\n\n";
    }
    std::string events = RoleChunk() + Chunk(chat_ ? Json::object() : Json(""), FinishReason());
    if (completion_.include_usage) {
      Json chunk = Head(chat_ ? "chat.completion.chunk" : "text_completion");
      chunk["choices"] = Json::array();
      chunk["usage"] = Usage();
      events += "data: " + Dump(chunk) + "\n\n";
    }
    return events + "data: [DONE]\n\n";
  }
  void Collect(const ServedModel& /*model*/, const Response& response) override {
    if (std::optional<std::string> text = TextOf(mapping_, response)) text_ += *text;
  }
  http::Response Answer() override {
    Json choice = {{"index", 0}, {"finish_reason", FinishReason()}, {"logprobs", nullptr}};
    if (chat_) {
      choice["message"] = {{"role", "assistant"}, {"content", text_}};
    } else {
      choice["text"] = text_;
    }
    Json answer = Head(chat_ ? "chat.completion" : "text_completion");
    answer["choices"] = Json::array({choice});
    answer["usage"] = Usage();
    return http::JsonResponse(200, Dump(answer));
  }
  http::Response Failure(const Status& error) override { return Error(error); }

 private:
  Json Head(const char* object) const {
    return {{"id", id_}, {"object", object}, {"created", created_}, {"model", completion_.model}};
  }
  std::string Chunk(Json content, Json finish_reason) const {
    Json choice = {{"index", 0}, {"finish_reason", std::move(finish_reason)}};
    if (chat_) {
      choice["delta"] = std::move(content);
    } else {
      choice["text"] = std::move(content);
      choice["logprobs"] = nullptr;
    }
    Json chunk = Head(chat_ ? "chat.completion.chunk" : "text_completion");
    chunk["choices"] = Json::array({choice});
    return "data: " + Dump(chunk) + "\n\n";
  }
  // A chat stream's first chunk names the role.
  std::string RoleChunk() {
    if (!chat_ || role_sent_) return "";
    role_sent_ = true;
    return Chunk({{"role", "assistant"}, {"content", ""}}, Json());
  }
  int64_t CompletionTokens() const { return static_cast<int64_t>(text_.size()); }
  // "length" when the model produced as many tokens as it was allowed (known for models whose
  // tokens are bytes), else "stop".
  std::string FinishReason() const {
    return mapping_.byte_tokens && max_tokens_ && CompletionTokens() >= *max_tokens_ ? "length"
                                                                                     : "stop";
  }
  // Token counts for models whose tokens are bytes; null otherwise.
  Json Usage() const {
    if (!mapping_.byte_tokens) return nullptr;
    const auto prompt = static_cast<int64_t>(completion_.prompt.size());
    return {{"prompt_tokens", prompt},
            {"completion_tokens", CompletionTokens()},
            {"total_tokens", prompt + CompletionTokens()}};
  }

  const Completion completion_;
  const bool chat_;
  const Manifest::OpenAi mapping_;
  const std::string id_;
  const int64_t created_;
  std::optional<int64_t> max_tokens_;
  std::string text_;
  bool role_sent_ = false;
};

Json ModelObject(const ServedModel& model) {
  return {{"id", model.name}, {"object", "model"}, {"created", 0}, {"owned_by", "orochi"}};
}

}  // namespace

OpenAiApi::OpenAiApi(ModelService& models, Metrics& metrics, const ServerConfig& config)
    : models_(models), config_(config), runner_(models, metrics, config) {}

void OpenAiApi::Register(http::Router& router) {
  router.Add(bhttp::verb::get, "/v1/models",
             [this](http::Request&&, const http::PathParams&, const http::Responder& respond) {
               Models(respond);
             });
  router.Add(bhttp::verb::get, "/v1/models/{model}",
             [this](http::Request&&, const http::PathParams& params,
                    const http::Responder& respond) { Model(params.at("model"), respond); });
  router.Add(
      bhttp::verb::post, "/v1/completions",
      [this](http::Request&& request, const http::PathParams&, const http::Responder& respond) {
        Complete(request, respond, Kind::kCompletion);
      });
  router.Add(bhttp::verb::post, "/v1/chat/completions",
             [this](http::Request&& request, const http::PathParams&,
                    const http::Responder& respond) { Complete(request, respond, Kind::kChat); });
}

void OpenAiApi::Models(const http::Responder& respond) const {
  Json data = Json::array();
  std::set<std::string> listed;
  for (const std::shared_ptr<const ServedModel>& model : models_.List()) {
    if (model->manifest().openai && listed.insert(model->name).second) {
      data.push_back(ModelObject(*model));
    }
  }
  respond(http::JsonResponse(200, Dump({{"object", "list"}, {"data", data}})));
}

void OpenAiApi::Model(const std::string& name, const http::Responder& respond) const {
  std::shared_ptr<const ServedModel> model = models_.Find(name, std::nullopt);
  if (model == nullptr || !model->manifest().openai) {
    respond(Error(404, "the model '" + name + "' does not exist or is not served on /v1", "model",
                  "model_not_found"));
    return;
  }
  respond(http::JsonResponse(200, Dump(ModelObject(*model))));
}

void OpenAiApi::Complete(const http::Request& request, const http::Responder& respond, Kind kind) {
  const Clock::time_point received = Clock::now();
  const bool chat = kind == Kind::kChat;
  Completion completion;
  if (std::optional<Invalid> invalid = ReadRequest(request.body(), chat, &completion)) {
    respond(Error(400, invalid->message, invalid->param));
    return;
  }
  Result<std::shared_ptr<const ServedModel>> found =
      runner_.Resolve(completion.model, "", /*count_unknown=*/true);
  if (!found.ok() || !(*found)->manifest().openai) {
    respond(Error(404,
                  found.ok() ? "the model '" + completion.model +
                                   "' is not a text generator (its manifest has no \"openai\" "
                                   "key)"
                             : found.status().message(),
                  "model", "model_not_found"));
    return;
  }
  std::shared_ptr<const ServedModel> model = *found;
  if (std::optional<kserve::InferenceRunner::Refusal> refused =
          runner_.Admit(*model, request.body().size(), received)) {
    respond(Error(refused->too_large ? 413 : kserve::HttpStatusOf(refused->status.code()),
                  refused->status.message()));
    return;
  }
  const Manifest::OpenAi& mapping = *model->manifest().openai;
  Json infer = {{"inputs", Json::array({{{"name", mapping.text_input},
                                         {"datatype", "BYTES"},
                                         {"shape", {1}},
                                         {"data", {completion.prompt}}}})}};
  if (!completion.parameters.empty()) infer["parameters"] = completion.parameters;
  Result<kserve::InferRequest> parsed =
      kserve::ParseInferRequest(model->manifest(), Dump(infer), std::nullopt,
                                kserve::ParseLimits{config_.http.max_json_depth});
  if (!parsed.ok()) {
    runner_.Refused(*model, kserve::ParseFailureReason(parsed.status().code()), received);
    respond(Error(parsed.status()));
    return;
  }
  kserve::InferenceCall call;
  call.model = model;
  call.request = std::make_shared<kserve::InferRequest>(std::move(parsed).value());
  call.received = received;
  std::make_shared<CompletionWriter>(respond, std::move(completion), chat, *model)
      ->Run(runner_, std::move(call), static_cast<size_t>(config_.models.stream_buffer_responses));
}

}  // namespace orochi::server::openai
