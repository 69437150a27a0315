// Subcommands of the `orochi` binary. Each returns the process exit status.
#pragma once

#include <string>
#include <vector>

namespace orochi::cli {

// `orochi python [--copies N] [-c CODE | -m MODULE | FILE | -] [ARGS...]`
int RunPythonCommand(const std::vector<std::string>& args);

// The usage text of `orochi python`, shown by `orochi python --help`.
extern const char* const kPythonUsage;

}  // namespace orochi::cli
