// StreamMark (stream_mark.hpp) in CUDA builds: CUDA events recorded on the Kokkos stream, from a
// pool (an event goes back to it when its last mark is gone).
#include <cuda_runtime.h>

#include <Kokkos_Core.hpp>
#include <mutex>
#include <sstream>
#include <vector>

#include "common/device_wait.hpp"
#include "common/error.hpp"
#include "common/stream_mark.hpp"
#include "common/timer.hpp"

namespace trident {

namespace {
void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::ostringstream os;
  os << "CUDA " << what << " failed: " << cudaGetErrorString(e);
  throw Error::one(os.str());
}

std::mutex g_pool_mutex;
std::vector<cudaEvent_t>* g_pool = nullptr;  // freed when Kokkos finalizes

cudaEvent_t take_event() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pool) {
    g_pool = new std::vector<cudaEvent_t>();
    Kokkos::push_finalize_hook([] {
      std::lock_guard<std::mutex> l(g_pool_mutex);
      for (cudaEvent_t e : *g_pool) cudaEventDestroy(e);
      delete g_pool;
      g_pool = nullptr;
    });
  }
  if (!g_pool->empty()) {
    cudaEvent_t e = g_pool->back();
    g_pool->pop_back();
    return e;
  }
  cudaEvent_t e;
  check(cudaEventCreate(&e), "cudaEventCreate");
  return e;
}

void give_event(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (g_pool)
    g_pool->push_back(e);
  else
    cudaEventDestroy(e);
}

cudaEvent_t event_of(const std::shared_ptr<void>& p) { return static_cast<cudaEvent_t>(p.get()); }

// the reference for wall(): a mark whose host time is known to be its device time
struct Anchor {
  std::shared_ptr<void> event;
  double host = 0;
};
const Anchor& anchor() {
  static const Anchor a = [] {
    Anchor r;
    cudaEvent_t e = take_event();
    r.event = std::shared_ptr<void>(static_cast<void*>(e), [](void* p) { give_event(static_cast<cudaEvent_t>(p)); });
    TRIDENT_DEVICE_WAIT();  // once per process: the queue is empty, so the event passes now
    check(cudaEventRecord(e, Kokkos::Cuda().cuda_stream()), "cudaEventRecord");
    check(cudaEventSynchronize(e), "cudaEventSynchronize");
    r.host = wall_seconds();
    return r;
  }();
  return a;
}
}  // namespace

StreamMark StreamMark::record() {
  StreamMark m;
  cudaEvent_t e = take_event();
  m.event_ = std::shared_ptr<void>(static_cast<void*>(e), [](void* p) { give_event(static_cast<cudaEvent_t>(p)); });
  check(cudaEventRecord(e, Kokkos::Cuda().cuda_stream()), "cudaEventRecord");
  m.host_ = wall_seconds();
  m.recorded_ = true;
  return m;
}

double StreamMark::seconds(const StreamMark& a, const StreamMark& b) {
  TRIDENT_DEVICE_READ();
  check(cudaEventSynchronize(event_of(b.event_)), "cudaEventSynchronize");
  return elapsed(a, b);
}

void StreamMark::wait() const {
  TRIDENT_DEVICE_READ();
  check(cudaEventSynchronize(event_of(event_)), "cudaEventSynchronize");
}

bool StreamMark::passed() const {
  const cudaError_t e = cudaEventQuery(event_of(event_));
  if (e == cudaErrorNotReady) return false;
  check(e, "cudaEventQuery");
  return true;
}

double StreamMark::elapsed(const StreamMark& a, const StreamMark& b) {
  float ms = 0.f;
  check(cudaEventElapsedTime(&ms, event_of(a.event_), event_of(b.event_)), "cudaEventElapsedTime");
  return 1e-3 * static_cast<double>(ms);
}

double StreamMark::wall() const {
  const Anchor& r = anchor();
  TRIDENT_DEVICE_READ();
  check(cudaEventSynchronize(event_of(event_)), "cudaEventSynchronize");
  float ms = 0.f;
  check(cudaEventElapsedTime(&ms, event_of(r.event), event_of(event_)), "cudaEventElapsedTime");
  return r.host + 1e-3 * static_cast<double>(ms);
}

}  // namespace trident
