// The named parts of a model's loss, summed over the micro-batches a head has run since it was
// last asked (LanguageModel::take_loss_parts) and reduced over the pipeline and data-parallel
// groups by the trainer:
//   lm:  the token-prediction part: BERT's masked-LM loss, T5's LM loss over decoder targets
//        (GPT reports its loss as the micro-batch's token sum instead and leaves these at 0);
//   sop: BERT's sentence-order (binary head) loss.
// `lm` and `sop` add the per-micro-batch means; the sums and counts behind them (labelled
// positions, samples with a sentence-order label) give the exact means over a whole batch.
#pragma once

namespace trident {

struct LossParts {
  double lm = 0, sop = 0;
  double lm_sum = 0, lm_count = 0, sop_sum = 0, sop_count = 0;
  void add(const LossParts& o) {
    lm += o.lm;
    sop += o.sop;
    lm_sum += o.lm_sum;
    lm_count += o.lm_count;
    sop_sum += o.sop_sum;
    sop_count += o.sop_count;
  }
};

}  // namespace trident
