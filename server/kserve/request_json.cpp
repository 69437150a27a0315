#include "request_json.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "json_pull_parser.h"
#include "orochi/base/check.h"
#include "orochi/engine/dtype.h"
#include "orochi/engine/tensor.h"

namespace orochi::server::kserve {
namespace {

using interpreters::BytesTensor;
using packaging::DataType;
using packaging::Manifest;
using packaging::TensorSpec;
using TensorValue = std::variant<engine::Tensor, BytesTensor>;

// A number read from a request, for messages: as JSON writes it, and NaN and the infinities as
// the request may spell them.
std::string NumberText(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return Json(value).dump();
}

// A number's text for a message: its first 32 characters.
std::string Shortened(std::string_view text) {
  return text.size() <= 32 ? std::string(text) : std::string(text.substr(0, 32)) + "...";
}

}  // namespace

std::string Quoted(const std::string& text) {
  return Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
}

Result<engine::Shape> ReadShape(const Json& input, const std::string& input_name) {
  auto shape_json = input.find("shape");
  if (shape_json == input.end() || !shape_json->is_array()) {
    return InvalidArgument("input '" + input_name + "' has no 'shape'");
  }
  std::vector<int64_t> dims;
  for (const Json& size : *shape_json) {
    if (!size.is_number_integer()) {
      return InvalidArgument("input '" + input_name + "': shape must hold non-negative integers");
    }
    dims.push_back(size.get<int64_t>());
  }
  return CheckInputShape(std::move(dims), input_name);
}

Result<engine::Shape> CheckInputShape(std::vector<int64_t> dims, const std::string& input_name) {
  for (int64_t size : dims) {
    if (size < 0) {
      return InvalidArgument("input '" + input_name + "': shape must hold non-negative integers");
    }
  }
  if (dims.size() > engine::kMaxDims) {
    return InvalidArgument("input '" + input_name + "': too many dims");
  }
  engine::Shape shape(dims.begin(), dims.end());
  int64_t elements = 1;
  for (int64_t size : shape) {
    if (__builtin_mul_overflow(elements, size, &elements) || elements > (int64_t{1} << 40)) {
      return InvalidArgument("input '" + input_name + "': shape " + engine::ShapeString(shape) +
                             " is too large");
    }
  }
  return shape;
}

namespace {

// Numbers and booleans of one datatype. With the shape known up front the values go straight
// into the tensor; otherwise they are collected (bool as bytes: std::vector<bool> packs bits)
// and copied into it once.
template <typename T>
class NumericData final : public TensorData {
 public:
  NumericData(const TensorSpec& spec, engine::DType dtype,
              const std::optional<engine::Shape>& expected_shape)
      : TensorData(spec), dtype_(dtype) {
    if (expected_shape) {
      tensor_ = engine::Tensor::Empty(*expected_shape, dtype);
      in_place_ = tensor_.mutable_data_as<T>();
      capacity_ = tensor_.numel();
    }
  }

  void Bool(bool value) override {
    if (!Take()) return;
    if constexpr (std::is_same_v<T, bool>) {
      Put(value);
    } else {
      RefuseValue(value ? "true" : "false");
    }
  }
  void Integer(int64_t value) override { Whole(value); }
  void Unsigned(uint64_t value) override { Whole(value); }
  void Float(double value) override {
    if (!Take()) return;
    if constexpr (std::is_integral_v<T>) {
      RefuseValue(NumberText(value));
    } else {
      PutFloating(value, [&] { return NumberText(value); });
    }
  }
  void BigInteger(double value, std::string_view text) override {
    if constexpr (std::is_same_v<T, bool>) {
      if (Take()) RefuseValue(Shortened(text));
    } else if constexpr (std::is_integral_v<T>) {
      // Not "expected integers": it is one, past the range (as a double it may even round
      // into it: -9223372036854775809 is -2^63).
      if (Take()) RefuseOutOfRange(Shortened(text));
    } else {
      Float(value);
    }
  }
  void String(std::string&& value) override {
    if (Take()) RefuseValue(Quoted(value));
  }

 private:
  using Stored = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;

  template <typename Integer>
  void Whole(Integer value) {
    if (!Take()) return;
    if constexpr (std::is_same_v<T, bool>) {
      RefuseValue(std::to_string(value));
    } else if constexpr (std::is_integral_v<T>) {
      // Out of range is refused, not wrapped: 300 for UINT8 would silently be 44.
      if (!std::in_range<T>(value)) {
        RefuseOutOfRange(std::to_string(value));
        return;
      }
      Put(static_cast<T>(value));
    } else {
      PutFloating(static_cast<double>(value), [&] { return std::to_string(value); });
    }
  }

  // A finite number past the datatype's range is refused, as an integer past its range is:
  // 1e39 as FP32 or 70000 as FP16 would otherwise become infinity. Infinity itself is kept.
  template <typename Text>
  void PutFloating(double value, Text text) {
    const T converted = engine::Convert<T>(value);
    if (std::isinf(engine::Convert<double>(converted)) && !std::isinf(value)) {
      const double largest = LargestFinite();
      Refuse(Heading() + ": " + text() + " is out of its range [" + Json(-largest).dump() + ", " +
             Json(largest).dump() + "]");
      return;
    }
    Put(converted);
  }

  static double LargestFinite() {
    if constexpr (std::is_same_v<T, engine::Half>) {
      return engine::Convert<double>(engine::Half{0x7BFF});
    } else if constexpr (std::is_same_v<T, engine::BFloat16>) {
      return engine::Convert<double>(engine::BFloat16{0x7F7F});
    } else {
      return static_cast<double>(std::numeric_limits<T>::max());
    }
  }

  void Put(T value) {
    if (in_place_ == nullptr) {
      collected_.push_back(static_cast<Stored>(value));
    } else if (count_ <= capacity_) {
      in_place_[count_ - 1] = value;  // past the capacity only counted, for the error
    }
  }

  void RefuseOutOfRange(std::string_view text) requires std::is_integral_v<T> {
    using Limits = std::numeric_limits<T>;
    Refuse(Heading() + ": " + std::string(text) + " is out of its range [" +
           std::to_string(+Limits::min()) + ", " + std::to_string(+Limits::max()) + "]");
  }

  std::string Heading() const {
    return "input '" + spec_.name + "' is " + std::string(DataTypeName(spec_.datatype));
  }
  std::string_view Expectation() const override {
    return std::is_same_v<T, bool> ? "true or false"
           : std::is_integral_v<T> ? "integers"
                                   : "numbers";
  }
  void RefuseValue(std::string_view got) {
    Refuse(Heading() + ": expected " + std::string(Expectation()) + ", got " + std::string(got));
  }

  Result<TensorValue> Values(const engine::Shape& shape) override {
    if (in_place_ != nullptr) {
      OROCHI_INTERNAL_ASSERT(tensor_.shape() == shape,
                             "the request's shape changed after its data was read");
      return TensorValue(std::move(tensor_));
    }
    engine::Tensor tensor = engine::Tensor::Empty(shape, dtype_);
    if (!collected_.empty()) {
      std::memcpy(tensor.mutable_data(), collected_.data(), collected_.size() * sizeof(Stored));
    }
    return TensorValue(std::move(tensor));
  }

  engine::DType dtype_;
  engine::Tensor tensor_;
  T* in_place_ = nullptr;
  int64_t capacity_ = 0;
  std::vector<Stored> collected_;
};

class BytesData final : public TensorData {
 public:
  BytesData(const TensorSpec& spec, const std::optional<engine::Shape>& expected_shape)
      : TensorData(spec) {
    if (expected_shape) items_.reserve(static_cast<size_t>(engine::NumElements(*expected_shape)));
  }
  void Bool(bool value) override { RefuseValue(value ? "true" : "false"); }
  void Integer(int64_t value) override { RefuseValue(std::to_string(value)); }
  void Unsigned(uint64_t value) override { RefuseValue(std::to_string(value)); }
  void Float(double value) override { RefuseValue(NumberText(value)); }
  void BigInteger(double /*value*/, std::string_view text) override {
    RefuseValue(Shortened(text));
  }
  void String(std::string&& value) override {
    if (Take()) items_.push_back(std::move(value));
  }

 private:
  std::string_view Expectation() const override { return "strings"; }
  void RefuseValue(std::string_view got) {
    if (!Take()) return;
    Refuse("input '" + spec_.name + "' is BYTES: expected strings, got " + std::string(got));
  }
  Result<TensorValue> Values(const engine::Shape& shape) override {
    return TensorValue(BytesTensor{shape, std::move(items_)});
  }
  std::vector<std::string> items_;
};

}  // namespace

std::unique_ptr<TensorData> TensorData::For(const TensorSpec& spec,
                                            const std::optional<engine::Shape>& expected_shape) {
  if (spec.datatype == DataType::kBytes) return std::make_unique<BytesData>(spec, expected_shape);
  const engine::DType dtype = *packaging::EngineDType(spec.datatype);
  std::unique_ptr<TensorData> data;
  engine::VisitDType(dtype, [&]<typename T>() {
    data = std::make_unique<NumericData<T>>(spec, dtype, expected_shape);
  });
  return data;
}

void TensorData::StartArray() {
  const auto depth = static_cast<int>(open_sizes_.size());
  if (!open_sizes_.empty()) ++open_sizes_.back();
  deepest_array_ = std::max(deepest_array_, depth);
  open_sizes_.push_back(0);
  if (size_at_depth_.size() <= open_sizes_.size() - 1) size_at_depth_.push_back(-1);
}

void TensorData::EndArray() {
  const int64_t size = open_sizes_.back();
  open_sizes_.pop_back();
  int64_t& seen = size_at_depth_[open_sizes_.size()];
  if (seen == -1) {
    seen = size;
  } else if (seen != size) {
    ragged_ = true;
  }
}

bool TensorData::Take() {
  ++count_;
  const auto depth = static_cast<int>(open_sizes_.size());
  if (!open_sizes_.empty()) ++open_sizes_.back();
  if (shallowest_value_ < 0 || depth < shallowest_value_) shallowest_value_ = depth;
  deepest_value_ = std::max(deepest_value_, depth);
  return error_.ok();
}

void TensorData::Refuse(std::string message) {
  if (error_.ok()) error_ = InvalidArgument(std::move(message));
}

void TensorData::NotAValue(std::string_view what) {
  if (!Take()) return;
  Refuse("input '" + spec_.name + "' is " + std::string(DataTypeName(spec_.datatype)) +
         ": expected " + std::string(Expectation()) + ", got " + std::string(what));
}

// Nested data must be nested exactly as the shape (flat data is the other accepted layout): a
// ragged or differently nested list with the right number of values is a mistake, not a layout.
bool TensorData::FollowsShape(const engine::Shape& shape) const {
  if (ragged_) return false;
  const auto rank = static_cast<int>(shape.size());
  // Arrays reach down to the last dim, or stop at the first empty one.
  int deepest_expected = rank - 1;
  for (int depth = 0; depth < rank - 1; ++depth) {
    if (shape[depth] == 0) {
      deepest_expected = depth;
      break;
    }
  }
  if (deepest_array_ != deepest_expected) return false;
  for (int depth = 0; depth <= deepest_array_; ++depth) {
    if (size_at_depth_[depth] != shape[depth]) return false;
  }
  return deepest_value_ < 0 || (shallowest_value_ == rank && deepest_value_ == rank);
}

Result<TensorValue> TensorData::Finish(const engine::Shape& shape) {
  if (deepest_array_ >= 1 && !FollowsShape(shape)) {
    return InvalidArgument(
        "input '" + spec_.name + "' has nested data that does not follow its shape " +
        engine::ShapeString(shape) + " (send it flat, or nested exactly as the shape)");
  }
  const int64_t elements = engine::NumElements(shape);
  if (count_ != elements) {
    return InvalidArgument("input '" + spec_.name + "' has " + std::to_string(count_) +
                           " values, but shape " + engine::ShapeString(shape) + " needs " +
                           std::to_string(elements));
  }
  if (!error_.ok()) return error_;
  return Values(shape);
}

void TensorData::Feed(const Json& data) {
  switch (data.type()) {
    case Json::value_t::array:
      StartArray();
      for (const Json& item : data) Feed(item);
      EndArray();
      break;
    case Json::value_t::boolean:
      Bool(data.get<bool>());
      break;
    case Json::value_t::number_integer:
      Integer(data.get<int64_t>());
      break;
    case Json::value_t::number_unsigned:
      Unsigned(data.get<uint64_t>());
      break;
    case Json::value_t::number_float:
      Float(data.get<double>());
      break;
    case Json::value_t::string:
      String(data.get<std::string>());
      break;
    case Json::value_t::object:
      NotAValue("an object");
      break;
    default:
      NotAValue("null");
      break;
  }
}

namespace {

// Keys and values a request may hold besides its inputs' data. Each is a document node of 50 to
// 100 bytes from as few as 2 bytes of text ("[],"): without a bound, a 64 MB body of them took
// 1.5 GB. Real requests have a few per input and output and one per parameter.
constexpr int64_t kMaxValuesBesideData = int64_t{1} << 16;

// Why the body could not be parsed, where, and the text that led there (printable ASCII only:
// the message goes back to the client and into logs).
std::string JsonErrorMessage(const JsonPullParser& parser, std::string_view text) {
  if (parser.error_kind() == JsonPullParser::ErrorKind::kTooDeep) {
    return "the request JSON is " + parser.error();
  }
  const size_t offset = parser.error_offset();
  // Valid JSON, but no datatype holds the number.
  const std::string what = parser.error_kind() == JsonPullParser::ErrorKind::kNumberTooLarge
                               ? "the request JSON has a number out of range at byte "
                               : "the request body is not valid JSON at byte ";
  const size_t end = std::min(offset + 1, text.size());
  const size_t begin = end - std::min<size_t>(end, 24);
  std::string near;
  for (char c : text.substr(begin, end - begin)) near += (c >= 0x20 && c < 0x7f) ? c : '?';
  return what + std::to_string(offset + 1) + ": " + parser.error() + " (near '" + near + "')";
}

class RequestBuilder;
// Reads the next event and hands it to `builder`; returns it.
JsonEvent Forward(JsonPullParser& parser, RequestBuilder& builder);

// Builds the request document from the parser's events, except inside an input's `data`
// array, whose events go to a TensorData once the input's name and datatype have been seen.
class RequestBuilder {
 public:
  RequestBuilder(const Manifest& manifest, std::string_view text, const JsonPullParser& parser,
                 int max_depth)
      : manifest_(manifest),
        text_(text),
        parser_(parser),
        max_depth_(max_depth),
        preallocation_budget_(text.size() / 2 + 1) {}

  void Null() {
    Scalar([](TensorData& data) { data.NotAValue("null"); }, nullptr);
  }
  void Bool(bool value) {
    Scalar([&](TensorData& data) { data.Bool(value); }, value);
  }
  void Integer(int64_t value) {
    Scalar([&](TensorData& data) { data.Integer(value); }, value);
  }
  void Unsigned(uint64_t value) {
    Scalar([&](TensorData& data) { data.Unsigned(value); }, value);
  }
  void Float(double value) {
    Scalar([&](TensorData& data) { data.Float(value); }, value);
  }
  void BigInteger(double value, std::string_view text) {
    Scalar([&](TensorData& data) { data.BigInteger(value, text); }, value);
  }
  void String(std::string& value) {
    // Moved into whichever takes it: the lambda runs only when the document does not.
    Scalar([&](TensorData& data) { data.String(std::move(value)); },
           [&] { return Json(std::move(value)); });
  }

  void StartObject() {
    if (passing_depth_ > 0) {
      ++passing_depth_;
      return;
    }
    if (reading_ != nullptr) {
      // An object where a value belongs: refused once, its contents skipped.
      if (skipped_++ == 0) reading_->NotAValue("an object");
      return;
    }
    Role role = Role::kOther;
    size_t input_index = 0;
    if (open_.empty()) {
      role = Role::kRoot;
    } else if (next_is_data_ || open_.back().role == Role::kData) {
      role = Role::kData;
    } else if (open_.back().role == Role::kInputs) {
      role = Role::kInput;
      input_index = open_.back().node->size();
      if (data_.size() <= input_index) data_.resize(input_index + 1);
    }
    Json* node = Place(Json::object());
    open_.push_back({node, role, input_index});
  }

  // False when the key was given twice, or is one too many (error()).
  bool Key(std::string& name) {
    if (reading_ != nullptr || passing_depth_ > 0) return true;
    if (!CountBesideData()) return false;
    Frame& top = open_.back();
    // Which of two equal keys counts is a guess either way; say so instead of choosing.
    if (top.role != Role::kData && top.node->contains(name)) {
      error_ =
          InvalidArgument("the request JSON has the key " + Quoted(name) + " twice in one object");
      return false;
    }
    slot_ = &(*top.node)[name];
    next_is_data_ = top.role == Role::kInput && name == "data";
    next_is_inputs_ = top.role == Role::kRoot && name == "inputs";
    return true;
  }

  void EndObject() {
    if (passing_depth_ > 0) {
      --passing_depth_;
      return;
    }
    if (reading_ != nullptr) {
      --skipped_;
      return;
    }
    const Frame& frame = open_.back();
    if (frame.role == Role::kInput && frame.input_index < passed_data_.size() &&
        passed_data_[frame.input_index]) {
      ReadPassedData(*passed_data_[frame.input_index]);
    }
    open_.pop_back();
  }

  void StartArray() {
    if (passing_depth_ > 0) {
      ++passing_depth_;
      return;
    }
    if (reading_ != nullptr) {
      if (skipped_ > 0) {
        ++skipped_;
      } else {
        reading_->StartArray();
        ++reading_depth_;
      }
      return;
    }
    if (next_is_data_) {
      reading_ = StartData();
      if (reading_ != nullptr) {
        next_is_data_ = false;
        reading_->StartArray();
        reading_depth_ = 1;
        return;  // the document keeps a null in its place
      }
      // Before the input's name or datatype: passed over now and read from the text when the
      // input object ends. As a document it would take 16 bytes a value and some 60 an array
      // (a 64 MB body of "[]," took 1.5 GB).
      next_is_data_ = false;
      passing_depth_ = 1;
      passing_from_ = parser_.offset() - 1;
      passing_input_ = open_.back().input_index;
      return;
    }
    Role role = Role::kOther;
    if (next_is_inputs_) {
      role = Role::kInputs;
    } else if (next_is_data_ || (!open_.empty() && open_.back().role == Role::kData)) {
      role = Role::kData;
    }
    Json* node = Place(Json::array());
    open_.push_back({node, role, 0});
  }

  void EndArray() {
    if (passing_depth_ > 0) {
      if (--passing_depth_ == 0) {
        if (passed_data_.size() <= passing_input_) passed_data_.resize(passing_input_ + 1);
        passed_data_[passing_input_] =
            std::string_view(text_.data() + passing_from_, parser_.offset() - passing_from_);
      }
      return;
    }
    if (reading_ != nullptr) {
      if (skipped_ > 0) {
        --skipped_;
        return;
      }
      reading_->EndArray();
      if (--reading_depth_ == 0) reading_ = nullptr;
      return;
    }
    open_.pop_back();
  }

  RequestJson Release() { return {std::move(root_), std::move(data_)}; }
  // Set once the request is refused; the events after it are not looked at.
  bool failed() const { return !error_.ok(); }
  const Status& error() const { return error_; }

 private:
  // kData: inside an input's `data` kept in the document, where an object is refused as a
  // value anyway, whatever its keys (as when the data is read while parsing).
  enum class Role { kOther, kRoot, kInputs, kInput, kData };
  struct Frame {
    Json* node;
    Role role;
    size_t input_index;  // for kInput: its position in `inputs`
  };

  // A value: to the data being read (unless inside an object there, which is skipped), or
  // into the document. `value` is the value, or a function making it.
  template <typename Read, typename Value>
  void Scalar(Read read, Value&& value) {
    if (passing_depth_ > 0) return;
    if (reading_ != nullptr) {
      if (skipped_ == 0) read(*reading_);
      return;
    }
    if constexpr (std::is_invocable_v<Value>) {
      Place(value());
    } else {
      Place(Json(std::forward<Value>(value)));
    }
  }

  // Counts a key or value that is not an input's data; false (error()) past the bound.
  bool CountBesideData() {
    if (++values_beside_data_ <= kMaxValuesBesideData) return true;
    if (error_.ok()) {
      error_ =
          InvalidArgument("the request JSON has more than " + std::to_string(kMaxValuesBesideData) +
                          " keys and values besides its inputs' data");
    }
    return false;
  }

  // Puts a value where the document expects the next one; returns it.
  Json* Place(Json value) {
    // Data held in the document (it came before its input's name) is as large as the request;
    // an object there is refused later, but is no data to be held meanwhile.
    const bool data = !open_.empty() && open_.back().role == Role::kData && !value.is_object();
    if (!data) CountBesideData();
    next_is_data_ = false;
    next_is_inputs_ = false;
    if (open_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Json& top = *open_.back().node;
    if (top.is_array()) {
      top.push_back(std::move(value));
      return &top.back();
    }
    *slot_ = std::move(value);
    return slot_;
  }

  // A reader for the data array starting now, when its input's name and datatype are known
  // (and match the model): clients send them first. Otherwise the document keeps the data.
  TensorData* StartData() {
    const Frame& input = open_.back();
    const Json& object = *input.node;
    auto name = object.find("name");
    auto datatype = object.find("datatype");
    if (name == object.end() || !name->is_string() || datatype == object.end() ||
        !datatype->is_string()) {
      return nullptr;
    }
    auto spec = std::find_if(
        manifest_.inputs.begin(), manifest_.inputs.end(),
        [&](const TensorSpec& s) { return s.name == name->get_ref<const std::string&>(); });
    if (spec == manifest_.inputs.end() ||
        datatype->get_ref<const std::string&>() != DataTypeName(spec->datatype)) {
      return nullptr;
    }
    std::unique_ptr<TensorData>& data = data_[input.input_index];
    data = TensorData::For(*spec, ExpectedShape(object));
    return data.get();
  }

  // Reads the data array that came before its input's name or datatype, now that the input
  // object has ended: its text was valid JSON then, and is read by the same rules again.
  void ReadPassedData(std::string_view data_text) {
    reading_ = StartData();
    if (reading_ == nullptr) return;  // the codec refuses the input for its name or datatype
    JsonPullParser parser(data_text, {.allow_nan_and_infinity = true, .max_depth = max_depth_});
    for (;;) {
      const JsonEvent event = Forward(parser, *this);
      if (event == JsonEvent::kEnd) break;
      if (event == JsonEvent::kError) {
        // Cannot happen: the text was read once already, by the same rules.
        error_ = InvalidArgument("the data of an input could not be read again: " + parser.error());
        break;
      }
    }
    reading_ = nullptr;
  }

  // The input's shape when it was given before its data and is plausible: every value takes
  // at least two bytes of text ("1,"), so the shapes that are allocated up front claim no more
  // values together than the body can hold. Past that, a shape is only counted against (the
  // request is refused when its values are), so that many inputs with large shapes and no
  // data cannot make a small body allocate without bound.
  std::optional<engine::Shape> ExpectedShape(const Json& input) {
    Result<engine::Shape> shape = ReadShape(input, "");
    if (!shape.ok()) return std::nullopt;
    const auto elements = static_cast<uint64_t>(engine::NumElements(*shape));
    if (elements > preallocation_budget_) return std::nullopt;
    preallocation_budget_ -= elements;
    return std::move(shape).value();
  }

  const Manifest& manifest_;
  std::string_view text_;
  const JsonPullParser& parser_;
  int max_depth_;
  uint64_t preallocation_budget_;  // values the shapes allocated so far leave to the others
  Json root_;
  std::vector<Frame> open_;
  Json* slot_ = nullptr;  // in the innermost open object, where the value of the last key goes
  bool next_is_data_ = false;
  bool next_is_inputs_ = false;
  std::vector<std::unique_ptr<TensorData>> data_;
  TensorData* reading_ = nullptr;  // the data array being read, if any
  int reading_depth_ = 0;          // its arrays open
  int skipped_ = 0;                // containers open inside an object within it
  // Data arrays that came before their input's name or datatype, by input position.
  std::vector<std::optional<std::string_view>> passed_data_;
  int passing_depth_ = 0;  // arrays and objects open in the one being passed over
  size_t passing_from_ = 0;
  size_t passing_input_ = 0;
  int64_t values_beside_data_ = 0;
  Status error_;  // the first refusal
};

JsonEvent Forward(JsonPullParser& parser, RequestBuilder& builder) {
  const JsonEvent event = parser.Next();
  switch (event) {
    case JsonEvent::kStartObject:
      builder.StartObject();
      break;
    case JsonEvent::kEndObject:
      builder.EndObject();
      break;
    case JsonEvent::kStartArray:
      builder.StartArray();
      break;
    case JsonEvent::kEndArray:
      builder.EndArray();
      break;
    case JsonEvent::kKey:
      builder.Key(parser.string());  // a refusal is the builder's failed()
      break;
    case JsonEvent::kString:
      builder.String(parser.string());
      break;
    case JsonEvent::kNull:
      builder.Null();
      break;
    case JsonEvent::kBool:
      builder.Bool(parser.boolean());
      break;
    case JsonEvent::kInteger:
      builder.Integer(parser.integer());
      break;
    case JsonEvent::kUnsigned:
      builder.Unsigned(parser.unsigned_integer());
      break;
    case JsonEvent::kFloat:
      if (parser.integer_past_64_bits()) {
        builder.BigInteger(parser.number(), parser.number_text());
      } else {
        builder.Float(parser.number());
      }
      break;
    case JsonEvent::kEnd:
    case JsonEvent::kError:
      break;
  }
  return event;
}

}  // namespace

Result<RequestJson> ReadRequestJson(std::string_view text, const Manifest& manifest,
                                    int max_depth) {
  JsonPullParser parser(text, {.allow_nan_and_infinity = true, .max_depth = max_depth});
  RequestBuilder builder(manifest, text, parser, max_depth);
  for (;;) {
    switch (Forward(parser, builder)) {
      case JsonEvent::kEnd:
        return builder.Release();
      case JsonEvent::kError:
        return InvalidArgument(JsonErrorMessage(parser, text));
      default:
        break;
    }
    if (builder.failed()) return builder.error();
  }
}

}  // namespace orochi::server::kserve
