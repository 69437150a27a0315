#include "listening_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "exit_guard.h"
#include "log.h"

namespace orochi::server {

Result<int> BindListener(const std::string& address, int port) {
  sockaddr_storage storage{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    length = sizeof(sockaddr_in6);
  } else {
    return InvalidArgument("'" + address + "' is not an IP address");
  }
  const int fd = ::socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable(std::string("cannot create a socket: ") + std::strerror(errno));
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0 ||
      ::listen(fd, SOMAXCONN) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Unavailable("cannot listen on " + address + ":" + std::to_string(port) + ": " + why);
  }
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return 0;
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  }
  return 0;
}

bool ListenerIntact(int fd) {
  int listening = 0;
  int shared = 0;
  socklen_t length = sizeof(int);
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0 || listening == 0) {
    return false;
  }
  length = sizeof(int);
  return ::getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &shared, &length) == 0 && shared == 0;
}

namespace {

struct OptionName {
  int level;
  int name;
  const char* label;
};

// SO_MAX_PACING_RATE is 47 and SO_BUSY_POLL 46 on every architecture Linux has; older headers
// lack the first.
constexpr int kMaxPacingRate = 47;

constexpr OptionName kInheritedOptions[] = {
    {SOL_SOCKET, SO_RCVLOWAT, "SO_RCVLOWAT"},
    {SOL_SOCKET, SO_RCVBUF, "SO_RCVBUF"},
    {SOL_SOCKET, SO_SNDBUF, "SO_SNDBUF"},
    {SOL_SOCKET, SO_PRIORITY, "SO_PRIORITY"},
    {SOL_SOCKET, SO_KEEPALIVE, "SO_KEEPALIVE"},
    {SOL_SOCKET, SO_LINGER, "SO_LINGER"},
    {SOL_SOCKET, SO_DONTROUTE, "SO_DONTROUTE"},
    {SOL_SOCKET, SO_OOBINLINE, "SO_OOBINLINE"},
    {SOL_SOCKET, SO_RCVTIMEO, "SO_RCVTIMEO"},
    {SOL_SOCKET, SO_SNDTIMEO, "SO_SNDTIMEO"},
    {SOL_SOCKET, SO_BUSY_POLL, "SO_BUSY_POLL"},
    {SOL_SOCKET, kMaxPacingRate, "SO_MAX_PACING_RATE"},
    {IPPROTO_IP, IP_TTL, "IP_TTL"},
    {IPPROTO_IP, IP_TOS, "IP_TOS"},
    {IPPROTO_IP, IP_OPTIONS, "IP_OPTIONS"},
    {IPPROTO_IP, IP_MTU_DISCOVER, "IP_MTU_DISCOVER"},
    {IPPROTO_IPV6, IPV6_UNICAST_HOPS, "IPV6_UNICAST_HOPS"},
    {IPPROTO_IPV6, IPV6_TCLASS, "IPV6_TCLASS"},
    {IPPROTO_IPV6, IPV6_MTU_DISCOVER, "IPV6_MTU_DISCOVER"},
    {IPPROTO_TCP, TCP_NODELAY, "TCP_NODELAY"},
    {IPPROTO_TCP, TCP_MAXSEG, "TCP_MAXSEG"},
    {IPPROTO_TCP, TCP_CORK, "TCP_CORK"},
    {IPPROTO_TCP, TCP_KEEPIDLE, "TCP_KEEPIDLE"},
    {IPPROTO_TCP, TCP_KEEPINTVL, "TCP_KEEPINTVL"},
    {IPPROTO_TCP, TCP_KEEPCNT, "TCP_KEEPCNT"},
    {IPPROTO_TCP, TCP_SYNCNT, "TCP_SYNCNT"},
    {IPPROTO_TCP, TCP_LINGER2, "TCP_LINGER2"},
    {IPPROTO_TCP, TCP_DEFER_ACCEPT, "TCP_DEFER_ACCEPT"},
    {IPPROTO_TCP, TCP_WINDOW_CLAMP, "TCP_WINDOW_CLAMP"},
    {IPPROTO_TCP, TCP_CONGESTION, "TCP_CONGESTION"},
    {IPPROTO_TCP, TCP_USER_TIMEOUT, "TCP_USER_TIMEOUT"},
    {IPPROTO_TCP, TCP_NOTSENT_LOWAT, "TCP_NOTSENT_LOWAT"},
    {IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, "TCP_THIN_LINEAR_TIMEOUTS"},
    {IPPROTO_TCP, TCP_FASTOPEN, "TCP_FASTOPEN"},
};

bool Same(const OptionName& option, const char* left, socklen_t left_length, const char* right,
          socklen_t right_length) {
  if (option.level == IPPROTO_TCP && option.name == TCP_CONGESTION) {  // a name, NUL-padded
    return std::strncmp(left, right, std::min(left_length, right_length)) == 0;
  }
  return left_length == right_length && std::memcmp(left, right, left_length) == 0;
}

}  // namespace

ListenerOptions ListenerOptions::Of(int fd) {
  ListenerOptions snapshot;
  for (const OptionName& option : kInheritedOptions) {
    Value value{option.level, option.name, option.label, {}, 0};
    value.length = static_cast<socklen_t>(value.bytes.size());
    if (::getsockopt(fd, option.level, option.name, value.bytes.data(), &value.length) == 0) {
      snapshot.values_.push_back(value);
    }
  }
  return snapshot;
}

ListenerOptions::Drift ListenerOptions::Restore(int fd) const {
  Drift drift;
  for (const Value& value : values_) {
    const OptionName option{value.level, value.name, value.label};
    std::array<char, 64> now{};
    auto length = static_cast<socklen_t>(now.size());
    if (::getsockopt(fd, value.level, value.name, now.data(), &length) != 0 ||
        Same(option, now.data(), length, value.bytes.data(), value.length)) {
      continue;
    }
    // A buffer size set once locks the kernel's autotuning off, for the connections the
    // listener accepts too, whatever size is put back: a smaller one needs a new listener. A
    // larger one is what SO_RCVLOWAT leaves (it grows the buffer to fit), and harmless.
    if (value.level == SOL_SOCKET && (value.name == SO_RCVBUF || value.name == SO_SNDBUF)) {
      int was = 0;
      int is = 0;
      std::memcpy(&was, value.bytes.data(), sizeof(was));
      std::memcpy(&is, now.data(), sizeof(is));
      if (is < was) {
        drift.changed.emplace_back(value.label);
        drift.restored = false;
      }
      continue;
    }
    drift.changed.emplace_back(value.label);
    // What setsockopt takes to get back to what getsockopt read, where the two differ: the
    // kernel's own choice of MSS (0) and TTL (-1), never set by anyone.
    const bool by_default = (value.level == IPPROTO_TCP && value.name == TCP_MAXSEG) ||
                            (value.level == IPPROTO_IP && value.name == IP_TTL) ||
                            (value.level == IPPROTO_IPV6 && value.name == IPV6_UNICAST_HOPS);
    const int kernel_default = value.level == IPPROTO_TCP ? 0 : -1;
    socklen_t set_length = value.length;
    if (value.level == IPPROTO_TCP && value.name == TCP_CONGESTION) {
      set_length = static_cast<socklen_t>(::strnlen(value.bytes.data(), value.length));
    }
    const bool set =
        by_default ? ::setsockopt(fd, value.level, value.name, &kernel_default,
                                  sizeof(kernel_default)) == 0
                   : ::setsockopt(fd, value.level, value.name, value.bytes.data(), set_length) == 0;
    length = static_cast<socklen_t>(now.size());
    const bool back = set && ::getsockopt(fd, value.level, value.name, now.data(), &length) == 0 &&
                      Same(option, now.data(), length, value.bytes.data(), value.length);
    if (!back) drift.restored = false;
  }
  return drift;
}

bool TendListener(int fd) {
  if (!ListenerIntact(fd) || ::listen(fd, SOMAXCONN) != 0) return false;
  // The flag lives on the open file description, which model code shares: cleared, accepts
  // block the thread that makes them (an I/O thread of every HTTP port) until a client comes.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK) == 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  return true;
}

namespace {

// The ports this process listens on (0: a free entry), and the highest descriptor a listener or
// connection has had, for CloseServerSocketsInChild. Plain atomics: the fork handler may take
// no lock.
constexpr size_t kMaxListeners = 64;
std::array<std::atomic<int>, kMaxListeners> listening_ports{};
std::atomic<int> highest_socket{-1};

// The fork handler (see RegisterListeningPort). Only getsockname, getsockopt and close, which
// are async-signal-safe, as the child of a threaded process requires.
void CloseServerSocketsInChild() {
  const int highest = highest_socket.load(std::memory_order_relaxed);
  for (int fd = 0; fd <= highest; ++fd) {
    const int port = BoundPort(fd);  // async-signal-safe: getsockname only
    int type = 0;
    socklen_t type_length = sizeof(type);
    if (port == 0 || ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_length) != 0 ||
        type != SOCK_STREAM) {
      continue;
    }
    for (const std::atomic<int>& listening : listening_ports) {
      if (listening.load(std::memory_order_relaxed) == port) {
        ::close(fd);
        break;
      }
    }
  }
}

}  // namespace

void NoteServerSocket(int fd) {
  int seen = highest_socket.load(std::memory_order_relaxed);
  while (fd > seen && !highest_socket.compare_exchange_weak(seen, fd)) {
  }
}

void RegisterListeningPort(int fd, int port) {
  static std::once_flag registered;
  std::call_once(registered, [] { ::pthread_atfork(nullptr, nullptr, CloseServerSocketsInChild); });
  NoteServerSocket(fd);
  for (std::atomic<int>& entry : listening_ports) {
    int free = 0;
    if (entry.compare_exchange_strong(free, port)) return;
  }
}

void UnregisterListeningPort(int port) {
  for (std::atomic<int>& entry : listening_ports) {
    int expected = port;
    if (entry.compare_exchange_strong(expected, 0)) return;
  }
}

namespace {

std::mutex listener_lost_mutex;
std::function<void()> listener_lost_handler;
bool listener_lost_reported = false;

}  // namespace

void SetListenerLostHandler(std::function<void()> handler) {
  std::lock_guard lock(listener_lost_mutex);
  listener_lost_handler = std::move(handler);
}

void ReportListenerLost(int port) {
  std::function<void()> handler;
  {
    std::lock_guard lock(listener_lost_mutex);
    Log(LogLevel::kError,
        "a listening socket was shut down or shared (SO_REUSEPORT) by model code; the serving "
        "process exits so that the supervisor binds the port again",
        {{"port", std::to_string(port), false}});
    if (listener_lost_reported) return;
    listener_lost_reported = true;
    handler = listener_lost_handler;
  }
  if (!handler) ExitServingProcess(kListenerLostExitStatus);
  handler();
}

}  // namespace orochi::server
