// A crashed worker's own stack from its stderr (crash_trace.h): Python's faulthandler (as
// Python 3.11 writes it) and the worker library's native frames.
#include "launcher/stacks/crash_trace.h"

#include <gtest/gtest.h>

namespace dlrun::launcher {
namespace {

TEST(CrashTrace, PythonsFaulthandlerGivesTheCurrentThreadsInnermostFrame) {
  const std::string text = R"(some output before
Fatal Python error: Segmentation fault

Thread 0x00007ff8f05656c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 975 in run
  File "/usr/lib/python3.11/threading.py", line 1038 in _bootstrap_inner

Current thread 0x00007ff8f09412c0 (most recent call first):
  File "/tmp/fh.py", line 3 in crash
  File "/tmp/fh.py", line 6 in main
  File "/tmp/fh.py", line 7 in <module>

Extension modules: numpy._core._multiarray_umath, torch._C (total: 2))";
  const auto t = ParseCrashTrace(text);
  ASSERT_TRUE(t.has_value());
  ASSERT_EQ(t->frames.size(), 3u);
  EXPECT_EQ(t->frames[0].Render(), "/tmp/fh.py:3 crash");
  EXPECT_EQ(t->frames[2].function, "<module>");
}

TEST(CrashTrace, TheWorkerLibrarysNativeFramesKeepModuleAndOffset) {
  const std::string text =
      "dlrun::worker: fatal signal SIGSEGV; native frames (most recent call first):\n"
      "  #0 /opt/bin/train+0x1267\n"
      "  #1 /opt/lib/libtorch_cpu.so+0x1a2b3c _ZN2at6native3fooEv\n"
      "  #2 ??+0x7f00aa\n";
  const auto t = ParseCrashTrace(text);
  ASSERT_TRUE(t.has_value());
  ASSERT_EQ(t->frames.size(), 3u);
  EXPECT_EQ(t->frames[0].module, "/opt/bin/train");
  EXPECT_EQ(t->frames[0].offset, 0x1267u);
  EXPECT_EQ(t->frames[0].function, "??");
  EXPECT_EQ(t->frames[1].function, "at::native::foo()") << "demangled";
  EXPECT_TRUE(t->frames[2].module.empty()) << "outside any module: nothing to name";
}

TEST(CrashTrace, NoTraceIsNone) {
  EXPECT_FALSE(ParseCrashTrace("").has_value());
  EXPECT_FALSE(ParseCrashTrace("Segmentation fault (core dumped)\n").has_value());
  EXPECT_FALSE(ParseCrashTrace("Current thread 0x1 (most recent call first):\n  garbage\n"));
  // A truncated tail: the header is gone, the frames alone are no trace.
  EXPECT_FALSE(ParseCrashTrace("  File \"/tmp/x.py\", line 3 in f\n").has_value());
}

}  // namespace
}  // namespace dlrun::launcher
