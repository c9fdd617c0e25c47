// The state machine tests' fixture: a fake clock, joins that record their results.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rendezvous/state_machine.h"

namespace dlrun::rdzv::testing {

class StateMachineTest : public ::testing::Test {
 protected:
  void Make(Config c) {
    config_ = c;
    sm_ = std::make_unique<StateMachine>(c, now_);
  }
  static NodeInfo Node(const std::string& id, int nproc = 2, int slurm = -1,
                       bool in_process = false) {
    NodeInfo n;
    n.node_id = id;
    n.hostname = "host-" + id;
    n.address = "addr-" + id;
    n.nproc = nproc;
    n.slurm_node_id = slurm;
    n.master_port = 1000 + static_cast<int>(id.size());
    n.in_process = in_process;
    return n;
  }
  // Joins and records the eventual result under the node id.
  void Join(const std::string& id, int nproc = 2, int slurm = -1, bool in_process = false) {
    results_.erase(id);
    Deliveries out;
    absl::Status s = sm_->Join(
        Node(id, nproc, slurm, in_process), ++ticket_, now_,
        [this, id](absl::StatusOr<Assignment> a) { results_[id] = a; }, &out);
    ASSERT_TRUE(s.ok()) << s;
    Run(out);
  }
  void Run(Deliveries& out) {
    for (auto& d : out) d.callback(std::move(d.result));
  }
  void Advance(std::chrono::milliseconds d) {
    now_ += d;
    Deliveries out;
    sm_->Tick(now_, &out);
    Run(out);
  }
  void HeartbeatAll(const std::vector<std::string>& ids, bool in_process = false) {
    for (const auto& id : ids) {
      auto r = sm_->Heartbeat(id, sm_->state().round, now_, in_process);
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
  absl::StatusOr<FailureReply> Fail(const std::string& id, uint64_t round) {
    Deliveries out;
    auto r = sm_->ReportFailure(id, round, "worker exited with 1", now_, &out);
    Run(out);
    return r;
  }

  Config config_;
  TimePoint now_ = TimePoint() + std::chrono::hours(1);
  std::unique_ptr<StateMachine> sm_;
  std::map<std::string, absl::StatusOr<Assignment>> results_;
  uint64_t ticket_ = 0;
};

}  // namespace dlrun::rdzv::testing
