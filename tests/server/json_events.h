// JSON events written as text ("{", "k:name", "i:-3", "f:<bits>", ...), from nlohmann's SAX
// parser and from the server's pull parser alike, so that tests and the fuzzer can hold the
// pull parser to nlohmann event for event.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kserve/json_pull_parser.h"

namespace orochi::server::kserve::json_events {

inline std::string FloatEvent(double value) {
  return "f:" + std::to_string(std::bit_cast<uint64_t>(value));  // tells -0.0 from 0.0
}

// nlohmann's events (nlohmann::json::sax_parse(text, &recorder)).
class Recorder {
 public:
  bool null() { return Add("n"); }
  bool boolean(bool value) { return Add(value ? "true" : "false"); }
  bool number_integer(int64_t value) { return Add("i:" + std::to_string(value)); }
  bool number_unsigned(uint64_t value) { return Add("u:" + std::to_string(value)); }
  bool number_float(double value, const std::string& /*text*/) { return Add(FloatEvent(value)); }
  bool string(std::string& value) { return Add("s:" + value); }
  static bool binary(nlohmann::json::binary_t& /*value*/) { return false; }
  bool start_object(size_t /*size*/) { return Add("{"); }
  bool key(std::string& value) { return Add("k:" + value); }
  bool end_object() { return Add("}"); }
  bool start_array(size_t /*size*/) { return Add("["); }
  bool end_array() { return Add("]"); }
  static bool parse_error(size_t /*position*/, const std::string& /*token*/,
                          const nlohmann::detail::exception& /*error*/) {
    return false;
  }
  std::vector<std::string> events;

 private:
  bool Add(std::string event) {
    events.push_back(std::move(event));
    return true;
  }
};

// The pull parser's `event`, just returned by parser.Next(), as Recorder writes it.
// Precondition: `event` is neither kEnd nor kError.
inline std::string EventText(JsonPullParser& parser, JsonEvent event) {
  switch (event) {
    case JsonEvent::kStartObject:
      return "{";
    case JsonEvent::kEndObject:
      return "}";
    case JsonEvent::kStartArray:
      return "[";
    case JsonEvent::kEndArray:
      return "]";
    case JsonEvent::kKey:
      return "k:" + parser.string();
    case JsonEvent::kString:
      return "s:" + parser.string();
    case JsonEvent::kNull:
      return "n";
    case JsonEvent::kBool:
      return parser.boolean() ? "true" : "false";
    case JsonEvent::kInteger:
      return "i:" + std::to_string(parser.integer());
    case JsonEvent::kUnsigned:
      return "u:" + std::to_string(parser.unsigned_integer());
    case JsonEvent::kFloat:
      return FloatEvent(parser.number());
    case JsonEvent::kEnd:
    case JsonEvent::kError:
      break;
  }
  return "?";
}

}  // namespace orochi::server::kserve::json_events
