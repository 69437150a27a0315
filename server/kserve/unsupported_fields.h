// The parts of a KServe v2 / Triton inference request that Orochi does not implement, refused
// with 400 naming them instead of being accepted and ignored: a client that asks for sequence
// batching, a priority or shared memory and silently gets none would run on with wrong answers
// or wrong assumptions. One place, so that implementing a feature means removing its refusal
// here (system shared memory: RefuseSharedMemory).
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "orochi/base/status.h"

namespace orochi::server::kserve {

// Checks a request document (already known to be an object) for keys and parameters Orochi
// does not read: kInvalidArgument naming the first one, and what is supported instead.
//  - top level: keys other than id, parameters, inputs, outputs; the reserved parameters
//    priority, sequence_id, sequence_start, sequence_end (Triton's scheduling parameters,
//    which would otherwise reach the model's predict() as its own parameters);
//  - inputs: keys other than name, datatype, shape, parameters, data; parameters other than
//    binary_data_size; `parameters` that is not an object;
//  - outputs: keys other than name, parameters; parameters other than binary_data and
//    classification; `parameters` that is not an object;
//  - shared_memory_region, shared_memory_offset, shared_memory_byte_size on an input or an
//    output (RefuseSharedMemory).
Status RefuseUnsupportedFields(const nlohmann::json& request);

// The system and CUDA shared-memory extensions are not implemented: a tensor named by
// `shared_memory_*` parameters would otherwise be read from (or written to) nowhere.
// `tensor` says which, e.g. "input 'x'".
Status RefuseSharedMemory(const std::string& tensor, const std::string& parameter);

}  // namespace orochi::server::kserve
