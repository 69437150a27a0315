// Reading an inference request's JSON (events from JsonPullParser).
//
// A request is mostly a few small objects around large `data` arrays. As a JSON document every
// value of those arrays would be a node of 16 bytes in a growing vector, and the conversion to
// the input's datatype another pass: a 60 MB body took 2 GB and seconds of an I/O thread. Here
// each input's `data` is converted as it is read, straight into a tensor of the input's shape
// when its name, datatype and shape come first (as clients send them), or read again from the
// text when its input object ends where they come after it; only the rest of the request
// becomes a document.
//
// Thread-safety: none needed; every object here belongs to the one request being parsed.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "orochi/base/status.h"
#include "orochi/interpreters/model.h"
#include "orochi/packaging/manifest.h"

namespace orochi::server::kserve {

using Json = nlohmann::json;

// `text` as a JSON string; invalid UTF-8 becomes U+FFFD.
std::string Quoted(const std::string& text);
// An input object's "shape": non-negative integers, at most engine::kMaxDims of them, and at
// most 2^40 elements. Errors name `input_name`.
Result<engine::Shape> ReadShape(const Json& input, const std::string& input_name);
// The same checks of a shape read by another protocol.
Result<engine::Shape> CheckInputShape(std::vector<int64_t> dims, const std::string& input_name);

// One input's `data`, value by value: converted to the input's datatype as it arrives, and its
// nesting recorded so that Finish can tell whether it follows the shape. The first wrong value
// is remembered (and later ones are only counted), so errors read as a whole-document check
// would give them.
class TensorData {
 public:
  virtual ~TensorData() = default;
  // `expected_shape`, when the shape is known before the data, sizes the tensor up front so
  // that values are written in place; without it they are collected and copied once.
  static std::unique_ptr<TensorData> For(const packaging::TensorSpec& spec,
                                         const std::optional<engine::Shape>& expected_shape);

  void StartArray();
  void EndArray();
  virtual void Bool(bool value) = 0;
  virtual void Integer(int64_t value) = 0;
  virtual void Unsigned(uint64_t value) = 0;
  virtual void Float(double value) = 0;
  // An integer past 64 bits, read as the double `value`; `text` as written, for errors.
  virtual void BigInteger(double value, std::string_view text) = 0;
  virtual void String(std::string&& value) = 0;
  // A null or an object where a value should be: `what` names it for the error.
  void NotAValue(std::string_view what);

  // The values as a tensor of `shape`: an error when the nesting does not follow the shape,
  // the count differs from the shape's, or a value did not fit the datatype. Call once.
  Result<std::variant<engine::Tensor, interpreters::BytesTensor>> Finish(
      const engine::Shape& shape);

  // Replays a `data` that the document holds: one that is not an array.
  void Feed(const Json& data);

 protected:
  explicit TensorData(const packaging::TensorSpec& spec) : spec_(spec) {}
  // Counts one value at the current depth; false once an earlier value was wrong, so that the
  // sinks stop converting.
  bool Take();
  void Refuse(std::string message);
  virtual Result<std::variant<engine::Tensor, interpreters::BytesTensor>> Values(
      const engine::Shape& shape) = 0;
  // What the values must be, for errors: "integers", "strings", ...
  virtual std::string_view Expectation() const = 0;

  const packaging::TensorSpec& spec_;
  int64_t count_ = 0;

 private:
  bool FollowsShape(const engine::Shape& shape) const;

  Status error_;  // the first refusal (Refuse)
  // Nesting: sizes of the arrays still open, the size every array at each depth had so far
  // (-1 before the first closed), and where values and arrays were seen.
  std::vector<int64_t> open_sizes_;
  std::vector<int64_t> size_at_depth_;
  bool ragged_ = false;
  int deepest_array_ = -1;  // 0: `data` itself is an array
  int shallowest_value_ = -1;
  int deepest_value_ = -1;
};

struct RequestJson {
  Json document;  // the request, with each input's `data` left null where it was read below
  // By position in `inputs`: the data read while parsing, or null where the document holds it.
  std::vector<std::unique_ptr<TensorData>> data;
};

// Parses `text` as a request for `manifest`'s model. Errors (kInvalidArgument) name what is
// wrong: invalid JSON with its byte offset, nesting past `max_depth`, a key given twice.
Result<RequestJson> ReadRequestJson(std::string_view text, const packaging::Manifest& manifest,
                                    int max_depth);

}  // namespace orochi::server::kserve
