// device_wait (device_wait.hpp): a fence, and its Kokkos Tools event when a tools library listens.
#include "common/device_wait.hpp"

#include <Kokkos_Core.hpp>
#include <cstring>
#include <string>

namespace trident {

namespace {
void wait_event(const char* file, int line) {
  // the site relative to src/ (the build's absolute path is not part of the name)
  const char* src = std::strstr(file, "src/");
  std::string event = "trident::wait ";
  event += src ? src + 4 : file;
  event += ':';
  event += std::to_string(line);
  Kokkos::Profiling::markEvent(event);
}
}  // namespace

void device_wait(const char* file, int line) {
  Kokkos::fence();
  if (Kokkos::Profiling::profileLibraryLoaded()) wait_event(file, line);
}

void note_device_read(const char* file, int line) {
  if (Kokkos::Profiling::profileLibraryLoaded()) wait_event(file, line);
}

void note_device_copy() {
  if (Kokkos::Profiling::profileLibraryLoaded()) Kokkos::Profiling::markEvent("trident::device_copy");
}

}  // namespace trident
