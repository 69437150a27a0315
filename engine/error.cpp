#include "orochi/engine/error.h"

namespace orochi::engine {

Error::Error(Status status) : status_(std::move(status)) {}

const char* Error::what() const noexcept { return status_.message().c_str(); }

namespace detail {
void Throw(StatusCode code, const std::string& message) { throw Error(Status(code, message)); }
}  // namespace detail

}  // namespace orochi::engine
