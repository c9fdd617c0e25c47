// Per-rank profiling's choices (profile.h).
#include "launcher/profile/profile.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/contract.h"

namespace dlrun::launcher {

std::string ProfileFileName(ProfileTool t, int rank) {
  const char* ext = t == ProfileTool::kNsys    ? ".nsys-rep"
                    : t == ProfileTool::kTorch ? ".pt.trace.json"
                                               : ".svg";
  return absl::StrCat("rank", rank, ext);
}


std::vector<std::string> NsysArgv(const ProfileSpec& spec, const std::string& nsys,
                                  const std::string& out_stem, std::vector<std::string> argv) {
  std::vector<std::string> w = {nsys, "profile", "-o", out_stem, "--force-overwrite", "true"};
  if (spec.steps) {
    w.push_back("--capture-range=cudaProfilerApi");
    w.push_back("--capture-range-end=stop");
  }
  w.insert(w.end(), spec.args.begin(), spec.args.end());
  w.push_back("--");
  w.insert(w.end(), argv.begin(), argv.end());
  return w;
}

std::map<std::string, std::string> ProfileEnv(const ProfileSpec& spec, const std::string& file) {
  std::map<std::string, std::string> env{{contract::kProfile, ProfileToolName(spec.tool)}};
  if (spec.steps) {
    env[contract::kProfileSteps] = absl::StrCat(spec.steps->first, ":", spec.steps->last);
  }
  if (spec.tool == ProfileTool::kTorch) env[contract::kProfileFile] = file;
  return env;
}

CaptureWindow::Action CaptureWindow::Started() {
  capturing_ = false;
  if (done_) return Action::kNone;
  if (!steps_ || steps_->first == 0) {
    capturing_ = true;
    return Action::kStart;
  }
  return Action::kNone;
}

CaptureWindow::Action CaptureWindow::Step(int64_t step) {
  if (done_ || !steps_) return Action::kNone;
  if (capturing_ && step >= steps_->last) {
    capturing_ = false;
    done_ = true;
    return Action::kStop;
  }
  if (!capturing_ && step >= steps_->first - 1 && step < steps_->last) {
    capturing_ = true;
    return Action::kStart;
  }
  return Action::kNone;
}

}  // namespace dlrun::launcher
