// The parts of a KServe v2 / Triton inference request that Orochi does not implement, refused
// with 400 naming them instead of being accepted and ignored: a client that asks for a
// priority and silently gets none would run on with wrong assumptions. One place, so that
// implementing a feature means removing its refusal here; the gRPC codec refuses the same reserved
// parameters through IsReservedParameter.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "orochi/base/status.h"

namespace orochi::server::kserve {

// Checks a request document (already known to be an object) for keys and parameters Orochi
// does not read: kInvalidArgument naming the first one, and what is supported instead.
//  - top level: keys other than id, parameters, inputs, outputs; the reserved parameters
//    priority (Triton's scheduling parameter, which would otherwise reach the model's predict()
//    as its own parameter; the sequence parameters are read by InferRequestBuilder);
//  - inputs: keys other than name, datatype, shape, parameters, data; parameters other than
//    binary_data_size and the shared-memory ones; `parameters` that is not an object;
//  - outputs: keys other than name, parameters; parameters other than binary_data,
//    classification and the shared-memory ones; `parameters` that is not an object.
Status RefuseUnsupportedFields(const nlohmann::json& request);

// Whether `name` is one of Triton's reserved request parameters that Orochi does not implement
// (priority), and the refusal that names it.
bool IsReservedParameter(std::string_view name);
Status RefuseReservedParameter(const std::string& name);

}  // namespace orochi::server::kserve
