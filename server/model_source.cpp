#include "orochi/server/model_source.h"

#include <string_view>
#include <utility>

#include "orochi/packaging/model_key.h"

namespace orochi::server {

interpreters::ModelSource ModelSourceFrom(std::shared_ptr<const packaging::Package> package,
                                          const std::string& config_json) {
  const packaging::Manifest& manifest = package->manifest();
  interpreters::ModelSource source;
  source.key = packaging::ModelKey{manifest.name, manifest.version}.ToString();
  source.manifest_json = manifest.json;
  source.config_json = config_json.empty() ? "{}" : config_json;
  source.code = package->code();
  source.weights = package->weights();
  source.read_resource = [package = std::move(package)](std::string_view resource) {
    return package->ReadResource(resource);
  };
  return source;
}

}  // namespace orochi::server
