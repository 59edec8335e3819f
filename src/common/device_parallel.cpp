// device_scratch (device_parallel.hpp): one growing buffer per process, freed at Kokkos::finalize.
#include "common/device_parallel.hpp"

namespace trident {

namespace {
FloatView* g_scratch = nullptr;
}  // namespace

FloatView device_scratch(std::int64_t n) {
  if (!g_scratch) {
    g_scratch = new FloatView();
    Kokkos::push_finalize_hook([] {
      delete g_scratch;
      g_scratch = nullptr;
    });
  }
  if (static_cast<std::int64_t>(g_scratch->extent(0)) < n) {
    *g_scratch = FloatView();  // the old buffer goes before the new one is taken
    *g_scratch = FloatView(Kokkos::view_alloc(std::string("device_scratch"), Kokkos::WithoutInitializing),
                           static_cast<size_t>(n + n / 4));
  }
  return *g_scratch;
}

}  // namespace trident
