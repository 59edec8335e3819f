// dfma_fuses (device_math.hpp), compiled with the library's flags, where TRIDENT_HOST_FMA is set
// exactly when the host kernels' dfma is fmaf.
#include "common/device_math.hpp"

namespace trident {

bool dfma_fuses() {
#if defined(TRIDENT_ENABLE_CUDA) || defined(TRIDENT_HOST_FMA)
  return true;
#else
  return false;
#endif
}

}  // namespace trident
