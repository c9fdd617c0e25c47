// The supervision loop's routing table (launcher/agent/event_routes.h), row by row: every kind of
// process-table event and every kind of step record, with the facts the loop looks up, and the
// sinks each reaches. Agent-level tests (hang_test, recovery_test, telemetry_test) show the sinks
// act; this shows none is missed or reached by mistake.
#include "launcher/agent/event_routes.h"

#include <signal.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dlrun::launcher::event_routes_test {
namespace {

ProcEvent Event(ProcEvent::Kind kind, int sig = 0) {
  ProcEvent e;
  e.kind = kind;
  e.pid = 42;
  e.signal = sig;
  return e;
}

ProcEvent Record(RecordKind kind) {
  ProcEvent e = Event(ProcEvent::Kind::kStep);
  e.step.kind = kind;
  return e;
}

struct Row {
  const char* what;
  ProcEvent event;
  EventFacts facts;
  Sinks sinks;
};

TEST(EventRoutes, EveryRowOfTheTable) {
  const Sinks records = Sink::kTelemetryRecord | Sink::kHangRecord;
  const std::vector<Row> rows = {
      {"an exit: the group, then the telemetry's CPU time and the hang watch",
       Event(ProcEvent::Kind::kExited),
       {},
       Sink::kGroupExit | Sink::kTelemetryExit | Sink::kHangExit},
      {"a heartbeat: the hang watch only",
       Event(ProcEvent::Kind::kHeartbeat),
       {},
       static_cast<Sinks>(Sink::kHangBeat)},
      {"a signal the workers get is passed on",
       Event(ProcEvent::Kind::kSignal, SIGUSR1),
       {.passthrough = true},
       static_cast<Sinks>(Sink::kPassOn)},
      {"another signal stops the job",
       Event(ProcEvent::Kind::kSignal, SIGTERM),
       {},
       static_cast<Sinks>(Sink::kStop)},
      {"a wake-up", Event(ProcEvent::Kind::kWake), {}, static_cast<Sinks>(Sink::kNone)},
      {"a malformed record is counted",
       Event(ProcEvent::Kind::kBadRecord),
       {},
       static_cast<Sinks>(Sink::kBadRecord)},
      {"a step of a rank not profiled: telemetry and hang watch",
       Record(RecordKind::kStep),
       {},
       records},
      {"a step of a profiled rank: the profiler too",
       Record(RecordKind::kStep),
       {.profiled = true},
       records | Sink::kProfilerStep},
      {"a resume: telemetry (the ledger) and hang watch",
       Record(RecordKind::kResumed),
       {.profiled = true},
       records},
      {"a declaration: the recovery too",
       Record(RecordKind::kDeclared),
       {},
       records | Sink::kRecovery},
      {"a state from a peer: the recovery too",
       Record(RecordKind::kFromPeer),
       {},
       records | Sink::kRecovery},
      {"a refusal: its line", Record(RecordKind::kRefused), {}, records | Sink::kRefusalLine},
      {"a pause", Record(RecordKind::kPause), {}, records},
      {"its end", Record(RecordKind::kUnpause), {}, records},
      {"done: the group marks it", Record(RecordKind::kDone), {}, records | Sink::kDone},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(RouteOf(r.event, r.facts), r.sinks) << r.what;
  }
}

// A fact that does not apply to the event's kind changes nothing.
TEST(EventRoutes, FactsOfAnotherKindChangeNothing) {
  const EventFacts both{.passthrough = true, .profiled = true};
  EXPECT_EQ(RouteOf(Event(ProcEvent::Kind::kExited), both),
            Sink::kGroupExit | Sink::kTelemetryExit | Sink::kHangExit);
  EXPECT_EQ(RouteOf(Record(RecordKind::kDone), both),
            Sink::kTelemetryRecord | Sink::kHangRecord | Sink::kDone);
  EXPECT_EQ(RouteOf(Event(ProcEvent::Kind::kHeartbeat), both), static_cast<Sinks>(Sink::kHangBeat));
}

}  // namespace
}  // namespace dlrun::launcher::event_routes_test
