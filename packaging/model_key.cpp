#include "orochi/packaging/model_key.h"

#include <charconv>
#include <system_error>

namespace orochi::packaging {

std::string ModelKey::ToString() const { return name + ":" + std::to_string(version); }

Result<ModelKey> ModelKey::Parse(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return InvalidArgument("'" + std::string(text) + "' is not a model key (name:version)");
  }
  const std::string_view digits = text.substr(colon + 1);
  ModelKey key{std::string(text.substr(0, colon)), 0};
  const auto [end, error] =
      std::from_chars(digits.data(), digits.data() + digits.size(), key.version);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() ||
      key.version < 0) {
    return InvalidArgument("'" + std::string(text) + "': the version of a model key is a number");
  }
  return key;
}

}  // namespace orochi::packaging
