// The server's configuration file: the shipped config/orochi.json is exactly the defaults, and
// every bad value is refused with its JSON path.
#include "orochi/server/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace orochi::server {
namespace {

using ::testing::HasSubstr;

TEST(ServerConfig, TheShippedFileHoldsTheDefaults) {
  Result<ServerConfig> shipped = LoadServerConfig(OROCHI_SOURCE_DIR "/config/orochi.json");
  ASSERT_TRUE(shipped.ok()) << shipped.status().ToString();
  const ServerConfig defaults;
  EXPECT_EQ(shipped->copies, defaults.copies);
  EXPECT_EQ(shipped->engine.intra_op_threads, defaults.engine.intra_op_threads);
  EXPECT_EQ(shipped->http.bind_address, defaults.http.bind_address);
  EXPECT_EQ(shipped->http.inference_port, defaults.http.inference_port);
  EXPECT_EQ(shipped->http.metrics_port, defaults.http.metrics_port);
  EXPECT_EQ(shipped->http.io_threads, defaults.http.io_threads);
  EXPECT_EQ(shipped->http.max_header_bytes, defaults.http.max_header_bytes);
  EXPECT_EQ(shipped->http.max_body_bytes, defaults.http.max_body_bytes);
  EXPECT_EQ(shipped->http.max_json_depth, defaults.http.max_json_depth);
  EXPECT_EQ(shipped->http.idle_timeout_s, defaults.http.idle_timeout_s);
  EXPECT_EQ(shipped->http.shutdown_delay_s, defaults.http.shutdown_delay_s);
  EXPECT_EQ(shipped->http.shutdown_grace_s, defaults.http.shutdown_grace_s);
  EXPECT_EQ(shipped->http.max_connections, defaults.http.max_connections);
  EXPECT_EQ(shipped->http.max_connections_per_client, defaults.http.max_connections_per_client);
  EXPECT_EQ(shipped->http.request_timeout_s, defaults.http.request_timeout_s);
  EXPECT_EQ(shipped->grpc.max_connections, defaults.grpc.max_connections);
  EXPECT_EQ(shipped->grpc.max_connections_per_client, defaults.grpc.max_connections_per_client);
  EXPECT_EQ(shipped->management.upload_timeout_s, defaults.management.upload_timeout_s);
  EXPECT_EQ(shipped->models.load_timeout_s, defaults.models.load_timeout_s);
  EXPECT_EQ(shipped->models.max_memory_bytes, defaults.models.max_memory_bytes);
  EXPECT_EQ(shipped->models.repository, defaults.models.repository);
  EXPECT_EQ(shipped->models.model_dir, defaults.models.model_dir);
  EXPECT_EQ(shipped->models.model_name, defaults.models.model_name);
  EXPECT_EQ(shipped->models.load, defaults.models.load);
  EXPECT_EQ(shipped->models.max_queue_size, defaults.models.max_queue_size);
  EXPECT_EQ(shipped->models.default_timeout_ms, defaults.models.default_timeout_ms);
  EXPECT_EQ(shipped->models.execution_grace_ms, defaults.models.execution_grace_ms);
  EXPECT_EQ(shipped->models.sequence_idle_timeout_ms, defaults.models.sequence_idle_timeout_ms);
  EXPECT_EQ(shipped->models.max_sequences_per_copy, defaults.models.max_sequences_per_copy);
  EXPECT_EQ(shipped->models.max_abandoned_copies, defaults.models.max_abandoned_copies);
  EXPECT_EQ(shipped->models.unload_grace_s, defaults.models.unload_grace_s);
  EXPECT_EQ(shipped->models.max_queue_delay_us, defaults.models.max_queue_delay_us);
  EXPECT_EQ(shipped->models.preferred_batch_sizes, defaults.models.preferred_batch_sizes);
  EXPECT_EQ(shipped->models.model_control_mode, defaults.models.model_control_mode);
  EXPECT_EQ(shipped->models.repository_poll_ms, defaults.models.repository_poll_ms);
  EXPECT_EQ(shipped->log.level, defaults.log.level);
  EXPECT_EQ(shipped->log.format, defaults.log.format);
  EXPECT_EQ(shipped->log.requests, defaults.log.requests);
  EXPECT_EQ(shipped->management.bind_address, defaults.management.bind_address);
  EXPECT_EQ(shipped->management.port, defaults.management.port);
  EXPECT_EQ(shipped->management.max_upload_bytes, defaults.management.max_upload_bytes);
  EXPECT_EQ(shipped->management.token_file, defaults.management.token_file);
  EXPECT_EQ(shipped->management.token_env, defaults.management.token_env);
  EXPECT_EQ(shipped->http.token_file, defaults.http.token_file);
  EXPECT_EQ(shipped->http.repository_on_inference_port, defaults.http.repository_on_inference_port);
  EXPECT_TRUE(shipped->models.version_policies.empty());
}

TEST(ServerConfig, ValuesOverrideDefaults) {
  Result<ServerConfig> config = ParseServerConfig(
      R"({"copies": 4, "http": {"inference_port": 9000, "_note": "ignored"},
          "models": {"load": ["a", "b"], "preferred_batch_sizes": [4, 8]},
          "log": {"format": "json"}})");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->copies, 4);
  EXPECT_EQ(config->http.inference_port, 9000);
  EXPECT_EQ(config->http.metrics_port, 8002);
  EXPECT_EQ(config->models.load, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(config->models.preferred_batch_sizes, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(config->log.format, "json");
  config = ParseServerConfig(R"({"models": {"model_dir": "/mnt/models", "model_name": "iris"}})");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->models.model_dir, "/mnt/models");
  EXPECT_EQ(config->models.model_name, "iris");
}

TEST(ServerConfig, EachBadValueNamesItsKey) {
  const std::pair<const char*, const char*> cases[] = {
      {"[1]", "config: $: expected an object"},
      {"{nope", "config: $: not valid JSON"},
      {R"({"htp": {}})", "config: $.htp: unknown key"},
      {R"({"http": {"port": 1}})", "config: $.http.port: unknown key"},
      {R"({"http": {"inference_port": 70000}})",
       "config: $.http.inference_port: expected an integer from 0 to 65535, got 70000"},
      {R"({"http": {"max_body_bytes": "big"}})",
       "config: $.http.max_body_bytes: expected an integer"},
      {R"({"http": {"max_connections": 0}})",
       "config: $.http.max_connections: expected an integer from 1 to 1000000, got 0"},
      // A header field past 65535 bytes is more than Beast's field table indexes: it threw.
      {R"({"http": {"max_header_bytes": 65536}})",
       "config: $.http.max_header_bytes: expected an integer from 1024 to 65535, got 65536"},
      {R"({"http": {"request_timeout_s": 0}})",
       "config: $.http.request_timeout_s: expected an integer from 1 to 86400, got 0"},
      {R"({"models": {"load_timeout_s": 0}})",
       "config: $.models.load_timeout_s: expected an integer from 1 to 86400, got 0"},
      {R"({"copies": -1})", "config: $.copies: expected an integer from 0 to 1024, got -1"},
      {R"({"engine": {"intra_op_threads": "auto"}})",
       "config: $.engine.intra_op_threads: expected an integer from 0 to 1024, got \"auto\""},
      {R"({"models": {"load": "all"}})", "config: $.models.load: expected an array of strings"},
      {R"({"http": {"shutdown_delay_s": 3601}})",
       "config: $.http.shutdown_delay_s: expected an integer from 0 to 3600, got 3601"},
      {R"({"models": {"unload_grace_s": -1}})",
       "config: $.models.unload_grace_s: expected an integer from 0 to 86400, got -1"},
      {R"({"models": {"preferred_batch_sizes": [0]}})",
       "config: $.models.preferred_batch_sizes: expected integers >= 1"},
      {R"({"log": {"format": "xml"}})",
       "config: $.log.format: expected one of text, json, got 'xml'"},
      {R"({"http": {"inference_port": 9000, "metrics_port": 9000}})",
       "config: $: the inference, gRPC, management and metrics ports must differ"},
      {R"({"management": {"port": 8000}})",
       "config: $: the inference, gRPC, management and metrics ports must differ (8000 is given "
       "twice)"},
      {R"({"grpc": {"port": 8002}})",
       "config: $: the inference, gRPC, management and metrics ports must differ (8002 is given "
       "twice)"},
      {R"({"grpc": {"max_stream_in_flight": 0}})",
       "config: $.grpc.max_stream_in_flight: expected an integer from 1 to 65536, got 0"},
      {R"({"grpc": {"max_connections": 0}})",
       "config: $.grpc.max_connections: expected an integer from 1 to 1000000, got 0"},
      {R"({"grpc": {"max_connections_per_client": 2000000}})",
       "config: $.grpc.max_connections_per_client: expected an integer from 1 to 1000000, got "
       "2000000"},
      {R"({"grpc": {"compression": "gzip"}})", "config: $.grpc.compression: unknown key"},
      {R"({"models": {"version_policies": {"m": {"policy": "specific"}}}})",
       "config: $.models.version_policies.m.versions: the 'specific' policy needs a non-empty "
       "list of versions"},
      {R"({"models": {"version_policies": {"m": {"policy": "newest"}}}})",
       "config: $.models.version_policies.m.policy: expected one of latest, all, specific"},
      {R"({"models": {"model_control_mode": "none"}})",
       "config: $.models.model_control_mode: expected one of explicit, poll"},
      {R"({"models": {"repository": "/r", "repository_poll_ms": 10}})",
       "config: $.models.repository_poll_ms: expected an integer from 100 to 86400000, got 10"},
      {R"({"models": {"model_control_mode": "poll", "repository": "/r", "load": ["a"]}})",
       "config: $.models.load: must be empty (or [\"*\"]) with model_control_mode \"poll\""},
      {R"({"models": {"model_control_mode": "poll"}})",
       "config: $.models.repository: model_control_mode \"poll\" needs a repository"},
      {R"({"models": {"repository": "/models", "model_dir": "/mnt/models"}})",
       "config: $.models: model_dir and repository are both set"},
      {R"({"models": {"model_name": "iris"}})",
       "config: $.models.model_name: names the package of a model_dir, and none is set"},
      {R"({"models": {"model_dir": 1}})", "config: $.models.model_dir: expected a string"},
  };
  for (const auto& [text, message] : cases) {
    Result<ServerConfig> config = ParseServerConfig(text);
    ASSERT_FALSE(config.ok()) << text;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr(message)) << text;
  }
  EXPECT_EQ(LoadServerConfig("/nonexistent/orochi.json").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace orochi::server
