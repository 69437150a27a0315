// Host functions every copy has without being given them (orochi.serving's resource reads).
#pragma once

#include <string_view>

#include "orochi/interpreters/value.h"

namespace orochi::interpreters {

// The built-in host function called `name`, or null.
const HostFunction* FindBuiltinHostFunction(std::string_view name);

}  // namespace orochi::interpreters
