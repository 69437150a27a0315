// The connections the gRPC accepting thread has handed to gRPC, counted by client address, so
// that one address cannot take every connection (and with them the process's descriptors) and
// the listener as a whole stays under its limit.
//
// gRPC (1.51) says nothing when it closes a connection it was handed, so an entry is only known
// to be gone when it is looked at again: its descriptor is closed, or the number now names
// another file (the same number reused). Entries are looked at when a count is at its limit,
// which keeps them bounded by the listener's limit and costs nothing below it. At a limit a
// scope (one client's entries, or all) is looked at no more than every kPruneInterval: a flood
// that keeps knocking would otherwise cost an fstat per entry per refused connection, slowing
// the accepting thread (and everyone else's connections behind it in the backlog) to a crawl.
//
// Thread-safety: none; the accepting thread alone uses it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace orochi::server::grpc_api {

class HandedOffConnections {
 public:
  enum class Admission { kAdmitted, kListenerFull, kClientFull };
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kPruneInterval{100};

  HandedOffConnections(size_t max_connections, size_t max_connections_per_client)
      : max_connections_(max_connections),
        max_connections_per_client_(max_connections_per_client) {}

  // Whether connection `fd` from `client` (an address, any stable encoding) may be handed to
  // gRPC; recorded when it may. Not admitted when fstat fails on it (reported as the listener
  // being full: it cannot be told apart later).
  Admission Admit(const std::string& client, int fd, Clock::time_point now = Clock::now());
  // Entries, some perhaps closed since.
  size_t open() const { return open_; }
  size_t max_connections() const { return max_connections_; }
  size_t max_connections_per_client() const { return max_connections_per_client_; }

 private:
  struct Handed {
    int fd;
    dev_t device;
    ino_t inode;
  };
  struct Client {
    std::vector<Handed> connections;
    Clock::time_point pruned;  // when `connections` were last looked at
  };
  // Drops the entries whose connection gRPC has closed.
  void Prune(std::vector<Handed>& connections);
  void PruneAll();

  size_t max_connections_;
  size_t max_connections_per_client_;
  std::map<std::string, Client> by_client_;
  size_t open_ = 0;
  Clock::time_point all_pruned_;
};

}  // namespace orochi::server::grpc_api
