// safetensors: round trips, zero-copy loading, and every malformed case named.
#include "orochi/engine/safetensors.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "engine_test_support.h"
#include "orochi/base/process_memory.h"

namespace orochi::engine {
namespace {

using testing::HasSubstr;

class SafetensorsTest : public testing::Test {
 protected:
  void SetUp() override {
    directory_ =
        std::filesystem::temp_directory_path() / ("orochi-safetensors-" + std::to_string(getpid()));
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }

  std::string Path(const std::string& name) const { return (directory_ / name).string(); }

  // A file with the given header text and data, and a header length that may lie.
  std::string WriteRaw(const std::string& name, const std::string& header, size_t data_bytes,
                       std::optional<uint64_t> claimed_length = std::nullopt) {
    std::string path = Path(name);
    std::ofstream file(path, std::ios::binary);
    uint64_t length = claimed_length.value_or(header.size());
    file.write(reinterpret_cast<const char*>(&length), 8);
    file << header;
    file << std::string(data_bytes, '\0');
    return path;
  }

  std::string LoadError(const std::string& path) {
    Result<SafetensorsContents> contents = LoadSafetensors(path);
    EXPECT_FALSE(contents.ok()) << path;
    return contents.ok() ? "" : contents.status().message();
  }

  std::filesystem::path directory_;
};

TEST_F(SafetensorsTest, RoundTripsEveryDTypeAndStridedTensors) {
  std::map<std::string, Tensor> tensors;
  for (int i = 0; i < kDTypeCount; ++i) {
    auto dtype = static_cast<DType>(i);
    tensors["t_" + std::string(DTypeName(dtype))] = RandomTensor({3, 4}, dtype, -4, 4, i);
  }
  tensors["strided"] = RandomTensor({4, 5}, DType::kFloat32).Transpose(0, 1);
  tensors["scalar"] = Scalar(2.5, DType::kFloat64);
  tensors["empty"] = Zeros({0, 3});
  ASSERT_TRUE(SaveSafetensors(Path("model.safetensors"), tensors, {{"format", "pt"}}).ok());

  Result<SafetensorsContents> loaded = LoadSafetensors(Path("model.safetensors"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->metadata.at("format"), "pt");
  ASSERT_EQ(loaded->tensors.size(), tensors.size());
  for (const auto& [name, original] : tensors) {
    const Tensor& copy = loaded->tensors.at(name);
    EXPECT_EQ(copy.dtype(), original.dtype()) << name;
    EXPECT_EQ(copy.shape(), original.shape()) << name;
    EXPECT_TRUE(copy.read_only()) << name;
    for (int64_t i = 0; i < original.numel(); ++i) {
      ASSERT_EQ(copy.ItemAsDouble(i), original.ItemAsDouble(i)) << name << " element " << i;
    }
  }
  // Zero copy: the tensors view the one mapping of the file.
  EXPECT_EQ(loaded->tensors.at("t_float32").storage().get(),
            loaded->tensors.at("t_int64").storage().get());
  Tensor weights = loaded->tensors.at("t_float32");
  EXPECT_THROW(weights.mutable_data(), Error);
  EXPECT_NEAR(Binary(Op::mul, weights, Scalar(2, DType::kFloat32)).ItemAsDouble(0),
              2 * weights.ItemAsDouble(0), 1e-6);  // reading is fine
}

// Saving over the file that loaded tensors map (a script that edits its weights in place) must
// leave those tensors readable: truncating the mapped file would make reading them SIGBUS.
TEST_F(SafetensorsTest, SavingOverTheLoadedFileKeepsLoadedTensorsValid) {
  const std::string path = Path("weights.safetensors");
  ASSERT_TRUE(SaveSafetensors(path, {{"w", RandomTensor({256, 64}, DType::kFloat32)}}).ok());
  Result<SafetensorsContents> loaded = LoadSafetensors(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Tensor old_weights = loaded->tensors.at("w");
  const double last = old_weights.ItemAsDouble(old_weights.numel() - 1);

  ASSERT_TRUE(SaveSafetensors(path, {{"small", Scalar(1, DType::kInt64)}}).ok());
  EXPECT_EQ(old_weights.ItemAsDouble(old_weights.numel() - 1), last);
  Result<SafetensorsContents> reloaded = LoadSafetensors(path);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().ToString();
  EXPECT_EQ(reloaded->tensors.size(), 1U);
  EXPECT_EQ(reloaded->tensors.at("small").ItemAsDouble(0), 1);
  // Nothing is left beside the file, and a failed save says why and changes nothing.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(directory_), {}), 1);
  Status failed = SaveSafetensors(Path("missing/weights.safetensors"), {{"w", old_weights}});
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.message(), HasSubstr("No such file or directory"));
}

TEST_F(SafetensorsTest, RejectsEachMalformedFileByName) {
  {
    std::ofstream(Path("short")) << "abc";
    EXPECT_THAT(LoadError(Path("short")), HasSubstr("truncated: 3 bytes"));
  }
  EXPECT_THAT(LoadError(WriteRaw("long_header", "{}", 0, 4096)),
              HasSubstr("header length 4096 runs past the end of the file"));
  EXPECT_THAT(LoadError(WriteRaw("bad_json", "{\"a\": [", 0)), HasSubstr("not valid JSON"));
  EXPECT_THAT(LoadError(WriteRaw("not_object", "[1, 2]", 0)), HasSubstr("not a JSON object"));
  EXPECT_THAT(
      LoadError(WriteRaw(
          "dtype", R"({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", 2)),
      HasSubstr("tensor 'w' has unknown dtype 'F8_E4M3'"));
  EXPECT_THAT(LoadError(WriteRaw(
                  "range", R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8)),
              HasSubstr("tensor 'w' has data_offsets [0, 16] outside the data (8 bytes)"));
  EXPECT_THAT(LoadError(WriteRaw("overlap", R"({
      "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                 12)),
              HasSubstr("tensors 'a' and 'b' overlap"));
  EXPECT_THAT(
      LoadError(WriteRaw(
          "size", R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 20)),
      HasSubstr("tensor 'w': shape [2, 3] of float32 needs 24 bytes, but data_offsets give 20"));
  EXPECT_THAT(LoadError(WriteRaw(
                  "hole", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8)),
              HasSubstr("data bytes [0, 4) belong to no tensor"));
  EXPECT_THAT(LoadError(WriteRaw(
                  "tail", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 12)),
              HasSubstr("data bytes [4, 12) belong to no tensor"));
  EXPECT_THAT(LoadError(WriteRaw("fields", R"({"w": {"dtype": "F32", "shape": [1]}})", 4)),
              HasSubstr("tensor 'w' needs \"data_offsets\""));
  EXPECT_THAT(
      LoadError(WriteRaw("negative",
                         R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4)),
      HasSubstr("shape that is not all sizes"));
  // Sizes whose byte count wraps around 64 bits (2^62 float32s are "0 bytes") or that do not
  // fit int64 are refused, not taken as small tensors whose reads leave the file.
  EXPECT_THAT(LoadError(WriteRaw("wraps", R"({
      "w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]},
      "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                                 4)),
              HasSubstr("tensor 'w' has a shape whose size does not fit in 64 bits"));
  EXPECT_THAT(LoadError(WriteRaw("square", R"({"w": {"dtype": "F32",
      "shape": [1099511627776, 1099511627776], "data_offsets": [0, 4]}})",
                                 4)),
              HasSubstr("tensor 'w' has a shape whose size does not fit in 64 bits"));
  // No elements, but a first stride of 2^64 (a 0 counts as 1 in strides).
  EXPECT_THAT(LoadError(WriteRaw("strides", R"({"w": {"dtype": "F32",
      "shape": [0, 4611686018427387904, 4], "data_offsets": [0, 0]},
      "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                                 4)),
              HasSubstr("tensor 'w' has a shape whose strides do not fit in 64 bits"));
  EXPECT_THAT(LoadError(WriteRaw("unsigned", R"({"w": {"dtype": "F32",
      "shape": [18446744073709551615], "data_offsets": [0, 4]}})",
                                 4)),
              HasSubstr("shape that is not all sizes"));
  std::string ones = "1";
  for (int i = 0; i < 64; ++i) ones += ", 1";  // 65 dims
  EXPECT_THAT(
      LoadError(WriteRaw(
          "rank", R"({"w": {"dtype": "F32", "shape": [)" + ones + R"(], "data_offsets": [0, 4]}})",
          4)),
      HasSubstr("tensor 'w' has 65 dimensions, more than the 64"));
  Result<SafetensorsContents> missing = LoadSafetensors(Path("does-not-exist"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// A 1 GiB file maps in milliseconds and costs no resident memory until its data is read.
TEST_F(SafetensorsTest, LoadingAGigabyteReadsNothingUpFront) {
  constexpr int64_t kElements = int64_t{1} << 28;  // 1 GiB of float32
  std::string header = R"({"big": {"dtype": "F32", "shape": [)" + std::to_string(kElements) +
                       R"(], "data_offsets": [0, )" + std::to_string(kElements * 4) + "]}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string path = WriteRaw("big.safetensors", header, 0);
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(8 + header.size() + kElements * 4)), 0);

  const int64_t resident_before = ProcessStatusKiB("VmRSS");
  auto start = std::chrono::steady_clock::now();
  Result<SafetensorsContents> loaded = LoadSafetensors(path);
  auto elapsed = std::chrono::steady_clock::now() - start;
  const int64_t resident_after = ProcessStatusKiB("VmRSS");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  std::printf("1 GiB safetensors: loaded in %.3f ms, resident +%ld KB\n",
              std::chrono::duration<double, std::milli>(elapsed).count(),
              resident_after - resident_before);
  EXPECT_EQ(loaded->tensors.at("big").numel(), kElements);
  EXPECT_LT(resident_after - resident_before, 4 * 1024) << "loading must not read the data";
  EXPECT_EQ(loaded->tensors.at("big").ItemAsDouble(kElements - 1), 0.0);  // the read maps a page
}

}  // namespace
}  // namespace orochi::engine
