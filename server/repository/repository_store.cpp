#include "repository_store.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "log.h"
#include "orochi/packaging/model_key.h"

namespace orochi::server::repository {
namespace {

namespace fs = std::filesystem;

constexpr const char* kStateDirectory = ".orochi";
constexpr const char* kPackageFile = "model.orochi";
constexpr const char* kQuarantineFile = "quarantine.json";
constexpr size_t kMostReasonChars = 1024;  // of a quarantine's recorded reason
constexpr const char* kTrashPrefix = "trash-";
// An upload file no server holds is left alone while it is this young and empty: the moment
// between its creation and its lock.
constexpr std::chrono::seconds kUnlockedUploadGrace{10};

std::string Which(const std::string& name, int64_t version) {
  return "model '" + name + "' version " + std::to_string(version);
}

std::string Errno() { return std::strerror(errno); }

// The contents of one of the repository's state files, if it is a regular file of at most 16 MiB:
// model code owns the repository's files too, and one replaced by a FIFO blocked the next start
// in its open, a directory failed it, /dev/zero behind a link had no end.
std::optional<std::string> ReadStateFile(const std::string& path) {
  constexpr off_t kMostBytes = off_t{16} << 20;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) {
      Log(LogLevel::kWarning, "a repository state file cannot be read; ignored",
          {{"path", path}, {"error", Errno()}});
    }
    return std::nullopt;
  }
  struct stat status {};
  std::optional<std::string> text;
  if (::fstat(fd, &status) == 0 && S_ISREG(status.st_mode) && status.st_size <= kMostBytes) {
    text.emplace(static_cast<size_t>(status.st_size), '\0');
    size_t done = 0;
    while (done < text->size()) {
      const ssize_t got = ::read(fd, text->data() + done, text->size() - done);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      done += static_cast<size_t>(got);
    }
    text->resize(done);
  } else {
    Log(LogLevel::kWarning,
        "a repository state file is not a regular file of at most 16 MiB; ignored",
        {{"path", path}});
  }
  ::close(fd);
  return text;
}

bool ParseVersion(const std::string& text, int64_t* version) {
  if (text.empty() || text.size() > 18 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  *version = std::stoll(text);
  return *version >= 1;
}

Status SyncFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    Status failed = Internal("cannot sync " + path + ": " + Errno());
    if (fd >= 0) ::close(fd);
    return failed;
  }
  ::close(fd);
  return Status::Ok();
}

// Durability of a name just created or removed in `path`; a failure to sync a directory
// changes nothing a reader sees, so it is not an error.
void SyncDirectory(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// An upload file left by a server that died mid-way: no server holds its lock, and it is not
// one being created this moment (empty and young).
bool IsAbandonedUpload(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  bool abandoned = false;
  struct stat status {};
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &status) == 0) {
    const auto age = std::chrono::system_clock::now() -
                     std::chrono::system_clock::from_time_t(status.st_mtim.tv_sec);
    abandoned = status.st_size > 0 || age > kUnlockedUploadGrace;
  }
  ::close(fd);
  return abandoned;
}

// link(2) over NFS may report a failure for a link that was made (a retransmitted request):
// the source's link count tells. Keeps errno.
bool Linked(const std::string& source) {
  const int failure = errno;
  struct stat status {};
  const bool linked = ::stat(source.c_str(), &status) == 0 && status.st_nlink == 2;
  errno = failure;
  return linked;
}

}  // namespace

RepositoryStore::RepositoryStore(std::string root) : root_(std::move(root)) {}

std::string RepositoryStore::upload_directory() const {
  return (fs::path(root_) / kStateDirectory / "uploads").string();
}

Status RepositoryStore::Open() const {
  std::error_code error;
  if (!fs::is_directory(root_, error)) {
    return NotFound("the model repository " + root_ + " is not a directory");
  }
  // Model code owns these files too: a state directory or upload directory that something
  // replaced with a file (or a FIFO, a link) failed every start after it. Such an entry is
  // moved aside, named for when, and the directory made afresh.
  for (const fs::path& directory :
       {fs::path(root_) / kStateDirectory, fs::path(upload_directory())}) {
    const fs::file_status status = fs::symlink_status(directory, error);
    if (error || status.type() == fs::file_type::not_found ||
        status.type() == fs::file_type::directory) {
      continue;
    }
    const fs::path aside =
        directory.string() + ".damaged-" +
        std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
    std::error_code moved;
    fs::rename(directory, aside, moved);
    Log(LogLevel::kWarning, "a repository directory was replaced by something else; moved aside",
        {{"path", directory.string()}, {"moved_to", moved ? moved.message() : aside.string()}});
  }
  error.clear();
  fs::create_directories(upload_directory(), error);
  if (error) return Internal("cannot create " + upload_directory() + ": " + error.message());
  // Other servers sharing the repository may be receiving uploads here: only what no live
  // server holds goes.
  for (auto it = fs::directory_iterator(upload_directory(), error);
       !error && it != fs::directory_iterator(); it.increment(error)) {
    std::error_code ignored;
    if (IsAbandonedUpload(it->path())) fs::remove(it->path(), ignored);
  }
  // Trash is out of every listing already; a server still deleting it ignores what is gone.
  const fs::path state = fs::path(root_) / kStateDirectory;
  for (auto it = fs::directory_iterator(state, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    if (it->path().filename().string().starts_with(kTrashPrefix)) RemoveTrash(it->path());
  }
  return Status::Ok();
}

std::string RepositoryStore::PackagePath(const std::string& name, int64_t version) const {
  return (fs::path(root_) / name / std::to_string(version) / kPackageFile).string();
}

Result<std::vector<std::string>> RepositoryStore::Models() const {
  std::vector<std::string> names;
  if (root_.empty()) return names;
  std::error_code error;
  for (auto it = fs::directory_iterator(root_, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    std::error_code ignored;
    const std::string name = it->path().filename().string();
    if (!name.empty() && name.front() != '.' && it->is_directory(ignored)) names.push_back(name);
  }
  if (error) {
    return Unavailable("cannot list the model repository " + root_ + ": " + error.message());
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool RepositoryStore::HasModel(const std::string& name) const {
  std::error_code error;
  return !root_.empty() && fs::is_directory(fs::path(root_) / name, error);
}

Result<std::vector<int64_t>> RepositoryStore::Versions(const std::string& name) const {
  std::vector<int64_t> versions;
  if (root_.empty()) return versions;
  std::error_code error;
  const fs::path directory = fs::path(root_) / name;
  for (auto it = fs::directory_iterator(directory, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    int64_t version = 0;
    std::error_code ignored;
    if (ParseVersion(it->path().filename().string(), &version) &&
        fs::is_regular_file(it->path() / kPackageFile, ignored)) {
      versions.push_back(version);
    }
  }
  if (error && error != std::errc::no_such_file_or_directory) {
    return Unavailable("cannot list " + directory.string() + ": " + error.message());
  }
  std::sort(versions.begin(), versions.end());
  return versions;
}

bool RepositoryStore::HasVersion(const std::string& name, int64_t version) const {
  std::error_code error;
  return !root_.empty() && fs::exists(PackagePath(name, version), error);
}

std::optional<FileIdentity> RepositoryStore::Identify(const std::string& name,
                                                      int64_t version) const {
  struct stat status {};
  if (root_.empty() || ::stat(PackagePath(name, version).c_str(), &status) != 0) {
    return std::nullopt;
  }
  return FileIdentity{
      static_cast<uint64_t>(status.st_dev), static_cast<uint64_t>(status.st_ino),
      static_cast<int64_t>(status.st_size),
      static_cast<int64_t>(status.st_mtim.tv_sec) * 1'000'000'000 + status.st_mtim.tv_nsec};
}

Status RepositoryStore::Publish(const std::string& name, int64_t version,
                                const std::string& file) const {
  const std::string target = PackagePath(name, version);
  const fs::path directory = fs::path(target).parent_path();
  auto conflict = [&] {
    return AlreadyExists(Which(name, version) +
                         " is already deployed (another upload, maybe through another server "
                         "sharing the repository, published it first); delete it first or "
                         "deploy a new version");
  };
  // The data is on disk before any name leads to it.
  OROCHI_RETURN_IF_ERROR(SyncFile(file));
  std::error_code error;
  const fs::path model_directory = directory.parent_path();
  const bool model_directory_existed = fs::exists(model_directory, error);
  fs::create_directories(directory, error);
  if (error) return Internal("cannot create " + directory.string() + ": " + error.message());
  // Modes of their own, as the package file has (0644): the process's umask is model code's to
  // change too, and one of 0777 once made an operator's upload directories of mode 000, which
  // the next start could not list.
  constexpr fs::perms kDirectoryMode = fs::perms::owner_all | fs::perms::group_read |
                                       fs::perms::group_exec | fs::perms::others_read |
                                       fs::perms::others_exec;
  if (!model_directory_existed) fs::permissions(model_directory, kDirectoryMode, error);
  if (!error) fs::permissions(directory, kDirectoryMode, error);
  if (error) return Internal("cannot open " + directory.string() + ": " + error.message());
  SyncDirectory(directory.parent_path().parent_path());
  SyncDirectory(directory.parent_path());
  // The moment the package appears, whole. link() never replaces a name: of two servers
  // publishing one version, the second gets EEXIST.
  if (::link(file.c_str(), target.c_str()) != 0 && !Linked(file)) {
    const int failure = errno;
    if (failure == EEXIST) return conflict();
    if (failure != EPERM && failure != EOPNOTSUPP && failure != ENOSYS) {
      return Internal("cannot publish " + target + ": " + std::strerror(failure));
    }
    // A filesystem without hard links: a rename that refuses to replace does the same.
    if (::renameat2(AT_FDCWD, file.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) != 0) {
      if (errno == EEXIST) return conflict();
      return Internal("cannot publish " + target +
                      ": the repository's filesystem has neither hard links nor renames that "
                      "refuse to replace a file (" +
                      Errno() + ")");
    }
  }
  SyncDirectory(directory);
  ::unlink(file.c_str());  // gone already after a rename
  return Status::Ok();
}

Result<std::string> RepositoryStore::MoveToTrash(const std::string& name,
                                                 std::optional<int64_t> version) const {
  const fs::path model = fs::path(root_) / name;
  const fs::path doomed = version ? model / std::to_string(*version) : model;
  // A directory of its own: servers sharing the repository may delete at the same moment.
  std::string trash = (fs::path(root_) / kStateDirectory / kTrashPrefix).string() + "XXXXXX";
  if (::mkdtemp(trash.data()) == nullptr) {
    return Internal("cannot remove " + doomed.string() + ": cannot create " + trash + ": " +
                    Errno());
  }
  if (::rename(doomed.c_str(), (fs::path(trash) / doomed.filename()).c_str()) != 0) {
    const int failure = errno;
    ::rmdir(trash.c_str());
    if (failure == ENOENT) {
      return NotFound(version ? Which(name, *version) + " is not in the repository"
                              : "model '" + name + "' is not in the repository");
    }
    return Internal("cannot remove " + doomed.string() + ": " + std::strerror(failure));
  }
  SyncDirectory(doomed.parent_path());
  return trash;
}

void RepositoryStore::RemoveTrash(const std::string& trash) {
  std::error_code ignored;
  fs::remove_all(trash, ignored);
}

std::set<std::string> RepositoryStore::ReadUnloaded() const {
  std::set<std::string> unloaded;
  const std::optional<std::string> text =
      ReadStateFile((fs::path(root_) / kStateDirectory / "state.json").string());
  if (!text) return unloaded;
  nlohmann::json state = nlohmann::json::parse(*text, nullptr, false);
  if (state.is_object() && state.contains("unloaded") && state["unloaded"].is_array()) {
    for (const auto& name : state["unloaded"]) {
      if (name.is_string()) unloaded.insert(name.get<std::string>());
    }
  }
  return unloaded;
}

Status RepositoryStore::WriteUnloaded(const std::set<std::string>& names) const {
  nlohmann::json state{{"unloaded", names}};
  return WriteFileAtomically((fs::path(root_) / kStateDirectory / "state.json").string(),
                             state.dump(2) + "\n");
}

std::map<std::string, std::string> RepositoryStore::ReadQuarantine() const {
  std::map<std::string, std::string> quarantined;
  const std::optional<std::string> text =
      ReadStateFile((fs::path(root_) / kStateDirectory / kQuarantineFile).string());
  if (!text) return quarantined;
  const nlohmann::json recorded = nlohmann::json::parse(*text, nullptr, false);
  if (!recorded.is_object() || !recorded.contains("quarantined") ||
      !recorded["quarantined"].is_array()) {
    return quarantined;
  }
  for (const nlohmann::json& entry : recorded["quarantined"]) {
    // Model code owns these files too: an entry of the wrong shape is passed over, never thrown.
    if (!entry.is_object() || !entry.contains("model") || !entry["model"].is_string() ||
        !entry.contains("package") || !entry["package"].is_object()) {
      continue;
    }
    const std::string key = entry["model"].get<std::string>();
    const nlohmann::json& package = entry["package"];
    const Result<packaging::ModelKey> parsed = packaging::ModelKey::Parse(key);
    const auto number = [&package](const char* field) -> std::optional<int64_t> {
      if (!package.contains(field) || !package[field].is_number_integer()) return std::nullopt;
      return package[field].get<int64_t>();
    };
    const std::optional<int64_t> inode = number("inode");
    const std::optional<int64_t> size = number("size");
    const std::optional<int64_t> modified_ns = number("modified_ns");
    if (!parsed.ok() || !inode || !size || !modified_ns) continue;
    // The device number is left out: it may change when the volume is mounted again.
    const std::optional<FileIdentity> current = Identify(parsed->name, parsed->version);
    if (!current || current->inode != static_cast<uint64_t>(*inode) || current->size != *size ||
        current->modified_ns != *modified_ns) {
      continue;  // deployed again since, or gone
    }
    std::string reason = "quarantined at an earlier start";
    if (entry.contains("reason") && entry["reason"].is_string()) {
      reason = entry["reason"].get<std::string>().substr(0, kMostReasonChars);
    }
    quarantined[key] = std::move(reason);
  }
  return quarantined;
}

Status RepositoryStore::WriteQuarantine(
    const std::map<std::string, std::string>& quarantined) const {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& [key, reason] : quarantined) {
    const Result<packaging::ModelKey> parsed = packaging::ModelKey::Parse(key);
    if (!parsed.ok()) continue;
    const std::optional<FileIdentity> package = Identify(parsed->name, parsed->version);
    if (!package) continue;
    entries.push_back({{"model", key},
                       {"reason", reason},
                       {"package",
                        {{"inode", package->inode},
                         {"size", package->size},
                         {"modified_ns", package->modified_ns}}}});
  }
  return WriteFileAtomically((fs::path(root_) / kStateDirectory / kQuarantineFile).string(),
                             nlohmann::json{{"quarantined", entries}}.dump(2) + "\n");
}

Status WriteFileAtomically(const std::string& path, const std::string& text) {
  std::string temporary = path + ".XXXXXX";
  int fd = ::mkstemp(temporary.data());
  if (fd < 0) return Internal("cannot write " + temporary + ": " + Errno());
  ::fchmod(fd, 0644);
  bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  written = ::fsync(fd) == 0 && written;
  written = ::close(fd) == 0 && written;
  if (!written || ::rename(temporary.c_str(), path.c_str()) != 0) {
    Status failed = Internal("cannot write " + path + ": " + Errno());
    ::unlink(temporary.c_str());
    return failed;
  }
  SyncDirectory(fs::path(path).parent_path());
  return Status::Ok();
}

}  // namespace orochi::server::repository
