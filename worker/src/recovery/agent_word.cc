#include "agent_word.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "common/contract.h"
#include "worker/src/text.h"

namespace dlrun::worker::detail {
namespace {

struct Words {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Regroup> newest;  // the newest word, once the hook has run
  std::atomic<int> announced{0};  // the newest word's generation, marked before the hook
  std::function<void()> hook;     // SetPeerLossHook
  std::atomic<int> current{0};
  std::atomic<bool> watching{false};
};

Words& TheWords() {
  static Words* w = [] {
    auto* w = new Words;  // never destroyed: the reader thread may outlive main()
    int gen = 0;
    if (const char* v = std::getenv(contract::kRecoveryGen); v != nullptr && lite::SimpleAtoi(v, &gen)) {
      w->current = gen;
      w->announced = gen;
    }
    return w;
  }();
  return *w;
}

// Marks the word (collectives give up), runs the hook (an abort of the old group's
// communicators), then lets AwaitRegroup() hear of it: the main thread builds the next group only
// after the old one was aborted.
void Announce(const Regroup& r) {
  Words& w = TheWords();
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    if (r.generation <= w.announced.load()) return;  // an old or repeated word
    w.announced = r.generation;
    hook = w.hook;
  }
  if (hook) hook();
  {
    std::lock_guard<std::mutex> lock(w.mu);
    if (!w.newest || w.newest->generation < r.generation) w.newest = r;
  }
  w.cv.notify_all();
}

// "regroup <generation> <master_port> [<rank> <world_size> <master_addr>]"; anything else is
// ignored (a newer agent's other words).
void OnLine(const std::string& line) {
  std::istringstream in(line);
  std::string word;
  Regroup r;
  if (!(in >> word >> r.generation >> r.master_port) || word != contract::kRegroupWord ||
      r.generation <= 0 || r.master_port <= 0 || r.master_port >= 65536) {
    return;
  }
  std::string addr;
  int rank = -1, world = 0;
  if (in >> rank >> world >> addr) {
    if (rank < 0 || world <= 0 || rank >= world) return;
    r.rank = rank;
    r.world_size = world;
    r.master_addr = addr;
  }
  Announce(r);
}

void ReadWords(int fd) {
  std::string pending;
  char buf[512];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the agent is gone
    pending.append(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
      OnLine(pending.substr(0, nl));
      pending.erase(0, nl + 1);
    }
    if (pending.size() > 4096) pending.clear();  // not a word of ours
  }
}

}  // namespace

bool WatchAgentWords() {
  Words& w = TheWords();
  std::lock_guard<std::mutex> lock(w.mu);
  if (w.watching) return true;
  const char* v = std::getenv(contract::kControlFd);
  int fd = -1;
  if (v == nullptr || !lite::SimpleAtoi(v, &fd) || fd < 0 || fcntl(fd, F_GETFD) < 0) return false;
  fcntl(fd, F_SETFD, FD_CLOEXEC);  // not into the programs this worker starts
  std::thread(ReadWords, fd).detach();
  w.watching = true;
  return true;
}

bool WatchingAgentWords() { return TheWords().watching.load(std::memory_order_relaxed); }

bool PeerLossAnnounced() {
  Words& w = TheWords();
  return w.announced.load(std::memory_order_acquire) > w.current.load(std::memory_order_acquire);
}

int CurrentGeneration() { return TheWords().current.load(); }

std::optional<Regroup> AwaitRegroup(std::chrono::milliseconds timeout) {
  Words& w = TheWords();
  std::unique_lock<std::mutex> lock(w.mu);
  const auto heard = [&] { return w.newest && w.newest->generation > w.current.load(); };
  w.cv.wait_for(lock, timeout, heard);
  if (!heard()) return std::nullopt;
  return w.newest;
}

void EnterGeneration(int generation) {
  Words& w = TheWords();
  std::lock_guard<std::mutex> lock(w.mu);
  if (generation > w.current.load()) w.current = generation;
}

void SetPeerLossHook(std::function<void()> hook) {
  Words& w = TheWords();
  std::lock_guard<std::mutex> lock(w.mu);
  w.hook = std::move(hook);
}

void AnnounceForTesting(const Regroup& r) { Announce(r); }

}  // namespace dlrun::worker::detail
