#include "launcher/rdzv/static_source.h"

namespace dlrun::launcher {
namespace {

class StaticSource final : public MembershipSource, public JobChannel {
 public:
  StaticSource(Assignment base, int max_restarts, std::function<int()> pick,
               telemetry::TelemetryOptions telemetry)
      : base_(std::move(base)), max_restarts_(max_restarts), pick_(std::move(pick)) {
    // A single-node job is seen whole here; a node of a static multi-node job sees only itself.
    if (base_.num_nodes <= 1) telemetry_ = std::make_shared<telemetry::JobTelemetry>(std::move(telemetry));
  }
  absl::StatusOr<Assignment> Next() override {
    Assignment a = base_;
    a.restart_count = restarts_;
    a.max_restarts = max_restarts_;
    if (pick_) a.master_port = pick_();
    if (telemetry_) {
      telemetry_->SetJob(a.run_id, static_cast<uint64_t>(restarts_ + 1), a.world_size, 1,
                         restarts_);
      telemetry_->SetState("running");
    }
    return a;
  }
  void OnStop(const std::string& reason) override {
    if (telemetry_) telemetry_->SetState("stopped");
  }
  bool OnFailure(const std::string& reason, bool fatal) override {
    if (fatal) {
      if (telemetry_) telemetry_->SetState("failed");
      return false;
    }
    const bool again = restarts_++ - fallbacks_ < max_restarts_;
    if (telemetry_) {
      if (again) telemetry_->AddRestartCause(reason);
      telemetry_->SetState(again ? "restarting" : "failed");
    }
    return again;
  }
  bool OnFallback(const std::string& reason) override {
    ++restarts_;  // the workers' TORCHELASTIC_RESTART_COUNT, not one of --max-restarts
    ++fallbacks_;
    if (telemetry_) {
      telemetry_->AddRestartCause(reason);
      telemetry_->SetState("restarting");
    }
    return true;
  }
  Verdict Check(std::string*) override { return Verdict::kContinue; }
  std::chrono::milliseconds check_interval() const override { return {}; }
  void OnSuccess() override {
    if (telemetry_) telemetry_->SetState("succeeded");
  }
  void Publish(const telemetry::NodeTelemetry& t) override {
    if (telemetry_) telemetry_->Update("local", t.hostname, t, std::chrono::steady_clock::now());
  }
  std::shared_ptr<telemetry::JobTelemetry> job_telemetry() const override { return telemetry_; }

 private:
  Assignment base_;
  int max_restarts_;
  std::function<int()> pick_;
  int restarts_ = 0;
  int fallbacks_ = 0;  // restarts in place of an in-process recovery, not counted
  std::shared_ptr<telemetry::JobTelemetry> telemetry_;
};

}  // namespace

JobLink MakeStaticSource(Assignment base, int max_restarts, std::function<int()> pick_master_port,
                         telemetry::TelemetryOptions telemetry) {
  return JobLink::Of(std::make_shared<StaticSource>(std::move(base), max_restarts,
                                                    std::move(pick_master_port),
                                                    std::move(telemetry)));
}

}  // namespace dlrun::launcher
