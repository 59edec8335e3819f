// Mixture-of-experts kernels (moe.hpp): one token (or one permuted row) whole on one thread over
// the rank's host threads (common/host_parallel), or one device thread; the dispatch plan on the
// host.
#include "ops/moe.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/device_math.hpp"
#include "common/device_parallel.hpp"
#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "common/host_parallel.hpp"

namespace trident {

namespace {

// The next entry after (pv, pe) in the order (value descending, index ascending) among v[0, E):
// the top-k without marks, one pass per rank.
template <class V>
KOKKOS_INLINE_FUNCTION std::int64_t next_best(const V& v, std::int64_t E, float pv, std::int64_t pe, bool first) {
  std::int64_t best = -1;
  float bv = 0.f;
  for (std::int64_t e = 0; e < E; ++e) {
    const float x = v(e);
    if (!first && !(x < pv || (x == pv && e > pe))) continue;  // at or before the previous pick
    if (best < 0 || x > bv) {
      best = e;
      bv = x;
    }
  }
  return best;
}

KOKKOS_INLINE_FUNCTION float moe_sigmoid(float x) { return 1.f / (1.f + dexp(-x)); }

}  // namespace

void moe_route(const IntView& idx, const FloatView& probs, const FloatView& lse, const FloatView& ssum,
               const FloatView& paux, const FloatView& logits, std::int64_t R, const RouterSpec& r,
               const FloatView& bias) {
  const std::int64_t E = r.E, k = r.k;
  const bool sigmoid = r.sigmoid, pre = r.pre_softmax, biased = bias.extent(0) > 0;
  TRIDENT_REQUIRE(!biased || (sigmoid && static_cast<std::int64_t>(bias.extent(0)) == E),
                  "internal: an expert bias needs sigmoid routing and E values");
  TRIDENT_REQUIRE(k >= 1 && k <= E, "internal: moe_route with k = " << k << " of " << E << " experts");
  for_each_index(
      "ops::moe_route", R, KOKKOS_LAMBDA(std::int64_t t) {
        const float* l = logits.data() + t * E;
        float m = l[0];
        for (std::int64_t e = 1; e < E; ++e) m = dmax(m, l[e]);
        float z = 0.f;
        for (std::int64_t e = 0; e < E; ++e) z += dexp(l[e] - m);
        const float lt = m + dlog(z);
        lse(t) = lt;
        float ss = 1.f;
        if (sigmoid) {
          ss = 0.f;
          for (std::int64_t e = 0; e < E; ++e) ss += moe_sigmoid(l[e]);
          ss += 1e-20f;
        }
        ssum(t) = ss;
        // the top-k of the logits (sigmoid and softmax are increasing: the same order), or of the
        // sigmoid scores plus the expert bias
        const auto key = [&](std::int64_t e) { return biased ? moe_sigmoid(l[e]) + bias(e) : l[e]; };
        float pv = 0.f, sel = 0.f;
        std::int64_t pe = -1;
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int64_t e = next_best(key, E, pv, pe, j == 0);
          pv = key(e);
          pe = e;
          idx(t * k + j) = static_cast<std::int32_t>(e);
          const float w = sigmoid ? moe_sigmoid(l[e]) : pre ? dexp(l[e] - lt) : dexp(l[e] - l[idx(t * k)]);
          probs(t * k + j) = w;
          sel += w;
        }
        if (sigmoid ? k > 1 : !pre) {
          const float d = sigmoid ? sel + 1e-20f : sel;
          for (std::int64_t j = 0; j < k; ++j) probs(t * k + j) = probs(t * k + j) / d;
        }
      });
  TRIDENT_DEVICE_WAIT();
  // p_te = softmax(logits)_te, or sigmoid(logits)_te / ssum_t
  const auto score = KOKKOS_LAMBDA(std::int64_t t, std::int64_t e) {
    const float x = logits(t * E + e);
    return sigmoid ? moe_sigmoid(x) / ssum(t) : dexp(x - lse(t));
  };
  if constexpr (kDeviceKernels) {
    device_copy(paux, 0.f);
    column_sums<1>(
        "ops::moe_route_paux", R, E,
        KOKKOS_LAMBDA(std::int64_t t, std::int64_t e, float* acc) { acc[0] += score(t, e); },
        ColumnOut<1>{{paux.data()}});
  } else {
    for_each_index(
        "ops::moe_route_paux", E, KOKKOS_LAMBDA(std::int64_t e) {
          float s = 0.f;
          for (std::int64_t t = 0; t < R; ++t) s += score(t, e);
          paux(e) = s;
        });
  }
  TRIDENT_DEVICE_WAIT();
}

void moe_route_backward(const FloatView& dlogits, const FloatView& dprobs, const FloatView& logits,
                        const FloatView& lse, const FloatView& ssum, const IntView& idx, const FloatView& probs,
                        const FloatView& aux_grad, float z_grad, std::int64_t R, const RouterSpec& r) {
  const std::int64_t E = r.E, k = r.k;
  const bool sigmoid = r.sigmoid, pre = r.pre_softmax;
  for_each_index(
      "ops::moe_route_backward", R, KOKKOS_LAMBDA(std::int64_t t) {
        const float* l = logits.data() + t * E;
        float* d = dlogits.data() + t * E;
        const float lt = lse(t), ss = ssum(t);
        // the load-balancing scores p and the z-loss: sum_e aux_grad_e p_te + z_grad lse_t^2
        float gp = 0.f;  // sum_f g_f p_tf
        for (std::int64_t e = 0; e < E; ++e) {
          const float p = sigmoid ? moe_sigmoid(l[e]) / ss : dexp(l[e] - lt);
          gp += aux_grad(e) * p;
        }
        for (std::int64_t e = 0; e < E; ++e) {
          const float s = dexp(l[e] - lt);  // softmax
          float v = 2.f * z_grad * lt * s;
          if (sigmoid) {
            const float sg = moe_sigmoid(l[e]);
            v += (aux_grad(e) - gp) / ss * sg * (1.f - sg);
          } else {
            v += s * (aux_grad(e) - gp);
          }
          d[e] = v;
        }
        // the routing probabilities
        float dot = 0.f;
        if (sigmoid) {
          if (k == 1) {
            const std::int64_t e = idx(t);
            const float sg = moe_sigmoid(l[e]);
            d[e] += dprobs(t) * sg * (1.f - sg);
          } else {
            float sel = 0.f;
            for (std::int64_t j = 0; j < k; ++j) {
              sel += moe_sigmoid(l[idx(t * k + j)]);
              dot += dprobs(t * k + j) * probs(t * k + j);
            }
            sel += 1e-20f;
            for (std::int64_t j = 0; j < k; ++j) {
              const std::int64_t e = idx(t * k + j);
              const float sg = moe_sigmoid(l[e]);
              d[e] += (dprobs(t * k + j) - dot) / sel * sg * (1.f - sg);
            }
          }
        } else if (pre) {  // probs_j = s_{e_j}: d l = s (ds - s . ds), ds at the chosen experts
          for (std::int64_t j = 0; j < k; ++j) dot += dprobs(t * k + j) * probs(t * k + j);
          for (std::int64_t e = 0; e < E; ++e) d[e] -= dexp(l[e] - lt) * dot;
          for (std::int64_t j = 0; j < k; ++j) d[idx(t * k + j)] += probs(t * k + j) * dprobs(t * k + j);
        } else {  // softmax over the k chosen logits
          for (std::int64_t j = 0; j < k; ++j) dot += dprobs(t * k + j) * probs(t * k + j);
          for (std::int64_t j = 0; j < k; ++j) d[idx(t * k + j)] += probs(t * k + j) * (dprobs(t * k + j) - dot);
        }
      });
  TRIDENT_DEVICE_WAIT();
}

std::int64_t moe_capacity(std::int64_t tokens, std::int64_t k, std::int64_t E, double factor) {
  return static_cast<std::int64_t>(
      std::ceil(static_cast<double>(tokens) * static_cast<double>(k) / static_cast<double>(E) * factor));
}

MoeExchange moe_exchange(const std::vector<std::int64_t>& sent, const std::vector<std::int64_t>& received,
                         std::int64_t ep) {
  TRIDENT_REQUIRE(ep >= 1 && sent.size() == received.size() && sent.size() % static_cast<size_t>(ep) == 0,
                  "internal: moe_exchange of " << sent.size() << " and " << received.size() << " counts over " << ep
                                               << " ranks");
  MoeExchange x;
  x.ep = ep;
  x.El = static_cast<std::int64_t>(sent.size()) / ep;
  const auto at = [&](const std::vector<std::int64_t>& v, std::int64_t r, std::int64_t j) {
    const std::int64_t n = v[static_cast<size_t>(r * x.El + j)];
    TRIDENT_REQUIRE(n >= 0, "internal: a negative row count in the expert-parallel exchange");
    return n;
  };
  x.send_rows.assign(static_cast<size_t>(ep), 0);
  x.recv_rows.assign(static_cast<size_t>(ep), 0);
  x.counts.assign(static_cast<size_t>(x.El), 0);
  for (std::int64_t r = 0; r < ep; ++r)
    for (std::int64_t j = 0; j < x.El; ++j) {
      x.send_rows[static_cast<size_t>(r)] += at(sent, r, j);
      x.recv_rows[static_cast<size_t>(r)] += at(received, r, j);
      x.counts[static_cast<size_t>(j)] += at(received, r, j);
    }
  x.offsets.assign(static_cast<size_t>(x.El + 1), 0);
  for (std::int64_t j = 0; j < x.El; ++j)
    x.offsets[static_cast<size_t>(j + 1)] = x.offsets[static_cast<size_t>(j)] + x.counts[static_cast<size_t>(j)];
  const std::int64_t M = x.rows();
  x.regroup.assign(static_cast<size_t>(M), 0);
  x.inverse.assign(static_cast<size_t>(M), 0);
  std::vector<std::int64_t> next(x.offsets.begin(), x.offsets.end() - 1);  // (El) the next expert-side row
  std::int64_t q = 0;                                                      // received row, in (source, expert) order
  for (std::int64_t r = 0; r < ep; ++r)
    for (std::int64_t j = 0; j < x.El; ++j)
      for (std::int64_t n = 0; n < at(received, r, j); ++n, ++q) {
        const std::int64_t m = next[static_cast<size_t>(j)]++;
        x.regroup[static_cast<size_t>(m)] = static_cast<std::int32_t>(q);
        x.inverse[static_cast<size_t>(q)] = static_cast<std::int32_t>(m);
      }
  return x;
}

MoePlan moe_plan(const std::int32_t* idx, const float* probs, std::int64_t R, std::int64_t k, std::int64_t E,
                 std::int64_t capacity, bool by_probs) {
  MoePlan p;
  p.R = R;
  p.k = k;
  p.E = E;
  p.routed.assign(static_cast<size_t>(E), 0);
  // the selections of each expert, token by token
  std::vector<std::vector<std::int64_t>> of(static_cast<size_t>(E));  // selection s = t k + j
  for (std::int64_t s = 0; s < R * k; ++s) {
    const std::int64_t e = idx[s];
    TRIDENT_REQUIRE(e >= 0 && e < E, "internal: moe_plan: expert " << e << " of " << E);
    of[static_cast<size_t>(e)].push_back(s);
    ++p.routed[static_cast<size_t>(e)];
  }
  if (capacity > 0) {
    for (auto& list : of) {
      if (static_cast<std::int64_t>(list.size()) <= capacity) continue;
      if (by_probs) {  // the largest probabilities, ties to the lower token; then back in token order
        std::stable_sort(list.begin(), list.end(),
                         [probs](std::int64_t a, std::int64_t b) { return probs[a] > probs[b]; });
        list.resize(static_cast<size_t>(capacity));
        std::sort(list.begin(), list.end());
      } else {
        list.resize(static_cast<size_t>(capacity));
      }
    }
  }
  p.counts.assign(static_cast<size_t>(E), 0);
  p.offsets.assign(static_cast<size_t>(E + 1), 0);
  p.slot_row.assign(static_cast<size_t>(R * k), -1);
  for (std::int64_t e = 0; e < E; ++e) {
    const auto& list = of[static_cast<size_t>(e)];
    p.counts[static_cast<size_t>(e)] = static_cast<std::int64_t>(list.size());
    p.offsets[static_cast<size_t>(e + 1)] = p.offsets[static_cast<size_t>(e)] + static_cast<std::int64_t>(list.size());
    std::int64_t n = p.offsets[static_cast<size_t>(e)];
    for (std::int64_t s : list) {
      p.row_token.push_back(static_cast<std::int32_t>(s / k));
      p.slot_row[static_cast<size_t>(s)] = static_cast<std::int32_t>(n++);
    }
  }
  return p;
}

namespace detail {
template <class V>
void gather_rows(const V& xp, const V& x, const IntView& row_token, std::int64_t N, std::int64_t C) {
  for_each_index(
      "ops::moe_gather", N, KOKKOS_LAMBDA(std::int64_t n) {
        const std::int64_t t = row_token(n);
        for (std::int64_t c = 0; c < C; ++c) xp(n * C + c) = x(t * C + c);
      });
}
}  // namespace detail

void moe_gather(const Act& xp, const Act& x, const IntView& row_token, std::int64_t N, std::int64_t C) {
  TRIDENT_REQUIRE(xp.dt == x.dt, "internal: moe_gather with mixed storage types");
  if (x.is_half())
    detail::gather_rows(xp.h, x.h, row_token, N, C);
  else
    detail::gather_rows(xp.f, x.f, row_token, N, C);
  TRIDENT_DEVICE_WAIT();
}

void moe_combine(const FloatView& out, const FloatView& yp, const FloatView& probs, const IntView& slot_row,
                 std::int64_t R, std::int64_t k, std::int64_t C) {
  for_each_index(
      "ops::moe_combine", R, KOKKOS_LAMBDA(std::int64_t t) {
        float* o = out.data() + t * C;
        for (std::int64_t c = 0; c < C; ++c) o[c] = 0.f;
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int64_t n = slot_row(t * k + j);
          if (n < 0) continue;
          const float w = probs(t * k + j);
          const float* y = yp.data() + n * C;
          for (std::int64_t c = 0; c < C; ++c) o[c] += w * y[c];
        }
      });
  TRIDENT_DEVICE_WAIT();
}

void moe_combine_backward(const FloatView& dyp, const FloatView& dprobs, const FloatView& dout, const FloatView& yp,
                          const FloatView& probs, const IntView& slot_row, std::int64_t R, std::int64_t k,
                          std::int64_t C) {
  for_each_index(
      "ops::moe_combine_backward", R, KOKKOS_LAMBDA(std::int64_t t) {
        const float* g = dout.data() + t * C;
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int64_t n = slot_row(t * k + j);
          if (n < 0) {
            dprobs(t * k + j) = 0.f;
            continue;
          }
          const float w = probs(t * k + j);
          const float* y = yp.data() + n * C;
          float* dy = dyp.data() + n * C;
          float dot = 0.f;
          for (std::int64_t c = 0; c < C; ++c) {
            dy[c] = w * g[c];
            dot += g[c] * y[c];
          }
          dprobs(t * k + j) = dot;
        }
      });
  TRIDENT_DEVICE_WAIT();
}

void moe_scatter_add(const FloatView& dx, const FloatView& dxp, const IntView& slot_row, std::int64_t R, std::int64_t k,
                     std::int64_t C) {
  for_each_index(
      "ops::moe_scatter_add", R, KOKKOS_LAMBDA(std::int64_t t) {
        float* o = dx.data() + t * C;
        for (std::int64_t c = 0; c < C; ++c) o[c] = 0.f;
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int64_t n = slot_row(t * k + j);
          if (n < 0) continue;
          const float* y = dxp.data() + n * C;
          for (std::int64_t c = 0; c < C; ++c) o[c] += y[c];
        }
      });
  TRIDENT_DEVICE_WAIT();
}

namespace detail {
template <class F, class V>
void add_bias_rows(const FloatView& y, const V& b, std::int64_t rows, std::int64_t C) {
  for_each_element(
      "ops::moe_add_bias", rows, C, KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) { y(i) += F::load(b(c)); });
}
}  // namespace detail

void moe_add_bias(const FloatView& y, const Act& bias, std::int64_t rows, std::int64_t C) {
  switch (bias.dt) {
    case DType::F32: detail::add_bias_rows<F32Fmt>(y, bias.f, rows, C); break;
    case DType::BF16: detail::add_bias_rows<Bf16Fmt>(y, bias.h, rows, C); break;
    case DType::F16: detail::add_bias_rows<Fp16Fmt>(y, bias.h, rows, C); break;
  }
  TRIDENT_DEVICE_WAIT();
}

}  // namespace trident
