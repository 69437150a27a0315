// A JSON parser that hands out one event at a time (a value, a key, the start or end of an
// object or array), for reading inference requests without building a document.
//
// Inference requests are mostly long arrays of numbers. nlohmann's SAX parser read them at about
// 85 MB/s on an I/O thread and has no way to accept NaN and Infinity, which Triton, Python's
// json module and this server's own responses write. This parser reads numbers with
// std::from_chars (correctly rounded, as strtod) and strings with a fast path for runs without
// escapes or non-ASCII bytes, and checks everything RFC 8259 asks: the grammar, escapes,
// surrogate pairs, UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF) and no raw
// control characters in strings. Its events and refusals are those of nlohmann (tested against
// it), with the JSON5 spellings NaN, Infinity and -Infinity as an option, and a leading UTF-8
// byte order mark ignored as nlohmann does.
//
// Thread-safety: none; a parser belongs to one reader. The text must outlive the parser.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace orochi::server::kserve {

enum class JsonEvent {
  kStartObject,
  kEndObject,
  kStartArray,
  kEndArray,
  kKey,     // string()
  kString,  // string()
  kNull,
  kBool,      // boolean()
  kInteger,   // integer(): negative and within int64
  kUnsigned,  // unsigned_integer(): non-negative and within uint64
  kFloat,     // number(): a fraction or exponent, an integer past 64 bits, NaN or an infinity
  kEnd,       // the one value is complete and only whitespace follows
  kError,     // error(), error_offset(); every later call returns kError again
};

class JsonPullParser {
 public:
  struct Options {
    bool allow_nan_and_infinity = false;
    // Containers open at once; one more is an error (kTooDeep), so a body of '[' cannot make
    // the reader's own stacks grow with it.
    int max_depth = 1 << 20;
  };
  enum class ErrorKind { kNone, kSyntax, kNumberTooLarge, kTooDeep };

  explicit JsonPullParser(std::string_view text) : JsonPullParser(text, Options{}) {}
  JsonPullParser(std::string_view text, Options options);

  // The next event. After kEnd or kError, returns the same again.
  JsonEvent Next();

  // The value of the last event, for the events named beside them above.
  bool boolean() const { return boolean_; }
  int64_t integer() const { return integer_; }
  uint64_t unsigned_integer() const { return unsigned_; }
  double number() const { return number_; }
  // For kFloat: whether the number was written as an integer (one past 64 bits), and its text.
  bool integer_past_64_bits() const { return integer_past_64_bits_; }
  std::string_view number_text() const { return number_text_; }
  // May be moved from; the next event overwrites it.
  std::string& string() { return string_; }

  // Where the text of the last event ends (just past a '[' for kStartArray, past a ']' for
  // kEndArray), for reading a part of the text again.
  size_t offset() const { return pos_; }

  ErrorKind error_kind() const { return error_kind_; }
  // What is wrong, e.g. "expected ',' or ']', found '}'" or "the text ends inside a string".
  const std::string& error() const { return error_; }
  // Where: the offset of the offending byte (the text's size when it ended too soon).
  size_t error_offset() const { return error_offset_; }

 private:
  enum class Expect { kValue, kFirstInArray, kFirstInObject, kAfterValue, kDone };

  JsonEvent Value();
  // A value is complete: next comes a ',' or the container's end, or the end of the text.
  void ValueRead();
  JsonEvent Open(JsonEvent event, char closer);
  JsonEvent Close();
  JsonEvent Literal(std::string_view word, JsonEvent event);
  // The error for what stands at pos_ where a value belongs, with a hint for nan and inf.
  JsonEvent NotAValue();
  JsonEvent Number();
  // Reads the string starting at the quote under pos_ into string_; false on an error.
  bool String();
  // Appends a \u escape's code point (two escapes for a surrogate pair); pos_ is past the 'u'.
  bool UnicodeEscape();
  // Checks the UTF-8 sequence starting at pos_ and appends it; false on an error.
  bool Utf8Sequence();
  JsonEvent Fail(ErrorKind kind, std::string message, size_t offset);
  // "found 'x'" or "but the text ends", for errors at pos_.
  std::string Found() const;
  void SkipWhitespace();

  std::string_view text_;
  Options options_;
  size_t pos_ = 0;
  Expect expect_ = Expect::kValue;
  std::vector<char> closers_;  // of the containers open: '}' or ']'

  bool boolean_ = false;
  int64_t integer_ = 0;
  uint64_t unsigned_ = 0;
  double number_ = 0;
  bool integer_past_64_bits_ = false;
  std::string_view number_text_;
  std::string string_;

  ErrorKind error_kind_ = ErrorKind::kNone;
  std::string error_;
  size_t error_offset_ = 0;
};

}  // namespace orochi::server::kserve
