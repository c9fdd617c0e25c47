// In-process recovery (dlrun/recovery.h): the survivors' regroup, the state transfer from one
// survivor, and the abortable wait the library's collectives use.
#include "dlrun/recovery.h"

#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>

#include "agent_word.h"
#include "state_transfer.h"
#include "step_state.h"
#include "transfer_plan.h"
#include "dlrun/agent_link.h"
#include "worker/src/group.h"
#include "worker/src/text.h"

namespace dlrun::worker {

namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

using detail::CloneInto;
using detail::CopyInto;
using detail::CpuRngDigest;
using detail::SameTensors;
using detail::StepSeed;
using detail::UpdateRaisesVersions;
using detail::Versions;

// NCCL runs a step's collectives on the GPU behind the CPU; Gloo's have ended (or thrown
// PeerLost) when the library's wait returns.
bool CollectivesRunBehind(const Context& ctx) { return ctx.backend == "nccl"; }

}  // namespace

// The group the agent's word aborts: the current generation's, swapped at each regroup.
struct Recovery::AbortTarget {
  std::mutex mu;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;

  void Set(c10::intrusive_ptr<c10d::ProcessGroup> next) {
    std::lock_guard<std::mutex> lock(mu);
    pg = std::move(next);
  }
  // On the words' reader thread, after the word was marked (agent_word.h, SetPeerLossHook).
  void Abort() {
    c10::intrusive_ptr<c10d::ProcessGroup> now;
    {
      std::lock_guard<std::mutex> lock(mu);
      now = pg;
    }
    if (now) detail::AbortGroup(*now);
  }
};

// What a step changed, as it was before (docs/RECOVERY.md, "A step is whole or not at all").
struct Recovery::StepUndo {
  int64_t committed = 0;  // committed_ at the step's start
  int64_t versions = 0;   // Versions() at the start, or at commit()
  // The parameters at the start, or at commit(), where an update does not raise their version
  // counters (UpdateRaisesVersions): one more copy of them; empty otherwise.
  std::vector<torch::Tensor> params_at;
  bool committed_in_step = false;
  std::vector<torch::Tensor> buffers;  // at the start, or at commit()
  std::vector<double> lrs;
  torch::Tensor rng;
  std::optional<TrainingState> trainer;  // hooks.capture() at the start, its tensors copied
  bool settled = false;                  // await_collectives() ran: the step's sums are whole
  bool updated = false;  // update() ran: the parameters and the optimizer before it
  std::vector<torch::Tensor> params;
  detail::OptimizerCopy optimizer;
};

void Recovery::commit(int64_t step) {
  // NCCL, an update of the trainer's own without await_collectives(): the step's sums are checked
  // now; a peer lost meanwhile then refuses the recovery (GiveUp: changed parameters).
  if (undo_ && !undo_->settled) await_collectives();
  // Seeded per rank: each rank's generator as of this step, for a rank that loses its own.
  if (undo_ && rng_per_rank_) rng_table_ = detail::GatherCpuRng(ctx_);
  rng_table_in_step_ = torch::Tensor();
  committed_ = step;
  updates_committed_ = updates_;
  if (undo_) {  // what comes after it in the body is not done again: its changes are checked
    undo_->committed_in_step = true;
    undo_->versions = Versions(model_);
    CloneInto(&undo_->buffers, model_.buffers());
    if (!undo_->params_at.empty()) CloneInto(&undo_->params_at, model_.parameters());
  }
}

TrainingState Recovery::capture_state() const {
  TrainingState st = hooks_.capture ? hooks_.capture() : TrainingState{};
  const torch::Tensor& table = rng_table_in_step_.defined() ? rng_table_in_step_ : rng_table_;
  if (table.defined()) st.tensors["dlrun.rng_table"] = table;  // each rank's own
  return st;
}

void Recovery::restore_state(const TrainingState& state) {
  if (hooks_.restore) hooks_.restore(state);
  const auto table = state.tensors.find("dlrun.rng_table");
  if (table != state.tensors.end()) {
    detail::SetCpuRngFromTable(table->second, ctx_.rank(), ctx_.world_size());
  }
}

bool Recovery::ParametersChanged() const {
  return Versions(model_) != undo_->versions ||
         (!undo_->params_at.empty() && !SameTensors(model_.parameters(), undo_->params_at));
}

void Recovery::await_collectives() {
  if (!enabled_ || !CollectivesRunBehind(ctx_)) return;
  try {
    torch::cuda::synchronize();
  } catch (const std::exception&) {  // a kernel the abort ended: the word tells
    if (!detail::PeerLossAnnounced()) throw;
  }
  if (undo_) undo_->settled = true;
  if (!detail::SettledStepMayApply(true, detail::PeerLossAnnounced(),
                                   detail::GroupFailed(*ctx_.pg))) {
    throw PeerLost(
        "step given up: a peer was lost while its collectives ran, so their sums may "
        "miss it; the update is not applied");
  }
}

void Recovery::update(const UpdateOptions& options) {
  await_collectives();
  if (undo_ && !undo_->updated && !options.ends_step) {
    CloneInto(&undo_->params, model_.parameters());
    detail::CopyOptimizerInto(optimizer_, &undo_->optimizer);
    undo_->updated = true;
  }
  if (options.apply) {
    options.apply();
  } else {
    optimizer_.step();
  }
  ++updates_;
  if (options.ends_step) return commit(running_);
  // Seeded per rank: each rank's generator as of the update too, for a checkpoint the step
  // saves after it (Recoverable::checkpoint_state); commit() gathers them again.
  if (undo_ && rng_per_rank_) rng_table_in_step_ = detail::GatherCpuRng(ctx_);
}

void Recovery::GiveUp() {
  rng_table_in_step_ = torch::Tensor();
  if (!undo_) return;
  StepUndo& u = *undo_;
  const int64_t step = u.committed + 1;
  if (u.committed_in_step) {  // the step counts as done at commit(); only what followed it goes
    if (ParametersChanged()) {
      throw std::runtime_error(lite::StrCat(
          "refused: the parameters changed after commit(", committed_, ") in the same step: that "
          "change cannot be given up (commit() at the step's end, with update() for the update)"));
    }
    CopyInto(model_.buffers(), u.buffers);
    return;
  }
  if (u.updated) {
    if (!u.optimizer.known) {
      throw std::runtime_error(lite::StrCat(
          "refused: a peer was lost after step ", step, "'s update, and this optimizer's kind has "
          "no copy to undo it (Adam, AdamW and SGD have)"));
    }
    CopyInto(model_.parameters(), u.params);
    detail::RestoreOptimizer(optimizer_, u.optimizer);
  } else if (ParametersChanged()) {
    throw std::runtime_error(lite::StrCat(
        "refused: the parameters changed in step ", step, " before the peer's loss, not through "
        "Recovery::update() and not committed: no copy to undo them (update() in place of "
        "optimizer.step(), or commit() right after it)"));
  }
  CopyInto(model_.buffers(), u.buffers);
  if (u.trainer) hooks_.restore(*u.trainer);  // an EMA, the loss scale: as at the start
  for (size_t g = 0; g < optimizer_.param_groups().size() && g < u.lrs.size(); ++g) {
    optimizer_.param_groups()[g].options().set_lr(u.lrs[g]);
  }
  if (u.rng.defined()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(u.rng);
  }
  for (torch::Tensor& p : model_.parameters()) p.mutable_grad() = torch::Tensor();
}

Recovery::Recovery(Context& ctx, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                   RecoveryHooks hooks, RecoveryOptions options)
    : ctx_(ctx), model_(model), optimizer_(optimizer),
      hooks_(detail::WithOptimizers(std::move(hooks))), options_(options) {
  enabled_ = detail::WatchAgentWords();
  // Made at start-up: only a replacement starts in a generation after the first.
  replacement_ = enabled_ && detail::CurrentGeneration() > 0;
  if (enabled_ && CollectivesRunBehind(ctx_)) {
    abort_ = std::make_shared<AbortTarget>();
    abort_->Set(ctx_.pg);
    detail::SetPeerLossHook([target = abort_] { target->Abort(); });
  }
  if (enabled_) declare_in_process_recovery();
  if (enabled_ && !replacement_ && ctx_.world_size() > 1) {  // every first process: one allgather
    rng_at_start_ = CpuRngDigest();
    rng_per_rank_ = !ctx_.ranks_agree(rng_at_start_);
  }
}

Recovery::~Recovery() {
  if (abort_) detail::SetPeerLossHook({});
}

// The transfer's collective plan (one allgather): each rank's last whole step, whether its steps
// drew from a CPU generator seeded per rank, and whether its DDP wrapper broadcasts buffers (-1:
// no wrapper yet, as in a replacement); detail::DecideTransfer throws the refusal of what the
// transfer cannot make exact.
detail::TransferPlan Recovery::PlanTransfer(int64_t my_step) {
  const bool drew_own = rng_per_rank_ && my_step >= 0 && CpuRngDigest() != rng_at_start_;
  const std::optional<bool> broadcasts = detail::BroadcastsBuffers(&model_);
  const std::vector<torch::Tensor> gathered = ctx_.all_gather(torch::tensor(
      {my_step, int64_t{drew_own}, broadcasts ? int64_t{*broadcasts} : -1, updates_committed_,
       int64_t{rng_table_.defined() && rng_table_.size(0) == ctx_.world_size()}},
      torch::kInt64));
  std::vector<detail::TransferRow> rows;
  for (const torch::Tensor& t : gathered) {
    const int64_t* v = t.data_ptr<int64_t>();
    rows.push_back({v[0], v[1] != 0, static_cast<int>(v[2]), v[3], v[4] != 0});
  }
  detail::TransferModel what;
  std::vector<const torch::optim::Optimizer*> all(hooks_.optimizers.begin(), hooks_.optimizers.end());
  all.push_back(&optimizer_);
  what.parameter_outside = detail::FirstParameterOutside(model_, all);
  const auto buffers = model_.named_buffers();
  if (!buffers.is_empty()) what.first_buffer = buffers.begin()->key();
  detail::TransferPlan plan = detail::DecideTransfer(rows, what);
  if (!what.first_buffer.empty() && plan.own_buffers && my_step < plan.best) {
    std::fprintf(stderr, "dlrun::worker: rank %d: the running statistics of its model ('%s'...: "
                 "each rank's own, DDP's broadcast_buffers off) were lost with its process: it "
                 "goes on with rank %d's\n", ctx_.rank(), what.first_buffer.c_str(), plan.root);
  }
  return plan;
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
  const detail::TransferPlan plan = PlanTransfer(my_step);
  const int64_t best = plan.best;
  const int root = plan.root;
  *root_out = root;
  TrainingState st;
  timing_ = {};
  detail::TransferTiming tt;
  *loaded = my_step < best;
  if (ctx_.rank() == root) {
    if (hooks_.capture) st = hooks_.capture();
    if (rng_per_rank_) st.values["dlrun.rng_per_rank"] = true;
    if (rng_table_.defined()) st.tensors["dlrun.rng_table"] = rng_table_;
    st.step = best;
    st.world_size = ctx_.world_size();
    detail::SendState(ctx_, model_, optimizer_, st, plan.behind, &tt);
  } else if (*loaded) {
    st = detail::ReceiveState(ctx_, model_, optimizer_, root, &tt);
    if (hooks_.restore) hooks_.restore(st);
    rng_per_rank_ = st.values.count("dlrun.rng_per_rank") != 0;  // the next commits gather
    const auto table = st.tensors.find("dlrun.rng_table");
    rng_table_ = table == st.tensors.end() ? torch::Tensor() : table->second;
    detail::SetCpuRngFromTable(rng_table_, ctx_.rank(), ctx_.world_size());
  }
  timing_.serialize_s = tt.serialize_s;
  timing_.send_s = tt.send_s;
  timing_.load_s = tt.load_s;
  lap();
  // The parameters, not the buffers: each rank's running statistics take in its own batch
  // after DDP's broadcast of rank 0's, so they differ between ranks at the end of a step.
  if (const std::vector<int> differ = ctx_.ranks_differing(digest(model_.parameters()));
      !differ.empty()) {
    const std::string first = detail::FirstDifferingParameter(ctx_, model_, differ.front());
    throw std::runtime_error(lite::StrCat("recovery: rank(s) ", lite::StrJoin(differ, ","),
                                          " hold other parameters than rank 0 after the state "
                                          "transfer from rank ", root, ", first '", first,
                                          "': not going on with replicas that differ"));
  }
  timing_.check_s = lap();
  st.step = best;
  updates_ = updates_committed_ = plan.updates;
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
  report_state_from_peer(st.step, SecondsSince(t0));
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
  if (abort_) abort_->Set(ctx_.pg);  // the next word aborts this generation's group
  detail::EnterGeneration(word.generation);
}

// The undo record of the step about to run (StepUndo), in the last step's tensors.
void Recovery::BeginStep() {
  auto next = std::make_shared<StepUndo>();
  if (undo_) {  // the last step's copies: copied into, not allocated again (88 MB a step for
    // train_unet's parameters and Adam's moments: fresh pages, faulted in and given back, each step)
    next->params = std::move(undo_->params);
    next->optimizer.tensors = std::move(undo_->optimizer.tensors);
    next->buffers = std::move(undo_->buffers);
    next->params_at = std::move(undo_->params_at);
  }
  undo_ = std::move(next);
  undo_->committed = committed_;
  undo_->versions = Versions(model_);
  bool raise = UpdateRaisesVersions(optimizer_);
  for (const auto* o : hooks_.optimizers) raise = raise && UpdateRaisesVersions(*o);
  if (raise) {
    undo_->params_at.clear();  // empty: the version counters tell (ParametersChanged)
  } else {
    CloneInto(&undo_->params_at, model_.parameters());
  }
  CloneInto(&undo_->buffers, model_.buffers());
  for (const auto& g : optimizer_.param_groups()) undo_->lrs.push_back(g.options().get_lr());
  if (hooks_.capture && hooks_.restore) {  // the trainer's own state, as of the last commit
    undo_->trainer = hooks_.capture();
    for (auto& [name, t] : undo_->trainer->tensors) t = t.detach().clone();
  }
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    undo_->rng = gen.get_state();
  }
}

Recovery::Outcome Recovery::run(const std::function<void()>& body) {
  // A checkpoint resume since the last step: the recovery goes on from its step (the trainer
  // need not commit(step) after it).
  if (const int64_t resumed = detail::TakeResumedStep(); resumed >= 0) committed_ = resumed;
  running_ = committed_ + 1;
  updates_ = updates_committed_;  // a step given up: its update is not counted
  if (options_.seed_per_rank) {  // this rank's randomness of the step, whoever runs it
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(StepSeed(*options_.seed_per_rank, committed_ + 1, ctx_.rank()));
  }
  if (!enabled_) {
    body();
    return {};
  }
  BeginStep();
  std::exception_ptr error;
  std::string what;
  try {
    body();
    undo_.reset();
    return {};
  } catch (const std::exception& e) {
    error = std::current_exception();
    what = FirstLine(e.what());
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::optional<detail::Regroup> word = detail::AwaitRegroup(options_.word_timeout);
  if (!word) std::rethrow_exception(error);  // not a peer's loss: the error stands
  if (word->world_size > ctx_.world_size()) {  // a node admitted into the running group
    std::fprintf(stderr,
                 "dlrun::worker: rank %d: a node joined: the group grows to %d ranks (%s); "
                 "joining generation %d\n",
                 ctx_.rank(), word->world_size, what.c_str(), word->generation);
  } else {
    std::fprintf(stderr, "dlrun::worker: rank %d: a peer was lost (%s); joining generation %d\n",
                 ctx_.rank(), what.c_str(), word->generation);
  }
  try {
    GiveUp();
    undo_.reset();
    Regroup(*word);
    bool loaded = false;
    int root = 0;
    const auto regrouped = std::chrono::steady_clock::now();
    const TrainingState st = Transfer(committed_, &loaded, &root);
    committed_ = st.step;
    const double secs = SecondsSince(t0);
    report_state_from_peer(st.step, secs);
    if (ctx_.rank() == root) {
      std::fprintf(stderr, "dlrun::worker: rank %d sent the state of step %lld in %.3f s after "
                   "the loss (generation %d; new group %.3f s, serialize %.3f s, send %.3f s, "
                   "check %.3f s)\n", ctx_.rank(), static_cast<long long>(st.step), secs,
                   word->generation, std::chrono::duration<double>(regrouped - t0).count(),
                   timing_.serialize_s, timing_.send_s, timing_.check_s);
    }
    return {true, st.step, word->generation, secs, word->rank >= 0};
  } catch (const std::exception& e) {
    const std::string why = FirstLine(e.what());
    // A rule's refusal: the agent restarts from the checkpoint, not counted as a failure.
    if (why.rfind("refused: ", 0) == 0) detail::RecordRefusal(why.substr(9));
    throw std::runtime_error(lite::StrCat("in-process recovery failed (generation ",
                                          word->generation, "): ", why));
  }
}

}  // namespace dlrun::worker
