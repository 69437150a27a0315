// The model repository API on the management port: deploy a package with one PUT, delete,
// list, load and unload (Triton's repository extension), all through the ModelService.
#pragma once

#include "http/router.h"
#include "models/model_service.h"

namespace orochi::server::repository {

// Uploads to `PUT /v2/repository/models/{name}/versions/{version}` are streamed to a file
// (http::Limits::stream_body_to_file): this says which requests those are.
bool IsUpload(const http::Request& header);

class RepositoryApi {
 public:
  explicit RepositoryApi(ModelService& models);
  void Register(http::Router& router);

 private:
  ModelService& models_;
};

}  // namespace orochi::server::repository
