// Status and Result<T>: the factories, the text a Status prints, and the macros that pass errors
// up.
#include "orochi/base/status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace orochi {
namespace {

struct Factory {
  std::function<Status(std::string)> make;
  StatusCode code;
  const char* name;
};

TEST(Status, EachErrorCodeHasAFactoryThatKeepsTheMessage) {
  const std::vector<Factory> factories = {
      {InvalidArgument, StatusCode::kInvalidArgument, "INVALID_ARGUMENT"},
      {OutOfRange, StatusCode::kOutOfRange, "OUT_OF_RANGE"},
      {NotFound, StatusCode::kNotFound, "NOT_FOUND"},
      {AlreadyExists, StatusCode::kAlreadyExists, "ALREADY_EXISTS"},
      {FailedPrecondition, StatusCode::kFailedPrecondition, "FAILED_PRECONDITION"},
      {Unavailable, StatusCode::kUnavailable, "UNAVAILABLE"},
      {ResourceExhausted, StatusCode::kResourceExhausted, "RESOURCE_EXHAUSTED"},
      {DeadlineExceeded, StatusCode::kDeadlineExceeded, "DEADLINE_EXCEEDED"},
      {[](std::string message) { return PythonError(std::move(message)); },
       StatusCode::kPythonError, "PYTHON_ERROR"},
      {Internal, StatusCode::kInternal, "INTERNAL"},
      {Unimplemented, StatusCode::kUnimplemented, "UNIMPLEMENTED"},
  };
  // Every code but kOk, each once: a code added to the enum needs a factory here too.
  std::vector<StatusCode> covered;
  for (const Factory& factory : factories) {
    const Status status = factory.make("the reason");
    EXPECT_FALSE(status.ok()) << factory.name;
    EXPECT_EQ(status.code(), factory.code) << factory.name;
    EXPECT_EQ(status.message(), "the reason");
    EXPECT_EQ(status.detail(), "");
    EXPECT_EQ(StatusCodeName(factory.code), factory.name);
    EXPECT_EQ(status.ToString(), std::string(factory.name) + ": the reason");
    covered.push_back(factory.code);
  }
  std::vector<StatusCode> every_error;
  for (int code = static_cast<int>(StatusCode::kOk) + 1;
       code <= static_cast<int>(StatusCode::kUnimplemented); ++code) {
    every_error.push_back(static_cast<StatusCode>(code));
  }
  EXPECT_THAT(covered, testing::UnorderedElementsAreArray(every_error));
}

TEST(Status, OkIsTheDefault) {
  EXPECT_TRUE(Status().ok());
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status().code(), StatusCode::kOk);
  EXPECT_EQ(Status().ToString(), "OK");
  EXPECT_EQ(StatusCodeName(StatusCode::kOk), "OK");
}

TEST(Status, APythonErrorPrintsItsTracebackOnLinesOfItsOwn) {
  const Status status =
      PythonError("ValueError: bad", "Traceback (most recent call last):\n  File \"m.py\"");
  EXPECT_EQ(status.detail(), "Traceback (most recent call last):\n  File \"m.py\"");
  EXPECT_EQ(status.ToString(),
            "PYTHON_ERROR: ValueError: bad\nTraceback (most recent call last):\n  File \"m.py\"");
}

TEST(Result, HoldsAValueOrAnError) {
  Result<std::string> value = std::string("text");
  ASSERT_TRUE(value.ok());
  EXPECT_TRUE(value.status().ok());
  EXPECT_EQ(*value, "text");
  EXPECT_EQ(value->size(), 4U);
  EXPECT_EQ(std::move(value).value(), "text");

  const Result<int> error = NotFound("no model 'm'");
  ASSERT_FALSE(error.ok());
  EXPECT_EQ(error.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(error.status().message(), "no model 'm'");
}

TEST(Result, BuiltFromAnOkStatusIsAnInternalError) {
  const Result<int> result = Status::Ok();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInternal);
}

TEST(Result, MoveOnlyValuesMoveOut) {
  Result<std::unique_ptr<int>> result = std::make_unique<int>(7);
  std::unique_ptr<int> taken = std::move(result).value();
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(*taken, 7);
}

TEST(ResultDeathTest, ReadingTheValueOfAnErrorAborts) {
  const Result<int> error = OutOfRange("index 9 is out of range");
  EXPECT_DEATH((void)error.value(), "OUT_OF_RANGE: index 9 is out of range");
}

Status Step(bool fail, std::vector<std::string>& trail) {
  trail.push_back(fail ? "failed" : "ran");
  return fail ? FailedPrecondition("step refused") : Status::Ok();
}

Status TwoSteps(bool fail_first, std::vector<std::string>& trail) {
  OROCHI_RETURN_IF_ERROR(Step(fail_first, trail));
  OROCHI_RETURN_IF_ERROR(Step(false, trail));
  return Status::Ok();
}

TEST(StatusMacros, ReturnIfErrorStopsAtTheFirstError) {
  std::vector<std::string> trail;
  EXPECT_TRUE(TwoSteps(false, trail).ok());
  EXPECT_THAT(trail, testing::ElementsAre("ran", "ran"));
  trail.clear();
  const Status status = TwoSteps(true, trail);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), "step refused");
  EXPECT_THAT(trail, testing::ElementsAre("failed"));
}

Result<int> Parse(const std::string& text) {
  if (text.empty()) return InvalidArgument("empty");
  return static_cast<int>(text.size());
}

Result<int> SumOfLengths(const std::string& a, const std::string& b) {
  OROCHI_ASSIGN_OR_RETURN(int first, Parse(a));
  OROCHI_ASSIGN_OR_RETURN(const int second, Parse(b));
  return first + second;
}

TEST(StatusMacros, AssignOrReturnDeclaresOrPassesTheErrorOn) {
  const Result<int> sum = SumOfLengths("ab", "cde");
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(*sum, 5);
  const Result<int> failed = SumOfLengths("ab", "");
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().ToString(), "INVALID_ARGUMENT: empty");
}

}  // namespace
}  // namespace orochi
