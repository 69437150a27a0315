// The repository on disk: listing, publishing without replacing (one winner among concurrent
// writers), removal through the trash, the state file, and what Open cleans up, on a real
// directory.
#include "repository/repository_store.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

namespace orochi::server::repository {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string Read(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

void Write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

class RepositoryStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "orochi-store-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    store_ = RepositoryStore(root_.string());
    ASSERT_TRUE(store_.Open().ok());
  }
  void TearDown() override { fs::remove_all(root_); }

  // A finished upload, as the transport leaves it for the handler.
  std::string Upload(const std::string& contents) {
    std::string path = store_.upload_directory() + "/.upload-XXXXXX";
    int fd = ::mkstemp(path.data());
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::write(fd, contents.data(), contents.size()), static_cast<ssize_t>(contents.size()));
    ::close(fd);
    return path;
  }

  fs::path root_;
  RepositoryStore store_{""};
};

TEST_F(RepositoryStoreTest, ListsModelsAndVersionsThatHoldAPackage) {
  Write(root_ / "b" / "2" / "model.orochi", "b2");
  Write(root_ / "b" / "10" / "model.orochi", "b10");
  Write(root_ / "b" / "3" / "notes.txt", "no package");  // not a version
  Write(root_ / "b" / "0" / "model.orochi", "x");        // versions start at 1
  Write(root_ / "b" / "v4" / "model.orochi", "x");       // not a number
  Write(root_ / "a" / "1" / "model.orochi", "a1");
  Write(root_ / "stray.txt", "not a model");
  EXPECT_THAT(store_.Models().value(), ElementsAre("a", "b"));  // .orochi is Orochi's, not a model
  EXPECT_THAT(store_.Versions("b").value(), ElementsAre(2, 10));
  EXPECT_THAT(store_.Versions("missing").value(), IsEmpty());
  EXPECT_TRUE(store_.HasModel("a"));
  EXPECT_FALSE(store_.HasModel("stray.txt"));
  EXPECT_TRUE(store_.HasVersion("b", 10));
  EXPECT_FALSE(store_.HasVersion("b", 3));
  EXPECT_EQ(store_.PackagePath("a", 1), (root_ / "a" / "1" / "model.orochi").string());
  EXPECT_THAT(RepositoryStore("").Models().value(), IsEmpty());
}

// Out of descriptors (a model leaking files does that to the whole process), a listing is an
// error, not an empty repository: poll mode once unloaded every model on such a listing, and
// the index answered [] with 200.
TEST_F(RepositoryStoreTest, AListingThatCannotBeReadIsAnErrorNotEmpty) {
  Write(root_ / "a" / "1" / "model.orochi", "a1");
  rlimit original{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &original), 0);
  rlimit lowered = original;
  lowered.rlim_cur = std::min<rlim_t>(original.rlim_cur, 256);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lowered), 0);
  std::vector<int> taken;
  for (int fd = ::dup(0); fd >= 0; fd = ::dup(0)) taken.push_back(fd);
  const Result<std::vector<std::string>> models = store_.Models();
  const Result<std::vector<int64_t>> versions = store_.Versions("a");
  for (int fd : taken) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &original), 0);
  ASSERT_FALSE(models.ok());
  EXPECT_THAT(models.status().message(), HasSubstr("cannot list the model repository"));
  EXPECT_THAT(models.status().message(), HasSubstr("Too many open files"));
  ASSERT_FALSE(versions.ok());
  EXPECT_THAT(versions.status().message(), HasSubstr("Too many open files"));
  EXPECT_THAT(store_.Models().value(), ElementsAre("a"));
}

TEST_F(RepositoryStoreTest, PublishesWholeAndNeverReplaces) {
  const std::string first = Upload("the first package");
  ASSERT_TRUE(store_.Publish("m", 2, first).ok());
  EXPECT_EQ(Read(store_.PackagePath("m", 2)), "the first package");
  EXPECT_FALSE(fs::exists(first)) << "the upload's name goes once published";
  EXPECT_THAT(store_.Versions("m").value(), ElementsAre(2));

  const std::string second = Upload("the second package");
  Status again = store_.Publish("m", 2, second);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(again.message(), HasSubstr("model 'm' version 2 is already deployed"));
  EXPECT_EQ(Read(store_.PackagePath("m", 2)), "the first package");
  EXPECT_TRUE(fs::exists(second)) << "a refused upload stays its owner's to remove";
}

TEST_F(RepositoryStoreTest, OfConcurrentPublishersOfOneVersionExactlyOneWins) {
  constexpr int kWriters = 8;
  std::vector<std::string> uploads;
  for (int i = 0; i < kWriters; ++i) uploads.push_back(Upload("package " + std::to_string(i)));
  std::atomic<int> won{0};
  std::atomic<int> conflicts{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> writers;
  for (int i = 0; i < kWriters; ++i) {
    writers.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      Status published = store_.Publish("m", 1, uploads[i]);
      if (published.ok()) ++won;
      if (published.code() == StatusCode::kAlreadyExists) ++conflicts;
    });
  }
  go = true;
  for (std::thread& writer : writers) writer.join();
  EXPECT_EQ(won, 1);
  EXPECT_EQ(conflicts, kWriters - 1);
  const std::string published = Read(store_.PackagePath("m", 1));
  int owners = 0;
  for (const std::string& upload : uploads) owners += fs::exists(upload) ? 0 : 1;
  EXPECT_EQ(owners, 1) << "only the winner's upload was taken";
  EXPECT_THAT(published, HasSubstr("package ")) << "one writer's package, whole";
}

TEST_F(RepositoryStoreTest, ARemovedVersionIsOutOfSightAtOnce) {
  ASSERT_TRUE(store_.Publish("m", 1, Upload("one")).ok());
  ASSERT_TRUE(store_.Publish("m", 2, Upload("two")).ok());
  Result<std::string> trash = store_.MoveToTrash("m", 1);
  ASSERT_TRUE(trash.ok()) << trash.status().ToString();
  EXPECT_THAT(store_.Versions("m").value(), ElementsAre(2));
  EXPECT_EQ(store_.MoveToTrash("m", 1).status().code(), StatusCode::kNotFound)
      << "deleted meanwhile (by another server) is not found, not an internal error";
  RepositoryStore::RemoveTrash(*trash);
  EXPECT_FALSE(fs::exists(*trash));
  Result<std::string> model = store_.MoveToTrash("m", std::nullopt);
  ASSERT_TRUE(model.ok());
  EXPECT_THAT(store_.Models().value(), IsEmpty());
  EXPECT_EQ(store_.MoveToTrash("m", std::nullopt).status().code(), StatusCode::kNotFound);
  // Trash a server left behind goes at the next Open.
  ASSERT_TRUE(store_.Open().ok());
  EXPECT_FALSE(fs::exists(*model));
}

TEST_F(RepositoryStoreTest, OpenRemovesOnlyUploadsNoLiveServerHolds) {
  const std::string abandoned = Upload("cut short when its server died");
  const std::string held = Upload("still being received");
  const int held_fd = ::open(held.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_EQ(::flock(held_fd, LOCK_EX | LOCK_NB), 0);
  const std::string just_created = Upload("");  // not locked yet, and empty: being created
  ASSERT_TRUE(store_.Open().ok());
  EXPECT_FALSE(fs::exists(abandoned));
  EXPECT_TRUE(fs::exists(held));
  EXPECT_TRUE(fs::exists(just_created));
  ::close(held_fd);
  ASSERT_TRUE(store_.Open().ok());
  EXPECT_FALSE(fs::exists(held)) << "its server let go of it";
  EXPECT_EQ(store_.Open().code(), StatusCode::kOk);
  EXPECT_EQ(RepositoryStore((root_ / "missing").string()).Open().code(), StatusCode::kNotFound);
}

TEST_F(RepositoryStoreTest, TellsAReplacedPackageFromTheOneLoaded) {
  ASSERT_TRUE(store_.Publish("m", 1, Upload("first")).ok());
  std::optional<FileIdentity> first = store_.Identify("m", 1);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(store_.Identify("m", 1), first);
  RepositoryStore::RemoveTrash(*store_.MoveToTrash("m", 1));
  EXPECT_FALSE(store_.Identify("m", 1).has_value());
  ASSERT_TRUE(store_.Publish("m", 1, Upload("second, deployed again")).ok());
  EXPECT_NE(store_.Identify("m", 1), first);
}

TEST_F(RepositoryStoreTest, TheStateFileIsReplacedWhole) {
  EXPECT_THAT(store_.ReadUnloaded(), IsEmpty());
  ASSERT_TRUE(store_.WriteUnloaded({"a", "b"}).ok());
  EXPECT_THAT(store_.ReadUnloaded(), ElementsAre("a", "b"));
  ASSERT_TRUE(store_.WriteUnloaded({"b"}).ok());
  EXPECT_THAT(store_.ReadUnloaded(), ElementsAre("b"));
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(root_ / ".orochi")) {
    files.push_back(entry.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  EXPECT_THAT(files, ElementsAre("state.json", "uploads")) << "no temporary left behind";
}

TEST_F(RepositoryStoreTest, AQuarantineHoldsUntilItsPackageIsReplaced) {
  ASSERT_TRUE(store_.Publish("m", 1, Upload("crashes")).ok());
  ASSERT_TRUE(store_.Publish("n", 2, Upload("crashes too")).ok());
  EXPECT_THAT(store_.ReadQuarantine(), IsEmpty());
  // A version with no package is not recorded: nothing would tell its next package apart.
  ASSERT_TRUE(
      store_.WriteQuarantine({{"m:1", "crashed"}, {"n:2", "stuck"}, {"gone:1", "crashed"}}).ok());
  EXPECT_EQ(store_.ReadQuarantine(),
            (std::map<std::string, std::string>{{"m:1", "crashed"}, {"n:2", "stuck"}}));
  RepositoryStore::RemoveTrash(*store_.MoveToTrash("m", 1));
  ASSERT_TRUE(store_.Publish("m", 1, Upload("fixed")).ok());
  EXPECT_EQ(store_.ReadQuarantine(), (std::map<std::string, std::string>{{"n:2", "stuck"}}));
}

TEST_F(RepositoryStoreTest, AQuarantineFileOfTheWrongShapeQuarantinesNothingAndThrowsNothing) {
  ASSERT_TRUE(store_.Publish("m", 1, Upload("package")).ok());
  const fs::path file = root_ / ".orochi" / "quarantine.json";
  for (const std::string& text :
       {std::string("not json"), std::string("[]"), std::string(R"({"quarantined": 7})"),
        std::string(R"({"quarantined": [7, "m:1", null]})"),
        std::string(R"({"quarantined": [{"model": 1, "package": {}}]})"),
        std::string(R"({"quarantined": [{"model": "m:1", "package": {"inode": "1"}}]})"),
        std::string(R"({"quarantined": [{"model": "m:1", "package": []}]})"),
        std::string(R"({"quarantined": [{"model": "m", "package": {"inode": 1, "size": 1,
                                         "modified_ns": 1}}]})")}) {
    Write(file, text);
    EXPECT_THAT(store_.ReadQuarantine(), IsEmpty()) << text;
  }
  // The right shape with a reason of the wrong type still holds, with a reason of its own.
  ASSERT_TRUE(store_.WriteQuarantine({{"m:1", "crashed"}}).ok());
  std::string recorded = Read(file);
  recorded.replace(recorded.find("\"crashed\""), 9, "[1, 2]");
  Write(file, recorded);
  EXPECT_EQ(store_.ReadQuarantine(),
            (std::map<std::string, std::string>{{"m:1", "quarantined at an earlier start"}}));
}

TEST_F(RepositoryStoreTest, OpenMovesAsideWhatReplacedItsDirectories) {
  // Model code owns the repository's files: an upload directory made a file failed every start.
  fs::remove_all(store_.upload_directory());
  Write(store_.upload_directory(), "not a directory");
  ASSERT_TRUE(store_.Open().ok());
  EXPECT_TRUE(fs::is_directory(store_.upload_directory()));
  // So did the state directory.
  fs::remove_all(root_ / ".orochi");
  Write(root_ / ".orochi", "not a directory either");
  ASSERT_TRUE(store_.Open().ok());
  EXPECT_TRUE(fs::is_directory(store_.upload_directory()));
  std::vector<std::string> aside;
  for (const auto& entry : fs::directory_iterator(root_)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(".orochi.damaged-")) aside.push_back(Read(entry.path()));
  }
  EXPECT_THAT(aside, ElementsAre("not a directory either"));
  EXPECT_THAT(store_.Models().value(), IsEmpty());
}

TEST_F(RepositoryStoreTest, StateFilesThatAreNotRegularFilesAreIgnoredWithoutWaiting) {
  // A FIFO once blocked the next start in its open, a directory failed it.
  ASSERT_EQ(::mkfifo((root_ / ".orochi" / "state.json").c_str(), 0600), 0);
  fs::create_directory(root_ / ".orochi" / "quarantine.json");
  EXPECT_THAT(store_.ReadUnloaded(), IsEmpty());
  EXPECT_THAT(store_.ReadQuarantine(), IsEmpty());
  fs::remove(root_ / ".orochi" / "state.json");
  fs::remove(root_ / ".orochi" / "quarantine.json");
  fs::create_symlink("/dev/zero", root_ / ".orochi" / "state.json");
  EXPECT_THAT(store_.ReadUnloaded(), IsEmpty());
  // What the server writes takes the place of what was there.
  ASSERT_TRUE(store_.WriteUnloaded({"a"}).ok());
  EXPECT_THAT(store_.ReadUnloaded(), ElementsAre("a"));
}

}  // namespace
}  // namespace orochi::server::repository
