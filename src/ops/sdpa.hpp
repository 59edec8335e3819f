// Fused attention through cuDNN's scaled-dot-product attention (ops/sdpa_plan.hpp): the device
// path's core attention on tensor cores (layers/attention_core's `cudnn` entry; docs/DESIGN.md
// "Kernels on a GPU").
//   CUDA build with the cuDNN frontend  one cuDNN graph execution per call (sdpa_cudnn_cuda.cpp)
//   host build                         a stand-in that computes what the plan says cuDNN computes,
//                                      from the plan's strides and offsets, as the library's own
//                                      work on this rank's threads (no Kokkos kernel), so that a
//                                      TRIDENT_DEVICE_KERNELS_ON_HOST build runs and counts the
//                                      cudnn entry as a GPU would. Its dropout is Trident's counter
//                                      hash (the mask of element (b, h, i, j) of the (B, nh, T, T)
//                                      probabilities, as ops/flash_attention), where cuDNN's is
//                                      Philox: the bits differ on a GPU, the distribution does not.
// Each call is one library call in a profiling region ("ops::sdpa_forward", "ops::sdpa_backward").
#pragma once
#include <string>

#include "ops/attention.hpp"
#include "ops/dropout.hpp"
#include "ops/sdpa_plan.hpp"

namespace trident {

// The plan of self-attention of shape s over 16-bit qkv of type dt, with dropout probability p
// (plan.error says why cuDNN cannot serve it: fp32, cross-attention, a head size it does not take,
// context-parallel dropout).
// padded: the calls give each sample's key count (SdpaLengths; cuDNN's padding mask).
SdpaPlan sdpa_plan(const AttentionShape& s, DType dt, bool causal, float dropout, bool padded = false);
// "" when cuDNN can express the mask of a call (causal or not; a key-padding mask given also as one
// key count per sample, AttentionMask::key_len), else why not: a key-padding mask that is not a
// prefix of each sample's keys (cuDNN's padding masks take a length per sample, not a flag per
// key) or document starts (packed documents would need cuDNN's ragged layout, one sequence per
// document).
std::string sdpa_mask_error(const AttentionMask& mask);
// A padded plan's sequence lengths, b int32 each (device memory): q the valid queries of each
// sample (Trident gives s: every query row is computed, as its own kernels do), kv its valid keys
// (AttentionMask::key_len). Empty for a plan that is not padded.
struct SdpaLengths {
  IntView q, kv;
};
// "" where this build can run sdpa_forward / sdpa_backward, else why not.
std::string sdpa_unavailable();

// qkv (B, T, C + 2 Ckv) -> y (B, T, C), lse (B, nh, T); qkv and y 16-bit of the plan's type.
void sdpa_forward(const SdpaPlan& p, const Act& qkv, const Act& y, const FloatView& lse, const DropoutSpec& drop,
                  const SdpaLengths& len = {});
// dy16 (B, T, C) 16-bit -> dqkv16 (B, T, C + 2 Ckv) 16-bit (overwritten, zero at padded keys); qkv,
// y, lse the forward's.
void sdpa_backward(const SdpaPlan& p, const Act& qkv, const Act& y, const HalfView& dy16, const FloatView& lse,
                   const HalfView& dqkv16, const DropoutSpec& drop, const SdpaLengths& len = {});

}  // namespace trident
