// Megatron's and Korthikanti et al.'s memory figures.
#include "train/memory_report.hpp"

#include <cmath>

namespace trident {

double megatron_bytes_per_param(const std::string& dtype, bool distributed, int d) {
  const double dd = d > 0 ? d : 1;
  if (dtype == "bf16") return distributed ? 6 + 12 / dd : 18;  // bf16 param + fp32 grad + fp32 master, m, v
  if (dtype == "fp16") return distributed ? 4 + 16 / dd : 20;  // fp16 param + fp16 grad; fp32 grad, master, m, v
  return distributed ? 8 + 8 / dd : 16;                        // fp32 param + grad; m, v
}

double korthikanti_layer_bytes(const ActivationModel& m) {
  const double sbh = m.s * m.b * m.h, as2b = m.a * m.s * m.s * m.b, e = m.e, t = m.t;
  const double split = m.sp ? t : 1;
  auto kept = [&] {
    const double values = m.sp ? sbh * (16 * e + 2) / t : sbh * (4 * e + 2 + 12 * e / t);
    const double attention = m.recompute == "selective" || m.flash ? 0 : as2b * (2 * e + 1) / t;
    return values + attention;
  };
  if (m.recompute != "full") return kept();
  const double input = e * sbh / split;  // the kept input of a recomputed group
  if (m.block) {  // the first `group` layers each keep their input, the others everything
    const double r = m.group < m.layers ? m.group : m.layers;
    ActivationModel k = m;
    k.recompute = "none";
    return (r * input + (m.layers - r) * korthikanti_layer_bytes(k)) / m.layers;
  }
  return std::ceil(m.layers / m.group) * input / m.layers;  // uniform: one input per group
}

}  // namespace trident
