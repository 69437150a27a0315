// The gRPC accepting thread's count of the connections it handed to gRPC: the limits per client
// address and per listener, and entries dropped once their descriptor is closed or reused (looked
// at no more often than every prune interval).
#include "grpc/handed_off_connections.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

namespace orochi::server::grpc_api {
namespace {

using Admission = HandedOffConnections::Admission;

// Connected sockets standing in for accepted connections; closed with the fixture.
class HandedOffConnectionsTest : public ::testing::Test {
 protected:
  ~HandedOffConnectionsTest() override {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  int NewSocket() {
    int pair[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
    fds_.push_back(pair[0]);
    fds_.push_back(pair[1]);
    return pair[0];
  }
  // Closes `fd` as gRPC would, without telling the table.
  void Close(int fd) {
    for (int& held : fds_) {
      if (held == fd) held = -1;
    }
    ::close(fd);
  }

 private:
  std::vector<int> fds_;
};

TEST_F(HandedOffConnectionsTest, OneClientIsRefusedPastItsLimitAndOthersAreNot) {
  HandedOffConnections table(10, 2);
  EXPECT_EQ(table.Admit("10.0.0.1", NewSocket()), Admission::kAdmitted);
  EXPECT_EQ(table.Admit("10.0.0.1", NewSocket()), Admission::kAdmitted);
  EXPECT_EQ(table.Admit("10.0.0.1", NewSocket()), Admission::kClientFull);
  EXPECT_EQ(table.Admit("10.0.0.2", NewSocket()), Admission::kAdmitted);
  EXPECT_EQ(table.open(), 3U);
}

TEST_F(HandedOffConnectionsTest, TheListenerIsRefusedPastItsLimit) {
  HandedOffConnections table(3, 2);
  EXPECT_EQ(table.Admit("10.0.0.1", NewSocket()), Admission::kAdmitted);
  EXPECT_EQ(table.Admit("10.0.0.2", NewSocket()), Admission::kAdmitted);
  EXPECT_EQ(table.Admit("10.0.0.3", NewSocket()), Admission::kAdmitted);
  EXPECT_EQ(table.Admit("10.0.0.4", NewSocket()), Admission::kListenerFull);
}

TEST_F(HandedOffConnectionsTest, AClosedConnectionMakesRoomAtTheLimit) {
  HandedOffConnections table(2, 2);
  const int first = NewSocket();
  EXPECT_EQ(table.Admit("10.0.0.1", first), Admission::kAdmitted);
  EXPECT_EQ(table.Admit("10.0.0.1", NewSocket()), Admission::kAdmitted);
  Close(first);
  EXPECT_EQ(table.Admit("10.0.0.1", NewSocket()), Admission::kAdmitted);
  EXPECT_EQ(table.open(), 2U);
  EXPECT_EQ(table.Admit("10.0.0.2", NewSocket()), Admission::kListenerFull);
}

TEST_F(HandedOffConnectionsTest, ADescriptorNumberReusedForAnotherSocketIsNotTheOldConnection) {
  HandedOffConnections table(10, 1);
  const int first = NewSocket();
  EXPECT_EQ(table.Admit("10.0.0.1", first), Admission::kAdmitted);
  Close(first);
  // The lowest free number: the closed connection's, now another socket.
  const int reused = NewSocket();
  ASSERT_EQ(reused, first);
  EXPECT_EQ(table.Admit("10.0.0.1", reused), Admission::kAdmitted);
  EXPECT_EQ(table.open(), 1U);
  EXPECT_EQ(table.Admit("10.0.0.1", NewSocket()), Admission::kClientFull);
}

TEST_F(HandedOffConnectionsTest, AtTheLimitEntriesAreLookedAtOnlyEveryPruneInterval) {
  HandedOffConnections table(10, 1);
  const HandedOffConnections::Clock::time_point start = HandedOffConnections::Clock::now();
  const int first = NewSocket();
  EXPECT_EQ(table.Admit("10.0.0.1", first, start), Admission::kAdmitted);
  EXPECT_EQ(table.Admit("10.0.0.1", NewSocket(), start), Admission::kClientFull);
  Close(first);
  const int next = NewSocket();
  // Looked at just now: refused without looking again, though the first one is gone.
  EXPECT_EQ(table.Admit("10.0.0.1", next, start + HandedOffConnections::kPruneInterval / 2),
            Admission::kClientFull);
  EXPECT_EQ(table.Admit("10.0.0.1", next, start + HandedOffConnections::kPruneInterval),
            Admission::kAdmitted);
}

TEST_F(HandedOffConnectionsTest, ADescriptorThatIsNotOpenIsNotAdmitted) {
  HandedOffConnections table(10, 10);
  const int fd = NewSocket();
  Close(fd);
  EXPECT_EQ(table.Admit("10.0.0.1", fd), Admission::kListenerFull);
  EXPECT_EQ(table.open(), 0U);
}

}  // namespace
}  // namespace orochi::server::grpc_api
