#include "dlrun/checkpoint.h"
#include "checkpoint_bytes.h"
#include "checkpoint_file.h"

#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "text.h"
#include "dlrun/agent_link.h"
#include "dlrun/nvtx_ranges.h"
#include "dlrun/dist_env.h"
#include "dlrun/worker.h"
#include "group.h"

namespace dlrun::worker {
namespace {

// Copies the archive's values into the module's own parameters and buffers (recursively), as
// load_state_dict does: the tensors keep their identity, gradient accumulators and hooks.
// With apply false, only reads and checks.
void LoadInPlace(torch::nn::Module& m, torch::serialize::InputArchive& a, const std::string& prefix,
                 bool apply) {
  auto copy_into = [&](const std::string& key, torch::Tensor& dst, bool is_buffer) {
    if (!dst.defined()) return;
    torch::Tensor src;  // undefined: read() assigns instead of set_()
    a.read(key, src, is_buffer);
    if (src.sizes() != dst.sizes()) {
      throw std::runtime_error(lite::StrCat(prefix, key, " has shape ", c10::str(src.sizes()),
                                            " in the checkpoint, ", c10::str(dst.sizes()),
                                            " in the model"));
    }
    if (apply) dst.copy_(src);
  };
  for (auto& p : m.named_parameters(/*recurse=*/false)) copy_into(p.key(), p.value(), false);
  for (auto& b : m.named_buffers(/*recurse=*/false)) copy_into(b.key(), b.value(), true);
  for (auto& c : m.named_children()) {
    torch::serialize::InputArchive child;
    a.read(c.key(), child);
    LoadInPlace(*c.value(), child, lite::StrCat(prefix, c.key(), "."), apply);
  }
}

}  // namespace

CheckpointManager::CheckpointManager(CheckpointOptions options) : o_(std::move(options)) {}

bool CheckpointManager::holds(int64_t step) const {
  std::error_code ec;
  return std::filesystem::exists(lite::StrCat(o_.dir, "/", detail::CheckpointFileName(step)), ec);
}

std::vector<std::string> CheckpointManager::list() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(o_.dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && name.size() > 6 &&
        name.compare(name.size() - 6, 6, ".dlrun") == 0) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.rbegin(), out.rend());  // zero-padded step numbers: newest first
  return out;
}

namespace {

// The training state and the CPU RNG.
void WriteTrainingState(torch::serialize::OutputArchive& archive, const TrainingState& state) {
  archive.write("step", torch::tensor({state.step}));
  archive.write("epoch", torch::tensor({state.epoch}));
  archive.write("sampler_epoch", torch::tensor({state.sampler_epoch}));
  archive.write("epoch_position", torch::tensor({state.epoch_position}));
  archive.write("world_size", torch::tensor({static_cast<int64_t>(state.world_size)}));
  torch::serialize::OutputArchive tensors_archive, values_archive;
  for (const auto& [name, t] : state.tensors) tensors_archive.write(name, t);
  for (const auto& [name, v] : state.values) values_archive.write(name, v);
  archive.write("tensors", tensors_archive);
  archive.write("values", values_archive);
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    archive.write("rng", gen.get_state());
  }
}

// The checkpoint's payload: the model, the optimizer, the training state and the CPU RNG.
std::string SerializeCheckpoint(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                                const TrainingState& state) {
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model_archive, optim_archive;
  model.save(model_archive);
  optimizer.save(optim_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optim_archive);
  WriteTrainingState(archive, state);
  std::ostringstream payload_stream;
  archive.save_to(payload_stream);
  return payload_stream.str();
}

// The step, epoch, sampler position, the trainer's tensors and values, and the CPU RNG.
void ReadTrainingState(torch::serialize::InputArchive& archive, TrainingState* st) {
  auto read_int = [&](const char* key) {
    torch::Tensor v;  // a fresh tensor: read() into a defined one would set_() it
    archive.read(key, v);
    return v.item<int64_t>();
  };
  st->step = read_int("step");
  st->epoch = read_int("epoch");
  st->sampler_epoch = read_int("sampler_epoch");
  torch::Tensor position;
  if (archive.try_read("epoch_position", position)) st->epoch_position = position.item<int64_t>();
  torch::Tensor world;
  if (archive.try_read("world_size", world)) st->world_size = static_cast<int>(world.item<int64_t>());
  torch::serialize::InputArchive tensors_archive, values_archive;
  if (archive.try_read("tensors", tensors_archive)) {
    for (const std::string& key : tensors_archive.keys()) {
      torch::Tensor t;
      tensors_archive.read(key, t);
      st->tensors[key] = t;
    }
  }
  if (archive.try_read("values", values_archive)) {
    for (const std::string& key : values_archive.keys()) {
      c10::IValue v;
      values_archive.read(key, v);
      st->values[key] = v;
    }
  }
  torch::Tensor t;
  archive.read("rng", t);
  t = t.to(torch::kCPU);
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(t);
}

// A checkpoint file's bytes (CheckpointFileProblem found none) into the model and optimizer in
// place, and its training state into `st`. Throws when they are another model's, leaving the model as it
// was: every parameter and buffer is read and its shape checked before anything changes.
void LoadCheckpointBytes(const std::string& data, torch::nn::Module& model,
                         torch::optim::Optimizer& optimizer, TrainingState* st) {
  torch::serialize::InputArchive archive;
  std::istringstream payload(detail::CheckpointPayload(data));
  // Onto the model's device (a checkpoint written on one GPU loads on another, or the CPU).
  std::vector<torch::Tensor> mp = model.parameters();
  archive.load_from(payload, mp.empty() ? torch::Device(torch::kCPU) : mp[0].device());
  torch::serialize::InputArchive model_archive, optim_archive;
  archive.read("model", model_archive);
  archive.read("optimizer", optim_archive);
  LoadInPlace(model, model_archive, "", /*apply=*/false);
  optimizer.load(optim_archive);
  {
    torch::NoGradGuard no_grad;
    LoadInPlace(model, model_archive, "", /*apply=*/true);
  }
  ReadTrainingState(archive, st);
}

// A checkpoint written at another world size: its position in the epoch (this rank's samples
// of an interleaved split) converted through the global count, or a refusal when it does not
// divide (TrainingState::world_size).
void ConvertPosition(TrainingState* st, int world,
                     const std::function<void(const std::string&)>& warn) {
  if (st->world_size <= 0 || st->world_size == world) return;
  const int64_t global = st->epoch_position * st->world_size;
  if (global % world != 0) {
    throw std::runtime_error(lite::StrCat(
        "checkpoint of step ", st->step, " was written at world size ", st->world_size,
        " with ", st->epoch_position, " samples per rank into the epoch (", global,
        " in all), which does not split over ", world,
        " ranks: resume at a world size that divides it, or from a checkpoint at an epoch's start"));
  }
  warn(lite::StrCat("checkpoint of step ", st->step, " was written at world size ", st->world_size,
                    ", this run has ", world, ": the position in the epoch, ", st->epoch_position,
                    " samples per rank there, is ", global / world, " per rank here (", global,
                    " in all)"));
  st->epoch_position = global / world;
  st->world_size = world;
}

// Where a resume's warnings go: the caller's function, else stderr.
using Warn = std::function<void(const std::string&)>;
Warn WarnTo(const Warn& to) {
  if (to) return to;
  return [](const std::string& w) {
    std::fprintf(stderr, "dlrun::worker: warning: %s\n", w.c_str());
  };
}

}  // namespace

namespace detail {

std::string CheckpointBytes(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                            const TrainingState& state) {
  const std::string payload = SerializeCheckpoint(model, optimizer, state);
  return CheckpointHeader(payload) + payload;
}

std::string CheckpointBytesProblem(const std::string& data) { return CheckpointFileProblem(data); }

void LoadCheckpointBytesInPlace(const std::string& data, torch::nn::Module& model,
                                torch::optim::Optimizer& optimizer, TrainingState* st) {
  LoadCheckpointBytes(data, model, optimizer, st);
}

std::string TrainingStateBytes(const TrainingState& state) {
  torch::serialize::OutputArchive archive;
  WriteTrainingState(archive, state);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

TrainingState TrainingStateFromBytes(const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in, torch::Device(torch::kCPU));
  TrainingState st;
  ReadTrainingState(archive, &st);
  return st;
}

}  // namespace detail

void CheckpointManager::save(const torch::nn::Module& model,
                             const torch::optim::Optimizer& optimizer,
                             const TrainingState& state) {
  if (o_.dir.empty()) throw std::runtime_error("checkpoint: CheckpointOptions::dir is empty");
  ScopedRange range("checkpoint save", state.step);
  std::error_code ec;
  std::filesystem::create_directories(o_.dir, ec);
  if (ec) throw std::runtime_error(lite::StrCat("checkpoint: cannot create ", o_.dir, ": ", ec.message()));

  const std::string payload = SerializeCheckpoint(model, optimizer, state);
  const std::string header = detail::CheckpointHeader(payload);

  const std::string final_path = lite::StrCat(o_.dir, "/", detail::CheckpointFileName(state.step));
  const std::string tmp =
      lite::StrCat(o_.dir, "/.tmp-", detail::CheckpointFileName(state.step), "-", getpid());
  detail::WriteThenRename(header, payload, tmp, final_path);
  detail::SyncDirectory(o_.dir);  // the rename is durable only once the directory is synced
  // Keep the newest keep_last; clear temp files of writers that died.
  std::vector<std::string> all = list();
  for (size_t i = static_cast<size_t>(std::max(1, o_.keep_last)); i < all.size(); ++i) {
    std::filesystem::remove(all[i], ec);
  }
  for (const auto& e : std::filesystem::directory_iterator(o_.dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-ckpt-", 0) == 0 && e.path().string() != tmp) {
      std::filesystem::remove(e.path(), ec);
    }
  }
}

std::optional<TrainingState> CheckpointManager::resume_latest(
    torch::nn::Module& model, torch::optim::Optimizer& optimizer,
    const std::function<void(const std::string&)>& warn_to) {
  int world = 1;
  try {
    world = parse_dist_env(process_environment()).world_size;
  } catch (const std::exception&) {  // no job's environment (or a broken one): one process
  }
  if (world > 1) {
    throw std::logic_error(lite::StrCat(
        "CheckpointManager::resume_latest(model, optimizer) in a job of ", world, " ranks: each "
        "rank would resume from its own directory alone (node-local ones differ, and the ranks "
        "then train out of step); call resume_latest(model, optimizer, ctx) on every rank"));
  }
  ScopedRange range("checkpoint load");
  const auto warn = WarnTo(warn_to);
  const auto load_start = std::chrono::steady_clock::now();
  for (const std::string& path : list()) {
    std::string data = detail::ReadWholeFile(path);
    const std::string problem = detail::CheckpointFileProblem(data);
    if (!problem.empty()) {
      warn(lite::StrCat("checkpoint ", path, " skipped: ", problem));
      continue;
    }
    TrainingState st;
    try {
      LoadCheckpointBytes(data, model, optimizer, &st);
    } catch (const std::exception& e) {
      std::string what = e.what();
      warn(lite::StrCat("checkpoint ", path, " skipped: it does not match this model (",
                        what.substr(0, what.find('\n')), ")"));
      continue;
    }
    // For the agent's restart ledger: what this attempt resumed from, and what it cost.
    report_resume(st.step, std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                        load_start).count());
    detail::NoteResumedStep(st.step);  // a Recovery goes on from it
    return st;
  }
  return std::nullopt;
}

std::optional<TrainingState> CheckpointManager::resume_latest(
    torch::nn::Module& model, torch::optim::Optimizer& optimizer, const Context& ctx,
    const ResumeOptions& options, const std::function<void(const std::string&)>& warn_to) {
  ScopedRange range("checkpoint load");
  const auto warn = WarnTo(warn_to);
  const auto load_start = std::chrono::steady_clock::now();
  // This rank's newest intact file, if any (its directory may be node-local, or empty).
  std::string mine;
  int64_t my_step = -1;
  for (const std::string& path : list()) {
    std::string data = detail::ReadWholeFile(path);
    if (const std::string problem = detail::CheckpointFileProblem(data); !problem.empty()) {
      warn(lite::StrCat("checkpoint ", path, " skipped: ", problem));
      continue;
    }
    mine = std::move(data);
    my_step = detail::StepOfCheckpointFile(path);
    break;
  }
  // The newest step any rank holds, and the lowest rank holding it sends it.
  const int64_t best =
      ctx.all_reduce(torch::tensor({my_step}, torch::kInt64), c10d::ReduceOp::MAX).item<int64_t>();
  if (best < 0) {
    if (options.strict) {
      throw std::runtime_error(lite::StrCat("checkpoint: no rank has a usable checkpoint in ",
                                            o_.dir, " (strict resume)"));
    }
    return std::nullopt;
  }
  const int64_t root = ctx.all_reduce(torch::tensor({my_step == best ? ctx.rank() : ctx.world_size()},
                                                   torch::kInt64),
                                     c10d::ReduceOp::MIN)
                           .item<int64_t>();
  const int64_t size =
      ctx.broadcast(torch::tensor({static_cast<int64_t>(mine.size())}, torch::kInt64),
                    static_cast<int>(root))
          .item<int64_t>();
  torch::Tensor bytes = torch::empty({size}, torch::kUInt8);
  if (ctx.rank() == root) std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  ctx.broadcast(bytes, static_cast<int>(root));
  const std::string data(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(size));
  if (const std::string problem = detail::CheckpointFileProblem(data); !problem.empty()) {
    throw std::runtime_error(lite::StrCat("checkpoint of step ", best, " from rank ", root,
                                          " arrived damaged: ", problem));
  }
  TrainingState st;
  try {
    LoadCheckpointBytes(data, model, optimizer, &st);
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw std::runtime_error(lite::StrCat("checkpoint of step ", best, " from rank ", root,
                                          " does not match this model (",
                                          what.substr(0, what.find('\n')), ")"));
  }
  if (const std::vector<int> differ = ctx.ranks_differing(digest(model.parameters()));
      !differ.empty()) {
    throw std::runtime_error(lite::StrCat("checkpoint of step ", best, ": rank(s) ",
                                          lite::StrJoin(differ, ","),
                                          " hold other parameters than rank 0 after the resume"));
  }
  ConvertPosition(&st, ctx.world_size(), warn);
  if (my_step != best) {
    warn(lite::StrCat("resumed from step ", best, " sent by rank ", root, " (",
                      my_step < 0 ? std::string("no checkpoint here")
                                  : lite::StrCat("the newest here was step ", my_step),
                      ")"));
  }
  report_resume(st.step, std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                      load_start).count());
  detail::NoteResumedStep(st.step);  // a Recovery goes on from it
  return st;
}

}  // namespace dlrun::worker
