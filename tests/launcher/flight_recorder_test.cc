// The Flight Recorder's dumps (launcher/stacks/flight_recorder.h): the pickle reader on a dump
// torch 2.15 wrote and on Python's own pickles, bad bytes refused with the opcode and offset, and
// where the ranks' histories first part.
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "launcher/stacks/flight_recorder.h"

namespace dlrun::launcher::testing {
namespace {

std::string Unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// torch 2.15's _dump_fr_trace_file of a 2-rank Gloo job, rank 0 (five collectives, the fifth
// timed out): what NCCL's dump on a timeout looks like too.
const char kTorchDump[] =
    "80027d28580700000076657273696f6e71005804000000322e31307101580900000070675f636f6e66696771027d2858"
    "0000000071037d2858040000006e616d657104680358040000006465736371056803580500000072616e6b7371065806"
    "0000005b302c20315d710775755810000000636f6d6d5f6c69625f76657273696f6e71086803580900000070675f7374"
    "6174757371097d28580100000030710a7d2858180000006c6173745f656e7175657565645f636f6c6c65637469766571"
    "0b4b0558170000006c6173745f737461727465645f636f6c6c656374697665710c4affffffff58190000006c6173745f"
    "636f6d706c657465645f636f6c6c656374697665710d4b0575755807000000656e7472696573710e5d287d2858090000"
    "007265636f72645f6964710f4b00580500000070675f696471104b00580d00000070726f636573735f67726f75707111"
    "680a580a00000064656661756c745f7067711286580b0000007468726561645f6e616d6571135807000000707974686f"
    "6e33711458090000007468726561645f69647115580f0000003133393936383635373638333133367116581100000063"
    "6f6c6c6563746976655f7365715f696471174b01580a0000007032705f7365715f696471184b0058050000006f705f69"
    "6471194b01580e00000070726f66696c696e675f6e616d65711a580f000000676c6f6f3a616c6c5f726564756365711b"
    "580f00000074696d655f637265617465645f6e73711c8a08c81a38cade09eb18580b000000696e7075745f73697a6573"
    "711d5d285d284b046565580c000000696e7075745f647479706573711e5d285805000000466c6f6174711f65580c0000"
    "006f75747075745f73697a657371205d285d284b046565580d0000006f75747075745f64747970657371215d28681f65"
    "58050000007374617465712258090000007363686564756c65647123581a00000074696d655f646973636f7665726564"
    "5f737461727465645f6e7371244e581c00000074696d655f646973636f76657265645f636f6d706c657465645f6e7371"
    "254e580700000072657469726564712688580a00000074696d656f75745f6d7371274db80b580600000069735f703270"
    "712889757d28680f4b0168104b006811680a681286681368146815681668174b0268184b0068194b02681a681b681c8a"
    "084ecf40cade09eb18681d5d285d284b046565681e5d28681f6568205d285d284b04656568215d28681f656822682368"
    "244e68254e68268868274db80b682889757d28680f4b0268104b006811680a681286681368146815681668174b036818"
    "4b0068194b03681a580e000000676c6f6f3a62726f6164636173747129681c8a08678b45cade09eb18681d5d285d284b"
    "046565681e5d28681f6568205d285d284b04656568215d28681f656822682368244e68254e68268868274db80b682889"
    "757d28680f4b0368104b006811680a681286681368146815681668174b0468184b0068194b04681a681b681c8a08ec44"
    "49cade09eb18681d5d285d284b046565681e5d28681f6568205d285d284b04656568215d28681f656822682368244e68"
    "254e68268868274db80b682889757d28680f4b0468104b006811680a681286681368146815681668174b0568184b0068"
    "194b05681a681b681c8a08bfec4bcade09eb18681d5d285d284b046565681e5d28681f6568205d285d284b0465656821"
    "5d28681f656822682368244e68254e68268868274db80b682889756575712a2e";

// pickle.dumps(..., protocol=2) of {"a": l, "b": l, "neg": -300000000000, "f": 1.5,
// "t": (1, "x"), "n": None, "y": True, 7: "seven"} with l = [1, 2]: the list is memoized empty
// and filled afterwards, and "b" refers back to it.
const char kPythonPickle[] =
    "80027d71002858010000006171015d7102284b014b02655801000000627103680258030000006e656771048a05"
    "00489b26ba5801000000667105473ff800000000000058010000007471064b01580100000078710786710858010000"
    "006e71094e580100000079710a884b075805000000736576656e710b752e";

TEST(FlightRecorder, TorchsDumpIsReadWithEveryEntry) {
  const std::string dir = ::testing::TempDir() + "/fr_read";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/rank_0", std::ios::binary) << Unhex(kTorchDump);
  std::ofstream(dir + "/rank_x", std::ios::binary) << "not a rank";
  std::ofstream(dir + "/rank_1", std::ios::binary) << Unhex(kTorchDump).substr(0, 300);
  std::vector<std::string> errors;
  const std::vector<FrRank> ranks = ReadFlightRecorderDir(PosixFileSystem(), dir, "rank_", &errors);
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0].rank, 0);
  ASSERT_EQ(ranks[0].entries.size(), 5u);
  EXPECT_EQ(ranks[0].entries[0].op, "gloo:all_reduce");
  EXPECT_EQ(ranks[0].entries[2].op, "gloo:broadcast");
  EXPECT_EQ(ranks[0].entries[4].seq, 5);
  EXPECT_EQ(ranks[0].entries[4].group, "0");
  EXPECT_EQ(ranks[0].entries[4].group_desc, "default_pg");
  EXPECT_EQ(ranks[0].entries[4].state, "scheduled");
  // The truncated one is named, with why.
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("rank_1"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("truncated"), std::string::npos) << errors[0];
}

TEST(FlightRecorder, PythonsPicklesWithMemoizedContainersAndTorchsListBuilders) {
  auto v = ReadPickle(Unhex(kPythonPickle));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)["a"], nlohmann::json({1, 2}));
  EXPECT_EQ((*v)["b"], nlohmann::json({1, 2}));
  EXPECT_EQ((*v)["neg"], -300000000000);
  EXPECT_EQ((*v)["f"], 1.5);
  EXPECT_EQ((*v)["t"], nlohmann::json({1, "x"}));
  EXPECT_TRUE((*v)["n"].is_null());
  EXPECT_EQ((*v)["y"], true);
  EXPECT_EQ((*v)["7"], "seven");
  auto list = ReadPickle(Unhex("8002") + "ctorch.jit._pickle\nbuild_intlist\n" +
                         Unhex("5d7100284b014b026585522e"));
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(*list, nlohmann::json({1, 2}));
}

TEST(FlightRecorder, BadPicklesAreRefusedNamingTheOpcode) {
  // A call of anything but torch's list builders is refused, not run.
  auto evil = ReadPickle(Unhex("8002") + "cos\nsystem\n" + Unhex("5802000000") + "id" +
                         Unhex("85522e"));
  ASSERT_FALSE(evil.ok());
  EXPECT_NE(evil.status().message().find("os.system"), std::string::npos) << evil.status();
  auto unknown = ReadPickle(Unhex("8002ff2e"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("opcode 0xff at byte 2"), std::string::npos)
      << unknown.status();
  EXPECT_FALSE(ReadPickle(Unhex("8002752e")).ok());        // SETITEMS without a MARK
  EXPECT_FALSE(ReadPickle(Unhex("800258ffffff7f")).ok());  // a string past the end
  EXPECT_FALSE(ReadPickle("").ok());
  // A memoized list appended to itself over and over stops at the bound, not out of memory.
  std::string bomb = Unhex("80025d7100284b014b024b034b0465");
  for (int i = 0; i < 40; ++i) bomb += Unhex("28680068006800680065");
  bomb += ".";
  auto b = ReadPickle(bomb);
  EXPECT_FALSE(b.ok());
}

FrRank Rank(int rank, const std::vector<std::pair<int64_t, std::string>>& seqs,
            const std::string& state = "scheduled") {
  FrRank r;
  r.rank = rank;
  for (const auto& [seq, op] : seqs) r.entries.push_back({"0", "default_pg", seq, op, state, false});
  return r;
}

TEST(FlightRecorder, TheFirstCollectiveSomeRanksNeverEnteredIsNamed) {
  const std::vector<std::pair<int64_t, std::string>> upto29 = {{28, "gloo:all_reduce"},
                                                               {29, "gloo:all_reduce"}};
  auto upto30 = upto29;
  upto30.push_back({30, "gloo:all_reduce"});
  const auto v = FirstDisagreement(
      {Rank(0, upto30), Rank(1, upto30), Rank(2, upto29), Rank(3, upto30)}, {0, 1, 2, 3, 4});
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->agree);
  EXPECT_EQ(v->seq, 30);
  EXPECT_EQ(v->op, "gloo:all_reduce");
  EXPECT_EQ(v->never_entered, std::vector<int>({2}));
  EXPECT_EQ(v->entered, std::vector<int>({0, 1, 3}));
  EXPECT_EQ(v->no_dump, std::vector<int>({4}));
  EXPECT_EQ(v->text, "rank 2 never entered gloo:all_reduce #30 of group 0 (default_pg); ranks "
                     "0-1,3 did; no dump from rank(s) 4");
  EXPECT_EQ(FrVerdictJson(*v)["never_entered"], nlohmann::json({2}));
}

TEST(FlightRecorder, AgreeingHistoriesSayWhereTheyDidNotComplete) {
  const std::vector<std::pair<int64_t, std::string>> h = {{1, "nccl:all_reduce"},
                                                          {2, "nccl:broadcast"}};
  auto v = FirstDisagreement({Rank(0, h, "started"), Rank(1, h, "started")}, {0, 1});
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->agree);
  EXPECT_EQ(v->text, "every rank entered nccl:broadcast #2 of group 0; it never completed on "
                     "ranks 0-1");
  v = FirstDisagreement({Rank(0, h, "completed"), Rank(1, h, "completed")}, {0, 1});
  EXPECT_EQ(v->text, "the ranks' collective histories agree");
  EXPECT_FALSE(FirstDisagreement({}, {0, 1}).has_value());
}

}  // namespace
}  // namespace dlrun::launcher::testing
