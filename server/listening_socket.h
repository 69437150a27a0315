// The listening sockets of `orochi serve`: bound once by the supervisor and inherited by each
// serving process it starts, so that a restart never closes a port.
//
// One socket, two processes: model code in the serving process can shut down an inherited
// listener (shutdown(2) on the descriptor, or on a dup of it), which ends its listening state
// for the supervisor too, so that no accept on it succeeds again; or set SO_REUSEPORT on it
// (ListenerIntact). The serving process then drains and
// exits (ReportListenerLost) instead of serving nothing on that port for good, and the
// supervisor binds the port again before the next start (Supervisor::HealListeners).
#pragma once

#include <sys/socket.h>

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "orochi/base/status.h"

namespace orochi::server {

// A TCP socket listening on address:port (port 0: one the kernel picks), close-on-exec.
Result<int> BindListener(const std::string& address, int port);

// The port `fd` is bound to, or 0.
int BoundPort(int fd);

// Whether `fd` is still a listening socket that shares its port with no other: model code can
// also set SO_REUSEPORT on an inherited listener, after which a socket of its own (a daemon's)
// bound to the port with it takes part of the connections, through every restart.
bool ListenerIntact(int fd);

// The options of a listening socket that the connections it accepts inherit, and that model code
// can change on the socket it shares with the supervisor: SO_RCVLOWAT (no request is ever read),
// TCP_MAXSEG and a pacing rate (answers stall), a TTL of 1 (unreachable past a router), and more,
// all while every port still answers a probe, and through every restart. The supervisor takes
// a snapshot after binding and puts back what drifted every second (Restore). Only options this
// kernel lets getsockopt read are kept, and none that changes by itself (SO_INCOMING_CPU,
// TCP_QUICKACK).
class ListenerOptions {
 public:
  ListenerOptions() = default;
  static ListenerOptions Of(int fd);

  struct Drift {
    std::vector<std::string> changed;  // the options that differed, by name
    // False when one could not be put back: a buffer size (which turns the kernel's autotuning
    // off for good), a window clamp (which a listener cannot clear). The listener must then be
    // bound again.
    bool restored = true;
  };
  // Puts back each option of `fd` that differs from the snapshot.
  Drift Restore(int fd) const;

 private:
  struct Value {
    int level = 0;
    int name = 0;
    const char* label = "";
    std::array<char, 64> bytes{};
    socklen_t length = 0;
  };
  std::vector<Value> values_;
};

// How often the accept loops tend their listener (TendListener).
inline constexpr int kListenerUpkeepMs = 1000;

// ListenerIntact, and if so gives `fd` its full backlog and O_NONBLOCK again: model code can
// shrink the backlog with listen(fd, 0), which the listener would keep through every restart (a
// connection at a time taken, the rest of a burst dropped), and clear O_NONBLOCK on the file
// description it shares, after which an accept blocks its thread. The accept loops call it
// every kListenerUpkeepMs, so that a listener nobody connects to is checked too, and when an
// accept fails.
bool TendListener(int fd);

// Registers a listener on `port` (and `fd`, for NoteServerSocket) for the fork handler that
// closes, in the child of any fork() of the server (a model calling os.fork(), say), every TCP
// socket whose local port is one the server listens on: its listeners and the connections they
// accepted. Left open there, a listening port stays taken after the server dies (a restart
// fails with "Address already in use"), a daemon could accept on it, and a client's connection
// is not closed when the server closes it. Thread-safe.
void RegisterListeningPort(int fd, int port);
void UnregisterListeningPort(int port);
// Notes a socket's descriptor (a connection accepted), so that the fork handler looks that far.
void NoteServerSocket(int fd);

// For an accept loop whose listener TendListener denies, which then stops accepting on it: logs
// that the listener on
// `port` stopped listening and calls the handler (the first report only). Thread-safe.
void ReportListenerLost(int port);

// What ReportListenerLost calls: the Server's, which drains and exits with
// kListenerLostExitStatus so that its supervisor restarts it on a listener bound again. Without
// one, the process exits at once with that status.
void SetListenerLostHandler(std::function<void()> handler);
inline constexpr int kListenerLostExitStatus = 75;  // EX_TEMPFAIL

}  // namespace orochi::server
