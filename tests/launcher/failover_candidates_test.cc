// Who an agent tries after its rendezvous host is lost, and in which order (launcher/rdzv/
// failover.h); the protocol itself is in docs/FAILOVER.md and tests/rdzv/failover_test.cc.
#include "launcher/rdzv/failover.h"

#include "gtest/gtest.h"

namespace dlrun::launcher {
namespace {

std::vector<std::string> Endpoints(const std::vector<Candidate>& c) {
  std::vector<std::string> out;
  for (const Candidate& x : c) out.push_back(x.endpoint + (x.is_me ? " (me)" : ""));
  return out;
}

TEST(EndpointList, ParsesEntriesWithTheDefaultPort) {
  auto l = ParseEndpointList("node1:29500, node2,10.0.0.3:7");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(*l, (std::vector<std::string>{"node1:29500", "node2:29400", "10.0.0.3:7"}));
}

TEST(EndpointList, ABadEntryIsNamed) {
  for (const char* bad : {"a:1,,b:2", "a:1,b:x", "a:1,b:70000", "a:1,:5"}) {
    auto l = ParseEndpointList(bad);
    ASSERT_FALSE(l.ok()) << bad;
    EXPECT_NE(std::string(l.status().message()).find("invalid value '" + std::string(bad) + "'"),
              std::string::npos);
  }
  auto dup = ParseEndpointList("a:1,b:2,a:1");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(std::string(dup.status().message()).find("'a:1' is listed twice"), std::string::npos);
}

TEST(FailoverOrder, ExplicitCandidatesFollowTheLostOneAndWrapRound) {
  FailoverView v;
  v.explicit_list = {"a:1", "b:1", "c:1", "d:1"};
  v.lost = "c:1";
  EXPECT_EQ(Endpoints(FailoverOrder(v)), (std::vector<std::string>{"d:1", "a:1", "b:1"}));
}

TEST(FailoverOrder, ImplicitCandidatesAreTheSuccessorsInOrderAtTheRendezvousPort) {
  FailoverView v;
  v.successors = {{"n1:11", "10.0.0.1"}, {"n2:12", "10.0.0.2"}, {"n3:13", "10.0.0.3"}};
  v.port = "29400";
  v.my_node_id = "n2:12";
  EXPECT_EQ(Endpoints(FailoverOrder(v)),
            (std::vector<std::string>{"10.0.0.1:29400", "10.0.0.2:29400 (me)", "10.0.0.3:29400"}));
}

TEST(FailoverOrder, MembersSharingAnAddressGiveOneEntryButMineIsKept) {
  // Three agents on one machine: the first successor hosts, the others join it; the last one
  // still hosts itself if the first never comes up.
  FailoverView v;
  v.successors = {{"h:1", "127.0.0.1"}, {"h:2", "127.0.0.1"}, {"h:3", "127.0.0.1"}};
  v.port = "5000";
  v.my_node_id = "h:3";
  EXPECT_EQ(Endpoints(FailoverOrder(v)),
            (std::vector<std::string>{"127.0.0.1:5000", "127.0.0.1:5000 (me)"}));
  v.my_node_id = "h:1";
  EXPECT_EQ(Endpoints(FailoverOrder(v)),
            (std::vector<std::string>{"127.0.0.1:5000 (me)", "127.0.0.1:5000"}));
}

TEST(Survivors, AllButTheHostWhenItWasAMember) {
  EXPECT_EQ(Survivors(3, 2), 2);  // an agent hosted: it is not among its successors
  EXPECT_EQ(Survivors(2, 1), 1);
  EXPECT_EQ(Survivors(3, 3), 3);  // a stand-alone server: every member survives it
  EXPECT_EQ(Survivors(100, rdzv::kMaxSuccessors), 99);
}

}  // namespace
}  // namespace dlrun::launcher
