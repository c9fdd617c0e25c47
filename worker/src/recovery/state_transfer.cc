#include "state_transfer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <set>
#include <sstream>

#include "worker/src/checkpoint_bytes.h"
#include "worker/src/text.h"

namespace dlrun::worker::detail {
namespace {

constexpr int kTag = 0x5eed;
enum Kind : int64_t { kNone = 0, kAdam = 1, kAdamW = 2, kSgd = 3 };

double Since(std::chrono::steady_clock::time_point* t) {
  const auto now = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(now - *t).count();
  *t = now;
  return s;
}

// The optimizer's parameters in a fixed order (groups, then their parameters).
std::vector<torch::Tensor> OptimizerParams(const torch::optim::Optimizer& o) {
  std::vector<torch::Tensor> ps;
  for (const auto& g : o.param_groups()) {
    for (const torch::Tensor& p : g.params()) ps.push_back(p);
  }
  return ps;
}

// The state tensors of the optimizer's parameters in order, and per parameter (kind, step,
// whether its optional tensor is there). False when a state is of a kind not known here.
bool OptimizerTensors(const torch::optim::Optimizer& o, std::vector<torch::Tensor>* tensors,
                      std::vector<int64_t>* layout) {
  for (const torch::Tensor& p : OptimizerParams(o)) {
    auto it = o.state().find(p.unsafeGetTensorImpl());
    if (it == o.state().end()) {
      layout->insert(layout->end(), {kNone, 0, 0});
      continue;
    }
    auto adam_like = [&](auto* s, Kind kind) {
      const bool max = s->max_exp_avg_sq().defined();
      layout->insert(layout->end(), {kind, s->step(), max ? 1 : 0});
      tensors->push_back(s->exp_avg());
      tensors->push_back(s->exp_avg_sq());
      if (max) tensors->push_back(s->max_exp_avg_sq());
    };
    if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
      adam_like(a, kAdam);
    } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
      adam_like(w, kAdamW);
    } else if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
      const bool m = s->momentum_buffer().defined();
      layout->insert(layout->end(), {kSgd, 0, m ? 1 : 0});
      if (m) tensors->push_back(s->momentum_buffer());
    } else {
      return false;
    }
  }
  return true;
}

// A fresh state per `layout` (zeros, to be received into), replacing what the optimizer had.
void PrimeOptimizer(torch::optim::Optimizer& o, const std::vector<int64_t>& layout) {
  const std::vector<torch::Tensor> ps = OptimizerParams(o);
  if (layout.size() != 3 * ps.size()) {
    throw std::runtime_error(lite::StrCat("recovery: the sender's optimizer has ",
                                          layout.size() / 3, " parameters, this one ", ps.size()));
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    const int64_t kind = layout[3 * i], step = layout[3 * i + 1];
    const bool extra = layout[3 * i + 2] != 0;
    void* key = ps[i].unsafeGetTensorImpl();
    auto zeros = [&] { return torch::zeros_like(ps[i], torch::MemoryFormat::Preserve); };
    auto adam_like = [&](auto s) {
      s->step(step);
      s->exp_avg(zeros());
      s->exp_avg_sq(zeros());
      if (extra) s->max_exp_avg_sq(zeros());
      o.state()[key] = std::move(s);
    };
    if (kind == kNone) {
      o.state().erase(key);
    } else if (kind == kAdam) {
      adam_like(std::make_unique<torch::optim::AdamParamState>());
    } else if (kind == kAdamW) {
      adam_like(std::make_unique<torch::optim::AdamWParamState>());
    } else if (kind == kSgd) {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      if (extra) s->momentum_buffer(zeros());
      o.state()[key] = std::move(s);
    } else {
      throw std::runtime_error(lite::StrCat("recovery: unknown optimizer state kind ", kind));
    }
  }
}

// What the transfer moves as raw tensors: parameters, buffers, then the optimizer's state.
std::vector<torch::Tensor> ModelTensors(const torch::nn::Module& model) {
  std::vector<torch::Tensor> v = model.parameters();
  for (const torch::Tensor& b : model.buffers()) v.push_back(b);
  return v;
}

void SendBytes(const Context& ctx, const std::string& bytes, const std::vector<int>& to, int tag,
               std::vector<c10::intrusive_ptr<c10d::Work>>* sends, std::vector<torch::Tensor>* keep) {
  keep->push_back(torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64));
  keep->push_back(torch::from_blob(const_cast<char*>(bytes.data()),
                                   {static_cast<int64_t>(bytes.size())}, torch::kUInt8));
  for (int r : to) {
    std::vector<torch::Tensor> a{(*keep)[keep->size() - 2]}, b{keep->back()};
    sends->push_back(ctx.pg->send(a, r, tag));
    sends->push_back(ctx.pg->send(b, r, tag + 1));
  }
}

std::string RecvBytes(const Context& ctx, int root, int tag) {
  std::vector<torch::Tensor> size{torch::zeros({1}, torch::kInt64)};
  ctx.pg->recv(size, root, tag)->wait();  // bounded by the group's timeout
  std::string data(static_cast<size_t>(size[0].item<int64_t>()), '\0');
  std::vector<torch::Tensor> bytes{
      torch::from_blob(data.data(), {static_cast<int64_t>(data.size())}, torch::kUInt8)};
  ctx.pg->recv(bytes, root, tag + 1)->wait();
  return data;
}

}  // namespace

void CopyOptimizerInto(const torch::optim::Optimizer& optimizer, OptimizerCopy* copy) {
  std::vector<torch::Tensor> live;
  copy->layout.clear();
  copy->known = OptimizerTensors(optimizer, &live, &copy->layout);
  CloneInto(&copy->tensors, live);
}

void CloneInto(std::vector<torch::Tensor>* to, const std::vector<torch::Tensor>& from) {
  bool same = to->size() == from.size();
  for (size_t i = 0; same && i < from.size(); ++i) {
    const torch::Tensor& a = (*to)[i];
    same = a.defined() && from[i].defined() && a.sizes() == from[i].sizes() &&
           a.dtype() == from[i].dtype() && a.device() == from[i].device();
  }
  if (!same) {
    to->clear();
    for (const torch::Tensor& t : from) to->push_back(t.defined() ? t.detach().clone() : t);
    return;
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < from.size(); ++i) (*to)[i].copy_(from[i].detach());
}

void RestoreOptimizer(torch::optim::Optimizer& optimizer, const OptimizerCopy& copy) {
  PrimeOptimizer(optimizer, copy.layout);
  std::vector<torch::Tensor> live;
  std::vector<int64_t> unused;
  OptimizerTensors(optimizer, &live, &unused);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < live.size() && i < copy.tensors.size(); ++i) live[i].copy_(copy.tensors[i]);
}

void CaptureOptimizers(const std::vector<torch::optim::Optimizer*>& optimizers, TrainingState* state) {
  for (size_t i = 0; i < optimizers.size(); ++i) {
    const torch::optim::Optimizer& o = *optimizers[i];
    const std::string key = lite::StrCat("dlrun.optimizer.", i + 1, ".");
    std::vector<torch::Tensor> tensors;
    std::vector<int64_t> layout;
    if (OptimizerTensors(o, &tensors, &layout)) {
      state->tensors[key + "layout"] = torch::tensor(layout, torch::kInt64);
      for (size_t t = 0; t < tensors.size(); ++t) state->tensors[lite::StrCat(key, t)] = tensors[t];
    } else {  // a kind not known here: its archive, whole
      torch::serialize::OutputArchive archive;
      o.save(archive);
      std::ostringstream bytes;
      archive.save_to(bytes);
      const std::string b = bytes.str();
      state->tensors[key + "archive"] =
          torch::from_blob(const_cast<char*>(b.data()), {static_cast<int64_t>(b.size())},
                           torch::kUInt8).clone();
    }
    std::vector<double> lrs;
    for (const auto& g : o.param_groups()) lrs.push_back(g.options().get_lr());
    state->tensors[key + "lr"] = torch::tensor(lrs, torch::kFloat64);
  }
}

void RestoreOptimizers(const std::vector<torch::optim::Optimizer*>& optimizers,
                       const TrainingState& state) {
  for (size_t i = 0; i < optimizers.size(); ++i) {
    torch::optim::Optimizer& o = *optimizers[i];
    const std::string key = lite::StrCat("dlrun.optimizer.", i + 1, ".");
    const auto& ts = state.tensors;
    const auto lr = ts.find(key + "lr");
    if (lr == ts.end()) {
      throw std::runtime_error(lite::StrCat(
          "the state of step ", state.step, " holds none of optimizer ", i + 1, "'s (written "
          "without it: one optimizer given where the trainer has ", optimizers.size() + 1, ")"));
    }
    if (const auto a = ts.find(key + "archive"); a != ts.end()) {
      torch::serialize::InputArchive archive;
      const torch::Tensor b = a->second.contiguous();
      archive.load_from(reinterpret_cast<const char*>(b.data_ptr<uint8_t>()),
                        static_cast<size_t>(b.numel()));
      o.load(archive);
    } else {
      OptimizerCopy copy;
      const torch::Tensor layout = ts.at(key + "layout").contiguous();
      copy.layout.assign(layout.data_ptr<int64_t>(), layout.data_ptr<int64_t>() + layout.numel());
      for (size_t t = 0; ts.count(lite::StrCat(key, t)); ++t) {
        copy.tensors.push_back(ts.at(lite::StrCat(key, t)));
      }
      std::vector<torch::Tensor> live;
      std::vector<int64_t> unused;
      PrimeOptimizer(o, copy.layout);
      OptimizerTensors(o, &live, &unused);
      if (live.size() != copy.tensors.size()) {
        throw std::runtime_error(lite::StrCat("the state of optimizer ", i + 1, " holds ",
                                              copy.tensors.size(), " tensors, this one has ",
                                              live.size()));
      }
      RestoreOptimizer(o, copy);
    }
    const torch::Tensor lrs = lr->second;
    for (size_t g = 0; g < o.param_groups().size() && g < static_cast<size_t>(lrs.numel()); ++g) {
      o.param_groups()[g].options().set_lr(lrs[static_cast<int64_t>(g)].item<double>());
    }
  }
}

RecoveryHooks WithOptimizers(RecoveryHooks hooks) {
  if (hooks.optimizers.empty()) return hooks;
  RecoveryHooks out = hooks;
  out.capture = [hooks] {
    TrainingState st = hooks.capture ? hooks.capture() : TrainingState{};
    CaptureOptimizers(hooks.optimizers, &st);
    return st;
  };
  out.restore = [hooks](const TrainingState& st) {
    if (hooks.restore) hooks.restore(st);
    RestoreOptimizers(hooks.optimizers, st);
  };
  return out;
}

std::string FirstParameterOutside(const torch::nn::Module& model,
                                  const std::vector<const torch::optim::Optimizer*>& optimizers) {
  std::set<const void*> in;
  for (const torch::optim::Optimizer* o : optimizers) {
    for (const torch::Tensor& p : OptimizerParams(*o)) in.insert(p.unsafeGetTensorImpl());
  }
  for (const auto& item : model.named_parameters()) {
    if (item.value().requires_grad() && !in.count(item.value().unsafeGetTensorImpl())) {
      return item.key();
    }
  }
  return "";
}

void SendState(const Context& ctx, const torch::nn::Module& model,
               const torch::optim::Optimizer& optimizer, const TrainingState& state,
               const std::vector<int>& to, TransferTiming* timing) {
  auto t = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> tensors = ModelTensors(model);
  std::vector<int64_t> layout;
  const bool raw = OptimizerTensors(optimizer, &tensors, &layout);
  std::vector<int64_t> numels{raw ? 1 : 0};  // [raw?, numel of each raw tensor...]
  for (const torch::Tensor& x : tensors) numels.push_back(raw ? x.numel() : 0);
  TrainingState st = state;
  st.tensors["dlrun.layout"] = torch::tensor(layout, torch::kInt64);
  st.tensors["dlrun.numels"] = torch::tensor(numels, torch::kInt64);
  std::vector<double> lrs;
  for (const auto& g : optimizer.param_groups()) lrs.push_back(g.options().get_lr());
  st.tensors["dlrun.lrs"] = torch::tensor(lrs, torch::kDouble);
  const std::string meta = TrainingStateBytes(st);
  const std::string whole = raw ? std::string() : CheckpointBytes(model, optimizer, state);
  timing->serialize_s = Since(&t);
  std::vector<c10::intrusive_ptr<c10d::Work>> sends;
  std::vector<torch::Tensor> keep;
  SendBytes(ctx, meta, to, kTag, &sends, &keep);
  if (!raw) SendBytes(ctx, whole, to, kTag + 2, &sends, &keep);
  for (int r : to) {
    for (size_t i = 0; raw && i < tensors.size(); ++i) {
      std::vector<torch::Tensor> one{tensors[i].is_contiguous() ? tensors[i] : tensors[i].contiguous()};
      keep.push_back(one[0]);
      sends.push_back(ctx.pg->send(one, r, kTag + 4));
    }
  }
  for (auto& w : sends) w->wait();
  timing->send_s = Since(&t);
}

TrainingState ReceiveState(const Context& ctx, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, int root, TransferTiming* timing) {
  auto t = std::chrono::steady_clock::now();
  TrainingState st = TrainingStateFromBytes(RecvBytes(ctx, root, kTag));  // the CPU RNG too
  const torch::Tensor layout_t = st.tensors.at("dlrun.layout"), numels_t = st.tensors.at("dlrun.numels");
  const torch::Tensor lrs = st.tensors.at("dlrun.lrs");
  for (const char* k : {"dlrun.layout", "dlrun.numels", "dlrun.lrs"}) st.tensors.erase(k);
  const std::vector<int64_t> numels(numels_t.data_ptr<int64_t>(),
                                    numels_t.data_ptr<int64_t>() + numels_t.numel());
  if (numels.empty() || numels[0] == 0) {  // an optimizer of another kind: the whole checkpoint
    const std::string data = RecvBytes(ctx, root, kTag + 2);
    timing->send_s = Since(&t);
    if (const std::string problem = CheckpointBytesProblem(data); !problem.empty()) {
      throw std::runtime_error(lite::StrCat("recovery: the state from rank ", root,
                                            " arrived damaged: ", problem));
    }
    LoadCheckpointBytesInPlace(data, model, optimizer, &st);
    timing->load_s = Since(&t);
    return st;
  }
  PrimeOptimizer(optimizer, std::vector<int64_t>(layout_t.data_ptr<int64_t>(),
                                                 layout_t.data_ptr<int64_t>() + layout_t.numel()));
  std::vector<torch::Tensor> tensors = ModelTensors(model);
  std::vector<int64_t> unused;
  OptimizerTensors(optimizer, &tensors, &unused);
  bool fits = tensors.size() + 1 == numels.size();
  for (size_t i = 0; fits && i < tensors.size(); ++i) fits = tensors[i].numel() == numels[i + 1];
  if (!fits) {  // the sender's sends then fail as this process exits: the ordinary restart
    throw std::runtime_error(lite::StrCat("recovery: the state from rank ", root, " has ",
                                          numels.size() - 1, " tensors, this model and optimizer ",
                                          tensors.size(), " (or their sizes differ)"));
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const bool direct = tensors[i].is_contiguous();
    std::vector<torch::Tensor> one{
        direct ? tensors[i] : torch::empty_like(tensors[i], torch::MemoryFormat::Contiguous)};
    ctx.pg->recv(one, root, kTag + 4)->wait();
    if (!direct) tensors[i].copy_(one[0]);
  }
  timing->send_s = Since(&t);
  for (size_t g = 0; g < optimizer.param_groups().size() && g < static_cast<size_t>(lrs.numel()); ++g) {
    optimizer.param_groups()[g].options().set_lr(lrs[static_cast<int64_t>(g)].item<double>());
  }
  timing->load_s = Since(&t);
  return st;
}

std::string FirstDifferingParameter(const Context& ctx, const torch::nn::Module& model, int other) {
  std::vector<int64_t> mine;
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) {
    names.push_back(item.key());
    mine.push_back(static_cast<int64_t>(digest({item.value()})));
  }
  const std::vector<torch::Tensor> all = ctx.all_gather(torch::tensor(mine, torch::kInt64));
  const torch::Tensor theirs = all[static_cast<size_t>(other)], first = all[0];
  for (int64_t i = 0; i < theirs.numel() && i < first.numel(); ++i) {
    if (theirs[i].item<int64_t>() != first[i].item<int64_t>()) return names[static_cast<size_t>(i)];
  }
  return "";
}

}  // namespace dlrun::worker::detail
