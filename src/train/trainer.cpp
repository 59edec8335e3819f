// The generic pretraining loop of every model family (docs/DESIGN.md "Architecture"; the
// family's task, train/family_task, supplies the samples, loss normalisation and metric
// columns; models/model_factory its model):
//   for each iteration: zero grads; for each micro-batch of this DP rank: forward+backward
//   through the pipeline schedule (gradients of the global mean loss accumulate); reduce the
//   gradients over DP (bucketed and overlapped when asked; to the shards' owners under ZeRO-1);
//   unscale and check them (fp16); global grad norm; clip; AdamW; log; evaluate; checkpoint.
// Samples of an iteration, global order: micro-step k, DP rank r, slot j ->
//   sample consumed + (k * dp + r) * micro_batch + j   (Megatron's pretraining sampler).
// This file is the loop and its start-up summary (about 600 lines: the iteration's steps read
// best in one function, in the order they run); model building, resuming, evaluation, the
// families' tasks, the debugging taps and the end-of-run reports live beside it in train/.
#include "train/trainer.hpp"

#include "layers/layer_modules.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
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
#include "io/metrics.hpp"
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

}  // namespace

int run_training(const Deck& deck, ModelFamily fam) {
  const FamilyTask& task = task_of(fam);
  Topology topo(MPI_COMM_WORLD, static_cast<int>(deck.parallel.tp), static_cast<int>(deck.parallel.pp));
  const Communicator& world = topo.world();
  const bool root = world.rank() == 0;
  const char* family = family_name(fam);
  if (deck.eval.only) return run_evaluation(deck, topo, fam);
  // SIGUSR1 / SIGTERM (time limit, preemption): checkpoint at the next iteration boundary, exit 3
  StopSignal stop;
  topo.print(std::cout);
  gemm_set_tf32(deck.precision.tf32);

  const int dp = topo.dp_size(), dp_rank = topo.coords().dp;
  const std::int64_t S = deck.model.seq_length, mbs = deck.train.micro_batch_size, GB = deck.train.global_batch_size;
  TRIDENT_REQUIRE(GB % (mbs * dp) == 0, "deck: train.global_batch_size ("
                                            << GB << ") is not divisible by "
                                            << "train.micro_batch_size x data-parallel size (" << mbs << " x " << dp
                                            << ")");
  const std::int64_t acc = GB / (mbs * dp);
  TRIDENT_REQUIRE(deck.parallel.vp == 1 || acc % topo.pp_size() == 0,
                  "the interleaved pipeline schedule needs the micro-batches per iteration ("
                      << acc
                      << " = train.global_batch_size / (train.micro_batch_size x dp)) to be divisible by parallel.pp ("
                      << topo.pp_size() << ")");
  const std::int64_t iters = deck.train.iters;

  // ---- data ----
  SampleSource data;
  std::shared_ptr<void> data_owner;
  const std::int64_t valid_samples = deck.eval.interval > 0 ? deck.eval.iters * mbs * dp : 0;
  collectively(world.get(), [&] {
    const std::int64_t n = std::max<std::int64_t>(iters, 1) * GB;
    data = samples_of(fam, deck, n, valid_samples, data_owner);
    TRIDENT_REQUIRE(deck.eval.interval == 0 || data.valid,
                    "eval.interval > 0 but data.split '" << deck.data.split << "' leaves no validation documents");
  });
  std::int64_t vocab = data.vocab;
  if (deck.model.vocab_size > 0)
    TRIDENT_REQUIRE(deck.model.vocab_size == vocab,
                    "the shards have vocab_size " << vocab << " but model.vocab_size is " << deck.model.vocab_size);

  // ---- model and optimizer ----
  ParamStore store;
  const TransformerConfig cfg = make_config(deck, vocab, topo.tp_size(), fam);
  const HeadOptions head = head_options(deck);
  const TensorParallel tp = tensor_parallel(deck, topo);
  const std::vector<ModelStage> stages = chunks_of(deck, topo, cfg);
  if (cfg.encoder_decoder() && topo.pp_size() > 1) topo.set_decoder_stage(decoder_stage(deck, topo, cfg));
  store.set_dtype(cfg.dt);
  auto chunks = build_chunks(fam, cfg, head, store, mbs, tp, stages);
  LanguageModel& model = *chunks.front();
  // Flat buffers padded to equal data-parallel shards of a multiple of 4096 elements (the
  // optimizer kernel's chunk), in both optimizer modes so that they update alike.
  store.allocate(static_cast<std::int64_t>(dp) * 4096);
  store.initialize(static_cast<std::uint64_t>(deck.train.seed));
  const bool zero = distributed_optimizer(deck.optim.distributed, dp);
  // LoRA: only the adapters train (store.trainable_size(): the front of the buffers); the
  // optimizer, the gradient reductions and ZeRO-1's shards cover that range alone
  const bool lora = store.has_adapters();
  const std::int64_t trainable = store.trainable_size();
  const std::int64_t shard = trainable / dp, shard_begin = shard * dp_rank;
  AdamWConfig ac;
  ac.beta1 = deck.optim.beta1;
  ac.beta2 = deck.optim.beta2;
  ac.eps = deck.optim.eps;
  ac.weight_decay = deck.optim.weight_decay;
  // ZeRO-1: this DP rank's optimizer updates (and keeps moments for) its shard only.
  AdamW adamw(ac, zero ? shard : trainable, store.decay_size(), zero ? shard_begin : 0);
  // Mixed precision: fp32 master weights of the optimizer's range, from the 16-bit model
  // (Megatron's Float16Optimizer); replaced by the checkpoint's masters on resume.
  const bool half = cfg.dt != DType::F32, fp16 = cfg.dt == DType::F16;
  if (half) adamw.init_master(cfg.dt, store.values16());
  LossScalerConfig lsc;
  lsc.dynamic = fp16 && deck.precision.loss_scale == 0;
  lsc.initial = fp16 ? (deck.precision.loss_scale > 0 ? deck.precision.loss_scale : deck.precision.initial_loss_scale)
                     : 1.0;
  lsc.min_scale = std::min(deck.precision.min_loss_scale, lsc.initial);
  lsc.window = deck.precision.loss_scale_window;
  lsc.hysteresis = deck.precision.hysteresis;
  LossScaler scaler(lsc);
  const auto iterations_of = [](const std::string& key, const std::string& list) {
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
  };
  const std::vector<std::int64_t> force_overflow = iterations_of("debug.force_overflow", deck.debug.force_overflow);
  const std::vector<std::int64_t> dump_params_at = iterations_of("debug.dump_params_iters",
                                                                 deck.debug.dump_params_iters);
  LrSchedule sched;
  sched.lr = deck.optim.lr;
  sched.min_lr = deck.optim.min_lr;
  sched.warmup_iters = deck.optim.warmup_iters;
  sched.decay_iters = deck.optim.decay_iters;
  sched.style = deck.optim.decay_style;

  const StartPoint start = start_point(deck, fam, cfg, head, vocab, store, adamw, scaler, lsc.dynamic, topo);
  if (start.finished) return 0;
  std::int64_t iteration = start.iteration, consumed = start.consumed;
  const bool resuming = start.resuming;
  // weights, both moments and (16-bit runs) the fp32 masters, as fp32 tensors (LoRA: of the adapters)
  const std::int64_t checkpoint_bytes = (lora ? store.global_adapter_count() : store.global_count()) *
                                        static_cast<std::int64_t>(sizeof(float)) * (adamw.has_master() ? 4 : 3);
  {
    // everything this run will write, checked before its first iteration (collective)
    OutputPlan plan;
    plan.resuming = resuming;
    plan.checkpoint_bytes = checkpoint_bytes;
    check_outputs(deck, plan, world);
  }
  const std::string deck_text = deck.to_ini();
  Watchdog watchdog(deck.watchdog, world.rank());
  std::int64_t last_saved = -1;
  auto save = [&](std::int64_t it) {
    watchdog.slow_phase("checkpoint save", it);
    last_saved = it;
    CheckpointState st;
    st.model = family;
    st.iteration = it;
    st.consumed_samples = consumed;
    st.optimizer_steps = adamw.steps();
    st.seed = deck.train.seed;
    st.loss_scale = scaler.scale();
    st.loss_scale_growth_tracker = scaler.growth_tracker();
    st.loss_scale_hysteresis_tracker = scaler.hysteresis_tracker();
    st.skipped_iterations = scaler.skipped();
    st.dtype = deck.precision.dtype;
    st.deck = deck_text;
    st.lora_base = start.lora_base;
    st.lora_base_digest = start.lora_base_digest;
    check_room_for_checkpoint(deck.checkpoint.save, checkpoint_bytes, world);
    const std::string f = save_checkpoint(deck.checkpoint.save, st, store, &adamw, topo);
    if (root) std::cout << "saved checkpoint " << f << std::endl;
  };

  // tokens of an iteration (T5: encoder and decoder tokens)
  const double tokens_per_iter = static_cast<double>(GB * (S + (cfg.encoder_decoder() ? cfg.decoder_seq_length : 0)));
  const double flops_per_iter = model.flops_per_step(GB * S);
  if (root) {
    std::cout << task.banner << ": " << cfg.num_layers
              << (cfg.encoder_decoder() ? " encoder + " + std::to_string(cfg.decoder_layers) + " decoder"
                                        : std::string())
              << " layers, hidden " << cfg.hidden_size << ", heads " << cfg.num_heads << ", ffn " << cfg.ffn_hidden_size
              << ", seq " << S
              << (cfg.encoder_decoder() ? " (encoder), " + std::to_string(cfg.decoder_seq_length) + " (decoder)"
                                        : std::string())
              << ", vocab " << vocab << " (padded " << cfg.padded_vocab << "), " << store.global_count()
              << " parameters\n"
              << "layer: " << cfg.normalization << " (eps " << cfg.norm_epsilon << "), " <<
        [&] {
          std::ostringstream os;
          os << cfg.position_embedding_type;
          if (cfg.position_embedding_type == "rope") os << " (base " << cfg.rotary_base << ")";
          return os.str();
        }() << " positions, "
              << (cfg.groups() == cfg.num_heads ? "multi-head"
                  : cfg.groups() == 1           ? "multi-query"
                                                : "grouped-query")
              << " attention (" << cfg.num_heads << " heads, " << cfg.groups() << " key/value groups, "
              << cfg.head_dim() << " channels each" << (cfg.qk_layernorm ? ", q/k norms" : "") << ")"
              << ", " << cfg.mlp_activation() << " MLP, "
              << (cfg.add_bias_linear ? "biases"
                  : cfg.add_qkv_bias  ? "qkv bias only"
                                      : "no linear biases")
              << ", " << (cfg.untie_embeddings_and_output_weights ? "untied" : "tied") << " output layer\n"
              << "parallel: tp " << topo.tp_size() << (tp.sequence_parallel ? " with sequence parallelism" : "")
              << ", pp " << topo.pp_size()
              << (topo.pp_size() == 1    ? ""
                  : deck.parallel.vp > 1 ? " (interleaved 1F1B, vp " + std::to_string(deck.parallel.vp) + ")"
                                         : " (1F1B)")
              << ", dp " << dp << "; dropout hidden " << cfg.hidden_dropout << ", attention " << cfg.attention_dropout
              << "\n"
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
              << "batch: global " << GB << " = micro " << mbs << " x accumulation " << acc << " x dp " << dp
              << "; iterations " << iters << "; GEMM: " << gemm_backend_name() << "\n"
              << "optimizer: AdamW"
              << (zero ? ", distributed (ZeRO-1): each of the " + std::to_string(dp) + " data-parallel ranks keeps " +
                             std::to_string(shard) + " of " + std::to_string(trainable) + " elements' state"
                       : std::string())
              << "; precision: " << deck.precision.dtype
              << (half ? " (16-bit parameters and GEMM inputs, fp32 master weights, gradients, residual stream, "
                         "softmax and cross-entropy)"
                       : "")
              << (fp16 ? (lsc.dynamic ? "; dynamic loss scaling from " : "; constant loss scale ") +
                             std::to_string(lsc.initial)
                       : std::string())
              << "; recomputation: " << deck.precision.recompute
              << (lora ? "\nLoRA: rank " + std::to_string(cfg.lora_rank) + ", scale " + std::to_string(cfg.lora_scale) +
                             " (alpha / rank) on " + deck.lora.targets + ": " +
                             std::to_string(store.global_adapter_count()) + " adapter parameters train, the " +
                             std::to_string(store.global_count() - store.global_adapter_count()) +
                             " of the base model are frozen"
                       : std::string())
              << (deck.precision.recompute == "full"
                      ? " (" + deck.precision.recompute_method + ", " +
                            std::to_string(deck.precision.recompute_num_layers) + " layers)"
                      : std::string())
              << "\n"
              << "data: " << deck.data.train_shards << "\n"
              << data.description << "model FLOPs per iteration: " << flops_per_iter << " (" << model.flops_formula()
              << ")\n";
    if (deck.perf.peak_tflops > 0)
      std::cout << "MFU against a peak of " << deck.perf.peak_tflops << " TFLOP/s per rank"
                << (deck.perf.peak_name.empty() ? "" : " (" + deck.perf.peak_name + ")") << "\n";
    std::cout << std::flush;
  }

  MetricsWriter metrics, eval_metrics;
  if (root && !deck.log.metrics_file.empty()) {
    metrics = MetricsWriter(deck.log.metrics_file, task.train_columns(), resuming ? iteration : -1);
    if (deck.eval.interval > 0)
      eval_metrics = MetricsWriter(sibling_metrics_path(deck.log.metrics_file, "eval"), task.eval_columns(),
                                   resuming ? iteration : -1);
  }
  std::unique_ptr<BatchDumper> dumper;
  if (root && !deck.debug.dump_batches.empty())
    dumper = std::make_unique<BatchDumper>(deck.debug.dump_batches, resuming);

  std::int64_t tape_iteration = 0;  // the iteration the dropout tape's masks belong to
  std::unique_ptr<DropoutTape> tape;
  if (!deck.debug.dump_dropout.empty()) {
    // the tape is a sequence of forward calls: one rank, each forward pass run once
    TRIDENT_REQUIRE(world.size() == 1 && deck.precision.recompute == "none",
                    "debug.dump_dropout records the masks of a one-rank run without recomputation (this run has "
                        << world.size() << " ranks, recomputation " << deck.precision.recompute << ")");
    tape = std::make_unique<DropoutTape>(deck.debug.dump_dropout, &tape_iteration);
  }

  if (!deck.checkpoint.save.empty() && deck.checkpoint.save_initial && iteration == 0) save(0);

  std::int64_t consecutive_skips = 0;  // fp16: overflowing iterations in a row
  Batch batch(mbs, S, fam, deck.model.decoder_seq_length);
  // GPT: the loss is the mean over the iteration's tokens; BERT: the mean over its micro-batches
  // of each micro-batch's MLM (mean over its labelled positions) + sentence-order loss; T5: the
  // mean over its micro-batches of each one's mean over its decoder targets (Megatron's T5)
  const double loss_count = task.loss_per_micro_batch ? static_cast<double>(acc * dp) : static_cast<double>(GB * S);
  const double dscale_unscaled = 1.0 / loss_count;
  const FloatView grads = store.grads();
  PhaseTimers timers;

  PipelineRunner runner(raw(chunks), topo);
  runner.grouped_p2p = deck.debug.grouped_p2p;
  runner.record = !deck.log.timeline_file.empty();
  // Overlapped, bucketed data-parallel reduction (one bucket per layer, started by the backward
  // pass of the iteration's last micro-batch).
  const bool overlap = deck.parallel.overlap_grad_reduce && dp > 1;
  GradReducer reducer(store, topo.dp_group(), zero ? shard : 0);
  if (overlap)
    for (auto& chunk : chunks) chunk->on_layer_grads_ready = [&](std::int64_t l) { reducer.layer_ready(l); };
  // A read of this rank's samples can fail on this rank alone (a shard truncated under the job:
  // its mapping's SIGBUS becomes an Error naming the shard) while the other ranks are already in
  // the iteration's collectives. Such an error is kept, the window is filled with token 0, the
  // iteration runs to its end, and every rank leaves together at the collective data check below,
  // before the step uses the data.
  DeferredReadError read_error;
  // micro-batch k of the current iteration, read on a helper thread while k - 1 computes
  Prefetcher prefetch(
      [&](std::int64_t k, std::vector<std::int32_t>& w) {
        const std::int64_t first = consumed + (k * dp + dp_rank) * mbs;
        read_error.run(w, [&] {
          for (std::int64_t j = 0; j < mbs; ++j) data.train(first + j, w.data() + j * batch.width);
        });
      },
      static_cast<std::size_t>(mbs * batch.width), deck.data.prefetch);
  auto evaluate = [&](std::int64_t it) {
    double sum = runner.evaluate(
        deck.eval.iters,
        [&](std::int64_t k, MicroBatch& mb) {
          read_error.run(batch.window, [&] {
            for (std::int64_t j = 0; j < mbs; ++j)
              data.valid((k * dp + dp_rank) * mbs + j, batch.window.data() + j * batch.width);
          });
          batch.finish(vocab, mb);
        },
        [&](std::int64_t) { return mbs; });
    agree_or_throw(world.get(), read_error.take_or(TokenShardReader::check_touched_shards()));
    sum = topo.dp_group().allreduce_sum(topo.pp_group().allreduce_sum(sum));
    const double n = task.loss_per_micro_batch ? static_cast<double>(deck.eval.iters * dp)
                                               : static_cast<double>(deck.eval.iters * mbs * dp * S);
    const double loss = sum / n;
    const LossParts parts = task.loss_per_micro_batch ? reduce_loss_parts(chunks, topo) : LossParts{};
    if (root) {
      std::cout << std::setprecision(6) << " validation at iteration " << it << " | loss " << loss;
      if (task.reports_loss_parts)
        std::cout << " | lm loss " << parts.lm / n << " | sop loss " << parts.sop / n << std::endl;
      else
        std::cout << " | ppl " << std::exp(loss) << std::endl;
      eval_metrics.write(task.reports_loss_parts
                             ? std::vector<double>{static_cast<double>(it), loss, parts.lm / n, parts.sop / n}
                             : std::vector<double>{static_cast<double>(it), loss, std::exp(loss)});
    }
  };

  topo.tp_group().reset_stats();
  topo.dp_group().reset_stats();
  double bubble_sum = 0;
  const std::int64_t first_iteration = iteration;
  const double t_start = wall_seconds();
  double t_last = t_start;
  std::int64_t iters_since_log = 0;
  // [begin, end) of the gradients already zero: the optimizer's range after an update that
  // zeroed it in the same sweep (AdamW::GradsAfter::zero), nothing before the first iteration
  std::int64_t grads_zero_begin = 0, grads_zero_end = 0;
  stop.arm();  // from here a signal checkpoints at the next iteration boundary (before: exit 4 at once)
  while (iteration < iters) {
    const std::int64_t it = iteration + 1;
    tape_iteration = it;
    const double t0 = wall_seconds();
    watchdog.iteration(it);
    store.zero_grads(grads_zero_begin, grads_zero_end);  // all but what the last update zeroed
    grads_zero_begin = grads_zero_end = 0;
    timers.start("forward-backward");
    progress::set_phase("forward-backward");
    const double pipe_t0 = wall_seconds(), busy0 = runner.forward_seconds() + runner.backward_seconds();
    // fp16: the loss gradient is multiplied by the loss scale (1 otherwise)
    const float dscale = static_cast<float>(dscale_unscaled * scaler.scale());
    const double scale_used = scaler.scale();
    double loss_sum = runner.train(
        acc,
        [&](std::int64_t k, MicroBatch& mb) {
          const std::vector<std::int32_t>& w = prefetch.get(k, acc);
          std::copy(w.begin(), w.end(), batch.window.begin());
          batch.finish(vocab, mb);
        },
        dscale,
        [&](std::int64_t k) {
          // Dropout streams keyed by the global micro-batch index: independent of dp and of the
          // accumulation split, and exactly reproduced on resume.
          DropoutStreams rng;
          rng.training = true;
          rng.step = static_cast<std::uint64_t>((consumed + (k * dp + dp_rank) * mbs) / mbs);
          rng.shared = static_cast<std::uint64_t>(deck.train.seed);
          rng.tp_local = static_cast<std::uint64_t>(deck.train.seed) + 2718 +
                         static_cast<std::uint64_t>(topo.coords().tp);
          return rng;
        });
    prefetch.drain();
    // the shards this iteration read must still be the files opened (a shard truncated or replaced
    // under the job reads as zeros or as another corpus): checked before the step uses the data
    progress::set_phase("shard check");
    agree_or_throw(world.get(), read_error.take_or(TokenShardReader::check_touched_shards()));
    // bubble as Megatron defines it: idle time over busy (forward + backward) time of a stage
    const double span = wall_seconds() - pipe_t0;
    const double busy = runner.forward_seconds() + runner.backward_seconds() - busy0;
    if (iteration > first_iteration)  // the first iteration also allocates activation slots
      bubble_sum += busy > 0 ? (span - busy) / busy : 0.0;
    timers.stop("forward-backward");
    timers.start("grad-allreduce");
    progress::set_phase("grad-allreduce");
    if (overlap) reducer.wait();        // the layers' buckets, started during the backward pass
    if (tp.sequence_parallel && !lora)  // replicated parameters saw only this rank's rows
      tp_allreduce(tp, slice(grads, store.replicated_begin(), store.replicated_end() - store.replicated_begin()),
                   store.replicated_end() - store.replicated_begin());
    else if (!lora && topo.tp_size() > 1 && store.replicated_end() > store.tp_partial_begin())  // q/k norms
      tp_allreduce(tp, slice(grads, store.tp_partial_begin(), store.replicated_end() - store.tp_partial_begin()),
                   store.replicated_end() - store.tp_partial_begin());
    if (lora && topo.tp_size() > 1) {  // the replicated adapters' gradients are partial sums over TP
      const std::int64_t b = store.adapter_replicated_begin(), n = store.adapter_replicated_end() - b;
      tp_allreduce(tp, slice(grads, b, n), n);
    }
    for (auto& chunk : chunks) {  // tied embeddings: the stages that hold them sum their gradients
      if (lora) break;            // (frozen with LoRA)
      if (topo.pp_size() > 1 && chunk->word_embeddings() >= 0 && !cfg.untie_embeddings_and_output_weights) {
        const FloatView g = store.grad(chunk->word_embeddings());
        topo.embedding_group().allreduce_sum(g.data(), static_cast<std::int64_t>(g.extent(0)));
      }
      if (cfg.encoder_decoder() && topo.pp_size() > 1 &&
          chunk->position_embeddings() >= 0) {  // first and decoder stage
        const FloatView g = store.grad(chunk->position_embeddings());
        topo.position_group().allreduce_sum(g.data(), static_cast<std::int64_t>(g.extent(0)));
      }
    }
    if (overlap)
      reducer.reduce_rest();  // what no layer bucket covered (to the shards' owners with ZeRO-1)
    else if (zero)            // each DP rank receives the sum of its shard only
      topo.dp_group().reduce_scatter_in_place(grads.data(), shard);
    else {  // the same reduce-scatter, then every shard to every rank: the sums (and so the
            // updates) are bitwise those of ZeRO-1 at any dp, which a library all-reduce, free
            // to add in another order, is not beyond dp = 2
      topo.dp_group().reduce_scatter_in_place(grads.data(), shard);
      topo.dp_group().allgather_in_place(grads.data(), shard);
    }
    loss_sum = topo.dp_group().allreduce_sum(topo.pp_group().allreduce_sum(loss_sum));
    const LossParts parts = task.loss_per_micro_batch ? reduce_loss_parts(chunks, topo)
                                                      : LossParts{};  // (T5: resets the model's sums)
    timers.stop("grad-allreduce");
    timers.start("optimizer");
    progress::set_phase("optimizer");
    const double loss = loss_sum / loss_count;
    // Loss scaling (fp16): unscale the optimizer's range of the main gradients, check it for
    // inf/NaN, agree on the verdict over every rank, and skip the step on overflow.
    const FloatView opt_grads = slice(grads, adamw.begin(), adamw.size());
    if (std::find(force_overflow.begin(), force_overflow.end(), it) != force_overflow.end() && world.rank() == 0)
      Kokkos::deep_copy(slice(opt_grads, 0, 1), std::numeric_limits<float>::infinity());
    bool skip = false;
    if (fp16) {
      if (scale_used != 1.0) scale(opt_grads, static_cast<float>(1.0 / scale_used), adamw.size());
      const bool found_inf = world.allreduce_max(has_nonfinite(opt_grads, adamw.size()) ? 1.0 : 0.0) > 0;
      // a run that keeps overflowing has diverged: stop it rather than skip forever (and never
      // checkpoint its non-finite state); every rank decides alike from the agreed verdict
      TRIDENT_REQUIRE(!(found_inf && lsc.dynamic && scaler.scale() <= lsc.min_scale),
                      "iteration " << it << ": the fp16 gradients overflow at the minimum loss scale (" << lsc.min_scale
                                   << "): training has diverged (loss " << loss_sum / loss_count
                                   << "); lower optim.lr, or train in bf16");
      skip = scaler.update(found_inf);
      consecutive_skips = skip ? consecutive_skips + 1 : 0;
      TRIDENT_REQUIRE(
          deck.precision.max_skipped_iterations == 0 || consecutive_skips < deck.precision.max_skipped_iterations,
          "iteration " << it << ": " << consecutive_skips << " fp16 iterations in a row overflowed and were "
                       << "skipped (precision.max_skipped_iterations): training has diverged; lower optim.lr, "
                       << "or train in bf16");
    }
    const double gnorm = skip ? std::nan("") : global_grad_norm(store, topo, shard_begin, shard_begin + shard);
    TRIDENT_REQUIRE(skip || (std::isfinite(loss) && std::isfinite(gnorm)),
                    "iteration " << it << ": the loss or gradient is not finite (loss " << loss << ", grad norm "
                                 << gnorm << "); lower optim.lr or check the data");
    if (it == 1 && !deck.debug.dump_grads.empty()) {
      if (zero) topo.dp_group().allgather_in_place(grads.data(), shard);  // debug only: every shard
      save_named_tensors(deck.debug.dump_grads, "", store, grads, it, topo);
    }
    if (tape) tape->flush();
    if (dumper) {
      std::vector<std::int32_t> rows(static_cast<size_t>(GB * batch.width));
      for (std::int64_t i = 0; i < GB; ++i) data.train(consumed + i, rows.data() + i * batch.width);
      dumper->write(it, rows, GB, batch.width);
    }
    float clip = 1.f;
    if (deck.optim.clip_grad > 0) {
      const double c = deck.optim.clip_grad / (gnorm + 1e-6);
      if (c < 1.0) clip = static_cast<float>(c);
    }
    const double lr = sched.at(it);
    if (skip) {
      // overflow: no update (Megatron's skipped iteration); the schedule still advances
    } else if (half) {
      adamw.step_mixed(store.values16(), grads, lr, clip, AdamW::GradsAfter::zero);
      if (zero) topo.dp_group().allgather_in_place(store.values16().data(), shard);  // 16-bit shards to every rank
    } else {
      adamw.step(store.values(), grads, lr, clip, AdamW::GradsAfter::zero);
      if (zero) topo.dp_group().allgather_in_place(store.values().data(), shard);  // updated shards to every rank
    }
    if (!skip) {  // the update zeroed the gradients it read: the next iteration zeroes only the rest
      grads_zero_begin = adamw.begin();
      grads_zero_end = adamw.begin() + adamw.size();
    }
    timers.stop("optimizer");
    if (!deck.debug.dump_params.empty() &&
        std::find(dump_params_at.begin(), dump_params_at.end(), it) != dump_params_at.end()) {
      // the updated parameters (16-bit runs: the 16-bit model widened, as in a checkpoint)
      std::ostringstream name;
      name << "iter_" << std::setw(7) << std::setfill('0') << it << ".h5";
      const FloatView values = half ? Kokkos::create_mirror_view_and_copy(FloatView::memory_space(),
                                                                          store.model_to_host())
                                    : store.values();
      save_named_tensors((std::filesystem::path(deck.debug.dump_params) / name.str()).string(), "", store, values, it,
                         topo);
    }
    consumed += GB;
    iteration = it;
    ++iters_since_log;

    const double t1 = wall_seconds();
    const double dt = t1 - t0;
    watchdog.iteration_done(dt);
    const double tps = tokens_per_iter / dt;
    const double tflops = flops_per_iter / dt / world.size() / 1e12;
    const double mfu = deck.perf.peak_tflops > 0 ? tflops / deck.perf.peak_tflops : std::nan("");
    if (root) {
      std::vector<double> row = {static_cast<double>(it),
                                 static_cast<double>(consumed),
                                 loss,
                                 lr,
                                 gnorm,
                                 scale_used,
                                 skip ? 1.0 : 0.0,
                                 dt * 1e3,
                                 tps,
                                 tflops,
                                 mfu};
      if (task.reports_loss_parts) row.insert(row.begin() + 3, {parts.lm / loss_count, parts.sop / loss_count});
      metrics.write(row);
      if (it % deck.log.interval == 0 || it == iters) {
        const double per_iter = (t1 - t_last) / static_cast<double>(iters_since_log);
        std::ostringstream os;
        os << " iter " << std::setw(6) << it << "/" << iters << " | loss " << std::fixed << std::setprecision(4)
           << loss;
        if (task.reports_loss_parts)
          os << " | lm loss " << parts.lm / loss_count << " | sop loss " << parts.sop / loss_count;
        os << " | lr " << std::scientific << std::setprecision(3) << lr << std::fixed << " | gnorm "
           << std::setprecision(3) << gnorm << " | " << std::setprecision(1) << per_iter * 1e3 << " ms/it | "
           << std::setprecision(0) << tokens_per_iter / per_iter << " tok/s | " << std::setprecision(3)
           << flops_per_iter / per_iter / world.size() / 1e12 << " TFLOP/s/rank";
        if (deck.perf.peak_tflops > 0) os << " | MFU " << std::setprecision(1) << 100.0 * mfu << "%";
        if (fp16)
          os << " | loss scale " << std::defaultfloat << std::setprecision(6) << scale_used << std::fixed
             << " | skipped " << scaler.skipped();
        os << " | ETA " << hms(per_iter * static_cast<double>(iters - it));
        std::cout << os.str() << std::endl;
        t_last = t1;
        iters_since_log = 0;
      }
    }
    if (deck.eval.interval > 0 && (it % deck.eval.interval == 0 || it == iters)) {
      watchdog.slow_phase("evaluation", it);
      evaluate(it);
    }
    if (!deck.checkpoint.save.empty() &&
        ((deck.checkpoint.interval > 0 && it % deck.checkpoint.interval == 0) || it == iters))
      save(it);
    if (const int sig = stop.agreed(world); sig != 0 && it < iters) {  // time limit or preemption
      if (deck.checkpoint.save.empty()) {
        if (root)
          std::cout << "received " << StopSignal::name(sig) << ": stopping after iteration " << it
                    << " without a checkpoint (checkpoint.save is not set); exit code " << kExitStoppedNoCheckpoint
                    << std::endl;
        return kExitStoppedNoCheckpoint;
      }
      if (last_saved != it) save(it);
      if (root)
        std::cout << "received " << StopSignal::name(sig) << ": stopped after iteration " << it << " of " << iters
                  << " with a checkpoint in '" << deck.checkpoint.save << "'; exit code " << kExitCheckpointed
                  << " (resubmit with --checkpoint.load auto to continue)" << std::endl;
      return kExitCheckpointed;
    }
  }
  watchdog.idle();
  const double trained = static_cast<double>(std::max<std::int64_t>(iteration - first_iteration - 1, 1));
  const double bubble = topo.world().allreduce_sum(bubble_sum / trained) / topo.world_size();
  // Per-rank timers, gathered to rank 0: forward, backward, p2p wait, gradient reduction, optimizer.
  std::vector<double> mine = {runner.forward_seconds(), runner.backward_seconds(), runner.p2p_seconds(),
                              timers.totals().count("grad-allreduce") ? timers.totals().at("grad-allreduce") : 0.0,
                              timers.totals().count("optimizer") ? timers.totals().at("optimizer") : 0.0};
  print_rank_timers(mine, topo);
  // ---- memory accounting, per rank, beside Megatron's and Korthikanti et al.'s figures ----
  {
    MemoryFigures mf;
    mf.params = static_cast<double>(store.model_bytes());
    mf.grads = 4.0 * static_cast<double>(store.padded_size());
    mf.optimizer = static_cast<double>(adamw.state_bytes());
    mf.local_params = static_cast<double>(store.size());
    for (auto& chunk : chunks) {
      mf.activations += static_cast<double>(chunk->num_slots()) *
                        static_cast<double>(chunk->activation_bytes_per_slot());
      mf.workspace += static_cast<double>(chunk->workspace_bytes());
      mf.slots = std::max(mf.slots, static_cast<double>(chunk->num_slots()));
    }
    mf.layer_activations = model.layer_activation_bytes();
    ActivationModel am;
    am.s = static_cast<double>(S);
    am.b = static_cast<double>(mbs);
    am.h = static_cast<double>(cfg.hidden_size);
    am.a = static_cast<double>(cfg.num_heads);
    am.t = static_cast<double>(topo.tp_size());
    am.sp = tp.sequence_parallel;
    am.e = static_cast<double>(dtype_bytes(cfg.dt));  // bytes of a stored activation value
    am.recompute = deck.precision.recompute;
    am.flash = deck.model.flash_attention;
    am.mlp = static_cast<double>((make_mlp_activation(cfg)->blocks() + 1) * cfg.ffn_hidden_size) /
             static_cast<double>(cfg.hidden_size);
    am.qkv = static_cast<double>(cfg.qkv_width()) / static_cast<double>(cfg.hidden_size);
    am.proj = static_cast<double>(cfg.q_width()) / static_cast<double>(cfg.hidden_size);
    if (cfg.qk_layernorm)
      am.qk_norm = static_cast<double>(cfg.q_width() + cfg.kv_width()) / static_cast<double>(cfg.hidden_size);
    am.block = deck.precision.recompute_method == "block";
    am.group = static_cast<double>(deck.precision.recompute_num_layers);
    am.layers = static_cast<double>(model.num_layers());
    // (T5: encoder and decoder layers differ in shape; the formula is for one kind of layer)
    const double formula = !cfg.encoder_decoder() && model.num_layers() > 0 ? korthikanti_layer_bytes(am) : 0.0;
    print_memory_report(mf, am, formula, deck.precision.dtype, zero, topo, deck.log.memory_file);
  }
  if (!deck.log.timeline_file.empty()) write_timeline(deck.log.timeline_file, runner.events(), topo, t_start);
  if (root && topo.pp_size() > 1) {
    std::cout
        << std::fixed << std::setprecision(3) << "pipeline bubble: measured " << bubble
        << " (idle over busy time of the forward-backward phase, mean over ranks and iterations), theory (p-1)/m = "
        << static_cast<double>(topo.pp_size() - 1) / static_cast<double>(acc * deck.parallel.vp)
        << (deck.parallel.vp > 1 ? " (interleaved: (p-1)/(v m))" : "") << " (p " << topo.pp_size() << ", v "
        << deck.parallel.vp << ", m " << acc << "); p2p wait " << runner.p2p_seconds() << " s on rank 0" << std::endl;
    if (!deck.log.timeline_file.empty()) std::cout << "timeline: " << deck.log.timeline_file << std::endl;
  }
  if (root) print_run_totals(iteration, consumed, wall_seconds() - t_start, iteration - first_iteration, timers, topo);
  return 0;
}

}  // namespace trident
