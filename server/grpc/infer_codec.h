// ModelInferRequest and ModelInferResponse (inference.proto) read and written through the
// request codec that HTTP uses (orochi/server/kserve_codec.h): the same checks, the same errors,
// the same output selection and classification. Only the wire format is gRPC's own: values
// arrive in raw_input_contents or typed contents, and leave in raw_output_contents.
//
// Thread-safety: pure functions.
#pragma once

#include "inference.pb.h"
#include "orochi/base/status.h"
#include "orochi/server/kserve_codec.h"

namespace orochi::server::grpc_api {

// Errors are kInvalidArgument with a message for the client.
Result<kserve::InferRequest> ReadInferRequest(const packaging::Manifest& manifest,
                                              const inference::ModelInferRequest& message);

// Fills `response` (empty) with the outputs that `request` asked for.
void WriteInferResponse(const packaging::Manifest& manifest, const kserve::InferRequest& request,
                        const std::vector<interpreters::NamedTensor>& outputs,
                        const kserve::OutputLabels& labels,
                        inference::ModelInferResponse* response);

// The first field of `message` (or of a message in it) that this server's schema does not
// declare, as a path ("inputs[0].7"); empty when there is none. A field a client sets that the
// server does not know would otherwise be dropped without a word. (Unknown fields inside a map
// entry are dropped by protobuf's parser itself, before this can see them.)
std::string UnknownFieldPath(const inference::ModelInferRequest& message);

}  // namespace orochi::server::grpc_api
