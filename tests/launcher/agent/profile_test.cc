// The agent's side of --profile (docs/PROFILING.md) on the fakes: only the listed global ranks
// start differently (the profiler's command line and variables), the profiler hears of exactly
// their starts, step records and ends, and what it collects is published before the leave.
#include <set>

#include "gtest/gtest.h"
#include "agent/harness.h"

namespace dlrun::launcher::testing {
namespace {

class RecordingProfiler : public RankProfiler {
 public:
  explicit RecordingProfiler(std::set<int> ranks) : ranks_(std::move(ranks)) {}
  bool Wants(int rank) const override { return ranks_.count(rank) > 0; }
  std::vector<std::string> Argv(int rank, const std::vector<std::string>& argv) const override {
    std::vector<std::string> w = {"wrapper", "--rank", std::to_string(rank), "--"};
    w.insert(w.end(), argv.begin(), argv.end());
    return w;
  }
  std::map<std::string, std::string> Env(int rank) const override {
    return {{"PROFILED", std::to_string(rank)}};
  }
  void Started(int rank, pid_t pid) override { events.push_back("start " + std::to_string(rank)); }
  void Step(int rank, int64_t step) override {
    events.push_back("step " + std::to_string(rank) + ":" + std::to_string(step));
  }
  void Exited(int rank) override { events.push_back("exit " + std::to_string(rank)); }
  std::vector<telemetry::RankProfile> Collect(std::chrono::milliseconds) override {
    events.push_back("collect");
    std::vector<telemetry::RankProfile> out;
    for (int r : ranks_) {
      telemetry::RankProfile p;
      p.rank = r;
      p.tool = "perf";
      p.path = "/profiles/rank" + std::to_string(r) + ".svg";
      p.hot = {{"hot_function", 0.5}};
      out.push_back(p);
    }
    return out;
  }
  std::vector<std::string> events;

 private:
  std::set<int> ranks_;
};

TEST(AgentProfile, OnlyTheListedGlobalRanksAreWrappedAndFollowed) {
  Harness h(2);
  Assignment a;
  a.world_size = 4;
  a.local_world_size = 2;
  a.rank_offset = 2;  // this node runs global ranks 2 and 3
  auto profiler = std::make_shared<RecordingProfiler>(std::set<int>{3});
  h.options.profiler = profiler;
  h.options.spare_argv = {"spare"};
  auto src = std::make_unique<ScriptedSource>(a, 0, seconds(1));
  ScriptedSource* s = src.get();
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    StepRecord r;
    r.samples = 1;
    r.step_s = 0.1;
    f.StepsEvery(p.pid, milliseconds(100), milliseconds(300), r);
    f.ExitAfter(p.pid, milliseconds(350), 0);
  };
  EXPECT_EQ(h.Run(std::move(src)), 0);
  ASSERT_EQ(h.procs.procs.size(), 2u);
  const SpawnSpec& plain = h.procs.procs[0].spec;
  const SpawnSpec& wrapped = h.procs.procs[1].spec;
  EXPECT_EQ(plain.argv, std::vector<std::string>{"worker"}) << "rank 2 starts as without --profile";
  EXPECT_EQ(plain.env.count("PROFILED"), 0u);
  EXPECT_EQ(plain.spare_argv, std::vector<std::string>{"spare"});
  EXPECT_EQ(wrapped.argv, (std::vector<std::string>{"wrapper", "--rank", "3", "--", "worker"}));
  EXPECT_EQ(wrapped.env.at("PROFILED"), "3");
  EXPECT_TRUE(wrapped.spare_argv.empty()) << "a spare cannot take over a wrapped command";
  EXPECT_EQ(profiler->events, (std::vector<std::string>{"start 3", "step 3:1", "step 3:2",
                                                         "step 3:3", "exit 3", "collect",
                                                         "collect"}));
  ASSERT_FALSE(s->published.empty());
  const telemetry::NodeTelemetry& last = s->published.back();
  ASSERT_EQ(last.profiles.size(), 1u) << "the final figures carry the profile";
  EXPECT_EQ(last.profiles[0].rank, 3);
  EXPECT_EQ(last.profiles[0].path, "/profiles/rank3.svg");
}

TEST(AgentProfile, AnUnwrappedProfilerKeepsTheSpare) {
  // perf and py-spy attach: the command line stays, and so does the warm spare.
  class Attaching : public RecordingProfiler {
   public:
    Attaching() : RecordingProfiler({0}) {}
    std::vector<std::string> Argv(int, const std::vector<std::string>& argv) const override {
      return argv;
    }
  };
  Harness h(1);
  h.options.profiler = std::make_shared<Attaching>();
  h.options.spare_argv = {"spare"};
  h.procs.on_spawn = [](FakeProcesses& f, FakeProcesses::Proc& p) {
    f.ExitAfter(p.pid, milliseconds(100), 0);
  };
  EXPECT_EQ(h.RunStatic(0), 0);
  ASSERT_EQ(h.procs.procs.size(), 1u);
  EXPECT_EQ(h.procs.procs[0].spec.argv, std::vector<std::string>{"worker"});
  EXPECT_EQ(h.procs.procs[0].spec.spare_argv, std::vector<std::string>{"spare"});
}

}  // namespace
}  // namespace dlrun::launcher::testing
