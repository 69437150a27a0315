// The KServe v2 JSON codec on a large request and response: time and peak memory of the
// server's codec against reading and writing the same bodies through a JSON document
// (nlohmann::json, what the server did before), measured in the same run.
//
//   bench_codec [values]   (default 4000000 FP32 values, a body of about 40 MB)
//
// Each measurement runs in a forked child, so that its peak resident memory (VmHWM) is its
// own: the figure is the growth over the child's memory at the start, the body included in
// neither. Times are the best of three.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "orochi/base/process_memory.h"
#include "orochi/engine/tensor.h"
#include "orochi/server/kserve_codec.h"

namespace {

using orochi::engine::DType;
using orochi::engine::Tensor;
using orochi::packaging::DataType;
namespace kserve = orochi::server::kserve;

struct Measurement {
  double seconds = 0;
  double peak_mib = 0;
};

// Runs `work` three times in a child process; the best time and the memory peak come back.
Measurement InChild(const std::function<void()>& work) {
  int pipe_ends[2];
  if (pipe(pipe_ends) != 0) std::abort();
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_ends[0]);
    const int64_t start_kib = orochi::ProcessStatusKiB("VmRSS");
    double best = 1e9;
    for (int run = 0; run < 3; ++run) {
      const auto start = std::chrono::steady_clock::now();
      work();
      best = std::min(
          best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    Measurement result{best,
                       static_cast<double>(orochi::ProcessStatusKiB("VmHWM") - start_kib) / 1024};
    if (write(pipe_ends[1], &result, sizeof(result)) != sizeof(result)) _exit(1);
    _exit(0);
  }
  close(pipe_ends[1]);
  Measurement result;
  const bool read_all = read(pipe_ends[0], &result, sizeof(result)) == sizeof(result);
  close(pipe_ends[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (!read_all || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "a measurement failed\n");
    std::exit(1);
  }
  return result;
}

orochi::packaging::Manifest Manifest(int64_t values) {
  orochi::packaging::Manifest manifest;
  manifest.name = "bench";
  manifest.inputs = {{"x", DataType::kFp32, {values}}};
  manifest.outputs = {{"y", DataType::kFp32, {values}}};
  return manifest;
}

std::string Body(const std::vector<float>& values, bool data_first) {
  std::string data = "[";
  char number[32];
  for (size_t i = 0; i < values.size(); ++i) {
    std::snprintf(number, sizeof(number), "%s%.7g", i > 0 ? "," : "", values[i]);
    data += number;
  }
  data += "]";
  const std::string header =
      R"("name":"x","datatype":"FP32","shape":[)" + std::to_string(values.size()) + "]";
  const std::string input = data_first ? R"({"data":)" + data + "," + header + "}"
                                       : "{" + header + R"(,"data":)" + data + "}";
  return R"({"id":"bench","inputs":[)" + input + "]}";
}

// The document way: parse the whole body, then copy the values into a tensor.
void ReadThroughDocument(const std::string& body, int64_t values) {
  const nlohmann::json document = nlohmann::json::parse(body);
  const nlohmann::json& data = document["inputs"][0]["data"];
  std::vector<const nlohmann::json*> leaves;
  leaves.reserve(data.size());
  for (const nlohmann::json& value : data) leaves.push_back(&value);
  Tensor tensor = Tensor::Empty({values}, DType::kFloat32);
  float* out = tensor.mutable_data_as<float>();
  for (const nlohmann::json* leaf : leaves) *out++ = static_cast<float>(leaf->get<double>());
}

void WriteThroughDocument(const Tensor& tensor) {
  nlohmann::json data = nlohmann::json::array();
  const float* values = tensor.data_as<float>();
  for (int64_t i = 0; i < tensor.numel(); ++i) data.push_back(static_cast<double>(values[i]));
  nlohmann::json response{{"model_name", "bench"},
                          {"model_version", "1"},
                          {"outputs",
                           {{{"name", "y"},
                             {"datatype", "FP32"},
                             {"shape", {tensor.numel()}},
                             {"data", std::move(data)}}}}};
  const std::string body = response.dump();
  if (body.empty()) std::abort();
}

void Print(const char* what, const Measurement& measured, const Measurement& baseline) {
  std::printf("%-34s %8.1f ms %8.1f MiB   time %5.2fx  memory %5.2fx of the document's\n", what,
              measured.seconds * 1e3, measured.peak_mib, measured.seconds / baseline.seconds,
              measured.peak_mib / std::max(baseline.peak_mib, 1e-9));
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t count = argc > 1 ? std::atoll(argv[1]) : 4000000;
  std::mt19937 random(7);
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = normal(random);
  const orochi::packaging::Manifest manifest = Manifest(count);
  const std::string body = Body(values, /*data_first=*/false);
  const std::string data_first = Body(values, /*data_first=*/true);
  std::printf("request: %lld FP32 values, %.1f MiB of JSON; tensor %.1f MiB\n",
              static_cast<long long>(count), static_cast<double>(body.size()) / (1 << 20),
              static_cast<double>(count) * 4 / (1 << 20));

  const Measurement document_read = InChild([&] { ReadThroughDocument(body, count); });
  auto parse = [&](const std::string& text) {
    auto parsed = kserve::ParseInferRequest(manifest, text, std::nullopt, {});
    if (!parsed.ok()) {
      std::fprintf(stderr, "%s\n", parsed.status().ToString().c_str());
      std::abort();
    }
  };
  const Measurement codec_read = InChild([&] { parse(body); });
  const Measurement codec_read_data_first = InChild([&] { parse(data_first); });
  Print("read: document (baseline)", document_read, document_read);
  Print("read: codec, name/shape first", codec_read, document_read);
  Print("read: codec, data first", codec_read_data_first, document_read);

  Tensor output = Tensor::Empty({count}, DType::kFloat32);
  std::copy(values.begin(), values.end(), output.mutable_data_as<float>());
  const std::vector<orochi::interpreters::NamedTensor> outputs = {{"y", output}};
  const Measurement document_write = InChild([&] { WriteThroughDocument(output); });
  const Measurement codec_write = InChild([&] {
    const kserve::EncodedResponse encoded =
        kserve::EncodeInferResponse(manifest, kserve::InferRequest{}, outputs);
    if (encoded.body.empty()) std::abort();
  });
  Print("write: document (baseline)", document_write, document_write);
  Print("write: codec", codec_write, document_write);
  return 0;
}
