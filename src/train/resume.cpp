// Where a training run starts (train/resume.hpp): from scratch, from a checkpoint's weights
// (fine-tuning), or continuing a checkpoint, with checkpoint.load = auto falling back to older
// checkpoints that load.
#include "train/resume.hpp"

#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>

#include "common/error.hpp"
#include "common/timer.hpp"
#include "checkpoint/checkpoint.hpp"
#include "train/model_setup.hpp"
#include "train/stop_signal.hpp"

namespace trident {

namespace {

// Rank 0's list of checkpoint files, on every rank.
std::vector<std::string> broadcast_list(const std::vector<std::string>& list, const Communicator& comm) {
  std::string joined;
  for (const auto& s : list) joined += s + '\n';
  std::vector<std::string> out;
  std::istringstream in(comm.broadcast_text(joined));
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// LoRA: the adapters of checkpoint `file` must have been trained with this run's lora keys (read
// before the tensors: another rank has other shapes)...
std::string lora_key_differences(const std::string& file, const char* family, const Deck& deck, const Topology& topo) {
  const Deck saved = parse_stored_deck(read_checkpoint_deck(file, family, topo.world().get()));
  if (saved.lora.rank == deck.lora.rank && saved.lora.alpha == deck.lora.alpha &&
      lora_targets(saved.lora.targets) == lora_targets(deck.lora.targets))
    return "";
  std::ostringstream os;
  os << "checkpoint " << file << " holds adapters of lora.rank " << saved.lora.rank << ", lora.alpha "
     << saved.lora.alpha << ", lora.targets " << saved.lora.targets << "; this run has " << deck.lora.rank << ", "
     << deck.lora.alpha << ", " << deck.lora.targets;
  return os.str();
}

// ... on this run's base model (its digest `digest`).
std::string lora_base_difference(const std::string& file, const std::string& base, const std::string& digest,
                                 const CheckpointState& st) {
  if (st.lora_base_digest == digest) return "";
  return "checkpoint " + file + " holds adapters trained on base model " + st.lora_base + " (digest " +
         st.lora_base_digest + "), but checkpoint.load is " + base + " (digest " + digest +
         "): another base model, or one that changed since";
}

}  // namespace

StartPoint start_point(const Deck& deck, ModelFamily fam, const TransformerConfig& cfg, const HeadOptions& head,
                       std::int64_t vocab, ParamStore& store, AdamW& adamw, LossScaler& scaler, bool dynamic_loss_scale,
                       const Topology& topo) {
  const Communicator& world = topo.world();
  const char* family = family_name(fam);
  const std::int64_t iters = deck.train.iters;
  StartPoint start;
  const bool root = world.rank() == 0;
  const bool half = cfg.dt != DType::F32, fp16 = cfg.dt == DType::F16;
  // checkpoint.load = auto: continue from checkpoint.save when an earlier job left one there
  std::string load = auto_checkpoint(deck.checkpoint.load, deck.checkpoint.save, world);
  if (root && deck.checkpoint.load == "auto" && load.empty() && !deck.checkpoint.save.empty())
    std::cout << "checkpoint.load auto: no checkpoint in '" << deck.checkpoint.save << "' yet, starting from scratch\n";
  const bool lora = store.has_adapters();
  if (lora) {  // the frozen base model (checkpoint.load), whether this run starts or resumes
    start.lora_base = resolve_checkpoint(deck.checkpoint.load);
    check_same_model(start.lora_base, family, fam, cfg, head, vocab, topo);
    const CheckpointState st = load_checkpoint(start.lora_base, family, store, nullptr, topo, TensorSet::base);
    start.lora_base_digest = checkpoint_digest(start.lora_base, world.get());
    if (root)
      std::cout << "LoRA: base model " << start.lora_base << " (" << st.model << ", iteration " << st.iteration
                << ", digest " << start.lora_base_digest << "), frozen\n";
  }
  if (deck.checkpoint.finetune) {  // weights only, unless this fine-tuning run saved checkpoints already
    const std::string own = auto_checkpoint("auto", deck.checkpoint.save, world);
    if (own.empty() && lora) {
      if (root)
        std::cout << "LoRA: adapters start afresh (B = 0: the model starts as the base model); iteration, "
                     "optimizer state and learning-rate schedule start afresh\n";
      load.clear();
    } else if (own.empty()) {
      const std::string file = resolve_checkpoint(deck.checkpoint.load);
      check_same_model(file, family, fam, cfg, head, vocab, topo);
      const CheckpointState st = load_checkpoint(file, family, store, nullptr, topo);
      if (half) adamw.init_master(cfg.dt, store.values16());  // fp32 masters from the loaded weights
      if (root)
        std::cout << "fine-tuning from " << file << " (" << st.model << ", iteration " << st.iteration
                  << "): weights only; iteration, optimizer state and learning-rate schedule start afresh\n";
      load.clear();
    } else {
      load = own;
      if (root) std::cout << "checkpoint.finetune: '" << own << "' holds this run's checkpoints, resuming them\n";
    }
  }
  start.resuming = !load.empty();
  if (start.resuming) {
    // checkpoint.load = auto resuming this run's own checkpoints: a checkpoint that fails to load
    // (corrupt: a checksum, an unreadable tensor; or written by a diverged run) gives way to the
    // next older one that loads, with a message; an explicit checkpoint.load never falls back
    const bool may_fall_back = deck.checkpoint.load == "auto" && !deck.checkpoint.finetune;
    std::vector<std::string> candidates;
    std::int64_t newest = std::numeric_limits<std::int64_t>::max();
    try {
      candidates.push_back(resolve_checkpoint(load));
      newest = checkpoint_iteration_of(candidates[0]);
    } catch (const Error& e) {  // `latest` unreadable or naming a missing checkpoint
      if (!may_fall_back) throw;
      if (root) std::cout << "warning: " << e.what() << "\ncheckpoint.load auto: trying the iter_* directories\n";
    }
    if (may_fall_back) {
      std::vector<std::string> older;
      if (root)
        for (const auto& f : checkpoints_newest_first(load))
          if (checkpoint_iteration_of(f) < newest) older.push_back(f);
      for (auto& f : broadcast_list(older, world)) candidates.push_back(std::move(f));
      TRIDENT_REQUIRE(!candidates.empty(), "checkpoint.load auto: '" << load << "' holds no checkpoint that loads");
    }
    std::string file;
    CheckpointState st;
    for (std::size_t c = 0;; ++c) {
      file = candidates[c];
      std::string diff;
      try {
        diff = model_differences(file, family, fam, cfg, head, vocab, topo);
        if (diff.empty() && lora) {
          diff = lora_key_differences(file, family, deck, topo);
          if (diff.empty()) {
            st = load_checkpoint(file, family, store, &adamw, topo, TensorSet::adapters);
            diff = lora_base_difference(file, start.lora_base, start.lora_base_digest, st);
          }
          if (diff.empty()) break;
        } else if (diff.empty()) {
          const double t0 = wall_seconds();
          LoadTimes lt;
          st = load_checkpoint(file, family, store, &adamw, topo, TensorSet::all, &lt);
          if (root)
            std::cout << "loaded checkpoint " << file << " in " << std::fixed << std::setprecision(2)
                      << wall_seconds() - t0 << " s (open " << lt.open << ", read " << lt.read << ", verify "
                      << lt.verify << ", place " << lt.place << ")" << std::defaultfloat << std::endl;
          break;
        }
      } catch (const Error& e) {
        if (!may_fall_back || e.scope() != Error::Scope::all_ranks) throw;
        if (c + 1 == candidates.size())
          throw Error::all(std::string(e.what()) + "\n(checkpoint.load auto: no checkpoint in '" + load +
                           "' loads; tried " + std::to_string(candidates.size()) + ")");
        if (root)
          std::cout << "warning: " << e.what() << "\ncheckpoint.load auto: falling back to " << candidates[c + 1]
                    << std::endl;
        continue;
      }
      TRIDENT_REQUIRE(diff.empty(), diff);  // another model: never a reason to fall back
    }
    start.iteration = st.iteration;
    start.consumed = st.consumed_samples;
    if (start.iteration >= iters) {  // a finished run (a job resubmitted once too often, say): nothing to do
      if (root)
        std::cout << "checkpoint " << file << " is at iteration " << start.iteration << " and train.iters is " << iters
                  << ": nothing left to train (raise train.iters to continue)" << std::endl;
      start.finished = true;
      return start;
    }
    if (fp16 && st.dtype == "fp16" && dynamic_loss_scale)
      scaler.restore(st.loss_scale, st.loss_scale_growth_tracker, st.loss_scale_hysteresis_tracker,
                     st.skipped_iterations);
    if (root) {
      std::cout << "resumed from " << file << " at iteration " << start.iteration << " (" << start.consumed
                << " samples consumed)\n";
      if (st.seed != deck.train.seed)
        std::cout << "warning: train.seed " << deck.train.seed << " differs from the checkpoint's " << st.seed
                  << ": the data order changes\n";
    }
  }
  return start;
}

}  // namespace trident
