// Subcommands of the `orochi` binary. Each returns the process exit status.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace orochi::cli {

// `orochi python [--copies N] [-c CODE | -m MODULE | FILE | -] [ARGS...]`
int RunPythonCommand(const std::vector<std::string>& args);

// The usage text of `orochi python`, shown by `orochi python --help`.
extern const char* const kPythonUsage;

struct PackOptions {
  std::string directory;
  std::string output;
  bool no_compile = false;
  std::optional<int64_t> set_version;  // replaces the manifest's "version" in the package
};
struct InspectOptions {
  std::string path;
  bool json = false;
};
struct RunOptions {
  std::string path;
  std::vector<std::string> inputs;  // NAME=JSON or NAME=@FILE
  std::string request_path;         // a KServe v2 request body instead of inputs
  std::string config;               // a JSON object
  size_t copies = 1;
  // Directories on every copy's sys.path, as the server config's python.site_packages.
  std::vector<std::string> site_packages;
};

// `orochi pack DIR -o FILE`: validates, compiles the code in a copy, writes a deterministic
// archive and reads it back with the server's reader.
int PackCommand(const PackOptions& options);
// `orochi inspect FILE [--json]`: manifest, members and weights (names, dtypes, shapes).
int InspectCommand(const InspectOptions& options);
// `orochi run FILE --input NAME=JSON ...` (or `--request BODY.json`): loads the package into
// private copies, runs predict() once and prints the server's KServe v2 JSON response. A
// streaming model's responses are printed one JSON line each, as they come.
int RunCommand(const RunOptions& options);

struct ServeOptions {
  std::string config_path;
  std::string model_repository;
  std::string model_dir;   // KServe's model directory (/mnt/models): a repository or a package
  std::string model_name;  // the name its single package is served as
  std::vector<std::string> load_models;
  std::optional<int> http_port;
  std::optional<int> metrics_port;
  std::optional<int> grpc_port;
  std::optional<int> management_port;
  std::string bind_address;
  std::optional<int> copies;
  std::string log_format;
  std::string log_level;
  std::string model_control_mode;                 // models.model_control_mode
  std::optional<double> repository_poll_seconds;  // models.repository_poll_ms, in seconds
};
// `orochi serve`: the inference server until SIGTERM/SIGINT.
int ServeCommand(const ServeOptions& options);

}  // namespace orochi::cli
