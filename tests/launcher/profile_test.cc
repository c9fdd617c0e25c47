// Per-rank profiling's pure parts (docs/PROFILING.md): the flags, nsys's command line, when an
// attaching tool captures, `perf script` folded, flame graphs and hot frames; and the flags
// through `dlrun` and `dlrun slurm`.
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "fake_env.h"
#include "gtest/gtest.h"
#include "launcher/cli/job_cli.h"
#include "launcher/cli/options.h"
#include "launcher/jobgen/job_script.h"
#include "launcher/profile/flamegraph.h"
#include "launcher/profile/profile.h"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::launcher {
namespace {

using Action = CaptureWindow::Action;

TEST(Profile, TheFlagsValuesAreCheckedAndABadOneIsNamed) {
  EXPECT_EQ(*ParseProfileTool("py-spy"), ProfileTool::kPySpy);
  EXPECT_EQ(*ParseProfileTool("nsys"), ProfileTool::kNsys);
  auto bad = ParseProfileTool("vtune");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "'vtune'")) << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "nsys, py-spy, perf or torch"));

  auto r = ParseStepRange("5:10");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first, 5);
  EXPECT_EQ(r->last, 10);
  for (const char* v : {"10:5", "5", "a:b", "-1:3", "1:2:3", ""}) {
    auto s = ParseStepRange(v);
    ASSERT_FALSE(s.ok()) << v;
    EXPECT_TRUE(absl::StrContains(s.status().message(), "--profile-steps")) << s.status();
  }

  EXPECT_EQ(*ParseRankList("profile-ranks", "3,0-1,1"), (std::vector<int>{0, 1, 3}));
  for (const char* v : {"", "x", "3-1", "-2", "1,,2"}) {
    EXPECT_FALSE(ParseRankList("profile-ranks", v).ok()) << v;
  }
  EXPECT_EQ(*SplitProfileArgs("--rate 200  --native"),
            (std::vector<std::string>{"--rate", "200", "--native"}));
  EXPECT_EQ(*SplitProfileArgs("-e 'cpu clock' \"\""),
            (std::vector<std::string>{"-e", "cpu clock", ""}));
  EXPECT_FALSE(SplitProfileArgs("--x 'open").ok());
}

TEST(Profile, NsysWrapsTheRankWithTheCaptureRangeOnlyForAStepRange) {
  ProfileSpec spec;
  spec.tool = ProfileTool::kNsys;
  spec.ranks = {1};
  spec.args = {"--trace", "cuda,nvtx"};
  const std::vector<std::string> argv = {"python3", "train.py", "--lr", "1"};
  EXPECT_EQ(NsysArgv(spec, "/opt/nsys", "/run/profile/rank1", argv),
            (std::vector<std::string>{"/opt/nsys", "profile", "-o", "/run/profile/rank1",
                                      "--force-overwrite", "true", "--trace", "cuda,nvtx", "--",
                                      "python3", "train.py", "--lr", "1"}));
  spec.steps = StepRange{5, 10};
  EXPECT_EQ(NsysArgv(spec, "nsys", "r", {"prog"}),
            (std::vector<std::string>{"nsys", "profile", "-o", "r", "--force-overwrite", "true",
                                      "--capture-range=cudaProfilerApi",
                                      "--capture-range-end=stop", "--trace", "cuda,nvtx", "--",
                                      "prog"}));
  const auto env = ProfileEnv(spec, "/run/profile/rank1.nsys-rep");
  EXPECT_EQ(env.at("DLRUN_PROFILE"), "nsys");
  EXPECT_EQ(env.at("DLRUN_PROFILE_STEPS"), "5:10");
  EXPECT_EQ(env.count("DLRUN_PROFILE_FILE"), 0u) << "only torch's trace is written by the rank";
  EXPECT_TRUE(spec.Wants(1));
  EXPECT_FALSE(spec.Wants(0));
  EXPECT_EQ(ProfileFileName(ProfileTool::kTorch, 3), "rank3.pt.trace.json");
}

TEST(Profile, ACaptureRunsFromStepAMinusOnesRecordToStepBsAndOnlyOnce) {
  CaptureWindow whole(std::nullopt);
  EXPECT_EQ(whole.Started(), Action::kStart);
  EXPECT_EQ(whole.Step(1), Action::kNone);

  CaptureWindow w(StepRange{5, 7});
  EXPECT_EQ(w.Started(), Action::kNone);
  EXPECT_EQ(w.Step(3), Action::kNone);
  EXPECT_EQ(w.Step(4), Action::kStart) << "the end of step 4 is the start of step 5";
  EXPECT_TRUE(w.capturing());
  EXPECT_EQ(w.Step(5), Action::kNone);
  EXPECT_EQ(w.Step(6), Action::kNone);
  EXPECT_EQ(w.Step(7), Action::kStop);
  EXPECT_TRUE(w.done());
  EXPECT_EQ(w.Started(), Action::kNone) << "a restarted rank is not captured again";
  EXPECT_EQ(w.Step(4), Action::kNone);

  CaptureWindow from0(StepRange{0, 2});
  EXPECT_EQ(from0.Started(), Action::kStart);
  EXPECT_EQ(from0.Step(2), Action::kStop);

  CaptureWindow late(StepRange{5, 7});  // a restart that resumes inside the range
  EXPECT_EQ(late.Started(), Action::kNone);
  EXPECT_EQ(late.Step(6), Action::kStart);
  EXPECT_EQ(late.Step(7), Action::kStop);
}

// What `perf script` (6.1) prints for `perf record --call-graph dwarf`: two samples.
constexpr char kPerfScript[] =
    "train_unet  7138  9410.393150:   10101010 cpu-clock:ppp: \n"
    "\t    7f01 dnnl::impl::cpu::im2col_3d+0x1c (/v/lib/libtorch_cpu.so)\n"
    "\t    7f02 at::native::conv3d_symint+0x40 (/v/lib/libtorch_cpu.so)\n"
    "\t    5501 main+0x10 (/b/train_unet)\n"
    "\n"
    "pt worker 1  7140  9410.403150:   10101010 cpu-clock:ppp: \n"
    "\tffffffff82203249 _raw_spin_unlock_irqrestore+0x19 ([kernel.kallsyms])\n"
    "\t    7f03 [unknown] (/v/lib/libgomp.so.1)\n"
    "\t    7f04 [unknown] ([unknown])\n"
    "\n";

TEST(Flamegraph, PerfScriptIsFoldedRootFirstWithoutOffsets) {
  const Folded f = FoldPerfScript(kPerfScript);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f.at("train_unet;main;at::native::conv3d_symint;dnnl::impl::cpu::im2col_3d"), 1);
  EXPECT_EQ(f.at("pt worker 1;[unknown];[libgomp.so.1];_raw_spin_unlock_irqrestore_[k]"), 1)
      << "a command with blanks, a module without a symbol, a kernel frame";
  EXPECT_EQ(TotalSamples(f), 2);
}

TEST(Flamegraph, FoldedTextRoundTripsAndABadLineIsNamed) {
  auto f = ParseFolded("a;b;c 12\na;b 3\n 4\n");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->at("a;b;c"), 12);
  EXPECT_EQ(f->at("[unknown]"), 4) << "py-spy's samples with no Python frame";
  EXPECT_EQ(*ParseFolded(FoldedText(*f)), *f);
  auto bad = ParseFolded("a;b;c twelve\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "'a;b;c twelve'")) << bad.status();
}

TEST(Flamegraph, TheSvgHasAFramePerCallPathWithItsShare) {
  const Folded f = {{"python;main (t.py:9);hot_function (t.py:4)", 3},
                    {"python;main (t.py:9);cold <x> & y (t.py:7)", 1}};
  const std::string svg = FlameGraphSvg(f, "rank 1");
  EXPECT_TRUE(absl::StartsWith(svg, "<?xml")) << svg.substr(0, 100);
  EXPECT_TRUE(absl::StrContains(svg, "<svg ")) << svg;
  EXPECT_TRUE(absl::StrContains(svg, "</svg>"));
  EXPECT_TRUE(absl::StrContains(svg, "<title>hot_function (t.py:4) (3 samples, 75.00%)</title>"))
      << svg;
  EXPECT_TRUE(absl::StrContains(svg, "<title>main (t.py:9) (4 samples, 100.00%)</title>"));
  EXPECT_TRUE(absl::StrContains(svg, "cold &lt;x&gt; &amp; y")) << "names are escaped";
  EXPECT_TRUE(absl::StrContains(svg, "rank 1 (4 samples)"));
}

TEST(Flamegraph, HotFramesAreWhereTheSamplesInnermostNamedFrameIs) {
  const Folded f = {{"python;main (t.py:9);hot (t.py:4)", 5},
                    {"python;main (t.py:9);hot (t.py:5)", 3},   // the same function
                    {"train;conv3d;[libgomp.so]", 1},            // counts for conv3d
                    {"train;[unknown]", 1}};                     // JIT code: not ranked
  const std::vector<HotFrame> hot = HotFrames(f, 5);
  ASSERT_EQ(hot.size(), 2u);
  EXPECT_EQ(hot[0].frame, "hot (t.py)");
  EXPECT_DOUBLE_EQ(hot[0].fraction, 0.8);
  EXPECT_EQ(hot[1].frame, "conv3d");
  EXPECT_DOUBLE_EQ(hot[1].fraction, 0.1);
  EXPECT_EQ(HotFramesText(hot), "80% in hot (t.py), 10% in conv3d");
  EXPECT_EQ(HotFrames(f, 1).size(), 1u);
}

TEST(Flamegraph, ACxxFrameIsNamedWithoutTemplatesAndParameters) {
  EXPECT_EQ(ShortCxxName("std::_Function_handler<void (long), dnnl::impl::cpu::"
                         "jit_gemm_convolution_utils::im2col_3d<float>(dnnl::impl::cpu::"
                         "conv_gemm_conf_t const&, float const*, float*, long, long, long)::"
                         "{lambda(long)#1}>::_M_invoke"),
            "dnnl::impl::cpu::jit_gemm_convolution_utils::im2col_3d::{lambda}");
  EXPECT_EQ(ShortCxxName("at::native::(anonymous namespace)::mkldnn_convolution_transpose"),
            "at::native::mkldnn_convolution_transpose");
  EXPECT_EQ(ShortCxxName("c10::function_ref<void (char**, long const*, long, long)>::"
                         "callback_fn<at::native::AVX2::VectorizedLoop2d<float>>"),
            "c10::function_ref::callback_fn");
  EXPECT_EQ(ShortCxxName("mkl_vml_kernel_sTanh_EXHAynn"), "mkl_vml_kernel_sTanh_EXHAynn");
}

TEST(Profile, DlrunsFlagsNeedEachOther) {
  const auto env = dlrun::testing::FakeEnv({});
  auto ok = ParseLaunchOptions({"--profile", "perf", "--profile-ranks", "0,2", "--profile-steps",
                                "5:10", "--profile-args", "-F 499", "prog"},
                               env);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->profile.tool, ProfileTool::kPerf);
  EXPECT_EQ(ok->profile.ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(ok->profile.args, (std::vector<std::string>{"-F", "499"}));
  auto no_ranks = ParseLaunchOptions({"--profile", "perf", "prog"}, env);
  ASSERT_FALSE(no_ranks.ok());
  EXPECT_TRUE(absl::StrContains(no_ranks.status().message(), "needs --profile-ranks"));
  auto no_tool = ParseLaunchOptions({"--profile-steps", "1:2", "prog"}, env);
  ASSERT_FALSE(no_tool.ok());
  EXPECT_TRUE(absl::StrContains(no_tool.status().message(), "--profile-steps needs --profile"));
}

TEST(Profile, DlrunSlurmPassesTheFlagsOnQuoted) {
  auto o = ParseSlurmArgs({"--nodes", "2", "--profile", "py-spy", "--profile-ranks", "1,3",
                           "--profile-steps", "5:10", "--profile-args", "--rate 200", "--",
                           "python3", "train.py"});
  ASSERT_TRUE(o.ok()) << o.status();
  std::ifstream in(std::string(SOURCE_DIR) + "/job_templates/dlrun.sbatch");
  std::stringstream tmpl;
  tmpl << in.rdbuf();
  const std::string s = RenderSlurmScript(*o, tmpl.str());
  for (const char* line : {"--profile py-spy \\", "--profile-ranks 1,3 \\",
                           "--profile-steps 5:10 \\", "--profile-args '--rate 200' \\"}) {
    EXPECT_TRUE(absl::StrContains(s, line)) << line << "\n" << s;
  }
  EXPECT_FALSE(ParseSlurmArgs({"--profile", "gdb", "--", "x"}).ok());
  EXPECT_FALSE(ParseSlurmArgs({"--profile", "perf", "--", "x"}).ok()) << "no ranks";
  EXPECT_FALSE(ParseSlurmArgs({"--profile-ranks", "1", "--", "x"}).ok()) << "no tool";
}

}  // namespace
}  // namespace dlrun::launcher
