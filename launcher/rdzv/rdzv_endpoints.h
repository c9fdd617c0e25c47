// Who an agent of dlrun's rendezvous is, and how it reaches or hosts the job's rendezvous
// (launcher/rdzv/rdzv_source.cc, rdzv_regroup.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "launcher/rdzv/rdzv_source.h"
#include "rendezvous/api.h"

namespace dlrun::launcher {

// How long an agent that starts asks a peer whether it already hosts this job.
inline constexpr std::chrono::milliseconds kPeerProbeTimeout{500};

// This agent's identity at the rendezvous: host:pid/pid-namespace (agents in containers on one
// host, each the PID 1 of a namespace of its own, must not share an id).
std::string NodeId(const RdzvSourceOptions& o);
// A client of this job's rendezvous at `endpoint`.
rdzv::ClientOptions ClientFor(const RdzvSourceOptions& o, const std::string& endpoint);
// A host of this job's rendezvous at `endpoint` with `epoch`, run by this agent.
rdzv::HostOptions HostFor(const RdzvSourceOptions& o, const std::string& endpoint,
                          uint64_t epoch);
// A host of this job already serving at one of `o.peers`: its endpoint, or empty.
std::string FindServingPeer(rdzv::Api* api, const RdzvSourceOptions& o);

}  // namespace dlrun::launcher
