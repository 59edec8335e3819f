// Points in the device's queue, for timers that do not make the host wait (docs/DESIGN.md "Waiting
// for the device"). A StreamMark is recorded behind the work queued so far: on a host back-end the
// host's clock (host kernels run synchronously), in a CUDA build a CUDA event on the Kokkos stream.
// Reading the time between two marks waits for the later one to pass, so timers record marks
// during the step and read them where the step already waits, or once per report.
//
//   StreamMark::record()        a mark now (no wait)
//   m.passed()                  whether the device has passed m (never waits; always on a host)
//   StreamMark::seconds(a, b)   the time from a to b; waits for b on a device (a counted read,
//                               common/device_wait.hpp, where the kernels take device layouts:
//                               a host build cannot tell whether a GPU would have passed b)
//   StreamMark::elapsed(a, b)   the same for a b that has passed: no wait
//   m.wait()                    waits for the device to pass m (a counted read)
//   m.wall()                    the mark's time on the host's wall clock (wall_seconds()); on a
//                               device, the host's time at a reference mark plus the device's time
//                               since, waiting for m
#pragma once
#include <memory>

namespace trident {

class StreamMark {
 public:
  StreamMark() = default;
  static StreamMark record();
  static double seconds(const StreamMark& a, const StreamMark& b);
  static double elapsed(const StreamMark& a, const StreamMark& b);
  bool passed() const;
  void wait() const;  // until the device has passed this mark (a counted read)
  double wall() const;
  bool recorded() const { return recorded_; }

 private:
  double host_ = 0;              // the host's clock when recorded
  std::shared_ptr<void> event_;  // a CUDA build's event (back to a pool with the last copy)
  bool recorded_ = false;
};

}  // namespace trident
