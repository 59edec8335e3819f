// The figures of memory_report.hpp: Megatron-LM's bytes per parameter by dtype and optimizer
// mode, Korthikanti et al.'s activation bytes per layer and micro-batch (with or without sequence
// parallelism, selective or fused attention, full recomputation by uniform groups or block), and
// print_memory_report, which gathers every rank's measured figures to world rank 0 and prints a
// row per rank (with its pp, tp, dp coordinates), and writes the same figures to log.memory_file.
#include "train/memory_report.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <vector>

#include "common/error.hpp"

namespace trident {

double megatron_bytes_per_param(const std::string& dtype, bool distributed, int d) {
  const double dd = d > 0 ? d : 1;
  if (dtype == "bf16") return distributed ? 6 + 12 / dd : 18;  // bf16 param + fp32 grad + fp32 master, m, v
  if (dtype == "fp16") return distributed ? 4 + 16 / dd : 20;  // fp16 param + fp16 grad; fp32 grad, master, m, v
  return distributed ? 8 + 8 / dd : 16;                        // fp32 param + grad; m, v
}

double korthikanti_layer_bytes(const ActivationModel& m) {
  // context parallelism: every term of a layer is per token of the rank's s / c (the fused kernel's
  // ring keeps no score matrix; the term below applies to the unfused path, which cp refuses)
  const double s_local = m.s / (m.c > 0 ? m.c : 1);
  const double sbh = s_local * m.b * m.h, as2b = m.a * s_local * s_local * m.b, e = m.e, t = m.t;
  const double split = m.sp ? t : 1;
  auto kept = [&] {
    const double values = m.sp ? sbh * ((4 + m.qkv + m.proj + m.mlp) * e + 2) / t
                               : sbh * (4 * e + 2 + (m.qkv + m.proj + m.mlp) * e / t);
    const double attention = m.recompute == "selective" || m.flash ? 0 : as2b * (2 * e + 1) / t;
    const double qk_norm = m.qk_norm > 0 ? 4 * m.qk_norm * sbh / t : 0;
    const double moe = 4 * m.moe_fp32 * sbh / t;  // MoE needs SP under tp > 1: every term / t
    return values + attention + qk_norm + moe;
  };
  if (m.recompute != "full") return kept();
  const double input = e * sbh / split;  // the kept input of a recomputed group
  if (m.block) {                         // the first `group` layers each keep their input, the others everything
    const double r = m.group < m.layers ? m.group : m.layers;
    ActivationModel k = m;
    k.recompute = "none";
    return (r * input + (m.layers - r) * korthikanti_layer_bytes(k)) / m.layers;
  }
  return std::ceil(m.layers / m.group) * input / m.layers;  // uniform: one input per group
}

namespace {

// The figures of print_memory_report, per rank, under their JSON names (bytes unless named).
const char* const kFigureNames[] = {"params_bytes",
                                    "grads_bytes",
                                    "optimizer_bytes",
                                    "bytes_per_param",
                                    "megatron_bytes_per_param",
                                    "activation_bytes",
                                    "micro_batches_in_flight",
                                    "workspace_bytes",
                                    "layer_activation_bytes",
                                    "korthikanti_layer_bytes",
                                    "expert_params",
                                    "checkpoint_buffer_bytes"};

void write_memory_json(const std::string& path, const std::vector<double>& all, int K, const std::string& dtype,
                       bool distributed, const Topology& topo) {
  std::ostringstream os;
  os << std::setprecision(17) << "{\"dtype\": \"" << dtype
     << "\", \"distributed_optimizer\": " << (distributed ? "true" : "false") << ", \"ranks\": [";
  for (int r = 0; r < topo.world_size(); ++r) {
    const RankCoords c = topo.coords_of_rank(r);
    os << (r ? ",\n  " : "\n  ") << "{\"rank\": " << r << ", \"pp\": " << c.pp << ", \"tp\": " << c.tp
       << ", \"dp\": " << c.dp;
    if (topo.cp_size() > 1) os << ", \"cp\": " << c.cp;
    for (int k = 0; k < K; ++k) os << ", \"" << kFigureNames[k] << "\": " << all[static_cast<size_t>(r) * K + k];
    os << "}";
  }
  os << "\n]}\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << os.str();
    out.close();
    if (!out) throw Error::one("log.memory_file: cannot write '" + tmp + "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error::one("log.memory_file: cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

}  // namespace

const std::vector<std::string>& memory_figure_names() {
  static const std::vector<std::string> names(std::begin(kFigureNames), std::end(kFigureNames));
  return names;
}

std::vector<double> print_memory_report(const MemoryFigures& mf, const ActivationModel& am, double formula,
                                        const std::string& dtype, bool distributed, const Topology& topo,
                                        const std::string& json_path) {
  const double bpp = (mf.params + mf.grads + mf.optimizer) / std::max(mf.local_params, 1.0);
  // the experts' optimizer state is sharded over the expert-data-parallel group
  const double dense = std::max(mf.local_params - mf.expert_params, 0.0);
  const double mega = (dense * megatron_bytes_per_param(dtype, distributed, topo.dp_cp_group().size()) +
                       mf.expert_params * megatron_bytes_per_param(dtype, distributed, topo.edp_size())) /
                      std::max(dense + mf.expert_params, 1.0);
  std::vector<double> mine_mem = {mf.params,
                                  mf.grads,
                                  mf.optimizer,
                                  bpp,
                                  mega,
                                  mf.activations,
                                  mf.slots,
                                  mf.workspace,
                                  mf.layer_activations,
                                  formula,
                                  mf.expert_params,
                                  mf.checkpoint_buffers};
  const int K = static_cast<int>(mine_mem.size());  // figures per rank (kFigureNames)
  static_assert(sizeof(kFigureNames) / sizeof(kFigureNames[0]) == 12, "one name per figure");
  const bool experts = topo.ep_group().get() != MPI_COMM_NULL;
  const std::vector<double> all_mem = topo.world().gatherv_to_root(mine_mem);  // (world size, K) on rank 0
  if (topo.world().rank() == 0) {
    std::ostringstream os;
    os << "memory per rank (MiB, measured from the allocated buffers; bytes per parameter beside Megatron's " << dtype
       << (distributed ? " distributed-optimizer" : "") << " figure; activations per layer and "
       << "micro-batch beside Korthikanti et al. 2022 with " << am.e << "-byte values and 1-byte masks):\n"
       << (experts ? "  (MoE: ep and expert_dp coordinates, and the parameters of this rank's experts)\n" : "")
       << "  rank | pp tp dp" << (topo.cp_size() > 1 ? " cp" : "") << (experts ? " ep edp |  experts" : "")
       << " |   params |    grads | optimizer | bytes/param (Megatron) | activations (micro-batches) "
          "| workspace | per layer: measured KiB / formula KiB (ratio)\n";
    const double MiB = 1024.0 * 1024.0;
    for (int r = 0; r < topo.world_size(); ++r) {
      const double* v = &all_mem[static_cast<size_t>(r) * K];
      const RankCoords c = topo.coords_of_rank(r);
      os << "  " << std::setw(4) << r << " | " << c.pp << "  " << c.tp << "  " << c.dp;
      if (topo.cp_size() > 1) os << "  " << c.cp;
      if (experts) {
        const ExpertCoords x = topo.expert_coords_of_rank(r);
        os << "  " << x.ep << "   " << x.edp << " | " << std::setw(8) << static_cast<long long>(v[10]);
      }
      os << " | " << std::fixed << std::setprecision(2) << std::setw(8) << v[0] / MiB << " | " << std::setw(8)
         << v[1] / MiB << " | " << std::setw(9) << v[2] / MiB << " | " << std::setw(8) << v[3] << " ("
         << std::setprecision(2) << v[4] << ") | " << std::setw(10) << v[5] / MiB << " (" << std::setprecision(0)
         << v[6] << ") | " << std::setprecision(2) << std::setw(9) << v[7] / MiB << " | " << std::setprecision(1)
         << v[8] / 1024.0 << " / " << v[9] / 1024.0 << " (" << std::setprecision(3) << (v[9] > 0 ? v[8] / v[9] : 0.0)
         << ")\n";
    }
    double buffers = 0;  // checkpoint.async_save's host copies: the largest rank's
    for (int r = 0; r < topo.world_size(); ++r) buffers = std::max(buffers, all_mem[static_cast<size_t>(r) * K + 11]);
    if (buffers > 0)
      os << "  checkpoint.async_save host buffers: " << std::fixed << std::setprecision(2) << buffers / MiB
         << " MiB on the largest rank (host memory, beside the figures above)\n";
    std::cout << os.str() << std::flush;
    if (!json_path.empty()) write_memory_json(json_path, all_mem, K, dtype, distributed, topo);
  }
  return all_mem;
}

}  // namespace trident
