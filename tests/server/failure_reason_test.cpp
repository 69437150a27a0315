// The `reason` label of orochi_inference_requests_total: a request that could not be parsed for
// want of memory is not counted as a full queue, though both answer 503.
#include <gtest/gtest.h>

#include "kserve/handlers.h"

namespace orochi::server::kserve {
namespace {

TEST(FailureReason, AnAllocationFailureWhileParsingIsOutOfMemoryNotQueueFull) {
  EXPECT_EQ(ParseFailureReason(StatusCode::kResourceExhausted), "out_of_memory");
  EXPECT_EQ(FailureReason(StatusCode::kResourceExhausted), "queue_full");
  EXPECT_EQ(HttpStatusOf(StatusCode::kResourceExhausted), 503U);
  // The parse's other errors keep their reasons.
  EXPECT_EQ(ParseFailureReason(StatusCode::kInvalidArgument), "invalid_argument");
  EXPECT_EQ(ParseFailureReason(StatusCode::kInternal), "internal");
}

}  // namespace
}  // namespace orochi::server::kserve
