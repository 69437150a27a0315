// A package as the interpreters' model source, so that the server and the command line load a
// package the same way.
#pragma once

#include <memory>
#include <string>

#include "orochi/interpreters/model.h"
#include "orochi/packaging/package.h"

namespace orochi::server {

// The source of `package` under its ModelKey ("name:version"), with `config_json` (a JSON object;
// "{}" when empty) as its per-deployment config. The source's resource reader keeps the package
// alive.
interpreters::ModelSource ModelSourceFrom(std::shared_ptr<const packaging::Package> package,
                                          const std::string& config_json = "{}");

}  // namespace orochi::server
