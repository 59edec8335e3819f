#include "models/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/rng.hpp"

namespace trident {

// The vocabulary in decreasing logit order, ties by increasing id (std::stable_sort's order for the
// comparison logits[a] > logits[b]), by two stable 16-bit radix passes over an order-preserving
// integer key: O(V) where an indirect comparison sort of 50257 floats took about 5 ms per token.
// -0.0 sorts as +0.0, as the comparison does.
void order_by_logit(const float* logits, std::int64_t V, std::vector<std::int32_t>& ids) {
  thread_local std::vector<std::uint32_t> key, key2;
  thread_local std::vector<std::int32_t> tmp;
  thread_local std::vector<std::uint32_t> count;
  const auto n = static_cast<size_t>(V);
  key.resize(n);
  key2.resize(n);
  ids.resize(n);
  tmp.resize(n);
  for (size_t i = 0; i < n; ++i) {
    std::uint32_t b = 0;
    const float x = logits[i] == 0.0f ? 0.0f : logits[i];
    std::memcpy(&b, &x, sizeof b);
    const std::uint32_t ascending = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    key[i] = ~ascending;  // the largest logit gets the smallest key
    ids[i] = static_cast<std::int32_t>(i);
  }
  for (int shift : {0, 16}) {
    count.assign(65537, 0);
    for (size_t i = 0; i < n; ++i) ++count[((key[i] >> shift) & 0xFFFFu) + 1];
    for (size_t d = 1; d < count.size(); ++d) count[d] += count[d - 1];
    for (size_t i = 0; i < n; ++i) {
      const std::uint32_t slot = count[(key[i] >> shift) & 0xFFFFu]++;
      key2[slot] = key[i];
      tmp[slot] = ids[i];
    }
    key.swap(key2);
    ids.swap(tmp);
  }
}

std::int32_t sample_token(const float* logits, std::int64_t V, const SamplingParams& o, std::uint64_t key) {
  if (o.greedy) return static_cast<std::int32_t>(std::max_element(logits, logits + V) - logits);
  thread_local std::vector<std::int32_t> ids;
  order_by_logit(logits, V, ids);
  std::int64_t keep = o.top_k > 0 ? std::min(o.top_k, V) : V;
  thread_local std::vector<double> p;
  p.resize(static_cast<size_t>(keep));
  const double mx = logits[ids[0]];
  double z = 0;
  for (std::int64_t i = 0; i < keep; ++i) z += (p[i] = std::exp((logits[ids[i]] - mx) / o.temperature));
  double cum = 0;
  for (std::int64_t i = 0; i < keep; ++i) {
    cum += p[i] / z;
    if (cum >= o.top_p) {
      keep = i + 1;
      break;
    }
  }
  double total = 0;
  for (std::int64_t i = 0; i < keep; ++i) total += p[i];
  double u = static_cast<double>(splitmix64(key) >> 11) * 0x1.0p-53 * total;
  for (std::int64_t i = 0; i < keep; ++i) {
    u -= p[i];
    if (u < 0) return ids[i];
  }
  return ids[keep - 1];
}

double token_logprob(const float* logits, std::int64_t V, std::int32_t id) {
  const double mx = *std::max_element(logits, logits + V);
  double z = 0;
  for (std::int64_t i = 0; i < V; ++i) z += std::exp(static_cast<double>(logits[i]) - mx);
  return static_cast<double>(logits[id]) - mx - std::log(z);
}

}  // namespace trident
