// Step records on the heartbeat pipe (docs/TELEMETRY.md): the parser and the stream splitter.
#include "launcher/workers/step_record.h"

#include "gtest/gtest.h"

namespace dlrun::launcher {
namespace {

// What a fresh reader makes of `stream` fed in one read, and how many records it refused.
struct Read {
  std::vector<StepRecord> records;
  int64_t bad = 0;
};
Read ReadAll(const std::string& stream) {
  StepRecordReader reader;
  Read r;
  reader.Feed(stream.data(), stream.size(), &r.records);
  r.bad = reader.bad();
  return r;
}

TEST(StepRecord, ParsesTheRequiredFieldsAndEachOptionalOne) {
  auto r = ParseStepRecord("S 12 4 0.25 data_s=0.01 compute_s=0.2 sync_s=0.04 loss=-1.5e-3");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->step, 12);
  EXPECT_EQ(r->samples, 4);
  EXPECT_DOUBLE_EQ(r->step_s, 0.25);
  EXPECT_DOUBLE_EQ(*r->data_s, 0.01);
  EXPECT_DOUBLE_EQ(*r->compute_s, 0.2);
  EXPECT_DOUBLE_EQ(*r->sync_s, 0.04);
  EXPECT_DOUBLE_EQ(*r->loss, -1.5e-3);
  r = ParseStepRecord("S 1 0 0");
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->data_s.has_value());
  EXPECT_FALSE(r->loss.has_value());
}

TEST(StepRecord, MalformedRecordsAreRefused) {
  for (const char* bad : {"S", "S 1 2", "X 1 2 0.1", "S -1 2 0.1", "S 1 -2 0.1", "S 1 2 -0.1",
                          "S 1 2 nan", "S 1 2 inf", "S 1 2 0.1 data_s", "S 1 2 0.1 data_s=-1",
                          "S 1 2 0.1 speed=3", "S 1 2 0.1 loss=1 loss=2", "S 1 2 0.1 loss=nan",
                          "S a 2 0.1", "S 1 2 0.1 a=1 b=2 c=3 d=4 e=5",
                          "S 99999999999999999999 2 0.1"}) {
    EXPECT_FALSE(ParseStepRecord(bad).has_value()) << bad;
  }
}

TEST(StepRecord, AResumeRecordSaysTheCheckpointsStepAndItsLoadTime) {
  auto r = ParseStepRecord("R 40 0.25");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, RecordKind::kResumed);
  EXPECT_EQ(r->step, 40);
  EXPECT_DOUBLE_EQ(r->step_s, 0.25);
  EXPECT_EQ(ParseStepRecord("S 40 1 0.25")->kind, RecordKind::kStep);
  for (const char* bad : {"R", "R 40", "R -1 0.2", "R 40 -0.2", "R 40 nan", "R 40 0.2 x=1",
                          "R x 0.2"}) {
    EXPECT_FALSE(ParseStepRecord(bad).has_value()) << bad;
  }
  const Read read = ReadAll("hR 8 1.5\nhS 9 2 0.1\n");
  const std::vector<StepRecord>& out = read.records;
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].kind, RecordKind::kResumed);
  EXPECT_EQ(out[1].kind, RecordKind::kStep);
}

// In-process recovery (docs/RECOVERY.md): the declaration, and the state taken from a peer.
TEST(StepRecord, RecoveryRecordsDeclareItAndSayTheStateFromAPeer) {
  EXPECT_EQ(ParseStepRecord("C recovery")->kind, RecordKind::kDeclared);
  auto p = ParseStepRecord("P 12 0.125");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->kind, RecordKind::kFromPeer);
  EXPECT_EQ(p->step, 12);
  EXPECT_DOUBLE_EQ(p->step_s, 0.125);
  for (const char* bad : {"C", "C restart", "C recovery now", "P 12", "P -1 0.1", "P 12 x"}) {
    EXPECT_FALSE(ParseStepRecord(bad).has_value()) << bad;
  }
  const Read read = ReadAll("hC recovery\nhP 3 0.5\nhS 4 1 0.1\n");
  const std::vector<StepRecord>& out = read.records;
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].kind, RecordKind::kDeclared);
  EXPECT_EQ(out[1].kind, RecordKind::kFromPeer);
  EXPECT_EQ(out[2].kind, RecordKind::kStep);
  EXPECT_EQ(read.bad, 0);
}

TEST(StepRecord, APauseOfHangDetectionAndItsEnd) {
  auto p = ParseStepRecord("Z pause eval");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->kind, RecordKind::kPause);
  EXPECT_EQ(p->what, "eval");
  auto r = ParseStepRecord("Z resume");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->kind, RecordKind::kUnpause);
  EXPECT_FALSE(ParseStepRecord("Z pause"));
  EXPECT_FALSE(ParseStepRecord("Z pause a b"));
  EXPECT_FALSE(ParseStepRecord("Z resume now"));
  // Through the reader, among heartbeat bytes, as a pipe carries them (the reader once took
  // only S/R/C/P records, so a pause never reached the hang watch).
  const Read read = ReadAll("hS 4 1 0.1\nhZ pause eval\nhhZ resume\nhS 5 1 0.1\n");
  const std::vector<StepRecord>& out = read.records;
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[1].kind, RecordKind::kPause);
  EXPECT_EQ(out[1].what, "eval");
  EXPECT_EQ(out[2].kind, RecordKind::kUnpause);
  EXPECT_EQ(read.bad, 0);
}

// The program's work is done (dlrun_report.done()); through the reader like every record.
TEST(StepRecord, DoneSaysTheProgramFinishedItsWork) {
  EXPECT_EQ(ParseStepRecord("D done")->kind, RecordKind::kDone);
  for (const char* bad : {"D", "D done now", "D finished"}) {
    EXPECT_FALSE(ParseStepRecord(bad).has_value()) << bad;
  }
  const Read read = ReadAll("hS 9 1 0.1\nhD done\nh");
  const std::vector<StepRecord>& out = read.records;
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].kind, RecordKind::kDone);
  EXPECT_EQ(read.bad, 0);
  // Every record letter starts a record in the reader, and the heartbeat byte none.
  for (const char* line :
       {"S 1 1 0.1", "R 1 0.1", "C recovery", "P 1 0.1", "Z pause x", "Z resume", "D done"}) {
    EXPECT_EQ(ReadAll(std::string("h") + line + "\n").records.size(), 1u) << line;
  }
}

TEST(StepRecordReader, SplitsRecordsAcrossReadsAmongHeartbeatBytesAndCountsBadOnes) {
  StepRecordReader reader;
  std::vector<StepRecord> out;
  const std::string stream = "hhS 1 2 0.5\nhS 2 2 0.7 data_s=0.1\nS bogus\nhhS 3 2 0.9\n";
  for (char c : stream) reader.Feed(&c, 1, &out);  // one byte per read: the worst split
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].step, 1);
  EXPECT_EQ(out[1].step, 2);
  EXPECT_DOUBLE_EQ(*out[1].data_s, 0.1);
  EXPECT_EQ(out[2].step, 3);
  EXPECT_EQ(reader.bad(), 1);
  // An overlong line is dropped up to its newline, then records parse again.
  const std::string longline = "S 1 2 0.1 " + std::string(1000, 'x') + "\nS 4 1 0.2\n";
  out.clear();
  reader.Feed(longline.data(), longline.size(), &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].step, 4);
  EXPECT_EQ(reader.bad(), 2);
}

}  // namespace
}  // namespace dlrun::launcher
