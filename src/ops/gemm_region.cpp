// GemmRegion (ops/gemm_region.hpp): the profiling region of one GEMM call, with its shape in the
// name under TRIDENT_GEMM_REGION_SHAPES=1.
#include "ops/gemm_region.hpp"

#include <Kokkos_Core.hpp>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

namespace trident {

namespace {
bool shapes_in_names() {
  static const bool on = [] {
    const char* v = std::getenv("TRIDENT_GEMM_REGION_SHAPES");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

// The region's name for a call: `base` alone unless TRIDENT_GEMM_REGION_SHAPES=1 is set.
std::string gemm_region_name(const char* base, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K,
                             float beta, std::int64_t batch) {
  if (!shapes_in_names()) return base;
  std::ostringstream os;
  os << base << ' ' << (ta == Trans::T ? 'T' : 'N') << (tb == Trans::T ? 'T' : 'N') << " M=" << M << " N=" << N
     << " K=" << K << " batch=" << batch << " beta=" << beta;
  return os.str();
}
}  // namespace

GemmRegion::GemmRegion(const char* base) {
  if (!Kokkos::Profiling::profileLibraryLoaded() || open_ > 0) return;
  Kokkos::Profiling::pushRegion(base);
  pushed_ = true;
  ++open_;
}

GemmRegion::GemmRegion(const char* base, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float beta,
                       std::int64_t batch) {
  if (!Kokkos::Profiling::profileLibraryLoaded() || open_ > 0) return;
  Kokkos::Profiling::pushRegion(gemm_region_name(base, ta, tb, M, N, K, beta, batch));
  pushed_ = true;
  ++open_;
}

GemmRegion::~GemmRegion() {
  if (!pushed_) return;
  Kokkos::Profiling::popRegion();
  --open_;
}

thread_local int GemmRegion::open_ = 0;

}  // namespace trident
