// Where a training run starts (docs/DESIGN.md "Checkpoints"):
//   - checkpoint.load = auto: this run's own checkpoints in checkpoint.save when an earlier job
//     left some there (a checkpoint that fails to load gives way to the next older one, with a
//     message), else from scratch;
//   - an explicit checkpoint.load: that checkpoint, never another;
//   - checkpoint.finetune: the weights only (iteration, optimizer and schedule start afresh),
//     unless this fine-tuning run saved checkpoints already.
// A checkpoint must hold the same model (train/model_setup: model_differences).
#pragma once
#include <cstdint>

#include "comm/topology.hpp"
#include "io/deck.hpp"
#include "layers/param_store.hpp"
#include "models/model_factory.hpp"
#include "optim/adamw.hpp"
#include "optim/loss_scaler.hpp"

namespace trident {

struct StartPoint {
  std::int64_t iteration = 0, consumed = 0;  // iterations done and samples consumed
  bool resuming = false;                     // continues a checkpoint (optimizer state, schedule)
  bool finished = false;                     // the checkpoint is at train.iters: nothing to train
  // LoRA: the frozen base model's checkpoint file and digest (recorded in the run's checkpoints)
  std::string lora_base, lora_base_digest;
};

// Loads what the deck asks for into store, adamw (moments, and the fp32 masters of a 16-bit
// run) and scaler (an fp16 run with dynamic loss scaling), printing what it did on rank 0.
// Collective over topo's world.
StartPoint start_point(const Deck& deck, ModelFamily fam, const TransformerConfig& cfg, const HeadOptions& head,
                       std::int64_t vocab, ParamStore& store, AdamW& adamw, LossScaler& scaler, bool dynamic_loss_scale,
                       const Topology& topo);

}  // namespace trident
