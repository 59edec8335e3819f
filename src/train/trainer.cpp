// The generic pretraining loop of every model family (docs/DESIGN.md "Architecture"; the
// family's task, train/family_task, supplies the samples, loss normalisation and metric
// columns; models/model_factory its model):
//   for each iteration: zero grads; for each micro-batch of this DP rank: forward+backward
//   through the pipeline schedule (gradients of the global mean loss accumulate); reduce the
//   gradients over DP (bucketed and overlapped when asked; to the shards' owners under ZeRO-1);
//   unscale and check them (fp16); global grad norm; clip; AdamW; log; evaluate; checkpoint.
// Samples of an iteration, global order: micro-step k, DP rank r, slot j ->
//   sample consumed + (k * dp + r) * micro_batch + j   (Megatron's pretraining sampler).
// This file is the run in named phases (class TrainingRun below: start-up and banner; the step's
// forward-backward, gradient reductions, fp16 handling and update; the log line; the end-of-run
// report), in the order they run; model building, resuming, evaluation, the families' tasks, the
// debugging taps and the report printers live beside it in train/.
#include "train/trainer.hpp"

#include "layers/layer_modules.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <utility>

#include "comm/agreement.hpp"
#include "comm/topology.hpp"
#include "common/error.hpp"
#include "common/progress.hpp"
#include "common/timer.hpp"
#include "data/token_shard.hpp"
#include "checkpoint/checkpoint.hpp"
#include "comm/mpi_job.hpp"
#include "io/metrics.hpp"
#include "io/tensorboard.hpp"
#include "ops/elementwise.hpp"
#include "ops/gemm.hpp"
#include "optim/adamw.hpp"
#include "optim/loss_scaler.hpp"
#include "optim/lr_schedule.hpp"
#include "train/debug_dumps.hpp"
#include "train/evaluation.hpp"
#include "train/family_task.hpp"
#include "train/grad_reducer.hpp"
#include "train/memory_report.hpp"
#include "train/model_setup.hpp"
#include "train/output_checks.hpp"
#include "train/pipeline.hpp"
#include "train/prefetcher.hpp"
#include "train/resume.hpp"
#include "train/run_report.hpp"
#include "train/stop_signal.hpp"
#include "train/watchdog.hpp"

namespace trident {

namespace {

// "a, b,c" -> {"a", "b", "c"} (empty items dropped)
std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

// The first data read error of this rank since the last take_or (reads run on the prefetch thread
// or the main thread, never both at once; the mutex makes the hand-over explicit).
class DeferredReadError {
 public:
  template <class F>
  void run(std::vector<std::int32_t>& window, F&& read) {
    try {
      read();
    } catch (const Error& e) {
      std::fill(window.begin(), window.end(), 0);  // a valid token, label and mask everywhere
      std::lock_guard<std::mutex> lock(mutex_);
      if (message_.empty()) message_ = e.what();
    }
  }
  // The kept error (cleared), or `otherwise` when there is none.
  std::string take_or(std::string otherwise) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (message_.empty()) return otherwise;
    return std::exchange(message_, std::string());
  }

 private:
  std::mutex mutex_;
  std::string message_;
};

std::string hms(double s) {
  if (!(s >= 0) || s > 1e8) return "--:--:--";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%02ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  return buf;
}

// "debug.force_overflow = 3, 7" -> {3, 7}
std::vector<std::int64_t> iterations_of(const std::string& key, const std::string& list) {
  std::vector<std::int64_t> its;
  for (const std::string& f : split_list(list)) {
    std::size_t used = 0;
    std::int64_t v = -1;
    try {
      v = std::stoll(f, &used);
    } catch (...) {
    }
    if (used != f.size() || v < 1) throw Error::all("deck: " + key + ": '" + f + "' is not an iteration number");
    its.push_back(v);
  }
  return its;
}

AdamWConfig adamw_config(const Deck& deck) {
  AdamWConfig ac;
  ac.beta1 = deck.optim.beta1;
  ac.beta2 = deck.optim.beta2;
  ac.eps = deck.optim.eps;
  ac.weight_decay = deck.optim.weight_decay;
  return ac;
}

LossScalerConfig loss_scaler_config(const Deck& deck, bool fp16) {
  LossScalerConfig lsc;
  lsc.dynamic = fp16 && deck.precision.loss_scale == 0;
  lsc.initial = fp16 ? (deck.precision.loss_scale > 0 ? deck.precision.loss_scale : deck.precision.initial_loss_scale)
                     : 1.0;
  lsc.min_scale = std::min(deck.precision.min_loss_scale, lsc.initial);
  lsc.window = deck.precision.loss_scale_window;
  lsc.hysteresis = deck.precision.hysteresis;
  return lsc;
}

LrSchedule lr_schedule(const Deck& deck) {
  LrSchedule sched;
  sched.lr = deck.optim.lr;
  sched.min_lr = deck.optim.min_lr;
  sched.warmup_iters = deck.optim.warmup_iters;
  sched.decay_iters = deck.optim.decay_iters;
  sched.style = deck.optim.decay_style;
  return sched;
}

// One training run in its phases, in the order they run:
//   start-up (the constructor): batch layout checks, data, model, optimizer, start point (resume),
//     output checks; then the banner (print_banner);
//   each iteration (train): forward-backward over the pipeline schedule; the gradient reductions
//     (reduce_gradients: the tensor-parallel partial sums and the tied embeddings, then over the
//     data-parallel ranks); the fp16 loss-scale handling (unscale_and_check); the update (update);
//     the log line and metrics row (log_iteration); evaluation, checkpoints, the stop signal;
//   the end-of-run report (report_end_of_run): rank timers, memory, pipeline bubble, totals.
class TrainingRun {
 public:
  TrainingRun(const Deck& deck, ModelFamily fam, Topology& topo, StopSignal& stop);
  // the checkpoint loaded is at train.iters: nothing to train
  bool finished() const { return start_.finished; }
  void print_banner() const;
  // The iterations and the end-of-run report; returns the process exit code.
  int train();

 private:
  // what the step reports to log_iteration
  struct StepResult {
    double loss = 0, gnorm = 0, lr = 0, scale_used = 1;
    bool skip = false;
    LossParts parts;
    MoeReport moe;  // MoE models: the iteration's router losses and expert loads
  };

  void save(std::int64_t it);
  // Completes the pending asynchronous save (collective; waits for its writes) and reports it.
  void finish_save();
  // Collective: checkpoint.async_save's host buffers fit the node's available memory (an error
  // naming both figures otherwise).
  void check_async_buffers_fit();
  void open_outputs();
  void set_up_loop();
  void evaluate(std::int64_t it);
  // log.histogram_interval: the per-layer norms of the gradients (before the update) or the
  // parameters (after it) to the TensorBoard file. Collective.
  void record_layer_norms(std::int64_t it, bool grads);
  // One iteration (it = iteration + 1): everything but the log, evaluation and checkpoints.
  StepResult step(std::int64_t it);
  // The iteration's micro-batches through the pipeline schedule; returns this rank's loss sum.
  double forward_backward(double dscale);
  // The gradients of parameters that several ranks hold, summed where each rank saw only a part:
  // replicated parameters under sequence parallelism, the q/k norms over TP, LoRA's replicated
  // adapters, the tied word embeddings of the first and last stage and T5's position embeddings;
  // then the data-parallel reduction (to the shards' owners under ZeRO-1).
  void reduce_gradients();
  // fp16: unscales the optimizer's gradients and agrees on overflow; true when the step is skipped.
  bool unscale_and_check(std::int64_t it, double loss_sum, double scale_used);
  void update(bool skip, double lr, float clip);
  void dump_params(std::int64_t it);
  void log_iteration(std::int64_t it, const StepResult& r, double t0, double t1);
  void report_end_of_run();

  const Deck& deck_;
  const ModelFamily fam_;
  const FamilyTask& task_;
  // the loss is the mean over the micro-batches of each one's mean (BERT, T5; GPT with
  // data.eod_mask_loss, as Megatron normalises a masked loss), else over the iteration's tokens
  const bool per_micro_batch_;
  Topology& topo_;
  StopSignal& stop_;
  const Communicator& world_;
  const bool root_;
  // data-parallel size and rank (which samples this rank reads); the gradients' group dp x cp
  // (reduction and ZeRO-1 shards: dp_cp_group, the data-parallel group when cp = 1)
  const int dp_, dp_rank_, gdp_, gdp_rank_;
  const std::int64_t S_, mbs_, GB_;
  std::int64_t acc_ = 0;
  const std::int64_t iters_;

  // data
  SampleSource data_;
  std::shared_ptr<void> data_owner_;
  std::int64_t vocab_ = 0;

  // model and optimizer
  ParamStore store_;
  TransformerConfig cfg_;
  HeadOptions head_;
  TensorParallel tp_;
  std::vector<ModelStage> stages_;
  std::vector<std::unique_ptr<LanguageModel>> chunks_;
  bool zero_ = false, lora_ = false, half_ = false, fp16_ = false;
  std::int64_t trainable_ = 0, shard_ = 0, shard_begin_ = 0;
  // MoE experts: their range [e_begin_, e_begin_ + e_len_) of the flat buffers, split into
  // expert-data-parallel shards of e_shard_ (this rank's from e_shard_begin_)
  std::int64_t e_begin_ = 0, e_len_ = 0, e_shard_ = 0, e_shard_begin_ = 0;
  std::unique_ptr<AdamW> adamw_;
  LossScalerConfig lsc_;
  LossScaler scaler_;
  std::vector<std::int64_t> force_overflow_, dump_params_at_;
  LrSchedule sched_;

  // start point and outputs
  StartPoint start_;
  std::int64_t iteration_ = 0, consumed_ = 0;
  std::int64_t checkpoint_bytes_ = 0;
  std::string deck_text_;
  std::unique_ptr<Watchdog> watchdog_;
  std::int64_t last_saved_ = -1;
  // the checkpoint writer (an asynchronous save may be in flight: checkpoint.async_save)
  CheckpointSaver saver_;
  double tokens_per_iter_ = 0, flops_per_iter_ = 0;

  // the loop's objects (set_up_loop)
  MetricsWriter metrics_, eval_metrics_, moe_metrics_;
  TensorBoardWriter tb_;  // log.tensorboard_dir, on rank 0
  std::vector<std::string> tb_train_tags_;
  std::unique_ptr<BatchDumper> dumper_;
  std::int64_t tape_iteration_ = 0;  // the iteration the dropout tape's masks belong to
  std::unique_ptr<DropoutTape> tape_;
  std::int64_t consecutive_skips_ = 0;  // fp16: overflowing iterations in a row
  std::unique_ptr<Batch> batch_;
  double loss_count_ = 0, dscale_unscaled_ = 0;
  FloatView grads_;
  PhaseTimers timers_;
  RangeSquares grad_squares_;  // the gradient norm's one-pass plan (device layouts)
  std::unique_ptr<PipelineRunner> runner_;
  bool overlap_ = false;
  std::unique_ptr<GradReducer> reducer_;
  DeferredReadError read_error_;
  std::unique_ptr<Prefetcher> prefetch_;

  // the loop's running totals
  double bubble_sum_ = 0;
  std::int64_t first_iteration_ = 0;
  double t_start_ = 0, t_last_ = 0;
  std::int64_t iters_since_log_ = 0;
  // wall time since the last progress line spent outside the iterations: checkpoint saves (also
  // reported on their own) and evaluations; left out of ms/it and tok/s
  double save_s_ = 0, eval_s_ = 0;
  // [begin, end) of the gradients already zero: the optimizer's range after an update that
  // zeroed it in the same sweep (AdamW::GradsAfter::zero), nothing before the first iteration
  std::int64_t grads_zero_begin_ = 0, grads_zero_end_ = 0;
};

TrainingRun::TrainingRun(const Deck& deck, ModelFamily fam, Topology& topo, StopSignal& stop)
    : deck_(deck), fam_(fam), task_(task_of(fam)),
      per_micro_batch_(task_.loss_per_micro_batch ||
                       (fam == ModelFamily::Gpt && (deck.data.eod_mask_loss || deck.sft.enabled()))),
      topo_(topo), stop_(stop), world_(topo.world()), root_(topo.world().rank() == 0), dp_(topo.dp_size()),
      dp_rank_(topo.coords().dp), gdp_(topo.dp_cp_group().size()), gdp_rank_(topo.dp_cp_group().rank()),
      S_(deck.model.seq_length), mbs_(deck.train.micro_batch_size), GB_(deck.train.global_batch_size),
      iters_(deck.train.iters) {
  TRIDENT_REQUIRE(GB_ % (mbs_ * dp_) == 0, "deck: train.global_batch_size ("
                                               << GB_ << ") is not divisible by "
                                               << "train.micro_batch_size x data-parallel size (" << mbs_ << " x "
                                               << dp_ << ")");
  acc_ = GB_ / (mbs_ * dp_);
  TRIDENT_REQUIRE(deck.parallel.vp == 1 || acc_ % topo.pp_size() == 0,
                  "the interleaved pipeline schedule needs the micro-batches per iteration ("
                      << acc_
                      << " = train.global_batch_size / (train.micro_batch_size x dp)) to be divisible by parallel.pp ("
                      << topo.pp_size() << ")");

  // ---- data ----
  const std::int64_t valid_samples = deck.eval.interval > 0 ? deck.eval.iters * mbs_ * dp_ : 0;
  collectively(world_.get(), [&] {
    const std::int64_t n = std::max<std::int64_t>(iters_, 1) * GB_;
    data_ = samples_of(fam, deck, n, valid_samples, data_owner_);
    TRIDENT_REQUIRE(deck.eval.interval == 0 || data_.valid,
                    (deck.sft.enabled() ? std::string("eval.interval > 0 but sft.valid_data names no held-out records")
                                        : "eval.interval > 0 but data.split '" + deck.data.split +
                                              "' leaves no validation documents"));
  });
  vocab_ = data_.vocab;
  if (deck.model.vocab_size > 0)
    TRIDENT_REQUIRE(deck.model.vocab_size == vocab_,
                    "the shards have vocab_size " << vocab_ << " but model.vocab_size is " << deck.model.vocab_size);

  // ---- model and optimizer ----
  cfg_ = make_config(deck, vocab_, topo.tp_size(), fam);
  if (topo.cp_size() > 1) {  // context parallelism: the model holds seq_length / cp rows of every
                             // sample, each with its explicit position (Batch::set_context_parallel)
    cfg_.seq_length /= topo.cp_size();
    cfg_.reset_position_ids = true;
  }
  head_ = head_options(deck);
  if (cfg_.moe.on()) store_.set_expert_parallel(topo.ep_size());  // (run_training set the experts' grid)
  tp_ = tensor_parallel(deck, topo);
  stages_ = chunks_of(deck, topo, cfg_);
  if (cfg_.encoder_decoder() && topo.pp_size() > 1) topo.set_decoder_stage(decoder_stage(deck, topo, cfg_));
  store_.set_dtype(cfg_.dt);
  chunks_ = build_chunks(fam, cfg_, head_, store_, mbs_, tp_, stages_);
  // Flat buffers padded to equal data-parallel shards of a multiple of 4096 elements (the
  // optimizer kernel's chunk), in both optimizer modes so that they update alike.
  // The experts' range likewise, in expert-data-parallel shards.
  store_.allocate(static_cast<std::int64_t>(gdp_) * 4096, static_cast<std::int64_t>(topo.edp_size()) * 4096);
  store_.initialize(static_cast<std::uint64_t>(deck.train.seed));
  zero_ = distributed_optimizer(deck.optim.distributed, gdp_);
  // LoRA: only the adapters train (store.trainable_size(): the front of the buffers); the
  // optimizer, the gradient reductions and ZeRO-1's shards cover that range alone
  lora_ = store_.has_adapters();
  trainable_ = store_.dense_trainable_size();
  shard_ = trainable_ / gdp_;
  shard_begin_ = shard_ * gdp_rank_;
  // ZeRO-1: this DP rank's optimizer updates (and keeps moments for) its shard only; the
  // experts' range is a second segment, sharded over the expert-data-parallel group (LoRA: the
  // experts are part of the frozen base, no segment, no reduction).
  std::vector<AdamW::Segment> segments = {
      AdamW::Segment{zero_ ? shard_begin_ : 0, zero_ ? shard_ : trainable_, store_.decay_size(), false, 0}};
  if (store_.has_experts() && !lora_) {
    e_begin_ = store_.expert_begin();
    e_len_ = store_.padded_size() - e_begin_;
    e_shard_ = e_len_ / topo.edp_size();
    e_shard_begin_ = e_begin_ + e_shard_ * topo.expert_coords().edp;
    segments.push_back(AdamW::Segment{zero_ ? e_shard_begin_ : e_begin_, zero_ ? e_shard_ : e_len_,
                                      store_.expert_decay_end(), true, 0});
  }
  adamw_ = std::make_unique<AdamW>(adamw_config(deck), segments);
  // Mixed precision: fp32 master weights of the optimizer's range, from the 16-bit model
  // (Megatron's Float16Optimizer); replaced by the checkpoint's masters on resume.
  half_ = cfg_.dt != DType::F32;
  fp16_ = cfg_.dt == DType::F16;
  if (half_) adamw_->init_master(cfg_.dt, store_.values16());
  lsc_ = loss_scaler_config(deck, fp16_);
  scaler_ = LossScaler(lsc_);
  force_overflow_ = iterations_of("debug.force_overflow", deck.debug.force_overflow);
  dump_params_at_ = iterations_of("debug.dump_params_iters", deck.debug.dump_params_iters);
  sched_ = lr_schedule(deck);

  // ---- start point and outputs ----
  start_ = start_point(deck, fam, cfg_, head_, vocab_, store_, *adamw_, scaler_, lsc_.dynamic, topo);
  if (start_.finished) return;
  iteration_ = start_.iteration;
  consumed_ = start_.consumed;
  // weights, both moments and (16-bit runs) the fp32 masters, as fp32 tensors (LoRA: of the adapters)
  checkpoint_bytes_ = (lora_ ? store_.global_adapter_count() : store_.global_count()) *
                      static_cast<std::int64_t>(sizeof(float)) * (adamw_->has_master() ? 4 : 3);
  {
    // everything this run will write, checked before its first iteration (collective)
    OutputPlan plan;
    plan.resuming = start_.resuming;
    plan.checkpoint_bytes = checkpoint_bytes_;
    check_outputs(deck, plan, world_);
  }
  if (deck.checkpoint.async_save && !deck.checkpoint.save.empty()) {
    check_async_buffers_fit();
    saver_.reserve(store_, adamw_.get(), topo_);
  }
  deck_text_ = deck.to_ini();
  watchdog_ = std::make_unique<Watchdog>(deck.watchdog, world_.rank());
  // tokens of an iteration (T5: encoder and decoder tokens)
  tokens_per_iter_ = static_cast<double>(GB_ * (S_ + (cfg_.encoder_decoder() ? cfg_.decoder_seq_length : 0)));
  // (the whole sequences' length: under context parallelism the model holds S / cp rows of each)
  flops_per_iter_ = chunks_.front()->flops_per_step(GB_ * S_, S_);
}

void TrainingRun::check_async_buffers_fit() {
  // the largest rank's host buffers times the ranks of a node, against the node's available memory
  // (MemAvailable, read once the model and optimizer are allocated)
  const double mine = static_cast<double>(CheckpointSaver::host_buffer_bytes(store_, adamw_.get(), topo_));
  const double per_rank = world_.allreduce_max(mine);
  const int ranks = mpi_job::node_place().size;
  double available = -1;
  {
    std::ifstream in("/proc/meminfo");
    for (std::string key; in >> key;) {
      double kb = 0;
      in >> kb;
      if (key == "MemAvailable:") available = kb * 1024.0;
      in.ignore(64, '\n');
    }
  }
  available = world_.allreduce_min(available);
  const double GiB = 1024.0 * 1024.0 * 1024.0;
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << "checkpoint.async_save: its host buffers need " << per_rank * ranks / GiB
     << " GiB on a node (" << per_rank / GiB << " GiB per rank x " << ranks << " ranks), but the node has only "
     << available / GiB << " GiB available (MemAvailable); set checkpoint.async_save = false, or spread the job "
     << "over more nodes";
  TRIDENT_REQUIRE(available < 0 || per_rank * ranks <= available, os.str());
}

void TrainingRun::save(std::int64_t it) {
  last_saved_ = it;
  CheckpointState st;
  st.model = family_name(fam_);
  st.iteration = it;
  st.consumed_samples = consumed_;
  st.optimizer_steps = adamw_->steps();
  st.seed = deck_.train.seed;
  st.loss_scale = scaler_.scale();
  st.loss_scale_growth_tracker = scaler_.growth_tracker();
  st.loss_scale_hysteresis_tracker = scaler_.hysteresis_tracker();
  st.skipped_iterations = scaler_.skipped();
  st.dtype = deck_.precision.dtype;
  st.deck = deck_text_;
  st.lora_base = start_.lora_base;
  st.lora_base_digest = start_.lora_base_digest;
  // a new save waits for the previous one (and reports it)
  if (saver_.pending()) finish_save();
  watchdog_->slow_phase("checkpoint save", it);
  const double t0 = wall_seconds();
  check_room_for_checkpoint(deck_.checkpoint.save, checkpoint_bytes_, world_);
  const bool async = deck_.checkpoint.async_save;
  saver_.set_write_pause(deck_.debug.checkpoint_write_pause_s);
  saver_.begin(deck_.checkpoint.save, st, store_, adamw_.get(), topo_, async);
  if (async) {
    const double dt = wall_seconds() - t0;
    save_s_ += dt;
    if (root_)
      std::cout << "checkpoint of iteration " << it << ": training waited " << std::fixed << std::setprecision(2) << dt
                << " s (copy " << saver_.times().copy << ", create " << saver_.times().create
                << "); writing it in the background" << std::defaultfloat << std::endl;
    return;
  }
  const std::string f = saver_.finish(topo_);
  const double dt = wall_seconds() - t0;
  save_s_ += dt;
  const SaveTimes& times = saver_.times();
  if (root_)
    std::cout << "saved checkpoint " << f << " in " << std::fixed << std::setprecision(2) << dt
              << " s (training waited; copy " << times.copy << ", create " << times.create << ", checksums "
              << times.checksum << ", write " << times.write << ", fsync " << times.fsync << ", publish "
              << times.publish << ")" << std::defaultfloat << std::endl;
}

void TrainingRun::finish_save() {
  watchdog_->slow_phase("checkpoint save", saver_.iteration());
  const double t0 = wall_seconds();
  const std::string f = saver_.finish(topo_);
  const double dt = wall_seconds() - t0;
  save_s_ += dt;
  const SaveTimes& times = saver_.times();
  if (root_)
    std::cout << "saved checkpoint " << f << " in the background (training waited " << std::fixed
              << std::setprecision(2) << times.copy + times.create + dt << " s: copy " << times.copy << ", create "
              << times.create << ", wait " << times.wait << ", publish " << times.publish
              << "; behind training: checksums " << times.checksum << ", write " << times.write << ", fsync "
              << times.fsync << ")" << std::defaultfloat << std::endl;
}

void TrainingRun::print_banner() const {
  if (!root_) return;
  const Deck& deck = deck_;
  const TransformerConfig& cfg = cfg_;
  const Topology& topo = topo_;
  const LanguageModel& model = *chunks_.front();
  const std::string attention = model.attention_summary();
  const FamilyTask& task = task_;
  const ParamStore& store = store_;
  const TensorParallel& tp = tp_;
  const SampleSource& data = data_;
  const std::int64_t S = S_, mbs = mbs_, GB = GB_, acc = acc_, iters = iters_, vocab = vocab_;
  const std::int64_t shard = shard_, trainable = trainable_;
  const int dp = dp_;
  const bool zero = zero_, half = half_, fp16 = fp16_, lora = lora_;
  const LossScalerConfig& lsc = lsc_;
  const double flops_per_iter = flops_per_iter_;
  const auto& stages = stages_;
  std::cout
      << task.banner << ": " << cfg.num_layers
      << (cfg.encoder_decoder() ? " encoder + " + std::to_string(cfg.decoder_layers) + " decoder" : std::string())
      << " layers, hidden " << cfg.hidden_size << ", heads " << cfg.num_heads << ", ffn " << cfg.ffn_hidden_size
      << ", seq " << S
      << (cfg.encoder_decoder() ? " (encoder), " + std::to_string(cfg.decoder_seq_length) + " (decoder)"
                                : std::string())
      << ", vocab " << vocab << " (padded " << cfg.padded_vocab << "), " << store.global_count() << " parameters\n"
      << "layer: " << cfg.normalization << " (eps " << cfg.norm_epsilon << "), " <<
      [&] {
        std::ostringstream os;
        os << cfg.position_embedding_type;
        if (cfg.position_embedding_type == "rope") os << " (base " << cfg.rotary_base << ")";
        return os.str();
      }()
      << " positions, "
      << (cfg.groups() == cfg.num_heads ? "multi-head"
          : cfg.groups() == 1           ? "multi-query"
                                        : "grouped-query")
      << " attention (" << cfg.num_heads << " heads, " << cfg.groups() << " key/value groups, " << cfg.head_dim()
      << " channels each" << (cfg.qk_layernorm ? ", q/k norms" : "") << ")"
      << ", " << cfg.mlp_activation() << " MLP, "
      << (cfg.add_bias_linear ? "biases"
          : cfg.add_qkv_bias  ? "qkv bias only"
                              : "no linear biases")
      << ", " << (cfg.untie_embeddings_and_output_weights ? "untied" : "tied") << " output layer\n"
      << "parallel: tp " << topo.tp_size() << (tp.sequence_parallel ? " with sequence parallelism" : "") << ", pp "
      << topo.pp_size()
      << (topo.pp_size() == 1    ? ""
          : deck.parallel.vp > 1 ? " (interleaved 1F1B, vp " + std::to_string(deck.parallel.vp) + ")"
                                 : " (1F1B)")
      << ", dp " << dp
      << (topo.cp_size() > 1
              ? ", cp " + std::to_string(topo.cp_size()) +
                    (deck.parallel.cp_comm_type == "a2a" ? " (all-to-all over heads, a2a)" : " (ring attention, p2p)")
              : std::string())
      << "; dropout hidden " << cfg.hidden_dropout << ", attention " << cfg.attention_dropout << "\n"
      << (attention.empty() ? std::string() : "attention: " + attention + "\n")
      << "MPI waits: " << mpi_job::describe_wait_choice() << "\n"
      << (cfg.moe.on() ? "experts: ep " + std::to_string(topo.ep_size()) + ", expert_tp " +
                             std::to_string(topo.etp_size()) + ", expert_dp " + std::to_string(topo.edp_size()) + " (" +
                             std::to_string(cfg.moe.num_experts / topo.ep_size()) + " of " +
                             std::to_string(cfg.moe.num_experts) +
                             " experts per rank; their gradients summed over expert_dp, tokens exchanged over ep)\n"
                       : std::string())
      << (topo.pp_size() > 1 ? "stage 0 holds layers " +
                                   [&] {
                                     std::string r;
                                     for (const auto& st : stages)
                                       r += (r.empty() ? "" : ", ") + std::to_string(st.first_layer) + ".." +
                                            std::to_string(st.first_layer + st.num_layers - 1);
                                     return r;
                                   }() +
                                   "\n"
                             : std::string())
      << "batch: global " << GB << " = micro " << mbs << " x accumulation " << acc << " x dp " << dp << "; iterations "
      << iters << "; GEMM: " << gemm_backend_name() << "\n"
      << "optimizer: AdamW"
      << (zero ? ", distributed (ZeRO-1): each of the " + std::to_string(dp) + " data-parallel ranks keeps " +
                     std::to_string(shard) + " of " + std::to_string(trainable) + " elements' state" +
                     (e_len_ > 0
                          ? ", and each of the " + std::to_string(topo.edp_size()) + " expert-data-parallel ranks " +
                                std::to_string(e_shard_) + " of its experts' " + std::to_string(e_len_)
                          : std::string())
               : std::string())
      << "; precision: " << deck.precision.dtype
      << (half ? " (16-bit parameters and GEMM inputs, fp32 master weights, gradients, residual stream, "
                 "softmax and cross-entropy)"
               : "")
      << (fp16 ? (lsc.dynamic ? "; dynamic loss scaling from " : "; constant loss scale ") + std::to_string(lsc.initial)
               : std::string())
      << "; recomputation: " << deck.precision.recompute
      << (lora ? "\nLoRA: rank " + std::to_string(cfg.lora_rank) + ", scale " + std::to_string(cfg.lora_scale) +
                     " (alpha / rank) on " + deck.lora.targets + ": " + std::to_string(store.global_adapter_count()) +
                     " adapter parameters train, the " +
                     std::to_string(store.global_count() - store.global_adapter_count()) +
                     " of the base model are frozen"
               : std::string())
      << (deck.precision.recompute == "full" ? " (" + deck.precision.recompute_method + ", " +
                                                   std::to_string(deck.precision.recompute_num_layers) + " layers)"
                                             : std::string())
      << "\n"
      << "data: " << deck.data.train_shards << "\n"
      << data.description << "model FLOPs per iteration: " << flops_per_iter << " (" << model.flops_formula() << ")\n";
  if (deck.perf.peak_tflops > 0)
    std::cout << "MFU against a peak of " << deck.perf.peak_tflops << " TFLOP/s per rank"
              << (deck.perf.peak_name.empty() ? "" : " (" + deck.perf.peak_name + ")") << "\n";
  std::cout << std::flush;
}

void TrainingRun::open_outputs() {
  if (root_ && !deck_.log.metrics_file.empty()) {
    std::vector<std::string> columns = task_.train_columns();
    if (cfg_.moe.on()) columns.insert(columns.end(), {"moe_aux_loss", "moe_z_loss", "moe_max_load", "moe_dropped"});
    metrics_ = MetricsWriter(deck_.log.metrics_file, columns, start_.resuming ? iteration_ : -1);
    if (cfg_.moe.on()) {  // per MoE layer and iteration: each expert's share of the selections
      std::vector<std::string> load = {"iteration", "layer", "max_load"};
      for (std::int64_t e = 0; e < cfg_.moe.num_experts; ++e) load.push_back("expert_" + std::to_string(e));
      moe_metrics_ = MetricsWriter(sibling_metrics_path(deck_.log.metrics_file, "moe"), load,
                                   start_.resuming ? iteration_ : -1);
    }
    if (deck_.eval.interval > 0)
      eval_metrics_ = MetricsWriter(sibling_metrics_path(deck_.log.metrics_file, "eval"), task_.eval_columns(),
                                    start_.resuming ? iteration_ : -1);
  }
  if (root_ && !deck_.log.tensorboard_dir.empty()) {
    tb_ = TensorBoardWriter(deck_.log.tensorboard_dir, iteration_ + 1, deck_text_);
    std::vector<std::string> columns = task_.train_columns();
    if (cfg_.moe.on()) columns.insert(columns.end(), {"moe_aux_loss", "moe_z_loss", "moe_max_load", "moe_dropped"});
    for (size_t i = 1; i < columns.size(); ++i) tb_train_tags_.push_back("train/" + columns[i]);
    std::cout << "TensorBoard: " << tb_.path() << " (tensorboard --logdir " << deck_.log.tensorboard_dir << ")"
              << std::endl;
  }
  if (root_ && !deck_.debug.dump_batches.empty())
    dumper_ = std::make_unique<BatchDumper>(deck_.debug.dump_batches, start_.resuming);
  if (!deck_.debug.dump_dropout.empty()) {
    // the tape is a sequence of forward calls: one rank, each forward pass run once
    TRIDENT_REQUIRE(world_.size() == 1 && deck_.precision.recompute == "none",
                    "debug.dump_dropout records the masks of a one-rank run without recomputation (this run has "
                        << world_.size() << " ranks, recomputation " << deck_.precision.recompute << ")");
    tape_ = std::make_unique<DropoutTape>(deck_.debug.dump_dropout, &tape_iteration_);
  }
}

void TrainingRun::set_up_loop() {
  batch_ = std::make_unique<Batch>(mbs_, S_, fam_, deck_.model.decoder_seq_length, data_.sft);
  if (fam_ == ModelFamily::Gpt)
    batch_->set_packing(deck_.data.reset_position_ids, deck_.data.reset_attention_mask, deck_.data.eod_mask_loss,
                        data_.eod);
  if (topo_.cp_size() > 1) batch_->set_context_parallel(topo_.cp_size(), topo_.coords().cp);
  // GPT: the loss is the mean over the iteration's tokens (with data.eod_mask_loss: the mean over
  // its micro-batches of each one's mean over its counted tokens); BERT: the mean over its
  // micro-batches of each micro-batch's MLM (mean over its labelled positions) + sentence-order
  // loss; T5: the mean over its micro-batches of each one's mean over its decoder targets
  // (Megatron's T5)
  loss_count_ = per_micro_batch_ ? static_cast<double>(acc_ * dp_) : static_cast<double>(GB_ * S_);
  dscale_unscaled_ = 1.0 / loss_count_;
  grads_ = store_.grads();
  runner_ = std::make_unique<PipelineRunner>(raw(chunks_), topo_);
  runner_->grouped_p2p = deck_.debug.grouped_p2p;
  runner_->record = !deck_.log.timeline_file.empty();
  // Overlapped, bucketed data-parallel reduction (one bucket per layer, started by the backward
  // pass of the iteration's last micro-batch).
  overlap_ = deck_.parallel.overlap_grad_reduce && dp_ > 1;
  reducer_ = std::make_unique<GradReducer>(store_, topo_.dp_cp_group(), zero_ ? shard_ : 0);
  if (overlap_)
    for (auto& chunk : chunks_) chunk->on_layer_grads_ready = [this](std::int64_t l) { reducer_->layer_ready(l); };
  // A read of this rank's samples can fail on this rank alone (a shard truncated under the job:
  // its mapping's SIGBUS becomes an Error naming the shard) while the other ranks are already in
  // the iteration's collectives. Such an error is kept, the window is filled with token 0, the
  // iteration runs to its end, and every rank leaves together at the collective data check of
  // forward_backward, before the step uses the data.
  // Micro-batch k of the current iteration is read on a helper thread while k - 1 computes.
  prefetch_ = std::make_unique<Prefetcher>(
      [this](std::int64_t k, std::vector<std::int32_t>& w) {
        const std::int64_t first = consumed_ + (k * dp_ + dp_rank_) * mbs_;
        read_error_.run(w, [&] {
          for (std::int64_t j = 0; j < mbs_; ++j) data_.train(first + j, w.data() + j * batch_->width);
        });
      },
      static_cast<std::size_t>(mbs_ * batch_->width), deck_.data.prefetch);
}

void TrainingRun::evaluate(std::int64_t it) {
  Batch& batch = *batch_;
  double sum = runner_->evaluate(
      deck_.eval.iters,
      [&](std::int64_t k, MicroBatch& mb) {
        read_error_.run(batch.window, [&] {
          for (std::int64_t j = 0; j < mbs_; ++j)
            data_.valid((k * dp_ + dp_rank_) * mbs_ + j, batch.window.data() + j * batch.width);
        });
        batch.finish(vocab_, mb);
      },
      [&](std::int64_t) { return mbs_; });
  agree_or_throw(world_.get(), read_error_.take_or(TokenShardReader::check_touched_shards()));
  sum = topo_.dp_cp_group().allreduce_sum(topo_.pp_group().allreduce_sum(sum));
  const double n = per_micro_batch_ ? static_cast<double>(deck_.eval.iters * dp_)
                                    : static_cast<double>(deck_.eval.iters * mbs_ * dp_ * S_);
  const double loss = sum / n;
  const LossParts parts = per_micro_batch_ ? reduce_loss_parts(chunks_, topo_) : LossParts{};
  if (root_) {
    std::cout << std::setprecision(6) << " validation at iteration " << it << " | loss " << loss;
    if (task_.reports_loss_parts)
      std::cout << " | lm loss " << parts.lm / n << " | sop loss " << parts.sop / n << std::endl;
    else
      std::cout << " | ppl " << std::exp(loss) << std::endl;
    const std::vector<double> row = task_.reports_loss_parts
                                        ? std::vector<double>{static_cast<double>(it), loss, parts.lm / n,
                                                              parts.sop / n}
                                        : std::vector<double>{static_cast<double>(it), loss, std::exp(loss)};
    eval_metrics_.write(row);
    if (tb_.active()) {
      const std::vector<std::string> columns = task_.eval_columns();
      TbSummary s;
      for (size_t i = 1; i < columns.size(); ++i) s.scalar("eval/" + columns[i], row[i]);
      tb_.write(it, s);
    }
  }
}

double TrainingRun::forward_backward(double dscale) {
  const double pipe_t0 = wall_seconds(), busy0 = runner_->forward_seconds() + runner_->backward_seconds();
  Batch& batch = *batch_;
  const double loss_sum = runner_->train(
      acc_,
      [&](std::int64_t k, MicroBatch& mb) {
        const std::vector<std::int32_t>& w = prefetch_->get(k, acc_);
        std::copy(w.begin(), w.end(), batch.window.begin());
        batch.finish(vocab_, mb);
      },
      static_cast<float>(dscale),
      [&](std::int64_t k) {
        // Dropout streams keyed by the global micro-batch index: independent of dp and of the
        // accumulation split, and exactly reproduced on resume.
        DropoutStreams rng;
        rng.training = true;
        rng.step = static_cast<std::uint64_t>((consumed_ + (k * dp_ + dp_rank_) * mbs_) / mbs_);
        rng.shared = static_cast<std::uint64_t>(deck_.train.seed);
        rng.tp_local = static_cast<std::uint64_t>(deck_.train.seed) + 2718 +
                       static_cast<std::uint64_t>(topo_.coords().tp);
        return rng;
      });
  prefetch_->drain();
  // the shards this iteration read must still be the files opened (a shard truncated or replaced
  // under the job reads as zeros or as another corpus): checked before the step uses the data
  progress::set_phase("shard check");
  agree_or_throw(world_.get(), read_error_.take_or(TokenShardReader::check_touched_shards()));
  // bubble as Megatron defines it: idle time over busy (forward + backward) time of a stage
  // (busy first: on a device, reading the passes' times waits for the last of them)
  const double busy = runner_->forward_seconds() + runner_->backward_seconds() - busy0;
  const double span = wall_seconds() - pipe_t0;
  if (iteration_ > first_iteration_)  // the first iteration also allocates activation slots
    bubble_sum_ += busy > 0 ? (span - busy) / busy : 0.0;
  return loss_sum;
}

void TrainingRun::reduce_gradients() {
  const FloatView& grads = grads_;
  const ParamStore& store = store_;
  if (overlap_) reducer_->wait();       // the layers' buckets, started during the backward pass
  if (tp_.sequence_parallel && !lora_)  // replicated parameters saw only this rank's rows
    tp_allreduce(tp_, slice(grads, store.replicated_begin(), store.replicated_end() - store.replicated_begin()),
                 store.replicated_end() - store.replicated_begin());
  else if (!lora_ && topo_.tp_size() > 1 && store.replicated_end() > store.tp_partial_begin())  // q/k norms
    tp_allreduce(tp_, slice(grads, store.tp_partial_begin(), store.replicated_end() - store.tp_partial_begin()),
                 store.replicated_end() - store.tp_partial_begin());
  if (lora_ && topo_.tp_size() > 1) {  // the replicated adapters' gradients are partial sums over TP
    const std::int64_t b = store.adapter_replicated_begin(), n = store.adapter_replicated_end() - b;
    tp_allreduce(tp_, slice(grads, b, n), n);
  }
  for (auto& chunk : chunks_) {  // tied embeddings: the stages that hold them sum their gradients
    if (lora_) break;            // (frozen with LoRA)
    if (topo_.pp_size() > 1 && chunk->word_embeddings() >= 0 && !cfg_.untie_embeddings_and_output_weights) {
      const FloatView g = store_.grad(chunk->word_embeddings());
      topo_.embedding_group().allreduce_sum(g.data(), static_cast<std::int64_t>(g.extent(0)));
    }
    if (cfg_.encoder_decoder() && topo_.pp_size() > 1 &&
        chunk->position_embeddings() >= 0) {  // first and decoder stage
      const FloatView g = store_.grad(chunk->position_embeddings());
      topo_.position_group().allreduce_sum(g.data(), static_cast<std::int64_t>(g.extent(0)));
    }
  }
  if (overlap_)
    reducer_->reduce_rest();  // what no layer bucket covered (to the shards' owners with ZeRO-1)
  else if (zero_)             // each DP rank receives the sum of its shard only
    topo_.dp_cp_group().reduce_scatter_in_place(grads.data(), shard_);
  else {  // the same reduce-scatter, then every shard to every rank: the sums (and so the
          // updates) are bitwise those of ZeRO-1 at any dp, which a library all-reduce, free
          // to add in another order, is not beyond dp = 2
    topo_.dp_cp_group().reduce_scatter_in_place(grads.data(), shard_);
    topo_.dp_cp_group().allgather_in_place(grads.data(), shard_);
  }
  if (e_len_ > 0) {  // the experts' gradients: summed over the ranks holding the same experts
    float* g = grads.data() + e_begin_;
    topo_.edp_group().reduce_scatter_in_place(g, e_shard_);
    if (!zero_) topo_.edp_group().allgather_in_place(g, e_shard_);
  }
}

bool TrainingRun::unscale_and_check(std::int64_t it, double loss_sum, double scale_used) {
  // Loss scaling (fp16): unscale the optimizer's range of the main gradients, check it for
  // inf/NaN, agree on the verdict over every rank, and skip the step on overflow.
  const auto& segments = adamw_->segments();
  if (std::find(force_overflow_.begin(), force_overflow_.end(), it) != force_overflow_.end() && world_.rank() == 0)
    Kokkos::deep_copy(slice(grads_, segments.front().begin, 1), std::numeric_limits<float>::infinity());
  if (!fp16_) return false;
  bool nonfinite = false;
  for (const AdamW::Segment& sg : segments) {
    const FloatView opt_grads = slice(grads_, sg.begin, sg.n);
    if (scale_used != 1.0) scale(opt_grads, static_cast<float>(1.0 / scale_used), sg.n);
    nonfinite = has_nonfinite(opt_grads, sg.n) || nonfinite;
  }
  const bool found_inf = world_.allreduce_max(nonfinite ? 1.0 : 0.0) > 0;
  // a run that keeps overflowing has diverged: stop it rather than skip forever (and never
  // checkpoint its non-finite state); every rank decides alike from the agreed verdict
  TRIDENT_REQUIRE(!(found_inf && lsc_.dynamic && scaler_.scale() <= lsc_.min_scale),
                  "iteration " << it << ": the fp16 gradients overflow at the minimum loss scale (" << lsc_.min_scale
                               << "): training has diverged (loss " << loss_sum / loss_count_
                               << "); lower optim.lr, or train in bf16");
  const bool skip = scaler_.update(found_inf);
  consecutive_skips_ = skip ? consecutive_skips_ + 1 : 0;
  TRIDENT_REQUIRE(deck_.precision.max_skipped_iterations == 0 ||
                      consecutive_skips_ < deck_.precision.max_skipped_iterations,
                  "iteration " << it << ": " << consecutive_skips_ << " fp16 iterations in a row overflowed and were "
                               << "skipped (precision.max_skipped_iterations): training has diverged; lower optim.lr, "
                               << "or train in bf16");
  return skip;
}

void TrainingRun::update(bool skip, double lr, float clip) {
  if (skip) {
    // overflow: no update (Megatron's skipped iteration); the schedule still advances
  } else if (half_) {
    adamw_->step_mixed(store_.values16(), grads_, lr, clip, AdamW::GradsAfter::zero);
    if (zero_) topo_.dp_cp_group().allgather_in_place(store_.values16().data(), shard_);  // 16-bit shards to every rank
    if (zero_ && e_len_ > 0) topo_.edp_group().allgather_in_place(store_.values16().data() + e_begin_, e_shard_);
  } else {
    adamw_->step(store_.values(), grads_, lr, clip, AdamW::GradsAfter::zero);
    if (zero_) topo_.dp_cp_group().allgather_in_place(store_.values().data(), shard_);  // updated shards to every rank
    if (zero_ && e_len_ > 0) topo_.edp_group().allgather_in_place(store_.values().data() + e_begin_, e_shard_);
  }
  if (!skip) {  // the update zeroed the gradients it read: the next iteration zeroes only the rest (of
                // the dense segment; the experts' is zeroed twice)
    grads_zero_begin_ = adamw_->segments().front().begin;
    grads_zero_end_ = grads_zero_begin_ + adamw_->segments().front().n;
  }
}

void TrainingRun::dump_params(std::int64_t it) {
  if (deck_.debug.dump_params.empty() ||
      std::find(dump_params_at_.begin(), dump_params_at_.end(), it) == dump_params_at_.end())
    return;
  // the updated parameters (16-bit runs: the 16-bit model widened, as in a checkpoint)
  std::ostringstream name;
  name << "iter_" << std::setw(7) << std::setfill('0') << it << ".h5";
  const FloatView values = half_ || store_.has_states()  // (with the states, e.g. MoE expert biases)
                               ? Kokkos::create_mirror_view_and_copy(FloatView::memory_space(), store_.model_to_host())
                               : store_.values();
  save_named_tensors((std::filesystem::path(deck_.debug.dump_params) / name.str()).string(), "", store_, values, it,
                     topo_);
}

void TrainingRun::record_layer_norms(std::int64_t it, bool grads) {
  const std::int64_t layers = cfg_.total_layers();
  std::vector<double> sq;
  if (grads) {
    sq = layer_sum_squares(store_, topo_, layers, grads_, true, shard_begin_, shard_begin_ + shard_, e_shard_begin_,
                           e_shard_begin_ + e_shard_);
  } else {
    // 16-bit parameters (and the states) widened to fp32, as dump_params reads them
    const FloatView values = half_ ? Kokkos::create_mirror_view_and_copy(FloatView::memory_space(),
                                                                         store_.model_to_host())
                                   : store_.values();
    sq = layer_sum_squares(store_, topo_, layers, values, false, 0, store_.padded_size(), 0, store_.padded_size());
  }
  if (!tb_.active()) return;
  const std::string kind = grads ? "grad_norm/" : "param_norm/";
  TbSummary s;
  std::vector<double> norms;
  s.scalar(kind + "outside_layers", std::sqrt(sq[0]));
  for (std::int64_t l = 0; l < layers; ++l) {
    std::ostringstream tag;
    tag << kind << "layer_" << std::setw(3) << std::setfill('0') << l;
    norms.push_back(std::sqrt(sq[static_cast<size_t>(l + 1)]));
    s.scalar(tag.str(), norms.back());
  }
  s.histogram(kind + "by_layer", norms);
  tb_.write(it, s);
}

TrainingRun::StepResult TrainingRun::step(std::int64_t it) {
  StepResult r;
  store_.zero_grads(grads_zero_begin_, grads_zero_end_);  // all but what the last update zeroed
  grads_zero_begin_ = grads_zero_end_ = 0;
  timers_.start("forward-backward");
  progress::set_phase("forward-backward");
  // fp16: the loss gradient is multiplied by the loss scale (1 otherwise)
  const float dscale = static_cast<float>(dscale_unscaled_ * scaler_.scale());
  r.scale_used = scaler_.scale();
  // MoE: each micro-batch's load-balancing and z losses enter the objective with weight 1 / (the
  // iteration's micro-batches over all data-parallel ranks), as Megatron's MoEAuxLossAutoScaler
  start_moe_iteration(chunks_, static_cast<float>(scaler_.scale() / static_cast<double>(acc_ * dp_)));
  double loss_sum = forward_backward(dscale);
  if (cfg_.moe.on()) r.moe = reduce_moe_report(chunks_, cfg_, topo_);
  timers_.stop("forward-backward");

  timers_.start("grad-allreduce");
  progress::set_phase("grad-allreduce");
  reduce_gradients();
  loss_sum = topo_.dp_cp_group().allreduce_sum(topo_.pp_group().allreduce_sum(loss_sum));
  r.parts = per_micro_batch_ ? reduce_loss_parts(chunks_, topo_) : LossParts{};  // (T5: resets the model's sums)
  timers_.stop("grad-allreduce");

  timers_.start("optimizer");
  progress::set_phase("optimizer");
  r.loss = loss_sum / loss_count_;
  r.skip = unscale_and_check(it, loss_sum, r.scale_used);
  r.gnorm = r.skip ? std::nan("")
                   : global_grad_norm(store_, topo_, shard_begin_, shard_begin_ + shard_, e_shard_begin_,
                                      e_shard_begin_ + e_shard_, &grad_squares_);
  TRIDENT_REQUIRE(r.skip || (std::isfinite(r.loss) && std::isfinite(r.gnorm)),
                  "iteration " << it << ": the loss or gradient is not finite (loss " << r.loss << ", grad norm "
                               << r.gnorm << "); lower optim.lr or check the data");
  if (it == 1 && !deck_.debug.dump_grads.empty()) {
    if (zero_) topo_.dp_cp_group().allgather_in_place(grads_.data(), shard_);  // debug only: every shard
    if (zero_ && e_len_ > 0) topo_.edp_group().allgather_in_place(grads_.data() + e_begin_, e_shard_);
    save_named_tensors(deck_.debug.dump_grads, "", store_, grads_, it, topo_);
  }
  if (tape_) tape_->flush();
  if (dumper_) {
    std::vector<std::int32_t> rows(static_cast<size_t>(GB_ * batch_->width));
    for (std::int64_t i = 0; i < GB_; ++i) data_.train(consumed_ + i, rows.data() + i * batch_->width);
    dumper_->write(it, rows, GB_, batch_->width);
  }
  float clip = 1.f;
  if (deck_.optim.clip_grad > 0) {
    const double c = deck_.optim.clip_grad / (r.gnorm + 1e-6);
    if (c < 1.0) clip = static_cast<float>(c);
  }
  r.lr = sched_.at(it);
  const bool norms = deck_.log.histogram_interval > 0 && it % deck_.log.histogram_interval == 0 &&
                     !deck_.log.tensorboard_dir.empty();
  if (norms && !r.skip) record_layer_norms(it, true);
  update(r.skip, r.lr, clip);
  if (norms) record_layer_norms(it, false);
  // aux-loss-free balancing: every expert bias steps towards the mean load (skipped or not, as Megatron)
  if (cfg_.moe.on() && cfg_.moe.router_enable_expert_bias)
    update_expert_bias(chunks_, r.moe, cfg_.moe.router_bias_update_rate);
  timers_.stop("optimizer");
  dump_params(it);
  return r;
}

void TrainingRun::log_iteration(std::int64_t it, const StepResult& r, double t0, double t1) {
  const double dt = t1 - t0;
  const double tps = tokens_per_iter_ / dt;
  const double tflops = flops_per_iter_ / dt / world_.size() / 1e12;
  const double mfu = deck_.perf.peak_tflops > 0 ? tflops / deck_.perf.peak_tflops : std::nan("");
  if (!root_) return;
  std::vector<double> row = {static_cast<double>(it),
                             static_cast<double>(consumed_),
                             r.loss,
                             r.lr,
                             r.gnorm,
                             r.scale_used,
                             r.skip ? 1.0 : 0.0,
                             dt * 1e3,
                             tps,
                             tflops,
                             mfu};
  if (task_.reports_loss_parts) row.insert(row.begin() + 3, {r.parts.lm / loss_count_, r.parts.sop / loss_count_});
  if (cfg_.moe.on()) row.insert(row.end(), {r.moe.aux, r.moe.z, r.moe.max_load, r.moe.dropped});
  metrics_.write(row);
  if (tb_.active()) {
    TbSummary s;
    for (size_t i = 1; i < row.size() && i - 1 < tb_train_tags_.size(); ++i) s.scalar(tb_train_tags_[i - 1], row[i]);
    for (size_t i = 0; i < r.moe.load.size(); ++i) {
      const std::vector<double>& share = r.moe.load[i];
      const std::string layer = "moe/layer_" + std::to_string(r.moe.layers[i]) + "/";
      s.scalar(layer + "max_load",
               share.empty() ? 0.0 : *std::max_element(share.begin(), share.end()) * static_cast<double>(share.size()));
      for (size_t e = 0; e < share.size(); ++e) s.scalar(layer + "expert_" + std::to_string(e), share[e]);
    }
    tb_.write(it, s);
  }
  for (size_t i = 0; i < r.moe.load.size() && moe_metrics_.active(); ++i) {
    const std::vector<double>& share = r.moe.load[i];
    std::vector<double> v = {static_cast<double>(it), static_cast<double>(r.moe.layers[i]),
                             share.empty()
                                 ? 0.0
                                 : *std::max_element(share.begin(), share.end()) * static_cast<double>(share.size())};
    v.insert(v.end(), share.begin(), share.end());
    moe_metrics_.write(v);
  }
  if (it % deck_.log.interval == 0 || it == iters_) {
    // the iterations' own time: saves and evaluations since the last line are reported apart
    const double per_iter = std::max(t1 - t_last_ - save_s_ - eval_s_, 0.0) / static_cast<double>(iters_since_log_);
    std::ostringstream os;
    os << " iter " << std::setw(6) << it << "/" << iters_ << " | loss " << std::fixed << std::setprecision(4) << r.loss;
    if (task_.reports_loss_parts)
      os << " | lm loss " << r.parts.lm / loss_count_ << " | sop loss " << r.parts.sop / loss_count_;
    os << " | lr " << std::scientific << std::setprecision(3) << r.lr << std::fixed << " | gnorm "
       << std::setprecision(3) << r.gnorm << " | " << std::setprecision(1) << per_iter * 1e3 << " ms/it | "
       << std::setprecision(0) << tokens_per_iter_ / per_iter << " tok/s | " << std::setprecision(3)
       << flops_per_iter_ / per_iter / world_.size() / 1e12 << " TFLOP/s/rank";
    if (deck_.perf.peak_tflops > 0) os << " | MFU " << std::setprecision(1) << 100.0 * mfu << "%";
    if (cfg_.moe.on())
      os << " | moe aux " << std::setprecision(4) << r.moe.aux << " z " << r.moe.z << " max load "
         << std::setprecision(3) << r.moe.max_load << (cfg_.moe.expert_capacity_factor > 0 ? " dropped " : "")
         << (cfg_.moe.expert_capacity_factor > 0 ? std::to_string(r.moe.dropped) : "");
    if (fp16_)
      os << " | loss scale " << std::defaultfloat << std::setprecision(6) << r.scale_used << std::fixed << " | skipped "
         << scaler_.skipped();
    if (save_s_ > 0) os << " | checkpoint save " << std::setprecision(2) << save_s_ << " s";
    os << " | ETA " << hms(per_iter * static_cast<double>(iters_ - it));
    std::cout << os.str() << std::endl;
    t_last_ = t1;
    iters_since_log_ = 0;
    save_s_ = eval_s_ = 0;
  }
}

int TrainingRun::train() {
  open_outputs();
  if (!deck_.checkpoint.save.empty() && deck_.checkpoint.save_initial && iteration_ == 0) save(0);
  set_up_loop();
  topo_.tp_group().reset_stats();
  topo_.dp_group().reset_stats();
  if (topo_.cp_size() > 1) {
    topo_.cp_group().reset_stats();
    topo_.dp_cp_group().reset_stats();
  }
  if (topo_.ep_group().get() != MPI_COMM_NULL) {
    topo_.ep_group().reset_stats();
    topo_.edp_group().reset_stats();
  }
  first_iteration_ = iteration_;
  t_start_ = wall_seconds();
  t_last_ = t_start_;
  stop_.arm();  // from here a signal checkpoints at the next iteration boundary (before: exit 4 at once)
  while (iteration_ < iters_) {
    const std::int64_t it = iteration_ + 1;
    tape_iteration_ = it;
    const double t0 = wall_seconds();
    watchdog_->iteration(it);
    const StepResult r = step(it);
    consumed_ += GB_;
    iteration_ = it;
    ++iters_since_log_;
    const double t1 = wall_seconds();
    watchdog_->iteration_done(t1 - t0);
    log_iteration(it, r, t0, t1);
    if (deck_.eval.interval > 0 && (it % deck_.eval.interval == 0 || it == iters_)) {
      watchdog_->slow_phase("evaluation", it);
      const double te = wall_seconds();
      evaluate(it);
      eval_s_ += wall_seconds() - te;
    }
    // an asynchronous save completes at the first iteration boundary where every rank's writes are done
    if (saver_.pending() && saver_.ready(topo_)) finish_save();
    if (!deck_.checkpoint.save.empty() &&
        ((deck_.checkpoint.interval > 0 && it % deck_.checkpoint.interval == 0) || it == iters_))
      save(it);
    if (const int sig = stop_.agreed(world_); sig != 0 && it < iters_) {  // time limit or preemption
      if (deck_.checkpoint.save.empty()) {
        if (root_)
          std::cout << "received " << StopSignal::name(sig) << ": stopping after iteration " << it
                    << " without a checkpoint (checkpoint.save is not set); exit code " << kExitStoppedNoCheckpoint
                    << std::endl;
        return kExitStoppedNoCheckpoint;
      }
      if (last_saved_ != it) save(it);
      if (saver_.pending()) finish_save();  // the signal's checkpoint is complete before the exit
      if (root_)
        std::cout << "received " << StopSignal::name(sig) << ": stopped after iteration " << it << " of " << iters_
                  << " with a checkpoint in '" << deck_.checkpoint.save << "'; exit code " << kExitCheckpointed
                  << " (resubmit with --checkpoint.load auto to continue)" << std::endl;
      return kExitCheckpointed;
    }
  }
  if (saver_.pending()) finish_save();  // the end of training waits for the last save
  watchdog_->idle();
  report_end_of_run();
  tb_.close();
  return 0;
}

void TrainingRun::report_end_of_run() {
  const Deck& deck = deck_;
  const TransformerConfig& cfg = cfg_;
  const Topology& topo = topo_;
  LanguageModel& model = *chunks_.front();
  const double trained = static_cast<double>(std::max<std::int64_t>(iteration_ - first_iteration_ - 1, 1));
  const double bubble = topo.world().allreduce_sum(bubble_sum_ / trained) / topo.world_size();
  // Per-rank timers, gathered to rank 0: forward, backward, p2p wait, gradient reduction, optimizer.
  std::vector<double> mine = {runner_->forward_seconds(), runner_->backward_seconds(), runner_->p2p_seconds(),
                              timers_.totals().count("grad-allreduce") ? timers_.totals().at("grad-allreduce") : 0.0,
                              timers_.totals().count("optimizer") ? timers_.totals().at("optimizer") : 0.0};
  print_rank_timers(mine, topo);
  // ---- memory accounting, per rank, beside Megatron's and Korthikanti et al.'s figures ----
  {
    MemoryFigures mf;
    mf.params = static_cast<double>(store_.model_bytes());
    mf.grads = 4.0 * static_cast<double>(store_.padded_size());
    mf.optimizer = static_cast<double>(adamw_->state_bytes());
    mf.local_params = static_cast<double>(store_.size());
    if (deck.checkpoint.async_save && !deck.checkpoint.save.empty())
      mf.checkpoint_buffers = static_cast<double>(CheckpointSaver::host_buffer_bytes(store_, adamw_.get(), topo_));
    for (const auto& p : store_.params()) mf.expert_params += p.expert ? static_cast<double>(p.numel()) : 0.0;
    for (auto& chunk : chunks_) {
      mf.activations += static_cast<double>(chunk->num_slots()) *
                        static_cast<double>(chunk->activation_bytes_per_slot());
      mf.workspace += static_cast<double>(chunk->workspace_bytes());
      mf.slots = std::max(mf.slots, static_cast<double>(chunk->num_slots()));
    }
    mf.layer_activations = model.layer_activation_bytes();
    ActivationModel am;
    am.s = static_cast<double>(S_);
    am.b = static_cast<double>(mbs_);
    am.h = static_cast<double>(cfg.hidden_size);
    am.a = static_cast<double>(cfg.num_heads);
    am.t = static_cast<double>(topo.tp_size());
    am.c = static_cast<double>(topo.cp_size());
    am.sp = tp_.sequence_parallel;
    am.e = static_cast<double>(dtype_bytes(cfg.dt));  // bytes of a stored activation value
    am.recompute = deck.precision.recompute;
    am.flash = deck.model.flash_attention;
    const double blocks1 = static_cast<double>(make_mlp_activation(cfg)->blocks() + 1),
                 h = static_cast<double>(cfg.hidden_size);
    am.mlp = blocks1 * static_cast<double>(cfg.ffn_hidden_size) / h;
    if (cfg.moe.on()) {  // the chunk's share of MoE layers
      const MoeArch& m = cfg.moe;
      const ModelStage& st = model.stage();
      double share = 0;
      for (std::int64_t l = st.first_layer; l < st.first_layer + st.num_layers; ++l) share += m.layer(l) ? 1.0 : 0.0;
      share /= std::max<double>(1.0, static_cast<double>(st.num_layers));
      const double k = static_cast<double>(m.router_topk);
      const double moe_mlp = blocks1 *
                             (k * static_cast<double>(m.ffn_hidden_size) +
                              static_cast<double>(m.shared_expert_intermediate_size)) /
                             h;
      am.mlp = (1 - share) * am.mlp + share * moe_mlp;
      am.moe_fp32 = share * (k * h + static_cast<double>(m.num_experts) + 2 + 4 * k) / h;
      // the expert side keeps its received rows (e bytes) and their fp32 outputs, k rows per token
      // under balanced routing; under expert_tp also the expert_tp ranks' rows gathered (fc1's and
      // the activation's outputs are split alike, so they stay as they are)
      if (topo.ep_size() > 1 || topo.etp_size() > 1) {
        am.mlp += share * k;
        am.moe_fp32 += share * k;
        if (topo.etp_size() > 1) am.mlp += share * k * static_cast<double>(topo.etp_size());
      }
    }
    am.qkv = static_cast<double>(cfg.qkv_width()) / static_cast<double>(cfg.hidden_size);
    am.proj = static_cast<double>(cfg.q_width()) / static_cast<double>(cfg.hidden_size);
    if (cfg.qk_layernorm)
      am.qk_norm = static_cast<double>(cfg.q_width() + cfg.kv_width()) / static_cast<double>(cfg.hidden_size);
    am.block = deck.precision.recompute_method == "block";
    am.group = static_cast<double>(deck.precision.recompute_num_layers);
    am.layers = static_cast<double>(model.num_layers());
    // (T5: encoder and decoder layers differ in shape; the formula is for one kind of layer)
    const double formula = !cfg.encoder_decoder() && model.num_layers() > 0 ? korthikanti_layer_bytes(am) : 0.0;
    const std::vector<double> all_mem = print_memory_report(mf, am, formula, deck.precision.dtype, zero_, topo,
                                                            deck.log.memory_file);
    if (tb_.active()) {
      const std::vector<std::string>& names = memory_figure_names();
      TbSummary s;
      for (size_t k = 0; k < all_mem.size(); ++k)
        s.scalar("memory/rank_" + std::to_string(k / names.size()) + "/" + names[k % names.size()], all_mem[k]);
      tb_.write(iteration_, s);
    }
  }
  if (!deck.log.timeline_file.empty()) write_timeline(deck.log.timeline_file, runner_->events(), topo, t_start_);
  if (root_ && topo.pp_size() > 1) {
    std::cout
        << std::fixed << std::setprecision(3) << "pipeline bubble: measured " << bubble
        << " (idle over busy time of the forward-backward phase, mean over ranks and iterations), theory (p-1)/m = "
        << static_cast<double>(topo.pp_size() - 1) / static_cast<double>(acc_ * deck.parallel.vp)
        << (deck.parallel.vp > 1 ? " (interleaved: (p-1)/(v m))" : "") << " (p " << topo.pp_size() << ", v "
        << deck.parallel.vp << ", m " << acc_ << "); p2p wait " << runner_->p2p_seconds() << " s on rank 0"
        << std::endl;
    if (!deck.log.timeline_file.empty()) std::cout << "timeline: " << deck.log.timeline_file << std::endl;
  }
  if (root_)
    print_run_totals(iteration_, consumed_, wall_seconds() - t_start_, iteration_ - first_iteration_, timers_, topo_);
  if (root_ && cfg_.moe.on()) {  // rank 0's MoE layers, forward and backward passes
    double sec[4] = {0, 0, 0, 0};
    for (auto& chunk : chunks_)
      if (const MoeState* m = chunk->moe_state())
        for (int p = 0; p < 4; ++p) sec[p] += m->seconds[p];
    std::cout << std::fixed << std::setprecision(2) << "MoE layers (rank 0, forward + backward): router " << sec[0]
              << " s; dispatch " << sec[1] << " s; experts " << sec[2] << " s; combine " << sec[3] << " s" << std::endl;
  }
}

}  // namespace

int run_training(const Deck& deck, ModelFamily fam) {
  TRIDENT_REQUIRE(deck.parallel.cp == 1 || fam == ModelFamily::Gpt,
                  "deck: parallel.cp > 1 (context parallelism) is supported by pretrain_gpt only (causal "
                  "self-attention); "
                      << family_name(fam) << " runs at parallel.cp = 1");
  TRIDENT_REQUIRE(deck.parallel.cp == 1 || !deck.eval.only,
                  "deck: evaluation mode (eval.only) runs at parallel.cp = 1 (got " << deck.parallel.cp << ")");
  Topology topo(MPI_COMM_WORLD, static_cast<int>(deck.parallel.tp), static_cast<int>(deck.parallel.pp),
                static_cast<int>(deck.parallel.cp));
  // MoE: the experts' grid (Megatron's expert decomposition), before any model is built
  if (deck.model.moe.num_experts > 0)
    topo.set_expert_parallel(static_cast<int>(deck.parallel.ep), static_cast<int>(deck.parallel.expert_tp));
  if (deck.eval.only) return run_evaluation(deck, topo, fam);
  // SIGUSR1 / SIGTERM (time limit, preemption): checkpoint at the next iteration boundary, exit 3
  StopSignal stop;
  topo.print(std::cout);
  gemm_set_tf32(deck.precision.tf32);
  TrainingRun run(deck, fam, topo, stop);
  if (run.finished()) return 0;
  run.print_banner();
  return run.train();
}

}  // namespace trident
