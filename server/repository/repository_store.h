// The model repository on disk: <root>/<name>/<version>/model.orochi, and Orochi's own
// directory <root>/.orochi (uploads being received, the state file, trash being removed).
// Storage only: which versions load, and when, is ModelService's business.
//
// Several servers may share one root (a network volume, see docs/DEPLOYMENT.md), so every
// change is made for readers in other processes too: a package appears whole, with one link()
// of a file already synced (never a name that is still being written), and a version is
// published once: the second writer of one name:version gets kAlreadyExists, whichever server
// it runs on. Removal is one rename out of sight, then the deletion.
//
// Ownership: the store holds only the root's path; it returns copies. Thread-safety: every
// method may be called from any thread, and from other processes at the same time. What a
// listing says may be out of date by the time the caller acts on it (another server may have
// changed the directory): Publish and MoveToTrash say so with kAlreadyExists and kNotFound.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "orochi/base/status.h"

namespace orochi::server::repository {

// What tells a package file from another that took its name (deleted, then deployed again):
// a different identity is a different package, to be loaded again.
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t size = 0;
  int64_t modified_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

class RepositoryStore {
 public:
  // An empty root: no repository (every listing empty).
  explicit RepositoryStore(std::string root);

  const std::string& root() const { return root_; }
  // Checks that the root is a directory, creates the upload directory and removes what a
  // server killed mid-way left: trash, and uploads that no live server holds (their receiver
  // keeps an flock(2) on each while it exists, see http::Limits::upload_directory; Linux's
  // NFS client takes such locks on the server, so they hold across machines).
  Status Open() const;
  // Where uploads are received: on the repository's filesystem, so that publishing one is a
  // link, not a copy.
  std::string upload_directory() const;

  std::string PackagePath(const std::string& name, int64_t version) const;
  // Model directories (names not starting with '.'), sorted. An error when the repository
  // cannot be read (out of descriptors, an NFS failure): never an empty list in its place,
  // which poll mode would apply by unloading every model.
  Result<std::vector<std::string>> Models() const;
  bool HasModel(const std::string& name) const;
  // The versions of `name` that hold a package, ascending; none when `name` has no directory.
  // An error, as for Models, when its directory cannot be read.
  Result<std::vector<int64_t>> Versions(const std::string& name) const;
  bool HasVersion(const std::string& name, int64_t version) const;
  std::optional<FileIdentity> Identify(const std::string& name, int64_t version) const;

  // Makes `file` (a complete package on the repository's filesystem, normally in
  // upload_directory()) the package of name:version: synced, linked under its final name
  // without replacing anything, the directory synced, the old name removed. kAlreadyExists,
  // naming the version, when it is there already (deployed meanwhile, maybe by another server).
  Status Publish(const std::string& name, int64_t version, const std::string& file) const;
  // Takes a version (or, without one, the whole model) out of the repository with one rename,
  // into a trash directory whose path it returns; RemoveTrash deletes it. kNotFound when it is
  // not there (deleted meanwhile, maybe by another server).
  Result<std::string> MoveToTrash(const std::string& name, std::optional<int64_t> version) const;
  static void RemoveTrash(const std::string& trash);

  // The models unloaded through the API, remembered across restarts (.orochi/state.json).
  std::set<std::string> ReadUnloaded() const;
  Status WriteUnloaded(const std::set<std::string>& names) const;

  // Model versions quarantined by a supervisor ("name:version" -> why), remembered across
  // supervisors (a container restart) in .orochi/quarantine.json with the identity of each
  // version's package. WriteQuarantine records the packages as they are now (a version with no
  // package is left out); ReadQuarantine returns the versions whose package is still the one
  // recorded: deploying another package lifts the quarantine. A file that cannot be read or
  // parsed quarantines nothing.
  std::map<std::string, std::string> ReadQuarantine() const;
  Status WriteQuarantine(const std::map<std::string, std::string>& quarantined) const;

 private:
  std::string root_;
};

// Writes `text` to `path` so that readers see the old or the new contents, never a mix: a
// temporary file of its own (writers in other processes may be at it too), fsync, rename,
// fsync of the directory.
Status WriteFileAtomically(const std::string& path, const std::string& text);

}  // namespace orochi::server::repository
