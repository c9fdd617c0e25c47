// Our hostlist parser against Slurm's own (libslurm), and its errors.
#include "launcher/detect/hostlist.h"

#include <slurm/slurm.h>

#include <cstdlib>

#include "gtest/gtest.h"

namespace dlrun::launcher {
namespace {

std::vector<std::string> SlurmExpand(const std::string& list) {
  std::vector<std::string> out;
  hostlist_t hl = slurm_hostlist_create(list.c_str());
  if (hl == nullptr) return out;
  while (char* h = slurm_hostlist_shift(hl)) {
    out.emplace_back(h);
    std::free(h);
  }
  slurm_hostlist_destroy(hl);
  return out;
}

TEST(Hostlist, MatchesLibslurm) {
  for (const std::string list :
       {"tux[0-5,12,20-25]", "node[001-004,007],gpu-a[1-2]", "single", "a,b,c", "n[9-11]",
        "rack[1-2]-n[01-02]", "nid[00010-00012]"}) {
    auto ours = ExpandHostlist(list);
    ASSERT_TRUE(ours.ok()) << list << ": " << ours.status();
    EXPECT_EQ(*ours, SlurmExpand(list)) << list;
  }
}

TEST(Hostlist, KeepsZeroPaddingAndOrder) {
  auto h = ExpandHostlist("node[001-003,010]");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*h, (std::vector<std::string>{"node001", "node002", "node003", "node010"}));
}

TEST(Hostlist, BadInputIsAClearError) {
  for (const std::string bad : {"node[1-", "node]1[", "node[3-1]", "node[a-b]", "n[1-2],,m",
                                "", "n[]", "n[1-2][", "n [1]", "n[[1]]"}) {
    auto h = ExpandHostlist(bad);
    ASSERT_FALSE(h.ok()) << bad;
    EXPECT_NE(std::string(h.status().message()).find("invalid hostlist '" + bad + "'"),
              std::string::npos)
        << h.status();
  }
  EXPECT_FALSE(ExpandHostlist("n[0-99999999]", 1000).ok());  // bounded, no huge allocation
}

}  // namespace
}  // namespace dlrun::launcher
