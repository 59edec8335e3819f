// StreamMark (stream_mark.hpp) on host back-ends: the host's clock. Kernels run synchronously
// there, so a mark needs no fence; where the kernels take their device layouts
// (TRIDENT_DEVICE_KERNELS_ON_HOST) a read is counted as the wait it is on a GPU.
#include "common/stream_mark.hpp"

#if !defined(TRIDENT_ENABLE_CUDA)
#include "common/device_parallel.hpp"
#include "common/device_wait.hpp"
#include "common/timer.hpp"

namespace trident {

StreamMark StreamMark::record() {
  StreamMark m;
  m.host_ = wall_seconds();
  m.recorded_ = true;
  return m;
}

double StreamMark::seconds(const StreamMark& a, const StreamMark& b) {
  if (kDeviceKernels) TRIDENT_DEVICE_READ();
  return elapsed(a, b);
}

double StreamMark::elapsed(const StreamMark& a, const StreamMark& b) { return b.host_ - a.host_; }

bool StreamMark::passed() const { return true; }

void StreamMark::wait() const {
  if (kDeviceKernels) TRIDENT_DEVICE_READ();
}

double StreamMark::wall() const {
  if (kDeviceKernels) TRIDENT_DEVICE_READ();
  return host_;
}

}  // namespace trident
#endif
