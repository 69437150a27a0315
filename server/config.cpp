#include "orochi/server/config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace orochi::server {
namespace {

using Json = nlohmann::json;

Status Problem(const std::string& path, const std::string& message) {
  return InvalidArgument("config: " + path + ": " + message);
}

// Reads the keys of one JSON object into fields, refusing unknown keys.
class ObjectReader {
 public:
  ObjectReader(const Json& object, std::string path) : object_(object), path_(std::move(path)) {}

  Status Check(std::initializer_list<const char*> known) const {
    if (!object_.is_object()) {
      return Problem(path_, "expected an object, got " + std::string(object_.type_name()));
    }
    for (const auto& [key, value] : object_.items()) {
      if (!key.empty() && key.front() == '_') continue;  // "_comment" and the like: notes
      bool found = false;
      for (const char* name : known) found = found || key == name;
      if (!found) return Problem(path_ + "." + key, "unknown key");
    }
    return Status::Ok();
  }

  template <typename Int>
  Status Integer(const char* key, Int* field, int64_t minimum, int64_t maximum) const {
    auto found = object_.find(key);
    if (found == object_.end()) return Status::Ok();
    if (!found->is_number_integer() || found->get<int64_t>() < minimum ||
        found->get<int64_t>() > maximum) {
      return Problem(path_ + "." + key, "expected an integer from " + std::to_string(minimum) +
                                            " to " + std::to_string(maximum) + ", got " +
                                            found->dump());
    }
    *field = static_cast<Int>(found->get<int64_t>());
    return Status::Ok();
  }

  Status Boolean(const char* key, bool* field) const {
    auto found = object_.find(key);
    if (found == object_.end()) return Status::Ok();
    if (!found->is_boolean()) {
      return Problem(path_ + "." + key, "expected true or false, got " + found->dump());
    }
    *field = found->get<bool>();
    return Status::Ok();
  }

  Status String(const char* key, std::string* field,
                std::initializer_list<const char*> choices = {}) const {
    auto found = object_.find(key);
    if (found == object_.end()) return Status::Ok();
    if (!found->is_string()) {
      return Problem(path_ + "." + key, "expected a string, got " + found->dump());
    }
    std::string value = found->get<std::string>();
    if (choices.size() > 0) {
      bool allowed = false;
      std::string list;
      for (const char* choice : choices) {
        allowed = allowed || value == choice;
        list += (list.empty() ? "" : ", ") + std::string(choice);
      }
      if (!allowed) {
        return Problem(path_ + "." + key, "expected one of " + list + ", got '" + value + "'");
      }
    }
    *field = std::move(value);
    return Status::Ok();
  }

  Status Strings(const char* key, std::vector<std::string>* field) const {
    auto found = object_.find(key);
    if (found == object_.end()) return Status::Ok();
    if (!found->is_array()) return Problem(path_ + "." + key, "expected an array of strings");
    field->clear();
    for (const Json& item : *found) {
      if (!item.is_string()) return Problem(path_ + "." + key, "expected an array of strings");
      field->push_back(item.get<std::string>());
    }
    return Status::Ok();
  }

  Status Integers(const char* key, std::vector<int64_t>* field, int64_t minimum) const {
    auto found = object_.find(key);
    if (found == object_.end()) return Status::Ok();
    if (!found->is_array()) return Problem(path_ + "." + key, "expected an array of integers");
    field->clear();
    for (const Json& item : *found) {
      if (!item.is_number_integer() || item.get<int64_t>() < minimum) {
        return Problem(path_ + "." + key, "expected integers >= " + std::to_string(minimum));
      }
      field->push_back(item.get<int64_t>());
    }
    return Status::Ok();
  }

  // {"model": {"policy": "latest" | "all" | "specific", "versions": [1, 2]}}
  Status Policies(const char* key, std::map<std::string, VersionPolicy>* field) const {
    auto found = object_.find(key);
    if (found == object_.end()) return Status::Ok();
    if (!found->is_object()) return Problem(path_ + "." + key, "expected an object by model name");
    for (const auto& [model, value] : found->items()) {
      ObjectReader entry(value, path_ + "." + key + "." + model);
      OROCHI_RETURN_IF_ERROR(entry.Check({"policy", "versions"}));
      VersionPolicy policy;
      OROCHI_RETURN_IF_ERROR(entry.String("policy", &policy.kind, {"latest", "all", "specific"}));
      OROCHI_RETURN_IF_ERROR(entry.Integers("versions", &policy.versions, 1));
      if (policy.kind == "specific" && policy.versions.empty()) {
        return Problem(path_ + "." + key + "." + model + ".versions",
                       "the 'specific' policy needs a non-empty list of versions");
      }
      (*field)[model] = std::move(policy);
    }
    return Status::Ok();
  }

  ObjectReader Child(const char* key) const {
    static const Json kEmpty = Json::object();
    auto found = object_.find(key);
    return {found == object_.end() ? kEmpty : *found, path_ + "." + key};
  }

 private:
  const Json& object_;
  std::string path_;
};

}  // namespace

Result<ServerConfig> ParseServerConfig(std::string_view text) {
  Json json = Json::parse(text.begin(), text.end(), nullptr, false);
  if (json.is_discarded()) return Problem("$", "not valid JSON");
  ServerConfig config;
  ObjectReader root(json, "$");
  OROCHI_RETURN_IF_ERROR(root.Check(
      {"http", "grpc", "management", "models", "log", "python", "engine", "copies", "supervisor"}));
  OROCHI_RETURN_IF_ERROR(root.Integer("copies", &config.copies, 0, 1024));

  ObjectReader http = root.Child("http");
  OROCHI_RETURN_IF_ERROR(
      http.Check({"bind_address", "token_file", "token_env", "inference_port", "metrics_port",
                  "io_threads", "max_header_bytes", "max_body_bytes", "max_buffered_body_bytes",
                  "max_json_depth", "idle_timeout_s", "request_timeout_s", "shutdown_delay_s",
                  "shutdown_grace_s", "max_connections", "max_connections_per_client",
                  "allow_shared_memory", "repository_on_inference_port"}));
  OROCHI_RETURN_IF_ERROR(http.Boolean("allow_shared_memory", &config.http.allow_shared_memory));
  OROCHI_RETURN_IF_ERROR(http.String("bind_address", &config.http.bind_address));
  OROCHI_RETURN_IF_ERROR(http.String("token_file", &config.http.token_file));
  OROCHI_RETURN_IF_ERROR(http.String("token_env", &config.http.token_env));

  ObjectReader grpc = root.Child("grpc");
  OROCHI_RETURN_IF_ERROR(
      grpc.Check({"enabled", "bind_address", "port", "max_message_bytes", "max_response_bytes",
                  "max_stream_in_flight", "max_concurrent_streams", "max_connections",
                  "max_connections_per_client"}));
  OROCHI_RETURN_IF_ERROR(grpc.Boolean("enabled", &config.grpc.enabled));
  OROCHI_RETURN_IF_ERROR(grpc.String("bind_address", &config.grpc.bind_address));
  OROCHI_RETURN_IF_ERROR(grpc.Integer("port", &config.grpc.port, 0, 65535));
  // gRPC's own limits are ints.
  OROCHI_RETURN_IF_ERROR(
      grpc.Integer("max_message_bytes", &config.grpc.max_message_bytes, 1024, INT32_MAX));
  OROCHI_RETURN_IF_ERROR(
      grpc.Integer("max_response_bytes", &config.grpc.max_response_bytes, 1024, INT32_MAX));
  OROCHI_RETURN_IF_ERROR(
      grpc.Integer("max_stream_in_flight", &config.grpc.max_stream_in_flight, 1, 65536));
  OROCHI_RETURN_IF_ERROR(
      grpc.Integer("max_concurrent_streams", &config.grpc.max_concurrent_streams, 1, 1 << 20));
  OROCHI_RETURN_IF_ERROR(
      grpc.Integer("max_connections", &config.grpc.max_connections, 1, 1'000'000));
  OROCHI_RETURN_IF_ERROR(grpc.Integer("max_connections_per_client",
                                      &config.grpc.max_connections_per_client, 1, 1'000'000));

  ObjectReader management = root.Child("management");
  OROCHI_RETURN_IF_ERROR(management.Check(
      {"bind_address", "port", "token_file", "token_env", "max_upload_bytes", "upload_timeout_s"}));
  OROCHI_RETURN_IF_ERROR(management.String("bind_address", &config.management.bind_address));
  OROCHI_RETURN_IF_ERROR(management.Integer("port", &config.management.port, 0, 65535));
  OROCHI_RETURN_IF_ERROR(management.String("token_file", &config.management.token_file));
  OROCHI_RETURN_IF_ERROR(management.String("token_env", &config.management.token_env));
  OROCHI_RETURN_IF_ERROR(management.Integer("max_upload_bytes", &config.management.max_upload_bytes,
                                            1024, int64_t{1} << 42));
  OROCHI_RETURN_IF_ERROR(
      management.Integer("upload_timeout_s", &config.management.upload_timeout_s, 1, 604800));
  OROCHI_RETURN_IF_ERROR(http.Integer("inference_port", &config.http.inference_port, 0, 65535));
  OROCHI_RETURN_IF_ERROR(http.Integer("metrics_port", &config.http.metrics_port, 0, 65535));
  OROCHI_RETURN_IF_ERROR(http.Integer("io_threads", &config.http.io_threads, 1, 256));
  OROCHI_RETURN_IF_ERROR(
      // At most 65535: a single header or trailer field longer than that is more than the
      // HTTP parser's field table can index.
      http.Integer("max_header_bytes", &config.http.max_header_bytes, 1024, 65535));
  OROCHI_RETURN_IF_ERROR(
      http.Integer("max_body_bytes", &config.http.max_body_bytes, 1024, int64_t{1} << 40));
  OROCHI_RETURN_IF_ERROR(http.Integer("max_buffered_body_bytes",
                                      &config.http.max_buffered_body_bytes, 0, int64_t{1} << 50));
  OROCHI_RETURN_IF_ERROR(http.Integer("max_json_depth", &config.http.max_json_depth, 2, 10000));
  OROCHI_RETURN_IF_ERROR(http.Integer("idle_timeout_s", &config.http.idle_timeout_s, 1, 86400));
  OROCHI_RETURN_IF_ERROR(
      http.Integer("request_timeout_s", &config.http.request_timeout_s, 1, 86400));
  OROCHI_RETURN_IF_ERROR(
      http.Integer("max_connections", &config.http.max_connections, 1, 1'000'000));
  OROCHI_RETURN_IF_ERROR(http.Integer("max_connections_per_client",
                                      &config.http.max_connections_per_client, 1, 1'000'000));
  OROCHI_RETURN_IF_ERROR(http.Integer("shutdown_delay_s", &config.http.shutdown_delay_s, 0, 3600));
  OROCHI_RETURN_IF_ERROR(http.Integer("shutdown_grace_s", &config.http.shutdown_grace_s, 0, 3600));
  OROCHI_RETURN_IF_ERROR(
      http.Boolean("repository_on_inference_port", &config.http.repository_on_inference_port));

  ObjectReader models = root.Child("models");
  OROCHI_RETURN_IF_ERROR(models.Check({"repository",
                                       "model_dir",
                                       "model_name",
                                       "load",
                                       "max_queue_size",
                                       "default_timeout_ms",
                                       "max_memory_bytes",
                                       "execution_grace_ms",
                                       "load_timeout_s",
                                       "max_abandoned_copies",
                                       "unload_grace_s",
                                       "max_queue_delay_us",
                                       "preferred_batch_sizes",
                                       "version_policies",
                                       "model_control_mode",
                                       "repository_poll_ms",
                                       "max_queued_streams",
                                       "stream_buffer_responses",
                                       "stream_stall_timeout_ms",
                                       "sequence_idle_timeout_ms",
                                       "max_sequences_per_copy"}));
  OROCHI_RETURN_IF_ERROR(models.String("repository", &config.models.repository));
  OROCHI_RETURN_IF_ERROR(models.String("model_dir", &config.models.model_dir));
  OROCHI_RETURN_IF_ERROR(models.String("model_name", &config.models.model_name));
  OROCHI_RETURN_IF_ERROR(
      models.String("model_control_mode", &config.models.model_control_mode, {"explicit", "poll"}));
  OROCHI_RETURN_IF_ERROR(
      models.Integer("repository_poll_ms", &config.models.repository_poll_ms, 100, 86'400'000));
  OROCHI_RETURN_IF_ERROR(models.Strings("load", &config.models.load));
  OROCHI_RETURN_IF_ERROR(
      models.Integer("max_queue_size", &config.models.max_queue_size, 1, int64_t{1} << 30));
  OROCHI_RETURN_IF_ERROR(
      models.Integer("default_timeout_ms", &config.models.default_timeout_ms, 0, int64_t{1} << 40));
  OROCHI_RETURN_IF_ERROR(
      models.Integer("max_memory_bytes", &config.models.max_memory_bytes, 0, int64_t{1} << 50));
  OROCHI_RETURN_IF_ERROR(models.Integer("load_timeout_s", &config.models.load_timeout_s, 1, 86400));
  OROCHI_RETURN_IF_ERROR(
      models.Integer("execution_grace_ms", &config.models.execution_grace_ms, 0, int64_t{1} << 40));
  OROCHI_RETURN_IF_ERROR(
      models.Integer("max_abandoned_copies", &config.models.max_abandoned_copies, 0, 1'000'000));
  OROCHI_RETURN_IF_ERROR(models.Integer("unload_grace_s", &config.models.unload_grace_s, 0, 86400));
  OROCHI_RETURN_IF_ERROR(
      models.Integer("max_queued_streams", &config.models.max_queued_streams, 1, int64_t{1} << 30));
  OROCHI_RETURN_IF_ERROR(models.Integer("stream_buffer_responses",
                                        &config.models.stream_buffer_responses, 1, 1'000'000));
  OROCHI_RETURN_IF_ERROR(models.Integer(
      "stream_stall_timeout_ms", &config.models.stream_stall_timeout_ms, 1, int64_t{1} << 40));
  OROCHI_RETURN_IF_ERROR(models.Integer(
      "sequence_idle_timeout_ms", &config.models.sequence_idle_timeout_ms, 1, int64_t{1} << 40));
  OROCHI_RETURN_IF_ERROR(models.Integer(
      "max_sequences_per_copy", &config.models.max_sequences_per_copy, 1, int64_t{1} << 30));
  OROCHI_RETURN_IF_ERROR(
      models.Integer("max_queue_delay_us", &config.models.max_queue_delay_us, 0, int64_t{1} << 40));
  OROCHI_RETURN_IF_ERROR(
      models.Integers("preferred_batch_sizes", &config.models.preferred_batch_sizes, 1));

  OROCHI_RETURN_IF_ERROR(models.Policies("version_policies", &config.models.version_policies));

  ObjectReader engine = root.Child("engine");
  OROCHI_RETURN_IF_ERROR(engine.Check({"intra_op_threads"}));
  OROCHI_RETURN_IF_ERROR(
      engine.Integer("intra_op_threads", &config.engine.intra_op_threads, 0, 1024));

  ObjectReader python = root.Child("python");
  OROCHI_RETURN_IF_ERROR(python.Check({"site_packages"}));
  OROCHI_RETURN_IF_ERROR(python.Strings("site_packages", &config.python.site_packages));

  ObjectReader supervisor = root.Child("supervisor");
  OROCHI_RETURN_IF_ERROR(supervisor.Check({"enabled", "max_model_crashes", "crash_window_s",
                                           "liveness_timeout_s", "max_model_processes"}));
  OROCHI_RETURN_IF_ERROR(supervisor.Boolean("enabled", &config.supervisor.enabled));
  OROCHI_RETURN_IF_ERROR(
      supervisor.Integer("max_model_crashes", &config.supervisor.max_model_crashes, 1, 1'000'000));
  OROCHI_RETURN_IF_ERROR(supervisor.Integer("crash_window_s", &config.supervisor.crash_window_s, 1,
                                            int64_t{86400} * 30));
  OROCHI_RETURN_IF_ERROR(
      supervisor.Integer("liveness_timeout_s", &config.supervisor.liveness_timeout_s, 0, 3600));
  OROCHI_RETURN_IF_ERROR(supervisor.Integer("max_model_processes",
                                            &config.supervisor.max_model_processes, 0, 1'000'000));

  ObjectReader log = root.Child("log");
  OROCHI_RETURN_IF_ERROR(log.Check({"level", "format", "requests"}));
  OROCHI_RETURN_IF_ERROR(log.String("requests", &config.log.requests, {"errors", "all", "none"}));
  OROCHI_RETURN_IF_ERROR(
      log.String("level", &config.log.level, {"debug", "info", "warning", "error"}));
  OROCHI_RETURN_IF_ERROR(log.String("format", &config.log.format, {"text", "json"}));
  OROCHI_RETURN_IF_ERROR(ValidateServerConfig(config));
  return config;
}

Result<ServerConfig> LoadServerConfig(const std::string& path) {
  std::ifstream file(path);
  if (!file) return NotFound("cannot read config file " + path);
  std::ostringstream text;
  text << file.rdbuf();
  Result<ServerConfig> config = ParseServerConfig(text.str());
  if (!config.ok()) return Status(config.status().code(), path + ": " + config.status().message());
  return config;
}

Status ValidateServerConfig(const ServerConfig& config) {
  std::vector<int> ports = {config.http.inference_port, config.management.port,
                            config.http.metrics_port};
  if (config.grpc.enabled) ports.push_back(config.grpc.port);
  for (size_t i = 0; i < ports.size(); ++i) {
    for (size_t j = i + 1; j < ports.size(); ++j) {
      if (ports[i] != 0 && ports[i] == ports[j]) {
        return Problem("$", "the inference, gRPC, management and metrics ports must differ (" +
                                std::to_string(ports[i]) + " is given twice)");
      }
    }
  }
  if (!config.models.model_dir.empty() && !config.models.repository.empty()) {
    return Problem("$.models",
                   "model_dir and repository are both set: serve a model directory or "
                   "a repository, not both");
  }
  if (!config.models.model_name.empty() && config.models.model_dir.empty()) {
    return Problem("$.models.model_name", "names the package of a model_dir, and none is set");
  }
  if (config.models.model_control_mode == "poll") {
    const std::vector<std::string>& load = config.models.load;
    if (!load.empty() && !(load.size() == 1 && load[0] == "*")) {
      return Problem("$.models.load",
                     "must be empty (or [\"*\"]) with model_control_mode \"poll\": every model "
                     "of the repository is served");
    }
    if (config.models.repository.empty()) {
      return Problem("$.models.repository",
                     "model_control_mode \"poll\" needs a repository (a model_dir is read once, "
                     "at startup)");
    }
  }
  return Status::Ok();
}

}  // namespace orochi::server
