// The KServe v2 codec: a request reads the same whatever order its keys come in (its data is
// converted while parsing when the name, datatype and shape come first, from the document
// otherwise), every malformed request is refused with a message naming the problem, and
// responses are valid JSON with floats in their shortest form.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kserve/request_json.h"
#include "orochi/base/process_memory.h"
#include "orochi/engine/dtype.h"
#include "orochi/engine/tensor.h"
#include "orochi/server/kserve_codec.h"

namespace orochi::server::kserve {
namespace {

using interpreters::BytesTensor;
using interpreters::NamedTensor;
using packaging::DataType;
using ::testing::AllOf;
using ::testing::HasSubstr;

packaging::Manifest EchoManifest(DataType datatype, std::vector<int64_t> shape,
                                 int64_t max_batch_size = 0) {
  packaging::Manifest manifest;
  manifest.name = "echo";
  manifest.version = 3;
  manifest.max_batch_size = max_batch_size;
  manifest.inputs = {{"x", datatype, shape}};
  manifest.outputs = {{"y", datatype, std::move(shape)}};
  return manifest;
}

// One input as clients write it, with its keys in `order`.
std::string Request(const std::vector<std::string>& order, const std::string& datatype,
                    const std::string& shape, const std::string& data) {
  std::string input = "{";
  for (const std::string& key : order) {
    if (input.size() > 1) input += ",";
    if (key == "name") input += R"("name":"x")";
    if (key == "datatype") input += R"("datatype":")" + datatype + "\"";
    if (key == "shape") input += R"("shape":)" + shape;
    if (key == "data") input += R"("data":)" + data;
  }
  return R"({"id":"r1","inputs":[)" + input + "}]}";
}

const std::vector<std::vector<std::string>> kKeyOrders = {
    {"name", "datatype", "shape", "data"},  // read while parsing, into a tensor of its shape
    {"name", "datatype", "data", "shape"},  // read while parsing, collected then copied
    {"data", "name", "datatype", "shape"},  // passed over, read when the input ends
    {"shape", "data", "datatype", "name"},
};

Result<InferRequest> Parse(const packaging::Manifest& manifest, const std::string& body,
                           int max_depth = 64) {
  return ParseInferRequest(manifest, body, std::nullopt, ParseLimits{max_depth});
}

template <typename T>
std::vector<T> Values(const InferRequest& request) {
  const auto& tensor = std::get<engine::Tensor>(request.inputs.at(0).value);
  return std::vector<T>(tensor.data_as<T>(), tensor.data_as<T>() + tensor.numel());
}

TEST(ParseInferRequest, ReadsTheSameValuesWhateverTheKeyOrder) {
  const packaging::Manifest manifest = EchoManifest(DataType::kFp32, {2, 2});
  for (const auto& order : kKeyOrders) {
    for (const std::string data : {"[1, 2.5, -3, 4e1]", "[[1, 2.5], [-3, 4e1]]"}) {
      SCOPED_TRACE(order.front() + " first, data " + data);
      Result<InferRequest> parsed = Parse(manifest, Request(order, "FP32", "[2, 2]", data));
      ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
      EXPECT_EQ(parsed->id, "r1");
      EXPECT_EQ(std::get<engine::Tensor>(parsed->inputs[0].value).shape(), (engine::Shape{2, 2}));
      EXPECT_EQ(Values<float>(*parsed), (std::vector<float>{1.0F, 2.5F, -3.0F, 40.0F}));
    }
  }
}

TEST(ParseInferRequest, ConvertsEveryDatatype) {
  const packaging::Manifest bools = EchoManifest(DataType::kBool, {3});
  const packaging::Manifest uint8s = EchoManifest(DataType::kUInt8, {3});
  const packaging::Manifest int64s = EchoManifest(DataType::kInt64, {3});
  const packaging::Manifest halves = EchoManifest(DataType::kFp16, {3});
  const packaging::Manifest doubles = EchoManifest(DataType::kFp64, {3});
  const packaging::Manifest strings = EchoManifest(DataType::kBytes, {3});
  for (const auto& order : kKeyOrders) {
    SCOPED_TRACE(order.front() + " first");
    Result<InferRequest> parsed = Parse(bools, Request(order, "BOOL", "[3]", "[true,false,true]"));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(Values<bool>(*parsed), (std::vector<bool>{true, false, true}));
    parsed = Parse(uint8s, Request(order, "UINT8", "[3]", "[0, 255, 7]"));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(Values<uint8_t>(*parsed), (std::vector<uint8_t>{0, 255, 7}));
    parsed = Parse(
        int64s, Request(order, "INT64", "[3]", "[-9223372036854775808, 9223372036854775807, 0]"));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(Values<int64_t>(*parsed),
              (std::vector<int64_t>{std::numeric_limits<int64_t>::min(),
                                    std::numeric_limits<int64_t>::max(), 0}));
    parsed = Parse(halves, Request(order, "FP16", "[3]", "[0.5, -2, 65504]"));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    const auto half = Values<engine::Half>(*parsed);
    EXPECT_EQ(engine::Convert<float>(half[0]), 0.5F);
    EXPECT_EQ(engine::Convert<float>(half[1]), -2.0F);
    EXPECT_EQ(engine::Convert<float>(half[2]), 65504.0F);
    parsed = Parse(doubles, Request(order, "FP64", "[3]", "[0.1, 1e300, 3]"));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(Values<double>(*parsed), (std::vector<double>{0.1, 1e300, 3.0}));
    parsed = Parse(strings, Request(order, "BYTES", "[3]", R"(["a", "", "\u00e9\n"])"));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(std::get<BytesTensor>(parsed->inputs[0].value).items,
              (std::vector<std::string>{"a", "", "\xc3\xa9\n"}));
  }
}

// The same message whichever way the data was read.
void ExpectRefusal(const packaging::Manifest& manifest, const std::string& datatype,
                   const std::string& shape, const std::string& data, const std::string& message) {
  for (const auto& order : kKeyOrders) {
    SCOPED_TRACE(order.front() + " first, data " + data);
    Result<InferRequest> parsed = Parse(manifest, Request(order, datatype, shape, data));
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message(), message);
  }
}

TEST(ParseInferRequest, RefusesValuesThatDoNotFitTheDatatype) {
  ExpectRefusal(EchoManifest(DataType::kUInt8, {2}), "UINT8", "[2]", "[1, 300]",
                "input 'x' is UINT8: 300 is out of its range [0, 255]");
  ExpectRefusal(EchoManifest(DataType::kInt64, {1}), "INT64", "[1]", "[18446744073709551615]",
                "input 'x' is INT64: 18446744073709551615 is out of its range "
                "[-9223372036854775808, 9223372036854775807]");
  // Integers past 64 bits are read as doubles, but are still integers out of range.
  ExpectRefusal(EchoManifest(DataType::kInt64, {1}), "INT64", "[1]", "[-9223372036854775809]",
                "input 'x' is INT64: -9223372036854775809 is out of its range "
                "[-9223372036854775808, 9223372036854775807]");
  ExpectRefusal(EchoManifest(DataType::kUInt8, {1}), "UINT8", "[1]",
                "[123456789012345678901234567890123456789]",
                "input 'x' is UINT8: 12345678901234567890123456789012... is out of its range "
                "[0, 255]");
  ExpectRefusal(EchoManifest(DataType::kBool, {1}), "BOOL", "[1]", "[18446744073709551616]",
                "input 'x' is BOOL: expected true or false, got 18446744073709551616");
  ExpectRefusal(EchoManifest(DataType::kInt32, {2}), "INT32", "[2]", "[1, 2.5]",
                "input 'x' is INT32: expected integers, got 2.5");
  ExpectRefusal(EchoManifest(DataType::kBool, {2}), "BOOL", "[2]", "[true, 1]",
                "input 'x' is BOOL: expected true or false, got 1");
  ExpectRefusal(EchoManifest(DataType::kFp32, {2}), "FP32", "[2]", R"([1, "2"])",
                "input 'x' is FP32: expected numbers, got \"2\"");
  ExpectRefusal(EchoManifest(DataType::kFp32, {2}), "FP32", "[2]", "[1, null]",
                "input 'x' is FP32: expected numbers, got null");
  ExpectRefusal(EchoManifest(DataType::kFp32, {2}), "FP32", "[2]", R"([{"a": [1, {}]}, 1])",
                "input 'x' is FP32: expected numbers, got an object");
  // Inside data an object is wrong whatever its keys, given twice or not.
  ExpectRefusal(EchoManifest(DataType::kInt32, {2}), "INT32", "[2]", R"([1, {"a": 1, "a": 2}])",
                "input 'x' is INT32: expected integers, got an object");
  // Floats past their datatype's range are refused as integers are, not made infinite.
  ExpectRefusal(EchoManifest(DataType::kFp32, {2}), "FP32", "[2]", "[1, 1e39]",
                "input 'x' is FP32: 1e+39 is out of its range "
                "[-3.4028234663852886e+38, 3.4028234663852886e+38]");
  ExpectRefusal(EchoManifest(DataType::kFp16, {1}), "FP16", "[1]", "[70000]",
                "input 'x' is FP16: 70000 is out of its range [-65504.0, 65504.0]");
  ExpectRefusal(EchoManifest(DataType::kBf16, {1}), "BF16", "[1]", "[-3.5e38]",
                "input 'x' is BF16: -3.5e+38 is out of its range "
                "[-3.3895313892515355e+38, 3.3895313892515355e+38]");
  ExpectRefusal(EchoManifest(DataType::kBytes, {2}), "BYTES", "[2]", R"(["a", 7])",
                "input 'x' is BYTES: expected strings, got 7");
  // The first wrong value is the one named.
  ExpectRefusal(EchoManifest(DataType::kInt8, {3}), "INT8", "[3]", "[1, 200, true]",
                "input 'x' is INT8: 200 is out of its range [-128, 127]");
}

TEST(ParseInferRequest, RefusesDataThatDoesNotFollowTheShape) {
  const packaging::Manifest manifest = EchoManifest(DataType::kFp32, {2, 3});
  const std::string nested =
      "input 'x' has nested data that does not follow its shape [2, 3] "
      "(send it flat, or nested exactly as the shape)";
  ExpectRefusal(manifest, "FP32", "[2, 3]", "[[1, 2, 3], [4, 5]]", nested);         // ragged
  ExpectRefusal(manifest, "FP32", "[2, 3]", "[[1, 2], [3, 4], [5, 6]]", nested);    // transposed
  ExpectRefusal(manifest, "FP32", "[2, 3]", "[[1, 2, 3], 4, 5, 6]", nested);        // mixed
  ExpectRefusal(manifest, "FP32", "[2, 3]", "[[[1, 2, 3]], [[4, 5, 6]]]", nested);  // too deep
  ExpectRefusal(manifest, "FP32", "[2, 3]", "[[1, 2, 3], [4, 5, [6]]]", nested);
  ExpectRefusal(manifest, "FP32", "[2, 3]", "[1, 2, 3, 4, 5]",
                "input 'x' has 5 values, but shape [2, 3] needs 6");
  ExpectRefusal(manifest, "FP32", "[2, 3]", "[1, 2, 3, 4, 5, 6, 7]",
                "input 'x' has 7 values, but shape [2, 3] needs 6");
  // Empty dims: nesting stops at the first one.
  const packaging::Manifest empty = EchoManifest(DataType::kFp32, {-1, 0, 3});
  for (const std::string data : {"[]", "[[], []]"}) {
    Result<InferRequest> parsed = Parse(empty, Request(kKeyOrders[0], "FP32", "[2, 0, 3]", data));
    EXPECT_TRUE(parsed.ok()) << data << ": " << parsed.status().ToString();
  }
  // A single value needs no array.
  Result<InferRequest> scalar =
      Parse(EchoManifest(DataType::kInt32, {1}), Request(kKeyOrders[0], "INT32", "[1]", "7"));
  ASSERT_TRUE(scalar.ok()) << scalar.status().ToString();
  EXPECT_EQ(Values<int32_t>(*scalar), std::vector<int32_t>{7});
}

TEST(ParseInferRequest, AShapeLargerThanTheBodyIsCountedNotAllocated) {
  // 2^40 values cannot be in a body of a few bytes: refused by count, never allocated.
  const packaging::Manifest manifest = EchoManifest(DataType::kFp64, {-1});
  ExpectRefusal(manifest, "FP64", "[1099511627776]", "[1, 2]",
                "input 'x' has 2 values, but shape [1099511627776] needs 1099511627776");
}

TEST(ParseInferRequest, AnEmptyShapeWhoseStridesPass64BitsIsRefused) {
  // [0, 2^62, 4] has no values, but a tensor of it would have a first stride of 2^64: refused
  // with the engine's words, however the data was read (its fuzzer found the stride's
  // multiplication overflowing). Large sizes beside a 0 whose strides fit are an empty tensor.
  const packaging::Manifest manifest = EchoManifest(DataType::kFp32, {-1, -1, -1});
  ExpectRefusal(manifest, "FP32", "[0, 4611686018427387904, 4]", "[]",
                "the shape [0, 4611686018427387904, 4] has strides that do not fit in 64 bits");
  for (const auto& order : kKeyOrders) {
    Result<InferRequest> parsed =
        Parse(manifest, Request(order, "FP32", "[2, 0, 8643020009459241319]", "[]"));
    ASSERT_TRUE(parsed.ok()) << order.front() << " first: " << parsed.status().ToString();
    EXPECT_EQ(std::get<engine::Tensor>(parsed->inputs.at(0).value).numel(), 0);
  }
}

// In a child process of its own (so that the peak is this parse's): `parse` must be refused
// with exactly `message`, the process's address space growing by less than `limit_mib`.
void ExpectRefusedWithin(const std::function<Result<InferRequest>()>& parse,
                         const std::string& message, int64_t limit_mib) {
  EXPECT_EXIT(
      {
        const int64_t before = ProcessStatusKiB("VmPeak");
        Result<InferRequest> parsed = parse();
        const int64_t grown_mib = (ProcessStatusKiB("VmPeak") - before) / 1024;
        std::fprintf(stderr, "%s; address space grew by %lld MiB\n",
                     parsed.status().ToString().c_str(), static_cast<long long>(grown_mib));
        std::exit(
            !parsed.ok() && parsed.status().message() == message && grown_mib < limit_mib ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "address space grew by");
}

// Shapes are believed up front only as far as the body could fill them, for all inputs
// together: a 2 MB body of 7000 inputs each claiming 24 MB of FP64 and holding none would
// otherwise allocate 168 GB (or, past the address space, fail the server).
TEST(ParseInferRequest, ShapesWithoutValuesCannotMakeABodyAllocateMore) {
  const packaging::Manifest manifest = EchoManifest(DataType::kFp64, {-1});
  std::string body = R"({"inputs":[)";
  const std::string input = R"({"name":"x","datatype":"FP64","shape":[3000000],"data":[]})";
  // 9 keys and values each: under the bound on those (BoundsTheKeysAndValuesBesideTheData).
  for (int i = 0; i < 7000; ++i) body += (i ? "," : "") + input;
  body += "]}";
  ExpectRefusedWithin([&] { return Parse(manifest, body); },
                      "input 'x' has 0 values, but shape [3000000] needs 3000000", 1024);
}

// Data before its input's name is passed over and read when the input object ends, not held as
// a document: 8M empty arrays there (24 MB of text) took about 600 MB as one.
TEST(ParseInferRequest, DataBeforeItsNameIsNotHeldAsADocument) {
  const packaging::Manifest manifest = EchoManifest(DataType::kFp32, {-1, 1});
  std::string body = R"({"inputs":[{"data":[)";
  for (int i = 0; i < 8 << 20; ++i) body += i > 0 ? ",[]" : "[]";
  body += R"(],"name":"x","datatype":"FP32","shape":[1,1]}]})";
  ExpectRefusedWithin([&] { return Parse(manifest, body); },
                      "input 'x' has nested data that does not follow its shape [1, 1] (send it "
                      "flat, or nested exactly as the shape)",
                      64);
}

// 4 bytes of binary data make an empty BYTES element, 32 bytes as a string: elements past the
// shape's count are counted, not kept.
TEST(ParseInferRequest, BinaryBytesElementsPastTheShapeAreCountedNotKept) {
  const packaging::Manifest manifest = EchoManifest(DataType::kBytes, {-1});
  const std::string header = R"({"inputs":[{"name":"x","datatype":"BYTES","shape":[3],)"
                             R"("parameters":{"binary_data_size":67108864}}]})";
  const std::string body = header + std::string(size_t{64} << 20, '\0');
  ExpectRefusedWithin(
      [&] { return ParseInferRequest(manifest, body, header.size(), ParseLimits{64}); },
      "input 'x' has 16777216 BYTES elements, but shape [3] needs 3", 64);
}

TEST(ParseInferRequest, RefusesMalformedJsonWithWhereItBroke) {
  const packaging::Manifest manifest = EchoManifest(DataType::kFp32, {1});
  Result<InferRequest> parsed = Parse(manifest, R"({"inputs": [}])");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(),
            "the request body is not valid JSON at byte 13: expected a value, found '}' (near "
            "'{\"inputs\": [}')");
  // numpy's spellings get told Python's.
  for (const std::string spelling : {"nan", "inf", "-inf"}) {
    parsed = Parse(manifest, Request(kKeyOrders[0], "FP32", "[1]", "[" + spelling + "]"));
    ASSERT_FALSE(parsed.ok());
    EXPECT_THAT(parsed.status().message(), HasSubstr("write NaN, Infinity and -Infinity"))
        << spelling;
  }
  parsed = Parse(manifest, Request(kKeyOrders[0], "FP32", "[1]", "[1e400]"));
  ASSERT_FALSE(parsed.ok());
  // Valid JSON, so not said to be invalid.
  EXPECT_THAT(parsed.status().message(),
              AllOf(HasSubstr("the request JSON has a number out of range at byte "),
                    HasSubstr("the number 1e400 is too large for any datatype")));
  parsed = Parse(manifest, "");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(),
            "the request body is not valid JSON at byte 1: expected a value, but the text ends "
            "(near '')");
  // Control characters and bytes past ASCII do not reach the answer as they are.
  parsed = Parse(manifest, "{\"a\": \x01\xff}");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(),
            "the request body is not valid JSON at byte 7: expected a value, found the byte 0x01 "
            "(near '{\"a\": ?')");
}

// NaN and the infinities, as Triton, Python's json module and the server's own responses write
// them, in every float datatype and whatever the key order; refused for the other datatypes.
TEST(ParseInferRequest, ReadsNanAndInfinity) {
  for (const DataType datatype :
       {DataType::kFp16, DataType::kBf16, DataType::kFp32, DataType::kFp64}) {
    const packaging::Manifest manifest = EchoManifest(datatype, {4});
    const std::string name(DataTypeName(datatype));
    for (const auto& order : kKeyOrders) {
      Result<InferRequest> parsed =
          Parse(manifest, Request(order, name, "[4]", "[NaN, Infinity, -Infinity, 1.5]"));
      ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status().message();
      const auto& tensor = std::get<engine::Tensor>(parsed->inputs[0].value);
      engine::VisitDType(tensor.dtype(), [&]<typename T>() {
        const T* values = tensor.data_as<T>();
        EXPECT_TRUE(std::isnan(engine::Convert<double>(values[0]))) << name;
        EXPECT_EQ(engine::Convert<double>(values[1]), std::numeric_limits<double>::infinity());
        EXPECT_EQ(engine::Convert<double>(values[2]), -std::numeric_limits<double>::infinity());
        EXPECT_EQ(engine::Convert<double>(values[3]), 1.5);
      });
    }
  }
  const packaging::Manifest manifest = EchoManifest(DataType::kInt32, {1});
  for (const auto& order : kKeyOrders) {
    Result<InferRequest> parsed = Parse(manifest, Request(order, "INT32", "[1]", "[NaN]"));
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().message(), "input 'x' is INT32: expected integers, got NaN");
  }
}

TEST(ParseInferRequest, KeepsTheRequestParametersThatAreTheModels) {
  const packaging::Manifest manifest = EchoManifest(DataType::kFp32, {1});
  const std::string input = R"("inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}])";
  Result<InferRequest> parsed =
      Parse(manifest, R"({"parameters":{"top_k":5,"label":"cat","exact":true,"temperature":0.5,)"
                      R"("huge":18446744073709551615,"timeout":1000,"binary_data_output":false},)" +
                          input + "}");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  // Sorted by name; those the server reads itself are not the model's.
  const interpreters::RequestParameters expected = {{"exact", true},
                                                    {"huge", 18446744073709551615.0},
                                                    {"label", std::string("cat")},
                                                    {"temperature", 0.5},
                                                    {"top_k", int64_t{5}}};
  EXPECT_EQ(parsed->parameters, expected);
  EXPECT_EQ(parsed->timeout, std::chrono::microseconds(1000));
  for (const std::string value : {"null", "[1]", "{\"a\":1}"}) {
    parsed = Parse(manifest, R"({"parameters":{"p":)" + value + "}," + input + "}");
    ASSERT_FALSE(parsed.ok()) << value;
    EXPECT_THAT(parsed.status().message(),
                HasSubstr("parameter \"p\" must be a string, a number or a boolean"));
  }
}

// A stateful model's requests carry Triton's sequence parameters, read apart from the model's own
// parameters: an id an unsigned integer (to 2^64 - 1) or a string (7 and "7" are two sequences).
TEST(ParseInferRequest, ReadsTheSequenceParametersOfAStatefulModel) {
  packaging::Manifest manifest = EchoManifest(DataType::kFp32, {1});
  manifest.sequence = packaging::Manifest::Sequence{};
  const std::string input = R"("inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}])";
  Result<InferRequest> parsed =
      Parse(manifest,
            R"({"parameters":{"sequence_id":18446744073709551615,"sequence_start":true,"k":1},)" +
                input + "}");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ASSERT_TRUE(parsed->sequence.has_value());
  EXPECT_EQ(parsed->sequence->id, "18446744073709551615");
  EXPECT_TRUE(parsed->sequence->start);
  EXPECT_FALSE(parsed->sequence->end);
  EXPECT_EQ(parsed->parameters, (interpreters::RequestParameters{{"k", int64_t{1}}}));
  parsed =
      Parse(manifest, R"({"parameters":{"sequence_id":"7","sequence_end":true},)" + input + "}");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->sequence->id, "\"7\"");
  EXPECT_TRUE(parsed->sequence->end);
  const std::pair<std::string, std::string> refused[] = {
      {"{" + input + "}", "model echo is stateful: each request names its sequence"},
      {R"({"parameters":{"sequence_start":true},)" + input + "}",
       "model echo is stateful: each request names its sequence"},
      {R"({"parameters":{"sequence_id":-1},)" + input + "}",
       "parameter 'sequence_id' must be an unsigned integer or a non-empty string"},
      {R"({"parameters":{"sequence_id":""},)" + input + "}",
       "parameter 'sequence_id' must be an unsigned integer or a non-empty string"},
      {R"({"parameters":{"sequence_id":1.5},)" + input + "}",
       "parameter 'sequence_id' must be an unsigned integer or a non-empty string"},
      {R"({"parameters":{"sequence_id":[1]},)" + input + "}",
       "parameter 'sequence_id' must be an unsigned integer or a non-empty string"},
      {R"({"parameters":{"sequence_id":1,"sequence_start":1},)" + input + "}",
       "parameter 'sequence_start' must be a boolean"},
  };
  for (const auto& [body, message] : refused) {
    parsed = Parse(manifest, body);
    ASSERT_FALSE(parsed.ok()) << body;
    EXPECT_THAT(parsed.status().message(), HasSubstr(message)) << body;
  }
}

// Nothing a client asks for is accepted and ignored: what Orochi does not implement is refused,
// named, while the model's own parameters still reach it.
TEST(ParseInferRequest, RefusesWhatOrochiDoesNotImplementNamingIt) {
  const packaging::Manifest manifest = EchoManifest(DataType::kFp32, {1});
  const std::string input = R"({"name":"x","datatype":"FP32","shape":[1],"data":[1]})";
  struct Case {
    std::string body;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"({"parameters":{"priority":1},"inputs":[)" + input + "]}",
       R"(parameter "priority" is not supported)"},
      {R"({"parameters":{"sequence_id":7,"sequence_start":true},"inputs":[)" + input + "]}",
       R"(model echo is not stateful (its manifest declares no "sequence"))"},
      {R"({"parameters":{"sequence_end":true},"inputs":[)" + input + "]}",
       R"(model echo is not stateful)"},
      {R"({"inputs":[)" + input + R"(],"model_name":"echo"})",
       R"(the request has the key "model_name", which Orochi does not implement)"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],"contents":{}}]})",
       R"(input "x" has the key "contents", which Orochi does not implement)"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],"parameters":)"
       R"({"shared_memory_region":"r","shared_memory_byte_size":4}}]})",
       R"(input 'x' has both shared_memory_region and 'data')"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],"parameters":)"
       R"({"content_type":"np"}}]})",
       R"(input "x" has the parameter "content_type", which Orochi does not implement (an )"
       R"(input takes only binary_data_size and shared_memory_region, _offset and _byte_size))"},
      {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],"parameters":1}]})",
       R"(input "x": 'parameters' must be an object)"},
      {R"({"inputs":[)" + input +
           R"(],"outputs":[{"name":"y","parameters":)"
           R"({"shared_memory_region":"out","shared_memory_offset":0}}]})",
       R"(output 'y': shared_memory_region needs shared_memory_byte_size)"},
      {R"({"inputs":[)" + input + R"(],"outputs":[{"name":"y","parameters":{"top":1}}]})",
       R"(output "y" has the parameter "top", which Orochi does not implement)"},
      {R"({"inputs":[)" + input + R"(],"outputs":[{"name":"y","datatype":"FP32"}]})",
       R"(output "y" has the key "datatype")"},
      {R"({"inputs":[)" + input + R"(],"outputs":[{"name":"y","parameters":"binary"}]})",
       R"(output "y": 'parameters' must be an object)"},
      {R"({"inputs":[)" + input + R"(],"outputs":[{"name":"y","parameters":{"binary_data":1}}]})",
       "output 'y': binary_data must be a boolean"},
      {R"({"parameters":{"binary_data_output":"yes"},"inputs":[)" + input + "]}",
       "parameter 'binary_data_output' must be a boolean"},
  };
  for (const Case& each : cases) {
    Result<InferRequest> parsed = Parse(manifest, each.body);
    ASSERT_FALSE(parsed.ok()) << each.body;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(each.message)) << each.body;
  }
  // An input's values one way only: both would leave one of them unread.
  const std::string body = R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],)"
                           R"("parameters":{"binary_data_size":4}}]})";
  const std::string binary(4, '\0');
  Result<InferRequest> both =
      ParseInferRequest(manifest, body + binary, body.size(), ParseLimits{});
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(both.status().message(), HasSubstr("has both 'data' and binary_data_size"));
}

TEST(ParseInferRequest, RefusesAKeyGivenTwice) {
  const packaging::Manifest manifest = EchoManifest(DataType::kFp32, {1});
  for (const std::string& body :
       {std::string(R"({"inputs": [], "inputs": []})"),
        std::string(R"({"inputs": [{"name": "x", "shape": [1], "shape": [1]}]})"),
        std::string(
            R"({"inputs": [{"name": "x", "datatype": "FP32", "data": [1], "data": [2]}]})")}) {
    SCOPED_TRACE(body);
    Result<InferRequest> parsed = Parse(manifest, body);
    ASSERT_FALSE(parsed.ok());
    EXPECT_THAT(parsed.status().message(), HasSubstr("twice in one object"));
  }
}

TEST(ParseInferRequest, RefusesNestingPastTheLimit) {
  const packaging::Manifest manifest = EchoManifest(DataType::kFp32, {1});
  for (const std::string& body :
       {std::string(1000, '['), std::string(R"({"inputs":[{"name":"x","datatype":"FP32","data":)") +
                                    std::string(100, '[')}) {
    Result<InferRequest> parsed = Parse(manifest, body, 8);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().message(), "the request JSON is nested deeper than the limit of 8");
  }
}

// Random requests, right and wrong, read both ways (straight into the tensor, and passed over
// to be read when the input object ends): the same tensor or the same error every time.
TEST(ParseInferRequest, BothWaysOfReadingAgreeOnRandomRequests) {
  std::mt19937 random(11);
  const std::vector<std::pair<DataType, std::string>> datatypes = {
      {DataType::kBool, "BOOL"},  {DataType::kUInt8, "UINT8"}, {DataType::kInt32, "INT32"},
      {DataType::kFp16, "FP16"},  {DataType::kFp32, "FP32"},   {DataType::kFp64, "FP64"},
      {DataType::kBytes, "BYTES"}};
  std::vector<std::string> values = {"0",   "1",    "-1",       "300",      "2.5",   "-0.0",
                                     "1e3", "true", "false",    "null",     "\"s\"", "{}",
                                     "[]",  "NaN",  "Infinity", "-Infinity"};
  // Integers past 64 bits, refused as written whichever way they are read.
  values.insert(values.end(), {"-9223372036854775809", "18446744073709551616"});
  int accepted = 0;
  for (int round = 0; round < 3000; ++round) {
    const auto& [datatype, name] = datatypes[random() % datatypes.size()];
    engine::Shape shape;
    for (size_t rank = random() % 3; shape.size() < rank;) {
      shape.push_back(static_cast<int64_t>(random() % 3));
    }
    // Nested as the shape, flat, or either with a value or an array too many or too few.
    std::function<std::string(size_t)> nested = [&](size_t depth) -> std::string {
      if (depth == shape.size()) return values[random() % values.size()];
      std::string text = "[";
      int64_t items = shape[depth] + (random() % 8 == 0 ? 1 : 0);
      for (int64_t i = 0; i < items; ++i) text += (i ? "," : "") + nested(depth + 1);
      return text + "]";
    };
    std::string data;
    if (random() % 2 == 0) {
      data = nested(0);
    } else {
      data = "[";
      const int64_t count = engine::NumElements(shape) + static_cast<int64_t>(random() % 3) - 1;
      for (int64_t i = 0; i < count; ++i) data += (i ? "," : "") + values[random() % values.size()];
      data += "]";
    }
    const std::string shape_text = engine::ShapeString(shape);
    const packaging::Manifest manifest = EchoManifest(datatype, shape);
    Result<InferRequest> in_place = Parse(manifest, Request(kKeyOrders[0], name, shape_text, data));
    Result<InferRequest> from_document =
        Parse(manifest, Request(kKeyOrders[2], name, shape_text, data));
    SCOPED_TRACE(name + " " + shape_text + " " + data);
    ASSERT_EQ(in_place.ok(), from_document.ok());
    if (!in_place.ok()) {
      EXPECT_EQ(in_place.status().message(), from_document.status().message());
      continue;
    }
    ++accepted;
    const auto& left = in_place->inputs[0].value;
    const auto& right = from_document->inputs[0].value;
    if (datatype == DataType::kBytes) {
      EXPECT_EQ(std::get<BytesTensor>(left).items, std::get<BytesTensor>(right).items);
      continue;
    }
    const auto& a = std::get<engine::Tensor>(left);
    const auto& b = std::get<engine::Tensor>(right);
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.numel() * engine::ItemSize(a.dtype())), 0);
  }
  EXPECT_GT(accepted, 100);  // the comparison covered good requests too, not only refusals
}

// Hostile bodies: valid requests with bytes flipped, dropped, repeated or cut. Each is read
// or refused with a message; none may crash (this runs under AddressSanitizer in test.sh).
TEST(ParseInferRequest, MutatedRequestsAreReadOrRefusedNeverMisread) {
  std::mt19937 random(5);
  packaging::Manifest manifest = EchoManifest(DataType::kFp32, {2, 2}, /*max_batch_size=*/4);
  manifest.inputs.push_back({"s", DataType::kBytes, {-1}});
  const std::string valid =
      R"({"id":"m","parameters":{"timeout":5},"inputs":[)"
      R"({"name":"x","datatype":"FP32","shape":[1,2,2],"data":[[[1,2],[3,4]]]},)"
      R"({"name":"s","datatype":"BYTES","shape":[1,2],"data":[["a","\u00e9"]]}],)"
      R"("outputs":[{"name":"y","parameters":{"binary_data":true}}]})";
  ASSERT_TRUE(Parse(manifest, valid).ok());
  const std::string alphabet = "{}[],:\"0123456789.-eE+ntfaul\\x\xff";
  int read = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string body = valid;
    for (int edits = 1 + static_cast<int>(random() % 4); edits > 0; --edits) {
      const size_t at = random() % body.size();
      switch (random() % 4) {
        case 0:
          body[at] = alphabet[random() % alphabet.size()];
          break;
        case 1:
          body.erase(at, 1 + random() % 8);
          break;
        case 2:
          body.insert(at, body.substr(at, 1 + random() % 16));
          break;
        default:
          body.resize(at);
          break;
      }
      if (body.empty()) body = "{";
    }
    Result<InferRequest> parsed = Parse(manifest, body);
    if (parsed.ok()) {
      ++read;
      // What was read is whole: every input, with as many values as its shape says.
      ASSERT_EQ(parsed->inputs.size(), 2U) << body;
      const auto& x = std::get<engine::Tensor>(parsed->inputs[0].value);
      const auto& strings = std::get<BytesTensor>(parsed->inputs[1].value);
      EXPECT_EQ(x.shape()[0], parsed->rows) << body;
      EXPECT_EQ(static_cast<int64_t>(strings.items.size()), engine::NumElements(strings.shape))
          << body;
    } else {
      EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << body;
      EXPECT_FALSE(parsed.status().message().empty()) << body;
    }
  }
  EXPECT_GT(read, 0);
}

NamedTensor Output(DataType datatype, const engine::Shape& shape,
                   const std::vector<double>& values) {
  const engine::DType dtype = *packaging::EngineDType(datatype);
  engine::Tensor tensor = engine::Tensor::Empty(shape, dtype);
  engine::VisitDType(dtype, [&]<typename T>() {
    for (size_t i = 0; i < values.size(); ++i) {
      tensor.mutable_data_as<T>()[i] = engine::Convert<T>(values[i]);
    }
  });
  return {"y", tensor};
}

std::string EncodedData(DataType datatype, const std::vector<double>& values) {
  const packaging::Manifest manifest =
      EchoManifest(datatype, {static_cast<int64_t>(values.size())});
  const EncodedResponse encoded = EncodeInferResponse(
      manifest, InferRequest{}, {Output(datatype, {static_cast<int64_t>(values.size())}, values)});
  const std::string& body = encoded.body;
  const size_t start = body.find("\"data\":[") + 8;
  return body.substr(start, body.find(']', start) - start);
}

TEST(EncodeInferResponse, WritesFloatsInTheirShortestForm) {
  EXPECT_EQ(EncodedData(DataType::kFp32, {0.1, 1.0, -2.5, 1e20, 3e-8}), "0.1,1.0,-2.5,1e+20,3e-08");
  EXPECT_EQ(EncodedData(DataType::kFp64, {0.1, 1.0 / 3}), "0.1,0.3333333333333333");
  // FP16 and BF16 in their own shortest form, as numpy writes them (65504 reads back from 65500).
  EXPECT_EQ(EncodedData(DataType::kFp16, {0.5, 65504, 0.1, -0.0, 5.960464477539063e-08}),
            "0.5,65500.0,0.1,-0.0,6e-08");
  EXPECT_EQ(EncodedData(DataType::kBf16, {0.1, 3.3895313892515355e38}), "0.1,3.39e+38");
  EXPECT_EQ(EncodedData(DataType::kInt16, {-32768, 7}), "-32768,7");
  EXPECT_EQ(EncodedData(DataType::kUInt8, {255, 0}), "255,0");
  EXPECT_EQ(EncodedData(DataType::kBool, {1, 0}), "true,false");
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(EncodedData(DataType::kFp32, {std::nan(""), inf, -inf}), "NaN,Infinity,-Infinity");
}

TEST(EncodeInferResponse, IsValidJsonWithRequestedOutputsAndBinaryData) {
  packaging::Manifest manifest = EchoManifest(DataType::kFp32, {2});
  manifest.outputs.push_back({"names", DataType::kBytes, {2}});
  InferRequest request;
  request.id = "quote\" and \x01";
  const std::vector<NamedTensor> outputs = {
      Output(DataType::kFp32, {2}, {1.5, -1}),
      {"names", BytesTensor{{2}, {"caf\xc3\xa9", "bad \xff utf-8"}}}};
  const Json all = Json::parse(EncodeInferResponse(manifest, request, outputs).body);
  EXPECT_EQ(all["model_name"], "echo");
  EXPECT_EQ(all["model_version"], "3");
  EXPECT_EQ(all["id"], request.id);
  ASSERT_EQ(all["outputs"].size(), 2U);
  EXPECT_EQ(all["outputs"][0],
            Json::parse(R"({"name":"y","datatype":"FP32","shape":[2],"data":[1.5,-1.0]})"));
  EXPECT_EQ(all["outputs"][1]["data"], Json::parse(R"(["café", "bad \ufffd utf-8"])"));

  request.outputs = {"names"};
  request.binary_outputs = {"names"};
  const EncodedResponse binary = EncodeInferResponse(manifest, request, outputs);
  ASSERT_TRUE(binary.json_length.has_value());
  const Json header = Json::parse(binary.body.substr(0, *binary.json_length));
  ASSERT_EQ(header["outputs"].size(), 1U);
  EXPECT_EQ(header["outputs"][0]["parameters"]["binary_data_size"], 4 + 5 + 4 + 11);
  EXPECT_EQ(binary.body.size() - *binary.json_length, 24U);
}

// Triton's classification extension: the top scores along the last dim as "score:index",
// per row of a batch, as BYTES, in JSON or binary.
TEST(EncodeInferResponse, GivesClassesWhenAskedForThem) {
  const packaging::Manifest manifest = EchoManifest(DataType::kFp32, {4}, /*max_batch_size=*/8);
  const std::string input = R"("inputs":[{"name":"x","datatype":"FP32","shape":[2,4],)"
                            R"("data":[0,0,0,0,0,0,0,0]}])";
  auto classify = [&](const std::string& parameters, const std::vector<double>& scores) {
    Result<InferRequest> request = Parse(
        manifest, "{" + input + R"(,"outputs":[{"name":"y","parameters":)" + parameters + "}]}");
    EXPECT_TRUE(request.ok()) << request.status().message();
    return EncodeInferResponse(manifest, *request, {Output(DataType::kFp32, {2, 4}, scores)});
  };
  const std::vector<double> scores = {0.1, 0.7, 0.2, 0.7, 3, 1, 2, NAN};
  Json response = Json::parse(classify(R"({"classification":2})", scores).body);
  const Json& output = response["outputs"][0];
  EXPECT_EQ(output["datatype"], "BYTES");
  EXPECT_EQ(output["shape"], Json::parse("[2, 2]"));
  // Ties to the lower index; NaN above every number, as torch.topk ranks it.
  EXPECT_EQ(output["data"], Json::parse(R"(["0.7:1", "0.7:3", "NaN:3", "3.0:0"])"));
  // With the output's labels (the manifest's labels file), each class is named.
  Result<InferRequest> labelled = Parse(
      manifest, "{" + input + R"(,"outputs":[{"name":"y","parameters":{"classification":1}}]})");
  ASSERT_TRUE(labelled.ok());
  response = Json::parse(EncodeInferResponse(manifest, *labelled,
                                             {Output(DataType::kFp32, {2, 4}, scores)},
                                             {{"y", {"cat", "dog", "emu", "yak"}}})
                             .body);
  EXPECT_EQ(response["outputs"][0]["data"], Json::parse(R"(["0.7:1:dog", "NaN:3:yak"])"));
  // More classes than there are: all of them.
  response = Json::parse(classify(R"({"classification":9})", scores).body);
  EXPECT_EQ(response["outputs"][0]["shape"], Json::parse("[2, 4]"));
  // Binary: each class as a BYTES element.
  const EncodedResponse binary = classify(R"({"classification":1,"binary_data":true})", scores);
  ASSERT_TRUE(binary.json_length.has_value());
  const std::string data = binary.body.substr(*binary.json_length);
  EXPECT_EQ(data, std::string("\x05\0\0\0"
                              "0.7:1"
                              "\x05\0\0\0"
                              "NaN:3",
                              18));

  for (const std::string parameters :
       {R"({"classification":0})", R"({"classification":"2"})", R"({"classification":1.5})"}) {
    Result<InferRequest> request = Parse(
        manifest, "{" + input + R"(,"outputs":[{"name":"y","parameters":)" + parameters + "}]}");
    ASSERT_FALSE(request.ok()) << parameters;
    EXPECT_EQ(request.status().message(),
              "output 'y': classification must be a positive integer (how many classes to return)");
  }
  const packaging::Manifest strings = EchoManifest(DataType::kBytes, {1});
  Result<InferRequest> request =
      Parse(strings, R"({"inputs":[{"name":"x","datatype":"BYTES","shape":[1],"data":["a"]}],)"
                     R"("outputs":[{"name":"y","parameters":{"classification":1}}]})");
  ASSERT_FALSE(request.ok());
  EXPECT_EQ(request.status().message(),
            "output 'y' is BYTES: classification needs an output of scores");
}

TEST(EncodeInferResponse, RanksIntegerScoresExactly) {
  // 2^62, 2^62 + 1 and 2^62 + 2 are one value as doubles: ranked through double, the ties
  // went to the lower index and the largest score came last.
  const packaging::Manifest manifest = EchoManifest(DataType::kInt64, {3});
  Result<InferRequest> request =
      Parse(manifest, R"({"inputs":[{"name":"x","datatype":"INT64","shape":[3],"data":[0,0,0]}],)"
                      R"("outputs":[{"name":"y","parameters":{"classification":3}}]})");
  ASSERT_TRUE(request.ok()) << request.status().message();
  engine::Tensor scores = engine::Tensor::Empty({3}, engine::DType::kInt64);
  const int64_t base = int64_t{1} << 62;
  scores.mutable_data_as<int64_t>()[0] = base + 1;
  scores.mutable_data_as<int64_t>()[1] = base;
  scores.mutable_data_as<int64_t>()[2] = base + 2;
  const Json response = Json::parse(EncodeInferResponse(manifest, *request, {{"y", scores}}).body);
  EXPECT_EQ(response["outputs"][0]["data"],
            Json::parse(R"(["4611686018427387906:2", "4611686018427387905:0",)"
                        R"( "4611686018427387904:1"])"));
}

TEST(ParseInferRequest, ClassificationCountsPastInt64AreAllClassesAndOutputsAreAskedOnce) {
  const packaging::Manifest manifest = EchoManifest(DataType::kFp32, {3});
  const std::string input = R"("inputs":[{"name":"x","datatype":"FP32","shape":[3],)"
                            R"("data":[0,0,0]}])";
  Result<InferRequest> request =
      Parse(manifest, "{" + input +
                          R"(,"outputs":[{"name":"y","parameters":)"
                          R"({"classification":18446744073709551615}}]})");
  ASSERT_TRUE(request.ok()) << request.status().message();
  EXPECT_EQ(request->classification.at("y"), INT64_MAX);

  // Two answers for one output (here two counts) would silently become one.
  request = Parse(manifest, "{" + input +
                                R"(,"outputs":[{"name":"y","parameters":{"classification":1}},)"
                                R"({"name":"y","parameters":{"classification":2}}]})");
  ASSERT_FALSE(request.ok());
  EXPECT_EQ(request.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(request.status().message(), "output 'y' is requested twice");
}

// Besides the data, each key and value becomes a document node many times the size of its text:
// a 64 MB body of "[]," took 1.5 GB before it was refused.
TEST(ParseInferRequest, BoundsTheKeysAndValuesBesideTheData) {
  const packaging::Manifest manifest = EchoManifest(DataType::kFp32, {-1});
  const std::string input = R"({"name":"x","datatype":"FP32","shape":[1],"data":[1]})";
  auto repeated = [](const std::string& item, int count) {
    std::string text;
    for (int i = 0; i < count; ++i) text += (i > 0 ? "," : "") + item;
    return text;
  };
  std::string parameters;
  for (int i = 0; i < 70000; ++i) {
    parameters += (i > 0 ? ",\"p" : "\"p") + std::to_string(i) + "\":1";
  }
  for (const std::string& body :
       {R"({"unread":[)" + repeated("[]", 70000) + R"(],"inputs":[)" + input + "]}",
        R"({"inputs":[)" + repeated("{}", 70000) + "]}",
        R"({"inputs":[)" + input + R"(],"parameters":{)" + parameters + "}}",
        R"({"inputs":[{"data":[1],"name":"x","datatype":"FP32","shape":[1],"x":[)" +
            repeated("{}", 70000) + "]}]}"}) {
    Result<InferRequest> request = Parse(manifest, body);
    ASSERT_FALSE(request.ok()) << body.substr(0, 40);
    EXPECT_EQ(request.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(request.status().message(),
              "the request JSON has more than 65536 keys and values besides its inputs' data");
  }

  // The data itself is not bounded, read while parsing or held in the document first.
  const std::string values = repeated("[0.5]", 100000);
  for (const std::string& body :
       {R"({"inputs":[{"name":"x","datatype":"FP32","shape":[100000,1],"data":[)" + values + "]}]}",
        R"({"inputs":[{"data":[)" + values +
            R"(],"name":"x","datatype":"FP32","shape":[100000,1]}]})"}) {
    Result<InferRequest> request = Parse(EchoManifest(DataType::kFp32, {-1, 1}), body);
    ASSERT_TRUE(request.ok()) << request.status().message();
  }
}

TEST(Codec, ARequestRoundTripsThroughTheEncoder) {
  // What the server answers, sent back as a request, reads as the same tensor.
  const packaging::Manifest manifest = EchoManifest(DataType::kFp32, {3});
  const std::vector<double> values = {0.1, -1e-30, 123456.789};
  Json response = Json::parse(
      EncodeInferResponse(manifest, InferRequest{}, {Output(DataType::kFp32, {3}, values)}).body);
  Json request = {{"inputs", {response["outputs"][0]}}};
  request["inputs"][0]["name"] = "x";
  Result<InferRequest> parsed = Parse(manifest, request.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const auto read = Values<float>(*parsed);
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(read[i], static_cast<float>(values[i]));
}

}  // namespace
}  // namespace orochi::server::kserve
