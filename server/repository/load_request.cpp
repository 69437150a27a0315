#include "load_request.h"

#include <nlohmann/json.hpp>

namespace orochi::server::repository {
namespace {

using Json = nlohmann::json;

std::string Named(const std::string& text) {
  return Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
}

Result<Json> ReadBody(std::string_view body, const char* call) {
  Json json = Json::parse(body.begin(), body.end(), nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    return InvalidArgument(std::string("the ") + call +
                           " request's body must be a JSON object such as {\"parameters\": {...}}");
  }
  for (const auto& [key, value] : json.items()) {
    if (key != "parameters") {
      return InvalidArgument(std::string("the ") + call + " request has the key " + Named(key) +
                             ", which Orochi does not implement (only \"parameters\")");
    }
  }
  Json parameters = json.value("parameters", Json::object());
  if (!parameters.is_object()) {
    return InvalidArgument(std::string("the ") + call + " request's parameters must be an object");
  }
  return parameters;
}

Result<int64_t> Integer(const Json& value, const std::string& path, int64_t minimum) {
  // Triton's JSON configs write 64-bit integers as strings ("max_batch_size": "8") too.
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (!text.empty() && text.size() <= 18 &&
        text.find_first_not_of("0123456789") == std::string::npos && std::stoll(text) >= minimum) {
      return std::stoll(text);
    }
  } else if (value.is_number_integer() && value.get<int64_t>() >= minimum) {
    return value.get<int64_t>();
  }
  return InvalidArgument("config: " + path + " must be an integer >= " + std::to_string(minimum) +
                         ", got " + value.dump());
}

Status Unsupported(const std::string& path, const std::string& why) {
  return InvalidArgument("config: " + path + " is not supported by Orochi: " + why);
}

Status ReadConfig(const Json& config, const std::string& model, LoadOverrides* overrides) {
  for (const auto& [key, value] : config.items()) {
    if (key == "name") {
      if (!value.is_string() || value.get<std::string>() != model) {
        return InvalidArgument("config: name " + value.dump() + " is not the model's, " +
                               Named(model));
      }
    } else if (key == "max_batch_size") {
      OROCHI_ASSIGN_OR_RETURN(int64_t size, Integer(value, "max_batch_size", 0));
      overrides->max_batch_size = size;
    } else if (key == "dynamic_batching") {
      if (!value.is_object()) return InvalidArgument("config: dynamic_batching must be an object");
      for (const auto& [field, setting] : value.items()) {
        const std::string path = "dynamic_batching." + field;
        if (field == "max_queue_delay_microseconds") {
          OROCHI_ASSIGN_OR_RETURN(int64_t delay, Integer(setting, path, 0));
          overrides->max_queue_delay = std::chrono::microseconds(delay);
        } else if (field == "preferred_batch_size") {
          if (!setting.is_array()) return InvalidArgument("config: " + path + " must be an array");
          std::vector<int64_t> sizes;
          for (const Json& size : setting) {
            OROCHI_ASSIGN_OR_RETURN(int64_t read, Integer(size, path, 1));
            sizes.push_back(read);
          }
          overrides->preferred_batch_sizes = std::move(sizes);
        } else {
          return Unsupported(path,
                             "of dynamic_batching, only max_queue_delay_microseconds and "
                             "preferred_batch_size apply");
        }
      }
    } else if (key == "instance_group") {
      if (!value.is_array() || value.size() != 1 || !value[0].is_object()) {
        return Unsupported("instance_group",
                           "it must hold exactly one group (Orochi places a model in a number of "
                           "interpreter copies, without kinds or devices per group)");
      }
      for (const auto& [field, setting] : value[0].items()) {
        if (field == "count") {
          OROCHI_ASSIGN_OR_RETURN(int64_t count, Integer(setting, "instance_group[0].count", 1));
          overrides->instances = count;
        } else if (field != "name") {
          return Unsupported("instance_group[0]." + field,
                             "of an instance group, only count applies (the manifest's device "
                             "places the model)");
        }
      }
    } else if (key == "parameters") {
      return Unsupported("parameters",
                         "a model's parameters come from its package's manifest (repack it to "
                         "change them)");
    } else {
      return Unsupported(key,
                         "a load's config may set dynamic_batching (max_queue_delay_microseconds, "
                         "preferred_batch_size) and instance_group count, and state the model's "
                         "name and max_batch_size");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<LoadOverrides> ParseLoadRequest(std::string_view body, const std::string& model) {
  LoadOverrides overrides;
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return overrides;
  OROCHI_ASSIGN_OR_RETURN(Json parameters, ReadBody(body, "load"));
  for (const auto& [name, value] : parameters.items()) {
    if (name == "config") {
      if (!value.is_string()) {
        return InvalidArgument("parameter \"config\" must be a string holding the JSON config");
      }
      const std::string& text = value.get_ref<const std::string&>();
      Json config = Json::parse(text, nullptr, false);
      if (config.is_discarded() || !config.is_object()) {
        return InvalidArgument("parameter \"config\" is not a JSON object");
      }
      OROCHI_RETURN_IF_ERROR(ReadConfig(config, model, &overrides));
    } else if (name.starts_with("file:")) {
      return InvalidArgument("parameter " + Named(name) +
                             " is not supported: Orochi loads models from packages in its "
                             "repository; upload one with PUT /v2/repository/models/" +
                             model + "/versions/<version> on the management port");
    } else {
      return InvalidArgument("parameter " + Named(name) +
                             " of the load request is not supported by Orochi (only \"config\")");
    }
  }
  return overrides;
}

Status CheckUnloadRequest(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return Status::Ok();
  OROCHI_ASSIGN_OR_RETURN(Json parameters, ReadBody(body, "unload"));
  for (const auto& [name, value] : parameters.items()) {
    if (name == "unload_dependents") {
      if (!value.is_boolean()) {
        return InvalidArgument("parameter \"unload_dependents\" must be a boolean");
      }
      continue;  // Orochi models have no dependents: either value holds
    }
    return InvalidArgument("parameter " + Named(name) +
                           " of the unload request is not supported by Orochi (only "
                           "\"unload_dependents\")");
  }
  return Status::Ok();
}

}  // namespace orochi::server::repository
