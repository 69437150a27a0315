// Model output as log records: fields, levels, and the per-copy rate limit with its report of
// dropped lines, on a clock the test moves.
#include "model_output_log.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace orochi::server {
namespace {

using interpreters::OutputLine;

struct Record {
  LogLevel level;
  std::string message;
  std::map<std::string, std::string> fields;
};

struct Harness {
  std::vector<Record> records;
  ModelOutputLog::Clock::time_point now{};
  ModelOutputLog log;

  explicit Harness(ModelOutputLimits limits)
      : log(
            2, limits,
            [this](LogLevel level, const std::string& message,
                   const std::vector<LogField>& fields) {
              Record record{level, message, {}};
              for (const LogField& field : fields) record.fields[field.key] = field.value;
              records.push_back(record);
            },
            [this] { return now; }) {}

  void Print(size_t slot, std::string_view text, std::string_view caller = "m:3",
             OutputLine::Stream stream = OutputLine::Stream::kStdout, bool cut = false) {
    Print(interpreters::OutputSource{slot, static_cast<int>(slot), false}, text, caller, stream,
          cut);
  }
  void Print(const interpreters::OutputSource& source, std::string_view text,
             std::string_view caller = "m:3",
             OutputLine::Stream stream = OutputLine::Stream::kStdout, bool cut = false) {
    OutputLine line;
    line.stream = stream;
    line.text = text;
    line.cut = cut;
    line.caller = caller;
    log.Write(source, line);
  }
};

TEST(ModelOutputLog, EachLineIsARecordWithItsStreamCopyAndModel) {
  Harness harness({});
  harness.Print(1, "hello");
  harness.Print(0, "oops", "other:12", OutputLine::Stream::kStderr, true);
  harness.Print(0, "before any model", "");
  ASSERT_EQ(harness.records.size(), 3U);
  const Record& out = harness.records[0];
  EXPECT_EQ(out.level, LogLevel::kInfo);
  EXPECT_EQ(out.message, "model output");
  EXPECT_EQ(out.fields, (std::map<std::string, std::string>{{"stream", "stdout"},
                                                            {"copy", "1"},
                                                            {"model", "m"},
                                                            {"version", "3"},
                                                            {"line", "hello"}}));
  const Record& err = harness.records[1];
  EXPECT_EQ(err.level, LogLevel::kWarning);
  EXPECT_EQ(err.fields.at("stream"), "stderr");
  EXPECT_EQ(err.fields.at("model"), "other");
  EXPECT_EQ(err.fields.at("version"), "12");
  EXPECT_EQ(err.fields.at("cut"), "true");
  EXPECT_EQ(harness.records[2].fields.count("model"), 0U);
}

TEST(ModelOutputLog, AFloodIsCutToTheRateAndTheDroppedLinesAreReportedOnceASecond) {
  Harness harness({.lines_per_second = 10, .burst = 5, .report_every = std::chrono::seconds(1)});
  for (int i = 0; i < 100; ++i) harness.Print(0, "flood");
  EXPECT_EQ(harness.records.size(), 5U);  // the burst
  harness.Print(1, "another copy has its own budget");
  EXPECT_EQ(harness.records.size(), 6U);

  harness.now += std::chrono::milliseconds(100);  // one line's worth
  harness.Print(0, "next");
  ASSERT_EQ(harness.records.size(), 8U);
  EXPECT_EQ(harness.records[6].level, LogLevel::kWarning);
  EXPECT_EQ(harness.records[6].message,
            "model output dropped: the copy printed faster than its limit");
  EXPECT_EQ(harness.records[6].fields.at("dropped_lines"), "95");
  EXPECT_EQ(harness.records[6].fields.at("model"), "m");
  EXPECT_EQ(harness.records[7].fields.at("line"), "next");

  // Dropped again: reported only once a second has passed since the last report.
  harness.Print(0, "dropped");
  harness.now += std::chrono::milliseconds(100);
  harness.Print(0, "let through, not yet reported");
  EXPECT_EQ(harness.records.size(), 9U);
  harness.Print(0, "dropped");
  harness.now += std::chrono::seconds(1);
  harness.Print(0, "let through and reported");
  ASSERT_EQ(harness.records.size(), 11U);
  EXPECT_EQ(harness.records[9].fields.at("dropped_lines"), "2");
  EXPECT_EQ(harness.records[10].fields.at("line"), "let through and reported");

  // The bucket holds at most the burst, however long the copy was quiet.
  harness.now += std::chrono::hours(1);
  for (int i = 0; i < 100; ++i) harness.Print(0, "again");
  EXPECT_EQ(harness.records.size(), 16U);
}

TEST(ModelOutputLog, AnAbandonedCopysLinesSayItAndUseABudgetOfTheirOwn) {
  Harness harness({.lines_per_second = 10, .burst = 2, .report_every = std::chrono::seconds(1)});
  // Slot 0's stuck copy (id 0) came back after copy 7 took the slot with another model.
  const interpreters::OutputSource abandoned{0, 0, true};
  harness.Print(abandoned, "finally done", "stuck:1");
  ASSERT_EQ(harness.records.size(), 1U);
  EXPECT_EQ(harness.records[0].fields,
            (std::map<std::string, std::string>{{"stream", "stdout"},
                                                {"copy", "0"},
                                                {"abandoned", "true"},
                                                {"copy_id", "0"},
                                                {"model", "stuck"},
                                                {"version", "1"},
                                                {"line", "finally done"}}));
  for (int i = 0; i < 10; ++i) harness.Print(abandoned, "flood", "stuck:1");
  EXPECT_EQ(harness.records.size(), 2U);  // the abandoned copies' burst is spent
  harness.Print(interpreters::OutputSource{0, 7, false}, "the replacement", "other:2");
  ASSERT_EQ(harness.records.size(), 3U) << "the flood used up the slot's own budget";
  EXPECT_EQ(harness.records[2].fields.count("abandoned"), 0U);
  EXPECT_EQ(harness.records[2].fields.at("model"), "other");
  harness.now += std::chrono::seconds(1);
  harness.Print(abandoned, "after the flood", "stuck:1");
  ASSERT_EQ(harness.records.size(), 5U);
  EXPECT_EQ(harness.records[3].fields.at("dropped_lines"), "9");
  EXPECT_EQ(harness.records[3].fields.at("abandoned"), "true");
  EXPECT_EQ(harness.records[3].fields.at("model"), "stuck");
}

}  // namespace
}  // namespace orochi::server
