#include "json_pull_parser.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

namespace orochi::server::kserve {
namespace {

constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";

// Not <cctype>'s: those follow the process's locale, which model code can change.
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void AppendUtf8(uint32_t code_point, std::string* out) {
  if (code_point < 0x80) {
    out->push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

// Whether a number whose parse ran out of double's range is past its top (rather than below its
// smallest subnormal): whether its first significant digit stands before the decimal point once
// the exponent is applied. Grammar-checked text only.
bool AboveOne(std::string_view number) {
  if (number.front() == '-') number.remove_prefix(1);
  const size_t exponent_at = std::min(number.find_first_of("eE"), number.size());
  std::string_view mantissa = number.substr(0, exponent_at);
  int64_t exponent = 0;
  if (exponent_at < number.size()) {
    std::string_view digits = number.substr(exponent_at + 1);
    const bool negative = digits.front() == '-';
    if (digits.front() == '-' || digits.front() == '+') digits.remove_prefix(1);
    for (char digit : digits) {  // saturates: past a billion the answer cannot change
      exponent = std::min<int64_t>(exponent * 10 + (digit - '0'), 1'000'000'000);
    }
    if (negative) exponent = -exponent;
  }
  const size_t point = std::min(mantissa.find('.'), mantissa.size());
  const size_t first_significant = mantissa.find_first_of("123456789");
  if (first_significant == std::string_view::npos) return false;
  // The power of ten of that digit's place: 0 for "5", 2 for "512", -1 for "0.5".
  const int64_t place = first_significant < point
                            ? static_cast<int64_t>(point - first_significant) - 1
                            : -static_cast<int64_t>(first_significant - point);
  return place + exponent >= 0;
}

// A byte for a message: 'x' when printable, else its value.
std::string Describe(unsigned char c) {
  if (c >= 0x20 && c < 0x7F) return std::string("'") + static_cast<char>(c) + "'";
  char byte[16];
  std::snprintf(byte, sizeof(byte), "the byte 0x%02X", c);
  return byte;
}

}  // namespace

JsonPullParser::JsonPullParser(std::string_view text, Options options)
    : text_(text), options_(options) {
  if (text_.starts_with(kByteOrderMark)) pos_ = kByteOrderMark.size();
}

void JsonPullParser::SkipWhitespace() {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return;
    ++pos_;
  }
}

JsonEvent JsonPullParser::Next() {
  if (error_kind_ != ErrorKind::kNone) return JsonEvent::kError;
  SkipWhitespace();
  const bool more = pos_ < text_.size();
  switch (expect_) {
    case Expect::kDone:
      if (!more) return JsonEvent::kEnd;
      return Fail(ErrorKind::kSyntax, "expected the end after the JSON value, " + Found(), pos_);
    case Expect::kValue:
      return Value();
    case Expect::kFirstInArray:
      if (more && text_[pos_] == ']') return Close();
      return Value();
    case Expect::kFirstInObject:
      if (more && text_[pos_] == '}') return Close();
      break;
    case Expect::kAfterValue:
      if (more && text_[pos_] == closers_.back()) return Close();
      if (!more || text_[pos_] != ',') {
        return Fail(ErrorKind::kSyntax,
                    std::string("expected ',' or '") + closers_.back() + "', " + Found(), pos_);
      }
      ++pos_;
      SkipWhitespace();
      if (closers_.back() == ']') return Value();
      break;
  }
  if (pos_ >= text_.size() || text_[pos_] != '"') {
    return Fail(ErrorKind::kSyntax, "expected a key (a string in quotes), " + Found(), pos_);
  }
  if (!String()) return JsonEvent::kError;
  SkipWhitespace();
  if (pos_ >= text_.size() || text_[pos_] != ':') {
    return Fail(ErrorKind::kSyntax, "expected ':' after a key, " + Found(), pos_);
  }
  ++pos_;
  expect_ = Expect::kValue;
  return JsonEvent::kKey;
}

JsonEvent JsonPullParser::Value() {
  integer_past_64_bits_ = false;
  if (pos_ >= text_.size()) {
    return Fail(ErrorKind::kSyntax, "expected a value, " + Found(), pos_);
  }
  switch (text_[pos_]) {
    case '{':
      return Open(JsonEvent::kStartObject, '}');
    case '[':
      return Open(JsonEvent::kStartArray, ']');
    case '"':
      if (!String()) return JsonEvent::kError;
      ValueRead();
      return JsonEvent::kString;
    case 't':
      boolean_ = true;
      return Literal("true", JsonEvent::kBool);
    case 'f':
      boolean_ = false;
      return Literal("false", JsonEvent::kBool);
    case 'n':
      return Literal("null", JsonEvent::kNull);
    case 'N':
      number_ = std::numeric_limits<double>::quiet_NaN();
      return Literal(options_.allow_nan_and_infinity ? "NaN" : "", JsonEvent::kFloat);
    case 'I':
      number_ = std::numeric_limits<double>::infinity();
      return Literal(options_.allow_nan_and_infinity ? "Infinity" : "", JsonEvent::kFloat);
    case '-':
      if (text_.substr(pos_ + 1).starts_with('I')) {
        number_ = -std::numeric_limits<double>::infinity();
        return Literal(options_.allow_nan_and_infinity ? "-Infinity" : "", JsonEvent::kFloat);
      }
      if (pos_ + 1 < text_.size() && IsLetter(text_[pos_ + 1])) {
        return NotAValue();  // "-nan", "-inf": a word, not a number
      }
      return Number();
    default:
      if (IsDigit(text_[pos_])) return Number();
      return NotAValue();
  }
}

void JsonPullParser::ValueRead() {
  expect_ = closers_.empty() ? Expect::kDone : Expect::kAfterValue;
}

JsonEvent JsonPullParser::Open(JsonEvent event, char closer) {
  if (closers_.size() >= static_cast<size_t>(options_.max_depth)) {
    return Fail(ErrorKind::kTooDeep,
                "nested deeper than the limit of " + std::to_string(options_.max_depth), pos_);
  }
  closers_.push_back(closer);
  ++pos_;
  expect_ = closer == '}' ? Expect::kFirstInObject : Expect::kFirstInArray;
  return event;
}

JsonEvent JsonPullParser::Close() {
  const char closer = closers_.back();
  closers_.pop_back();
  ++pos_;
  ValueRead();
  return closer == '}' ? JsonEvent::kEndObject : JsonEvent::kEndArray;
}

// `word` is the literal the first letter announced; empty when none may stand here.
JsonEvent JsonPullParser::Literal(std::string_view word, JsonEvent event) {
  if (word.empty() || !text_.substr(pos_).starts_with(word)) return NotAValue();
  pos_ += word.size();
  ValueRead();
  return event;
}

JsonEvent JsonPullParser::NotAValue() {
  // The word that is there, for the message: letters, after a sign.
  size_t end = pos_ + ((text_[pos_] == '-' || text_[pos_] == '+') ? 1 : 0);
  while (end < text_.size() && end - pos_ < 16 && IsLetter(text_[end])) ++end;
  const std::string found(text_.substr(pos_, end - pos_));
  if (found.size() <= 1) return Fail(ErrorKind::kSyntax, "expected a value, " + Found(), pos_);
  std::string message = "expected a value, found '" + found + "'";
  std::string lower = found;
  std::transform(lower.begin(), lower.end(), lower.begin(), Lower);
  if (lower.starts_with('-') || lower.starts_with('+')) lower.erase(0, 1);
  if (lower.starts_with("nan") || lower.starts_with("inf")) {
    message += options_.allow_nan_and_infinity
                   ? "; write NaN, Infinity and -Infinity (as Python's json module does)"
                   : "; NaN and Infinity are not JSON numbers";
  }
  return Fail(ErrorKind::kSyntax, std::move(message), pos_);
}

JsonEvent JsonPullParser::Number() {
  const size_t start = pos_;
  auto digits = [&] {
    const size_t first = pos_;
    while (pos_ < text_.size() && IsDigit(text_[pos_])) ++pos_;
    return pos_ > first;
  };
  if (text_[pos_] == '-') ++pos_;
  if (pos_ < text_.size() && text_[pos_] == '0') {
    ++pos_;  // a leading zero stands alone: "01" is 0 followed by a stray 1
  } else if (!digits()) {
    return Fail(ErrorKind::kSyntax, "expected a digit after '-', " + Found(), pos_);
  }
  bool integral = true;
  if (pos_ < text_.size() && text_[pos_] == '.') {
    ++pos_;
    if (!digits()) {
      return Fail(ErrorKind::kSyntax, "expected a digit after the decimal point, " + Found(), pos_);
    }
    integral = false;
  }
  if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
    ++pos_;
    if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
    if (!digits()) {
      return Fail(ErrorKind::kSyntax, "expected a digit in the exponent, " + Found(), pos_);
    }
    integral = false;
  }
  ValueRead();
  const char* first = text_.data() + start;
  const char* last = text_.data() + pos_;
  number_text_ = text_.substr(start, pos_ - start);
  if (integral) {
    // Integers past 64 bits are read as floats, as nlohmann reads them.
    if (*first == '-') {
      if (std::from_chars(first, last, integer_).ec == std::errc()) return JsonEvent::kInteger;
    } else if (std::from_chars(first, last, unsigned_).ec == std::errc()) {
      return JsonEvent::kUnsigned;
    }
    integer_past_64_bits_ = true;
  }
  if (std::from_chars(first, last, number_).ec == std::errc::result_out_of_range) {
    const std::string_view text(first, static_cast<size_t>(last - first));
    if (AboveOne(text)) {
      std::string shown(text.substr(0, 32));
      if (text.size() > 32) shown += "...";
      return Fail(ErrorKind::kNumberTooLarge,
                  "the number " + shown + " is too large for any datatype", start);
    }
    number_ = *first == '-' ? -0.0 : 0.0;  // below the smallest subnormal: rounds to zero
  }
  return JsonEvent::kFloat;
}

bool JsonPullParser::String() {
  const size_t open = pos_++;
  string_.clear();
  for (;;) {
    // Runs of plain ASCII are copied at once.
    size_t run_end = pos_;
    while (run_end < text_.size()) {
      const auto c = static_cast<unsigned char>(text_[run_end]);
      if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
      ++run_end;
    }
    string_.append(text_.data() + pos_, run_end - pos_);
    pos_ = run_end;
    if (pos_ >= text_.size()) {
      Fail(ErrorKind::kSyntax,
           "the text ends inside the string that starts at byte " + std::to_string(open + 1), pos_);
      return false;
    }
    const auto c = static_cast<unsigned char>(text_[pos_]);
    if (c == '"') {
      ++pos_;
      return true;
    }
    if (c < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof(escape), "\\u%04x", c);
      Fail(ErrorKind::kSyntax,
           std::string("a control character in a string (write it as ") + escape + ")", pos_);
      return false;
    }
    if (c >= 0x80) {
      if (!Utf8Sequence()) return false;
      continue;
    }
    // A backslash.
    if (pos_ + 1 >= text_.size()) {
      ++pos_;
      Fail(ErrorKind::kSyntax, "the text ends inside an escape", pos_);
      return false;
    }
    const char escaped = text_[pos_ + 1];
    pos_ += 2;
    switch (escaped) {
      case '"':
      case '\\':
      case '/':
        string_.push_back(escaped);
        break;
      case 'b':
        string_.push_back('\b');
        break;
      case 'f':
        string_.push_back('\f');
        break;
      case 'n':
        string_.push_back('\n');
        break;
      case 'r':
        string_.push_back('\r');
        break;
      case 't':
        string_.push_back('\t');
        break;
      case 'u':
        if (!UnicodeEscape()) return false;
        break;
      default:
        pos_ -= 2;
        Fail(ErrorKind::kSyntax,
             "an invalid escape in a string: '\\' followed by " +
                 Describe(static_cast<unsigned char>(escaped)) +
                 " (the escapes are \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)",
             pos_);
        return false;
    }
  }
}

bool JsonPullParser::UnicodeEscape() {
  auto four_hex = [&](uint32_t* code_unit) {
    if (text_.size() - pos_ < 4) return false;
    uint32_t value = 0;
    for (size_t i = 0; i < 4; ++i) {
      const int digit = HexValue(text_[pos_ + i]);
      if (digit < 0) return false;
      value = value * 16 + static_cast<uint32_t>(digit);
    }
    pos_ += 4;
    *code_unit = value;
    return true;
  };
  const size_t escape_at = pos_ - 2;
  uint32_t code_point = 0;
  if (!four_hex(&code_point)) {
    Fail(ErrorKind::kSyntax, "a \\u escape needs four hex digits", escape_at);
    return false;
  }
  if (code_point >= 0xDC00 && code_point <= 0xDFFF) {
    Fail(ErrorKind::kSyntax, "a \\u escape of a low surrogate without a high one before it",
         escape_at);
    return false;
  }
  if (code_point >= 0xD800 && code_point <= 0xDBFF) {
    uint32_t low = 0;
    if (!text_.substr(pos_).starts_with("\\u") || (pos_ += 2, !four_hex(&low)) || low < 0xDC00 ||
        low > 0xDFFF) {
      Fail(ErrorKind::kSyntax,
           "a \\u escape of a high surrogate not followed by one of a low surrogate", escape_at);
      return false;
    }
    code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
  }
  AppendUtf8(code_point, &string_);
  return true;
}

bool JsonPullParser::Utf8Sequence() {
  // RFC 3629's table: the lead byte fixes the length and the range of the second byte, which
  // rules out overlong forms, surrogates and code points past U+10FFFF.
  const auto lead = static_cast<unsigned char>(text_[pos_]);
  size_t length = 0;
  unsigned char second_low = 0x80;
  unsigned char second_high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_low = 0xA0;
    if (lead == 0xED) second_high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_low = 0x90;
    if (lead == 0xF4) second_high = 0x8F;
  }
  bool valid = length > 0 && text_.size() - pos_ >= length;
  for (size_t i = 1; valid && i < length; ++i) {
    const auto byte = static_cast<unsigned char>(text_[pos_ + i]);
    valid = i == 1 ? (byte >= second_low && byte <= second_high) : (byte >= 0x80 && byte <= 0xBF);
  }
  if (!valid) {
    Fail(ErrorKind::kSyntax, "a string that is not valid UTF-8", pos_);
    return false;
  }
  string_.append(text_.data() + pos_, length);
  pos_ += length;
  return true;
}

std::string JsonPullParser::Found() const {
  if (pos_ >= text_.size()) return "but the text ends";
  return "found " + Describe(static_cast<unsigned char>(text_[pos_]));
}

JsonEvent JsonPullParser::Fail(ErrorKind kind, std::string message, size_t offset) {
  error_kind_ = kind;
  error_ = std::move(message);
  error_offset_ = offset;
  return JsonEvent::kError;
}

}  // namespace orochi::server::kserve
