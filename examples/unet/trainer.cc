// The train_unet program: the SC22 tutorial's U-Net trainer on LibTorch + dlrun::worker.
#include "unet/trainer_impl.h"

namespace train_unet_internal {

// The tutorial's loss: L1, plus lambda_rho x L1 of exp(14 x) on channel 0 (the density), which
// weights the dense regions.
torch::Tensor Loss(const torch::Tensor& gen, const torch::Tensor& tar, double lambda_rho) {
  torch::Tensor loss = torch::l1_loss(gen, tar);
  if (lambda_rho > 0) {
    loss = loss + lambda_rho * torch::l1_loss(torch::exp(14 * gen.select(1, 0)),
                                              torch::exp(14 * tar.select(1, 0)));
  }
  return loss;
}

// SIGUSR1 (e.g. Slurm's --signal=USR1@90 before preemption, forwarded by dlrun): checkpoint at
// the end of the current step.
std::atomic<bool> g_checkpoint_requested{false};
void OnSigusr1(int) { g_checkpoint_requested = true; }

// This process replaces a lost rank (contract::kRecoveryGen: a generation after the first).
bool IsReplacement() {
  const char* gen = std::getenv(dlrun::contract::kRecoveryGen);
  return gen != nullptr && std::atoi(gen) > 0;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Seconds since this process started (its exec, before LibTorch was loaded), from
// /proc/self/stat's start time in clock ticks since boot; -1 if unknown.
double SecondsSinceProcessStart() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return -1;
  std::istringstream fields(stat.substr(paren + 2));
  std::string f;
  for (int i = 3; i < 22 && fields >> f; ++i) {
  }
  unsigned long long start_ticks = 0;
  if (!(fields >> start_ticks)) return -1;
  timespec now{};
  clock_gettime(CLOCK_BOOTTIME, &now);
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9 -
         static_cast<double>(start_ticks) / ticks;
}

// This process' peak resident memory (VmHWM), bytes; 0 when unreadable.
int64_t PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}


void Trainer::ResolveSizes() {
  rank_ = ctx_.rank();
  world_ = ctx_.world_size();
  if (a_.global_batch_size > 0 && !a_.local_batch_given) {
    if (a_.global_batch_size % world_ != 0) {
      throw std::runtime_error(lite::StrCat("global_batch_size ", a_.global_batch_size,
                                            " does not split over ", world_,
                                            " ranks: expected a multiple of the world size"));
    }
    a_.local_batch_size = a_.global_batch_size / world_;
  }
  // The global (effective) batch of one optimizer step: K micro-batches on every rank. The LR
  // scaling, the epochs and samples/s count it.
  sizes_.global_batch = a_.local_batch_size * world_ * a_.accumulation_steps;
  // Epochs as in the tutorial: Nsamples per epoch over the global batch; without a config an
  // epoch is --max-steps steps (the whole run unless --num-epochs says more).
  sizes_.steps_per_epoch =
      a_.nsamples > 0 ? std::max<int64_t>(1, a_.nsamples / sizes_.global_batch) : a_.max_steps;
  if (a_.num_epochs > 0 && (a_.nsamples == 0 || !a_.max_steps_given)) {
    a_.max_steps = a_.num_epochs * sizes_.steps_per_epoch;
  }
  if (a_.warmup_steps >= a_.max_steps) a_.warmup_steps = 0;
  sizes_.val_steps =
      a_.nsamples_val > 0 ? std::max<int64_t>(1, a_.nsamples_val / sizes_.global_batch) : 0;
}

// The model and its optimizer are built before init(): a warm spare waits inside init() until
// it is promoted, so a spare has them built already when it replaces a lost rank (only the
// group and the state from a peer are left). The environment gives the local rank and size.
void Trainer::Init() {
  dlrun::worker::DistEnv env;
  try {
    env = dlrun::worker::parse_dist_env(dlrun::worker::process_environment());
  } catch (const std::invalid_argument&) {
    // init() below reports it, in its own words.
  }
  SetThreads(env.local_world_size);
  BuildModel(env.local_rank);
  ctx_ = dlrun::worker::init();
  init_done_s_ = ctx_.promoted_at ? Seconds(*ctx_.promoted_at) : SecondsSinceProcessStart();
}

void Trainer::BuildModel(int local_rank) {
  torch::manual_seed(a_.seed);  // identical init everywhere; rank 0's values are broadcast anyway
  model_ = dlrun::examples::UNet(
      dlrun::examples::UNetOptions{4, 5, a_.base_channels, a_.checkpoint_activations});
  // The GPU path (never run here: no GPU): the rank's device, cuDNN/TF32, channels-last,
  // autocast with loss scaling. On the CPU only channels-last can be asked for.
  device_ = dlrun::examples::PickDevice(a_.device, local_rank);
  dlrun::examples::ConfigureBackends(device_, a_.tf32, a_.deterministic);
  model_->to(device_);
  model_->setBetweenLevels(dlrun::worker::interruption_point);  // a lost peer: give up at once
  channels_last_ = a_.channels_last < 0 ? device_.is_cuda() : a_.channels_last > 0;
  if (channels_last_) dlrun::examples::ToChannelsLast(model_->parameters());
  data_.SetDevice(device_, channels_last_);
  scaler_ = std::make_unique<dlrun::examples::GradScaler>(a_.amp && device_.is_cuda());
  params_ = model_->parameters();
  initial_digest_ = dlrun::worker::digest(params_);
  for (const auto& p : params_) sizes_.nparams += p.numel();
  opt_ = std::make_unique<torch::optim::Adam>(params_, torch::optim::AdamOptions(a_.lr));
}

void Trainer::BuildSchedule() {
  sched_.start_lr = a_.lr;
  sched_.end_lr = a_.end_lr;
  sched_.tot_steps = a_.max_steps;
  sched_.warmup_steps = a_.lr_warmup_steps;
  sched_.global_batch_size = sizes_.global_batch;
  sched_.base_batch_size = a_.base_batch_size > 0 ? a_.base_batch_size : sizes_.global_batch;
  sched_.scaling = a_.lr_scaling;
  dlrun::worker::validate(sched_);
  if (rank_ == 0) {
    for (const std::string& note : dlrun::worker::ineffective_settings(sched_)) {
      std::fprintf(stderr, "train_unet: note: %s\n", note.c_str());
    }
  }
  progress_.lr = a_.lr;
}

// Resume after an elastic restart or a requeue: the collective resume, so every rank loads the
// newest checkpoint any rank holds (the directory may be shared or node-local: the file goes to
// the ranks without it in one broadcast); a replacement of a lost rank takes the state from a
// survivor instead. Then the DDP wrapper, as with PyTorch: dlrun::worker::Recoverable does all
// three, and makes the wrapper anew after a recovery.
void Trainer::Resume() {
  if (a_.fail_replacement == "hang" && IsReplacement()) {  // testing: one that never joins
    std::fprintf(stderr, "train_unet: --fail-replacement hang: not joining\n");
    std::fflush(stderr);
    for (;;) pause();
  }
  dlrun::worker::RecoverableOptions o;
  o.ddp.bucket_cap_mb = a_.bucket_cap_mb;
  o.ddp.broadcast_buffers = a_.broadcast_buffers;
  o.ddp.fp16_compression = a_.fp16_grad_compression;
  o.state.capture = [this] {
    dlrun::worker::TrainingState st;
    if (scaler_->enabled()) {  // the AMP loss scale (CUDA), so a resume goes on with it
      st.values["amp.scale"] = scaler_->currentScale();
      st.values["amp.good_steps"] = scaler_->goodSteps();
    }
    return st;
  };
  o.state.restore = [this](const dlrun::worker::TrainingState& st) {
    if (a_.fail_replacement == "differs") {  // testing: replicas that differ must be refused
      torch::NoGradGuard no_grad;
      params_[0].add_(1e-3);
    }
    const auto& v = st.values;
    if (scaler_->enabled() && v.count("amp.scale") && v.count("amp.good_steps")) {
      scaler_->restore(v.at("amp.scale").toDouble(), v.at("amp.good_steps").toInt());
    }
  };
  o.on_warning = [](const std::string& w) {
    std::fprintf(stderr, "train_unet: warning: %s\n", w.c_str());
  };
  o.on_recovery = [this](const dlrun::worker::Recovery::Outcome& r) { AfterRecovery(r); };
  if (!a_.checkpoint_dir.empty()) {
    ckpt_.emplace(dlrun::worker::CheckpointOptions{.dir = a_.checkpoint_dir, .keep_last = 3});
    o.checkpoint = &*ckpt_;
  }
  rec_.emplace(ctx_, model_, *opt_, std::move(o));
  start_step_ = rec_->start_step();
  if (rec_->resumed() && rank_ == 0) {
    // The restart's phases inside the worker (bench/recovery reads them).
    std::printf("resumed from step %ld (%s to init() done %.3f s, checkpoint load %.3f s)\n",
                start_step_, ctx_.promoted_at ? "promotion" : "process start", init_done_s_,
                rec_->resume_seconds());
  }
  if (rec_->replacement()) SaveIfLost(start_step_);
  std::signal(SIGUSR1, OnSigusr1);
}

// A peer was lost and the group regrouped: every rank now holds the state of step r.step, and
// the DDP wrapper is the new group's. The data streams go on after r.step, so the interrupted
// step is done again with the same samples.
// A lost node: the survivors go on at the smaller world size with their local batch (the
// global batch shrinks with it; the LR schedule and the epochs' length stay as they were), each
// rank's data stream now the one of its new rank.
void Trainer::AfterRecovery(const dlrun::worker::Recovery::Outcome& r) {
  const auto t = Clock::now();
  if (r.resized) {
    rank_ = ctx_.rank();
    world_ = ctx_.world_size();
    sizes_.global_batch = a_.local_batch_size * world_ * a_.accumulation_steps;
  }
  OpenData(r.step);
  if (rank_ == 0) {
    std::printf(
        "recovered in process at step %ld (generation %d, %.3f s; data again %.3f s): going on "
        "with step %ld%s\n",
        r.step, r.generation, r.seconds, Seconds(t), r.step + 1,
        r.resized ? lite::StrCat(" on ", world_, " rank(s)").c_str() : "");
    std::fflush(stdout);
  }
}

// The data streams where `at_step` steps left them (batch_feed.h), and on rank 0 (a survivor
// that became rank 0 too) the TensorBoard writer.
void Trainer::OpenData(int64_t at_step) {
  data_.Open(a_, sizes_.steps_per_epoch, sizes_.val_steps, rank_, threads_.loader, at_step);
  if (!a_.tensorboard_dir.empty() && rank_ == 0 && !tb_) {
    auto w = dlrun::examples::EventWriter::Open(a_.tensorboard_dir);
    if (!w.ok()) throw std::runtime_error(std::string(w.status().message()));
    tb_ = std::move(*w);
  }
}

void Trainer::PrintHeader() {
  if (rank_ != 0) return;
  std::printf(
      "train_unet: %d rank(s), base width %ld (%.2f M parameters), %ld^3 crops, "
      "local batch %ld, %d thread(s) per rank, gradient sync %s, device %s%s%s\n",
      world_, a_.base_channels, sizes_.nparams / 1e6, a_.data_size, a_.local_batch_size,
      torch::get_num_threads(), a_.grad_sync ? "on" : "off", device_.str().c_str(),
      scaler_->enabled() ? ", AMP" : "", channels_last_ ? ", channels-last" : "");
  std::printf("threads per rank: %d loader + %d intra-op (%d CPU(s) per rank)%s%s%s%s\n",
              threads_.loader, threads_.intra, threads_.cpus_per_rank,
              a_.accumulation_steps > 1 ? lite::StrCat(", ", a_.accumulation_steps,
                                                       " micro-batches per step (effective "
                                                       "global batch ",
                                                       sizes_.global_batch, ")")
                                              .c_str()
                                        : "",
              a_.checkpoint_activations ? ", activation checkpointing" : "",
              device_.is_cuda() && !a_.tf32 ? ", TF32 off" : "",
              data_.from_files() && a_.rotate_on_device ? ", rotations on the device" : "");
  std::printf("%s\n", Ddp().bucket_report().c_str());
  std::fflush(stdout);
}

// The thread budget: a rank's loader threads plus its intra-op threads fit the CPUs allocated
// to it (the CPUs this process may use, over the ranks of this node), unless the user chose
// the loader threads. Synthetic data needs no loader threads.
void Trainer::SetThreads(int local_world_size) {
  const dlrun::CpuAllocation cpus = dlrun::AllocatedCpus();
  const int local_world = std::max(1, local_world_size);
  threads_.cpus_per_rank = std::max(1, static_cast<int>(cpus.cpus / local_world));
  threads_.loader = a_.data.empty() ? 0 : a_.num_data_workers;
  if (threads_.loader > 0 && !a_.num_data_workers_given) {
    threads_.loader = std::clamp(threads_.cpus_per_rank - 1, 1, a_.num_data_workers);
  }
  threads_.intra =
      std::max(1, std::min(torch::get_num_threads(), threads_.cpus_per_rank - threads_.loader));
  torch::set_num_threads(threads_.intra);
}

// The last checkpoint, the summary, and every rank's parameter digest (so scripts can check
// the ranks agree bit for bit).
int Trainer::Finish() {
  if (start_step_ < a_.max_steps &&
      !(a_.checkpoint_every > 0 && a_.max_steps % a_.checkpoint_every == 0)) {
    Save(a_.max_steps);
  }
  const int64_t timed_steps = std::max<int64_t>(1, a_.max_steps - start_step_ - a_.warmup_steps);
  const double secs = Seconds(progress_.start);
  const double sps = timed_steps * sizes_.global_batch / secs;
  const uint64_t final_digest = dlrun::worker::digest(params_);
  double grad_sq = 0;
  for (const torch::Tensor& p : params_) {
    if (p.grad().defined()) grad_sq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  }
  const double grad_norm = std::sqrt(grad_sq);
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device_);
  std::vector<torch::Tensor> mine{torch::tensor({static_cast<int64_t>(final_digest)}, long_opts)};
  std::vector<std::vector<torch::Tensor>> all(1);
  for (int r = 0; r < world_; ++r) all[0].push_back(torch::zeros({1}, long_opts));
  all[0] = ctx_.all_gather(mine[0]);
  if (rank_ != 0) return 0;
  std::printf("Time taken for %ld steps is %.3f sec, avg %.3f samples/sec\n", timed_steps, secs,
              sps);
  std::printf("final loss %.5f (first step %.5f), %.3f samples/s over %d rank(s)\n",
              progress_.last_loss, progress_.first_loss, sps, world_);
  if (a_.metrics_json.empty()) return 0;
  nlohmann::json j;
  j["world_size"] = world_;
  j["steps"] = a_.max_steps;
  j["local_batch_size"] = a_.local_batch_size;
  j["accumulation_steps"] = a_.accumulation_steps;
  j["global_batch_size"] = sizes_.global_batch;  // effective: ranks x local batch x micro-batches
  j["checkpoint_activations"] = a_.checkpoint_activations;
  j["peak_rss_bytes"] = PeakRssBytes();
  const int64_t peak_device = dlrun::examples::PeakDeviceMemoryBytes(device_);
  j["peak_device_memory_bytes"] = peak_device >= 0 ? nlohmann::json(peak_device) : nlohmann::json();
  // The most tensor memory allocated at once during the steps: max_memory_allocated on CUDA,
  // LibTorch's CPU allocation reports on the CPU.
  j["peak_allocated_bytes"] = peak_device >= 0 ? nlohmann::json(peak_device)
                              : cpu_peak_     ? nlohmann::json(cpu_peak_->peakBytes())
                                              : nlohmann::json();
  j["grad_norm"] = grad_norm;  // the last step's averaged gradient
  j["loader_threads"] = threads_.loader;
  j["intra_op_threads"] = threads_.intra;
  if (a_.target_loss > 0) {
    j["target_loss"] = a_.target_loss;
    j["target_loss_step"] =
        progress_.target_step >= 0 ? nlohmann::json(progress_.target_step) : nlohmann::json();
    j["target_loss_s"] =
        progress_.target_step >= 0 ? nlohmann::json(progress_.target_s) : nlohmann::json();
    j["target_loss_of"] =
        progress_.target_step >= 0 ? nlohmann::json(progress_.target_of) : nlohmann::json();
  }
  j["samples_per_sec"] = sps;
  j["start_step"] = start_step_;
  j["final_lr"] = progress_.lr;
  j["final_loss"] = progress_.last_loss;
  j["first_loss"] = progress_.first_loss;
  j["parameters"] = sizes_.nparams;
  j["initial_param_digest"] = std::to_string(initial_digest_);
  j["param_digests"] = nlohmann::json::array();
  for (const auto& t : all[0]) {
    j["param_digests"].push_back(std::to_string(static_cast<uint64_t>(t.item<int64_t>())));
  }
  std::ofstream out(a_.metrics_json);
  out << j.dump(2) << "\n";
  if (!out) {
    std::fprintf(stderr, "train_unet: cannot write --metrics-json %s\n", a_.metrics_json.c_str());
    return 1;
  }
  return 0;
}

int Trainer::Run() {
  Init();
  ResolveSizes();
  BuildSchedule();
  Resume();
  OpenData(start_step_);
  PrintHeader();
  if (a_.benchy) return Benchy();
  progress_.t0 = progress_.start = progress_.epoch_start = Clock::now();
  if (!device_.is_cuda() && a_.measure_allocations) {
    cpu_peak_ = std::make_unique<dlrun::examples::CpuAllocationPeak>();
  }
  rec_->run(a_.max_steps, [&](int64_t step) {  // a step a lost peer interrupted comes again
    if (step == start_step_ + a_.warmup_steps + 1) progress_.start = Clock::now();
    Step(step);  // its update ends the step: committed there
    if (step % sizes_.steps_per_epoch == 0 || step == a_.max_steps) EndOfEpoch(step);
  });
  return Finish();
}

}  // namespace train_unet_internal

namespace dlrun::examples {

using train_unet_internal::Trainer;

int TrainUnetMain(int argc, char** argv) {
  TrainArgs a;
  if (const int rc = ParseTrainArgs(argc, argv, &a); rc >= 0) return rc;
  try {
    const int rc = Trainer(a).Run();  // the trainer, its threads and group are gone after it
    if (rc == 0) dlrun::worker::report_done();
    return rc;
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    dlrun::worker::record_error("train_unet: " + what);
    std::fprintf(stderr, "train_unet: %s\n", what.c_str());
    return 1;
  }
}

}  // namespace dlrun::examples
