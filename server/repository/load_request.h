// The bodies of Triton's repository `load` and `unload` requests, read into what Orochi applies,
// with anything it cannot apply refused (kInvalidArgument, naming the field) rather than
// answered 200 and ignored.
//
// load: `{"parameters": {"config": "<model configuration as a JSON string>"}}`, the config being
// Triton's JSON model configuration. Of it, Orochi applies:
//   dynamic_batching.max_queue_delay_microseconds, dynamic_batching.preferred_batch_size, and
//   instance_group (one group) count;
// and accepts only when it states what the package already says: name (the model's), and
// max_batch_size (the manifest's: the inputs' shapes depend on it; checked by ModelService).
// Everything else (parameters, input, output, backend, other instance_group fields,
// `file:` parameters that carry a model's files, ...) is refused naming it.
// unload: `{"parameters": {"unload_dependents": bool}}`; Orochi models have no dependents, so
// either value holds as is.
//
// An empty body is a load or unload without parameters. Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "models/model_service.h"
#include "orochi/base/status.h"

namespace orochi::server::repository {

Result<LoadOverrides> ParseLoadRequest(std::string_view body, const std::string& model);
Status CheckUnloadRequest(std::string_view body);

}  // namespace orochi::server::repository
