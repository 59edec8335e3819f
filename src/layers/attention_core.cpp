// The core-attention slot's entries (attention_core.hpp) and its registry. A new entry adds its
// class and one line to the registry below.
#include "layers/attention_core.hpp"

#include <cstdio>
#include <functional>
#include <sstream>
#include <utility>

#include "common/error.hpp"
#include "layers/transformer_layer.hpp"
#include "common/device_parallel.hpp"
#include "ops/flash_attention.hpp"
#include "ops/mixed_precision.hpp"
#include "ops/sdpa.hpp"

namespace trident {

namespace {

// ---- unfused: probabilities (B, nh/tp, T, T) and context through GEMMs ----------------------------

struct UnfusedKept final : AttentionKept {
  Act att, att_drop;  // the softmax output, and after dropout (with attention dropout)
  // false under selective recomputation: att / att_drop are the scratch's, recomputed in the
  // backward pass from qkv (Megatron's core-attention recomputation)
  bool own = true;
  std::int64_t bytes() const override { return own ? att.bytes() + att_drop.bytes() : 0; }
};
struct UnfusedScratch final : AttentionCoreScratch {
  Act att, att_drop;  // selective recomputation's shared probabilities
  std::int64_t bytes() const override { return att.bytes() + att_drop.bytes(); }
};

class UnfusedCore final : public AttentionCore {
 public:
  explicit UnfusedCore(const TransformerShape& s) : s_(s) {}
  const char* kind() const override { return "unfused"; }
  std::shared_ptr<AttentionCoreScratch> make_scratch(bool selective) const override {
    auto w = std::make_shared<UnfusedScratch>();
    if (selective) {
      const std::int64_t As = probs();
      w->att = make_act(s_.dt, "scratch::att", As);
      if (s_.attention_dropout > 0.f) w->att_drop = make_act(s_.dt, "scratch::att_drop", As);
    }
    return w;
  }
  std::shared_ptr<AttentionKept> make_kept(AttentionCoreScratch& scratch, bool keep_attention) const override {
    auto k = std::make_shared<UnfusedKept>();
    k->own = keep_attention;
    if (keep_attention) {
      k->att = make_act(s_.dt, "layer::att", probs());
      if (s_.attention_dropout > 0.f) k->att_drop = make_act(s_.dt, "layer::att_drop", probs());
    } else {
      auto& w = static_cast<UnfusedScratch&>(scratch);
      TRIDENT_REQUIRE(w.att.size() > 0, "internal: selective recomputation needs the attention workspace");
      k->att = w.att;
      k->att_drop = w.att_drop;
    }
    return k;
  }
  void forward(const AttentionIo& io, AttentionKept& kept, AttentionCoreScratch&, const AttentionShape& as,
               const DropoutSpec& drop) const override {
    auto& k = static_cast<UnfusedKept&>(kept);
    attention_probs(k.att, k.att_drop, io.qkv, as, drop, io.mask, io.work);
    attention_context(io.atty, drop.active() ? k.att_drop : k.att, io.qkv, as, io.work);  // (BT, C/tp)
  }
  // selective recomputation: the probabilities (and their dropout) again from the kept qkv
  bool backward(const AttentionIo& io, AttentionKept& kept, AttentionCoreScratch&, const AttentionShape& as,
                const DropoutSpec& drop) const override {
    auto& k = static_cast<UnfusedKept&>(kept);
    if (!k.own) attention_probs(k.att, k.att_drop, io.qkv, as, drop, io.mask, io.work);
    attention_backward(io.dqkv, io.datty, io.qkv, k.att, k.att_drop, io.work.scores, as, drop, io.mask, io.work);
    return false;
  }

 private:
  std::int64_t probs() const { return s_.B * (s_.num_heads / s_.tp.size()) * s_.T * s_.T; }
  TransformerShape s_;
};

// ---- the fused kernel and the context-parallel entries built on it: a log-sum-exp per row kept -----

struct LseKept final : AttentionKept {
  FloatView lse;  // (B, nh/tp, T)
  std::int64_t bytes() const override { return static_cast<std::int64_t>(lse.span()) * 4; }
};
// delta (B, nh/tp, T) for the backward pass, and the context-parallel entries' buffers
struct FusedScratch final : AttentionCoreScratch {
  FloatView delta;
  RingScratch ring;
  UlyssesScratch a2a;
  std::int64_t bytes() const override {
    return static_cast<std::int64_t>(delta.span()) * 4 + ring.bytes() + a2a.bytes();
  }
};

enum class FusedKind { fused, ring, a2a };

class FusedCore final : public AttentionCore {
 public:
  FusedCore(const TransformerShape& s, FusedKind k) : s_(s), kind_(k) {
    TRIDENT_REQUIRE(s.flash_attention, "internal: the " << kind() << " attention runs the fused kernel");
    TRIDENT_REQUIRE(k == FusedKind::fused || (s.tp.cp_size() > 1 && s.tp.cp),
                    "internal: the " << kind() << " attention needs a context-parallel group");
  }
  const char* kind() const override {
    return kind_ == FusedKind::fused ? "fused" : (kind_ == FusedKind::ring ? "ring" : "a2a");
  }
  std::shared_ptr<AttentionCoreScratch> make_scratch(bool) const override {
    auto w = std::make_shared<FusedScratch>();
    const std::int64_t p = s_.tp.size(), BT = s_.rows(), Ql = s_.q_width() / p, Wl = s_.qkv_width() / p;
    w->delta = make_float("scratch::delta", s_.B * (s_.num_heads / p) * s_.T);
    if (kind_ == FusedKind::ring) w->ring = RingScratch(s_.dt, BT, Ql, Wl - Ql);
    if (kind_ == FusedKind::a2a) w->a2a = UlyssesScratch(s_.dt, BT, Ql, Wl, s_.tp.cp_size());
    return w;
  }
  std::shared_ptr<AttentionKept> make_kept(AttentionCoreScratch&, bool) const override {
    auto k = std::make_shared<LseKept>();
    k->lse = make_float("layer::lse", s_.B * (s_.num_heads / s_.tp.size()) * s_.T);
    return k;
  }
  void forward(const AttentionIo& io, AttentionKept& kept, AttentionCoreScratch& scratch, const AttentionShape& as,
               const DropoutSpec& drop) const override {
    const FloatView& lse = static_cast<LseKept&>(kept).lse;
    auto& w = static_cast<FusedScratch&>(scratch);
    switch (kind_) {
      case FusedKind::fused: flash_attention_forward(io.atty, lse, io.qkv, as, drop, io.mask); break;
      case FusedKind::ring: ring_attention_forward(io.atty, lse, io.qkv, as, drop, io.mask, *s_.tp.cp, w.ring); break;
      case FusedKind::a2a: ulysses_attention_forward(io.atty, lse, io.qkv, as, drop, io.mask, *s_.tp.cp, w.a2a); break;
    }
  }
  bool backward(const AttentionIo& io, AttentionKept& kept, AttentionCoreScratch& scratch, const AttentionShape& as,
                const DropoutSpec& drop) const override {
    const FloatView& lse = static_cast<LseKept&>(kept).lse;
    auto& w = static_cast<FusedScratch&>(scratch);
    switch (kind_) {
      case FusedKind::fused:
        flash_attention_backward(io.dqkv, io.datty, io.qkv, io.atty, lse, w.delta, as, drop, io.mask);
        break;
      case FusedKind::ring:
        ring_attention_backward(io.dqkv, io.datty, io.qkv, io.atty, lse, w.delta, as, drop, io.mask, *s_.tp.cp, w.ring);
        break;
      case FusedKind::a2a:
        ulysses_attention_backward(io.dqkv, io.datty, io.qkv, io.atty, lse, w.delta, as, drop, io.mask, *s_.tp.cp,
                                   w.a2a);
        break;
    }
    return false;
  }

 private:
  TransformerShape s_;
  FusedKind kind_;
};

// ---- cudnn: cuDNN's fused attention (ops/sdpa), a log-sum-exp per row kept as the fused kernel's ----

// The core attention of the shape as one TP rank sees it.
AttentionShape rank_shape(const TransformerShape& s) {
  const std::int64_t p = s.tp.size();
  AttentionShape as{s.B, s.T, s.q_width() / p, s.num_heads / p};
  as.ng = s.groups() / p;
  return as;
}

// "" when the cudnn entry can serve the shape's self-attention, else why not.
std::string cudnn_refusal(const TransformerShape& s) {
  if (!kDeviceKernels) return "a host build, where the cudnn entry does not run";
  if (s.tp.cp_size() > 1) return "context parallelism (ring and a2a run Trident's kernel)";
  const std::string why = sdpa_unavailable();
  if (!why.empty()) return why;
  return sdpa_plan(rank_shape(s), s.dt, s.causal, s.attention_p()).error;
}

struct CudnnKept final : AttentionKept {
  FloatView lse;  // (B, nh/tp, T)
  // this micro-batch's mask is one cuDNN cannot express (sdpa_mask_error): Trident's fused kernel
  // ran its forward pass and runs its backward pass
  bool local = false;
  std::int64_t bytes() const override { return static_cast<std::int64_t>(lse.span()) * 4; }
};
struct CudnnScratch final : AttentionCoreScratch {
  HalfView dy16, dqkv16;  // the backward pass's 16-bit incoming gradient and dq|dk|dv
  FloatView delta;        // Trident's kernel's backward pass (a mask cuDNN cannot express)
  IntView q_len;          // (B) T: every query row of a padded sample is computed (SdpaLengths::q)
  std::int64_t bytes() const override {
    return static_cast<std::int64_t>(dy16.span() + dqkv16.span()) * 2 +
           static_cast<std::int64_t>(delta.span() + q_len.span()) * 4;
  }
};

class CudnnCore final : public AttentionCore {
 public:
  explicit CudnnCore(const TransformerShape& s) : s_(s) {
    const std::string why = cudnn_refusal(s);
    TRIDENT_REQUIRE(why.empty(), "cuDNN's fused attention cannot serve this model: " << why);
  }
  const char* kind() const override { return "cudnn"; }
  std::shared_ptr<AttentionCoreScratch> make_scratch(bool) const override {
    auto w = std::make_shared<CudnnScratch>();
    const std::int64_t p = s_.tp.size(), BT = s_.rows();
    w->dy16 = make_half("scratch::sdpa_dy16", BT * (s_.q_width() / p));
    w->dqkv16 = make_half("scratch::sdpa_dqkv16", BT * (s_.qkv_width() / p));
    w->delta = make_float("scratch::delta", s_.B * (s_.num_heads / p) * s_.T);
    w->q_len = make_int("scratch::sdpa_q_len", s_.B);
    Kokkos::deep_copy(w->q_len, static_cast<std::int32_t>(s_.T));
    return w;
  }
  std::shared_ptr<AttentionKept> make_kept(AttentionCoreScratch&, bool) const override {
    auto k = std::make_shared<CudnnKept>();
    k->lse = make_float("layer::lse", s_.B * (s_.num_heads / s_.tp.size()) * s_.T);
    return k;
  }
  void forward(const AttentionIo& io, AttentionKept& kept, AttentionCoreScratch& scratch, const AttentionShape& as,
               const DropoutSpec& drop) const override {
    auto& k = static_cast<CudnnKept&>(kept);
    const std::string why = sdpa_mask_error(io.mask);
    k.local = !why.empty();
    if (k.local) {
      note_local(why);
      flash_attention_forward(io.atty, k.lse, io.qkv, as, drop, io.mask);
      return;
    }
    sdpa_forward(plan(io, as, drop), io.qkv, io.atty, k.lse, drop, lengths(io, scratch));
  }
  // cuDNN reads a 16-bit dO: the output projection may write it straight into the entry's buffer
  HalfView output_grad16(AttentionKept& kept, AttentionCoreScratch& scratch) const override {
    return static_cast<CudnnKept&>(kept).local ? HalfView() : static_cast<CudnnScratch&>(scratch).dy16;
  }
  // the 16-bit dq|dk|dv straight into io.dqkv16 where the layer gives it (no widening), else
  // widened into io.dqkv
  bool backward(const AttentionIo& io, AttentionKept& kept, AttentionCoreScratch& scratch, const AttentionShape& as,
                const DropoutSpec& drop) const override {
    auto& k = static_cast<CudnnKept&>(kept);
    auto& w = static_cast<CudnnScratch&>(scratch);
    if (k.local) {
      flash_attention_backward(io.dqkv, io.datty, io.qkv, io.atty, k.lse, w.delta, as, drop, io.mask);
      return false;
    }
    const std::int64_t ny = as.B * as.T * as.C, nqkv = as.B * as.T * (as.C + 2 * as.kv_C());
    const bool direct = static_cast<std::int64_t>(io.dqkv16.extent(0)) >= nqkv;
    const HalfView dqkv16 = direct ? io.dqkv16 : w.dqkv16;
    if (io.datty16.extent(0) == 0) pack_half(s_.dt, w.dy16, io.datty, ny);
    sdpa_backward(plan(io, as, drop), io.qkv, io.atty, w.dy16, k.lse, dqkv16, drop, lengths(io, scratch));
    if (!direct) unpack_half(s_.dt, io.dqkv, dqkv16, nqkv);
    return direct;
  }

 private:
  // the call's plan: a key-padding mask goes to cuDNN as one length per sample (sdpa_mask_error
  // has checked that the mask came with them)
  SdpaPlan plan(const AttentionIo& io, const AttentionShape& as, const DropoutSpec& drop) const {
    return sdpa_plan(as, s_.dt, io.mask.causal, drop.p, io.mask.key_len.extent(0) > 0);
  }
  static SdpaLengths lengths(const AttentionIo& io, AttentionCoreScratch& scratch) {
    if (io.mask.key_len.extent(0) == 0) return {};
    return {static_cast<CudnnScratch&>(scratch).q_len, io.mask.key_len};
  }
  // Trident's kernel serves a micro-batch whose mask cuDNN cannot express; said once per process
  static void note_local(const std::string& why) {
    static bool said = false;
    if (said) return;
    said = true;
    std::fprintf(stderr,
                 "attention: cuDNN's fused attention cannot express %s; Trident's fused kernel serves those "
                 "micro-batches\n",
                 why.c_str());
  }
  TransformerShape s_;
};

using Factory = std::function<std::unique_ptr<AttentionCore>(const TransformerShape&)>;
struct Entry {
  std::string name;
  Factory make;
};

// the registry: one line per entry
const std::vector<Entry>& registry() {
  static const std::vector<Entry> r = {
      {"unfused", [](const TransformerShape& s) { return std::make_unique<UnfusedCore>(s); }},
      {"fused", [](const TransformerShape& s) { return std::make_unique<FusedCore>(s, FusedKind::fused); }},
      {"ring", [](const TransformerShape& s) { return std::make_unique<FusedCore>(s, FusedKind::ring); }},
      {"a2a", [](const TransformerShape& s) { return std::make_unique<FusedCore>(s, FusedKind::a2a); }},
      {"cudnn", [](const TransformerShape& s) { return std::make_unique<CudnnCore>(s); }},
  };
  return r;
}

}  // namespace

std::string attention_core_name(const TransformerShape& s) {
  if (s.tp.cp_size() > 1) return s.tp.cp_a2a ? "a2a" : "ring";
  if (!s.flash_attention) return "unfused";
  if (s.attention_backend == "local") return "fused";
  const std::string why = cudnn_refusal(s);
  TRIDENT_REQUIRE(why.empty() || s.attention_backend != "cudnn",
                  "model.attention_backend = cudnn: cuDNN's fused attention cannot serve this model: " << why);
  return why.empty() ? "cudnn" : "fused";
}

std::string attention_core_summary(const TransformerShape& s) {
  const std::string name = attention_core_name(s);
  if (name == "cudnn")
    return kDeviceOnHost ? "cudnn: cuDNN's fused attention as the host's stand-in computes it (ops/sdpa.hpp)"
                         : "cudnn: cuDNN's fused attention (tensor cores)";
  if (name == "unfused") return "unfused: scores and context by GEMMs, the masked softmax between";
  if (name == "ring" || name == "a2a")
    return name + ": context parallelism on Trident's fused kernel" +
           (name == "ring" ? std::string(" (ring exchange of keys and values)")
                           : std::string(" (all-to-all over heads)"));
  if (s.attention_backend == "local") return "fused: Trident's fused kernel (model.attention_backend = local)";
  return "fused: Trident's fused kernel (not cuDNN's: " + cudnn_refusal(s) + ")";
}

std::unique_ptr<AttentionCore> make_attention_core(const std::string& name, const TransformerShape& s) {
  for (const Entry& e : registry())
    if (e.name == name) return e.make(s);
  std::ostringstream names;
  for (const Entry& e : registry()) names << (names.tellp() > 0 ? ", " : "") << e.name;
  TRIDENT_REQUIRE(false, "unknown core attention '" << name << "' (entries: " << names.str() << ")");
  return nullptr;
}

}  // namespace trident
