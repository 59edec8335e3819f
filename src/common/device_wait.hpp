// The host's waits for the device. Every place where the host blocks until the device's queued
// work has finished goes through device_wait(), named by its site, so that the waits of a training
// step can be counted (perf/step_profile.py) and removed one by one: on a GPU each wait leaves the
// device idle while the host catches up, and a step with waits inside cannot be captured as a CUDA
// graph. On a host back-end a wait costs nothing, but is counted all the same.
//
//   TRIDENT_DEVICE_WAIT()   Kokkos::fence(), and a Kokkos Tools event "trident::wait FILE:LINE"
//                           when a tools library is loaded (perf/kernel_timer.cpp counts them)
//
//   TRIDENT_DEVICE_READ()   the same event without a fence, where the host reads a result of the
//                           device's (a reduction into a host value: the loss, the gradient norm,
//                           the found-inf check), which waits for the device by itself
//
//   device_copy(dst, src)   a copy between device views, or a fill of dst with the value src,
//                           queued behind the kernels before it: no wait. Kokkos' deep_copy
//                           without an execution space fences the device before and after, so a
//                           plain Kokkos::deep_copy inside the step is a wait, and
//                           perf/step_profile.py counts it as one (every copy Kokkos Tools sees,
//                           less the "trident::device_copy" events this one adds).
//
// Not counted (the device path's other blocking points, which a host build cannot see because its
// memory is host memory): create_mirror_view_and_copy to the host, and reductions into host
// scalars.
#pragma once
#include <Kokkos_Core.hpp>

#include "common/types.hpp"

namespace trident {

void device_wait(const char* file, int line);
void note_device_read(const char* file, int line);
// the Kokkos Tools event of one device_copy (when a tools library is loaded)
void note_device_copy();

template <class Dst, class Src>
void device_copy(const Dst& dst, const Src& src) {
  note_device_copy();
  Kokkos::deep_copy(ExecSpace(), dst, src);
}

}  // namespace trident

#define TRIDENT_DEVICE_WAIT() ::trident::device_wait(__FILE__, __LINE__)
#define TRIDENT_DEVICE_READ() ::trident::note_device_read(__FILE__, __LINE__)
