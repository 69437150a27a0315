// The request parser against nlohmann's: the same events for every text nlohmann accepts, a
// refusal for every text it refuses (hand-picked edge cases of RFC 8259, random documents, and
// those documents mutated byte by byte), plus what only this parser does: NaN and Infinity when
// asked, a depth limit, and messages that say where and what.
#include "kserve/json_pull_parser.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "json_events.h"

namespace orochi::server::kserve {
namespace {

using ::testing::HasSubstr;

using json_events::EventText;
using json_events::FloatEvent;
using json_events::Recorder;

// nlohmann's events, or nothing when it refuses the text.
std::optional<std::vector<std::string>> NlohmannEvents(const std::string& text) {
  Recorder recorder;
  if (!nlohmann::json::sax_parse(text, &recorder)) return std::nullopt;
  return std::move(recorder.events);
}

std::optional<std::vector<std::string>> Events(const std::string& text,
                                               JsonPullParser::Options options = {}) {
  JsonPullParser parser(text, options);
  std::vector<std::string> events;
  for (;;) {
    const JsonEvent event = parser.Next();
    switch (event) {
      case JsonEvent::kEnd:
        EXPECT_EQ(parser.Next(), JsonEvent::kEnd);  // and stays there
        return events;
      case JsonEvent::kError:
        EXPECT_FALSE(parser.error().empty()) << text;
        EXPECT_LE(parser.error_offset(), text.size()) << text;
        EXPECT_EQ(parser.Next(), JsonEvent::kError);
        return std::nullopt;
      default:
        events.push_back(EventText(parser, event));
    }
  }
}

// Reads to the end; the error, or "(no error)".
std::string ErrorOf(JsonPullParser& parser) {
  for (;;) {
    const JsonEvent event = parser.Next();
    if (event == JsonEvent::kEnd) return "(no error)";
    if (event == JsonEvent::kError) return parser.error();
  }
}

void ExpectSameAsNlohmann(const std::string& text) {
  const auto expected = NlohmannEvents(text);
  const auto actual = Events(text);
  ASSERT_EQ(actual.has_value(), expected.has_value())
      << (expected ? "accepted by nlohmann, refused here: "
                   : "refused by nlohmann, accepted here: ")
      << testing::PrintToString(text);
  if (expected) {
    EXPECT_EQ(*actual, *expected) << testing::PrintToString(text);
  }
}

TEST(JsonPullParser, AgreesWithNlohmannOnEdgeCases) {
  const std::vector<std::string> cases = {
      // Values and whitespace.
      "null", "true", "false", "0", "-0", "1", "-1", " \t\r\n[ ]\n", "{}", "[]", "\"\"", "[1,2,3]",
      "{\"a\":{\"b\":[{}]}}", "[[[[]]]]", "{\"a\":1,\"a\":2}", "\xEF\xBB\xBF[1]", "\xEF\xBB[1]",
      "\xEF[1]", "", " ", "\f[]", "[]\f", "\v1", std::string("\xA0") + "1", "[1]x", "[1] [2]",
      "{\"a\" 1}", "{\"a\":}", "{:1}", "{1:1}", "{\"a\":1,}", "[1,]", "[,1]", "[1 2]", "{\"a\"}",
      "[", "]", "{", "}", "[}", "{]", "[1}", "{\"a\":1]", "nul", "nulll", "truE", "True", "f",
      "'a'", "[null,true,false]",
      // Numbers.
      "01", "-01", "00", "1.", ".5", "-.5", "1.e5", "1e", "1e+", "1E-", "+1", "--1", "-", "1.5e3",
      "1E+2", "1e-2", "0.0", "-0.0", "0e0", "-0E-0", "1.0e0", "123456789", "9007199254740993",
      "18446744073709551615", "18446744073709551616", "-9223372036854775808",
      "-9223372036854775809", "123456789012345678901234567890", "1e308", "1.7976931348623157e308",
      "1.7976931348623159e308", "2e308", "1e400", "-1e400", "1e-400", "-1e-400", "4.9e-324",
      "2.4703282292062328e-324", "2.4703282292062327e-324", "0.1", "0.30000000000000004",
      "1e0000000000000000000001", "0.0000000000000000000000000000000001e-300",
      "100000000000000000000000000000000000000000000000000e-350", "1" + std::string(400, '0'),
      "0." + std::string(400, '0') + "1", "1e-" + std::string(30, '9'), "1e" + std::string(30, '9'),
      "-0e" + std::string(30, '9'), "0e-5", "[1e5,2E-3,-0.5]", "1x", "1.5.5", "1e5e5", "0x10",
      "Infinity", "-Infinity", "NaN", "nan", "inf", "-inf",
      // Strings: escapes, surrogates, control characters.
      R"("\"\\\/\b\f\n\r\t")", R"("\a")", R"("\x41")", R"("\u0041")", R"("\u00e9\u00E9")",
      R"("\u0000")", R"("\u12")", R"("\u12g4")", R"("\uD83D\uDE00")", R"("\uD83D")", R"("\uD83Dx")",
      R"("\uD83D\u0041")", R"("\uDE00")", R"("\uDBFF\uDFFF")", R"("\uD800\uDC00")",
      R"("\uDE00\uD83D")", R"("\u")", R"("\)", R"("abc)", "\"a\nb\"", "\"a\tb\"", "\"\x01\"",
      "\"\x1f\"", "\"\x7f\"", std::string("\"a\0b\"", 5), std::string("[\0]", 3),
      // UTF-8: valid sequences of each length, then overlong forms, surrogates, past U+10FFFF,
      // stray continuation bytes and cut sequences.
      "\"\xC3\xA9\"", "\"\xE2\x82\xAC\"", "\"\xF0\x9F\x98\x80\"", "\"\xF4\x8F\xBF\xBF\"",
      "\"\xEF\xBF\xBF\"", "\"\xC0\x80\"", "\"\xC1\xBF\"", "\"\xE0\x80\x80\"", "\"\xE0\x9F\xBF\"",
      "\"\xED\xA0\x80\"", "\"\xED\xBF\xBF\"", "\"\xED\x9F\xBF\"", "\"\xF0\x80\x80\x80\"",
      "\"\xF0\x8F\xBF\xBF\"", "\"\xF4\x90\x80\x80\"", "\"\xF5\x80\x80\x80\"", "\"\xFF\"",
      "\"\x80\"", "\"\xBF\"", "\"\xC3\"", "\"\xE2\x82\"", "\"\xF0\x9F\x98\"", "\"\xC3\x41\"",
      "\"\xE2\x41\xAC\"", "\xC3\xA9", "[\"\xC3\xA9\"]", "{\"\xC3\xA9\":1}", "{\"\xFF\":1}"};
  for (const std::string& text : cases) ExpectSameAsNlohmann(text);
}

// Random documents of every kind of value, then the same documents with bytes changed, cut,
// dropped and repeated: accepted with the same events, or refused, by both parsers.
TEST(JsonPullParser, AgreesWithNlohmannOnRandomAndMutatedDocuments) {
  std::mt19937 random(7);
  auto pick = [&](const std::vector<std::string>& options) {
    return options[random() % options.size()];
  };
  const std::vector<std::string> numbers = {"0",
                                            "-0",
                                            "7",
                                            "-7",
                                            "42",
                                            "3.25",
                                            "-0.5",
                                            "1e3",
                                            "1E-3",
                                            "2.5e+10",
                                            "1e308",
                                            "1e-320",
                                            "18446744073709551615",
                                            "18446744073709551616",
                                            "-9223372036854775808",
                                            "-9223372036854775809",
                                            "0.1",
                                            "123.456e-7"};
  const std::vector<std::string> string_parts = {"a",
                                                 "key",
                                                 " ",
                                                 "\\\"",
                                                 "\\\\",
                                                 "\\/",
                                                 "\\n",
                                                 "\\t",
                                                 "\\u0041",
                                                 "\\u00e9",
                                                 "\\uD83D\\uDE00",
                                                 "\xC3\xA9",
                                                 "\xE2\x82\xAC",
                                                 "\xF0\x9F\x98\x80",
                                                 "data",
                                                 "name"};
  const std::vector<std::string> spaces = {"", "", "", " ", "\n", "\t", "\r\n  "};
  std::function<std::string(int)> value = [&](int depth) -> std::string {
    const unsigned kind = depth >= 4 ? random() % 5 : random() % 7;
    auto string = [&] {
      std::string text = "\"";
      for (unsigned parts = random() % 4; parts > 0; --parts) text += pick(string_parts);
      return text + "\"";
    };
    switch (kind) {
      case 0:
        return pick({"null", "true", "false"});
      case 1:
      case 2:
        return pick(numbers);
      case 3:
      case 4:
        return string();
      case 5: {
        std::string text = "[" + pick(spaces);
        for (unsigned i = 0, n = random() % 5; i < n; ++i) {
          text += (i ? "," + pick(spaces) : "") + value(depth + 1) + pick(spaces);
        }
        return text + "]";
      }
      default: {
        std::string text = "{" + pick(spaces);
        for (unsigned i = 0, n = random() % 4; i < n; ++i) {
          text += (i ? "," : "") + pick(spaces) + string() + pick(spaces) + ":" + pick(spaces) +
                  value(depth + 1);
        }
        return text + pick(spaces) + "}";
      }
    }
  };
  const std::string alphabet =
      "{}[],:\" \\/0123456789.-+eEuUnlltrfasDdbx\x01\x1f\x7f\x80\xBF\xC3\xED\xF4\xFF";
  int accepted = 0;
  int refused = 0;
  for (int round = 0; round < 4000; ++round) {
    std::string text = pick(spaces) + value(0) + pick(spaces);
    ASSERT_TRUE(NlohmannEvents(text).has_value()) << text;  // the generator writes valid JSON
    ExpectSameAsNlohmann(text);
    for (int mutation = 0; mutation < 5; ++mutation) {
      std::string mutated = text;
      for (unsigned edits = 1 + random() % 3; edits > 0 && !mutated.empty(); --edits) {
        const size_t at = random() % mutated.size();
        switch (random() % 4) {
          case 0:
            mutated[at] = alphabet[random() % alphabet.size()];
            break;
          case 1:
            mutated.erase(at, 1 + random() % 4);
            break;
          case 2:
            mutated.insert(at, mutated.substr(at, 1 + random() % 8));
            break;
          default:
            mutated.resize(at);
            break;
        }
      }
      const auto expected = NlohmannEvents(mutated);
      (expected ? accepted : refused)++;
      ExpectSameAsNlohmann(mutated);
      if (testing::Test::HasFailure()) return;  // one counterexample is enough to read
    }
  }
  // Both outcomes were exercised, not only one.
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(refused, 1000);
}

TEST(JsonPullParser, ReadsNanAndInfinityOnlyWhenAsked) {
  const JsonPullParser::Options allow{.allow_nan_and_infinity = true};
  const auto events = Events("[NaN, Infinity, -Infinity, 1]", allow);
  ASSERT_TRUE(events.has_value());
  EXPECT_EQ((*events)[2], FloatEvent(std::numeric_limits<double>::infinity()));
  EXPECT_EQ((*events)[3], FloatEvent(-std::numeric_limits<double>::infinity()));
  JsonPullParser parser("NaN", allow);
  ASSERT_EQ(parser.Next(), JsonEvent::kFloat);
  EXPECT_TRUE(std::isnan(parser.number()));
  EXPECT_EQ(parser.Next(), JsonEvent::kEnd);

  EXPECT_FALSE(Events("[NaN]").has_value());
  EXPECT_FALSE(Events("[NaNa]", allow).has_value());
  for (const std::string spelling :
       {"nan", "inf", "-inf", "Inf", "-Inf", "+Infinity", "Infinit", "-NaN", "infinity"}) {
    const std::string text = "[" + spelling + "]";
    JsonPullParser parser(text, allow);
    EXPECT_THAT(ErrorOf(parser), HasSubstr("write NaN, Infinity and -Infinity")) << spelling;
  }
}

TEST(JsonPullParser, SaysWhatIsWrongAndWhere) {
  struct Case {
    std::string text;
    std::string error;
    size_t offset;
  };
  const std::vector<Case> cases = {
      {"[1, }", "expected a value, found '}'", 4},
      {"[1 2]", "expected ',' or ']', found '2'", 3},
      {"{\"a\" 1}", "expected ':' after a key, found '1'", 5},
      {"{\"a\": 1, 2}", "expected a key (a string in quotes), found '2'", 9},
      {"[1, 2", "expected ',' or ']', but the text ends", 5},
      {"[1] x", "expected the end after the JSON value, found 'x'", 4},
      {"[tru]", "expected a value, found 'tru'", 1},
      {"[-]", "expected a digit after '-', found ']'", 2},
      {"[1.]", "expected a digit after the decimal point, found ']'", 3},
      {"[1e]", "expected a digit in the exponent, found ']'", 3},
      {"[1e999]", "the number 1e999 is too large for any datatype", 1},
      {"\"ab", "the text ends inside the string that starts at byte 1", 3},
      {"\"a\x01\"", "a control character in a string (write it as \\u0001)", 2},
      {"\"a\\q\"", "an invalid escape in a string: '\\' followed by 'q'", 2},
      {"\"\\u12\"", "a \\u escape needs four hex digits", 1},
      {"\"\\uDE00\"", "a \\u escape of a low surrogate without a high one before it", 1},
      {"\"\\uD83D\"", "a \\u escape of a high surrogate not followed by one of a low surrogate", 1},
      {"[\"\xC0\x80\"]", "a string that is not valid UTF-8", 2},
      {"[\x80]", "expected a value, found the byte 0x80", 1},
  };
  for (const Case& c : cases) {
    JsonPullParser parser(c.text);
    EXPECT_THAT(ErrorOf(parser), HasSubstr(c.error)) << c.text;
    EXPECT_EQ(parser.error_offset(), c.offset) << c.text;
    EXPECT_EQ(parser.error_kind(), c.error.find("too large") != std::string::npos
                                       ? JsonPullParser::ErrorKind::kNumberTooLarge
                                       : JsonPullParser::ErrorKind::kSyntax)
        << c.text;
  }
}

TEST(JsonPullParser, RefusesNestingPastItsLimit) {
  const JsonPullParser::Options limit{.max_depth = 3};
  EXPECT_TRUE(Events("[{\"a\":[]}]", limit).has_value());
  JsonPullParser parser("[{\"a\":[[]]}]", limit);
  int events = 0;
  while (parser.Next() != JsonEvent::kError) ++events;
  EXPECT_EQ(events, 4);  // [ { k [ then the fourth container is refused
  EXPECT_EQ(parser.error_kind(), JsonPullParser::ErrorKind::kTooDeep);
  EXPECT_EQ(parser.error(), "nested deeper than the limit of 3");
  EXPECT_EQ(parser.error_offset(), 7U);
}

}  // namespace
}  // namespace orochi::server::kserve
