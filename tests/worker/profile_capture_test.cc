// The nsys capture window of a C++ worker (worker/src/nvtx_ranges.cc): cudaProfilerStart after the
// step record of A-1 (at init() for A = 0), cudaProfilerStop after that of B, once.
#include "profile_capture.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dlrun::worker {
namespace {

std::vector<std::string>* g_calls = nullptr;
int Start() {
  g_calls->push_back("start");
  return 0;
}
int Stop() {
  g_calls->push_back("stop");
  return 0;
}

// The calls, each after the step whose record preceded it ("init" for AtStart).
std::vector<std::string> Drive(const char* tool, const char* steps, int last_step,
                               ProfileCapture::Toggle start = &Start) {
  std::vector<std::string> calls;
  g_calls = &calls;
  ProfileCapture capture(tool, steps, start, &Stop);
  capture.AtStart();
  if (!calls.empty()) calls.back() += "@init";
  for (int s = 0; s <= last_step; ++s) {
    const size_t before = calls.size();
    capture.AfterStep(s);
    if (calls.size() > before) calls.back() += "@" + std::to_string(s);
  }
  g_calls = nullptr;
  return calls;
}

TEST(ProfileCapture, StartsAfterTheStepBeforeTheRangeAndStopsAfterItsLastStepOnce) {
  EXPECT_EQ(Drive("nsys", "5:10", 20), (std::vector<std::string>{"start@4", "stop@10"}));
  EXPECT_EQ(Drive("nsys", "0:2", 5), (std::vector<std::string>{"start@init", "stop@2"}));
  EXPECT_EQ(Drive("nsys", "3:3", 5), (std::vector<std::string>{"start@2", "stop@3"}));
}

TEST(ProfileCapture, OnlyNsysWithAValidRangeAndTheCudaRuntimeCaptures) {
  EXPECT_TRUE(Drive("perf", "1:2", 5).empty());
  EXPECT_TRUE(Drive("nsys", nullptr, 5).empty());
  EXPECT_TRUE(Drive("nsys", "2", 5).empty());
  EXPECT_TRUE(Drive("nsys", "4:2", 5).empty());
  EXPECT_TRUE(Drive("nsys", "1:2x", 5).empty());
  EXPECT_TRUE(Drive(nullptr, "1:2", 5).empty());
  EXPECT_TRUE(Drive("nsys", "1:2", 5, nullptr).empty()) << "no CUDA runtime in the process";
}

TEST(ProfileCapture, AWorkerResumedInsideTheRangeStartsAtOnce) {
  // A restarted worker whose first record is step 7 of 5:10 captures 8-10.
  std::vector<std::string> calls;
  g_calls = &calls;
  ProfileCapture capture("nsys", "5:10", &Start, &Stop);
  capture.AtStart();
  capture.AfterStep(7);
  EXPECT_EQ(calls, std::vector<std::string>{"start"});
  capture.AfterStep(10);
  capture.AfterStep(11);
  EXPECT_EQ(calls, (std::vector<std::string>{"start", "stop"}));
  g_calls = nullptr;
}

}  // namespace
}  // namespace dlrun::worker
