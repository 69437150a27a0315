// Fuzzes the JSON pull parser (server/kserve/json_pull_parser.h), which reads every inference
// request body first, on arbitrary bytes. The whole input is the text. Besides what the
// sanitizers catch (a read past the text, a signed overflow), it checks what the parser
// promises: every text ends in kEnd or kError, each event takes at least one byte (so no text
// makes it loop), both stay once reached, and errors say where within the text. It reads the
// text with the server's options (NaN and Infinity allowed, a depth limit), which only those
// invariants hold for, and with the default options, where it must also agree with nlohmann's
// parser event for event on which texts are JSON (but for a NUL byte, see below), as
// json_pull_parser_test checks for chosen texts.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "json_events.h"
#include "kserve/json_pull_parser.h"

namespace {

using orochi::server::kserve::JsonEvent;
using orochi::server::kserve::JsonPullParser;

using orochi::server::kserve::json_events::EventText;
using orochi::server::kserve::json_events::Recorder;

// The parser's events to the end of `text`, or nothing when it refuses the text; traps on a
// broken invariant.
std::optional<std::vector<std::string>> Events(std::string_view text,
                                               JsonPullParser::Options options) {
  JsonPullParser parser(text, options);
  std::vector<std::string> events;
  size_t last_offset = 0;
  // One event per byte at most, and the end: more means the parser stopped advancing.
  for (size_t count = 0; count <= text.size() + 1; ++count) {
    const JsonEvent event = parser.Next();
    if (event == JsonEvent::kError) {
      OROCHI_FUZZ_CHECK(!parser.error().empty(), "an error without a message");
      OROCHI_FUZZ_CHECK(parser.error_offset() <= text.size(), "an error past the text");
      OROCHI_FUZZ_CHECK(parser.Next() == JsonEvent::kError, "an error that did not stay");
      return std::nullopt;
    }
    OROCHI_FUZZ_CHECK(parser.offset() <= text.size(), "an event past the text");
    if (event == JsonEvent::kEnd) {
      OROCHI_FUZZ_CHECK(parser.Next() == JsonEvent::kEnd, "the end that did not stay");
      return events;
    }
    OROCHI_FUZZ_CHECK(parser.offset() > last_offset, "an event that read nothing");
    last_offset = parser.offset();
    // "-0" is a kInteger too, as nlohmann reads it.
    OROCHI_FUZZ_CHECK(event != JsonEvent::kInteger || parser.integer() <= 0,
                      "kInteger for a positive number");
    events.push_back(EventText(parser, event));
  }
  OROCHI_FUZZ_CHECK(false, "more events than the text has bytes");
  return std::nullopt;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  // As ReadRequestJson reads a request (the server's default max_json_depth).
  Events(text, {.allow_nan_and_infinity = true, .max_depth = 64});

  const std::optional<std::vector<std::string>> events = Events(text, {});
  // nlohmann takes a NUL byte for the end of the text (for C strings), and so accepts "1\0x";
  // a NUL is never JSON, in a string or out of one.
  if (text.find('\0') != std::string_view::npos) {
    OROCHI_FUZZ_CHECK(!events.has_value(), "a NUL byte accepted");
    return 0;
  }
  Recorder recorder;
  const bool nlohmann_accepts = nlohmann::json::sax_parse(text, &recorder);
  OROCHI_FUZZ_CHECK(events.has_value() == nlohmann_accepts,
                    nlohmann_accepts ? "accepted by nlohmann, refused here"
                                     : "refused by nlohmann, accepted here");
  if (nlohmann_accepts) {
    OROCHI_FUZZ_CHECK(*events == recorder.events, "events differ from nlohmann's");
  }
  return 0;
}
