// Which process a connection comes from: real sockets on loopback, real /proc.
#include "peer_process.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace orochi::server {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// A listener on 127.0.0.1 and one client connected to it, both of this process.
class LoopbackConnection : public ::testing::Test {
 protected:
  void SetUp() override {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    ASSERT_EQ(::listen(listener_, 4), 0);
    socklen_t length = sizeof(address);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    server_port_ = ntohs(address.sin_port);
    client_ = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(::connect(client_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    length = sizeof(address);
    ::getsockname(client_, reinterpret_cast<sockaddr*>(&address), &length);
    client_port_ = ntohs(address.sin_port);
    accepted_ = ::accept(listener_, nullptr, nullptr);
    ASSERT_GE(accepted_, 0);
  }
  void TearDown() override {
    for (int fd : {accepted_, client_, listener_}) {
      if (fd >= 0) ::close(fd);
    }
  }

  // As gRPC's clients connect: an AF_INET6 socket to ::ffff:127.0.0.1, which the server sees
  // as the IPv4 peer 127.0.0.1. Its client end and the accepted end; its port in `port`.
  std::pair<int, int> ConnectThroughIpv6(uint16_t* port) const {
    const int client6 = ::socket(AF_INET6, SOCK_STREAM, 0);
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_port = htons(server_port_);
    ::inet_pton(AF_INET6, "::ffff:127.0.0.1", &address.sin6_addr);
    EXPECT_EQ(::connect(client6, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    socklen_t length = sizeof(address);
    ::getsockname(client6, reinterpret_cast<sockaddr*>(&address), &length);
    *port = ntohs(address.sin6_port);
    return {client6, ::accept(listener_, nullptr, nullptr)};
  }

  // A child that sleeps until killed, holding this process's descriptors but the client
  // socket when `close_client`; returned once it is so (-1 if it cannot be started).
  pid_t ForkSleeper(bool close_client) const {
    int ready[2];
    if (::pipe(ready) != 0) return -1;
    const pid_t child = ::fork();
    if (child == 0) {
      if (close_client) ::close(client_);
      ::close(ready[0]);
      ::write(ready[1], "x", 1);
      ::pause();
      ::_exit(0);
    }
    ::close(ready[1]);
    char byte = 0;
    const bool started = child > 0 && ::read(ready[0], &byte, 1) == 1;
    ::close(ready[0]);
    return started ? child : -1;
  }

  int listener_ = -1;
  int client_ = -1;
  int accepted_ = -1;
  uint16_t server_port_ = 0;
  uint16_t client_port_ = 0;
};

TEST_F(LoopbackConnection, AClientOfTheTreeIsRefusedAndNamed) {
  const ProcessTreePeers peers(::getpid());
  const std::optional<std::string> refused = peers.Refusal("127.0.0.1", client_port_, server_port_);
  ASSERT_TRUE(refused.has_value());
  EXPECT_THAT(*refused, HasSubstr("process " + std::to_string(::getpid())));
  EXPECT_THAT(*refused, HasSubstr("model code may not manage models"));
  // As a dual-stack listener reports an IPv4 peer.
  EXPECT_TRUE(peers.Refusal("::ffff:127.0.0.1", client_port_, server_port_).has_value());
}

TEST_F(LoopbackConnection, AClientHeldByAChildOfTheTreeIsRefused) {
  // The child holds the client socket; the tree's root lets go of its own copy.
  const pid_t child = ForkSleeper(/*close_client=*/false);
  ASSERT_GT(child, 0);
  ::close(client_);
  client_ = -1;
  const std::optional<std::string> refused =
      ProcessTreePeers(::getpid()).Refusal("127.0.0.1", client_port_, server_port_);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_TRUE(refused.has_value());
  EXPECT_THAT(*refused, HasSubstr("process " + std::to_string(child)));
}

TEST_F(LoopbackConnection, AnIpv6SocketConnectedToTheIpv4ListenerIsFoundToo) {
  // Once it passed for a client on another host.
  uint16_t port6 = 0;
  const auto [client6, accepted] = ConnectThroughIpv6(&port6);
  const std::optional<std::string> refused =
      ProcessTreePeers(::getpid()).Refusal("127.0.0.1", port6, server_port_);
  ::close(accepted);
  ::close(client6);
  ASSERT_TRUE(refused.has_value());
  EXPECT_THAT(*refused, HasSubstr("process " + std::to_string(::getpid())));
}

TEST_F(LoopbackConnection, TheProcNetTablesFindTheSameClients) {
  // Where netlink sockets are refused (the packaged systemd unit), /proc/net/tcp and tcp6.
  const ProcessTreePeers peers(::getpid(), /*sock_diag=*/false);
  const std::optional<std::string> refused = peers.Refusal("127.0.0.1", client_port_, server_port_);
  ASSERT_TRUE(refused.has_value());
  EXPECT_THAT(*refused, HasSubstr("process " + std::to_string(::getpid())));
  EXPECT_FALSE(peers.Refusal("192.0.2.7", client_port_, server_port_).has_value());
  uint16_t port6 = 0;
  const auto [client6, accepted] = ConnectThroughIpv6(&port6);
  const bool mapped_refused = peers.Refusal("127.0.0.1", port6, server_port_).has_value();
  ::close(accepted);
  ::close(client6);
  EXPECT_TRUE(mapped_refused);
}

TEST_F(LoopbackConnection, AClientOutsideTheTreeIsLetOn) {
  // A tree of one sleeping child, which holds no socket of this connection: this process is
  // outside it, as an operator's curl is outside the server's.
  const pid_t child = ForkSleeper(/*close_client=*/true);
  ASSERT_GT(child, 0);
  const std::optional<std::string> refused =
      ProcessTreePeers(child).Refusal("127.0.0.1", client_port_, server_port_);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_FALSE(refused.has_value()) << *refused;
}

TEST_F(LoopbackConnection, APeerOnAnotherHostIsLetOn) {
  // No socket of this host has that address and port: the peer is elsewhere.
  EXPECT_FALSE(
      ProcessTreePeers(::getpid()).Refusal("192.0.2.7", client_port_, server_port_).has_value());
}

TEST_F(LoopbackConnection, AClientThatClosedCannotBeToldApartAndIsRefused) {
  // Sent its request and closed: its end lingers (FIN_WAIT) with no process holding it.
  ::close(client_);
  client_ = -1;
  const std::optional<std::string> refused =
      ProcessTreePeers(::getpid()).Refusal("127.0.0.1", client_port_, server_port_);
  ASSERT_TRUE(refused.has_value());
  EXPECT_THAT(*refused, HasSubstr("held by no process"));
}

TEST(ProcessTreePeersTest, AnAddressThatIsNoneIsRefused) {
  const std::optional<std::string> refused =
      ProcessTreePeers(::getpid()).Refusal("not-an-address", 1, 2);
  ASSERT_TRUE(refused.has_value());
  EXPECT_THAT(*refused, HasSubstr("not-an-address"));
}

// A child and, 20 ms later, a grandchild of this process, both paused until the test kills them.
class ProcessChain : public ::testing::Test {
 protected:
  void SetUp() override {
    int started[2];
    ASSERT_EQ(::pipe(started), 0);
    child_ = ::fork();
    ASSERT_GE(child_, 0);
    if (child_ == 0) {
      ::usleep(20000);  // a later start time (clock ticks) than the child's
      const pid_t grandchild = ::fork();
      if (grandchild == 0) {
        ::pause();
        ::_exit(0);
      }
      [[maybe_unused]] ssize_t written = ::write(started[1], &grandchild, sizeof(grandchild));
      ::pause();
      ::_exit(0);
    }
    ::close(started[1]);
    ASSERT_EQ(::read(started[0], &grandchild_, sizeof(grandchild_)),
              static_cast<ssize_t>(sizeof(grandchild_)));
    ::close(started[0]);
  }
  void TearDown() override {
    if (grandchild_ > 0) ::kill(grandchild_, SIGKILL);
    if (child_ > 0) {
      ::kill(child_, SIGKILL);
      ::waitpid(child_, nullptr, 0);
    }
  }

  pid_t child_ = -1;
  pid_t grandchild_ = -1;
};

TEST_F(ProcessChain, DescendantsComeParentsFirstAndChildrenOfOneLevel) {
  const std::vector<pid_t> tree = Descendants(::getpid());
  ASSERT_GE(tree.size(), 3U);
  EXPECT_EQ(tree.front(), ::getpid());
  const auto child_at = std::find(tree.begin(), tree.end(), child_);
  const auto grandchild_at = std::find(tree.begin(), tree.end(), grandchild_);
  ASSERT_NE(child_at, tree.end());
  ASSERT_NE(grandchild_at, tree.end());
  EXPECT_LT(child_at, grandchild_at);

  EXPECT_THAT(ChildrenOf(::getpid()), Contains(child_));
  EXPECT_THAT(ChildrenOf(::getpid()), Not(Contains(grandchild_)));
  EXPECT_THAT(ChildrenOf(child_), ElementsAre(grandchild_));
  EXPECT_THAT(Descendants(grandchild_), ElementsAre(grandchild_));
}

TEST_F(ProcessChain, ProcessesUnderComeYoungestFirst) {
  const std::vector<pid_t> under = ProcessesUnder(::getpid(), {::getpid()});
  const auto child_at = std::find(under.begin(), under.end(), child_);
  const auto grandchild_at = std::find(under.begin(), under.end(), grandchild_);
  ASSERT_NE(child_at, under.end());
  ASSERT_NE(grandchild_at, under.end());
  EXPECT_LT(grandchild_at, child_at);
  EXPECT_THAT(under, Not(Contains(::getpid())));
}

TEST(ProcessTreeTest, AProcessThatIsGoneHasNoChildren) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  EXPECT_THAT(ChildrenOf(child), IsEmpty());
  EXPECT_THAT(Descendants(child), ElementsAre(child));  // the root is listed as given
}

}  // namespace
}  // namespace orochi::server
