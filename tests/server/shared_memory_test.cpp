// The system shared-memory registry and the codec's shared-memory step, on real POSIX
// shared-memory objects: regions map what their key names and nothing past it, stay mapped
// while a request holds them after they are unregistered, and every offset and size a request
// gives is checked against its region and its tensor.
#include "kserve/shared_memory.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "orochi/server/kserve_codec.h"

namespace orochi::server::kserve {
namespace {

using ::testing::HasSubstr;

// A shared-memory object of `size` bytes, mapped here too, unlinked at the end of the test.
class Object {
 public:
  explicit Object(size_t size)
      : key_("/orochi-shm-test-" + std::to_string(getpid()) + "-" + std::to_string(next_++)),
        size_(size) {
    const int fd = shm_open(key_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    data_ = static_cast<std::byte*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~Object() {
    munmap(data_, size_);
    shm_unlink(key_.c_str());
  }
  const std::string& key() const { return key_; }
  std::byte* data() const { return data_; }

 private:
  static inline int next_ = 0;
  std::string key_;
  size_t size_;
  std::byte* data_;
};

TEST(SharedMemoryRegistry, RegistersWhatTheObjectHoldsAndNothingPastIt) {
  Object object(8192);
  SharedMemoryRegistry registry(true);
  ASSERT_TRUE(registry.Register("a", object.key(), 100, 8092).ok());
  EXPECT_EQ(registry.Register("a", object.key(), 0, 16).code(), StatusCode::kAlreadyExists);
  Status past = registry.Register("b", object.key(), 100, 8093);
  EXPECT_EQ(past.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(past.message(), HasSubstr("run past the end of shared memory object"));
  // Sums that wrap around 64 bits are past the end too.
  EXPECT_FALSE(registry.Register("b", object.key(), 16, UINT64_MAX - 8).ok());
  Status missing = registry.Register("b", "/orochi-no-such-object", 0, 16);
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(), HasSubstr("No such file or directory"));
  EXPECT_FALSE(registry.Register("b", object.key(), 0, 0).ok());
  EXPECT_FALSE(registry.Register("", object.key(), 0, 16).ok());

  // An offset that is no multiple of the page size still maps the bytes at that offset.
  std::memcpy(object.data() + 100, "hello", 5);
  Result<std::shared_ptr<const SharedMemoryRegion>> region = registry.Find("a");
  ASSERT_TRUE(region.ok());
  Result<std::byte*> bytes = (*region)->Slice(0, 5, "input 'x'");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(std::memcmp(*bytes, "hello", 5), 0);
  EXPECT_FALSE((*region)->Slice(8092, 1, "input 'x'").ok());
  EXPECT_FALSE((*region)->Slice(1, UINT64_MAX, "input 'x'").ok());
  EXPECT_TRUE((*region)->Slice(8092, 0, "input 'x'").ok());

  Result<std::vector<SharedMemoryRegionStatus>> all =
      registry.Describe(std::nullopt, SharedMemoryKind::kSystem);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].offset, 100u);
  EXPECT_EQ(registry.Describe("b", SharedMemoryKind::kSystem).status().code(),
            StatusCode::kNotFound);
}

TEST(SharedMemoryRegistry, EachKindListsAndUnregistersOnlyItsOwnRegions) {
  Object object(4096);
  SharedMemoryRegistry registry(true);
  ASSERT_TRUE(registry.Register("a", object.key(), 0, 4096).ok());
  EXPECT_TRUE(registry.Describe(std::nullopt, SharedMemoryKind::kCuda)->empty());
  Result<std::vector<SharedMemoryRegionStatus>> as_cuda =
      registry.Describe("a", SharedMemoryKind::kCuda);
  EXPECT_EQ(as_cuda.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(as_cuda.status().message(), HasSubstr("unable to find cuda shared memory region"));
  registry.Unregister("a", SharedMemoryKind::kCuda);
  registry.UnregisterAll(SharedMemoryKind::kCuda);
  EXPECT_TRUE(registry.Find("a").ok());
  // One namespace: a CUDA region may not take a system region's name.
  EXPECT_EQ(registry.RegisterCuda("a", std::string(64, '\0'), 0, 16).code(),
            StatusCode::kAlreadyExists);
}

TEST(SharedMemoryRegistry, AHeldRegionStaysMappedAfterItIsUnregistered) {
  Object object(4096);
  SharedMemoryRegistry registry(true);
  ASSERT_TRUE(registry.Register("a", object.key(), 0, 4096).ok());
  std::shared_ptr<const SharedMemoryRegion> held = *registry.Find("a");
  registry.Unregister("a", SharedMemoryKind::kSystem);
  registry.Unregister("a", SharedMemoryKind::kSystem);  // not registered: no error
  EXPECT_EQ(registry.Find("a").status().code(), StatusCode::kNotFound);
  // Still mapped: writes through it reach the object.
  std::memcpy(*held->Slice(10, 3, "output 'y'"), "abc", 3);
  EXPECT_EQ(std::memcmp(object.data() + 10, "abc", 3), 0);
  // The name can be registered again meanwhile.
  EXPECT_TRUE(registry.Register("a", object.key(), 0, 16).ok());
  registry.UnregisterAll(SharedMemoryKind::kSystem);
  EXPECT_TRUE(registry.Describe(std::nullopt, SharedMemoryKind::kSystem)->empty());
}

TEST(SharedMemoryRegistry, DisabledRefusesToRegister) {
  Object object(4096);
  SharedMemoryRegistry registry(false);
  Status refused = registry.Register("a", object.key(), 0, 16);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("http.allow_shared_memory"));
}

packaging::Manifest Model() {
  packaging::Manifest manifest;
  manifest.name = "m";
  manifest.version = 1;
  manifest.max_batch_size = 8;
  manifest.inputs = {{"x", packaging::DataType::kFp32, {2}},
                     {"s", packaging::DataType::kBytes, {1}}};
  manifest.outputs = {{"y", packaging::DataType::kFp32, {2}},
                      {"t", packaging::DataType::kBytes, {1}}};
  return manifest;
}

TEST(ResolveSharedMemory, ReadsInputsAndWritesOutputsThroughTheCodec) {
  Object object(4096);
  SharedMemoryRegistry registry(true);
  ASSERT_TRUE(registry.Register("r", object.key(), 0, 4096).ok());
  const float x[4] = {1, 2, 3, 4};
  std::memcpy(object.data(), x, sizeof(x));
  const char s[] = "\x02\x00\x00\x00hi\x00\x00\x00\x00";  // "hi", ""
  std::memcpy(object.data() + 64, s, 10);
  const packaging::Manifest manifest = Model();
  const std::string body = R"({"inputs":[
    {"name":"x","datatype":"FP32","shape":[2,2],
     "parameters":{"shared_memory_region":"r","shared_memory_byte_size":16}},
    {"name":"s","datatype":"BYTES","shape":[2,1],
     "parameters":{"shared_memory_region":"r","shared_memory_offset":64,
                   "shared_memory_byte_size":10}}],
    "outputs":[{"name":"y","parameters":{"shared_memory_region":"r",
                "shared_memory_offset":1024,"shared_memory_byte_size":16}},
               {"name":"t","parameters":{"shared_memory_region":"r",
                "shared_memory_offset":2048,"shared_memory_byte_size":64}}]})";
  Result<InferRequest> request = ParseInferRequest(manifest, body, std::nullopt, {});
  ASSERT_TRUE(request.ok()) << request.status().message();
  EXPECT_EQ(request->rows, 2);
  ASSERT_TRUE(ResolveSharedMemory(manifest, registry, &*request).ok());
  registry.UnregisterAll(SharedMemoryKind::kSystem);  // the request holds its regions from here
  const auto& tensor = std::get<engine::Tensor>(request->inputs[0].value);
  EXPECT_EQ(std::vector<float>(tensor.data_as<float>(), tensor.data_as<float>() + 4),
            std::vector<float>(x, x + 4));
  const auto& strings = std::get<interpreters::BytesTensor>(request->inputs[1].value);
  EXPECT_EQ(strings.items, (std::vector<std::string>{"hi", ""}));

  std::vector<interpreters::NamedTensor> outputs = {{"y", tensor}, {"t", strings}};
  ASSERT_TRUE(WriteSharedMemoryOutputs(manifest, *request, outputs).ok());
  float written[4];
  std::memcpy(written, object.data() + 1024, sizeof(written));
  EXPECT_EQ(std::vector<float>(written, written + 4), std::vector<float>(x, x + 4));
  EXPECT_EQ(std::memcmp(object.data() + 2048, s, 10), 0);
  const nlohmann::json response =
      nlohmann::json::parse(EncodeInferResponse(manifest, *request, outputs).body);
  EXPECT_EQ(response["outputs"][1],
            nlohmann::json::parse(R"({"name":"t","datatype":"BYTES","shape":[2,1],
               "parameters":{"shared_memory_region":"r","shared_memory_offset":2048,
                             "shared_memory_byte_size":10}})"));
  EXPECT_FALSE(response["outputs"][0].contains("data"));
}

TEST(ResolveSharedMemory, AnOutputLargerThanItsByteSizeWritesNothing) {
  Object object(4096);
  SharedMemoryRegistry registry(true);
  ASSERT_TRUE(registry.Register("r", object.key(), 0, 4096).ok());
  const packaging::Manifest manifest = Model();
  const std::string body = R"({"inputs":[
    {"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2]},
    {"name":"s","datatype":"BYTES","shape":[1,1],"data":["abc"]}],
    "outputs":[{"name":"y","parameters":{"shared_memory_region":"r","shared_memory_byte_size":8}},
               {"name":"t","parameters":{"shared_memory_region":"r","shared_memory_offset":8,
                "shared_memory_byte_size":6}}]})";
  Result<InferRequest> request = ParseInferRequest(manifest, body, std::nullopt, {});
  ASSERT_TRUE(request.ok()) << request.status().message();
  ASSERT_TRUE(ResolveSharedMemory(manifest, registry, &*request).ok());
  std::vector<interpreters::NamedTensor> outputs = request->inputs;
  outputs[0].name = "y";
  outputs[1].name = "t";
  Status refused = WriteSharedMemoryOutputs(manifest, *request, outputs);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("output 't' of model 'm' has 7 bytes"));
  EXPECT_EQ(std::vector<std::byte>(object.data(), object.data() + 16),
            std::vector<std::byte>(16, std::byte{0}));  // y fitted, but was not written either
}

}  // namespace
}  // namespace orochi::server::kserve
