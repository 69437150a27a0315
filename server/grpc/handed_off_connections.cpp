#include "handed_off_connections.h"

#include <sys/stat.h>

#include <algorithm>

namespace orochi::server::grpc_api {
namespace {

bool StillOpen(int fd, dev_t device, ino_t inode) {
  struct stat now {};
  return ::fstat(fd, &now) == 0 && now.st_dev == device && now.st_ino == inode;
}

}  // namespace

HandedOffConnections::Admission HandedOffConnections::Admit(const std::string& client, int fd,
                                                            Clock::time_point now) {
  struct stat identity {};
  if (::fstat(fd, &identity) != 0) return Admission::kListenerFull;
  auto found = by_client_.find(client);
  if (found != by_client_.end() &&
      found->second.connections.size() >= max_connections_per_client_) {
    if (now - found->second.pruned < kPruneInterval) return Admission::kClientFull;
    found->second.pruned = now;
    Prune(found->second.connections);
    if (found->second.connections.size() >= max_connections_per_client_) {
      return Admission::kClientFull;
    }
  }
  if (open_ >= max_connections_) {
    if (now - all_pruned_ < kPruneInterval) return Admission::kListenerFull;
    all_pruned_ = now;
    PruneAll();
    if (open_ >= max_connections_) return Admission::kListenerFull;
  }
  by_client_[client].connections.push_back({fd, identity.st_dev, identity.st_ino});
  ++open_;
  return Admission::kAdmitted;
}

void HandedOffConnections::Prune(std::vector<Handed>& connections) {
  const size_t before = connections.size();
  std::erase_if(connections, [](const Handed& handed) {
    return !StillOpen(handed.fd, handed.device, handed.inode);
  });
  open_ -= before - connections.size();
}

void HandedOffConnections::PruneAll() {
  for (auto client = by_client_.begin(); client != by_client_.end();) {
    Prune(client->second.connections);
    client = client->second.connections.empty() ? by_client_.erase(client) : std::next(client);
  }
}

}  // namespace orochi::server::grpc_api
