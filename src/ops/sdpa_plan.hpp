// cuDNN's fused scaled-dot-product attention as Trident calls it, as data (no Kokkos here, so that
// the one file that includes the cuDNN frontend, ops/sdpa_cudnn_cuda.cpp, compiles with the host
// compiler). ops/sdpa.hpp builds a plan from an attention call; the plan names every tensor as
// cuDNN's 4-D (b, h, s, d) view of Trident's buffers:
//   q, k, v  into qkv (B, T, C + 2 Ckv): query head h at channel h d, key group g at C + g d, value
//            group g at C + Ckv + g d; the gradients dq, dk, dv into a 16-bit buffer of the same layout
//   o        into y (B, T, C); the incoming gradient dO into a 16-bit buffer of the same layout
//   stats    (b, h, s, 1) fp32: the log-sum-exp of each query row's scaled scores, Trident's lse
//   seq_len_q, seq_len_kv  (b, 1, 1, 1) int32, where padded: the valid queries and keys of each
//            sample, a prefix of its s (cuDNN's padding mask; Trident passes s for the queries)
// and the attention it computes: softmax(scale q k^T + mask) v per head, fp32 accumulation, the
// query heads of a group sharing its keys and values (grouped-query attention), with Philox
// dropout on the probabilities (cuDNN's own generator; seed and offset read from device memory).
#pragma once
#include <cstdint>
#include <string>

namespace trident {

struct SdpaTensor {
  std::int64_t dim[4] = {0, 0, 0, 0};     // (b, h, s, d)
  std::int64_t stride[4] = {0, 0, 0, 0};  // in elements
  std::int64_t offset = 0;                // element (0, 0, 0, 0) from the buffer's start, in elements
  std::int64_t at(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) const {
    return offset + b * stride[0] + h * stride[1] + s * stride[2] + d * stride[3];
  }
};

struct SdpaPlan {
  std::string error;  // not empty: cuDNN's fused attention cannot serve this call (it says why)
  bool bf16 = true;   // the 16-bit type of q, k, v, o and the gradients (else fp16)
  std::int64_t b = 0, h_q = 0, h_kv = 0, s = 0, d = 0;
  SdpaTensor q, k, v, o, stats;
  float scale = 1.f;    // 1 / sqrt(d)
  bool causal = true;   // key j of query i when j <= i (cuDNN's top-left diagonal band, right bound 0)
  float dropout = 0.f;  // probability of dropping a probability (Philox; 0: none)
  bool padded = false;  // keys j >= seq_len_kv(b) of sample b masked (a key-padding mask as lengths)
  // every field above that shapes cuDNN's graph, as text (the graph's name in messages)
  std::string key() const;
  // whether o has every field that shapes the graph equal to this plan's (key() equal), without
  // building the text: the graph cache's lookup, twice per layer and micro-batch
  bool same_graph(const SdpaPlan& o) const;
};

// The CUDA build with the cuDNN frontend (ops/sdpa_cudnn_cuda.cpp; the frontend loads libcudnn.so.9
// when first called). stream: the cudaStream_t; rng: two int64 in device memory (Philox seed and
// offset), read only when plan.dropout > 0; seq_q, seq_kv: b int32 each in device memory (the
// sequence lengths), read only when plan.padded. Each call is one cuDNN graph execution; the graphs
// are built once per plan key and kept.
namespace cudnn_sdpa {
// "" when libcudnn loads and its version runs the fused attention, else why not
std::string unavailable();
void forward(const SdpaPlan& p, void* stream, const void* qkv, void* y, float* stats, const std::int64_t* rng,
             const std::int32_t* seq_q, const std::int32_t* seq_kv);
void backward(const SdpaPlan& p, void* stream, const void* qkv, const void* y, const void* dy, const float* stats,
              void* dqkv, const std::int64_t* rng, const std::int32_t* seq_q, const std::int32_t* seq_kv);
}  // namespace cudnn_sdpa

}  // namespace trident
