// The agent -> worker direction of the agent link (contract::kControlFd): what the dlrun agent
// tells a surviving worker when a peer is lost, for in-process recovery (dlrun/recovery.h).
// Internal to the worker library; no LibTorch here, so the shared-memory allreduce can poll it.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace dlrun::worker::detail {

struct Regroup {
  int generation = 0;
  int master_port = 0;
  // Set (rank >= 0) when the group's nodes changed: this rank's new place and master address.
  int rank = -1;
  int world_size = 0;
  std::string master_addr;
};

// Starts, once per process, the thread that reads the agent's words from contract::kControlFd.
// False outside dlrun (no control pipe): nothing is started.
bool WatchAgentWords();
// Whether WatchAgentWords() started the reader (the library's waits then poll for the word).
bool WatchingAgentWords();

// True while the agent has announced a generation newer than the one this process runs: every
// collective of the old group is to be given up (a peer of it is gone). Cheap (one atomic load).
bool PeerLossAnnounced();

// The generation this process runs (contract::kRecoveryGen's for a replacement, else 0), and the
// newest the agent announced.
int CurrentGeneration();

// Waits up to `timeout` for the agent's word of a generation newer than the current one.
std::optional<Regroup> AwaitRegroup(std::chrono::milliseconds timeout);

// Runs on the reader thread when the agent's word of a newer generation comes: after
// PeerLossAnnounced() turns true, before AwaitRegroup() hears of the word. In-process recovery
// aborts the NCCL communicators here (ncclCommAbort ends a kernel waiting on the lost peer, and
// a step's sum it ends is never taken for a finished one: the word was marked first). One hook;
// a later call replaces it, an empty function removes it.
void SetPeerLossHook(std::function<void()> hook);

// The group of `generation` is built: collectives are no longer given up.
void EnterGeneration(int generation);

// Tells the agent this rank refuses the in-process recovery under way ("C refused RULE"): the
// agent restarts the group from the checkpoint in its place, not counted against
// --max-restarts (as dlrun_recovery does for Python).
void RecordRefusal(const std::string& rule);

// Tests: the word as if the agent had written it.
void AnnounceForTesting(const Regroup& r);

}  // namespace dlrun::worker::detail
