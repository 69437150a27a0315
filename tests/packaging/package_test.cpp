// The zip reader and writer, the manifest schema and Package::Open, at the unit level. (The
// hostile-archive suite drives the real binary: test_package_commands.py.)
#include "orochi/packaging/package.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "orochi/engine/ops.h"
#include "orochi/packaging/manifest.h"
#include "orochi/packaging/zip.h"
#include "package_test_support.h"

namespace orochi::packaging {
namespace {

using ::testing::HasSubstr;

constexpr const char* kIo = R"([{"name": "x", "datatype": "FP32", "shape": [-1]}])";
constexpr const char* kModel = "class Model:\n    def __init__(self, context):\n        pass\n";

TEST(Zip, WritesDeterministicArchivesThatReadBack) {
  TempDir directory;
  std::vector<ZipEntry> entries{{"a.txt", std::string(1000, 'a'), false},
                                {"weights/w.safetensors", "0123456789", true}};
  ASSERT_TRUE(WriteZip(directory / "one.zip", entries).ok());
  ASSERT_TRUE(WriteZip(directory / "two.zip", entries).ok());
  auto one = ZipReader::Open(directory / "one.zip");
  auto two = ZipReader::Open(directory / "two.zip");
  ASSERT_TRUE(one.ok() && two.ok());
  ASSERT_EQ((*one)->file()->size(), (*two)->file()->size());
  EXPECT_EQ(std::memcmp((*one)->file()->data(), (*two)->file()->data(), (*one)->file()->size()), 0);
  const ZipMember* text = (*one)->Find("a.txt");
  ASSERT_NE(text, nullptr);
  EXPECT_FALSE(text->stored);
  EXPECT_LT(text->compressed_size, 100U);
  EXPECT_EQ(*(*one)->Read(*text), std::string(1000, 'a'));
  const ZipMember* stored = (*one)->Find("weights/w.safetensors");
  ASSERT_NE(stored, nullptr);
  EXPECT_TRUE(stored->stored);
  EXPECT_EQ(stored->data_offset % 64, 0U) << "stored members are aligned for mapping";
  EXPECT_EQ(*(*one)->Read(*stored), "0123456789");
}

TEST(Zip, LimitsAreSettings) {
  TempDir directory;
  std::vector<ZipEntry> entries{{"big.bin", std::string(5000, 'x'), true},
                                {"more.bin", std::string(5000, 'y'), true}};
  ASSERT_TRUE(WriteZip(directory / "a.zip", entries).ok());
  ZipLimits member_limit;
  member_limit.max_member_bytes = 4096;
  EXPECT_THAT(
      ZipReader::Open(directory / "a.zip", member_limit).status().message(),
      HasSubstr("member 'big.bin': uncompressed size 5000 bytes is over the limit of 4096"));
  ZipLimits total_limit;
  total_limit.max_total_bytes = 8000;
  EXPECT_THAT(
      ZipReader::Open(directory / "a.zip", total_limit).status().message(),
      HasSubstr("member 'more.bin': the members' total uncompressed size passes the limit"));
  ZipLimits count_limit;
  count_limit.max_members = 1;
  EXPECT_THAT(ZipReader::Open(directory / "a.zip", count_limit).status().message(),
              HasSubstr("2 members, over the limit of 1"));
  EXPECT_EQ(ZipReader::Open(directory / "missing.zip").status().code(), StatusCode::kNotFound);
}

TEST(Zip, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8("héllo wörld ✓ 🐍"));
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe2\x82"));          // truncated
}

TEST(Manifest, ParsesTheFullSchema) {
  Result<Manifest> manifest = ParseManifest(
      R"({"format_version": 1, "name": "resnet-18", "version": 3, "entry": "pkg.model:Net.Inner",
          "description": "d", "inputs": [{"name": "image", "datatype": "FP32", "shape": [3, -1, -1]}],
          "outputs": [{"name": "label", "datatype": "BYTES", "shape": [1]}],
          "max_batch_size": 16, "instances": 2, "device": "cuda:1", "requires": ["numpy", "a.b"],
          "parameters": {"top_k": 5, "normalise": true}})");
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  EXPECT_EQ(manifest->name, "resnet-18");
  EXPECT_EQ(manifest->version, 3);
  EXPECT_EQ(manifest->entry_module, "pkg.model");
  EXPECT_EQ(manifest->entry_class, "Net.Inner");
  EXPECT_EQ(manifest->inputs[0].shape, (std::vector<int64_t>{3, -1, -1}));
  EXPECT_EQ(manifest->outputs[0].datatype, DataType::kBytes);
  EXPECT_EQ(manifest->max_batch_size, 16);
  EXPECT_EQ(manifest->instances, 2);
  EXPECT_EQ(manifest->device, "cuda:1");
  EXPECT_EQ(manifest->required_modules, (std::vector<std::string>{"numpy", "a.b"}));
  EXPECT_EQ(manifest->parameters_json, R"({"normalise":true,"top_k":5})");
  EXPECT_EQ(EngineDType(DataType::kBf16), engine::DType::kBFloat16);
  EXPECT_EQ(EngineDType(DataType::kBytes), std::nullopt);
}

TEST(Manifest, EachProblemIsReportedWithItsJsonPath) {
  const std::string base = R"("format_version": 1, "name": "m", "version": 1, "entry": "a:B", )";
  const std::string io = R"("inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}], )"
                         R"("outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}])";
  struct Case {
    std::string json;
    std::string message;
  };
  const Case cases[] = {
      {"[]", "$: expected a JSON object, got array"},
      {"{" + base + io + R"(, "extra": 1})", "$.extra: unknown key"},
      {R"({"name": "m"})", "$: missing required key 'format_version'"},
      {"{" + base + R"("inputs": [], )" + io.substr(io.find("\"outputs\"")) + "}",
       "$.inputs: expected a non-empty array"},
      {R"({"format_version": 2, "name": "m", "version": 1, "entry": "a:B", )" + io + "}",
       "$.format_version: this Orochi reads format version 1, got 2"},
      {R"({"format_version": 1, "name": "../m", "version": 1, "entry": "a:B", )" + io + "}",
       "$.name: '../m' is not a valid model name"},
      {R"({"format_version": 1, "name": "m", "version": 9223372036854775808, "entry": "a:B", )" +
           io + "}",
       "$.version: expected an integer that fits in 64 bits, got 9223372036854775808"},
      {R"({"format_version": 1, "name": "m", "version": 0, "entry": "a:B", )" + io + "}",
       "$.version: expected an integer >= 1, got 0"},
      {R"({"format_version": 1, "name": "m", "version": 1, "entry": "a.b", )" + io + "}",
       "$.entry: expected 'module:Class'"},
      {"{" + base + R"("inputs": [{"name": "x", "datatype": "UINT32", "shape": [1]}], )" +
           io.substr(io.find("\"outputs\"")) + "}",
       "$.inputs[0].datatype: unknown datatype 'UINT32' (UINT16, UINT32 and UINT64 have no "
       "engine dtype)"},
      {"{" + base + R"("inputs": [{"name": "x", "datatype": "FP32", "shape": [1, "2"]}], )" +
           io.substr(io.find("\"outputs\"")) + "}",
       "$.inputs[0].shape[1]: expected an integer >= 1 or -1, got \"2\""},
      {"{" + base +
           R"("inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}, )"
           R"({"name": "x", "datatype": "FP32", "shape": [1]}], )" +
           io.substr(io.find("\"outputs\"")) + "}",
       "$.inputs[1].name: duplicate tensor name 'x'"},
      {"{" + base + io + R"(, "device": "tpu"})", "$.device: expected 'cpu', 'cuda' or 'cuda:N'"},
      {"{" + base + io + R"(, "requires": "numpy"})",
       "$.requires: expected an array of Python module names, got string"},
      {"{" + base + io + R"(, "requires": ["numpy", "../x"]})",
       "$.requires[1]: expected a Python module name such as 'numpy', got \"../x\""},
      {"{" + base + io + R"(, "requires": ["numpy", "numpy"]})",
       "$.requires[1]: 'numpy' is listed twice"},
      {"{" + base + io + R"(, "max_batch_size": -1})",
       "$.max_batch_size: expected an integer >= 0"},
      {"{" + base + io + R"(, "parameters": {"k": [1]}})",
       "$.parameters.k: expected a string, number or boolean, got array"},
      {"{" + base + io + R"(, "streaming": "yes"})", "$.streaming: expected true or false"},
      {"{" + base + io + R"(, "streaming": true, "max_batch_size": 8})",
       "$.max_batch_size: a streaming model takes no batch dimension"},
      {"{" + base + io + R"(, "max_live_sequences": 4})",
       "$.max_live_sequences: only a streaming model"},
      {"{" + base + io + R"(, "streaming": true, "max_live_sequences": 0})",
       "$.max_live_sequences: expected an integer >= 1"},
      {"{" + base + io + R"(, "sequence": 60})", "$.sequence: expected an object"},
      {"{" + base + io + R"(, "sequence": {"idle": 5}})", "$.sequence.idle: unknown key"},
      {"{" + base + io + R"(, "sequence": {"idle_timeout_ms": 0}})",
       "$.sequence.idle_timeout_ms: expected an integer >= 1"},
      {"{" + base + io + R"(, "sequence": {"max_sequences_per_copy": 0}})",
       "$.sequence.max_sequences_per_copy: expected an integer >= 1"},
      {"{" + base + io + R"(, "sequence": {}, "streaming": true})",
       "$.sequence: a streaming model cannot also be stateful"},
      {"{" + base + io + R"(, "sequence": {}, "max_batch_size": 4})",
       "$.max_batch_size: a stateful model (\"sequence\") runs each request alone"},
  };
  for (const Case& test : cases) {
    Result<Manifest> manifest = ParseManifest(test.json);
    ASSERT_FALSE(manifest.ok()) << test.json;
    EXPECT_EQ(manifest.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(manifest.status().message(), HasSubstr(test.message)) << test.json;
    EXPECT_THAT(manifest.status().message(), HasSubstr("manifest.json: "));
  }
}

// nlohmann keeps the last of two equal keys and skips a byte order mark; the manifest's reader
// refuses both, naming the key and the object it is in, or the BOM.
TEST(Manifest, StreamingModelsAndTheirLiveSequences) {
  const std::string base = R"({"format_version": 1, "name": "m", "version": 1, "entry": "a:B", )"
                           R"("inputs": [{"name": "x", "datatype": "BYTES", "shape": [1]}], )"
                           R"("outputs": [{"name": "y", "datatype": "BYTES", "shape": [1]}])";
  Result<Manifest> plain = ParseManifest(base + "}");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->streaming);
  Result<Manifest> streaming = ParseManifest(base + R"(, "streaming": true})");
  ASSERT_TRUE(streaming.ok());
  EXPECT_TRUE(streaming->streaming);
  EXPECT_EQ(streaming->max_live_sequences, 16);
  Result<Manifest> live = ParseManifest(base + R"(, "streaming": true, "max_live_sequences": 3})");
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(live->max_live_sequences, 3);
}

TEST(Manifest, StatefulModelsDeclareTheirSequenceSettings) {
  const std::string base = R"({"format_version": 1, "name": "m", "version": 1, "entry": "a:B", )"
                           R"("inputs": [{"name": "x", "datatype": "BYTES", "shape": [1]}], )"
                           R"("outputs": [{"name": "y", "datatype": "BYTES", "shape": [1]}])";
  EXPECT_FALSE(ParseManifest(base + "}")->sequence.has_value());
  Result<Manifest> defaults = ParseManifest(base + R"(, "sequence": {}})");
  ASSERT_TRUE(defaults.ok()) << defaults.status().message();
  ASSERT_TRUE(defaults->sequence.has_value());
  EXPECT_FALSE(defaults->sequence->idle_timeout_ms.has_value());
  EXPECT_FALSE(defaults->sequence->max_sequences_per_copy.has_value());
  Result<Manifest> given = ParseManifest(
      base + R"(, "sequence": {"idle_timeout_ms": 1500, "max_sequences_per_copy": 8}})");
  ASSERT_TRUE(given.ok()) << given.status().message();
  EXPECT_EQ(given->sequence->idle_timeout_ms, 1500);
  EXPECT_EQ(given->sequence->max_sequences_per_copy, 8);
}

TEST(Manifest, OpenAiMappingNamesOneTextInputAndATextOutput) {
  const std::string base = R"({"format_version": 1, "name": "m", "version": 1, "entry": "a:B", )"
                           R"("inputs": [{"name": "x", "datatype": "BYTES", "shape": [1]}], )"
                           R"("outputs": [{"name": "y", "datatype": "BYTES", "shape": [1]}])";
  Result<Manifest> mapped = ParseManifest(
      base + R"(, "streaming": true, "openai": {"text_input": "x", "text_output": "y", )"
             R"("tokens": "bytes"}})");
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  ASSERT_TRUE(mapped->openai.has_value());
  EXPECT_EQ(mapped->openai->text_input, "x");
  EXPECT_EQ(mapped->openai->text_output, "y");
  EXPECT_TRUE(mapped->openai->byte_tokens);
  EXPECT_FALSE(ParseManifest(base + "}")->openai.has_value());
  const std::pair<std::string, std::string> refused[] = {
      {R"(, "openai": {"text_input": "x", "text_output": "y"}})", "only a streaming model"},
      {R"(, "streaming": true, "openai": {}})", "'text_input' must be the model's only input"},
      {R"(, "streaming": true, "openai": {"text_input": "x"}})", "'text_output' must be"},
      {R"(, "streaming": true, "openai": {"text_input": "x", "text_output": "y", "tokens": "words"}})",
       "expected \"bytes\""},
      {R"(, "streaming": true, "openai": {"text_input": "x", "text_output": "y", "other": 1}})",
       "$.openai.other: unknown key"},
  };
  for (const auto& [json, message] : refused) {
    Result<Manifest> manifest = ParseManifest(base + json);
    ASSERT_FALSE(manifest.ok()) << json;
    EXPECT_NE(manifest.status().message().find(message), std::string::npos)
        << manifest.status().message();
  }
}

TEST(Manifest, DuplicateKeysAndAByteOrderMarkAreRefused) {
  const std::string base = R"("format_version": 1, "name": "m", "version": 1, "entry": "a:B")";
  const std::string inputs = R"("inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2]}])";
  const std::string outputs = R"("outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}])";
  const std::string valid = "{" + base + ", " + inputs + ", " + outputs + "}";
  ASSERT_TRUE(ParseManifest(valid).ok());
  struct Case {
    std::string json;
    std::string message;
  };
  const Case cases[] = {
      {"{" + base + ", " + inputs + ", " + outputs + ", " + inputs + "}",
       "manifest.json: $: the key 'inputs' appears more than once"},
      {"{" + base + R"(, "version": 1, )" + inputs + ", " + outputs + "}",
       "manifest.json: $: the key 'version' appears more than once"},
      {"{" + base + ", " + inputs +
           R"(, "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}, )"
           R"({"name": "z", "datatype": "FP32", "name": "w", "shape": [1]}]})",
       "manifest.json: $.outputs[1]: the key 'name' appears more than once"},
      {"{" + base + ", " + inputs + ", " + outputs + R"(, "parameters": {"k": 1, "k": 2}})",
       "manifest.json: $.parameters: the key 'k' appears more than once"},
      {"\xEF\xBB\xBF" + valid,
       "manifest.json: $: the file starts with a UTF-8 byte order mark (BOM)"},
  };
  for (const Case& test : cases) {
    Result<Manifest> manifest = ParseManifest(test.json);
    ASSERT_FALSE(manifest.ok()) << test.json;
    EXPECT_EQ(manifest.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(manifest.status().message(), HasSubstr(test.message)) << test.json;
  }
}

// Each level of nesting kept its JSON path, for the messages: a manifest of 60 KB nested 30,000
// deep took 1.8 GB and one of 200 KB 16.5 GB before its answer. Deep nesting is now refused as
// the parse reaches it, whatever the depth (memory linear in the text).
TEST(Manifest, NestingPastTheLimitIsRefusedWithoutPathsPerLevel) {
  const std::string base = R"("format_version": 1, "name": "m", "version": 1, "entry": "a:B", )"
                           R"("inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}], )"
                           R"("outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}])";
  auto nested = [&](size_t levels) {
    return "{" + base + R"(, "parameters": {"p": )" + std::string(levels, '[') + "1" +
           std::string(levels, ']') + "}}";
  };
  // Within the limit, the value is read (and refused: a parameter is a scalar).
  EXPECT_THAT(ParseManifest(nested(60)).status().message(),
              HasSubstr("$.parameters.p: expected a string, number or boolean, got array"));
  for (const size_t levels : {63UL, 200'000UL}) {
    Result<Manifest> manifest = ParseManifest(nested(levels));
    ASSERT_FALSE(manifest.ok()) << levels;
    EXPECT_EQ(manifest.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(manifest.status().message(),
                HasSubstr("nested deeper than 64 levels of objects and arrays"));
    EXPECT_THAT(manifest.status().message(), HasSubstr("manifest.json: $.parameters.p"));
  }
  // A key given twice still counts within the limit, and nothing past it is looked at.
  EXPECT_THAT(ParseManifest("{" + base + R"(, "parameters": {"k": 1, "k": 2}})").status().message(),
              HasSubstr("the key 'k' appears more than once"));
}

TEST(Package, WeightsViewThePackageFileWithoutCopies) {
  TempDir directory;
  engine::Tensor weight = engine::Arange(0, 1024).To(engine::DType::kFloat32);
  std::string path = WritePackage(
      directory, "m.orochi",
      {{"manifest.json", ManifestJson("m", kIo, kIo)},
       {"code/model.py", kModel},
       {"weights/a.safetensors", SafetensorsBytes({{"w", weight}}, directory)},
       {"weights/b.safetensors", SafetensorsBytes({{"b", engine::Ones({4})}}, directory)},
       {"resources/labels.txt", "cat\ndog\n"}});
  Result<std::unique_ptr<Package>> package = Package::Open(path);
  ASSERT_TRUE(package.ok()) << package.status().ToString();
  const engine::Tensor& mapped = (*package)->weights().at("w");
  EXPECT_TRUE(mapped.read_only());
  EXPECT_EQ(mapped.storage().get(), (*package)->archive().file().get())
      << "the tensor views the package's own mapping";
  EXPECT_EQ(mapped.data_as<float>()[1023], 1023.0F);
  EXPECT_EQ((*package)->weights_files().size(), 2U);
  EXPECT_EQ((*package)->code().at("model.py"), kModel);
  EXPECT_EQ(*(*package)->ReadResource("labels.txt"), "cat\ndog\n");
  EXPECT_EQ((*package)->ReadResource("missing.txt").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*package)->resources(), (std::vector<std::string>{"labels.txt"}));
}

TEST(Package, TensorNamesMustBeUniqueAcrossWeightsFiles) {
  TempDir directory;
  std::string path = WritePackage(
      directory, "m.orochi",
      {{"manifest.json", ManifestJson("m", kIo, kIo)},
       {"code/model.py", kModel},
       {"weights/a.safetensors", SafetensorsBytes({{"w", engine::Ones({2})}}, directory)},
       {"weights/b.safetensors", SafetensorsBytes({{"w", engine::Ones({2})}}, directory)}});
  EXPECT_THAT(Package::Open(path).status().message(),
              HasSubstr("member 'weights/b.safetensors': tensor 'w' is also in another weights "
                        "file"));
}

TEST(Package, EntryModuleMayBeAPackage) {
  TempDir directory;
  std::string manifest = ManifestJson("m", kIo, kIo);
  manifest.replace(manifest.find("model:Model"), 11, "pkg.sub:Model");
  std::string path = WritePackage(directory, "m.orochi",
                                  {{"manifest.json", manifest},
                                   {"code/pkg/__init__.py", ""},
                                   {"code/pkg/sub/__init__.py", kModel}});
  EXPECT_TRUE(Package::Open(path).ok());
}

// Code is held in memory by every interpreter copy: a code/ that inflates to a lot is refused
// at open, before any of it is read, even where each member is far from the archive's limits.
TEST(Package, CodeIsBoundedAllTogether) {
  TempDir directory;
  std::string padding(size_t{600} * 1024, ' ');
  uint32_t state = 1;  // incompressible text: deflate would otherwise trip the ratio check
  for (char& c : padding) {
    state = state * 1664525U + 1013904223U;
    c = static_cast<char>('!' + (state >> 24) % 90);
  }
  std::map<std::string, std::string> members{{"manifest.json", ManifestJson("m", kIo, kIo)},
                                             {"code/model.py", kModel}};
  for (int i = 0; i < 4; ++i) members["code/padding" + std::to_string(i) + ".py"] = padding;
  std::string path = WritePackage(directory, "m.orochi", members);
  PackageLimits limits;
  limits.max_code_bytes = 2 << 20;
  Result<std::unique_ptr<Package>> refused = Package::Open(path, limits);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(
      refused.status().message(),
      HasSubstr("code/ holds " + std::to_string(4 * padding.size() + std::string(kModel).size()) +
                " bytes uncompressed, over the limit of 2097152"));
  limits.max_code_bytes = 4 << 20;
  EXPECT_TRUE(Package::Open(path, limits).ok());
}

}  // namespace
}  // namespace orochi::packaging
