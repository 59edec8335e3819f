// Softmax cross-entropy; one thread per row (token). The logits are large (tokens x vocabulary)
// and the op is bound by memory traffic, so each row is read once for the loss (online
// max/sum by blocks) and once more, with one write, for the gradient.
#include "ops/cross_entropy.hpp"

#include "common/device_math.hpp"
#include "common/device_parallel.hpp"
#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "common/half.hpp"

#include "common/host_parallel.hpp"
#include "common/simd.hpp"

namespace trident {

namespace {
constexpr std::int64_t kBlock = 64;  // elements per block of the one-pass (online) max/sum

// A position with a negative target has no loss: loss 0 and, with backward, a zero row of the
// gradient (n values). Returns whether the position is ignored.
KOKKOS_INLINE_FUNCTION bool ignore_position(std::int32_t target, float& loss, float* row, std::int64_t n,
                                            bool backward) {
  if (target >= 0) return false;
  loss = 0.f;
  if (backward)
    for (std::int64_t j = 0; j < n; ++j) row[j] = 0.f;
  return true;
}

// A row's pieces of the device layout (F, W: the logits' format and word; packed: rows_packed):
// the max of the first n logits, the sum of exp(logit - mx) over them, and the gradient written in
// place over the row's `width` columns, exp(logit - mx) * s for the first n and dscale less at
// column tgt, 0 after n (and everywhere where `ignored`).
template <class F, class W>
KOKKOS_INLINE_FUNCTION float logit_max(const RowTeam& t, const W* row, std::int64_t n, bool packed) {
  return row_max_values<F>(t, n, row, packed, [](float v) { return v; });
}
template <class F, class W>
KOKKOS_INLINE_FUNCTION float exp_sum(const RowTeam& t, const W* row, std::int64_t n, float mx, bool packed) {
  return row_sum_values<F>(t, n, row, packed, [&](float v) { return fast_exp(v - mx); });
}
template <class F, class W>
KOKKOS_INLINE_FUNCTION void write_gradient(const RowTeam& t, W* row, std::int64_t width, std::int64_t n, float mx,
                                           float s, std::int64_t tgt, float dscale, bool ignored, bool packed) {
  row_for_groups(t, width, [&](std::int64_t c0, int cnt) {
    float v[kGroup];
    load_group<F>(row + c0, cnt, packed, v);
    for (int k = 0; k < kGroup; ++k) {
      const std::int64_t j = c0 + k;
      float g = 0.f;
      if (!ignored && j < n) {
        g = fast_exp(v[k] - mx) * s;
        if (j == tgt) g -= dscale;
      }
      v[k] = g;
    }
    store_group<F>(row + c0, cnt, packed, v);
  });
}

// The device layout (common/device_parallel.hpp): a warp per row in 16-byte groups, the max and the
// sum of exponentials as two of its reductions, the gradient written by the warp in one more pass.
// F: the logits' format (F32Fmt, or the 16-bit classifier's Bf16Fmt / Fp16Fmt: the values loaded
// from 16-bit words and the gradient rounded into them); W: their word.
template <bool kBackward, class F, class W>
void cross_entropy_device(const FloatView& losses, W* logits, const IntView& targets, std::int64_t N, std::int64_t V,
                          std::int64_t Vp, float dscale) {
  const bool packed = rows_packed(Vp, logits);
  for_each_row(
      kBackward ? "ops::cross_entropy_forward_backward" : "ops::cross_entropy_forward", N,
      KOKKOS_LAMBDA(const RowTeam& t, std::int64_t n) {
        W* row = logits + n * Vp;
        const std::int64_t tgt = targets(n);
        if (tgt < 0) {
          row_once(t, [&]() { losses(n) = 0.f; });
          if (kBackward) write_gradient<F>(t, row, Vp, V, 0.f, 0.f, tgt, dscale, true, packed);
          return;
        }
        // the target's logit, read by one lane and given to all before any lane writes the row
        const float target_logit = row_share(t, [&]() { return F::load(row[tgt]); });
        const float mx = logit_max<F>(t, row, V, packed);
        const float sum = exp_sum<F>(t, row, V, mx, packed);
        row_once(t, [&]() { losses(n) = mx + dlog(sum) - target_logit; });
        if (kBackward) write_gradient<F>(t, row, Vp, V, mx, dscale / sum, tgt, dscale, false, packed);
      });
}

template <bool kBackward>
void cross_entropy_impl(const FloatView& losses, const FloatView& logits, const IntView& targets, std::int64_t N,
                        std::int64_t V, std::int64_t Vp, float dscale) {
  if constexpr (kDeviceKernels) {
    cross_entropy_device<kBackward, F32Fmt>(losses, logits.data(), targets, N, V, Vp, dscale);
    return;
  }
  for_each_index(
      kBackward ? "ops::cross_entropy_forward_backward" : "ops::cross_entropy_forward", N,
      KOKKOS_LAMBDA(std::int64_t n) {
        float* row = logits.data() + n * Vp;
        if (ignore_position(targets(n), losses(n), row, Vp, kBackward)) return;
        // Pass 1, online softmax by blocks: running max mx and sum of exp(x - mx),
        // rescaled when a block raises the max. The row is read once.
        float mx = -3.0e38f, sum = 0.f;
        for (std::int64_t b0 = 0; b0 < V; b0 += kBlock) {
          const std::int64_t b1 = b0 + kBlock < V ? b0 + kBlock : V;
          float bm = -3.0e38f;
          TRIDENT_SIMD_MAX(bm)
          for (std::int64_t j = b0; j < b1; ++j) bm = row[j] > bm ? row[j] : bm;
          if (bm > mx) {
            sum *= fast_exp(mx - bm);
            mx = bm;
          }
          float bs = 0.f;
          TRIDENT_SIMD_SUM(bs)
          for (std::int64_t j = b0; j < b1; ++j) bs += fast_exp(row[j] - mx);
          sum += bs;
        }
        const std::int64_t tgt = targets(n);
        losses(n) = mx + dlog(sum) - row[tgt];
        if (kBackward) {
          // Pass 2: the gradient softmax * dscale - onehot * dscale, in place.
          const float s = dscale / sum;
          for (std::int64_t j = 0; j < V; ++j) row[j] = fast_exp(row[j] - mx) * s;
          row[tgt] -= dscale;
          for (std::int64_t j = V; j < Vp; ++j) row[j] = 0.f;
        }
      });
}

// vocab_parallel_cross_entropy's device layout: a warp per row in 16-byte groups for each of its
// three kernels (F, W: the logits' format and word, as cross_entropy_device).
template <class F, class W>
void vocab_parallel_device(const FloatView& losses, W* logits, const IntView& targets, std::int64_t N, std::int64_t Vl,
                           std::int64_t start, std::int64_t nvalid, float dscale, bool backward,
                           const Communicator& comm, const FloatView& rowmax, const FloatView& sums) {
  const bool packed = rows_packed(Vl, logits);
  for_each_row(
      "ops::vocab_parallel_ce_max", N, KOKKOS_LAMBDA(const RowTeam& t, std::int64_t n) {
        const W* row = logits + n * Vl;
        const float mx = logit_max<F>(t, row, nvalid, packed);
        row_once(t, [&]() { rowmax(n) = mx; });
      });
  comm.allreduce_max(rowmax.data(), N);
  for_each_row(
      "ops::vocab_parallel_ce_sum", N, KOKKOS_LAMBDA(const RowTeam& t, std::int64_t n) {
        const W* row = logits + n * Vl;
        const float mx = rowmax(n);
        const float s = exp_sum<F>(t, row, nvalid, mx, packed);
        row_once(t, [&]() {
          const std::int64_t tl = static_cast<std::int64_t>(targets(n)) - start;
          sums(n) = s;
          sums(N + n) = (tl >= 0 && tl < nvalid) ? F::load(row[tl]) : 0.f;
        });
      });
  comm.allreduce_sum(sums.data(), 2 * N);
  for_each_row(
      "ops::vocab_parallel_ce_loss", N, KOKKOS_LAMBDA(const RowTeam& t, std::int64_t n) {
        W* row = logits + n * Vl;
        const bool ignored = targets(n) < 0;
        row_once(t, [&]() { losses(n) = ignored ? 0.f : rowmax(n) + dlog(sums(n)) - sums(N + n); });
        if (!backward) return;
        const float mx = rowmax(n), s = dscale / sums(n);
        const std::int64_t tl = static_cast<std::int64_t>(targets(n)) - start;
        write_gradient<F>(t, row, Vl, nvalid, mx, s, tl, dscale, ignored, packed);
      });
}

// columns of this rank that are real vocabulary entries: [0, nvalid)
std::int64_t valid_columns(std::int64_t V, std::int64_t Vl, std::int64_t start) {
  return V - start < 0 ? 0 : (V - start < Vl ? V - start : Vl);
}
}  // namespace

void cross_entropy_forward(const FloatView& losses, const FloatView& logits, const IntView& targets, std::int64_t N,
                           std::int64_t V, std::int64_t Vp) {
  cross_entropy_impl<false>(losses, logits, targets, N, V, Vp, 0.f);
}

void cross_entropy_forward_backward(const FloatView& losses, const FloatView& logits, const IntView& targets,
                                    std::int64_t N, std::int64_t V, std::int64_t Vp, float dscale) {
  cross_entropy_impl<true>(losses, logits, targets, N, V, Vp, dscale);
}

void vocab_parallel_cross_entropy(const FloatView& losses, const FloatView& logits, const IntView& targets,
                                  std::int64_t N, std::int64_t V, std::int64_t Vl, std::int64_t start, float dscale,
                                  bool backward, const Communicator& comm, const FloatView& scratch) {
  const std::int64_t nvalid = valid_columns(V, Vl, start);
  const FloatView rowmax = slice(scratch, 0, N), sums = slice(scratch, N, 2 * N);  // sums: (sum exp, target logit)
  if constexpr (kDeviceKernels) {
    vocab_parallel_device<F32Fmt>(losses, logits.data(), targets, N, Vl, start, nvalid, dscale, backward, comm, rowmax,
                                  sums);
    return;
  }
  for_each_index(
      "ops::vocab_parallel_ce_max", N, KOKKOS_LAMBDA(std::int64_t n) {
        const float* row = logits.data() + n * Vl;
        float mx = -3.0e38f;
        TRIDENT_SIMD_MAX(mx)
        for (std::int64_t j = 0; j < nvalid; ++j) mx = row[j] > mx ? row[j] : mx;
        rowmax(n) = mx;
      });
  comm.allreduce_max(rowmax.data(), N);
  for_each_index(
      "ops::vocab_parallel_ce_sum", N, KOKKOS_LAMBDA(std::int64_t n) {
        const float* row = logits.data() + n * Vl;
        const float mx = rowmax(n);
        float s = 0.f;
        TRIDENT_SIMD_SUM(s)
        for (std::int64_t j = 0; j < nvalid; ++j) s += fast_exp(row[j] - mx);
        const std::int64_t t = static_cast<std::int64_t>(targets(n)) - start;
        sums(n) = s;
        sums(N + n) = (t >= 0 && t < nvalid) ? row[t] : 0.f;
      });
  comm.allreduce_sum(sums.data(), 2 * N);
  for_each_index(
      "ops::vocab_parallel_ce_loss", N, KOKKOS_LAMBDA(std::int64_t n) {
        float* row = logits.data() + n * Vl;
        if (ignore_position(targets(n), losses(n), row, Vl, backward)) return;
        losses(n) = rowmax(n) + dlog(sums(n)) - sums(N + n);
        if (!backward) return;
        const float mx = rowmax(n), s = dscale / sums(n);
        for (std::int64_t j = 0; j < nvalid; ++j) row[j] = fast_exp(row[j] - mx) * s;
        for (std::int64_t j = nvalid; j < Vl; ++j) row[j] = 0.f;
        const std::int64_t t = static_cast<std::int64_t>(targets(n)) - start;
        if (t >= 0 && t < nvalid) row[t] -= dscale;
      });
}

double sum_losses(const FloatView& losses, std::int64_t N) {
  double total = 0;
  TRIDENT_DEVICE_READ();
  Kokkos::parallel_reduce(
      "ops::sum_losses", range(N), KOKKOS_LAMBDA(std::int64_t n, double& acc) { acc += losses(n); }, total);
  return total;
}

void add_losses(const View1<double>& sums, const FloatView& losses, std::int64_t N) {
  Kokkos::parallel_reduce(
      "ops::sum_losses", range(N), KOKKOS_LAMBDA(std::int64_t n, double& acc) { acc += losses(n); },
      Kokkos::subview(sums, 1));
  Kokkos::parallel_for(
      "ops::add_losses", range(1), KOKKOS_LAMBDA(std::int64_t) { sums(0) += sums(1); });
}

double take_loss_sum(const View1<double>& sums) {
  TRIDENT_DEVICE_READ();
  const auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), Kokkos::subview(sums, 0));
  const double total = h();
  device_copy(Kokkos::subview(sums, 0), 0.0);
  return total;
}

void token_cross_entropy(const FloatView& losses, const FloatView& logits, const IntView& targets, std::int64_t N,
                         std::int64_t V, std::int64_t Vl, std::int64_t start, float dscale, bool backward,
                         const Communicator* comm, const FloatView& scratch) {
  if (comm && comm->size() > 1)
    vocab_parallel_cross_entropy(losses, logits, targets, N, V, Vl, start, dscale, backward, *comm, scratch);
  else if (backward)
    cross_entropy_forward_backward(losses, logits, targets, N, V, Vl, dscale);
  else
    cross_entropy_forward(losses, logits, targets, N, V, Vl);
}

namespace {
template <class F>
void cross_entropy_half(const FloatView& losses, std::uint16_t* logits, const IntView& targets, std::int64_t N,
                        std::int64_t V, std::int64_t Vl, std::int64_t start, float dscale, bool backward,
                        const Communicator* comm, const FloatView& scratch) {
  if (comm && comm->size() > 1) {
    const FloatView rowmax = slice(scratch, 0, N), sums = slice(scratch, N, 2 * N);
    vocab_parallel_device<F>(losses, logits, targets, N, Vl, start, valid_columns(V, Vl, start), dscale, backward,
                             *comm, rowmax, sums);
  } else if (backward) {
    cross_entropy_device<true, F>(losses, logits, targets, N, V, Vl, dscale);
  } else {
    cross_entropy_device<false, F>(losses, logits, targets, N, V, Vl, dscale);
  }
}
}  // namespace

void token_cross_entropy_half(DType dt, const FloatView& losses, const HalfView& logits, const IntView& targets,
                              std::int64_t N, std::int64_t V, std::int64_t Vl, std::int64_t start, float dscale,
                              bool backward, const Communicator* comm, const FloatView& scratch) {
  if constexpr (!kDeviceKernels) {
    throw Error::one("internal: the 16-bit classifier serves the device path only");
  } else {
    if (dt == DType::BF16)
      cross_entropy_half<Bf16Fmt>(losses, logits.data(), targets, N, V, Vl, start, dscale, backward, comm, scratch);
    else if (dt == DType::F16)
      cross_entropy_half<Fp16Fmt>(losses, logits.data(), targets, N, V, Vl, start, dscale, backward, comm, scratch);
    else
      throw Error::one("internal: token_cross_entropy_half with fp32 logits");
  }
}

}  // namespace trident
