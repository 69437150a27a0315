// Which process is at the other end of a TCP connection made from this machine: the management
// API's answer to model code. Model code runs as the server's own user and can read whatever
// the server can, the management token included, so neither loopback nor a token tells an
// operator's `curl` from a model's `urllib` that deletes every other model. What does is the
// peer's socket: the kernel knows its inode (sock_diag), and /proc knows which process holds it.
// A process that descends from the server (the serving process, everything its models start,
// and the daemons a supervisor adopted as subreaper) is model code.
//
// What it cannot see: a socket handed (SCM_RIGHTS) to a process outside the tree, which takes a
// process of the same user that is listening for it; and a process that model code got started
// outside the tree by others (a cron or systemd user job). docs/HARDENING.md says so.
//
// Thread-safety: a ProcessTreePeers is immutable; Refusal may be called from any thread. Each
// call lists this host's TCP sockets and reads /proc, a few milliseconds: meant for the rare
// management requests, not for inference.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace orochi::server {

// The processes under `root` (itself included), but those in `except`, that hold one of the
// sockets `inodes`: at most `most` of them. From /proc: a process that is gone meanwhile, or
// that this process may not read (another user's, a non-dumpable one), is passed over.
std::vector<pid_t> ProcessesHoldingSockets(pid_t root, const std::vector<unsigned long>& inodes,
                                           const std::vector<pid_t>& except,
                                           size_t most = static_cast<size_t>(-1));

// Whether process `pid` holds one of the sockets `inodes`: a read of each of its descriptors,
// so as costly as it has descriptors. False if it is gone or not this process's to read.
bool HoldsSocket(pid_t pid, const std::vector<unsigned long>& inodes);

// The processes under `root` (itself included), but those in `except`, youngest first (by their
// start time). From /proc, as above.
std::vector<pid_t> ProcessesUnder(pid_t root, const std::vector<pid_t>& except);

// The children of every thread of `pid`; none if it is gone. From the kernel's children files
// (a few small reads) where it has them, else from a scan of every process's parent.
std::vector<pid_t> ChildrenOf(pid_t pid);

// `root` and every process under it, each once, parents before their children. As ChildrenOf:
// the cost of a walk is that of the tree, not of every process on the machine.
std::vector<pid_t> Descendants(pid_t root);

class ProcessTreePeers {
 public:
  // `tree_root`: the supervisor's pid, or this process's own without a supervisor. Sockets are
  // looked up through sock_diag, and where netlink sockets are not allowed (systemd's
  // RestrictAddressFamilies) in /proc/net/tcp and tcp6; `sock_diag` false: there only (tests).
  explicit ProcessTreePeers(pid_t tree_root, bool sock_diag = true)
      : tree_root_(tree_root), sock_diag_(sock_diag) {}

  // Why a request over the connection from `peer_address`:`peer_port` to this server's
  // `server_port` is refused: its socket is held by a process of the tree (named in the
  // reason), or is on this host and held by no process any more (a client that sent its
  // request and closed, which no operator's tool does, but which would hide model code).
  // nullopt for a peer on another host, or held by a process outside the tree. `peer_address`
  // is as a transport prints it ("127.0.0.1", "::1", "::ffff:127.0.0.1"). If the host's
  // sockets cannot be listed (no sock_diag in this kernel), refused with the reason.
  std::optional<std::string> Refusal(const std::string& peer_address, uint16_t peer_port,
                                     uint16_t server_port) const;

 private:
  pid_t tree_root_;
  bool sock_diag_;
};

}  // namespace orochi::server
