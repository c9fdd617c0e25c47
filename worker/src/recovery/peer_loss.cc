// The library's waits under in-process recovery (dlrun/recovery.h): a collective, a comm hook's
// future or a long forward that meets the agent's word of a lost peer ends in PeerLost instead
// of waiting for Gloo's timeout; NCCL's group errors and abort; and the step a checkpoint resume
// left this process at, which a Recovery goes on from.
#include <torch/torch.h>
#include <torch/version.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>

#include "agent_word.h"
#include "dlrun/recovery.h"
#include "worker/src/group.h"

namespace dlrun::worker {

namespace detail {

void WaitWork(const c10::intrusive_ptr<c10d::Work>& work) {
  if (!WatchingAgentWords()) {
    work->wait();
    return;
  }
  for (;;) {
    if (PeerLossAnnounced() && !work->isCompleted()) {
      throw PeerLost("collective given up: the dlrun agent said a rank of the group was lost");
    }
    try {
      work->wait(std::chrono::milliseconds(20));
      return;
    } catch (...) {
      // The slice's timeout, or the work's own error; it may also have completed just after
      // the slice ended: then its own wait returns, or throws its own error.
      if (work->isCompleted()) {
        work->wait();
        return;
      }
    }
  }
}

void WaitFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  if (!WatchingAgentWords()) {
    future->wait();
    return;
  }
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();
  future->addCallback([done](c10::ivalue::Future&) {
    std::lock_guard<std::mutex> lock(done->mu);
    done->done = true;
    done->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(done->mu);
  while (!done->cv.wait_for(lock, std::chrono::milliseconds(20), [&] { return done->done; })) {
    if (PeerLossAnnounced()) {
      throw PeerLost("communication hook given up: the dlrun agent said a rank of the group was "
                     "lost");
    }
  }
}

void ThrowIfPeerLost() {
  if (PeerLossAnnounced()) {
    throw PeerLost("step given up: the dlrun agent said a rank of the group was lost");
  }
}

namespace {
std::atomic<int64_t> resumed_step{-1};
}  // namespace

void NoteResumedStep(int64_t step) { resumed_step.store(step); }
int64_t TakeResumedStep() { return resumed_step.exchange(-1); }

bool GroupFailed(c10d::ProcessGroup& pg) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
  try {
    return pg.getDefaultBackend()->getError() != c10d::ErrorType::SUCCESS;
  } catch (const std::exception&) {  // a backend without getError (Gloo's): the word alone tells
    return false;
  }
#else
  (void)pg;  // LibTorch before 2.8 has no Backend::getError: the word alone tells
  return false;
#endif
}

void AbortGroup(c10d::ProcessGroup& pg) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 7)
  try {
    pg.abort();  // ProcessGroup::abort and Backend::abort came with LibTorch 2.7
  } catch (const std::exception& e) {  // the recovery's own timeout ends what the abort did not
    const std::string what = e.what();
    std::fprintf(stderr, "dlrun::worker: aborting the NCCL group: %s\n",
                 what.substr(0, what.find('\n')).c_str());
  }
#else
  (void)pg;
  std::fprintf(stderr,
               "dlrun::worker: this LibTorch (before 2.7) cannot abort the NCCL group: a "
               "collective waiting on the lost peer ends at the recovery's timeout\n");
#endif
}

bool SettledStepMayApply(bool collectives_run_behind, bool word_heard, bool group_failed) {
  return !collectives_run_behind || (!word_heard && !group_failed);
}

}  // namespace detail

void interruption_point() { detail::ThrowIfPeerLost(); }

}  // namespace dlrun::worker
