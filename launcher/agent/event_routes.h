// Where the supervision loop sends each event of the process table (agent.cc's HandleEvents
// carries it out), decided from the event and two facts the loop looks up: pure, so the whole
// table is tested on its own (tests/launcher/agent/event_routes_test.cc), as RecoveryMachine's
// and FailureVerdict's are.
#pragma once

#include <cstdint>

#include "launcher/workers/processes.h"

namespace dlrun::launcher {

enum class Sink : uint32_t {
  kNone = 0,
  kGroupExit = 1 << 0,         // WorkerGroup::Exited; the two below only for a worker of the group
  kTelemetryExit = 1 << 1,     // AgentTelemetry::Exited (its CPU time whole)
  kHangExit = 1 << 2,          // HangWatch::Exited
  kHangBeat = 1 << 3,          // HangWatch::Beat
  kPassOn = 1 << 4,            // a signal passed on to the workers (--signals-to-handle)
  kStop = 1 << 5,              // a signal that stops the job (the first of a batch is returned)
  kRecovery = 1 << 7,          // InProcessRecovery::Record: a declaration, a state from a peer
  kDone = 1 << 8,              // WorkerGroup::Done: the program's work is done
  kRefusalLine = 1 << 9,       // the line naming the rank that refused the recovery and its rule
  kTelemetryRecord = 1 << 10,  // AgentTelemetry::Step
  kHangRecord = 1 << 11,       // HangWatch::Record (steps, pauses, done)
  kProfilerStep = 1 << 12,     // the profiler's step count of a rank it profiles
  kBadRecord = 1 << 13,        // the telemetry's count of malformed records
};
using Sinks = uint32_t;
constexpr Sinks operator|(Sink a, Sink b) { return static_cast<Sinks>(a) | static_cast<Sinks>(b); }
constexpr Sinks operator|(Sinks a, Sink b) { return a | static_cast<Sinks>(b); }
constexpr bool Has(Sinks s, Sink one) { return (s & static_cast<Sinks>(one)) != 0; }

// What the loop knows of an event beyond the event itself.
struct EventFacts {
  bool passthrough = false;  // kSignal: a signal the workers get (--signals-to-handle)
  bool profiled = false;     // kStep: the record's rank is one the profiler traces
};

// The sinks of `e`.
Sinks RouteOf(const ProcEvent& e, const EventFacts& facts);

}  // namespace dlrun::launcher
