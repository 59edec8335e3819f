// libFuzzer harness: the input deck parser. Any text either parses or throws trident::Error (a
// message for the user); a deck that parses prints (to_ini) as a deck that parses to the same
// text again. Anything else (another exception, a crash, a sanitizer report) is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include "io/deck.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string printed;
  try {
    printed = trident::parse_deck_text(text).to_ini();
  } catch (const trident::Error&) {
    return 0;
  }
  std::string again;
  try {
    again = trident::parse_deck_text(printed).to_ini();
  } catch (const trident::Error& e) {
    std::fprintf(stderr, "a printed deck does not parse: %s\n--- deck ---\n%s\n", e.what(), printed.c_str());
    std::abort();
  }
  if (again != printed) {
    std::fprintf(stderr, "printing is not stable:\n--- first ---\n%s\n--- second ---\n%s\n", printed.c_str(),
                 again.c_str());
    std::abort();
  }
  return 0;
}
