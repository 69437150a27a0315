#include "orochi/packaging/model_key.h"

#include <gtest/gtest.h>

#include <string>

namespace orochi::packaging {
namespace {

TEST(ModelKeyTest, WritesNameColonVersion) {
  EXPECT_EQ((ModelKey{"digits", 1}.ToString()), "digits:1");
  EXPECT_EQ((ModelKey{"resnet-50.v2", 1234567890123}.ToString()), "resnet-50.v2:1234567890123");
}

TEST(ModelKeyTest, ParsesWhatItWrites) {
  for (const ModelKey& key : {ModelKey{"a", 1}, ModelKey{"my_model.v2", 42}, ModelKey{"x-1", 7}}) {
    Result<ModelKey> parsed = ModelKey::Parse(key.ToString());
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, key);
  }
}

TEST(ModelKeyTest, RefusesTextThatIsNotAKey) {
  for (const std::string text :
       {"", "digits", ":1", "digits:", "digits:1x", "digits:-1", "digits:99999999999999999999"}) {
    Result<ModelKey> parsed = ModelKey::Parse(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(parsed.status().message().find("model key"), std::string::npos) << text;
  }
}

TEST(ModelKeyTest, OrdersByNameThenVersion) {
  EXPECT_LT((ModelKey{"a", 2}), (ModelKey{"b", 1}));
  EXPECT_LT((ModelKey{"a", 1}), (ModelKey{"a", 2}));
}

}  // namespace
}  // namespace orochi::packaging
