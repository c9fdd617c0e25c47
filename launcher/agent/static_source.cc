#include "launcher/agent/membership.h"

namespace dlrun::launcher {
namespace {

class StaticSource final : public MembershipSource {
 public:
  StaticSource(Assignment base, int max_restarts, std::function<int()> pick)
      : base_(std::move(base)), max_restarts_(max_restarts), pick_(std::move(pick)) {}
  absl::StatusOr<Assignment> Next() override {
    Assignment a = base_;
    a.restart_count = restarts_;
    a.max_restarts = max_restarts_;
    if (pick_) a.master_port = pick_();
    return a;
  }
  bool OnFailure(const std::string&) override { return restarts_++ < max_restarts_; }
  Verdict Check(std::string*) override { return Verdict::kContinue; }
  std::chrono::milliseconds check_interval() const override { return {}; }
  void OnSuccess() override {}

 private:
  Assignment base_;
  int max_restarts_;
  std::function<int()> pick_;
  int restarts_ = 0;
};

}  // namespace

std::unique_ptr<MembershipSource> MakeStaticSource(Assignment base, int max_restarts,
                                                   std::function<int()> pick_master_port) {
  return std::make_unique<StaticSource>(std::move(base), max_restarts,
                                        std::move(pick_master_port));
}

}  // namespace dlrun::launcher
