// The core-attention slot of the one transformer layer (docs/DESIGN.md "Layer spec"): the
// self-attention between the qkv projection (after the q/k norms and rotary positions) and the
// output projection,
//   atty (BT, nh d/tp) = attention(qkv (BT, (nh + 2 ng) d/tp))   and back,
// filled by the entry the shape names (attention_core_name()):
//   unfused  probabilities and context through GEMMs, the (T, T) probabilities kept or, under
//            selective recomputation, recomputed in the backward pass (ops/attention)
//   fused    Trident's fused kernel: no (T, T) probabilities, a log-sum-exp per row kept
//            (ops/flash_attention; ModelArch::flash_attention)
//   ring     context parallelism over the group's ring (parallel.cp > 1, cp_comm_type p2p)
//   a2a      context parallelism by an all-to-all over heads (cp_comm_type a2a)
//   cudnn    cuDNN's fused attention on tensor cores (ops/sdpa; device builds that have it, 16-bit,
//            head sizes up to 128): a log-sum-exp per row kept, as fused; a micro-batch whose mask
//            cuDNN cannot express (key padding, document starts) takes Trident's fused kernel
// An entry keeps what its backward pass needs in an AttentionKept of its own (one per layer and
// micro-batch in flight, owned by the layer's activations) and shares an AttentionCoreScratch
// (one per model chunk, sized for one layer). The cross-attention of decoder layers is not this
// slot: it always takes the GEMM path of ops/attention with the layer's scratch.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layers/context_parallel.hpp"
#include "ops/attention.hpp"
#include "ops/dropout.hpp"

namespace trident {

struct TransformerShape;

// What one layer's core attention keeps from its forward pass (the entry's own type).
struct AttentionKept {
  virtual ~AttentionKept() = default;
  virtual std::int64_t bytes() const = 0;
};
// Temporaries shared by the layers of a chunk (the entry's own type).
struct AttentionCoreScratch {
  virtual ~AttentionCoreScratch() = default;
  virtual std::int64_t bytes() const = 0;
};

// The layer's buffers an entry reads and writes: its input qkv (kept by the layer), its output
// atty (kept), the backward pass's fp32 gradients dqkv (out) and datty (in), and the layer's
// shared attention workspaces (the GEMM path's scores, widened probabilities and 16-bit copies).
// dqkv16, where the layer gives one (16-bit parameters, nothing between the core and the qkv
// projection's backward): an entry whose gradient is 16-bit anyway (cudnn) may write it there
// instead of widening it into dqkv, and says so by backward's result. datty16: the incoming
// gradient already in 16 bits, in the entry's own buffer (output_grad16), datty then not read.
struct AttentionIo {
  Act qkv, atty;
  FloatView dqkv, datty;
  AttentionScratch work;
  AttentionMask mask;
  HalfView dqkv16 = {}, datty16 = {};
};

class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  // the entry's name; the entries of one name in a chunk share one scratch
  virtual const char* kind() const = 0;
  // selective: under selective recomputation (the chunk's layers share recomputed buffers)
  virtual std::shared_ptr<AttentionCoreScratch> make_scratch(bool selective) const = 0;
  // keep_attention false: selective recomputation (an entry that keeps probabilities takes them
  // from the scratch and recomputes them in the backward pass)
  virtual std::shared_ptr<AttentionKept> make_kept(AttentionCoreScratch& s, bool keep_attention) const = 0;
  virtual void forward(const AttentionIo& io, AttentionKept& k, AttentionCoreScratch& s, const AttentionShape& as,
                       const DropoutSpec& drop) const = 0;
  // Where an entry takes its incoming gradient in 16 bits for this micro-batch (the layer's output
  // projection then writes it there, io.datty16): the buffer (B T, nh d/tp), else empty.
  virtual HalfView output_grad16(AttentionKept&, AttentionCoreScratch&) const { return {}; }
  // true: the input gradient is in io.dqkv16 (16 bits) and io.dqkv was not written
  virtual bool backward(const AttentionIo& io, AttentionKept& k, AttentionCoreScratch& s, const AttentionShape& as,
                        const DropoutSpec& drop) const = 0;
};

// The entry a shape takes: a2a or ring with context parallelism; else, under
// ModelArch::flash_attention, cudnn where ModelArch::attention_backend (auto, cudnn) allows and the
// build and shape can run it, else fused; else unfused.
std::string attention_core_name(const TransformerShape& s);
// The entry a shape takes, said for a person: its name, what it is and, where cuDNN's entry is not
// taken under ModelArch::flash_attention, why not (e.g. "fused: Trident's fused kernel (not
// cuDNN's: a host build ...)").
std::string attention_core_summary(const TransformerShape& s);
// The entry `name` for the shape (an unknown name, or one the shape cannot run, is an error).
std::unique_ptr<AttentionCore> make_attention_core(const std::string& name, const TransformerShape& s);

}  // namespace trident
