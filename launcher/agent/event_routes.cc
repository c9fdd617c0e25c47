// The supervision loop's routing table (event_routes.h).
#include "launcher/agent/event_routes.h"

namespace dlrun::launcher {

Sinks RouteOf(const ProcEvent& e, const EventFacts& facts) {
  switch (e.kind) {
    case ProcEvent::Kind::kExited:
      return Sink::kGroupExit | Sink::kTelemetryExit | Sink::kHangExit;
    case ProcEvent::Kind::kHeartbeat:
      return static_cast<Sinks>(Sink::kHangBeat);
    case ProcEvent::Kind::kSignal:
      return static_cast<Sinks>(facts.passthrough ? Sink::kPassOn : Sink::kStop);
    // A wake only ends the Wait: whoever woke the loop checks its own state.
    case ProcEvent::Kind::kWake:
      return static_cast<Sinks>(Sink::kNone);
    case ProcEvent::Kind::kBadRecord:
      return static_cast<Sinks>(Sink::kBadRecord);
    case ProcEvent::Kind::kStep:
      break;
  }
  // Every record goes to the telemetry and the hang watch; some also elsewhere.
  Sinks s = Sink::kTelemetryRecord | Sink::kHangRecord;
  switch (e.step.kind) {
    case RecordKind::kDeclared:
    case RecordKind::kFromPeer:
      return s | Sink::kRecovery;
    case RecordKind::kDone:
      return s | Sink::kDone;
    case RecordKind::kRefused:
      return s | Sink::kRefusalLine;
    case RecordKind::kStep:
      return facts.profiled ? s | Sink::kProfilerStep : s;
    case RecordKind::kResumed:
    case RecordKind::kPause:
    case RecordKind::kUnpause:
      return s;
  }
  return s;
}

}  // namespace dlrun::launcher
