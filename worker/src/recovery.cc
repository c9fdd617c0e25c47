// In-process recovery (dlrun/recovery.h): the survivors' regroup, the state transfer from one
// survivor, and the abortable wait the library's collectives use.
#include "dlrun/recovery.h"

#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <exception>

#include "agent_word.h"
#include "state_transfer.h"
#include "dlrun/agent_link.h"
#include "group.h"
#include "text.h"

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

void ThrowIfPeerLost() {
  if (PeerLossAnnounced()) {
    throw PeerLost("step given up: the dlrun agent said a rank of the group was lost");
  }
}

}  // namespace detail

void interruptionPoint() { detail::ThrowIfPeerLost(); }

namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

Recovery::Recovery(Context& ctx, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                   RecoveryHooks hooks, RecoveryOptions options)
    : ctx_(ctx), model_(model), optimizer_(optimizer), hooks_(std::move(hooks)),
      options_(options) {
  enabled_ = detail::WatchAgentWords();
  // Made at start-up: only a replacement starts in a generation after the first.
  replacement_ = enabled_ && detail::CurrentGeneration() > 0;
  if (enabled_) declareInProcessRecovery();
}

// Collective over ctx_: the lowest rank with the highest committed step sends model, optimizer
// and state, point to point, to every rank behind it (the replacement passes -1), which loads
// them. Then the ranks' parameters and buffers must agree bit for bit.
TrainingState Recovery::Transfer(int64_t my_step, bool* loaded, int* root_out) {
  auto t = std::chrono::steady_clock::now();
  auto lap = [&t] {
    const double s = SecondsSince(t);
    t = std::chrono::steady_clock::now();
    return s;
  };
  const std::vector<torch::Tensor> steps = ctx_.allGather(torch::tensor({my_step}, torch::kInt64));
  int64_t best = -1;
  int root = -1;
  for (int r = 0; r < static_cast<int>(steps.size()); ++r) {
    const int64_t s = steps[static_cast<size_t>(r)].item<int64_t>();
    if (s > best) best = s, root = r;
  }
  if (best < 0) throw std::runtime_error("recovery: no rank holds a state to send");
  *root_out = root;
  TrainingState st;
  timing_ = {};
  detail::TransferTiming tt;
  *loaded = my_step < best;
  if (ctx_.rank() == root) {
    if (hooks_.capture) st = hooks_.capture();
    st.step = best;
    st.world_size = ctx_.worldSize();
    std::vector<int> behind;
    for (int r = 0; r < static_cast<int>(steps.size()); ++r) {
      if (steps[static_cast<size_t>(r)].item<int64_t>() < best) behind.push_back(r);
    }
    detail::SendState(ctx_, model_, optimizer_, st, behind, &tt);
  } else if (*loaded) {
    st = detail::ReceiveState(ctx_, model_, optimizer_, root, &tt);
    if (hooks_.restore) hooks_.restore(st);
  }
  timing_.serialize_s = tt.serialize_s;
  timing_.send_s = tt.send_s;
  timing_.load_s = tt.load_s;
  lap();
  std::vector<torch::Tensor> all = model_.parameters();
  for (const torch::Tensor& b : model_.buffers()) all.push_back(b);
  if (const std::vector<int> differ = ctx_.ranksDiffering(digest(all)); !differ.empty()) {
    throw std::runtime_error(lite::StrCat("recovery: rank(s) ", lite::StrJoin(differ, ","),
                                          " hold other parameters than rank 0 after the state "
                                          "transfer from rank ", root, ": not going on with "
                                          "replicas that differ"));
  }
  timing_.check_s = lap();
  st.step = best;
  return st;
}

TrainingState Recovery::receive() {
  if (!replacement_) throw std::logic_error("Recovery::receive() outside a replacement process");
  const auto t0 = std::chrono::steady_clock::now();
  bool loaded = false;
  int root = 0;
  TrainingState st = Transfer(-1, &loaded, &root);
  committed_ = st.step;
  replacement_ = false;
  reportStateFromPeer(st.step, SecondsSince(t0));
  std::fprintf(stderr, "dlrun::worker: rank %d took the state of step %lld from rank %d in %.3f s "
               "(generation %d; receive %.3f s, load %.3f s, check %.3f s)\n", ctx_.rank(),
               static_cast<long long>(st.step), root, SecondsSince(t0),
               detail::CurrentGeneration(), timing_.send_s, timing_.load_s, timing_.check_s);
  return st;
}

void Recovery::Regroup(const detail::Regroup& word) {
  // The old group is left as it is, not destroyed: its threads may still wait on a peer that
  // is gone (until Gloo's own timeout), and destroying it would wait with them.
  (void)ctx_.pg.release();
  (void)ctx_.store.release();
  ctx_.env.master_port = word.master_port;
  if (word.rank >= 0) {  // a node was lost: this rank's new place
    ctx_.env.rank = word.rank;
    ctx_.env.world_size = word.world_size;
    ctx_.env.master_addr = word.master_addr;
  }
  detail::ConnectGroup(ctx_, ctx_.backend, options_.timeout);
  detail::EnterGeneration(word.generation);
}

Recovery::Outcome Recovery::run(const std::function<void()>& body) {
  if (!enabled_) {
    body();
    return {};
  }
  std::exception_ptr error;
  std::string what;
  try {
    body();
    return {};
  } catch (const std::exception& e) {
    error = std::current_exception();
    what = FirstLine(e.what());
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::optional<detail::Regroup> word = detail::AwaitRegroup(options_.word_timeout);
  if (!word) std::rethrow_exception(error);  // not a peer's loss: the error stands
  if (word->world_size > ctx_.worldSize()) {  // a node admitted into the running group
    std::fprintf(stderr,
                 "dlrun::worker: rank %d: a node joined: the group grows to %d ranks (%s); "
                 "joining generation %d\n",
                 ctx_.rank(), word->world_size, what.c_str(), word->generation);
  } else {
    std::fprintf(stderr, "dlrun::worker: rank %d: a peer was lost (%s); joining generation %d\n",
                 ctx_.rank(), what.c_str(), word->generation);
  }
  try {
    Regroup(*word);
    bool loaded = false;
    int root = 0;
    const auto regrouped = std::chrono::steady_clock::now();
    const TrainingState st = Transfer(committed_, &loaded, &root);
    committed_ = st.step;
    const double secs = SecondsSince(t0);
    reportStateFromPeer(st.step, secs);
    if (ctx_.rank() == root) {
      std::fprintf(stderr, "dlrun::worker: rank %d sent the state of step %lld in %.3f s after "
                   "the loss (generation %d; new group %.3f s, serialize %.3f s, send %.3f s, "
                   "check %.3f s)\n", ctx_.rank(), static_cast<long long>(st.step), secs,
                   word->generation, std::chrono::duration<double>(regrouped - t0).count(),
                   timing_.serialize_s, timing_.send_s, timing_.check_s);
    }
    return {true, st.step, word->generation, secs, word->rank >= 0};
  } catch (const std::exception& e) {
    throw std::runtime_error(lite::StrCat("in-process recovery failed (generation ",
                                          word->generation, "): ", FirstLine(e.what())));
  }
}

}  // namespace dlrun::worker
