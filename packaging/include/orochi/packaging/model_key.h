// ModelKey: one version of one model, written "name:version" (e.g. "digits:1"). The server keys
// its loaded versions, queues, metrics labels, log records and crash records by it, and loads a
// package into the copies under it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include "orochi/base/status.h"

namespace orochi::packaging {

struct ModelKey {
  std::string name;  // a manifest's name: no ':' in it
  int64_t version = 0;

  // "name:version".
  std::string ToString() const;
  // The key that ToString wrote. kInvalidArgument for text without a name, a ':' and a version
  // of decimal digits after the last ':'.
  static Result<ModelKey> Parse(std::string_view text);

  friend bool operator==(const ModelKey&, const ModelKey&) = default;
  // By name, then version (a defaulted <=> would do, but clang-tidy misreads its 0).
  friend bool operator<(const ModelKey& left, const ModelKey& right) {
    return std::tie(left.name, left.version) < std::tie(right.name, right.version);
  }
};

}  // namespace orochi::packaging
