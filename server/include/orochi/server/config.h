// The server's configuration: config/orochi.json documents every key and its default.
//
// LoadServerConfig reads a JSON file whose keys mirror these structs; every key is optional,
// keys starting with "_" are notes and ignored, other unknown keys are errors, and a bad value
// is reported with its JSON path
// ("config: $.http.max_body_bytes: expected an integer >= 1024, got 12").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "orochi/base/status.h"

namespace orochi::server {

struct HttpConfig {
  std::string bind_address = "0.0.0.0";
  // Optional bearer token for the inference port (a file, or an environment variable's name).
  std::string token_file;
  std::string token_env;
  int inference_port = 8000;
  int metrics_port = 8002;
  int io_threads = 2;
  int64_t max_header_bytes = int64_t{16} << 10;
  int64_t max_body_bytes = int64_t{64} << 20;
  // Bytes of request bodies held in memory at once, over every listener, with the stream answers
  // waiting for their client; past it a new body is refused (503) before it is read, and a
  // stream's answer is replaced by an error. 0: a quarter of what the process may use (its
  // cgroup's memory limit, else the machine's memory, or models.max_memory_bytes where that is
  // less), and never under max_body_bytes.
  int64_t max_buffered_body_bytes = 0;
  int max_json_depth = 64;
  int idle_timeout_s = 60;
  int request_timeout_s = 60;  // from a request's header to the end of its body
  // Open connections per listener, and from one client address; when either is reached the
  // oldest idle connection is closed to make room, and only when none is idle does a new one
  // get 503 and close.
  int64_t max_connections = 4096;
  int64_t max_connections_per_client = 1024;
  // After SIGTERM: how long the server reports not-ready while it still accepts and serves on
  // every listener, so that a load balancer (a Kubernetes Service's endpoints) stops routing to
  // it before it stops accepting; only then does the drain within shutdown_grace_s begin.
  int shutdown_delay_s = 5;
  int shutdown_grace_s = 30;
  // Triton's system shared-memory extension: clients may register POSIX shared-memory objects
  // that the server maps. Off by default, as Triton's --allow-client-shm: a client could name
  // any object the server's user can open, and read it out or overwrite it through a model.
  bool allow_shared_memory = false;
  // Serve the repository API's index, load and unload on the inference port too, where Triton's
  // clients send them. Needs the management token (the server refuses to start without one),
  // which those requests must then carry; off, they are answered 403 naming the management port.
  bool repository_on_inference_port = false;
};

// KServe v2 over gRPC (inference.GRPCInferenceService). The inference port's token
// (http.token_file/token_env) applies to it; its repository calls follow the management API's
// rules (its token when one is set, else callers on loopback only).
struct GrpcConfig {
  bool enabled = true;
  std::string bind_address = "0.0.0.0";
  int port = 8001;
  // The largest request message; larger ones are refused (RESOURCE_EXHAUSTED) before they are
  // read. As HTTP's max_body_bytes.
  int64_t max_message_bytes = int64_t{64} << 20;
  // The largest response message a client accepts is its own setting; the server sends up to
  // this (a larger answer fails with RESOURCE_EXHAUSTED instead of being cut).
  int64_t max_response_bytes = int64_t{256} << 20;
  // Requests of one ModelStreamInfer stream read and not yet answered: at this many the server
  // stops reading the stream until an answer is written, so a client that sends faster than it
  // reads (or than the model runs) is held back by flow control instead of queueing without
  // bound.
  int64_t max_stream_in_flight = 64;
  // HTTP/2 streams (calls) open at once on one connection.
  int64_t max_concurrent_streams = 1024;
  // Open connections on the listener, and from one client address (under the supervisor, whose
  // listener the server accepts on itself). Past either a new connection is closed at once:
  // gRPC cannot close an idle one to make room as HTTP does.
  int64_t max_connections = 4096;
  int64_t max_connections_per_client = 1024;
};

// The management API (model repository): closed by default. A bearer token is required
// whenever it listens on anything but loopback; the server refuses to start without one.
struct ManagementConfig {
  std::string bind_address = "127.0.0.1";
  int port = 8003;
  std::string token_file;  // a file holding the token (whitespace trimmed)
  std::string token_env;   // or the name of an environment variable holding it
  int64_t max_upload_bytes = int64_t{4} << 30;
  int upload_timeout_s = 3600;  // from an upload's header to the end of its body
};

struct VersionPolicy {
  std::string kind = "latest";    // latest, all or specific
  std::vector<int64_t> versions;  // for "specific"
};

struct ModelsConfig {
  std::string repository;  // <repository>/<name>/<version>/model.orochi
  // A model directory as KServe gives a runtime (/mnt/models): a repository or one .orochi
  // package, read but never written (see model_directory.h). Not with `repository`.
  std::string model_dir;
  std::string model_name;         // the name a model_dir's single package is served as
  std::vector<std::string> load;  // names to load at startup; "*" for all
  int64_t max_queue_size = 1024;  // waiting requests per model; more are refused (503)
  // Per-request deadline when the request sets none; 0: none. On by default: a request whose
  // input makes the model run for minutes must not hold a copy (and its client) forever.
  int64_t default_timeout_ms = 60000;
  // Resident memory at which new inference requests are refused (503, out_of_memory) until
  // running ones free some; 0: 90% of the cgroup's memory limit, else of the machine's memory.
  int64_t max_memory_bytes = 0;
  int64_t execution_grace_ms = 5000;  // after an interrupt, before a copy is replaced
  // How long loading a model version (its entry class's __init__ in every copy) may take before
  // it is interrupted and fails.
  int64_t load_timeout_s = 120;
  // Abandoned copies still running (stuck, each on a core) at which a model that gets one more
  // copy stuck is made unavailable.
  int64_t max_abandoned_copies = 4;
  // Unloading: how long a version's running requests may take to finish before they are
  // interrupted, and their copies abandoned if they ignore it.
  int64_t unload_grace_s = 30;
  // Streaming models: streams waiting for a copy (or a live-sequence place) per model; more
  // are refused (503 / RESOURCE_EXHAUSTED).
  int64_t max_queued_streams = 64;
  // Responses one stream holds for its client (written to the connection one at a time); when
  // they are all waiting, its generator or sequence is paused.
  int64_t stream_buffer_responses = 16;
  // How long a stream may stay paused by a full buffer (a client that reads nothing) before it
  // is ended with an error and its copy freed.
  int64_t stream_stall_timeout_ms = 30000;
  // Stateful models: a sequence with no request for this long is freed (its manifest's
  // sequence.idle_timeout_ms overrides it), and the most live sequences one copy holds (its
  // sequence.max_sequences_per_copy overrides it).
  int64_t sequence_idle_timeout_ms = 60000;
  int64_t max_sequences_per_copy = 256;
  int64_t max_queue_delay_us = 0;  // dynamic batching: how long a batch may wait to fill
  std::vector<int64_t> preferred_batch_sizes;
  std::map<std::string, VersionPolicy> version_policies;  // by model name; "latest" otherwise
  // "explicit": the repository API loads and unloads. "poll": every repository_poll_ms, the
  // server serves what the repository holds (several servers sharing one repository directory
  // follow each other's deploys and deletes), as Triton's poll mode.
  std::string model_control_mode = "explicit";
  int64_t repository_poll_ms = 15000;
};

struct LogConfig {
  std::string level = "info";   // debug, info, warning, error
  std::string format = "text";  // text or json
  // Which requests get a log line: "errors" (status >= 400; the default: a line for every
  // request wrote 21 MB in 5 minutes under load), "all", or "none". Metrics count them all.
  std::string requests = "errors";
};

struct PythonConfig {
  // Directories put on every copy's sys.path after the embedded stdlib, e.g. Debian's
  // /usr/lib/python3/dist-packages for numpy; their C extensions load through Orochi's loader.
  std::vector<std::string> site_packages;
};

struct EngineConfig {
  // The engine's intra-op pool (engine/threads.h SetIntraOpThreads): the cores one process's tensor
  // calls may use together. A call spreads over the cores no busy copy holds; with one busy copy
  // per core each call runs on its copy's thread alone. 0: every core; 1: every call on its
  // copy's thread.
  int intra_op_threads = 0;
};

// The supervisor process (supervisor.h) that restarts the serving process when model code
// crashes it.
struct SupervisorConfig {
  bool enabled = true;
  // A model version that crashed the serving process this many times within the window is
  // not loaded again by the restarts (quarantined).
  int64_t max_model_crashes = 3;
  int64_t crash_window_s = 600;
  // A serving process that served and then leaves one of its ports unanswered this long (the
  // supervisor asks each port every second) is killed and restarted on fresh listeners. 0: off.
  int64_t liveness_timeout_s = 5;
  // Processes model code may have at once (what it forks or spawns, and their descendants):
  // past it the youngest are killed within a second. Half the user's process limit or the
  // container's pids limit, if lower, bounds it too. 0: no bound.
  int64_t max_model_processes = 256;
};

struct ServerConfig {
  HttpConfig http;
  GrpcConfig grpc;
  SupervisorConfig supervisor;
  ManagementConfig management;
  ModelsConfig models;
  LogConfig log;
  PythonConfig python;
  EngineConfig engine;
  int copies = 0;  // interpreter copies; 0: one per core
};

// Parses `text` (the contents of a config file) over the defaults.
Result<ServerConfig> ParseServerConfig(std::string_view text);
Result<ServerConfig> LoadServerConfig(const std::string& path);
// Checks values that depend on each other (ports distinct, ...).
Status ValidateServerConfig(const ServerConfig& config);

}  // namespace orochi::server
