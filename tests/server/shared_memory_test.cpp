// The system shared-memory registry and the codec's shared-memory step, on real POSIX
// shared-memory objects: regions hold what their key names and nothing past it, stay open
// while a request holds them after they are unregistered, every offset and size a request
// gives is checked against its region and its tensor, and an object the client truncates
// (even while it is read and written) is an error, never a crash.
#include "kserve/shared_memory.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
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
  // Only regular files: a FIFO in the shared-memory directory has no bytes at offsets.
  const std::string fifo = "/orochi-shm-test-fifo-" + std::to_string(getpid());
  ASSERT_EQ(mkfifo(("/dev/shm" + fifo).c_str(), 0600), 0);
  Status not_a_file = registry.Register("b", fifo, 0, 16);
  unlink(("/dev/shm" + fifo).c_str());
  EXPECT_EQ(not_a_file.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(not_a_file.message(), HasSubstr("is not a regular file"));
  EXPECT_FALSE(registry.Register("", object.key(), 0, 16).ok());

  // Request offsets count from the region's offset in the object.
  std::memcpy(object.data() + 100, "hello", 5);
  Result<std::shared_ptr<const SharedMemoryRegion>> region = registry.Find("a");
  ASSERT_TRUE(region.ok());
  char bytes[5] = {};
  ASSERT_TRUE((*region)->ReadInto(0, 5, "input 'x'", reinterpret_cast<std::byte*>(bytes)).ok());
  EXPECT_EQ(std::memcmp(bytes, "hello", 5), 0);
  EXPECT_FALSE((*region)->ReadInto(8092, 1, "input 'x'", reinterpret_cast<std::byte*>(bytes)).ok());
  EXPECT_FALSE(
      (*region)->ReadInto(1, UINT64_MAX, "input 'x'", reinterpret_cast<std::byte*>(bytes)).ok());
  EXPECT_TRUE((*region)->ReadInto(8092, 0, "input 'x'", reinterpret_cast<std::byte*>(bytes)).ok());

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

TEST(SharedMemoryRegistry, AHeldRegionStaysOpenAfterItIsUnregistered) {
  Object object(4096);
  SharedMemoryRegistry registry(true);
  ASSERT_TRUE(registry.Register("a", object.key(), 0, 4096).ok());
  std::shared_ptr<const SharedMemoryRegion> held = *registry.Find("a");
  registry.Unregister("a", SharedMemoryKind::kSystem);
  registry.Unregister("a", SharedMemoryKind::kSystem);  // not registered: no error
  EXPECT_EQ(registry.Find("a").status().code(), StatusCode::kNotFound);
  // Still open: writes through it reach the object.
  ASSERT_TRUE(held->Write(10, std::as_bytes(std::span("abc", 3)), "output 'y'").ok());
  EXPECT_EQ(std::memcmp(object.data() + 10, "abc", 3), 0);
  // The name can be registered again meanwhile.
  EXPECT_TRUE(registry.Register("a", object.key(), 0, 16).ok());
  registry.UnregisterAll(SharedMemoryKind::kSystem);
  EXPECT_TRUE(registry.Describe(std::nullopt, SharedMemoryKind::kSystem)->empty());
}

// The object as another process would cut it: to `size` bytes, through a descriptor of its own.
void Truncate(const Object& object, size_t size) {
  const int fd = shm_open(object.key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  close(fd);
}

TEST(SharedMemoryRegistry, AnObjectTruncatedAfterRegistrationIsAnErrorNotACrash) {
  Object object(size_t{3} * 4096);
  SharedMemoryRegistry registry(true);
  ASSERT_TRUE(registry.Register("r", object.key(), 4096, uint64_t{2} * 4096).ok());
  std::shared_ptr<const SharedMemoryRegion> region = *registry.Find("r");
  std::byte bytes[64] = {};
  Truncate(object, 0);  // the test's mapping is not touched from here until it grows again
  Status read = region->ReadInto(0, 4, "input 'x'", bytes);
  EXPECT_EQ(read.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(read.message(),
            "input 'x': shared memory region 'r' holds 0 bytes now (its object was truncated to 0 "
            "bytes); the input needs 4 bytes at offset 0");
  Status written = region->Write(8, std::span(bytes, 64), "output 'y'");
  EXPECT_EQ(written.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(written.message(), HasSubstr("the output needs 64 bytes at offset 8"));
  EXPECT_FALSE(region->CheckHeld(8, 64, "output 'y'").ok());
  EXPECT_TRUE(region->CheckHeld(8, 0, "output 'y'").ok());  // nothing to write, nothing needed

  // Cut inside the region: what it still holds is read and written, nothing past it.
  Truncate(object, 4096 + 10);
  EXPECT_TRUE(region->ReadInto(2, 8, "input 'x'", bytes).ok());
  EXPECT_TRUE(region->Write(0, std::span(bytes, 10), "output 'y'").ok());
  EXPECT_THAT(region->ReadInto(4, 8, "input 'x'", bytes).message(),
              HasSubstr("holds 10 bytes now (its object was truncated to 4106 bytes); the input "
                        "needs 8 bytes at offset 4"));
  EXPECT_FALSE(region->Write(4, std::span(bytes, 8), "output 'y'").ok());
  struct stat info {};
  {
    const int fd = shm_open(object.key().c_str(), O_RDONLY, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fstat(fd, &info), 0);
    close(fd);
  }
  EXPECT_EQ(info.st_size, 4096 + 10);  // a refused write does not grow the object

  Truncate(object, size_t{3} * 4096);  // grown back: served again
  std::memcpy(object.data() + 4096 + 100, "back", 4);
  ASSERT_TRUE(region->ReadInto(100, 4, "input 'x'", bytes).ok());
  EXPECT_EQ(std::memcmp(bytes, "back", 4), 0);
}

TEST(SharedMemoryRegistry, ReadsAndWritesRacingATruncationFailOrSucceedButNeverCrash) {
  constexpr size_t kSize = size_t{64} * 1024;
  Object object(kSize);
  SharedMemoryRegistry registry(true);
  ASSERT_TRUE(registry.Register("r", object.key(), 0, kSize).ok());
  std::shared_ptr<const SharedMemoryRegion> region = *registry.Find("r");
  std::atomic<bool> done = false;
  std::thread cutter([&] {
    const int fd = shm_open(object.key().c_str(), O_RDWR, 0);
    for (size_t size = 0; !done; size = size == 0 ? kSize : 0) {
      EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    }
    close(fd);
  });
  std::vector<std::byte> buffer(kSize);
  int refused = 0;
  for (int i = 0; i < 2000; ++i) {
    for (const Status& status : {region->ReadInto(0, kSize, "input 'x'", buffer.data()),
                                 region->Write(0, buffer, "output 'y'")}) {
      if (status.ok()) continue;
      ++refused;
      EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(status.message(), HasSubstr("shared memory region 'r' holds"));
    }
  }
  done = true;
  cutter.join();
  EXPECT_GT(refused, 0);  // the race was run, not missed
}

// Each system region keeps a descriptor: registrations without end would take the ones that
// connections need. A quarter of RLIMIT_NOFILE is theirs.
TEST(SharedMemoryRegistry, SystemRegionsTakeAQuarterOfTheDescriptorsAtMost) {
  Object object(4096);
  SharedMemoryRegistry registry(true);
  rlimit original{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &original), 0);
  rlimit lowered = original;
  lowered.rlim_cur = std::min<rlim_t>(original.rlim_cur, 200);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  const size_t most = lowered.rlim_cur / 4;
  for (size_t i = 0; i < most; ++i) {
    ASSERT_TRUE(registry.Register("r" + std::to_string(i), object.key(), 0, 16).ok()) << i;
  }
  const Status refused = registry.Register("one-more", object.key(), 0, 16);
  registry.Unregister("r0", SharedMemoryKind::kSystem);
  const Status after_unregister = registry.Register("one-more", object.key(), 0, 16);
  registry.UnregisterAll(SharedMemoryKind::kSystem);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &original), 0);
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              HasSubstr(std::to_string(most) + " system shared memory regions are registered"));
  EXPECT_THAT(refused.message(), HasSubstr("RLIMIT_NOFILE " + std::to_string(lowered.rlim_cur)));
  EXPECT_TRUE(after_unregister.ok()) << after_unregister.message();
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
