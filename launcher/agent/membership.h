// Where the agent's place in the job comes from: fixed flags (standalone / static rendezvous,
// MakeStaticSource) or dlrun's gRPC rendezvous (launcher/rdzv/rdzv_source.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/assignment.h"
#include "telemetry/telemetry.h"
#include "rendezvous/types.h"

namespace dlrun::launcher {

class MembershipSource {
 public:
  enum class Verdict { kContinue, kRestart, kStop, kFinished };
  virtual ~MembershipSource() = default;
  // The next round's assignment. May block (a rendezvous join) when NextMayBlock(): the agent
  // then runs it on a helper thread so signals still reach it.
  virtual absl::StatusOr<Assignment> Next() = 0;
  virtual bool NextMayBlock() const { return check_interval().count() > 0; }
  // A local worker failed: returns true if the job goes on (a new round), false if it is over.
  virtual bool OnFailure(const std::string& reason) = 0;
  // A local worker failed the same way as last time (Agent: "a failure that repeats"): the job
  // ends here; the other nodes are stopped, not given a new round.
  virtual void OnFatalFailure(const std::string& reason) { OnStop(reason); }
  // The agent itself was told to stop (SIGINT, SIGTERM): no restart follows. By default the
  // others are told as of a failure (a rendezvous opens a round without this node).
  virtual void OnStop(const std::string& reason) { OnFailure(reason); }
  // Called every check_interval() while workers run (never if it is zero).
  virtual Verdict Check(std::string* reason) = 0;
  virtual std::chrono::milliseconds check_interval() const = 0;
  // Every local worker succeeded. The agent then keeps calling Check() until it says kFinished
  // (every node is done), kRestart (another node failed: run again) or kStop.
  virtual void OnSuccess() = 0;
  // A job-wide `dlrun stacks` (docs/STACKS.md): a request id the rendezvous asked this node to
  // answer (0: none pending); the agent dumps its workers and posts them with PostDiagnostics (stacks or profiles).
  virtual uint64_t StacksWanted() const { return 0; }
  virtual void PostDiagnostics(uint64_t id, const std::string& answer_json) {}
  // With StacksWanted(): `dlrun profile` asked for profiles of some ranks instead
  // (docs/PROFILING.md, "On a running job"); the answer goes with PostDiagnostics too.
  virtual std::optional<rdzv::ProfileAsk> ProfileWanted() const { return std::nullopt; }
  // Where `dlrun stacks` reaches this job's rendezvous (the current host), and its secret;
  // empty endpoint for a static job.
  struct RdzvAddress {
    std::string endpoint, run_id, token;
  };
  virtual RdzvAddress Address() const { return {}; }
  // This node's latest telemetry (docs/TELEMETRY.md): sent with the next heartbeat and with the
  // leave, or fed to the local aggregate of a single-node job.
  virtual void Publish(const telemetry::NodeTelemetry& t) = 0;
  // The job-wide aggregate when this agent holds it (single-node jobs, the rendezvous host),
  // else null.
  virtual std::shared_ptr<telemetry::JobTelemetry> job_telemetry() const = 0;
};

// Fixed assignment; restarts are counted locally up to max_restarts. `pick_master_port`, when
// set, picks a fresh port per attempt (standalone).
std::unique_ptr<MembershipSource> MakeStaticSource(Assignment base, int max_restarts,
                                                   std::function<int()> pick_master_port,
                                                   telemetry::TelemetryOptions telemetry = {});

}  // namespace dlrun::launcher
