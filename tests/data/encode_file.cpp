// encode_file: GPT-2-tokenizes a whole file with trident::Gpt2Tokenizer and writes the ids,
// one per line (for the comparison with the JavaScript encoder, tests/data/compare_with_js.py).
//   encode_file VOCAB(encoder.json) MERGES(vocab.bpe) INPUT OUTPUT
// Also checks decode(encode(text)) == text and reports the throughput on stderr (one pass
// with a cold word cache, then one with a warm cache).
//   encode_file VOCAB MERGES INPUT.jsonl OUTPUT --jsonl KEY
// tokenizes each JSON line's text under KEY instead, writing one line of space-separated ids
// per non-blank input line (the expected documents of preprocess_data, without EOD).

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.hpp"
#include "data/gpt2_tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc != 5 && !(argc == 7 && std::string(argv[5]) == "--jsonl")) {
    std::cerr << "usage: encode_file VOCAB MERGES INPUT OUTPUT [--jsonl KEY]\n";
    return 2;
  }
  try {
    if (argc == 7) {
      trident::Gpt2Tokenizer tok(argv[1], argv[2]);
      std::ifstream in(argv[3], std::ios::binary);
      if (!in) throw std::runtime_error(std::string("cannot open ") + argv[3]);
      std::ofstream out(argv[4], std::ios::binary);
      std::string line;
      while (std::getline(in, line)) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string text = nlohmann::json::parse(line).at(argv[6]).get<std::string>();
        std::string buf;
        for (std::int32_t id : tok.encode(text)) {
          if (!buf.empty()) buf += ' ';
          buf += std::to_string(id);
        }
        out << buf << '\n';
      }
      if (!out) throw std::runtime_error(std::string("cannot write ") + argv[4]);
      return 0;
    }
    const auto t_load = std::chrono::steady_clock::now();
    trident::Gpt2Tokenizer tok(argv[1], argv[2]);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    std::ifstream in(argv[3], std::ios::binary);
    if (!in) throw std::runtime_error(std::string("cannot open ") + argv[3]);
    std::ostringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();

    auto t0 = std::chrono::steady_clock::now();
    const std::vector<std::int32_t> ids = tok.encode(text);
    const double cold_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    const std::vector<std::int32_t> again = tok.encode(text);
    const double warm_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (again != ids) throw std::runtime_error("second encode differs from the first (cache bug)");
    if (tok.decode(ids) != text) throw std::runtime_error("decode(encode(text)) != text");

    std::ofstream out(argv[4], std::ios::binary);
    std::string buf;
    buf.reserve(ids.size() * 6);
    for (std::int32_t id : ids) {
      buf += std::to_string(id);
      buf += '\n';
    }
    out << buf;
    if (!out) throw std::runtime_error(std::string("cannot write ") + argv[4]);
    std::fprintf(stderr,
                 "encode_file: %zu bytes -> %zu tokens; load %.2f s; encode %.3f s cold (%.2fM tokens/s, %.1f MB/s), "
                 "%.3f s warm (%.2fM tokens/s, %.1f MB/s)\n",
                 text.size(), ids.size(), load_s, cold_s, ids.size() / cold_s / 1e6, text.size() / cold_s / 1e6,
                 warm_s, ids.size() / warm_s / 1e6, text.size() / warm_s / 1e6);
  } catch (const std::exception& e) {
    std::cerr << "encode_file: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
